//! Multi-member clusters (DESIGN.md "Multi-member clusters"): members learned from the peers
//! ([`peers`]); a member that lost its data rejoins through its peers as a learner, journaled
//! ([`journal`], [`promote`]) — never from the store; a member that leaves ([`leave`]); cluster
//! restore plans written and read ([`restore`]). Who writes is `crate::backup::leadership`; the
//! start-up steps of a cluster member are `crate::startup::cluster` and `crate::startup::plan`.
//! It calls `restore`, `store`, `etcd` and the floors below them.

pub mod journal;
pub mod leave;
pub mod peers;
pub mod promote;
pub mod restore;

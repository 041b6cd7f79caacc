//! Multi-member clusters (DESIGN.md "Multi-member clusters"): one writer per cluster (the raft
//! leader's warden, [`leadership`]); members learned from the peers ([`peers`]); a member that
//! lost its data rejoins through its peers as a learner, journaled ([`startup`], [`journal`],
//! [`promote`]) — never from the store. Whether a data dir is sound offline is `crate::etcd::local`.

pub mod journal;
pub mod leadership;
pub mod leave;
pub mod peers;
pub mod promote;
pub mod restore;
pub mod startup;

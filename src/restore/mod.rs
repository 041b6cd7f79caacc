//! Restore: plan (pure: which objects, which revisions) then execute (work dir beside the target,
//! etcd's own restore tool, atomic swap). The deltas reach the restored member through `write`
//! (into its bbolt file via `crate::format::mvcc` and `crate::format::bolt`), or `replay` (through a
//! private etcd) as the fallback. `catchup` writes the revisions a behind data dir misses into its
//! own db file, once it is shown to be the store's history.

pub mod catchup;
pub mod check;
pub mod execute;
mod full;
pub mod marker;
pub mod plan;
mod replay;
mod write;

pub use catchup::{CatchUpOptions, CaughtUp, catch_up};
pub use execute::{RestoreOptions, RestoreReport, restore};
pub use plan::Target;
pub use write::extend;

//! Restore: plan (pure: which objects, which revisions) then execute (work dir beside the target,
//! etcd's own restore tool, deltas written into its bbolt file, atomic swap).

pub mod bolt;
pub mod drill;
pub mod execute;
pub mod mvcc;
pub mod plan;
pub mod startup;

pub use execute::{RestoreOptions, RestoreReport, restore};
pub use plan::Target;

//! The backup writer: one task (`writer`) owns the delta buffer, the watch and every upload and
//! deletion, so uploads never overlap and retention never races an upload. While etcd is healthy
//! it resumes the newest chain in the store (watching from the chain's last revision + 1) or
//! starts a new one with a full snapshot, then streams deltas. Full snapshots come from the cron
//! schedule, SIGUSR1, a compacted or gapped watch, and an overflowed delta buffer. Every outcome
//! lands in [`BackupStatus`]; none of it touches readiness (rule 1).
//!
//! The writer's parts, each called only by the owner's loop: `chain` (where a chain starts),
//! `stream` (the delta stream), `leases`, `fulls`, `fencing` (leadership and the store's head),
//! `members`, `retention`, `space`, `checks` (what only a full carries). The formats they write
//! live in `crate::snapshot`; the store in `crate::store`.

mod chain;
mod checks;
mod config;
pub mod drill;
mod fencing;
mod fulls;
mod handle;
pub mod leadership;
mod leases;
mod members;
mod retention;
mod space;
mod status;
mod stream;
pub mod tail;
mod writer;

pub use config::BackupConfig;
pub use fulls::parse_cron;
pub use handle::{BackupHandle, Control};
pub use status::{BackupStatus, ChainBreak, DefragInfo, SnapInfo};
pub use writer::Backup;

//! Snapshot bytes on their way to and from the store: full snapshots streamed from etcd (`full`),
//! delta snapshots from a watch (`delta`, its records in `crate::format::delta_codec`),
//! compression (`compress`, with `crate::store::crypt` for encryption), reading an object back
//! and checking it (`verify`, and `gbr` for etcd-backup-restore's objects), and what only a full
//! snapshot carries: membership and auth (`outside`). It calls `store`, `etcd`, `format` and the
//! floor; the backup writer and the restore call it.

pub mod compress;
pub mod delta;
pub mod full;
pub mod gbr;
pub mod outside;
pub mod verify;

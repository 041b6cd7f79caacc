//! Backups: full snapshots streamed from etcd (`full`), delta snapshots from a watch (`delta`,
//! `delta_codec`), compression (`compress`), and the loop that schedules them (`backup`).

pub mod backup;
pub mod compress;
pub mod crypt;
pub mod delta;
pub mod delta_codec;
pub mod full;
pub mod verify;

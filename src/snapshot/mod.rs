//! Backups: full snapshots streamed from etcd (`full`), delta snapshots from a watch (`delta`,
//! `delta_codec`), compression (`compress`), the loop that schedules them (`backup`), and what only
//! a full snapshot carries: membership and auth (`outside`).

pub mod backup;
pub mod compress;
pub mod crypt;
pub mod delta;
pub mod delta_codec;
pub mod full;
pub mod outside;
pub mod tail;
pub mod verify;

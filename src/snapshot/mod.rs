//! The formats the backup writer (`crate::backup`) produces and restores read: full snapshots
//! streamed from etcd (`full`), delta snapshots from a watch (`delta`, its records in `crate::format::delta_codec`), compression
//! (`compress`), encryption (`crypt`), and what only a full snapshot carries: membership and auth
//! (`outside`).

pub mod compress;
pub mod crypt;
pub mod delta;
pub mod full;
pub mod outside;
pub mod verify;

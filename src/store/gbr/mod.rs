//! Gardener's etcd-backup-restore (GBR), read in place: so an operator can switch to the warden
//! with months of GBR backups in the bucket and no window without a usable history.
//!
//! What GBR writes under its `--store-prefix` (read from its source, pkg/snapstore and
//! pkg/snapshot/snapshotter; docs/gbr.md has the whole account):
//! - `v2/Full-00000000-<rev>-<unix s>[.gz|.zlib|.Z][.final]`: etcd's snapshot stream (the database and
//!   its trailing sha256), compressed as one stream; `<rev>` was read before the stream began, so
//!   the database may hold more.
//! - `v2/Incr-<start>-<last>-<unix s>[.gz|…]`: a JSON array of `{"etcdEvent": <clientv3.Event>,
//!   "time": …}` followed by the raw sha256 of the JSON, compressed together.
//! - `v1/Backup-<unix s>/` holds the same names in the older layout.
//!
//! The warden lists, verifies and restores these beside its own `v1/full` and `v1/delta` objects
//! ([`names`] for keys and chains; `crate::snapshot::gbr` reads the bytes), and never writes or deletes one: its own
//! keys never match GBR's grammar, so GBR ignores them in turn (it logs a warning per listing).

pub mod names;

pub use names::{GbrCompression, GbrName};

//! Files read and written byte by byte, pure and without I/O beyond the file at hand: etcd's bbolt
//! db file (`bolt`, and `bolt_stream` to read one front to back as it streams past), etcd's mvcc keys and values in it (`mvcc`), the warden's delta record
//! (`delta_codec`), etcd's WAL (`wal`, read only) and the few protobuf messages read by hand
//! (`proto`). Their readers take hostile
//! bytes (a damaged db file, a store object) and answer with an error, never a panic (`tests/fuzz.rs`).
//! It calls nothing of the warden but itself.

pub mod bolt;
pub mod bolt_stream;
pub mod delta_codec;
pub mod mvcc;
pub mod proto;
pub mod wal;

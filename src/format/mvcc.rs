//! Writing delta revisions straight into a restored member's bbolt file, exactly as etcd's mvcc
//! store writes them, instead of replaying them through a running etcd.
//!
//! etcd keeps every revision of every key in the `key` bucket, keyed by the revision:
//! `u64 main (big-endian) | '_' | u64 sub (big-endian)`, plus a trailing `t` for a delete
//! (a tombstone). The value is the protobuf `mvccpb.KeyValue` {key, create_revision, mod_revision,
//! version, value, lease}; a tombstone's value holds only the key. `sub` is the position of the
//! change within its revision's transaction, which is the order the watch reports the events in.
//! At start etcd rebuilds its index and its current revision from this bucket (and the compaction
//! marks in `meta`), so appending the recorded revisions in order gives the member the original
//! revision numbers, mod_revisions, create_revisions and versions, byte for byte.
//!
//! Leases live in the `lease` bucket, keyed by the big-endian ID, valued by `leasepb.Lease`
//! {ID, TTL}. A lease granted after the full snapshot is written with the TTL it was granted with;
//! etcd starts its countdown when the restored member becomes leader. A put keeps the lease ID
//! etcd recorded, as etcd's own history does, also when the lease is known neither from the
//! snapshot nor from a delta (it was already revoked when the watcher asked its TTL): a later
//! revision deletes such a key, and a restore that stops before it leaves a key etcd starts
//! without attaching (it logs "failed to attach a lease"), as it would without the ID. The replay
//! through etcd cannot put such a lease ID and drops it.
//!
//! Nothing else changes: the consistent index, membership and term that etcdutl/etcdctl wrote stay
//! as they are, so etcd starts on the file exactly as it would after the plain snapshot restore.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use super::bolt::{Appender, BUCKET_LEAF, BoltError, BoltFile, BucketValue, LeafItem};
use crate::format::delta_codec::{EventType, Revision};

const KEY_BUCKET: &[u8] = b"key";
const LEASE_BUCKET: &[u8] = b"lease";
const META_BUCKET: &[u8] = b"meta";
const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
const CONSISTENT_INDEX: &[u8] = b"consistent_index";

pub struct MvccFile {
    db: BoltFile,
    root: Vec<LeafItem>,
    keys: Appender,
    leases: BTreeMap<Vec<u8>, Vec<u8>>,
    lease_ids: HashSet<i64>,
    leases_changed: bool,
    /// Entries of the `meta` bucket to set at commit.
    meta_puts: BTreeMap<Vec<u8>, Vec<u8>>,
    revision: i64,
    /// The newest compaction mark (finished or scheduled; 0: none).
    compacted: i64,
}

fn bucket<'a>(root: &'a [LeafItem], name: &[u8]) -> Result<&'a [u8], BoltError> {
    root.iter()
        .find(|(f, k, _)| f & BUCKET_LEAF != 0 && k == name)
        .map(|(_, _, v)| v.as_slice())
        .ok_or_else(|| {
            BoltError::Unsupported(format!(
                "no {:?} bucket: not an etcd 3.4/3.5 backend",
                String::from_utf8_lossy(name)
            ))
        })
}

/// The newest etcd release that wrote the backend at `path`, as `(major, minor)`: the greater of
/// `meta.storageVersion` (3.6+, "3.6") and `cluster.clusterVersion` ("3.5.0"; 3.4+). etcd refuses
/// a storage version newer than itself and panics on a newer cluster version, so a db written by a
/// newer minor cannot be restored for an older one without `etcdutl migrate`. `None`: neither key.
pub fn written_by(path: &Path) -> Result<Option<(u32, u32)>, BoltError> {
    let db = BoltFile::open(path)?;
    let root = db.root_items()?;
    let mut newest = None;
    for (bucket_name, key) in [
        (META_BUCKET, &b"storageVersion"[..]),
        (b"cluster", b"clusterVersion"),
    ] {
        let Ok(b) = bucket(&root, bucket_name) else {
            continue;
        };
        for (_, k, v) in db.bucket_items(&BucketValue::parse(b)?)? {
            if k == key {
                let text = String::from_utf8_lossy(&v);
                let mut parts = text.trim().split('.').map(|p| p.parse::<u32>());
                if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) {
                    newest = newest.max(Some((major, minor)));
                }
            }
        }
    }
    Ok(newest)
}

/// Reads a member's db file without changing it: `f` gets every entry of the `key` bucket in
/// revision order (main revision, tombstone, the `mvccpb.KeyValue` bytes), a page at a time.
/// Returns the revision of the last finished compaction (0: none), below which the file holds
/// no history.
pub fn read_history(path: &Path, mut f: impl FnMut(i64, bool, &[u8])) -> Result<i64, BoltError> {
    let db = BoltFile::open(path)?;
    let root = db.root_items()?;
    let mut compacted = 0;
    for (_, k, v) in db.bucket_items(&BucketValue::parse(bucket(&root, META_BUCKET)?)?)? {
        if k == FINISHED_COMPACT && v.len() >= 8 {
            compacted = i64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
        }
    }
    let mut bad = None;
    db.visit_bucket(
        &BucketValue::parse(bucket(&root, KEY_BUCKET)?)?,
        |k, v| match main_revision(k) {
            Ok(rev) => f(rev, k.len() == 18, v),
            Err(e) => {
                bad.get_or_insert(e);
            }
        },
    )?;
    bad.map_or(Ok(compacted), Err)
}

/// What [`revisions_after`] read besides the revisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// The newest compaction mark, finished or scheduled (0: none): the file holds no complete
    /// revision at or below it.
    pub compacted: i64,
    /// `meta.consistent_index`: the last raft entry etcd applied into this file (0: none).
    pub consistent_index: u64,
}

/// Reads a member's db file without changing it (no etcd may run on it): `f` gets each revision
/// after `after`, in order, as the delta format records it, one revision in memory at a time. A
/// put carries its `mvccpb.KeyValue` fields; a delete its key alone, as etcd's watch reports a
/// tombstone. An entry without a value (the marker of a revision bump) is no event. Only the
/// bucket's pages from `after` on are read.
pub fn revisions_after(path: &Path, after: i64, mut f: impl FnMut(&Revision)) -> Result<Tail, BoltError> {
    let db = BoltFile::open(path)?;
    let root = db.root_items()?;
    let mut tail = Tail {
        compacted: 0,
        consistent_index: 0,
    };
    for (_, k, v) in db.bucket_items(&BucketValue::parse(bucket(&root, META_BUCKET)?)?)? {
        let Some(be) = v.get(..8).map(|b| <[u8; 8]>::try_from(b).expect("8 bytes")) else {
            continue;
        };
        if k == FINISHED_COMPACT || k == SCHEDULED_COMPACT {
            tail.compacted = tail.compacted.max(i64::from_be_bytes(be));
        } else if k == CONSISTENT_INDEX {
            tail.consistent_index = u64::from_be_bytes(be);
        }
    }
    let start = revision_key(after.saturating_add(1).max(0), 0, false);
    let mut current: Option<Revision> = None;
    let mut bad = None;
    db.visit_bucket_from(
        &BucketValue::parse(bucket(&root, KEY_BUCKET)?)?,
        &start,
        |k, v| {
            if bad.is_some() {
                return;
            }
            match event(k, v) {
                Ok((_, None)) => {}
                Ok((main, Some(e))) => match current.as_mut() {
                    Some(r) if r.revision == main => r.events.push(e),
                    _ => {
                        if let Some(done) = current.replace(Revision {
                            revision: main,
                            events: vec![e],
                        }) {
                            f(&done);
                        }
                    }
                },
                Err(e) => bad = Some(e),
            }
        },
    )?;
    if let Some(e) = bad {
        return Err(e);
    }
    if let Some(done) = current {
        f(&done);
    }
    Ok(tail)
}

/// One `key` bucket entry as a delta event: its main revision, and the event (`None`: a bump's
/// marker, which holds no value).
fn event(k: &[u8], v: &[u8]) -> Result<(i64, Option<crate::format::delta_codec::Event>), BoltError> {
    use crate::format::delta_codec::Event;
    let main = main_revision(k)?;
    if v.is_empty() {
        return Ok((main, None));
    }
    let corrupt = || {
        BoltError::Corrupt(format!(
            "key bucket entry {} holds no mvccpb.KeyValue",
            hex::encode(k)
        ))
    };
    let fields = crate::format::proto::fields(v).ok_or_else(corrupt)?;
    let int = |n: u64| {
        fields
            .iter()
            .find(|f| f.0 == n && f.1 == 0)
            .map_or(0, |f| f.2 as i64)
    };
    let bytes = |n: u64| {
        fields
            .iter()
            .find(|f| f.0 == n && f.1 == 2)
            .map_or(Vec::new(), |f| f.3.to_vec())
    };
    let key = bytes(1);
    if key.is_empty() {
        return Err(corrupt());
    }
    let e = if k.len() == 18 && k[17] == b't' {
        Event {
            kind: EventType::Delete,
            key,
            value: Vec::new(),
            lease: 0,
            create_revision: 0,
            version: 0,
        }
    } else {
        Event {
            kind: EventType::Put,
            key,
            value: bytes(5),
            lease: int(6),
            create_revision: int(2),
            version: int(4),
        }
    };
    Ok((main, Some(e)))
}

/// The main revision of a `key` bucket key (17 bytes, or 18 for a tombstone).
fn main_revision(k: &[u8]) -> Result<i64, BoltError> {
    match k.len() {
        17 | 18 if k[8] == b'_' => Ok(i64::from_be_bytes(k[..8].try_into().expect("8 bytes"))),
        _ => Err(BoltError::Unsupported(format!(
            "key bucket entry {} is not an etcd revision",
            hex::encode(k)
        ))),
    }
}

fn revision_key(main: i64, sub: usize, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&main.to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&(sub as i64).to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Protobuf field `n` as a varint; proto3 leaves zero out.
fn int_field(out: &mut Vec<u8>, n: u8, v: i64) {
    if v != 0 {
        out.push(n << 3);
        varint(out, v as u64);
    }
}

fn bytes_field(out: &mut Vec<u8>, n: u8, v: &[u8]) {
    if !v.is_empty() {
        out.push(n << 3 | 2);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }
}

/// `mvccpb.KeyValue`, fields in number order as etcd's gogo-protobuf marshals them.
fn key_value(key: &[u8], create: i64, modified: i64, version: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + value.len() + 40);
    bytes_field(&mut out, 1, key);
    int_field(&mut out, 2, create);
    int_field(&mut out, 3, modified);
    int_field(&mut out, 4, version);
    bytes_field(&mut out, 5, value);
    int_field(&mut out, 6, lease);
    out
}

impl MvccFile {
    /// Opens a member's `member/snap/db`. Fails with [`BoltError::Unsupported`] before writing
    /// anything when the file is not shaped as expected.
    pub fn open(path: &Path) -> Result<Self, BoltError> {
        let db = BoltFile::open(path)?;
        let root = db.root_items()?;
        let keys = db.appender(&BucketValue::parse(bucket(&root, KEY_BUCKET)?)?)?;
        // An etcd that never wrote a key is at revision 1.
        let mut revision = match keys.last_key() {
            Some(k) => main_revision(k)?.max(1),
            None => 1,
        };
        // A compaction can remove the newest revision's entry (a deleted key); etcd then takes
        // its revision from the compaction mark, and so do we. A snapshot taken while a compaction
        // ran has only the scheduled mark, which is still a revision the cluster had reached
        // (newer etcd counts it too, etcd-io/etcd#17780).
        let mut compacted = 0;
        for (_, k, v) in db.bucket_items(&BucketValue::parse(bucket(&root, META_BUCKET)?)?)? {
            if (k == FINISHED_COMPACT || k == SCHEDULED_COMPACT) && v.len() >= 8 {
                compacted = compacted.max(i64::from_be_bytes(v[..8].try_into().expect("8 bytes")));
            }
        }
        revision = revision.max(compacted);
        let leases: BTreeMap<Vec<u8>, Vec<u8>> = db
            .bucket_items(&BucketValue::parse(bucket(&root, LEASE_BUCKET)?)?)?
            .into_iter()
            .map(|(_, k, v)| (k, v))
            .collect();
        let lease_ids = leases
            .keys()
            .filter(|k| k.len() == 8)
            .map(|k| i64::from_be_bytes(k.as_slice().try_into().expect("8 bytes")))
            .collect();
        Ok(Self {
            db,
            root,
            keys,
            leases,
            lease_ids,
            leases_changed: false,
            meta_puts: BTreeMap::new(),
            revision,
            compacted,
        })
    }

    /// The member's revision: the last one in the file, appended ones included.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The newest compaction mark, finished or scheduled (0: none): no revision at or below it
    /// can be read from this member's history.
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// Records a lease granted after the snapshot (once; a TTL ≤ 0 means it was already gone).
    pub fn add_lease(&mut self, id: i64, ttl: i64) {
        if ttl <= 0 || !self.lease_ids.insert(id) {
            return;
        }
        let mut v = Vec::with_capacity(20);
        int_field(&mut v, 1, id);
        int_field(&mut v, 2, ttl);
        self.leases.insert(id.to_be_bytes().to_vec(), v);
        self.leases_changed = true;
    }

    /// Makes `set` the lease bucket (a delta's lease set): leases not in it were revoked or
    /// expired; those missing are added with their granted TTL. Leases kept keep their value.
    pub fn set_leases(&mut self, set: &[crate::format::delta_codec::Lease]) {
        let keep: HashSet<i64> = set.iter().map(|l| l.id).collect();
        let before = self.leases.len();
        self.lease_ids.retain(|id| keep.contains(id));
        self.leases.retain(|k, _| {
            <[u8; 8]>::try_from(k.as_slice()).is_ok_and(|b| keep.contains(&i64::from_be_bytes(b)))
        });
        if self.leases.len() != before {
            self.leases_changed = true;
        }
        for l in set {
            self.add_lease(l.id, l.granted_ttl);
        }
    }

    /// Appends the next revision.
    pub fn apply(&mut self, r: &Revision) -> Result<(), BoltError> {
        if r.revision != self.revision + 1 || r.events.is_empty() {
            return Err(BoltError::Corrupt(format!(
                "revision {} ({} events) cannot follow revision {}",
                r.revision,
                r.events.len(),
                self.revision
            )));
        }
        for (sub, e) in r.events.iter().enumerate() {
            let (key, value) = match e.kind {
                EventType::Put => (
                    revision_key(r.revision, sub, false),
                    key_value(
                        &e.key,
                        e.create_revision,
                        r.revision,
                        e.version,
                        &e.value,
                        e.lease,
                    ),
                ),
                EventType::Delete => (
                    revision_key(r.revision, sub, true),
                    key_value(&e.key, 0, 0, 0, &[], 0),
                ),
            };
            self.keys.push(&mut self.db, 0, key, value)?;
        }
        self.revision = r.revision;
        Ok(())
    }

    /// What etcdutl's `snapshot restore --bump-revision N --mark-compacted` does (etcdutl 3.6's
    /// unsafeBumpBucketsRevision and unsafeMarkRevisionCompacted): an entry with an empty value at
    /// revision `current + amount` (sub 0) in the `key` bucket, and `scheduledCompactRev` in `meta`
    /// set to it. etcd starts at that revision and runs the scheduled compaction, so every older
    /// revision answers "compacted". `current` counts the compaction marks too (etcdutl looks at the
    /// key bucket only), so the new revision is above every revision the member ever had. Last:
    /// nothing can be applied after it.
    pub fn bump_and_mark_compacted(&mut self, amount: u64) -> Result<i64, BoltError> {
        let to = i64::try_from(amount)
            .ok()
            .and_then(|a| self.revision.checked_add(a))
            .filter(|_| amount > 0)
            .ok_or_else(|| {
                BoltError::Unsupported(format!("cannot bump revision {} by {amount}", self.revision))
            })?;
        let key = revision_key(to, 0, false);
        self.keys.push(&mut self.db, 0, key.clone(), Vec::new())?;
        self.meta_puts.insert(SCHEDULED_COMPACT.to_vec(), key);
        self.revision = to;
        Ok(to)
    }

    /// Makes the appended revisions and leases the file's content (one meta write, synced).
    pub fn commit(mut self) -> Result<(), BoltError> {
        let mut root = std::mem::take(&mut self.root);
        let key_root = self.keys.finish(&mut self.db)?;
        let lease_root = if self.leases_changed {
            Some(
                self.db.write_tree(
                    std::mem::take(&mut self.leases)
                        .into_iter()
                        .map(|(k, v)| (0, k, v))
                        .collect(),
                )?,
            )
        } else {
            None
        };
        let meta_root = if self.meta_puts.is_empty() {
            None
        } else {
            let mut items: BTreeMap<Vec<u8>, (u32, Vec<u8>)> = self
                .db
                .bucket_items(&BucketValue::parse(bucket(&root, META_BUCKET)?)?)?
                .into_iter()
                .map(|(f, k, v)| (k, (f, v)))
                .collect();
            for (k, v) in std::mem::take(&mut self.meta_puts) {
                items.insert(k, (0, v));
            }
            Some(
                self.db
                    .write_tree(items.into_iter().map(|(k, (f, v))| (f, k, v)).collect())?,
            )
        };
        for (_, name, value) in root.iter_mut() {
            let new_root = match name.as_slice() {
                KEY_BUCKET => Some(key_root),
                LEASE_BUCKET => lease_root,
                META_BUCKET => meta_root,
                _ => None,
            };
            if let Some(r) = new_root {
                let sequence = BucketValue::parse(value)?.sequence;
                *value = BucketValue::encode(r, sequence);
            }
        }
        self.db.commit(root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes produced by etcd 3.5's gogo-protobuf for
    /// KeyValue{Key:"foo", CreateRevision:2, ModRevision:300, Version:3, Value:"bar", Lease:0x694d...}.
    #[test]
    fn key_value_encodes_like_gogo_protobuf() {
        let got = key_value(b"foo", 2, 300, 3, b"bar", 0x694d_7a5e_1234_5678);
        let mut want = vec![
            0x0a, 3, b'f', b'o', b'o', 0x10, 2, 0x18, 0xac, 0x02, 0x20, 3, 0x2a, 3,
        ];
        want.extend_from_slice(b"bar");
        want.push(0x30);
        varint(&mut want, 0x694d_7a5e_1234_5678);
        assert_eq!(got, want);
        assert_eq!(key_value(b"k", 0, 0, 0, b"", 0), vec![0x0a, 1, b'k']);
    }

    /// Anything that is not an etcd bbolt file is refused before a byte is written, so the restore
    /// can replay through etcd instead.
    #[test]
    fn a_file_that_is_not_etcd_bbolt_is_refused_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let garbage: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &garbage).expect("write");
        assert!(matches!(MvccFile::open(&path), Err(BoltError::Unsupported(_))));
        assert_eq!(std::fs::read(&path).expect("read"), garbage);
    }

    #[test]
    fn revision_keys_sort_by_main_then_sub_and_mark_tombstones() {
        let a = revision_key(5, 1, false);
        let b = revision_key(5, 2, true);
        let c = revision_key(256, 0, false);
        assert!(a < b && b < c);
        assert_eq!(b.len(), 18);
        assert_eq!(main_revision(&b).expect("rev"), 5);
        assert_eq!(main_revision(&c).expect("rev"), 256);
        assert_eq!(&a[..], &[0, 0, 0, 0, 0, 0, 0, 5, b'_', 0, 0, 0, 0, 0, 0, 0, 1]);
    }
}

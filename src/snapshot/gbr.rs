//! GBR's bytes, read into what the rest of the warden reads: a full snapshot becomes etcd's stream in
//! a file (as `etcdutl snapshot restore` wants it), a delta becomes the warden's own delta payload
//! (`format::delta_codec`), so the restore, the replay and `backups verify` apply and check GBR's
//! history with the code that applies and checks the warden's.
//!
//! GBR records a put's lease id but never the lease's TTL. A lease the full snapshot holds keeps its
//! own TTL; one granted after it is restored with the store's `gbr_lease_ttl` (`--gbr-lease-ttl`,
//! one hour by default: Kubernetes' event TTL), so its keys still expire once etcd runs.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use base64::Engine;
use futures_util::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::format::delta_codec::{self, Event, EventType, Lease, Revision};
use crate::snapshot::compress::{Decompressor, Unpacker};
use crate::snapshot::full::TrailerCheck;
use crate::snapshot::verify::{FullWorker, ObjectError};
use crate::store::Store;
use crate::store::format::{self, Footer, Header, Verified};
use crate::store::gbr::{GbrCompression, GbrName};
use crate::store::layout::{Compression, Encryption, Kind, SnapshotName};

/// A delta is held whole: its digest is at its end. GBR cuts one at `--delta-snapshot-memory-limit`
/// (10 MiB by default) of JSON; this bounds what a damaged or foreign object can make us hold.
const MAX_DELTA: usize = 512 << 20;

/// What GBR's `Incr` JSON holds per event: Go's encoding of `clientv3.Event` (`[]byte` as base64,
/// zero values left out: a put has no `type`, a delete's kv only its key and mod_revision).
#[derive(Deserialize)]
struct TimedEvent {
    #[serde(rename = "etcdEvent")]
    event: GoEvent,
}

#[derive(Deserialize)]
struct GoEvent {
    #[serde(default, rename = "type")]
    kind: i32,
    kv: Option<GoKv>,
}

#[derive(Deserialize, Default)]
struct GoKv {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    create_revision: i64,
    #[serde(default)]
    mod_revision: i64,
    #[serde(default)]
    version: i64,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    lease: i64,
}

fn decompressor(c: GbrCompression) -> std::io::Result<Decompressor> {
    match c {
        GbrCompression::None => Decompressor::new(Compression::None),
        GbrCompression::Gzip => Decompressor::new(Compression::Gzip),
        GbrCompression::Zlib => Ok(Decompressor::zlib()),
        GbrCompression::Lzw => Ok(Decompressor::lzw()),
    }
}

fn corrupt(name: &SnapshotName, e: impl std::fmt::Display) -> ObjectError {
    ObjectError::Corrupt(format!("{}: {e}", name.key()))
}

fn unavailable(name: &SnapshotName, e: object_store::Error) -> ObjectError {
    let text = format!("read {}: {}", name.key(), crate::telemetry::error_chain(&e));
    match e {
        object_store::Error::NotFound { .. } => ObjectError::Corrupt(format!("{text} (missing)")),
        _ => ObjectError::Unavailable(text),
    }
}

/// What reading a GBR object proved, in the terms of the warden's own objects.
fn verified(
    name: &SnapshotName,
    size: u64,
    raw: u64,
    etcd_sha256: Option<String>,
    counts: (u64, u64),
) -> Verified {
    let (kind, revision, first, last) = match name.kind {
        Kind::Full { revision, .. } => ("full", Some(revision), None, None),
        Kind::Delta { first, last, .. } => ("delta", None, Some(first), Some(last)),
    };
    let delta = kind == "delta";
    Verified {
        header: Header {
            format: 0,
            kind: kind.into(),
            revision,
            base: None,
            base_created: None,
            first,
            last,
            created: humantime::format_rfc3339_millis(name.created()).to_string(),
            compression: Compression::None,
            encryption: Encryption::Plain,
            is_final: matches!(name.kind, Kind::Full { is_final: true, .. }),
            cluster_id: 0,
            member_id: 0,
            raft_term: None,
            etcd_version: String::new(),
            writer: "etcd-backup-restore".into(),
            outside: None,
            rollback_for: None,
        },
        footer: Footer {
            raw_bytes: raw,
            etcd_sha256,
            revision_after: None,
            revisions: delta.then_some(counts.0),
            events: delta.then_some(counts.1),
            signature: None,
        },
        size,
        payload_len: size,
    }
}

/// Reads one GBR object end to end and checks it: a full's etcd sha256, a delta's own sha256 and
/// its revisions (contiguous, from the name's start to its last). Hands `on_raw` what the warden's
/// own object of that kind would: etcd's stream, or the delta payload in `delta_codec`'s encoding.
pub async fn read_verified<F>(
    store: &Store,
    name: &SnapshotName,
    g: &GbrName,
    mut on_raw: F,
) -> Result<Verified, ObjectError>
where
    F: FnMut(&[u8]) -> Result<(), String>,
{
    if name.is_full() {
        let mut trailer = TrailerCheck::default();
        let (size, raw) = stream(store, name, g, |bytes| {
            trailer.update(bytes);
            on_raw(bytes)
        })
        .await?;
        let sha = trailer
            .verify()
            .ok_or_else(|| corrupt(name, "etcd's embedded sha256 does not match the database"))?;
        return Ok(verified(name, size, raw, Some(sha), (0, 0)));
    }
    let (size, json) = delta_json(store, name, g).await?;
    let mut payload = Vec::new();
    let (revisions, events) =
        delta_payload(name, g, &json, store.gbr_lease_ttl, &mut payload).map_err(|e| corrupt(name, e))?;
    on_raw(&payload).map_err(|e| corrupt(name, e))?;
    Ok(verified(
        name,
        size,
        payload.len() as u64,
        None,
        (revisions, events),
    ))
}

/// The object's bytes as the store hands them over.
async fn get(store: &Store, name: &SnapshotName) -> Result<object_store::GetResult, ObjectError> {
    store
        .inner
        .get(&Path::from(name.key()))
        .await
        .map_err(|e| unavailable(name, e))
}

/// Streams a GBR object's stored bytes through its decompressor into `sink`: a full's etcd stream,
/// or a delta's JSON and sha256. Returns the stored and the decompressed size.
async fn stream<F>(
    store: &Store,
    name: &SnapshotName,
    g: &GbrName,
    mut sink: F,
) -> Result<(u64, u64), ObjectError>
where
    F: FnMut(&[u8]) -> Result<(), String>,
{
    let got = get(store, name).await?;
    let size = got.meta.size;
    let mut stream = format::byte_stream(got);
    let mut de = decompressor(g.compression).map_err(|e| corrupt(name, e))?;
    let mut raw = 0u64;
    let decode = |e: std::io::Error| {
        corrupt(
            name,
            format!("decode the {} payload: {e}", g.compression.as_str()),
        )
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| unavailable(name, e))?;
        for piece in chunk.chunks(16 << 10) {
            de.write(piece).map_err(decode)?;
            let out = de.take();
            raw += out.len() as u64;
            sink(&out).map_err(|e| corrupt(name, e))?;
        }
    }
    let out = de.finish().map_err(decode)?;
    raw += out.len() as u64;
    sink(&out).map_err(|e| corrupt(name, e))?;
    Ok((size, raw))
}

/// A delta's JSON, its sha256 checked (the object's last 32 bytes after decompression).
async fn delta_json(store: &Store, name: &SnapshotName, g: &GbrName) -> Result<(u64, Vec<u8>), ObjectError> {
    let mut data = Vec::new();
    let (size, _) = stream(store, name, g, |bytes| {
        data.extend_from_slice(bytes);
        if data.len() > MAX_DELTA {
            return Err(format!("more than {MAX_DELTA} bytes after decompression"));
        }
        Ok(())
    })
    .await?;
    if data.len() <= 32 {
        return Err(corrupt(name, "the delta is missing its sha256"));
    }
    let (json, digest) = data.split_at(data.len() - 32);
    if Sha256::digest(json).as_slice() != digest {
        return Err(corrupt(name, "the delta's sha256 does not match its events"));
    }
    data.truncate(data.len() - 32);
    Ok((size, data))
}

/// GBR's events as the warden's delta payload: one revision record per mod_revision (a
/// transaction's events stay together, in their order), a lease record with `lease_ttl` before the
/// first put that names a lease. Returns the counts of revisions and events.
pub fn delta_payload(
    name: &SnapshotName,
    g: &GbrName,
    json: &[u8],
    lease_ttl: i64,
    out: &mut Vec<u8>,
) -> Result<(u64, u64), String> {
    let Kind::Delta { last, .. } = name.kind else {
        return Err("not a delta".into());
    };
    let events: Vec<TimedEvent> =
        serde_json::from_slice(json).map_err(|e| format!("the events are not GBR's JSON: {e}"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut seen_leases = std::collections::HashSet::new();
    // The revision being gathered, and the leases its puts name first.
    let mut current: Option<(Revision, Vec<i64>)> = None;
    let (mut revisions, mut count) = (0u64, 0u64);
    let mut next = g.start;
    let mut flush = |(r, leases): (Revision, Vec<i64>), out: &mut Vec<u8>| -> Result<(), String> {
        if r.revision != next {
            return Err(format!("revision {} where {next} was expected", r.revision));
        }
        next += 1;
        revisions += 1;
        for id in leases {
            let lease = Lease {
                id,
                granted_ttl: lease_ttl,
            };
            delta_codec::encode_lease(&lease, out);
        }
        delta_codec::encode_revision(&r, out);
        Ok(())
    };
    for (i, te) in events.into_iter().enumerate() {
        let kv = te.event.kv.unwrap_or_default();
        let bytes = |s: Option<String>, what: &str| -> Result<Vec<u8>, String> {
            s.map(|s| b64.decode(s))
                .transpose()
                .map_err(|e| format!("event {i}: its {what} is not base64: {e}"))
                .map(Option::unwrap_or_default)
        };
        let key = bytes(kv.key, "key")?;
        if key.is_empty() {
            return Err(format!("event {i} has no key"));
        }
        let kind = match te.event.kind {
            0 => EventType::Put,
            1 => EventType::Delete,
            k => return Err(format!("event {i} has the unknown type {k}")),
        };
        let event = Event {
            kind,
            value: bytes(kv.value, "value")?,
            key,
            lease: if kind == EventType::Put { kv.lease } else { 0 },
            create_revision: kv.create_revision,
            version: kv.version,
        };
        if current
            .as_ref()
            .is_some_and(|(r, _)| r.revision != kv.mod_revision)
            && let Some(done) = current.take()
        {
            flush(done, out)?;
        }
        let (r, leases) = current.get_or_insert_with(|| {
            (
                Revision {
                    revision: kv.mod_revision,
                    events: Vec::new(),
                },
                Vec::new(),
            )
        });
        // Announced right before the revision whose put first names it, as the warden's own
        // deltas do: a restore that stops before that revision grants nothing.
        if event.lease != 0 && seen_leases.insert(event.lease) {
            leases.push(event.lease);
        }
        r.events.push(event);
        count += 1;
    }
    if let Some(done) = current.take() {
        flush(done, out)?;
    }
    if next != last + 1 {
        return Err(format!(
            "the events end at revision {}, the name says {last}",
            next - 1
        ));
    }
    Ok((revisions, count))
}

/// [`crate::snapshot::verify::read_full_to_file`] for a GBR full: the download here, decompression,
/// etcd's sha256 and the file writes on the worker thread.
pub async fn read_full_to_file(
    store: &Store,
    name: &SnapshotName,
    g: &GbrName,
    path: &std::path::Path,
    progress: &crate::telemetry::Progress,
) -> Result<Verified, ObjectError> {
    let file = std::fs::File::create(path)
        .map_err(|e| ObjectError::Local(format!("create {}: {e}", path.display())))?;
    let de = decompressor(g.compression).map_err(|e| corrupt(name, e))?;
    let done = Arc::new(AtomicU64::new(0));
    // GBR's objects claim no size: their etcd sha256 is the check, at the end, and what they may
    // decompress to is the free space (64 MiB kept), so a compression bomb stops before the disk
    // is full, as a bad object.
    let room = crate::snapshot::verify::free_bytes(path)
        .map(|free| (free.saturating_sub(64 << 20), "the disk has free"));
    let worker = FullWorker::start(Unpacker::from(de), file, path.to_owned(), done.clone(), room);
    let key = name.key();
    let started = std::time::Instant::now();
    let got = get(store, name).await?;
    let size = got.meta.size;
    let mut stream = format::byte_stream(got);
    let mut read = Ok(());
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                progress.tick(|| {
                    format!(
                        "downloading {key}: {}",
                        crate::telemetry::rate_line(
                            done.load(std::sync::atomic::Ordering::Relaxed),
                            None,
                            started.elapsed(),
                            "B"
                        )
                    )
                });
                if worker.send(c.to_vec()).is_err() {
                    break; // the worker's own error says why
                }
            }
            Err(e) => {
                read = Err(unavailable(name, e));
                break;
            }
        }
    }
    let written = worker.finish().await;
    let (raw, trailer) = match (read, written) {
        (Err(e @ ObjectError::Unavailable(_)), _) => return Err(e),
        (_, Err(ObjectError::Corrupt(e))) => return Err(corrupt(name, e)),
        (_, Err(e)) => return Err(e),
        (Err(e), _) => return Err(e),
        (Ok(()), Ok(w)) => w,
    };
    let sha = trailer
        .verify()
        .ok_or_else(|| corrupt(name, "etcd's embedded sha256 does not match the database"))?;
    Ok(verified(name, size, raw, Some(sha), (0, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(key: &str) -> (SnapshotName, GbrName) {
        let n = crate::store::gbr::names::parse(key).unwrap();
        let crate::store::layout::Layout::Gbr(g) = n.layout else {
            unreachable!()
        };
        (n, g)
    }

    #[test]
    fn events_become_one_revision_record_per_mod_revision() {
        // What GBR wrote for: put a=1 (lease 7), txn { put b, delete a }, put c.
        let json = br#"[{"etcdEvent":{"kv":{"key":"YQ==","create_revision":5,"mod_revision":5,"version":1,"value":"MQ==","lease":7}},"time":"2026-12-01T10:00:00.1Z"},{"etcdEvent":{"kv":{"key":"Yg==","create_revision":6,"mod_revision":6,"version":1}},"time":"2026-12-01T10:00:00.2+01:00"},{"etcdEvent":{"type":1,"kv":{"key":"YQ==","mod_revision":6}},"time":"2026-12-01T10:00:00.2Z"},{"etcdEvent":{"kv":{"key":"Yw==","create_revision":7,"mod_revision":7,"version":1,"value":"eA=="}},"time":"2026-12-01T10:00:00.3Z"}]"#;
        let (n, g) = delta("v2/Incr-00000005-00000007-1700000000.gz");
        let mut out = Vec::new();
        assert_eq!(delta_payload(&n, &g, json, 600, &mut out), Ok((3, 4)));
        let mut d = delta_codec::Decoder::new();
        let records = d.push(&out).unwrap();
        d.finish().unwrap();
        use delta_codec::Record;
        assert_eq!(
            records[0],
            Record::Lease(Lease {
                id: 7,
                granted_ttl: 600
            })
        );
        let Record::Revision(r6) = &records[2] else {
            panic!("{records:?}")
        };
        assert_eq!(r6.revision, 6);
        assert_eq!(
            r6.events
                .iter()
                .map(|e| (e.kind, e.key.clone()))
                .collect::<Vec<_>>(),
            [
                (EventType::Put, b"b".to_vec()),
                (EventType::Delete, b"a".to_vec())
            ]
        );
        assert!(r6.events[0].value.is_empty());
        // A lease first named by a later revision is announced right before that revision: a
        // restore that stops before it grants nothing.
        let later = br#"[{"etcdEvent":{"kv":{"key":"YQ==","create_revision":5,"mod_revision":5,"version":1,"value":"MQ=="}},"time":"2026-12-01T10:00:00.1Z"},{"etcdEvent":{"kv":{"key":"Yg==","create_revision":6,"mod_revision":6,"version":1,"lease":9}},"time":"2026-12-01T10:00:00.2Z"}]"#;
        let (n2, g2) = delta("v2/Incr-00000005-00000006-1700000000.gz");
        let mut out = Vec::new();
        delta_payload(&n2, &g2, later, 60, &mut out).unwrap();
        let kinds: Vec<String> = delta_codec::Decoder::new()
            .push(&out)
            .unwrap()
            .iter()
            .map(|r| match r {
                Record::Lease(l) => format!("lease {}", l.id),
                Record::LeaseSet(s) => format!("lease set of {}", s.len()),
                Record::Revision(r) => format!("revision {}", r.revision),
            })
            .collect();
        assert_eq!(kinds, ["revision 5", "lease 9", "revision 6"]);
        // A name whose range the events do not fill is corrupt, as is a revision missing inside.
        let (short, g2) = delta("v2/Incr-00000005-00000008-1700000000.gz");
        assert!(
            delta_payload(&short, &g2, json, 600, &mut Vec::new())
                .unwrap_err()
                .contains("end at revision 7")
        );
        let (late, g3) = delta("v2/Incr-00000004-00000007-1700000000.gz");
        assert!(
            delta_payload(&late, &g3, json, 600, &mut Vec::new())
                .unwrap_err()
                .contains("where 4 was expected")
        );
    }
}

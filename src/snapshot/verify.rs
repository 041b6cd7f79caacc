//! `backups verify`: every object's framing and digest, a full snapshot's embedded etcd checksum,
//! every delta's records (contiguous revisions within its range), and each chain's continuity from
//! its full snapshot. Reads stream; nothing is held whole in memory.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::compress::Unpacker;
use super::full::TrailerCheck;
use crate::format::delta_codec::{Decoder, Record};
use crate::store::format::{self, Verified};
use crate::store::layout::{Encryption, Kind, Layout, SnapshotName};
use crate::store::{Store, StoreError};

#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    pub key: String,
    pub ok: bool,
    pub error: Option<String>,
    pub stored_bytes: u64,
    pub raw_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    pub objects: Vec<ObjectReport>,
    /// Chain problems: gaps, overlaps, deltas without a full snapshot.
    pub chain_errors: Vec<String>,
    /// What is worth knowing but no problem: GBR deltas whose full GBR's own garbage collection
    /// removed first (it may keep deltas longer than their full).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.chain_errors.is_empty() && self.objects.iter().all(|o| o.ok)
    }
}

/// Why an object could not be read: the store did not answer (worth retrying, never a reason to
/// prefer older data), or the object itself is missing, damaged or undecodable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectError {
    Unavailable(String),
    Corrupt(String),
    /// This machine failed while taking the object in (a full disk): neither the store's fault nor
    /// the object's.
    Local(String),
}

impl ObjectError {
    fn from_format(e: format::FormatError) -> Self {
        let text = crate::telemetry::error_chain(&e);
        match e {
            format::FormatError::Read {
                source: object_store::Error::NotFound { .. },
                ..
            } => Self::Corrupt(format!("{text} (missing)")),
            format::FormatError::Read { .. } | format::FormatError::Write { .. } => Self::Unavailable(text),
            format::FormatError::Corrupt { .. } => Self::Corrupt(text),
        }
    }
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(e) => write!(f, "store unavailable: {e}"),
            Self::Corrupt(e) | Self::Local(e) => f.write_str(e),
        }
    }
}

impl From<ObjectError> for String {
    fn from(e: ObjectError) -> Self {
        e.to_string()
    }
}

/// Checks one object end to end. An age-encrypted object read without an identity is checked as
/// far as that allows: its framing and the digest of its (encrypted) payload, which the store's
/// holder can verify without being able to read it.
pub async fn verify_object(store: &Store, name: &SnapshotName) -> Result<Verified, String> {
    if !name.is_own() {
        return read_verified(store, name, |_| Ok(())).await.map_err(String::from);
    }
    if name.encryption == Encryption::Age && store.keys.identities.is_empty() {
        return format::read_object(
            store.inner.as_ref(),
            &name.key(),
            &store.keys.signing,
            |_, _, _| Ok(()),
        )
        .await
        .map_err(|e| crate::telemetry::error_chain(&e));
    }
    read_verified(store, name, |_| Ok(())).await.map_err(String::from)
}

/// Stored bytes decompressed per step in `read_verified` (a delta compresses ~60:1 at best).
const SLICE: usize = 16 << 10;

/// Reads one object end to end, handing every decompressed payload byte to `on_raw` in order, and
/// checks everything `verify_object` checks. For a full snapshot the bytes are etcd's stream as it
/// was received (the database followed by its sha256), ready for `etcdutl snapshot restore`.
/// Callers must not use what they received unless this returns `Ok`.
pub async fn read_verified<F>(store: &Store, name: &SnapshotName, on_raw: F) -> Result<Verified, ObjectError>
where
    F: FnMut(&[u8]) -> Result<(), String>,
{
    if name.encryption != Encryption::Age || matches!(name.layout, Layout::Gbr(_)) {
        store
            .keys
            .unencrypted_allowed(&name.key())
            .map_err(ObjectError::Corrupt)?;
    }
    if let Layout::Gbr(g) = &name.layout {
        // etcd-backup-restore signs nothing: with signing on, only those named are read.
        store
            .keys
            .signing
            .unsigned(&name.key(), "is etcd-backup-restore's (never signed)")
            .map_err(ObjectError::Corrupt)?;
        return crate::snapshot::gbr::read_verified(store, name, g, on_raw).await;
    }
    let mut unavailable = None;
    read_checked(store, name, on_raw, &mut unavailable)
        .await
        .map_err(|e| match unavailable.take() {
            Some(store_error) => store_error,
            None if e.starts_with(&name.key()) => ObjectError::Corrupt(e),
            None => ObjectError::Corrupt(format!("{}: {e}", name.key())),
        })
}

/// `read_verified` with every failure as text; a failure to read the object (rather than a check
/// that failed) is also left in `failed`, typed.
async fn read_checked<F>(
    store: &Store,
    name: &SnapshotName,
    mut on_raw: F,
    failed: &mut Option<ObjectError>,
) -> Result<Verified, String>
where
    F: FnMut(&[u8]) -> Result<(), String>,
{
    let key = name.key();
    let mut de: Option<Unpacker> = None;
    let mut trailer = TrailerCheck::default();
    let mut decoder = Decoder::new();
    let mut next_rev: Option<i64> = None;
    let mut revisions = 0u64;
    let mut events = 0u64;
    let mut raw = 0u64;
    let (first, last) = match name.kind {
        Kind::Delta { first, last, .. } => (first, last),
        Kind::Full { .. } => (0, 0),
    };
    let is_full = name.is_full();
    // What the footer claims the payload decodes to: nothing past it reaches `on_raw` (a bomb
    // stops at its claim, not at the end of the disk). Known once the first chunk arrives.
    let claim = AtomicU64::new(u64::MAX);
    let mut consume = |out: Vec<u8>| -> Result<(), String> {
        raw += out.len() as u64;
        if raw > claim.load(Ordering::Relaxed) {
            return Err(format!(
                "the payload decompresses past the {} bytes its footer claims",
                claim.load(Ordering::Relaxed)
            ));
        }
        on_raw(&out)?;
        if is_full {
            trailer.update(&out);
            return Ok(());
        }
        for rec in decoder.push(&out).map_err(|e| e.to_string())? {
            if let Record::Revision(r) = rec {
                let want = next_rev.unwrap_or(first);
                if r.revision != want {
                    return Err(format!("revision {} where {want} was expected", r.revision));
                }
                next_rev = Some(r.revision + 1);
                revisions += 1;
                events += r.events.len() as u64;
            }
        }
        Ok(())
    };
    let verified = format::read_object(store.inner.as_ref(), &key, &store.keys.signing, |h, f, chunk| {
        claim.store(f.raw_bytes, Ordering::Relaxed);
        let d = match de.as_mut() {
            Some(d) => d,
            None => {
                de.insert(Unpacker::new(h.compression, h.encryption, &store.keys).map_err(|e| e.to_string())?)
            }
        };
        // In slices, so what one step decompresses stays small however large the chunk the store
        // handed over (a whole object, when it was fetched ahead) and however well it compressed.
        for piece in chunk.chunks(SLICE) {
            d.write(piece).map_err(|e| format!("decode the payload: {e}"))?;
            consume(d.take())?;
        }
        Ok(())
    })
    .await
    .map_err(|e| {
        let e = ObjectError::from_format(e);
        *failed = Some(e.clone());
        e.to_string()
    })?;
    if let Some(d) = de {
        consume(d.finish().map_err(|e| format!("decode the payload: {e}"))?)?;
    }
    if raw != verified.footer.raw_bytes {
        return Err(format!(
            "{raw} bytes after decompression, footer says {}",
            verified.footer.raw_bytes
        ));
    }
    if is_full {
        check_etcd_sha256(&verified, trailer)?;
    } else {
        decoder.finish().map_err(|e| e.to_string())?;
        if next_rev != Some(last + 1) {
            return Err(format!(
                "delta ends at revision {:?}, name says {last}",
                next_rev.map(|r| r - 1)
            ));
        }
        if verified.footer.revisions != Some(revisions) || verified.footer.events != Some(events) {
            return Err("revision or event count differs from the footer".into());
        }
    }
    Ok(verified)
}

/// Verifies every object and chain in the store.
pub async fn verify_store(store: &Store) -> Result<Report, StoreError> {
    let mut report = Report::default();
    let (fulls, chains) = store.catalog_with_meta().await?;
    let mut check = |name: &SnapshotName, r: Result<Verified, String>| {
        report.objects.push(match r {
            Ok(v) => ObjectReport {
                key: name.key(),
                ok: true,
                error: None,
                stored_bytes: v.size,
                raw_bytes: v.footer.raw_bytes,
            },
            Err(e) => ObjectReport {
                key: name.key(),
                ok: false,
                error: Some(e),
                stored_bytes: 0,
                raw_bytes: 0,
            },
        });
    };
    for (name, _) in &fulls {
        let r = verify_object(store, name).await;
        check(name, r);
    }
    let starts: Vec<_> = fulls.iter().filter_map(|(n, _)| n.chain()).collect();
    let mut chain_errors = Vec::new();
    let mut notes = Vec::new();
    for (chain, deltas) in chains {
        if !starts.contains(&chain) {
            if deltas.iter().all(|(d, _)| d.is_orphan()) {
                notes.push(format!(
                    "{} etcd-backup-restore deltas from revision {} on extend no full in the store (its garbage collection removed it); no restore uses them",
                    deltas.len(),
                    chain.base + 1
                ));
            } else {
                chain_errors.push(format!("chain {chain}: no full snapshot starts it"));
            }
        }
        // Overlaps are legal (a handover between writers, a retried upload) when the shared
        // revisions carry the same events; anything else is two histories under one prefix.
        let mut seen: std::collections::HashMap<i64, [u8; 32]> = std::collections::HashMap::new();
        let mut expected = chain.base + 1;
        for (name, _) in deltas {
            let Kind::Delta { first, last, .. } = name.kind else {
                continue;
            };
            if first > expected {
                chain_errors.push(format!(
                    "chain {chain}: {} starts at {first}, expected {expected} (a gap)",
                    name.key()
                ));
            }
            if name.encryption == Encryption::Age && store.keys.identities.is_empty() {
                let r = verify_object(store, &name).await;
                check(&name, r);
                expected = expected.max(last + 1);
                continue;
            }
            // One read: the object's checks, and each revision's digest on the way.
            let mut decoder = Decoder::new();
            let mut digests = Vec::new();
            let r = read_verified(store, &name, |raw| {
                for rec in decoder.push(raw).map_err(|e| e.to_string())? {
                    if let Record::Revision(r) = rec {
                        digests.push((r.revision, crate::format::delta_codec::revision_digest(&r)));
                    }
                }
                Ok(())
            })
            .await
            .map_err(String::from);
            if r.is_ok() {
                for (revision, digest) in digests {
                    if let Some(prev) = seen.insert(revision, digest)
                        && prev != digest
                    {
                        chain_errors.push(format!(
                            "chain {chain}: {} holds other events for revision {revision} than an earlier delta: two histories under one prefix",
                            name.key()
                        ));
                    }
                }
            }
            check(&name, r);
            expected = expected.max(last + 1);
        }
    }
    report.chain_errors = chain_errors;
    report.notes = notes;
    Ok(report)
}

/// etcd's own checksum: the stream's last 32 bytes are the sha256 of the database before them, and
/// that is the digest recorded at backup time.
fn check_etcd_sha256(verified: &Verified, trailer: TrailerCheck) -> Result<(), String> {
    let sha = trailer
        .verify()
        .ok_or("etcd's embedded sha256 does not match the database")?;
    if verified.footer.etcd_sha256.as_deref() != Some(sha.as_str()) {
        return Err("etcd's sha256 differs from the one recorded at backup time".into());
    }
    Ok(())
}

/// All records of a delta, verified.
pub async fn read_delta(store: &Store, name: &SnapshotName) -> Result<Vec<Record>, ObjectError> {
    let mut decoder = Decoder::new();
    let mut records = Vec::new();
    let mut err = None;
    read_verified(store, name, |raw| {
        match decoder.push(raw) {
            Ok(r) => records.extend(r),
            Err(e) => err = Some(e.to_string()),
        }
        Ok(())
    })
    .await?;
    match err {
        Some(e) => Err(ObjectError::Corrupt(format!("{}: {e}", name.key()))),
        None => Ok(records),
    }
}

/// Stored chunks in flight between the download and the worker of `read_full_to_file`: with the
/// store's chunks (up to 1 MiB from a file, smaller from HTTP) a few MiB at most.
const FULL_QUEUE: usize = 4;

/// Writes a full snapshot's etcd stream (database + sha256) to `path`, verified: everything
/// `verify_object` checks. The download and the object's digest run here; decryption,
/// decompression, etcd's sha256 and the file writes run on a thread of their own, a few chunks
/// behind, so the two halves overlap on two cores instead of taking turns.
pub async fn read_full_to_file(
    store: &Store,
    name: &SnapshotName,
    path: &std::path::Path,
    progress: &crate::telemetry::Progress,
) -> Result<Verified, ObjectError> {
    if name.encryption != Encryption::Age || matches!(name.layout, Layout::Gbr(_)) {
        store
            .keys
            .unencrypted_allowed(&name.key())
            .map_err(ObjectError::Corrupt)?;
    }
    if let Layout::Gbr(g) = &name.layout {
        // etcd-backup-restore signs nothing: with signing on, only those named are read.
        store
            .keys
            .signing
            .unsigned(&name.key(), "is etcd-backup-restore's (never signed)")
            .map_err(ObjectError::Corrupt)?;
        return crate::snapshot::gbr::read_full_to_file(store, name, g, path, progress).await;
    }
    let local = |e: String| ObjectError::Local(e);
    let key = name.key();
    // Through the gate first: its footer's claim, once it fits the object, bounds what the payload
    // may decompress to, and the file system must hold that much before a byte is written.
    let claimed = match crate::store::gate::check(store, name, None).await {
        Ok(c) => c.footer().map_or(0, |f| f.raw_bytes),
        Err(crate::store::gate::Refused::Bad(e)) => return Err(ObjectError::Corrupt(e)),
        Err(crate::store::gate::Refused::Unknown(e)) => return Err(ObjectError::Unavailable(e)),
    };
    let total = Some(claimed);
    free_space_for(path, claimed).map_err(local)?;
    let file = std::fs::File::create(path).map_err(|e| local(format!("create {}: {e}", path.display())))?;
    let (started, done) = (std::time::Instant::now(), std::sync::Arc::new(AtomicU64::new(0)));
    let line = |done: u64| {
        format!(
            "downloading {key}: {}",
            crate::telemetry::rate_line(done, total, started.elapsed(), "B")
        )
    };
    let mut worker: Option<FullWorker> = None;
    let mut file = Some(file);
    let read = format::read_object(store.inner.as_ref(), &key, &store.keys.signing, |h, _, chunk| {
        let w = match worker.as_mut() {
            Some(w) => w,
            None => {
                let unpacker =
                    Unpacker::new(h.compression, h.encryption, &store.keys).map_err(|e| e.to_string())?;
                let file = file.take().expect("the file goes to the first worker");
                worker.insert(FullWorker::start(
                    unpacker,
                    file,
                    path.to_owned(),
                    done.clone(),
                    Some((claimed, "its footer claims")),
                ))
            }
        };
        progress.tick(|| line(done.load(Ordering::Relaxed)));
        // The worker stopped: its own error says why.
        w.send(chunk.to_vec())
            .map_err(|()| "the writer stopped".to_owned())
    })
    .await;
    let written = match worker {
        Some(w) => Some(w.finish().await),
        None => None,
    };
    let corrupt = |e: String| ObjectError::Corrupt(format!("{key}: {e}"));
    let (verified, (raw, trailer)) = match (read.map_err(ObjectError::from_format), written) {
        // The store stopped answering: the worker then met a cut-off stream, which says nothing
        // about the object (a gzip or age payload fails its end check); retried, never "corrupt".
        (Err(e @ ObjectError::Unavailable(_)), _) => return Err(e),
        // The worker stopped first (a full disk, a payload that does not decode): the read then
        // failed only because the worker was gone.
        (_, Some(Err(ObjectError::Corrupt(e)))) => return Err(corrupt(e)),
        (_, Some(Err(e))) => return Err(e),
        (Err(e), _) => return Err(e),
        (Ok(v), Some(Ok(w))) => (v, w),
        // An object with an empty payload never started the worker.
        (Ok(v), None) => (v, (0, TrailerCheck::default())),
    };
    if raw != verified.footer.raw_bytes {
        return Err(corrupt(format!(
            "{raw} bytes after decompression, footer says {}",
            verified.footer.raw_bytes
        )));
    }
    check_etcd_sha256(&verified, trailer).map_err(corrupt)?;
    progress.update(line(raw));
    Ok(verified)
}

/// Room for `bytes` more in the file system that will hold `path` (with 64 MiB to spare), or why
/// not.
fn free_space_for(path: &std::path::Path, bytes: u64) -> Result<(), String> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let Some(free) = free_bytes(path) else {
        // Nothing to say about it: the writes will tell.
        return Ok(());
    };
    let needed = bytes.saturating_add(64 << 20);
    if free < needed {
        return Err(format!(
            "{} has {free} bytes free; the snapshot needs {needed} ({bytes} and 64 MiB to spare): free space there or restore elsewhere",
            dir.display()
        ));
    }
    Ok(())
}

/// The bytes free on the file system that holds `path` (its directory), for its owner.
pub(crate) fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let fs = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(fs.blocks_available().saturating_mul(fs.fragment_size()))
}

/// The second half of `read_full_to_file`: stored bytes in, etcd's stream out to the file, counted
/// and checksummed on the way. One thread decrypts, decompresses and writes; etcd's sha256 runs on
/// a second one over the same batches (on two cores, hashing 1 GiB costs about what decompressing
/// it does, so the two halves overlap instead of taking turns).
pub(crate) struct FullWorker {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    thread: std::thread::JoinHandle<Result<(u64, TrailerCheck), ObjectError>>,
}

/// Decompressed bytes go to the file and the hasher in batches of this size.
const FULL_BATCH: usize = 256 << 10;
/// Batches the hasher may be behind the writer.
const HASH_QUEUE: usize = 2;

impl FullWorker {
    /// `limit`: the most bytes the payload may decompress to, and what sets it (its footer's
    /// claim; for objects that claim nothing, the free space); a stream that goes past it is
    /// corrupt and stops there, so a compression bomb never fills the disk.
    pub(crate) fn start(
        mut unpacker: Unpacker,
        mut file: std::fs::File,
        path: std::path::PathBuf,
        done: std::sync::Arc<AtomicU64>,
        limit: Option<(u64, &'static str)>,
    ) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(FULL_QUEUE);
        let thread = std::thread::spawn(move || {
            use std::io::Write;
            use std::sync::Arc;
            let (to_hasher, batches) = std::sync::mpsc::sync_channel::<Arc<Vec<u8>>>(HASH_QUEUE);
            let hasher = std::thread::Builder::new()
                .name("snapshot-sha256".into())
                .spawn(move || {
                    let mut trailer = TrailerCheck::default();
                    for batch in batches {
                        trailer.update(&batch);
                    }
                    trailer
                })
                .map_err(|e| ObjectError::Local(format!("start the snapshot hasher: {e}")))?;
            let mut raw = 0u64;
            let mut emit = |bytes: Vec<u8>| -> Result<(), ObjectError> {
                raw += bytes.len() as u64;
                if let Some((limit, what)) = limit.filter(|(l, _)| raw > *l) {
                    return Err(ObjectError::Corrupt(format!(
                        "the payload decompresses past the {limit} bytes {what}"
                    )));
                }
                done.store(raw, Ordering::Relaxed);
                let bytes = Arc::new(bytes);
                to_hasher
                    .send(bytes.clone())
                    .map_err(|_| ObjectError::Local("the snapshot hasher stopped".into()))?;
                file.write_all(&bytes)
                    .map_err(|e| ObjectError::Local(format!("write {}: {e}", path.display())))
            };
            let decode = |e: std::io::Error| ObjectError::Corrupt(format!("decode the payload: {e}"));
            for chunk in rx {
                for piece in chunk.chunks(SLICE) {
                    unpacker.write(piece).map_err(decode)?;
                    if let Some(batch) = unpacker.take_batch(FULL_BATCH) {
                        emit(batch)?;
                    }
                }
            }
            emit(unpacker.finish().map_err(decode)?)?;
            drop(to_hasher);
            let trailer = hasher
                .join()
                .map_err(|_| ObjectError::Local("the snapshot hasher panicked".into()))?;
            Ok((raw, trailer))
        });
        Self { tx, thread }
    }

    /// Hands one stored chunk over, waiting while the worker is `FULL_QUEUE` chunks behind.
    pub(crate) fn send(&self, chunk: Vec<u8>) -> Result<(), ()> {
        let send = || self.tx.send(chunk).map_err(|_| ());
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => send(),
            _ => tokio::task::block_in_place(send),
        }
    }

    /// Waits for the worker to take in everything sent.
    pub(crate) async fn finish(self) -> Result<(u64, TrailerCheck), ObjectError> {
        let Self { tx, thread } = self;
        drop(tx);
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|e| ObjectError::Local(format!("the snapshot writer: {e}")))?
            .map_err(|_| ObjectError::Local("the snapshot writer panicked".into()))?
    }
}

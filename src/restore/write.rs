//! The default way deltas reach a restored member: their revisions are written straight into its
//! bbolt file (see `mvcc`), no etcd running. Also the per-revision decision that both this path and
//! the replay through a private etcd (`replay`) make.

use std::time::Instant;

use super::execute::Failure;
use super::plan::Candidate;
use crate::format::delta_codec::{Decoder, Record, Revision};
use crate::format::mvcc::MvccFile;
use crate::snapshot::verify::read_verified;
use crate::store::Store;
use crate::store::layout::{Kind, SnapshotName};
use crate::telemetry::Progress;

pub(super) enum Step {
    /// Already in the full snapshot (or an overlapping delta).
    Skip,
    /// Past the point-in-time target.
    Stop,
    Apply,
}

/// The revisions applied from deltas so far, by digest: a later delta that overlaps them (a
/// handover between writers, a retried upload) must carry the same events, or it belongs to
/// another history and its chain is cut before it.
#[derive(Default)]
pub(super) struct Applied(std::collections::HashMap<i64, u64>);

impl Applied {
    fn digest(r: &Revision) -> u64 {
        Self::short(&crate::format::delta_codec::revision_digest(r))
    }

    fn short(d: &[u8; 32]) -> u64 {
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    }

    /// Revisions the file already holds, by digest (`crate::format::delta_codec::revision_digest`):
    /// a delta that holds them must carry the same events.
    pub(super) fn known(digests: impl IntoIterator<Item = (i64, [u8; 32])>) -> Self {
        Self(digests.into_iter().map(|(r, d)| (r, Self::short(&d))).collect())
    }

    pub(super) fn record(&mut self, r: &Revision) {
        self.0.insert(r.revision, Self::digest(r));
    }

    /// A skipped revision that an earlier delta applied must be the same revision.
    pub(super) fn check(&self, r: &Revision, delta: &SnapshotName) -> Result<(), String> {
        match self.0.get(&r.revision) {
            Some(d) if *d != Self::digest(r) => Err(format!(
                "{} holds other events for revision {} than an earlier delta of its chain: two histories under one prefix",
                delta.key(),
                r.revision
            )),
            _ => Ok(()),
        }
    }
}

/// What to do with revision `r` when the member is at `current`.
pub(super) fn step(
    r: &Revision,
    current: i64,
    cand: &Candidate,
    delta: &SnapshotName,
) -> Result<Step, String> {
    if r.revision <= current {
        return Ok(Step::Skip);
    }
    if cand.stop_at.is_some_and(|s| r.revision > s) {
        return Ok(Step::Stop);
    }
    if r.revision != current + 1 {
        return Err(format!(
            "revision {} does not follow {current} in {}",
            r.revision,
            delta.key()
        ));
    }
    if r.events.is_empty() {
        return Err(format!(
            "revision {} has no events in {}",
            r.revision,
            delta.key()
        ));
    }
    Ok(Step::Apply)
}

pub(super) fn replay_progress(
    progress: &Progress,
    cand: &Candidate,
    i: usize,
    from: i64,
    current: i64,
    started: Instant,
) {
    progress.tick(|| {
        format!(
            "applying deltas: {} (revision {current}, delta {} of {})",
            crate::telemetry::rate_line(
                (current - from).max(0) as u64,
                Some((cand.target_revision - from).max(0) as u64),
                started.elapsed(),
                "revisions"
            ),
            i + 1,
            cand.deltas.len()
        )
    });
}

/// Deltas whose stored object is at most this large are fetched ahead into memory, up to
/// [`FETCH_AHEAD`] at once: a quiet cluster's chain is hundreds of small objects, and one round
/// trip after another to a remote store would dominate the restore. Larger ones stream at their
/// turn (their transfer time outweighs the round trip). Bounds what is held to ~20 MiB.
const FETCH_AHEAD_MAX_OBJECT: u64 = 2 << 20;
const FETCH_AHEAD: usize = 8;

/// Where to read one delta from: an in-memory copy fetched ahead, or the store itself.
async fn fetch_ahead(store: Store, name: SnapshotName) -> Store {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from(name.key());
    // Any failure here is left to the read at its turn, which reports it properly.
    let Ok(got) = store.inner.get(&path).await else {
        return store;
    };
    if got.meta.size > FETCH_AHEAD_MAX_OBJECT {
        return store;
    }
    let Ok(bytes) = got.bytes().await else {
        return store;
    };
    let mem = object_store::memory::InMemory::new();
    if mem.put(&path, bytes.into()).await.is_err() {
        return store;
    }
    Store {
        inner: std::sync::Arc::new(mem),
        ..store
    }
}

/// The chain's deltas, fetched ahead in order (small ones into memory, see `fetch_ahead`). Started
/// before the full snapshot is restored, so the first deltas are in hand when etcdutl finishes.
pub(super) struct DeltaFetcher {
    sources: tokio::sync::mpsc::Receiver<Store>,
    task: AbortOnDrop,
}

/// The fetching task ends with its fetcher (a failed attempt, the fallback to the replay).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl DeltaFetcher {
    pub(super) fn start(store: &Store, cand: &Candidate) -> Self {
        use futures_util::StreamExt;
        let (tx, sources) = tokio::sync::mpsc::channel::<Store>(1);
        let (store, deltas) = (store.clone(), cand.deltas.clone());
        let task = tokio::spawn(async move {
            let mut fetched = futures_util::stream::iter(deltas)
                .map(|n| fetch_ahead(store.clone(), n))
                .buffered(FETCH_AHEAD);
            while let Some(source) = fetched.next().await {
                if tx.send(source).await.is_err() {
                    return;
                }
            }
        });
        Self {
            sources,
            task: AbortOnDrop(task),
        }
    }
}

/// Writes the deltas' revisions into the restored db file (see `mvcc`), no etcd running. Runs on a
/// blocking thread: each delta streams through decompression, decoding and the bbolt writer a chunk
/// at a time, so memory stays flat however large a delta is, while small deltas are fetched ahead.
/// Records are written before their delta's digest is checked at its end; a failed check fails the
/// whole candidate, and nothing is committed to the file before every delta has verified.
/// What a write of deltas starts from and ends with besides them: the revisions the file already
/// holds, whose digests the skipped revisions must match (a catch-up's proof), and a last step
/// before the commit (a catch-up's reach check and revision bump).
#[derive(Default)]
pub(super) struct Around {
    pub known: Applied,
    pub before_commit: Option<BeforeCommit>,
}

pub(super) type BeforeCommit = Box<dyn FnOnce(&mut MvccFile) -> Result<(), String> + Send>;

pub(super) async fn write_deltas(
    fetcher: DeltaFetcher,
    file: MvccFile,
    cand: &Candidate,
    progress: &Progress,
    quiet: bool,
    around: Around,
) -> Result<(i64, u64), Failure> {
    let (cand, progress) = (cand.clone(), progress.clone());
    let handle = tokio::runtime::Handle::current();
    let DeltaFetcher { sources, task } = fetcher;
    let result = tokio::task::spawn_blocking(move || {
        write_deltas_blocking(&handle, sources, file, &cand, &progress, quiet, around)
    })
    .await
    .map_err(|e| Failure::Local(format!("write the deltas: {e}")));
    drop(task);
    result?
}

fn write_deltas_blocking(
    handle: &tokio::runtime::Handle,
    mut sources: tokio::sync::mpsc::Receiver<Store>,
    mut file: MvccFile,
    cand: &Candidate,
    progress: &Progress,
    quiet: bool,
    around: Around,
) -> Result<(i64, u64), Failure> {
    let (started, from) = (Instant::now(), file.revision());
    if !quiet {
        tracing::info!(
            revision = from,
            "full snapshot restored; writing the deltas into its db"
        );
    }
    if let Some(stop) = cand.stop_at
        && from > stop
    {
        // An older full may still reach the target.
        return Err(Failure::BadFull(format!(
            "the full snapshot already holds revision {from}, past the target {stop}"
        )));
    }
    let mut applied = 0u64;
    let mut applied_digests = around.known;
    for (i, delta) in cand.deltas.iter().enumerate() {
        let store = sources
            .blocking_recv()
            .ok_or_else(|| Failure::Local("the delta fetcher stopped early".into()))?;
        let mut decoder = Decoder::new();
        let mut stop = false;
        let mut pending_leases: std::collections::HashMap<i64, i64> = Default::default();
        // The revision the next record follows: a lease set is etcd's leases right after it.
        let mut at = match delta.kind {
            Kind::Delta { first, .. } => first - 1,
            _ => from,
        };
        // A failure to write into the db is this machine's, not the delta's.
        let mut write_failed = None;
        // Past a point-in-time target the rest of the delta is still read, for its digest.
        let read = handle.block_on(read_verified(&store, delta, |raw| {
            for rec in decoder.push(raw).map_err(|e| e.to_string())? {
                match rec {
                    _ if stop => {}
                    // Held until a revision this restore applies uses it: a delta written before
                    // the writer ordered them may hold a lease's record ahead of an earlier
                    // revision, where a point-in-time restore may stop.
                    Record::Lease(l) => {
                        pending_leases.insert(l.id, l.granted_ttl);
                    }
                    // Sets from before the full snapshot are older than what it holds.
                    Record::LeaseSet(set) if at >= from => file.set_leases(&set),
                    Record::LeaseSet(_) => {}
                    Record::Revision(r) => {
                        at = r.revision;
                        match step(&r, file.revision(), cand, delta)? {
                            Step::Skip => applied_digests.check(&r, delta)?,
                            Step::Stop => stop = true,
                            Step::Apply => {
                                for e in &r.events {
                                    if let Some(ttl) = pending_leases.remove(&e.lease) {
                                        file.add_lease(e.lease, ttl);
                                    }
                                }
                                file.apply(&r).map_err(|e| {
                                    let e = format!("write {} into the restored db: {e}", delta.key());
                                    write_failed = Some(e.clone());
                                    e
                                })?;
                                applied += 1;
                                applied_digests.record(&r);
                            }
                        }
                    }
                }
            }
            Ok(())
        }));
        if let Some(e) = write_failed {
            return Err(Failure::Local(e));
        }
        read.map_err(|e| Failure::delta(i, e))?;
        decoder.finish().map_err(|e| Failure::BadDelta {
            index: i,
            reason: format!("{}: {e}", delta.key()),
        })?;
        replay_progress(progress, cand, i, from, file.revision(), started);
        if stop {
            break;
        }
    }
    let revision = file.revision();
    if let Some(step) = around.before_commit {
        step(&mut file).map_err(Failure::Local)?;
    }
    file.commit()
        .map_err(|e| Failure::Local(format!("commit the restored db: {e}")))?;
    if !quiet {
        tracing::info!(
            revisions = applied,
            revision,
            secs = started.elapsed().as_secs_f64(),
            "deltas written into the restored db"
        );
    }
    Ok((revision, applied))
}

/// Appends `deltas` (in order, continuing the file's revision) to the db file of a restored member
/// that no etcd runs on, as a restore does: a standby following its store (`crate::standby`).
/// Nothing is committed unless every delta verified; the file's new revision and the number of
/// revisions written come back.
pub async fn extend(
    store: &Store,
    db: &std::path::Path,
    full: SnapshotName,
    deltas: Vec<SnapshotName>,
) -> Result<(i64, u64), String> {
    let file = MvccFile::open(db).map_err(|e| format!("open {}: {e}", db.display()))?;
    let target_revision = deltas.last().map_or(full.last_revision(), |d| d.last_revision());
    let cand = Candidate {
        full,
        deltas,
        target_revision,
        stop_at: None,
        gap: None,
    };
    let fetcher = DeltaFetcher::start(store, &cand);
    write_deltas(
        fetcher,
        file,
        &cand,
        &Progress::default(),
        true,
        Around::default(),
    )
    .await
    .map_err(|e| e.message(&cand))
}

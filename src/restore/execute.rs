//! Carrying out a restore plan, with nothing lost on the way (rule 3).
//!
//! Everything is built in `<data-dir>.restore-<time>/` beside the target, on the same filesystem:
//! the full snapshot is downloaded and verified, restored with etcd's own tool (etcdutl for 3.5+,
//! etcdctl for 3.4), and the deltas' revisions are written into the restored member's bbolt file in
//! etcd's own layout (`mvcc`), so revisions and every key's create/mod revision, version and lease
//! come out identical. Should that file be shaped in a way `bolt` does not handle, the deltas are
//! replayed through a private etcd on loopback ports instead, each original revision as exactly one
//! transaction. Only when that is complete is the result renamed into place. A candidate that
//! fails verification is reported and the next (older) one is tried.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use etcd_client::{Client, Compare, CompareOp, LeaseGrantOptions, Txn, TxnOp};
use thiserror::Error;

use super::mvcc::MvccFile;
use super::plan::{self, Candidate, Target};
use crate::pid1::{ExitStatus, Reaper, run_to_completion};
use crate::snapshot::delta_codec::{Decoder, EventType, Record, Revision};
use crate::snapshot::verify::{read_delta, read_full_to_file, read_verified};
use crate::store::layout::{Kind, SnapshotName};
use crate::store::{Store, StoreError};

pub use crate::telemetry::Progress;

/// What to restore into, with the cluster flags for the restored member.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub progress: Progress,
    pub data_dir: PathBuf,
    /// The etcd binary: runs the private etcd, and etcdutl/etcdctl are looked up beside it.
    pub etcd: PathBuf,
    /// etcdutl or etcdctl, when not beside etcd.
    pub tool: Option<PathBuf>,
    pub name: String,
    pub initial_cluster: Option<String>,
    pub initial_advertise_peer_urls: Option<String>,
    pub initial_cluster_token: Option<String>,
    pub target: Target,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreReport {
    pub full: String,
    pub deltas: usize,
    pub revisions_applied: u64,
    pub revision: i64,
    /// Candidates tried before the one used, with why they failed.
    pub skipped: Vec<(String, String)>,
    pub seconds: f64,
}

#[derive(Debug, Error)]
pub enum RestoreError {
    #[error("{path}: the target data dir is not empty (restore into a new or empty directory)")]
    NotEmpty { path: PathBuf },
    #[error("the store {url} has no backup that can be restored{detail}")]
    NoBackup { url: String, detail: String },
    #[error("every candidate failed: {0}")]
    AllFailed(String),
    #[error(
        "the restore tool {tool} does not run ({reason}); point --etcdutl at a working etcdutl (3.5+) or etcdctl (3.4), or --etcd at an etcd that has one beside it"
    )]
    Tool { tool: PathBuf, reason: String },
    #[error(
        "{key} is encrypted with age and no identity was given (pass --identity FILE, or --identity-file to run); not falling back to older backups"
    )]
    NoIdentity { key: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RestoreError + 'a {
    move |source| RestoreError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

impl RestoreOptions {
    /// A throwaway restore of the newest chain into `data_dir` (deep verify and the drill): a
    /// one-member cluster named `verify` on loopback, which etcdutl accepts.
    pub fn scratch(data_dir: PathBuf, etcd: PathBuf) -> Self {
        Self {
            progress: Progress::default(),
            data_dir,
            etcd,
            tool: None,
            name: "verify".into(),
            initial_cluster: Some("verify=http://127.0.0.1:2380".into()),
            initial_advertise_peer_urls: Some("http://127.0.0.1:2380".into()),
            initial_cluster_token: None,
            target: Target::Latest,
        }
    }
}

/// Whether a path is absent or an empty directory.
pub fn is_empty_dir(path: &Path) -> bool {
    match std::fs::read_dir(path) {
        Ok(mut it) => it.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Restores the store's best chain for `opts.target` into `opts.data_dir`.
pub async fn restore(
    store: &Store,
    opts: &RestoreOptions,
    reaper: &Reaper,
) -> Result<RestoreReport, RestoreError> {
    let started = Instant::now();
    if !is_empty_dir(&opts.data_dir) {
        return Err(RestoreError::NotEmpty {
            path: opts.data_dir.clone(),
        });
    }
    let (fulls, chains) = store.catalog().await?;
    let candidates = plan::candidates(
        &fulls,
        &|b| chains.get(&b).cloned().unwrap_or_default(),
        opts.target,
    );
    if candidates.is_empty() {
        let detail = if fulls.is_empty() {
            String::new()
        } else {
            format!(" for {:?}", opts.target)
        };
        return Err(RestoreError::NoBackup {
            url: store.url.to_string(),
            detail,
        });
    }
    // Without the key the newest backups cannot be read; an older plaintext chain would restore
    // older data than the operator has. Stop instead of falling back.
    if store.keys.identities.is_empty()
        && let Some(first) = candidates.first()
        && let Some(enc) = std::iter::once(&first.full)
            .chain(first.deltas.iter())
            .find(|n| n.encryption == crate::store::layout::Encryption::Age)
    {
        return Err(RestoreError::NoIdentity { key: enc.key() });
    }
    check_tool(opts, reaper).await?;
    let stamp = crate::store::layout::format_time(crate::store::layout::now_ms());
    let mut work = opts.data_dir.clone().into_os_string();
    work.push(format!(".restore-{stamp}"));
    let work = PathBuf::from(work);
    let mut skipped = Vec::new();
    for cand in candidates {
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(io("create the work dir", &work))?;
        tracing::info!(full = %cand.full.key(), deltas = cand.deltas.len(), target_revision = cand.target_revision, "restoring");
        match attempt(store, opts, reaper, &cand, &work).await {
            Ok((revision, applied)) => {
                let built = work.join("data");
                if opts.data_dir.exists() {
                    std::fs::remove_dir(&opts.data_dir)
                        .map_err(io("remove the empty target dir", &opts.data_dir))?;
                }
                if let Some(parent) = opts.data_dir.parent() {
                    std::fs::create_dir_all(parent).map_err(io("create the parent of", &opts.data_dir))?;
                }
                std::fs::rename(&built, &opts.data_dir)
                    .map_err(io("move the restored data into", &opts.data_dir))?;
                if let Some(parent) = opts.data_dir.parent() {
                    sync_path(parent);
                }
                let _ = std::fs::remove_dir_all(&work);
                if !skipped.is_empty() {
                    tracing::error!(used = %cand.full.key(), skipped = ?skipped, "restored from an OLDER chain: newer backups failed verification");
                }
                return Ok(RestoreReport {
                    full: cand.full.key(),
                    deltas: cand.deltas.len(),
                    revisions_applied: applied,
                    revision,
                    skipped,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            Err(reason) => {
                tracing::error!(full = %cand.full.key(), reason = %reason, "restore candidate failed; trying an older one");
                skipped.push((cand.full.key(), reason));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    Err(RestoreError::AllFailed(
        skipped
            .iter()
            .map(|(k, r)| format!("{k}: {r}"))
            .collect::<Vec<_>>()
            .join("; "),
    ))
}

/// The tool that restores a snapshot file: etcdutl beside etcd (3.5+), else etcdctl (3.4).
pub fn restore_tool(opts: &RestoreOptions) -> Option<PathBuf> {
    if let Some(t) = &opts.tool {
        return Some(t.clone());
    }
    ["etcdutl", "etcdctl"]
        .iter()
        .map(|n| opts.etcd.with_file_name(n))
        .find(|p| p.exists())
}

/// The restore tool answers `version` (before anything is downloaded): a broken etcdutl found on
/// PATH fails here, naming the file, instead of after the full snapshot's download.
async fn check_tool(opts: &RestoreOptions, reaper: &Reaper) -> Result<(), RestoreError> {
    let Some(tool) = restore_tool(opts) else {
        return Err(RestoreError::Tool {
            tool: opts.etcd.with_file_name("etcdutl"),
            reason: format!("neither etcdutl nor etcdctl is beside {}", opts.etcd.display()),
        });
    };
    let mut cmd = Command::new(&tool);
    cmd.env("ETCDCTL_API", "3").arg("version");
    let failed = |reason: String| RestoreError::Tool {
        tool: tool.clone(),
        reason,
    };
    match crate::pid1::run_bounded(reaper, &mut cmd, Some(Duration::from_secs(10))).await {
        Ok((ExitStatus::Code(0), out, _)) if out.to_ascii_lowercase().contains("version") => Ok(()),
        Ok((status, out, err)) => {
            let said = format!("{} {}", out.trim(), err.trim());
            let said: String = said
                .trim()
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect();
            Err(failed(format!("`{} version`: {status}: {said}", tool.display())))
        }
        Err(e) => Err(failed(format!("`{} version`: {e}", tool.display()))),
    }
}

async fn attempt(
    store: &Store,
    opts: &RestoreOptions,
    reaper: &Reaper,
    cand: &Candidate,
    work: &Path,
) -> Result<(i64, u64), String> {
    let db = work.join("snapshot.db");
    let t = Instant::now();
    opts.progress
        .step(format!("downloading and verifying {}", cand.full.key()));
    let verified = read_full_to_file(store, &cand.full, &db, &opts.progress).await?;
    tracing::info!(
        bytes = verified.footer.raw_bytes,
        secs = t.elapsed().as_secs_f64(),
        "full snapshot downloaded and verified"
    );

    let tool = restore_tool(opts)
        .ok_or_else(|| format!("neither etcdutl nor etcdctl beside {}", opts.etcd.display()))?;
    let data = work.join("data");
    let mut cmd = Command::new(&tool);
    if tool.file_name().is_some_and(|n| n == "etcdctl") {
        cmd.env("ETCDCTL_API", "3");
    }
    cmd.arg("snapshot")
        .arg("restore")
        .arg(&db)
        .arg("--data-dir")
        .arg(&data)
        .arg("--name")
        .arg(&opts.name);
    // etcdutl's own default names the member "default"; derive it from --name instead, as documented.
    let cluster = opts.initial_cluster.clone().unwrap_or_else(|| {
        let peer = opts
            .initial_advertise_peer_urls
            .as_deref()
            .unwrap_or("http://localhost:2380");
        format!("{}={peer}", opts.name)
    });
    cmd.arg("--initial-cluster").arg(cluster);
    if let Some(p) = &opts.initial_advertise_peer_urls {
        cmd.arg("--initial-advertise-peer-urls").arg(p);
    }
    if let Some(tok) = &opts.initial_cluster_token {
        cmd.arg("--initial-cluster-token").arg(tok);
    }
    opts.progress
        .step(format!("restoring the full snapshot with {}", tool.display()));
    let (status, _out, err) = run_to_completion(reaper, &mut cmd)
        .await
        .map_err(|e| format!("run {}: {e}", tool.display()))?;
    if status != ExitStatus::Code(0) {
        return Err(format!(
            "{} snapshot restore failed ({status}): {}",
            tool.display(),
            err.trim()
        ));
    }
    let _ = std::fs::remove_file(&db);

    let needs_deltas = !cand.deltas.is_empty() || cand.stop_at.is_some();
    if !needs_deltas {
        return Ok((cand.full.last_revision(), 0));
    }
    let db = data.join("member").join("snap").join("db");
    if std::env::var_os(REPLAY_THROUGH_ETCD).is_some() {
        tracing::info!("{REPLAY_THROUGH_ETCD} is set: replaying the deltas through a private etcd");
    } else {
        match MvccFile::open(&db) {
            Ok(file) => return write_deltas(store, file, cand, &opts.progress).await,
            // Checked before anything is written: the replay below still works on the file.
            Err(e) => {
                tracing::warn!(error = %e, db = %db.display(), "cannot write the deltas into the restored db directly; replaying them through a private etcd")
            }
        }
    }
    let private = PrivateEtcd::start(
        reaper,
        &opts.etcd,
        &data,
        &opts.name,
        &work.join("private-etcd.log"),
        true,
    )
    .await?;
    let result = apply_deltas(store, &private, cand, &opts.progress).await;
    private.stop().await;
    let (revision, applied) = result?;
    sync_tree(&data);
    Ok((revision, applied))
}

/// Set (to anything) to replay deltas through a private etcd instead of writing them into the
/// restored db directly: the slower path, kept as the fallback and for comparison.
pub const REPLAY_THROUGH_ETCD: &str = "ETCD_WARDEN_RESTORE_THROUGH_ETCD";

enum Step {
    /// Already in the full snapshot (or an overlapping delta).
    Skip,
    /// Past the point-in-time target.
    Stop,
    Apply,
}

/// What to do with revision `r` when the member is at `current`.
fn step(r: &Revision, current: i64, cand: &Candidate, delta: &SnapshotName) -> Result<Step, String> {
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

/// The next delta's records, fetched while the current one is applied.
type Prefetch = Option<tokio::task::JoinHandle<Result<Vec<Record>, String>>>;

async fn next_records(
    store: &Store,
    cand: &Candidate,
    i: usize,
    prefetch: &mut Prefetch,
) -> Result<Vec<Record>, String> {
    let records = match prefetch.take() {
        Some(h) => h.await.map_err(|e| e.to_string())??,
        None => read_delta(store, &cand.deltas[i]).await?,
    };
    if let Some(next) = cand.deltas.get(i + 1) {
        let (store, next) = (store.clone(), *next);
        *prefetch = Some(tokio::spawn(async move { read_delta(&store, &next).await }));
    }
    Ok(records)
}

fn replay_progress(
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

/// Writes the deltas' revisions into the restored db file (see `mvcc`), no etcd running. Runs on a
/// blocking thread: each delta streams through decompression, decoding and the bbolt writer a chunk
/// at a time, so memory stays flat however large a delta is, while small deltas are fetched ahead.
/// Records are written before their delta's digest is checked at its end; a failed check fails the
/// whole candidate, and nothing is committed to the file before every delta has verified.
async fn write_deltas(
    store: &Store,
    file: MvccFile,
    cand: &Candidate,
    progress: &Progress,
) -> Result<(i64, u64), String> {
    use futures_util::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::channel::<Store>(1);
    let fetcher = {
        let (store, deltas) = (store.clone(), cand.deltas.clone());
        tokio::spawn(async move {
            let mut sources = futures_util::stream::iter(deltas)
                .map(|n| fetch_ahead(store.clone(), n))
                .buffered(FETCH_AHEAD);
            while let Some(source) = sources.next().await {
                if tx.send(source).await.is_err() {
                    return;
                }
            }
        })
    };
    let (cand, progress) = (cand.clone(), progress.clone());
    let handle = tokio::runtime::Handle::current();
    let result =
        tokio::task::spawn_blocking(move || write_deltas_blocking(&handle, rx, file, &cand, &progress))
            .await
            .map_err(|e| format!("write the deltas: {e}"));
    fetcher.abort();
    result?
}

fn write_deltas_blocking(
    handle: &tokio::runtime::Handle,
    mut sources: tokio::sync::mpsc::Receiver<Store>,
    mut file: MvccFile,
    cand: &Candidate,
    progress: &Progress,
) -> Result<(i64, u64), String> {
    let (started, from) = (Instant::now(), file.revision());
    tracing::info!(
        revision = from,
        "full snapshot restored; writing the deltas into its db"
    );
    if let Some(stop) = cand.stop_at
        && from > stop
    {
        return Err(format!(
            "the full snapshot already holds revision {from}, past the target {stop}"
        ));
    }
    let mut applied = 0u64;
    for (i, delta) in cand.deltas.iter().enumerate() {
        let store = sources.blocking_recv().ok_or("the delta fetcher stopped early")?;
        let mut decoder = Decoder::new();
        let mut stop = false;
        // Past a point-in-time target the rest of the delta is still read, for its digest.
        handle.block_on(read_verified(&store, delta, |raw| {
            for rec in decoder.push(raw).map_err(|e| e.to_string())? {
                match rec {
                    _ if stop => {}
                    Record::Lease(l) => file.add_lease(l.id, l.granted_ttl),
                    Record::Revision(r) => match step(&r, file.revision(), cand, delta)? {
                        Step::Skip => {}
                        Step::Stop => stop = true,
                        Step::Apply => {
                            file.apply(&r)
                                .map_err(|e| format!("write {} into the restored db: {e}", delta.key()))?;
                            applied += 1;
                        }
                    },
                }
            }
            Ok(())
        }))?;
        decoder.finish().map_err(|e| e.to_string())?;
        replay_progress(progress, cand, i, from, file.revision(), started);
        if stop {
            break;
        }
    }
    let revision = file.revision();
    file.commit()
        .map_err(|e| format!("commit the restored db: {e}"))?;
    tracing::info!(
        revisions = applied,
        revision,
        secs = started.elapsed().as_secs_f64(),
        "deltas written into the restored db"
    );
    Ok((revision, applied))
}

/// The revision a private etcd on restored data serves.
pub(crate) async fn restored_revision(client: &mut Client) -> Result<i64, String> {
    Ok(client
        .get("\0", None)
        .await
        .map_err(|e| format!("read the restored revision: {e}"))?
        .header()
        .map(|h| h.revision())
        .unwrap_or(0))
}

async fn apply_deltas(
    store: &Store,
    private: &PrivateEtcd,
    cand: &Candidate,
    progress: &Progress,
) -> Result<(i64, u64), String> {
    let mut client = private.client().await?;
    let current = restored_revision(&mut client).await?;
    tracing::info!(revision = current, "full snapshot restored; applying deltas");
    let (replay_started, replay_from) = (Instant::now(), current);
    if let Some(stop) = cand.stop_at
        && current > stop
    {
        return Err(format!(
            "the full snapshot already holds revision {current}, past the target {stop}"
        ));
    }
    // Leases present in the snapshot and granted during replay are kept alive while we replay, so no
    // expiry inserts revisions the original history did not have.
    let mut leases: HashSet<i64> = client
        .leases()
        .await
        .map(|r| r.leases().iter().map(|l| l.id()).collect())
        .unwrap_or_default();
    let mut last_keepalive = Instant::now();
    let mut pipe = Pipeline::new(client.kv_client(), current);
    let mut prefetch: Prefetch = None;
    for (i, delta) in cand.deltas.iter().enumerate() {
        let records = next_records(store, cand, i, &mut prefetch).await?;
        for rec in records {
            match rec {
                Record::Lease(l) => {
                    if leases.contains(&l.id) || l.granted_ttl <= 0 {
                        continue;
                    }
                    match client
                        .lease_grant(l.granted_ttl, Some(LeaseGrantOptions::new().with_id(l.id)))
                        .await
                    {
                        Ok(_) => {
                            leases.insert(l.id);
                        }
                        Err(e) if e.to_string().contains("lease already exists") => {
                            leases.insert(l.id);
                        }
                        Err(e) => return Err(format!("grant lease {:x}: {e}", l.id)),
                    }
                }
                Record::Revision(r) => {
                    match step(&r, pipe.enqueued, cand, delta)? {
                        Step::Skip => continue,
                        Step::Stop => {
                            pipe.finish().await?;
                            return Ok((pipe.applied_rev, pipe.applied));
                        }
                        Step::Apply => {}
                    }
                    let ops: Vec<TxnOp> = r
                        .events
                        .iter()
                        .map(|e| match e.kind {
                            EventType::Put => {
                                let opts = (e.lease != 0 && leases.contains(&e.lease))
                                    .then(|| etcd_client::PutOptions::new().with_lease(e.lease));
                                TxnOp::put(e.key.clone(), e.value.clone(), opts)
                            }
                            EventType::Delete => TxnOp::delete(e.key.clone(), None),
                        })
                        .collect();
                    // The next transaction may only apply after this one: a key this revision puts
                    // carries it as mod_revision exactly then. A delete-only revision has no such
                    // proof (a key can also be absent because an earlier put was not applied yet),
                    // so the pipeline drains behind it instead.
                    let guard = r
                        .events
                        .iter()
                        .find(|e| e.kind == EventType::Put)
                        .map(|e| Compare::mod_revision(e.key.clone(), CompareOp::Equal, r.revision));
                    pipe.push(r.revision, ops, guard).await?;
                }
            }
            if last_keepalive.elapsed() > Duration::from_secs(1) && !leases.is_empty() {
                keep_alive(&mut client, &leases).await;
                last_keepalive = Instant::now();
            }
        }
        let current = pipe.applied_rev;
        if let Kind::Delta { last, .. } = delta.kind {
            tracing::debug!(
                delta = i + 1,
                of = cand.deltas.len(),
                revision = current,
                through = last,
                "delta applied"
            );
        }
        replay_progress(progress, cand, i, replay_from, current, replay_started);
    }
    pipe.finish().await?;
    tracing::info!(
        revisions = pipe.applied,
        reorders = pipe.reorders,
        revision = pipe.applied_rev,
        "deltas replayed"
    );
    Ok((pipe.applied_rev, pipe.applied))
}

/// How many transactions may be in flight during a replay.
const WINDOW: usize = 32;

type TxnFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<etcd_client::TxnResponse, etcd_client::Error>> + Send>,
>;

/// Replays revisions with up to [`WINDOW`] transactions in flight, still strictly in order: each
/// transaction carries a guard that holds only once the previous revision is applied (a key that
/// revision puts has it as mod_revision, which no other transaction can produce while an earlier
/// one is missing). A transaction that etcd happens to take before its predecessor fails the
/// guard, changes nothing, and is sent again; after a delete-only revision, which no key can prove,
/// the pipeline drains. So revision numbers and every key's mod_revision come out exactly as in the
/// original.
struct Pipeline {
    kv: etcd_client::KvClient,
    /// Sent transactions in order, and their responses in the same order. The futures live on this
    /// task (not spawned), so requests go on the wire in order and etcd rarely reorders them.
    window: std::collections::VecDeque<(i64, Txn)>,
    inflight: futures_util::stream::FuturesOrdered<TxnFuture>,
    prev_guard: Option<Compare>,
    /// The last revision handed to the pipeline.
    enqueued: i64,
    /// The last revision confirmed applied.
    applied_rev: i64,
    applied: u64,
    /// Times etcd took a transaction before its predecessor (each costs one resend round).
    reorders: u64,
}

impl Pipeline {
    fn new(kv: etcd_client::KvClient, current: i64) -> Self {
        Self {
            kv,
            window: std::collections::VecDeque::new(),
            inflight: futures_util::stream::FuturesOrdered::new(),
            prev_guard: None,
            enqueued: current,
            applied_rev: current,
            applied: 0,
            reorders: 0,
        }
    }

    fn send(&mut self, rev: i64, txn: Txn) {
        let mut kv = self.kv.clone();
        let t = txn.clone();
        self.inflight.push_back(Box::pin(async move { kv.txn(t).await }));
        self.window.push_back((rev, txn));
    }

    async fn next_response(&mut self, rev: i64) -> Result<etcd_client::TxnResponse, String> {
        use futures_util::StreamExt;
        match self.inflight.next().await {
            Some(r) => r.map_err(|e| format!("apply revision {rev}: {e}")),
            None => Err(format!("no response for revision {rev}")),
        }
    }

    async fn push(
        &mut self,
        rev: i64,
        ops: Vec<TxnOp>,
        guard_for_next: Option<Compare>,
    ) -> Result<(), String> {
        let txn = match self.prev_guard.take() {
            Some(g) => Txn::new().when(vec![g]).and_then(ops),
            None => Txn::new().and_then(ops),
        };
        self.enqueued = rev;
        self.send(rev, txn);
        match guard_for_next {
            Some(g) => self.prev_guard = Some(g),
            // No key proves this revision applied: wait until it is, so the next needs no guard.
            None => self.finish().await?,
        }
        while self.window.len() >= WINDOW {
            self.complete_front().await?;
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<(), String> {
        while !self.window.is_empty() {
            self.complete_front().await?;
        }
        Ok(())
    }

    fn confirm(&mut self, rev: i64, resp: &etcd_client::TxnResponse) -> Result<(), String> {
        let got = resp.header().map(|h| h.revision()).unwrap_or(0);
        if got != rev {
            return Err(format!("applying revision {rev} produced revision {got}"));
        }
        self.applied_rev = rev;
        self.applied += 1;
        Ok(())
    }

    async fn complete_front(&mut self) -> Result<(), String> {
        let Some((rev, txn)) = self.window.pop_front() else {
            return Ok(());
        };
        let resp = self.next_response(rev).await?;
        if resp.succeeded() {
            return self.confirm(rev, &resp);
        }
        // Taken before its predecessor. Everything after it fails its guard too; collect them,
        // apply this one alone (its predecessor is confirmed now), then send the rest again.
        let mut rest = Vec::new();
        while let Some((r, t)) = self.window.pop_front() {
            let resp = self.next_response(r).await?;
            if resp.succeeded() {
                return Err(format!("revision {r} was applied out of order"));
            }
            rest.push((r, t));
        }
        let resp = self
            .kv
            .txn(txn)
            .await
            .map_err(|e| format!("apply revision {rev}: {e}"))?;
        if !resp.succeeded() {
            return Err(format!(
                "revision {rev} failed its order guard after its predecessor was applied"
            ));
        }
        self.confirm(rev, &resp)?;
        self.reorders += 1;
        tracing::debug!(
            revision = rev,
            resent = rest.len(),
            "replay reordered by etcd; resending"
        );
        for (r, t) in rest {
            self.send(r, t);
        }
        Ok(())
    }
}

async fn keep_alive(client: &mut Client, leases: &HashSet<i64>) {
    for id in leases {
        if let Ok((mut keeper, mut stream)) = client.lease_keep_alive(*id).await {
            let _ = keeper.keep_alive().await;
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.message()).await;
        }
    }
}

/// A throwaway etcd on loopback ports that only the restore knows.
pub(crate) struct PrivateEtcd {
    pid: u32,
    exit: tokio::sync::oneshot::Receiver<ExitStatus>,
    endpoint: String,
    stopped: bool,
}

impl Drop for PrivateEtcd {
    /// An interrupted restore must not leave the private etcd running.
    fn drop(&mut self) {
        if !self.stopped {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("find a free loopback port: {e}"))
}

impl PrivateEtcd {
    /// Starts etcd on `data` with client and peer listeners on loopback ports nobody else is told.
    /// `scratch`: the dir is a restore's work dir, so fsync may be skipped (3.5+) and done once
    /// before the swap; on a real data dir every write is synced as usual.
    pub(crate) async fn start(
        reaper: &Reaper,
        etcd: &Path,
        data: &Path,
        name: &str,
        log_path: &Path,
        scratch: bool,
    ) -> Result<Self, String> {
        let log_path = log_path.to_owned();
        // Where its errors go, so that a failed start can say why. Failing to create that file is
        // the environment's problem, never evidence against the data dir: carry on without it.
        let log: std::process::Stdio = match std::fs::File::create(&log_path) {
            Ok(f) => f.into(),
            Err(e) => {
                tracing::warn!(path = %log_path.display(), error = %e, "cannot create the private etcd's log; running it without one");
                std::process::Stdio::null()
            }
        };
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client_port}");
        let (_, version, _) = run_to_completion(reaper, Command::new(etcd).arg("--version"))
            .await
            .map_err(|e| format!("run {} --version: {e}", etcd.display()))?;
        // Own process group, parent-death signal, no warden variables: like the supervised etcd.
        let mut cmd = crate::supervisor::Launch {
            program: etcd.to_owned(),
            args: Vec::new(),
        }
        .command();
        cmd.arg("--name")
            .arg(name)
            .arg("--data-dir")
            .arg(data)
            .arg("--listen-client-urls")
            .arg(&endpoint)
            .arg("--advertise-client-urls")
            .arg(&endpoint)
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer_port}"))
            .arg("--log-level")
            .arg("error")
            .arg("--quota-backend-bytes")
            .arg((8u64 << 30).to_string())
            // A replayed revision is one transaction however many keys it changed (a range delete
            // of thousands of keys is one revision), and as large as the original allowed.
            .arg("--max-txn-ops")
            .arg((1u32 << 20).to_string())
            .arg("--max-request-bytes")
            .arg((64u32 << 20).to_string())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        if scratch && !version.contains("etcd Version: 3.4") {
            // 3.5+: skip fsync while replaying; the warden syncs the files once before the swap.
            cmd.arg("--unsafe-no-fsync");
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        let spawned = reaper
            .spawn(&mut cmd)
            .map_err(|e| format!("start the private etcd: {e}"))?;
        let mut me = Self {
            pid: spawned.pid,
            exit: spawned.exit,
            endpoint,
            stopped: false,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(status) = me.exit.try_recv() {
                me.stopped = true;
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: String = log.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
                return Err(format!("the private etcd exited at start ({status}): {tail}"));
            }
            if let Ok(mut c) = me.client().await
                && c.get("\0", Some(etcd_client::GetOptions::new().with_serializable()))
                    .await
                    .is_ok()
            {
                return Ok(me);
            }
            if Instant::now() > deadline {
                me.stop().await;
                return Err("the private etcd did not come up within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn client(&self) -> Result<Client, String> {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(30));
        Client::connect([self.endpoint.as_str()], Some(opts))
            .await
            .map_err(|e| format!("connect to the private etcd: {e}"))
    }

    pub(crate) async fn stop(mut self) {
        self.stopped = true;
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(30), &mut self.exit)
            .await
            .is_err()
        {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.exit).await;
        }
    }
}

fn sync_path(p: &Path) {
    if let Ok(f) = std::fs::File::open(p) {
        let _ = f.sync_all();
    }
}

/// fsyncs every file and directory under `root` (the private etcd ran without fsync).
fn sync_tree(root: &Path) {
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    sync_path(&p);
                }
            }
        }
        sync_path(&d);
    }
}

/// A time for `--to-time`.
pub fn parse_time(s: &str) -> Result<u64, String> {
    humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("{s:?}: {e} (write RFC 3339, e.g. 2026-11-29T16:30:00Z)"))?
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .map_err(|_| format!("{s:?}: before 1970"))
}

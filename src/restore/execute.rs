//! Carrying out a restore plan, with nothing lost on the way (rule 3).
//!
//! Everything is built in `<data-dir>.restore-<time>/` beside the target, on the same filesystem:
//! the full snapshot is downloaded and verified, restored with etcd's own tool (etcdutl for 3.5+,
//! etcdctl for 3.4), and the deltas' revisions are written into the restored member's bbolt file in
//! etcd's own layout (`write`, `mvcc`), so revisions and every key's create/mod revision, version
//! and lease come out identical. Should that file be shaped in a way `bolt` does not handle, the
//! deltas are replayed through a private etcd on loopback ports instead (`replay`), each original
//! revision as exactly one transaction. Only when that is complete is the result renamed into
//! place. A candidate that fails verification is reported and the next (older) one is tried.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::plan::{self, Candidate, Target};
use crate::etcd::dirs::is_empty_dir;
use crate::etcd::private::PrivateEtcd;
use crate::format::mvcc::MvccFile;
use crate::process::pid1::{ExitStatus, Reaper};
use crate::snapshot::verify::{ObjectError, read_full_to_file};
use crate::store::{Store, StoreError};

pub use crate::telemetry::Progress;

/// What to restore into, with the cluster flags for the restored member.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub progress: Progress,
    pub data_dir: PathBuf,
    /// etcd's `--wal-dir`, when the WAL lives elsewhere: the restored WAL goes there (which must
    /// be missing or empty), the db into the data dir.
    pub wal_dir: Option<PathBuf>,
    /// The etcd binary: runs the private etcd, and etcdutl/etcdctl are looked up beside it.
    pub etcd: PathBuf,
    /// etcdutl or etcdctl, when not beside etcd.
    pub tool: Option<PathBuf>,
    pub name: String,
    pub initial_cluster: Option<String>,
    pub initial_advertise_peer_urls: Option<String>,
    pub initial_cluster_token: Option<String>,
    pub target: Target,
    /// Raise the restored revision by this much and mark everything up to it compacted (0: off),
    /// as etcdutl's `--bump-revision N --mark-compacted`.
    pub bump_revision: u64,
    /// The bump also clears every revision any object in the store names (`plan::bump_amount`):
    /// a fallback to an older chain must not hand out again what a newer chain's clients saw.
    /// Off for a cluster restore plan, whose bump was fixed when it was written, so that every
    /// member lands on the same revision however the store grew since.
    pub bump_clears_store: bool,
    /// How long the listing is retried while the store does not answer.
    pub store_wait: Duration,
}

/// `RestoreOptions::store_wait` where no operator chose one.
pub const STORE_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreReport {
    pub full: String,
    pub deltas: usize,
    pub revisions_applied: u64,
    /// The revision asked for: the newest the store's names promise for the target.
    pub target_revision: i64,
    /// The backed-up revision restored: below `target_revision` when objects were skipped.
    pub backed_up_revision: i64,
    /// The revision the restored member serves: `backed_up_revision + bumped_by`.
    pub revision: i64,
    /// The revision bump (0: none); everything at or below `revision` is marked compacted.
    pub bumped_by: u64,
    /// Objects not used (a corrupt full, or the delta a chain was cut before), with why.
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
    #[error("the store did not answer (retried for about a minute; nothing was changed): {0}")]
    Unavailable(String),
    #[error("{0} (nothing was changed)")]
    Local(String),
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
            wal_dir: None,
            etcd,
            tool: None,
            name: "verify".into(),
            initial_cluster: Some("verify=http://127.0.0.1:2380".into()),
            initial_advertise_peer_urls: Some("http://127.0.0.1:2380".into()),
            initial_cluster_token: None,
            target: Target::Latest,
            // A scratch copy is compared with the live history revision for revision.
            bump_revision: 0,
            bump_clears_store: false,
            store_wait: STORE_WAIT,
        }
    }
}

/// Removes a directory tree when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The chains to try, newest first (a rollback point alone for `Target::Rollback`); an error when
/// none fits the target, or when the newest is encrypted and no identity was given (an older
/// plaintext chain would be older data than the operator has).
// The restore's own error, returned once per restore: its size costs nothing.
#[allow(clippy::result_large_err)]
fn candidates_for(
    store: &Store,
    opts: &RestoreOptions,
    fulls: &[crate::store::layout::SnapshotName],
    chains: &crate::store::Catalog,
) -> Result<Vec<Candidate>, RestoreError> {
    let candidates = match opts.target {
        Target::Rollback(point) => vec![plan::Candidate {
            full: point,
            deltas: Vec::new(),
            target_revision: point.last_revision(),
            stop_at: None,
            gap: None,
        }],
        target => plan::candidates(fulls, &|c| chains.get(&c).cloned().unwrap_or_default(), target),
    };
    if candidates.is_empty() {
        let detail = match (fulls.is_empty(), opts.target) {
            (true, _) => String::new(),
            (false, Target::Time(_)) => format!(
                " for {}: every backup was written after it (`etcd-warden backups list` shows when each was)",
                opts.target
            ),
            (false, target) => format!(" for {target} (`etcd-warden backups list` shows what is there)"),
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
    Ok(candidates)
}

/// What the newest candidate falls short of the target by, said as skipped objects: a gap in the
/// chain, or a revision no backup reaches. Returns them and the revision that was asked for.
fn shortfall(opts: &RestoreOptions, first: &Candidate) -> (Vec<(String, String)>, i64) {
    let mut skipped = Vec::new();
    let mut asked = first.target_revision;
    // A missing delta is no object to fail on: the listing ends the chain at the gap. What the
    // store lists beyond it is what was asked for, so the result counts as older and says why.
    if let Some((after, beyond)) = first.gap {
        let first = match after.kind {
            crate::store::layout::Kind::Delta { first, .. } => first,
            crate::store::layout::Kind::Full { revision, .. } => revision,
        };
        let reason = format!(
            "the chain has a gap before it: revisions {}..{} are in no delta in the store (a missing object); restoring up to revision {} only",
            asked + 1,
            first - 1,
            asked
        );
        tracing::error!(delta = %after.key(), reason = %reason, "a gap in the chain");
        skipped.push((after.key(), reason));
        asked = beyond;
    }
    // A revision that no backup reaches (past the newest, or in a stretch no delta holds: GBR drops
    // the events between its last delta and each new full) is restored as far as the store goes,
    // and said, like a gap.
    if let Target::Revision(r) | Target::ChainAt(_, r) = opts.target
        && first.gap.is_none()
        && asked < r
    {
        let reason = format!(
            "no backup holds revision {r}: the backups below it reach revision {asked}; restoring up to revision {asked} only"
        );
        tracing::error!(reason = %reason, "the target revision is in no backup");
        skipped.push((format!("revision {r}"), reason));
        asked = r;
    }
    (skipped, asked)
}

/// The restored data moved into place: the WAL where it goes, the restore marker written first
/// (the writer must never meet the bumped data without it), then the rename.
// The restore's own error, returned once per restore: its size costs nothing.
#[allow(clippy::result_large_err)]
fn swap_in(opts: &RestoreOptions, built: &Path, revision: i64, served: i64) -> Result<(), RestoreError> {
    if let Some(wal) = &opts.wal_dir {
        place_wal(built, &opts.data_dir, wal).map_err(RestoreError::Local)?;
    }
    // Before the swap: the writer must never meet the bumped data without it.
    super::marker::record(&opts.data_dir, revision, served).map_err(RestoreError::Local)?;
    if opts.data_dir.exists() {
        std::fs::remove_dir(&opts.data_dir).map_err(io("remove the empty target dir", &opts.data_dir))?;
    }
    if let Some(parent) = opts.data_dir.parent() {
        std::fs::create_dir_all(parent).map_err(io("create the parent of", &opts.data_dir))?;
    }
    std::fs::rename(built, &opts.data_dir).map_err(io("move the restored data into", &opts.data_dir))?;
    if let Some(parent) = opts.data_dir.parent() {
        sync_path(parent);
    }
    Ok(())
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
    let screened = catalog_waiting(store, opts).await?;
    let (fulls, chains) = (&screened.fulls, &screened.chains);
    // The newest revision any object that passed the gate names, every chain's: what a bump must
    // clear.
    let named = plan::newest_named(fulls, chains);
    let candidates = candidates_for(store, opts, fulls, chains)?;
    check_tool(opts, reaper).await?;
    let stamp = crate::store::layout::format_time(crate::store::layout::now_ms());
    let mut work = opts.data_dir.clone().into_os_string();
    work.push(format!(".restore-{stamp}"));
    let work = PathBuf::from(work);
    // Removed however the restore ends, also when its future is dropped (Ctrl-C in `restore`).
    let _work_guard = RemoveOnDrop(work.clone());
    let (mut skipped, asked) = shortfall(opts, &candidates[0]);
    if let Some(s) = screened.rejected.summary() {
        skipped.push(("the listing".into(), s));
    }
    for mut cand in candidates {
        let mut unavailable = 0;
        let result = loop {
            let _ = std::fs::remove_dir_all(&work);
            std::fs::create_dir_all(&work).map_err(io("create the work dir", &work))?;
            tracing::info!(full = %cand.full.key(), deltas = cand.deltas.len(), target_revision = cand.target_revision, "restoring");
            match attempt(store, opts, reaper, &cand, &work, named).await {
                Ok(r) => break Some(r),
                // Never a reason to settle for older data: wait for the store.
                Err(Failure::Unavailable(e)) if unavailable < STORE_RETRIES.len() => {
                    let wait = STORE_RETRIES[unavailable];
                    unavailable += 1;
                    tracing::warn!(error = %e, retry_in_s = wait.as_secs(), attempt = unavailable, "the store did not answer during the restore; retrying the same chain");
                    opts.progress
                        .step(format!("store unavailable, retrying in {}s: {e}", wait.as_secs()));
                    tokio::time::sleep(wait).await;
                }
                Err(Failure::Unavailable(e)) => {
                    let _ = std::fs::remove_dir_all(&work);
                    return Err(RestoreError::Unavailable(e));
                }
                Err(Failure::Local(e)) => {
                    let _ = std::fs::remove_dir_all(&work);
                    return Err(RestoreError::Local(e));
                }
                // The newest consistent point: this chain up to the revision before the bad delta.
                Err(Failure::BadDelta { index, reason }) => {
                    let bad = cand.deltas[index];
                    tracing::error!(delta = %bad.key(), reason = %reason, "a delta is corrupt or missing: the chain is cut before it");
                    skipped.push((bad.key(), reason));
                    cand.cut_before(index);
                }
                Err(Failure::BadFull(reason)) => {
                    tracing::error!(full = %cand.full.key(), reason = %reason, "the full snapshot cannot be used; trying an older chain");
                    skipped.push((cand.full.key(), reason));
                    break None;
                }
            }
        };
        let Some(Restored {
            revision,
            served,
            applied,
            bumped_by,
        }) = result
        else {
            continue;
        };
        swap_in(opts, &work.join("data"), revision, served)?;
        let _ = std::fs::remove_dir_all(&work);
        if revision < asked {
            tracing::error!(restored = revision, asked, used = %cand.full.key(), skipped = ?skipped, "restored OLDER data than the store's newest backup: objects were corrupt or missing");
        }
        return Ok(RestoreReport {
            full: cand.full.key(),
            deltas: cand.deltas.len(),
            revisions_applied: applied,
            target_revision: asked,
            backed_up_revision: revision,
            revision: served,
            bumped_by,
            skipped,
            seconds: started.elapsed().as_secs_f64(),
        });
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

/// Moves the restored WAL (`<built>/member/wal`, where etcdutl writes it) to where etcd's
/// `--wal-dir` will look for it: into the wal dir when it is outside the data dir (renamed, or
/// copied and synced when it is on another filesystem), else to its place inside the data dir.
fn place_wal(built: &Path, data_dir: &Path, wal: &Path) -> Result<(), String> {
    fn failed<'a>(what: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> String + 'a {
        move |e| format!("{what} {}: {e}", path.display())
    }
    let from = built.join("member").join("wal");
    if let Ok(inside) = wal.strip_prefix(data_dir) {
        let to = built.join(inside);
        if to != from {
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(failed("create", parent))?;
            }
            std::fs::rename(&from, &to).map_err(failed("move the restored WAL to", &to))?;
        }
        return Ok(());
    }
    if wal.exists() && !is_empty_dir(wal) {
        return Err(format!(
            "the wal dir {} holds a WAL: a restore never mixes a new db with an old WAL (move it aside first)",
            wal.display()
        ));
    }
    if wal.exists() {
        std::fs::remove_dir(wal).map_err(failed("remove the empty wal dir", wal))?;
    }
    if let Some(parent) = wal.parent() {
        std::fs::create_dir_all(parent).map_err(failed("create the parent of", wal))?;
    }
    if std::fs::rename(&from, wal).is_err() {
        // Another filesystem: copy beside the target, sync, then rename into place.
        let partial = crate::etcd::dirs::beside(wal, ".restoring");
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).map_err(failed("create", &partial))?;
        for entry in std::fs::read_dir(&from).map_err(failed("read", &from))? {
            let entry = entry.map_err(failed("read", &from))?;
            let to = partial.join(entry.file_name());
            std::fs::copy(entry.path(), &to).map_err(failed("copy the restored WAL to", &to))?;
        }
        sync_tree(&partial);
        std::fs::rename(&partial, wal).map_err(failed("move the restored WAL to", wal))?;
        let _ = std::fs::remove_dir_all(&from);
    }
    if let Some(parent) = wal.parent() {
        sync_path(parent);
    }
    Ok(())
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
    match crate::process::pid1::run_bounded(reaper, &mut cmd, Some(Duration::from_secs(10))).await {
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

/// The store's listing, asked again with backoff while the store does not answer, up to
/// `opts.store_wait`; each wait is said (log and progress). A store that would give the same
/// answer again (access denied, no bucket) fails at once.
async fn catalog_waiting(
    store: &Store,
    opts: &RestoreOptions,
) -> Result<crate::store::gate::Screened, RestoreError> {
    let deadline = Instant::now() + opts.store_wait;
    let mut wait = Duration::from_millis(500);
    loop {
        match store.screened_catalog().await {
            Ok(c) => return Ok(c),
            Err(e) if e.is_transient() && Instant::now() + wait < deadline => {
                let why = crate::telemetry::error_chain(&e);
                let left = deadline.saturating_duration_since(Instant::now());
                tracing::warn!(error = %why, retry_in_ms = wait.as_millis() as u64, gives_up_in_s = left.as_secs(), "waiting for the store to answer");
                opts.progress.step(format!(
                    "waiting for the store to answer (retry in {:.1}s, giving up in {}s): {why}",
                    wait.as_secs_f64(),
                    left.as_secs()
                ));
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits between attempts while the store does not answer: about a minute in all.
const STORE_RETRIES: [Duration; 6] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(30),
];

/// Why one attempt at a candidate failed, and so what the restore does next.
pub(super) enum Failure {
    /// The store did not answer: the same candidate again, after a while.
    Unavailable(String),
    /// The full snapshot cannot be used: the next older candidate is the best left.
    BadFull(String),
    /// Delta `index` of the candidate is corrupt or missing: its chain is cut before it.
    BadDelta { index: usize, reason: String },
    /// This machine failed (disk, etcdutl, the private etcd): an older chain would fare no better.
    Local(String),
}

impl Failure {
    pub(super) fn delta(index: usize, e: ObjectError) -> Self {
        match e {
            ObjectError::Unavailable(e) => Self::Unavailable(e),
            ObjectError::Corrupt(reason) => Self::BadDelta { index, reason },
            ObjectError::Local(e) => Self::Local(e),
        }
    }

    /// Said in one line, the delta named (a standby's step, a catch-up).
    pub(super) fn message(self, cand: &Candidate) -> String {
        match self {
            Self::Unavailable(e) => format!("the store did not answer: {e}"),
            Self::BadFull(e) | Self::Local(e) => e,
            Self::BadDelta { index, reason } => {
                format!("{} is corrupt or missing: {reason}", cand.deltas[index].key())
            }
        }
    }
}

async fn attempt(
    store: &Store,
    opts: &RestoreOptions,
    reaper: &Reaper,
    cand: &Candidate,
    work: &Path,
    named: i64,
) -> Result<Restored, Failure> {
    let db = work.join("snapshot.db");
    let t = Instant::now();
    opts.progress
        .step(format!("downloading and verifying {}", cand.full.key()));
    let verified = read_full_to_file(store, &cand.full, &db, &opts.progress)
        .await
        .map_err(|e| match e {
            ObjectError::Unavailable(e) => Failure::Unavailable(e),
            ObjectError::Corrupt(e) => Failure::BadFull(e),
            ObjectError::Local(e) => Failure::Local(e),
        })?;
    tracing::info!(
        bytes = verified.footer.raw_bytes,
        secs = t.elapsed().as_secs_f64(),
        "full snapshot downloaded and verified"
    );

    // The deltas come in while the tool restores the full snapshot.
    let fetcher = super::write::DeltaFetcher::start(store, cand);
    let data = work.join("data");
    super::full::restore_full(opts, reaper, cand, &db, &data).await?;

    let db = data.join("member").join("snap").join("db");
    check_release(reaper, &opts.etcd, &db, &cand.full.key()).await?;
    let (revision, applied) = deltas(store, opts, reaper, cand, work, &db, fetcher).await?;
    if revision > crate::store::gate::MAX_REVISION {
        return Err(Failure::BadFull(format!(
            "the restored database is at revision {revision}, past {} (no cluster gets there; a crafted database)",
            crate::store::gate::MAX_REVISION
        )));
    }
    let bumped_by = match opts.bump_clears_store {
        true => super::plan::bump_amount(revision, opts.bump_revision, named),
        false => opts.bump_revision,
    };
    if bumped_by != opts.bump_revision {
        tracing::warn!(
            restored = revision,
            newest_named = named,
            bump = bumped_by,
            "the store names revisions up to {named}, beyond the restored {revision} plus the bump of {}: bumping by {bumped_by} instead, so that no revision a client may have seen is handed out again",
            opts.bump_revision
        );
    }
    if i64::try_from(bumped_by).map_or(true, |b| revision.checked_add(b).is_none()) {
        return Err(Failure::Local(format!(
            "a bump of {bumped_by} from revision {revision} passes etcd's last revision ({}): give a smaller --bump-revision",
            i64::MAX
        )));
    }
    let served = match bumped_by {
        0 => revision,
        n => bump(&db, n).map_err(Failure::Local)?,
    };
    // etcdutl, the bbolt writer and the private etcd leave files that the rename must not outrun.
    sync_tree(&data);
    Ok(Restored {
        revision,
        served,
        applied,
        bumped_by,
    })
}

/// A db written by a newer etcd minor than the one that will run it is refused before any delta
/// is written: etcd would refuse its `storageVersion` or panic on its cluster version.
async fn check_release(reaper: &Reaper, etcd: &Path, db: &Path, full: &str) -> Result<(), Failure> {
    let Ok(Some((major, minor))) = crate::format::mvcc::written_by(db) else {
        return Ok(());
    };
    let Some(ours) = crate::etcd::version::of_binary(reaper, etcd).await else {
        return Ok(());
    };
    if (major, minor) > (ours.major, ours.minor) {
        return Err(Failure::Local(format!(
            "{full} was written by etcd {major}.{minor} and etcd {ours} ({}) cannot open it: restore with etcd {major}.{minor} or newer (--etcd), or convert the restored data with `etcdutl migrate --target-version {}.{}` (docs/etcd-versions.md)",
            etcd.display(),
            ours.major,
            ours.minor
        )));
    }
    Ok(())
}

/// What one attempt built: the backed-up revision it reached, and the one etcd will serve.
struct Restored {
    revision: i64,
    served: i64,
    applied: u64,
    bumped_by: u64,
}

/// Brings the restored member from its full snapshot to the candidate's target revision.
async fn deltas(
    store: &Store,
    opts: &RestoreOptions,
    reaper: &Reaper,
    cand: &Candidate,
    work: &Path,
    db: &Path,
    fetcher: super::write::DeltaFetcher,
) -> Result<(i64, u64), Failure> {
    let needs_deltas = !cand.deltas.is_empty() || cand.stop_at.is_some();
    if !needs_deltas {
        // A full's name is a lower bound (its revision was read before the stream began): the
        // restored member is at what the database holds.
        let revision = MvccFile::open(db).map_or(cand.full.last_revision(), |f| f.revision());
        if let Target::Revision(r) | Target::ChainAt(_, r) = opts.target
            && revision > r
        {
            // An older full may still reach the target exactly.
            return Err(Failure::BadFull(format!(
                "the full snapshot holds revision {revision}, past the target {r}"
            )));
        }
        return Ok((revision, 0));
    }
    if std::env::var_os(REPLAY_THROUGH_ETCD).is_some() {
        tracing::info!("{REPLAY_THROUGH_ETCD} is set: replaying the deltas through a private etcd");
    } else {
        match MvccFile::open(db) {
            Ok(file) => {
                return super::write::write_deltas(
                    fetcher,
                    file,
                    cand,
                    &opts.progress,
                    false,
                    Default::default(),
                )
                .await;
            }
            // Checked before anything is written: the replay below still works on the file.
            Err(e) => {
                tracing::warn!(error = %e, db = %db.display(), "cannot write the deltas into the restored db directly; replaying them through a private etcd")
            }
        }
    }
    // The replay reads each delta at its turn: nothing fetched ahead is held meanwhile.
    drop(fetcher);
    let data = db
        .ancestors()
        .nth(3)
        .ok_or_else(|| Failure::Local(format!("{} is not inside a data dir", db.display())))?;
    let private = PrivateEtcd::start(
        reaper,
        &opts.etcd,
        data,
        None,
        &opts.name,
        &work.join("private-etcd.log"),
        true,
    )
    .await
    .map_err(Failure::Local)?;
    let result = super::replay::apply_deltas(store, &private, cand, &opts.progress).await;
    private.stop().await;
    result
}

/// Raises the restored member's revision by `amount` and marks everything up to the new revision
/// compacted (`MvccFile::bump_and_mark_compacted`, what etcdutl's `--bump-revision --mark-compacted`
/// does): no client that saw a revision after the backup is handed that number again, and a watch
/// resumed from one is told "compacted" instead of silently missing events.
fn bump(db: &Path, amount: u64) -> Result<i64, String> {
    let t = Instant::now();
    let mut file =
        MvccFile::open(db).map_err(|e| format!("open the restored db to bump its revision: {e}"))?;
    let from = file.revision();
    let to = file
        .bump_and_mark_compacted(amount)
        .map_err(|e| format!("bump the restored revision: {e}"))?;
    file.commit()
        .map_err(|e| format!("commit the bumped revision: {e}"))?;
    tracing::info!(
        from,
        to,
        amount,
        secs = t.elapsed().as_secs_f64(),
        "revision bumped; everything up to it marked compacted"
    );
    Ok(to)
}

/// Set (to anything) to replay deltas through a private etcd instead of writing them into the
/// restored db directly: the slower path, kept as the fallback and for comparison.
pub const REPLAY_THROUGH_ETCD: &str = "ETCD_WARDEN_RESTORE_THROUGH_ETCD";

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

/// A time for `--to-time`: RFC 3339, whose offset (`Z`, `+02:00`) is required; a time without
/// one would be read in some zone the operator did not choose.
pub fn parse_time(s: &str) -> Result<u64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|e| {
        format!("{s:?}: {e} (write RFC 3339 with its offset, e.g. 2026-11-29T16:30:00Z or 2026-11-29T17:30:00+01:00)")
    })?;
    u64::try_from(t.timestamp_millis()).map_err(|_| format!("{s:?}: before 1970"))
}

//! A single member's restore at start-up (`crate::startup` decides when, from its table): the
//! newest point the store holds, the validation of a present data dir with a private etcd on
//! loopback ports (it replays its WAL and opens its db: the most faithful check there is), and the
//! restore itself.
//!
//! - A data dir that does not start is moved aside to `<data-dir>.broken-<time>` and restored; one
//!   behind the newest backup to `<data-dir>.behind-<time>`. Newer local data is never replaced.
//! - Nothing is ever deleted, and nothing is moved aside unless a verified replacement follows: a
//!   restore that fails puts the data dir back, and one that reached only older data than the
//!   local dir (corrupt or missing objects) puts the local dir back and keeps the restore aside.
//! - Multi-member clusters are never restored from backup: a member that restores while the others
//!   keep quorum would fork the cluster (`crate::startup::cluster` rejoins through the peers).

use tokio::sync::watch;

use super::member::MemberConfig;
use crate::etcd::MemberDirs;
use crate::etcd::dirs::beside;
use crate::etcd::dirs::is_empty_dir;
use crate::etcd::private::PrivateEtcd;
use crate::process::pid1::Reaper;
use crate::restore::execute::{RestoreOptions, restore};
use crate::restore::plan::{self, Target};
use crate::startup::Decision;
use crate::startup::decide::{Aside, Local};
use crate::store::Store;

pub fn open_store(cfg: &MemberConfig) -> Result<Store, String> {
    cfg.backup
        .open_store()
        .map_err(|e| crate::telemetry::error_chain(&e))
}

/// The newest revision a restore would reach, or `None` when the store holds no backup: the
/// warden's own chains and GBR's alike, as far as their objects pass the gate
/// (`Store::screened_catalog`): a planted name never makes a data dir "behind".
pub async fn newest_backup(store: &Store) -> Result<Option<i64>, String> {
    let screened = store
        .screened_catalog()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let (fulls, chains) = (screened.fulls, screened.chains);
    let cands = plan::candidates(
        &fulls,
        &|c| chains.get(&c).cloned().unwrap_or_default(),
        Target::Latest,
    );
    Ok(cands.first().map(|c| c.target_revision))
}

/// `.<why>-<time>`: what a moved-aside dir's name gets.
fn aside(why: &str) -> String {
    format!(
        ".{why}-{}",
        crate::store::layout::format_time(crate::store::layout::now_ms())
    )
}

/// The revision of the data dir's db file, read offline (no etcd): the floor nothing may restore
/// below. `None` when there is no db file or it cannot be read.
pub fn offline_revision(dirs: &MemberDirs) -> Option<i64> {
    let db = dirs.data.join("member/snap/db");
    match crate::format::mvcc::MvccFile::open(&db) {
        Ok(f) => Some(f.revision()),
        Err(e) => {
            tracing::warn!(db = %db.display(), error = %e, "cannot read the data dir's db file offline");
            None
        }
    }
}

/// The data dir as a private etcd last left it (every file's path, size and modification time)
/// and the revision it served then. A validation of a data dir that nothing touched since reuses
/// it instead of starting a private etcd again (2-3 s on a busy machine), so a start-up check
/// interrupted again and again (ownership flapping) still gets etcd started. In memory only: a
/// new warden validates once.
static LAST_SERVED: std::sync::Mutex<Option<Served>> = std::sync::Mutex::new(None);

/// The files as left, the revision served, the cluster ID when known.
type Served = (Vec<FileStamp>, i64, Option<u64>);

type FileStamp = (std::path::PathBuf, u64, Option<std::time::SystemTime>);

/// Every file under the data dir and the WAL dir, with its size and modification time, sorted;
/// `None` when a directory cannot be read.
fn stamp(dirs: &MemberDirs) -> Option<Vec<FileStamp>> {
    let mut out = Vec::new();
    let mut todo: Vec<std::path::PathBuf> = std::iter::once(dirs.data.clone())
        .chain(dirs.wal.clone())
        .collect();
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).ok()? {
            let e = e.ok()?;
            let meta = e.metadata().ok()?;
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    Some(out)
}

/// Records that a private etcd, now stopped, served `dirs` at `revision` as a member of
/// `cluster` when known (a validation, the fence's final snapshot).
pub fn served_by_private_etcd(dirs: &MemberDirs, revision: i64, cluster: Option<u64>) {
    if let (Some(st), Ok(mut last)) = (stamp(dirs), LAST_SERVED.lock()) {
        *last = Some((st, revision, cluster));
    }
}

/// The revision (and cluster ID) a private etcd served `dirs` at, if nothing touched them since.
fn served_untouched(dirs: &MemberDirs) -> Option<(i64, Option<u64>)> {
    let now = stamp(dirs)?;
    let last = LAST_SERVED.lock().ok()?;
    match last.as_ref() {
        Some((st, revision, cluster)) if *st == now => Some((*revision, *cluster)),
        _ => None,
    }
}

/// A present data dir, validated by a private etcd: its revision, why etcd refused it, or why
/// nothing could be learnt (which is no evidence against it); and the cluster ID etcd reported.
pub async fn validate(cfg: &MemberConfig, reaper: &Reaper, dirs: &MemberDirs) -> (Local, Option<u64>) {
    if let Some((revision, cluster)) = served_untouched(dirs) {
        tracing::info!(
            revision,
            "the data dir is as a private etcd left it at this revision: not validated again"
        );
        return (Local::At(revision), cluster);
    }
    // Beside the data dir: writable wherever the data dir's parent is (a FROM-scratch image has
    // no /tmp).
    let log = beside(&dirs.data, ".validate.log");
    let check = async {
        let private = PrivateEtcd::start_checked(
            reaper,
            &cfg.launch.program,
            &dirs.data,
            dirs.wal.as_deref(),
            &cfg.etcd.name,
            &log,
            false,
        )
        .await
        .map_err(|e| (e.refused, e.message))?;
        let rev = async {
            let mut c = private.client().await?;
            let revision = crate::etcd::private::revision(&mut c, true)
                .await
                .map_err(|e| format!("read the local revision: {e}"))?;
            let cluster = c
                .status()
                .await
                .ok()
                .and_then(|s| s.header().map(|h| h.cluster_id()));
            Ok::<_, String>((revision, cluster))
        }
        .await;
        private.stop().await;
        rev.map_err(|e| (false, e))
    }
    .await;
    let _ = std::fs::remove_file(&log);
    match check {
        Ok((rev, cluster)) => {
            served_by_private_etcd(dirs, rev, cluster);
            (Local::At(rev), cluster)
        }
        Err((true, e)) => (Local::Broken(e), None),
        Err((false, e)) => (Local::Unknown(e), None),
    }
}

/// Restores the data dir from `store` (moving the present one aside first, when `aside`);
/// `floor`: the local revision nothing older may replace; `newest`: what the store promised.
/// `Err` only for what must stop the warden.
pub async fn restore_member(
    cfg: &MemberConfig,
    reaper: &Reaper,
    status: &watch::Sender<Option<String>>,
    dirs: &MemberDirs,
    aside_why: Option<Aside>,
    floor: Option<i64>,
    newest: Option<i64>,
) -> Result<Decision, String> {
    let data = &dirs.data;
    let store = open_store(cfg)?;
    let mut moved = None;
    if let Some(why) = aside_why {
        match why {
            Aside::Behind => tracing::warn!(
                local = floor,
                newest_backup = newest,
                "the data dir is behind the newest backup: restoring"
            ),
            Aside::Broken => {
                tracing::error!("the data dir does not start: moving it aside and restoring")
            }
        }
        let suffix = aside(why.as_str());
        let to = dirs.move_aside(&suffix)?;
        tracing::warn!(from = %data.display(), to = %to.display(), "data dir moved aside (kept, not deleted)");
        moved = Some((to, suffix));
    }
    status.send_replace(Some("restoring from the store".into()));
    let opts = RestoreOptions {
        progress: {
            let status = status.clone();
            crate::restore::execute::Progress::to(move |what| {
                if what.is_some() {
                    status.send_replace(what);
                }
            })
        },
        data_dir: data.clone(),
        wal_dir: dirs.wal.clone(),
        etcd: cfg.launch.program.clone(),
        tool: None,
        name: cfg.etcd.name.clone(),
        initial_cluster: cfg.etcd.initial_cluster.clone(),
        initial_advertise_peer_urls: cfg.etcd.initial_advertise_peer_urls.clone(),
        initial_cluster_token: cfg.etcd.initial_cluster_token.clone(),
        target: Target::Latest,
        bump_revision: cfg.restore_bump_revision,
        bump_clears_store: true,
        store_wait: crate::restore::execute::STORE_WAIT,
    };
    match restore(&store, &opts, reaper).await {
        Ok(report) if floor.is_some_and(|f| report.backed_up_revision < f) => {
            // The newest backups could not be used and what could is older than the local data:
            // the local data stays (rule 3), and the restore is kept aside for inspection.
            let local = floor.unwrap_or_default();
            let (from, suffix) = moved.as_ref().expect("a floor comes with a moved-aside dir");
            let older_suffix = aside("older-restore");
            let older = beside(data, &older_suffix);
            dirs.put_back(suffix, &older_suffix)
                .map_err(|e| format!("put the local data dir back from {}: {e}", from.display()))?;
            tracing::error!(
                local,
                restored = report.backed_up_revision,
                newest_backup = newest,
                skipped = ?report.skipped,
                kept_aside = %older.display(),
                "the restore reached only OLDER data than the local data dir: the local data dir is back in place and etcd starts on it"
            );
            Ok(Decision::Keep(format!(
                "the restore reached revision {} only, below the local {local}: local data kept",
                report.backed_up_revision
            )))
        }
        Ok(report) => {
            tracing::info!(revision = report.revision, backed_up_revision = report.backed_up_revision, bumped_by = report.bumped_by, full = %report.full, deltas = report.deltas, seconds = report.seconds, "data dir restored");
            Ok(Decision::Restored {
                revision: report.revision,
                backed_up_revision: report.backed_up_revision,
                target_revision: report.target_revision,
                skipped: report
                    .skipped
                    .iter()
                    .map(|(k, why)| format!("{k}: {why}"))
                    .collect(),
                moved_aside: moved.map(|(to, _)| to),
                seconds: report.seconds,
            })
        }
        Err(e) => {
            let msg = crate::telemetry::error_chain(&e);
            // Put a moved-aside dir back: without a replacement it stays the best data we have.
            if let Some((_, suffix)) = &moved
                && is_empty_dir(data)
            {
                match dirs.put_back(suffix, &aside("failed-restore")) {
                    Ok(()) => {
                        tracing::error!(error = %msg, "restore failed; the original data dir is back in place");
                        return Err(format!(
                            "restore failed ({msg}); the original data dir was put back"
                        ));
                    }
                    Err(e) => {
                        return Err(format!(
                            "restore failed ({msg}), and putting the data dir back failed: {e}"
                        ));
                    }
                }
            }
            Err(format!("restore failed: {msg}"))
        }
    }
}

/// Catches a data dir that is behind the store up from the store's deltas, in place
/// (`crate::restore::catchup`); `Err`: why it was not (nothing changed), and the full restore
/// follows.
pub async fn catch_up_member(
    cfg: &MemberConfig,
    status: &watch::Sender<Option<String>>,
    dirs: &MemberDirs,
    (served, cluster_id): (i64, Option<u64>),
    newest: i64,
) -> Result<Decision, String> {
    let store = open_store(cfg)?;
    let opts = crate::restore::CatchUpOptions {
        data_dir: dirs.data.clone(),
        wal_dir: dirs.wal.clone(),
        served,
        cluster_id,
        newest,
        bump_revision: cfg.restore_bump_revision,
        progress: {
            let status = status.clone();
            crate::restore::execute::Progress::to(move |what| {
                if what.is_some() {
                    status.send_replace(what);
                }
            })
        },
    };
    let done = crate::restore::catch_up(&store, &opts).await?;
    tracing::info!(
        from = done.from,
        to = done.revision,
        revision = done.served,
        bumped_by = done.bumped_by,
        deltas = done.deltas,
        revisions = done.revisions_applied,
        seconds = done.seconds,
        "data dir caught up from the store's deltas (not moved aside, no full restored)"
    );
    Ok(Decision::Restored {
        revision: done.served,
        backed_up_revision: done.revision,
        target_revision: newest,
        skipped: Vec::new(),
        moved_aside: None,
        seconds: done.seconds,
    })
}

/// Whether `data` is a data dir at all (for the table: missing or present).
pub fn local_fact(dirs: &MemberDirs) -> Local {
    if dirs.is_empty() {
        Local::Missing
    } else {
        Local::Present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untouched_data_dir_is_not_validated_again_and_a_touched_one_is() {
        let t = tempfile::tempdir().unwrap();
        let dirs = MemberDirs::data_only(&t.path().join("data"));
        std::fs::create_dir_all(dirs.data.join("member/wal")).unwrap();
        std::fs::write(dirs.data.join("member/wal/0.wal"), b"x").unwrap();
        assert_eq!(served_untouched(&dirs), None);
        served_by_private_etcd(&dirs, 42, Some(7));
        assert_eq!(served_untouched(&dirs), Some((42, Some(7))));
        // etcd (or anything) wrote to it since: validated again.
        std::fs::write(dirs.data.join("member/wal/1.wal"), b"y").unwrap();
        assert_eq!(served_untouched(&dirs), None);
        served_by_private_etcd(&dirs, 43, None);
        std::fs::write(dirs.data.join("member/wal/1.wal"), b"yz").unwrap();
        assert_eq!(served_untouched(&dirs), None);
    }
}

//! Before etcd starts: is the data dir fit, and is it at least as new as the backups?
//!
//! - Missing or empty: restore the newest chain that verifies (when the store has one).
//! - Present: start etcd privately on loopback ports (so it replays its WAL and opens its db, the
//!   most faithful check there is) and read its revision. If it cannot come up, the dir is moved
//!   aside to `<data-dir>.broken-<time>` and restored. If its revision is behind the newest backup,
//!   it is moved aside to `<data-dir>.behind-<time>` and restored. Newer local data is never replaced.
//! - Nothing is ever deleted, and nothing is moved aside unless a verified replacement follows.
//! - Multi-member clusters (more than one `--initial-cluster` entry) are never restored from backup:
//!   a member that restores while the others keep quorum would fork the cluster. The decision and
//!   a rejoin through the peers are `crate::cluster::startup`'s.
//! - No store, an empty store, or no backup: etcd starts as is (a new member when the dir is empty).
//!   A store that cannot be listed while the data dir is missing is retried rather than starting an
//!   empty etcd that would look like data loss; with data present, etcd starts and backups report.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

use super::execute::{RestoreOptions, is_empty_dir, restore};
use super::plan::{self, Target};
use crate::config::RunConfig;
use crate::etcd::private::PrivateEtcd;
use crate::pid1::Reaper;
use crate::store::Store;

/// What start-up decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start etcd on the data dir as it is.
    Keep(String),
    /// The data dir was restored (and the old one, if any, moved to this path).
    Restored {
        /// What etcd serves: the backed-up revision plus the bump.
        revision: i64,
        backed_up_revision: i64,
        /// The newest revision the store's names promised; above `backed_up_revision` when
        /// objects were corrupt or missing (`skipped`).
        target_revision: i64,
        skipped: Vec<String>,
        moved_aside: Option<PathBuf>,
        seconds: f64,
    },
    /// A cluster member starts with these etcd flags set (`--initial-cluster-state existing` and
    /// the current members to join its peers; a restore plan's `new` cluster); `learner`: it
    /// starts as that learner and waits to be promoted.
    Join {
        flags: Vec<(String, String)>,
        learner: Option<u64>,
        reason: String,
    },
}

/// Start-up restores done by this warden, for /status and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RestoreStats {
    pub total: u64,
    /// The revision the last restore left etcd at (the backed-up one plus the bump).
    pub last_revision: Option<i64>,
    /// The newest backed-up revision the last restore reached.
    pub last_backed_up_revision: Option<i64>,
    /// What it aimed at: the newest revision the store's names promised.
    pub last_target_revision: Option<i64>,
    /// Objects the last restore could not use (key: why), so it restored less than the target.
    pub last_skipped: Vec<String>,
    /// Restores that ended below their target, in all.
    pub older_than_target_total: u64,
    pub last_seconds: Option<f64>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_at: Option<std::time::SystemTime>,
}

fn set(status: &watch::Sender<Option<String>>, what: &str) {
    tracing::info!(step = what, "start-up check");
    status.send_replace(Some(what.to_owned()));
}

fn open_store(cfg: &RunConfig) -> Result<Store, String> {
    cfg.backup
        .open_store()
        .map_err(|e| crate::telemetry::error_chain(&e))
}

/// The newest revision a restore would reach, or `None` when the store holds no backup: the
/// warden's own chains and GBR's alike (`Store::catalog`).
async fn newest_backup(store: &Store) -> Result<Option<i64>, String> {
    let (fulls, chains) = store
        .catalog()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let cands = plan::candidates(
        &fulls,
        &|c| chains.get(&c).cloned().unwrap_or_default(),
        Target::Latest,
    );
    Ok(cands.first().map(|c| c.target_revision))
}

pub use crate::etcd::dirs::beside;

/// `.<why>-<time>`: what a moved-aside dir's name gets.
fn aside(why: &str) -> String {
    format!(
        ".{why}-{}",
        crate::store::layout::format_time(crate::store::layout::now_ms())
    )
}

/// Runs the start-up check; `Err` only for what must stop the warden.
pub async fn prepare(
    cfg: &RunConfig,
    reaper: &Reaper,
    status: &watch::Sender<Option<String>>,
    member: &watch::Sender<Option<String>>,
) -> Result<Decision, String> {
    let dirs = crate::etcd::MemberDirs::of(&cfg.etcd);
    let data = dirs.data.clone();
    let members = cfg
        .etcd
        .initial_cluster
        .as_deref()
        .map(|c| c.split(',').filter(|s| !s.trim().is_empty()).count())
        .unwrap_or(1);
    // This member left its cluster (`ctl leave`): a restart never rejoins with that WAL.
    if let Some(left) = crate::cluster::leave::marker(&data) {
        let why = format!(
            "this member left its cluster (member {:x}, `ctl leave`); remove {} to start it again as a new member",
            left.member_id,
            crate::cluster::leave::marker_path(&data).display()
        );
        tracing::warn!("{why}");
        member.send_replace(Some(why));
        while crate::cluster::leave::marker(&data).is_some() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        member.send_replace(None);
    }
    // A data dir of a cluster (members added at run time to what was started as one) is a
    // cluster member's, whatever the flags say: a lone restore would fork it.
    let members = members.max(crate::cluster::local::member_count(&data).unwrap_or(0));
    if members > 1 {
        // A member rejoins through its peers, never from the store (a lone restore would fork the
        // cluster).
        set(status, "asking the other members");
        return crate::cluster::startup::prepare(cfg, reaper, member).await;
    }
    let empty = dirs.is_empty();

    set(status, "listing backups");
    let mut delay = Duration::from_secs(1);
    let (store, newest) = loop {
        // Opened on every attempt: a fixed credentials file is picked up while waiting.
        let listed = match open_store(cfg) {
            Ok(store) => newest_backup(&store).await.map(|n| (store, n)),
            Err(e) => Err(e),
        };
        match listed {
            Ok(found) => break found,
            Err(e) if !empty => {
                tracing::error!(error = %e, "cannot list the store; starting etcd on its data dir without comparing");
                return Ok(Decision::Keep("store unreachable; local data kept".into()));
            }
            Err(e) => {
                tracing::error!(error = %e, retry_in_s = delay.as_secs(), "the data dir is empty and the store cannot be listed; waiting for the store rather than starting an empty etcd");
                set(status, "waiting for the store (data dir empty)");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    let Some(newest) = newest else {
        return Ok(Decision::Keep(if empty {
            "no backups: starting a new member".into()
        } else {
            "no backups to compare with".into()
        }));
    };
    let mut moved = None;
    // The revision of the local data a restore replaces: nothing older may take its place.
    let mut floor = None;
    if !empty {
        set(status, "validating the data dir with a private etcd");
        // Beside the data dir: writable wherever the data dir's parent is (a FROM-scratch image
        // has no /tmp).
        let log = beside(&data, ".validate.log");
        let check = async {
            let private = PrivateEtcd::start(
                reaper,
                &cfg.launch.program,
                &data,
                dirs.wal.as_deref(),
                &cfg.etcd.name,
                &log,
                false,
            )
            .await?;
            let rev = async {
                let mut c = private.client().await?;
                crate::etcd::private::revision(&mut c, true)
                    .await
                    .map_err(|e| format!("read the local revision: {e}"))
            }
            .await;
            private.stop().await;
            rev
        }
        .await;
        let _ = std::fs::remove_file(&log);
        let why = match check {
            Ok(local) if local >= newest => {
                tracing::info!(
                    local,
                    newest_backup = newest,
                    "the data dir is current; starting etcd on it"
                );
                status.send_replace(None);
                return Ok(Decision::Keep(format!(
                    "local revision {local} ≥ newest backup {newest}"
                )));
            }
            Ok(local) => {
                tracing::warn!(
                    local,
                    newest_backup = newest,
                    "the data dir is behind the newest backup: restoring"
                );
                floor = Some(local);
                "behind"
            }
            Err(e) => {
                tracing::error!(error = %e, "the data dir does not start: moving it aside and restoring");
                "broken"
            }
        };
        let suffix = aside(why);
        let to = dirs.move_aside(&suffix)?;
        tracing::warn!(from = %data.display(), to = %to.display(), "data dir moved aside (kept, not deleted)");
        moved = Some((to, suffix));
    }

    set(status, "restoring from the store");
    let opts = RestoreOptions {
        progress: {
            let status = status.clone();
            super::execute::Progress::to(move |what| {
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
    };
    match restore(&store, &opts, reaper).await {
        Ok(report) if floor.is_some_and(|f| report.backed_up_revision < f) => {
            // The newest backups could not be used and what could is older than the local data:
            // the local data stays (rule 3), and the restore is kept aside for inspection.
            let local = floor.unwrap_or_default();
            let (from, suffix) = moved.as_ref().expect("a floor comes with a moved-aside dir");
            let older_suffix = aside("older-restore");
            let older = beside(&data, &older_suffix);
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
            status.send_replace(None);
            Ok(Decision::Keep(format!(
                "the restore reached revision {} only, below the local {local}: local data kept",
                report.backed_up_revision
            )))
        }
        Ok(report) => {
            tracing::info!(revision = report.revision, backed_up_revision = report.backed_up_revision, bumped_by = report.bumped_by, full = %report.full, deltas = report.deltas, seconds = report.seconds, "data dir restored");
            status.send_replace(None);
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
                && is_empty_dir(&data)
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

//! `--verify-schedule`: a restore drill on a schedule. The newest chain is restored for real into a
//! scratch dir beside the data dir (same disk, so the space check is honest), through the same code
//! as a real restore, then removed. Success is exported as
//! `etcd_warden_last_verified_restore_timestamp_seconds`; failure shows in /status and the logs.
//! Like every backup concern, it never touches readiness.

use std::path::PathBuf;
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::BackupConfig;
use crate::etcd::ClientConfig;
use crate::process::pid1::Reaper;
use crate::restore::check::open_with_etcd;
use crate::restore::execute::{RestoreOptions, restore};

/// What a drill needs of the run's configuration.
#[derive(Debug, Clone)]
pub struct DrillConfig {
    pub schedule: croner::Cron,
    /// The store, opened afresh (credentials included) for each drill.
    pub backup: BackupConfig,
    /// The etcd binary the restore and the check run.
    pub program: PathBuf,
    /// The live data dir: the scratch dir goes beside it, on the same disk.
    pub data_dir: PathBuf,
    /// The live etcd, whose HashKV the restored data must match.
    pub client: ClientConfig,
}

/// The last drill's outcome. A drill that failed sets `last_error` and leaves the other fields as
/// the last one that got as far as a verdict left them (they describe `last_revision`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrillStatus {
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_success: Option<SystemTime>,
    pub last_revision: Option<i64>,
    /// etcd's HashKV of the restored data at `last_revision` (after compacting it to the live
    /// etcd's compaction revision, when the live etcd could be asked).
    pub last_hash: Option<u32>,
    /// Whether that equals the live etcd's HashKV at the same revision; `None` when the live etcd
    /// could not say (not running, or already compacted past that revision).
    pub matches_live: Option<bool>,
    /// The member whose HashKV the restored data was compared with: a follower when there is one,
    /// since HashKV holds back that member's writes while it reads the whole database.
    pub compared_with: Option<String>,
    /// Why `matches_live` is `None`: the live etcd's answer to HashKV at that revision.
    pub not_compared: Option<String>,
    pub last_seconds: Option<f64>,
    pub last_error: Option<String>,
    pub runs: u64,
}

/// Runs drills on the schedule until cancelled.
pub async fn run(
    cfg: DrillConfig,
    reaper: Reaper,
    status: watch::Sender<DrillStatus>,
    cancel: CancellationToken,
) {
    let data = std::env::current_dir()
        .unwrap_or_else(|_| PathBuf::from("/"))
        .join(&cfg.data_dir);
    remove_stale_scratch(&data);
    loop {
        let now = chrono::Utc::now();
        let Ok(next) = cfg.schedule.find_next_occurrence(&now, false) else {
            return;
        };
        let wait = (next - now).to_std().unwrap_or_default();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let mut scratch = data.as_os_str().to_owned();
        scratch.push(format!(
            ".verify-{}",
            crate::store::layout::format_time(crate::store::layout::now_ms())
        ));
        let scratch = PathBuf::from(scratch);
        let opts = RestoreOptions::scratch(scratch.join("data"), cfg.program.clone());
        let result = async {
            let store = cfg
                .backup
                .open_store()
                .map_err(|e| crate::telemetry::error_chain(&e))?;
            std::fs::create_dir_all(&scratch).map_err(|e| format!("create {}: {e}", scratch.display()))?;
            let report = tokio::select! {
                _ = cancel.cancelled() => return Err("cancelled".to_owned()),
                r = restore(&store, &opts, &reaper) => r.map_err(|e| crate::telemetry::error_chain(&e))?,
            };
            if !report.skipped.is_empty() {
                return Err(format!(
                    "the newest chain failed verification: {:?}",
                    report.skipped
                ));
            }
            let (live, compared_with, not_compared) = match tokio::select! {
                _ = cancel.cancelled() => return Err("cancelled".to_owned()),
                r = live_hash(&cfg.client, report.revision) => r,
            } {
                Ok((hash, compacted, member)) => (Some((hash, compacted)), Some(member), None),
                Err(why) => (None, None, Some(why)),
            };
            let hash = tokio::select! {
                _ = cancel.cancelled() => return Err("cancelled".to_owned()),
                r = open_with_etcd(
                    &reaper,
                    &opts.etcd,
                    &opts.data_dir,
                    &opts.name,
                    report.revision,
                    live.map(|(_, compacted)| compacted),
                ) => r?,
            };
            let matches = live.map(|(want, _)| want == hash);
            if let Some((want, _)) = live
                && want != hash
            {
                tracing::error!(
                    revision = report.revision,
                    restored = hash,
                    live = want,
                    "restore drill: the backups do not reproduce this cluster"
                );
            }
            Ok((report, hash, matches, (compared_with, not_compared)))
        }
        .await;
        let _ = std::fs::remove_dir_all(&scratch);
        status.send_modify(|s| {
            s.runs += 1;
            match &result {
                // The restore worked but reproduces another history than the live etcd's: a
                // failed drill, with the verdict kept where operators look.
                Ok((r, hash, Some(false), (with, _))) => {
                    s.last_revision = Some(r.revision);
                    s.last_hash = Some(*hash);
                    s.matches_live = Some(false);
                    s.compared_with.clone_from(with);
                    s.not_compared = None;
                    s.last_seconds = Some(r.seconds);
                    s.last_error = Some(format!(
                        "the restored data's HashKV at revision {} is {hash}, not live member {}'s: the backups do not reproduce this cluster",
                        r.revision,
                        with.as_deref().unwrap_or("?")
                    ));
                }
                Ok((r, hash, compared, (with, not_compared))) => {
                    tracing::info!(
                        revision = r.revision,
                        hash_kv = hash,
                        matches_live = ?compared,
                        seconds = r.seconds,
                        "restore drill succeeded"
                    );
                    s.last_success = Some(SystemTime::now());
                    s.last_revision = Some(r.revision);
                    s.last_hash = Some(*hash);
                    s.matches_live = *compared;
                    s.compared_with.clone_from(with);
                    s.not_compared.clone_from(not_compared);
                    s.last_seconds = Some(r.seconds);
                    s.last_error = None;
                }
                Err(e) => {
                    tracing::error!(error = %e, "restore drill FAILED");
                    s.last_error = Some(e.clone());
                }
            }
        });
    }
}

/// Scratch dirs of drills cut short (the warden stopped in the middle of one): each holds up to a
/// whole database beside the data dir. Only directories named as `run` names them are removed.
fn remove_stale_scratch(data: &std::path::Path) {
    let (Some(parent), Some(name)) = (data.parent(), data.file_name()) else {
        return;
    };
    let prefix = format!("{}.verify-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(stamp) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        if crate::store::layout::parse_time(stamp).is_none()
            || !std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir())
        {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => {
                tracing::info!(path = %e.path().display(), "removed a restore drill's scratch dir left by a stop in its middle")
            }
            Err(err) => {
                tracing::warn!(path = %e.path().display(), error = %err, "cannot remove a restore drill's scratch dir")
            }
        }
    }
}

/// The live cluster's HashKV at `revision`, the compaction revision it covers from and the member
/// that answered; or why none could (compacted past that revision, or not running).
///
/// HashKV holds etcd's read transaction across the whole database, and that member's commits, so
/// its writes, wait until it ends: 5.7 s at 7.6 GiB (bench/drill.py). A follower is asked first,
/// so the leader and the other members keep the cluster's writes going; the leader only when no
/// follower answers, and a single member itself. Each request has its own connection with
/// `WHOLE_DATABASE` as its timeout: with the health timeout, the drill never compared at 8 GiB.
async fn live_hash(client: &ClientConfig, revision: i64) -> Result<(u32, i64, String), String> {
    let mut last = String::from("no member to ask");
    for (name, mut cfg) in followers_first(client).await {
        cfg.timeout = crate::etcd::client::WHOLE_DATABASE;
        let answer = match cfg.connect().await {
            Ok(mut c) => c.hash_kv(revision).await.map_err(|e| e.to_string()),
            Err(e) => Err(crate::telemetry::error_chain(&e)),
        };
        match answer {
            Ok(h) => return Ok((h.hash(), h.compact_version(), name)),
            Err(e) => {
                tracing::info!(error = %e, revision, member = %name, "restore drill: a live member cannot hash that revision");
                last = format!("{name}'s HashKV at revision {revision}: {e}");
                // Every member compacts at the same revision.
                if e.contains("compacted") {
                    break;
                }
            }
        }
    }
    Err(last)
}

/// The voting members with client URLs, each with this warden's TLS and credentials, followers
/// before the leader; this member alone when the list cannot be read.
async fn followers_first(client: &ClientConfig) -> Vec<(String, ClientConfig)> {
    let alone = || vec![("this member".to_owned(), client.clone())];
    let members = match client.connect().await {
        Ok(mut c) => match c.member_list().await {
            Ok(r) => r.members().to_vec(),
            Err(_) => return alone(),
        },
        Err(_) => return alone(),
    };
    let mut ranked = Vec::new();
    for m in members
        .iter()
        .filter(|m| !m.is_learner() && !m.client_urls().is_empty())
    {
        let mut cfg = client.clone();
        cfg.endpoints = m.client_urls().to_vec();
        let leads = match cfg.connect().await {
            Ok(mut c) => match c.status().await {
                Ok(s) => s.leader() == m.id(),
                Err(_) => continue,
            },
            Err(_) => continue,
        };
        ranked.push((leads, m.name().to_owned(), cfg));
    }
    if ranked.is_empty() {
        return alone();
    }
    ranked.sort_by_key(|(leads, _, _)| *leads);
    ranked.into_iter().map(|(_, name, cfg)| (name, cfg)).collect()
}

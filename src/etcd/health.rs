//! The health loop: is etcd able to serve? A linearizable read (needs a leader and a quorum), the
//! member's status (leader, errors, db size, revision) and the alarm list (NOSPACE, CORRUPT).
//!
//! Results go to a watch channel stamped with the incarnation of the etcd they were taken from, so a
//! result about a process that has since died never counts. While the current incarnation has not
//! yet been seen healthy the loop polls fast, so readiness follows a (re)start closely.

use std::time::{Duration, SystemTime};

use etcd_client::{AlarmAction, AlarmType, Client};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::ClientConfig;
use crate::etcd::supervisor::{ChildState, Phase};
use crate::telemetry::Heartbeat;

/// The latest health result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    /// The etcd incarnation this result is about (0: none yet).
    pub incarnation: u64,
    pub healthy: bool,
    /// Why not healthy.
    pub reason: Option<String>,
    pub revision: Option<i64>,
    pub db_size: Option<i64>,
    pub leader: Option<u64>,
    /// The release the server reports in its status answer.
    pub version: Option<String>,
    /// Its database's sizes, quota, alarm and growth (also while it is not healthy: NOSPACE).
    pub space: Option<crate::space::Sample>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub checked_at: Option<SystemTime>,
}

const FAST_POLL: Duration = Duration::from_millis(50);
/// After a defragmentation etcd works off the requests queued behind it; a check that times out in
/// that moment is still the defrag's doing. The verdict is held this long after one was last seen
/// (2 s was too short once on a loaded CI machine: a check timed out 2.2 s after a 157 MiB defrag).
const AFTER_DEFRAG: Duration = Duration::from_secs(5);

/// Below this much free space on the data dir's filesystem etcd cannot write (a WAL segment is
/// 64 MiB, a db grows by pages): not ready, whatever the read path says. A restarted etcd on a full
/// disk can still answer linearizable reads from its preallocated WAL, then fail the next write.
const MIN_FREE: u64 = 4 << 20;

/// Free bytes for unprivileged writers on the filesystem that holds `dir`; `None` when it cannot
/// be told (the dir is being restored, or the call is not supported).
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Runs until cancelled.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    config: ClientConfig,
    data_dir: std::path::PathBuf,
    interval: Duration,
    mut child: watch::Receiver<ChildState>,
    health: watch::Sender<Health>,
    mut defragmenting: watch::Receiver<bool>,
    defrag_not_ready: bool,
    quota: Option<i64>,
    heartbeat: Heartbeat,
    cancel: CancellationToken,
) {
    let mut client: Option<(u64, Client)> = None;
    let mut forecast = crate::space::Forecast::default();
    let mut defrag_seen: Option<std::time::Instant> = None;
    let mut reported_version: Option<String> = None;
    loop {
        heartbeat.beat();
        let state = child.borrow_and_update().clone();
        let mut seen_healthy = false;
        if state.phase == Phase::Running && state.pid.is_some() {
            // A fresh client for each incarnation: no stale channel state from a dead process.
            if client.as_ref().is_none_or(|(inc, _)| *inc != state.incarnation) {
                client = match config.connect().await {
                    Ok(c) => Some((state.incarnation, c)),
                    Err(err) => {
                        tracing::debug!(error = %err, "etcd client not connected yet");
                        None
                    }
                };
            }
            // A defrag that started and ended between two checks counts too (has_changed). So does
            // one this warden did not start: another member's writer defragmenting this member,
            // or an operator's `etcdctl defrag` (etcd's temporary copy in the data dir tells).
            if defragmenting.has_changed().unwrap_or(false)
                | *defragmenting.borrow_and_update()
                | crate::space::defrag_in_progress(&data_dir)
            {
                defrag_seen = Some(std::time::Instant::now());
            }
            let (mut result, mut space) = match client.as_mut() {
                Some((_, c)) => check(c, config.timeout, quota).await,
                None => (
                    Err("etcd is not accepting client connections yet".to_owned()),
                    None,
                ),
            };
            if let Some(s) = space.as_mut() {
                forecast.observe(std::time::Instant::now(), s);
            }
            if result.is_ok()
                && let Some(free) = free_bytes(&data_dir).filter(|f| *f < MIN_FREE)
            {
                result = Err(format!(
                    "the data dir's filesystem is full ({} KiB free of the {} MiB etcd needs to write): free space on {}",
                    free >> 10,
                    MIN_FREE >> 20,
                    data_dir.display()
                ));
            }
            // Once per incarnation, at its first healthy answer: the etcd that answered must be the
            // one this warden started (another that took the address while this one was down
            // would be reported ready and backed up as this member). Once the child listens,
            // nobody else can take the address.
            if result.is_ok()
                && let Some(pid) = state.pid
                && !(health.borrow().healthy && health.borrow().incarnation == state.incarnation)
                && let Some(endpoint) = config.endpoints.first()
                && let Err(why) = super::ports::answered_by_child(endpoint, pid)
            {
                result = Err(why);
            }
            let defrag_now = *defragmenting.borrow() || crate::space::defrag_in_progress(&data_dir);
            if defrag_now {
                defrag_seen = Some(std::time::Instant::now());
            }
            let defrag_recent = defrag_seen.is_some_and(|t| t.elapsed() < AFTER_DEFRAG);
            result = during_defrag(
                result,
                defrag_now,
                defrag_recent,
                defrag_not_ready,
                &health,
                state.incarnation,
            );
            // Auth was enabled (or a token went stale) under this client: connect again, with the
            // configured user this time.
            if let Err(reason) = &result
                && ["user name is empty", "invalid auth token", "permission denied"]
                    .iter()
                    .any(|m| reason.contains(m))
            {
                client = None;
            }
            // Drop the result if etcd changed under us while we were asking.
            if child.borrow().incarnation == state.incarnation {
                seen_healthy = publish(
                    &health,
                    state.incarnation,
                    result,
                    space,
                    &mut reported_version,
                    &data_dir,
                );
            }
        } else {
            client = None;
        }
        let wait = if seen_healthy {
            interval
        } else {
            FAST_POLL.min(interval)
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = child.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// A check made during a defragmentation (or just after one): with `--space-defrag-not-ready`,
/// not ready; otherwise a failed check keeps this incarnation's previous verdict, since etcd
/// answers nothing while it defragments and a busy etcd is not a broken one.
fn during_defrag(
    mut result: Result<Health, String>,
    defrag_now: bool,
    defrag_recent: bool,
    defrag_not_ready: bool,
    health: &watch::Sender<Health>,
    incarnation: u64,
) -> Result<Health, String> {
    if defrag_not_ready && (defrag_now || result.is_err() && defrag_recent) {
        // The operator asked (`--space-defrag-not-ready`): clients go elsewhere meanwhile,
        // and for a check that failed just after it, which is the defrag's doing too.
        result = Err(
            "etcd is defragmenting its database and answers nothing until it is done \
             (--space-defrag-not-ready)"
                .to_owned(),
        );
    } else if let Err(reason) = &result
        && defrag_recent
    {
        // etcd answers nothing while it defragments: a check that failed during one (or
        // just after) keeps the previous verdict of this incarnation instead of calling a
        // busy etcd unhealthy.
        let prev = health.borrow().clone();
        if prev.healthy && prev.incarnation == incarnation {
            tracing::debug!(reason = %reason, "health check failed during defragmentation; verdict held");
            result = Ok(prev);
        }
    }
    result
}

/// Publishes one check's verdict for `incarnation` (logging a change and the release etcd
/// reports, which is recorded beside the data dir); whether etcd is healthy.
fn publish(
    health: &watch::Sender<Health>,
    incarnation: u64,
    result: Result<Health, String>,
    space: Option<crate::space::Sample>,
    reported_version: &mut Option<String>,
    data_dir: &std::path::Path,
) -> bool {
    let previous_ok = health.borrow().healthy && health.borrow().incarnation == incarnation;
    let h = match result {
        Ok(mut h) => {
            h.incarnation = incarnation;
            // (A verdict held through a defragmentation keeps its older sizes.)
            h.space = space.or(h.space);
            h
        }
        Err(reason) => Health {
            incarnation,
            reason: Some(reason),
            checked_at: Some(SystemTime::now()),
            space,
            ..Health::default()
        },
    };
    if let Some(v) = h.version.as_deref()
        && reported_version.as_deref() != Some(v)
    {
        *reported_version = Some(v.to_owned());
        tracing::info!(version = v, "etcd reports its release");
        if let Some(v) = super::version::Version::parse(v) {
            super::version::warn_known_issues(v, "server");
            // The release that served this data dir: what the next start's upgrade
            // check compares with.
            if let Err(e) = crate::etcd::version::record_release(data_dir, v) {
                tracing::warn!(error = %e, "cannot record the etcd release beside the data dir");
            }
        }
    }
    if previous_ok != h.healthy {
        match &h.reason {
            None => tracing::info!(revision = h.revision, "etcd is healthy"),
            Some(r) => tracing::warn!(reason = %r, "etcd is not healthy"),
        }
    }
    let healthy = h.healthy;
    health.send_replace(h);
    healthy
}

/// One check: the verdict, and the space sample taken on the way (`None` when etcd did not answer
/// its status). `quota`: the command line's `--quota-backend-bytes`.
async fn check(
    client: &mut Client,
    timeout: Duration,
    quota: Option<i64>,
) -> (Result<Health, String>, Option<crate::space::Sample>) {
    let mut space = None;
    let probe = async {
        let status = client
            .status()
            .await
            .map_err(|e| format!("status request failed: {}", brief(&e)))?;
        let sample = crate::space::Sample {
            db_size: status.db_size(),
            db_size_in_use: status.raft_used_db_size(),
            quota: Some(status.db_size_quota())
                .filter(|q| *q > 0)
                .or(quota.filter(|q| *q > 0))
                .unwrap_or(crate::space::DEFAULT_QUOTA),
            ..Default::default()
        };
        space = Some(sample);
        if status.leader() == 0 {
            return Err("etcd has no leader".to_owned());
        }
        // Before the status' errors, which name a raised alarm too: the space sample needs to know
        // whether it is NOSPACE.
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(|e| format!("alarm request failed: {}", brief(&e)))?;
        if let Some(s) = space.as_mut() {
            s.nospace = alarms.alarms().iter().any(|a| a.alarm() == AlarmType::Nospace);
        }
        if let Some(err) = status.errors().first() {
            return Err(format!("etcd reports an error: {err}"));
        }
        if let Some(alarm) = alarms.alarms().first() {
            let name = match alarm.alarm() {
                AlarmType::Nospace => "NOSPACE",
                AlarmType::Corrupt => "CORRUPT",
                AlarmType::None => "NONE",
            };
            return Err(format!("etcd alarm {name} is raised"));
        }
        // What etcd's own /health does: a linearizable read, which needs a leader and a quorum.
        let read = client
            .get("health", None)
            .await
            .map_err(|e| format!("linearizable read failed: {}", brief(&e)))?;
        Ok(Health {
            incarnation: 0,
            healthy: true,
            reason: None,
            revision: read.header().map(|h| h.revision()),
            db_size: Some(status.db_size()),
            leader: Some(status.leader()),
            version: Some(status.version().to_owned()),
            space: None,
            checked_at: Some(SystemTime::now()),
        })
    };
    let verdict = match tokio::time::timeout(timeout, probe).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "health check timed out after {}",
            humantime::format_duration(timeout)
        )),
    };
    (verdict, space)
}

/// An etcd client error as one short phrase: the gRPC status message, or the root cause.
fn brief(err: &etcd_client::Error) -> String {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            root_cause(status).unwrap_or_else(|| status.message().to_owned())
        }
        other => root_cause(other).unwrap_or_else(|| other.to_string()),
    }
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = err.source()?;
    while let Some(next) = cur.source() {
        cur = next;
    }
    Some(cur.to_string())
}

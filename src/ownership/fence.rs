//! After the kill: the final snapshot, taken from a private etcd, and the fenced state.
//!
//! The run loop SIGKILLs etcd's process group the moment ownership is lost and only then calls
//! [`take_final`]: nothing here can delay the kill. etcd is started again on the same data dir with
//! its client and peer listeners on loopback ports nobody else is told (so it replays its WAL and
//! the snapshot holds every acknowledged write), a full snapshot marked final is streamed to the
//! store, and the private etcd is stopped. A failing store is retried with backoff, for as long as
//! the host stays fenced; the private etcd is kept up between attempts so the WAL is replayed once.
//!
//! The pending delta is not waited for: the backup loop flushes it on its own once its watch
//! breaks (after the kill), and the final snapshot holds all of it anyway.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::sync::watch;

use crate::backup::SnapInfo;
use crate::etcd::private::PrivateEtcd;
use crate::process::pid1::Reaper;
use crate::snapshot::full;
use crate::startup::member::MemberConfig;
use crate::store::layout::Kind;

/// `/status` → `ownership.fence`, metrics, readiness.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FenceStatus {
    /// Set from the kill until ownership returns.
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub fenced_since: Option<SystemTime>,
    /// What the fence is doing: killing etcd, final snapshot, fenced.
    pub step: Option<String>,
    pub kills_total: u64,
    /// From the decision to kill until etcd was reaped, for the last fence.
    pub last_kill_seconds: Option<f64>,
    pub final_snapshots_total: u64,
    pub final_snapshot_failures_total: u64,
    pub last_final: Option<SnapInfo>,
    pub last_error: Option<String>,
}

impl FenceStatus {
    pub fn not_ready_reason(&self) -> Option<String> {
        self.fenced_since.map(|_| {
            format!(
                "fenced: this host is no longer the owner ({})",
                self.step.as_deref().unwrap_or("fenced")
            )
        })
    }
}

/// How a final snapshot attempt ended.
#[derive(Debug)]
enum Taken {
    New(SnapInfo),
    /// The newest snapshot in the store is already final at this revision.
    AlreadyFinal(i64),
}

fn step(status: &watch::Sender<FenceStatus>, what: &str) {
    tracing::info!(step = what, "fence");
    status.send_modify(|s| s.step = Some(what.to_owned()));
}

/// Takes the final snapshot, retrying until it is in the store or `abandon` completes (ownership
/// back, or the stop deadline). `true` when the store holds a final snapshot of this data dir.
pub async fn take_final(
    cfg: &MemberConfig,
    reaper: &Reaper,
    status: &watch::Sender<FenceStatus>,
    abandon: impl std::future::Future<Output = ()>,
) -> bool {
    tokio::pin!(abandon);
    let mut private: Option<PrivateEtcd> = None;
    let mut delay = Duration::from_secs(1);
    let mut served = None;
    let done = loop {
        let outcome = tokio::select! {
            r = attempt(cfg, reaper, status, &mut private) => r,
            _ = &mut abandon => break false,
        };
        match outcome {
            Ok(Taken::New(info)) => {
                served = Some(info.revision);
                tracing::info!(key = %info.key, revision = info.revision, bytes = info.stored_bytes, "final snapshot uploaded");
                status.send_modify(|s| {
                    s.final_snapshots_total += 1;
                    s.last_final = Some(info);
                    s.last_error = None;
                });
                break true;
            }
            Ok(Taken::AlreadyFinal(rev)) => {
                served = Some(rev);
                tracing::info!(
                    revision = rev,
                    "the newest snapshot is already final at this revision; not taking another"
                );
                status.send_modify(|s| s.last_error = None);
                break true;
            }
            Err(e) => {
                tracing::error!(error = %e, retry_in_s = delay.as_secs(), "final snapshot failed; etcd stays down and it is retried");
                status.send_modify(|s| {
                    s.final_snapshot_failures_total += 1;
                    s.last_error = Some(e);
                    s.step = Some("final snapshot failed; retrying".into());
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut abandon => break false,
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    };
    if let Some(p) = private.take() {
        p.stop().await;
        // The next start-up check need not start another private etcd on the same files.
        if let Some(revision) = served {
            crate::startup::restore::served_by_private_etcd(
                &crate::etcd::MemberDirs::of(&cfg.etcd),
                revision,
                None,
            );
        }
    }
    done
}

async fn attempt(
    cfg: &MemberConfig,
    reaper: &Reaper,
    status: &watch::Sender<FenceStatus>,
    private: &mut Option<PrivateEtcd>,
) -> Result<Taken, String> {
    if private.is_none() {
        step(status, "final snapshot: replaying the WAL in a private etcd");
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let data = cwd.join(&cfg.etcd.data_dir);
        let started = Instant::now();
        // Held by the caller while it comes up: abandoned then (ownership back), it is stopped
        // and its exit awaited before anything else may open the data dir.
        let etcd = private.insert(
            PrivateEtcd::spawn(
                reaper,
                &cfg.launch.program,
                &data,
                cfg.etcd.wal_path().as_deref(),
                &cfg.etcd.name,
                &crate::etcd::dirs::beside(&data, ".final-snapshot.log"),
                false,
            )
            .await?,
        );
        if let Err(e) = etcd.wait_up().await {
            *private = None;
            return Err(e);
        }
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "private etcd up for the final snapshot"
        );
    }
    let Some(etcd) = private.as_ref() else {
        unreachable!("started above")
    };
    let mut client = etcd.client().await?;
    let store = cfg
        .backup
        .open_store()
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let revision = client
        .status()
        .await
        .map_err(|e| format!("read the private etcd's revision: {e}"))?
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let fulls = store
        .list_fulls()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    if let Some((newest, _)) = fulls.last()
        && matches!(newest.kind, Kind::Full { revision: r, is_final: true } if r == revision)
    {
        return Ok(Taken::AlreadyFinal(revision));
    }
    step(status, "final snapshot: uploading");
    let r = full::take_full(
        &mut client,
        &store,
        cfg.backup.compression,
        full::FullOptions {
            is_final: true,
            ..Default::default()
        },
        &crate::telemetry::Progress::to({
            let status = status.clone();
            move |what| {
                if let Some(w) = what {
                    status.send_modify(|s| s.step = Some(format!("final snapshot: {w}")));
                }
            }
        }),
    )
    .await
    .map_err(|e| crate::telemetry::error_chain(&e))?;
    Ok(Taken::New(SnapInfo {
        key: r.name.key(),
        revision: r.name.last_revision(),
        at: Some(SystemTime::now()),
        stored_bytes: r.stored_bytes,
        raw_bytes: r.raw_bytes,
        duration_seconds: r.duration.as_secs_f64(),
    }))
}

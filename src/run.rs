//! `etcd-warden run`: wires the tasks together and turns signals into requests.
//!
//!   signal thread ──SIGCHLD──▶ Reaper (waitpid -1) ──exit status──▶ Supervisor (owns etcd)
//!        │                                                            │ watch<ChildState>
//!        └─SignalEvent─▶ run loop ──mpsc<Request>──────────────────────┘      │
//!                           │                                                  ▼
//!                           │   health loop (etcd client) ──watch<Health>──▶ Shared ──▶ http (/readyz …)
//!                           │                                                  ▲   └──▶ notify (systemd)
//!                           └─full/delta/stop─▶ backup loop ──watch<BackupStatus>┘
//!
//! Shutdown order: not ready at once → flush the pending delta (bounded) → SIGTERM etcd → grace →
//! SIGKILL → reap → the other tasks are cancelled → exit with etcd's status. A second stop signal
//! SIGKILLs etcd at once, even while the flush is still running.

use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::RunConfig;
use crate::etcd::Health;
use crate::pid1::{ExitStatus, InitRole, Reaper};
use crate::signals::SignalEvent;
use crate::snapshot::backup::{Backup, BackupStatus, Control};
use crate::state::Shared;
use crate::supervisor::{ChildState, Request, Supervisor};
use crate::telemetry::Heartbeat;

/// Supervises etcd until a stop signal ends it; returns etcd's final exit status.
pub async fn run(
    config: RunConfig,
    reaper: Reaper,
    role: InitRole,
    mut signals: mpsc::UnboundedReceiver<SignalEvent>,
    listener: TcpListener,
) -> ExitStatus {
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (child_tx, child_rx) = watch::channel(ChildState::initial());
    let (health_tx, health_rx) = watch::channel(Health::default());
    let (backup_tx, backup_rx) = watch::channel(BackupStatus::default());
    let (drill_tx, drill_rx) = watch::channel(crate::restore::drill::DrillStatus::default());
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let (restoring_tx, restoring_rx) = watch::channel(Some("checking the data dir".to_owned()));
    let shared = Shared {
        child: child_rx.clone(),
        health: health_rx.clone(),
        backup: backup_rx,
        drill: drill_rx,
        shutting_down: stopping_rx,
        restoring: restoring_rx,
        reaper: reaper.clone(),
        role,
        started_at: SystemTime::now(),
        store: config.store.to_string(),
        supervisor_heartbeat: Heartbeat::new(),
        health_heartbeat: Heartbeat::new(),
    };
    shared.supervisor_heartbeat.beat();
    shared.health_heartbeat.beat();
    tracing::info!(
        etcd = %config.launch.program.display(),
        name = %config.etcd.name,
        data_dir = %config.etcd.data_dir.display(),
        endpoints = %config.client.endpoints.join(","),
        listen = %config.listen,
        store = %config.store,
        role = ?role,
        "etcd-warden starting"
    );

    tracker.spawn(crate::http::serve(listener, shared.clone(), cancel.child_token()));
    tracker.spawn(crate::etcd::health::run(
        config.client.clone(),
        config.health_interval,
        child_rx.clone(),
        health_tx,
        shared.health_heartbeat.clone(),
        cancel.child_token(),
    ));
    tracker.spawn(crate::notify::run(shared.clone(), cancel.child_token()));

    // Validate (and if need be restore) the data dir before etcd may start. A stop signal meanwhile
    // abandons it: the private etcd is killed, the target is left as it was.
    {
        let prepare = crate::restore::startup::prepare(&config, &reaper, &restoring_tx);
        tokio::pin!(prepare);
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = beat.tick() => shared.supervisor_heartbeat.beat(),
                decision = &mut prepare => {
                    match decision {
                        Ok(d) => tracing::info!(decision = ?d, "data dir ready"),
                        Err(e) => {
                            tracing::error!(error = %e, "start-up restore failed; etcd is not started");
                            cancel.cancel();
                            return ExitStatus::Code(1);
                        }
                    }
                    break;
                }
                Some(ev) = signals.recv() => {
                    if let SignalEvent::Stop(sig) = ev {
                        tracing::warn!(signal = %sig, "stop requested during the start-up check; etcd was not started");
                        cancel.cancel();
                        return ExitStatus::Code(128 + sig as i32);
                    }
                }
            }
        }
        restoring_tx.send_replace(None);
    }
    if let Some(schedule) = config.verify_schedule.clone() {
        tracker.spawn(crate::restore::drill::run(
            config.clone(),
            schedule,
            reaper.clone(),
            drill_tx,
            cancel.child_token(),
        ));
    }
    let (backup, backup_handle) = Backup::new(config.backup.clone(), backup_tx, child_rx, health_rx);
    let backup_task = tokio::spawn(backup.run());

    let (requests, request_rx) = mpsc::channel(16);
    let supervisor = Supervisor::new(
        config.policy,
        config.launch.clone(),
        reaper,
        child_tx,
        shared.supervisor_heartbeat.clone(),
    );
    let mut supervisor = tokio::spawn(supervisor.run(request_rx));
    // The flush before a graceful stop may take at most this long.
    let flush_budget = (config.policy.stop_timeout / 2).min(Duration::from_secs(15));

    let status = loop {
        tokio::select! {
            done = &mut supervisor => break done.unwrap_or(ExitStatus::Code(1)),
            Some(event) = signals.recv() => match event {
                SignalEvent::Stop(sig) => {
                    if *stopping_tx.borrow() {
                        tracing::warn!(signal = %sig, "second stop signal: killing etcd now");
                        let _ = requests.send(Request::Stop).await;
                        let _ = requests.send(Request::Stop).await;
                        continue;
                    }
                    tracing::info!(signal = %sig, "stop requested: flushing the pending delta, then stopping etcd");
                    stopping_tx.send_replace(true);
                    crate::notify::stopping(&shared);
                    let handle = backup_handle.clone();
                    let requests = requests.clone();
                    tokio::spawn(async move {
                        handle.stop(flush_budget).await;
                        let _ = requests.send(Request::Stop).await;
                    });
                }
                SignalEvent::Forward(sig) => {
                    let _ = requests.send(Request::Forward(sig)).await;
                }
                SignalEvent::FullSnapshot => {
                    if backup_handle.request_full() {
                        tracing::info!("SIGUSR1: full snapshot requested");
                    } else {
                        tracing::info!("SIGUSR1: a full snapshot is already pending; coalesced");
                    }
                }
                SignalEvent::DeltaSnapshot => {
                    if backup_handle.request_delta() {
                        tracing::info!("SIGUSR2: delta flush requested");
                    }
                }
                SignalEvent::Reload => {
                    tracing::info!("SIGHUP: re-opening the store (credentials are re-read)");
                    let _ = backup_handle.control.try_send(Control::Reload);
                }
            },
        }
    };
    tracing::info!(%status, "etcd stopped; warden exiting");
    backup_task.abort();
    cancel.cancel();
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
    status
}

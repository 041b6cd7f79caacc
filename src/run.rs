//! `etcd-warden run`: wires the tasks together and turns signals into requests.
//!
//!   signal thread ──SIGCHLD──▶ Reaper (waitpid -1) ──exit status──▶ Supervisor (owns etcd)
//!        │                                                            │ watch<ChildState>
//!        └─SignalEvent─▶ run loop ──mpsc<Request>──────────────────────┘      │
//!                                                                              ▼
//!                       health loop (etcd client) ──watch<Health>──▶ Shared ──▶ http (/readyz …)
//!                                                                          └──▶ notify (systemd)
//!
//! Shutdown order: not ready (the supervisor enters `stopping`) → STOPPING=1 → SIGTERM etcd → grace
//! → SIGKILL → reap → the other tasks are cancelled → exit with etcd's status.

use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::RunConfig;
use crate::etcd::Health;
use crate::pid1::{ExitStatus, InitRole, Reaper};
use crate::signals::SignalEvent;
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
    let shared = Shared {
        child: child_rx.clone(),
        health: health_rx,
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
        child_rx,
        health_tx,
        shared.health_heartbeat.clone(),
        cancel.child_token(),
    ));
    tracker.spawn(crate::notify::run(shared.clone(), cancel.child_token()));

    let (requests, request_rx) = mpsc::channel(16);
    let supervisor = Supervisor::new(
        config.policy,
        config.launch.clone(),
        reaper,
        child_tx,
        shared.supervisor_heartbeat.clone(),
    );
    let mut supervisor = tokio::spawn(supervisor.run(request_rx));

    let status = loop {
        tokio::select! {
            done = &mut supervisor => break done.unwrap_or(ExitStatus::Code(1)),
            Some(event) = signals.recv() => match event {
                SignalEvent::Stop(sig) => {
                    tracing::info!(signal = %sig, "stop requested");
                    let _ = requests.send(Request::Stop).await;
                    crate::notify::stopping(&shared);
                }
                SignalEvent::Forward(sig) => {
                    let _ = requests.send(Request::Forward(sig)).await;
                }
                SignalEvent::FullSnapshot | SignalEvent::DeltaSnapshot => {
                    tracing::warn!(?event, "snapshots are not implemented in this version; signal ignored");
                }
                SignalEvent::Reload => {
                    tracing::info!("SIGHUP received; nothing to reload in this version");
                }
            },
        }
    };
    tracing::info!(%status, "etcd stopped; warden exiting");
    cancel.cancel();
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
    status
}

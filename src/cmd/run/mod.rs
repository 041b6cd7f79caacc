//! `etcd-warden run`: wires the tasks together and drives etcd through its terms.
//!
//!   signal thread ──SIGCHLD──▶ Reaper (waitpid -1) ──exit status──▶ Supervisor (owns etcd)
//!        │                                                            │ watch<ChildState>
//!        └─SignalEvent─▶ run loop ──mpsc<Request>──────────────────────┘      │
//!                         ▲  │                                                 ▼
//!   ownership checker ────┘  │   health loop (etcd client) ──watch<Health>──▶ Shared ──▶ http (/readyz …)
//!   (DNS TXT, watch)         │                                                 ▲   └──▶ notify (systemd)
//!                            └─full/delta/stop─▶ backup loop ──watch<BackupStatus>┘
//!
//! A term: wait until this host owns the data (at once without an ownership check) → validate or
//! restore the data dir → start etcd → serve until a stop signal or until ownership is lost. Lost:
//! fence (SIGKILL etcd's group at once, then the final snapshot from a private etcd), stay fenced,
//! and begin a new term when ownership comes back.
//!
//! Shutdown order: not ready at once → flush the pending delta (bounded) → SIGTERM etcd → grace →
//! SIGKILL → reap → the other tasks are cancelled → exit with etcd's status. A second stop signal
//! SIGKILLs etcd at once, even while the flush is still running. A stop signal while the final
//! snapshot is being taken lets it finish within --stop-timeout; a second one abandons it.

pub mod args;
pub mod config;
mod terms;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backup::{Backup, BackupStatus};
use crate::etcd::Health;
use crate::etcd::supervisor::{ChildState, Request, Supervisor};
use crate::ownership::OwnershipStatus;
use crate::ownership::fence::FenceStatus;
use crate::process::pid1::{ExitStatus, InitRole, Reaper};
use crate::process::signals::SignalEvent;
use crate::serve::state::Shared;
use crate::startup::RestoreStats;
use crate::telemetry::{self, Heartbeat};
use config::RunConfig;

use std::collections::HashMap;

use super::EX_USAGE;
use crate::process::{pid1, signals};
use crate::serve::http;
use args::RunArgs;
use terms::Terms;

/// Runs `run` (and `standby`, with `standby` set): the configuration validated before anything
/// starts (a bad one exits 64 with the input named), then the warden as PID 1 or a subreaper.
pub fn main(args: RunArgs, standby: Option<crate::standby::StandbyConfig>, env_warnings: &[String]) -> i32 {
    // A misspelled variable meant for the warden (its store, its stop timeout) would otherwise
    // leave that setting at its default while etcd runs: refused before anything starts.
    if !env_warnings.is_empty() {
        for w in env_warnings {
            eprintln!("etcd-warden: {w}");
        }
        eprintln!(
            "etcd-warden: refusing to start with an ETCD_WARDEN_* variable it does not read: rename or unset it"
        );
        return EX_USAGE;
    }
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match RunConfig::from_args(args, &env) {
        Ok(c) => RunConfig { standby, ..c },
        Err(err) => {
            eprintln!("etcd-warden: {err}");
            return EX_USAGE;
        }
    };
    let checked = match config.standby {
        Some(_) => crate::standby::check_usage(&config.member),
        None => crate::standby::check_not_a_standby(&config.member),
    };
    if let Err(e) = checked {
        eprintln!("etcd-warden: {e}");
        return EX_USAGE;
    }
    telemetry::init_logging(config.log_format);

    let reaper = pid1::Reaper::new();
    let role = match pid1::become_reaper() {
        Ok(role) => role,
        Err(err) => {
            tracing::error!(error = %err, "failed to become the child subreaper");
            return 1;
        }
    };
    let signals = match signals::start(reaper.clone()) {
        Ok(rx) => rx,
        Err(err) => {
            tracing::error!(error = %err, "failed to install signal handlers");
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("warden")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(error = %err, "failed to start the async runtime");
            return 1;
        }
    };
    let code = runtime.block_on(async {
        let listener = match http::bind(config.listen).await {
            Ok(l) => l,
            Err(err) => {
                eprintln!(
                    "etcd-warden: --listen {}: {err} (pick a free address with --listen)",
                    config.listen
                );
                return EX_USAGE;
            }
        };
        let admin = match &config.admin_socket {
            Some(path) => match http::bind_admin(path) {
                Ok(l) => Some((l, path.clone())),
                Err(err) => {
                    eprintln!("etcd-warden: --admin-socket {}: {err}", path.display());
                    return EX_USAGE;
                }
            },
            None => None,
        };
        run(config, reaper, role, signals, listener, admin)
            .await
            .exit_code()
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// Supervises etcd until a stop signal ends it; returns etcd's final exit status.
pub async fn run(
    config: RunConfig,
    reaper: Reaper,
    role: InitRole,
    signals: mpsc::UnboundedReceiver<SignalEvent>,
    listener: TcpListener,
    admin: Option<(UnixListener, std::path::PathBuf)>,
) -> ExitStatus {
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (child_tx, child_rx) = watch::channel(ChildState::initial());
    let (health_tx, health_rx) = watch::channel(Health::default());
    let (backup_tx, backup_rx) = watch::channel(BackupStatus::default());
    let (drill_tx, drill_rx) = watch::channel(crate::backup::drill::DrillStatus::default());
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let (restoring_tx, restoring_rx) = watch::channel(Some("checking the data dir".to_owned()));
    let (ownership_tx, ownership_rx) = watch::channel(match config.ownership {
        Some(_) => OwnershipStatus::unchecked(),
        None => OwnershipStatus::not_configured(),
    });
    let (fence_tx, fence_rx) = watch::channel(FenceStatus::default());
    let (restores_tx, restores_rx) = watch::channel(RestoreStats::default());
    let (member_tx, member_rx) = watch::channel(None);
    let (leave_refused_tx, leave_refused_rx) = watch::channel(None);
    let (standby_tx, standby_rx) = watch::channel(None);
    let (promote_tx, promote_rx) = mpsc::channel(8);
    warn_if_unsigned(&config.member.backup);
    let (etcd_version, upgrade) = match check_release(&config, &reaper).await {
        Ok(found) => found,
        Err(status) => return status,
    };
    let copies = crate::copies::Copies::start(
        &config.member.backup.copies,
        {
            let backup = config.member.backup.clone();
            move || backup.open_store()
        },
        cancel.child_token(),
    );
    let shared = Shared {
        copies: copies.clone(),
        child: child_rx.clone(),
        health: health_rx.clone(),
        backup: backup_rx,
        drill: drill_rx,
        shutting_down: stopping_rx,
        restoring: restoring_rx,
        ownership: ownership_rx.clone(),
        fence: fence_rx,
        restores: restores_rx,
        member: member_rx,
        leave_refused: leave_refused_rx,
        standby: standby_rx,
        reaper: reaper.clone(),
        role,
        etcd_binary_version: etcd_version,
        upgrade,
        started_at: SystemTime::now(),
        store: config.member.store.to_string(),
        supervisor_heartbeat: Heartbeat::new(),
        health_heartbeat: Heartbeat::new(),
    };
    shared.supervisor_heartbeat.beat();
    shared.health_heartbeat.beat();
    log_start(&config, etcd_version, role);

    let (defrag_tx, defrag_rx) = watch::channel(false);
    let (leave_tx, leave_rx) = mpsc::channel(1);
    let (backup, backup_handle) = Backup::new(
        config.member.backup.clone(),
        backup_tx,
        child_rx.clone(),
        health_rx.clone(),
        defrag_tx,
    );
    let backup = backup.with_copies(copies.clone());
    let actions = Arc::new(crate::serve::http::Actions {
        backup: backup_handle.clone(),
        token_file: config.admin_token_file.clone(),
        leave: leave_tx,
        promote: config.standby.is_some().then_some(promote_tx),
    });
    spawn_serving(&tracker, listener, admin, &shared, actions, &cancel);
    spawn_health(
        &tracker,
        &config,
        &shared,
        child_rx.clone(),
        health_tx,
        defrag_rx,
        &cancel,
    );
    tracker.spawn(crate::serve::notify::run(shared.clone(), cancel.child_token()));
    let recheck = Arc::new(Notify::new());
    // The sender lives as long as the run loop reads it (a closed watch would wake it forever).
    let _ownership_unchecked = spawn_ownership(&tracker, &config, ownership_tx, &recheck, &cancel);
    spawn_drill(&tracker, &config, &reaper, drill_tx, &cancel);
    let backup_task = tokio::spawn(backup.run());

    // One supervisor for the warden's whole life; it starts etcd only when asked.
    let (requests, supervisor) = start_supervisor(&config, &reaper, child_tx, &shared);

    let flush_budget = (config.policy.stop_timeout / 2).min(Duration::from_secs(15));
    let mut terms = Terms {
        flush_budget,
        copies: copies.clone(),
        config,
        reaper,
        shared,
        signals,
        requests,
        supervisor,
        backup: backup_handle,
        stopping: stopping_tx,
        restoring: restoring_tx,
        fence: fence_tx,
        restores: restores_tx,
        member: member_tx,
        leave_refused: leave_refused_tx,
        promote: None,
        leave: leave_rx,
        standby: standby_tx,
        promote_requests: promote_rx,
        skip_prepare: false,
        ownership: ownership_rx,
        recheck,
        hurry: false,
    };
    let status = terms.run().await;
    tracing::info!(%status, "etcd stopped; warden exiting");
    copies.drain(flush_budget).await;
    backup_task.abort();
    cancel.cancel();
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
    status
}

/// etcd's release (from `etcd --version`) checked against what last served the data dir and, in
/// a cluster, the peers' releases; the rollback point taken before a newer minor first starts.
/// `Err`: the exit status when etcd must not start. `Ok`: the release and the upgrade note.
async fn check_release(
    config: &RunConfig,
    reaper: &Reaper,
) -> Result<(Option<crate::etcd::version::Version>, Option<String>), ExitStatus> {
    let etcd_version = crate::etcd::version::of_binary(reaper, &config.member.launch.program).await;
    if let Some(v) = etcd_version {
        crate::etcd::version::warn_known_issues(v, "etcd --version");
    }
    let wal_dir = config
        .member
        .etcd
        .wal_path()
        .unwrap_or_else(|| config.member.backup.data_dir.join("member").join("wal"));
    // A cluster member's release is checked against its peers' too (the cluster version).
    let peers = match etcd_version {
        Some(_) if config.member.is_cluster_member() => {
            crate::upgrade::cluster::peer_releases(&config.member).await
        }
        _ => Vec::new(),
    };
    let gate = match crate::upgrade::gate(
        &config.member.backup.data_dir,
        &wal_dir,
        etcd_version,
        &peers,
        config.allow_unsupported_upgrade,
    ) {
        Ok(gate) => gate,
        Err(refused) => match forced_plan(config).await {
            // A forced cluster restore plan names this member: the start-up decision moves this
            // data dir aside and restores the plan's point (a rollback to an older release).
            Some(plan) => {
                tracing::warn!(
                    plan,
                    "a forced cluster restore plan replaces this data dir before etcd starts; the release check does not apply to it: {refused}"
                );
                crate::upgrade::Gate::default()
            }
            None => {
                tracing::error!("unsupported etcd release path: {refused}");
                return Err(ExitStatus::Code(64));
            }
        },
    };
    if let (Some(from), Some(next)) = (&gate.upgrade_from, etcd_version)
        && let Err(e) = rollback_point(config, reaper, from, next).await
    {
        tracing::error!(
            "no rollback point, so etcd {next} is not started on data that {from} wrote: {e} \
             (fix the store and start again; the data dir is untouched)"
        );
        return Err(ExitStatus::Code(1));
    }
    Ok((etcd_version, gate.note))
}

/// The line that says what this warden runs, with what and where.
fn log_start(config: &RunConfig, etcd_version: Option<crate::etcd::version::Version>, role: InitRole) {
    tracing::info!(
        etcd = %config.member.launch.program.display(),
        etcd_version = etcd_version.map(|v| v.to_string()),
        name = %config.member.etcd.name,
        data_dir = %config.member.etcd.data_dir.display(),
        endpoints = %config.member.client.endpoints.join(","),
        listen = %config.listen,
        store = %config.member.store,
        owner_name = config.ownership.as_ref().map(|o| o.lookup.name.as_str()),
        role = ?role,
        "etcd-warden starting"
    );
}

/// The ownership checker, when `--owner-*` configures one; without one, the sender is returned
/// for the caller to keep.
fn spawn_ownership(
    tracker: &TaskTracker,
    config: &RunConfig,
    ownership_tx: watch::Sender<OwnershipStatus>,
    recheck: &Arc<Notify>,
    cancel: &CancellationToken,
) -> Option<watch::Sender<OwnershipStatus>> {
    match config.ownership.clone() {
        Some(oc) => {
            tracker.spawn(crate::ownership::run(
                oc,
                ownership_tx,
                recheck.clone(),
                cancel.child_token(),
            ));
            None
        }
        None => Some(ownership_tx),
    }
}

/// The health loop: etcd asked every `--health-interval` while it runs.
fn spawn_health(
    tracker: &TaskTracker,
    config: &RunConfig,
    shared: &Shared,
    child_rx: watch::Receiver<ChildState>,
    health_tx: watch::Sender<Health>,
    defrag_rx: watch::Receiver<bool>,
    cancel: &CancellationToken,
) {
    tracker.spawn(crate::etcd::health::run(
        config.member.client.clone(),
        config.member.backup.data_dir.clone(),
        config.health_interval,
        child_rx.clone(),
        health_tx,
        defrag_rx,
        config.member.backup.space.defrag_not_ready,
        config.member.etcd.quota_backend_bytes,
        shared.health_heartbeat.clone(),
        cancel.child_token(),
    ));
}

/// The supervisor of the etcd child, and the channel its requests go through.
fn start_supervisor(
    config: &RunConfig,
    reaper: &Reaper,
    child_tx: watch::Sender<ChildState>,
    shared: &Shared,
) -> (mpsc::Sender<Request>, JoinHandle<ExitStatus>) {
    let (requests, request_rx) = mpsc::channel(16);
    let supervisor = Supervisor::new(
        config.policy,
        config.member.launch.clone(),
        reaper.clone(),
        child_tx,
        shared.supervisor_heartbeat.clone(),
    )
    .checking_addresses(config.member.etcd.clone());
    (requests, tokio::spawn(supervisor.run(request_rx)))
}

/// The HTTP surface on `--listen` and the admin socket.
fn spawn_serving(
    tracker: &TaskTracker,
    listener: TcpListener,
    admin: Option<(UnixListener, std::path::PathBuf)>,
    shared: &Shared,
    actions: Arc<crate::serve::http::Actions>,
    cancel: &CancellationToken,
) {
    tracker.spawn(crate::serve::http::serve(
        listener,
        shared.clone(),
        actions.clone(),
        cancel.child_token(),
    ));
    if let Some((socket, path)) = admin {
        tracker.spawn(crate::serve::http::serve_admin(
            socket,
            path,
            shared.clone(),
            actions,
            cancel.child_token(),
        ));
    }
}

/// The restore drill, when `--verify-schedule` asks for one.
fn spawn_drill(
    tracker: &TaskTracker,
    config: &RunConfig,
    reaper: &Reaper,
    drill_tx: watch::Sender<crate::backup::drill::DrillStatus>,
    cancel: &CancellationToken,
) {
    if let Some(schedule) = config.verify_schedule.clone() {
        let drill = crate::backup::drill::DrillConfig {
            schedule,
            backup: config.member.backup.clone(),
            program: config.member.launch.program.clone(),
            data_dir: config.member.etcd.data_dir.clone(),
            client: config.member.client.clone(),
        };
        tracker.spawn(crate::backup::drill::run(
            drill,
            reaper.clone(),
            drill_tx,
            cancel.child_token(),
        ));
    }
}

/// The rollback point before `next` first starts on data that `from` wrote (upgrade::rollback):
/// through a private etcd of `--previous-etcd` when that is `from`'s minor and this is a single
/// member, else from the db file.
async fn rollback_point(
    config: &RunConfig,
    reaper: &Reaper,
    from: &str,
    next: crate::etcd::version::Version,
) -> Result<(), String> {
    let store = config
        .member
        .backup
        .open_store()
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let started = std::time::Instant::now();
    tracing::info!(from, to = %next, "upgrade: taking a rollback point of the data before etcd {next} starts on it");
    let taken = match previous_release(config, reaper, from).await {
        Some(previous) => {
            let data = &config.member.backup.data_dir;
            let log = crate::etcd::dirs::beside(data, ".rollback-etcd.log");
            let etcd = crate::etcd::private::PrivateEtcd::start(
                reaper,
                &previous,
                data,
                config.member.etcd.wal_path().as_deref(),
                &config.member.etcd.name,
                &log,
                false,
            )
            .await
            .map_err(|e| format!("the private etcd of {} on the data: {e}", previous.display()))?;
            let taken = match etcd.client().await {
                Ok(mut client) => {
                    crate::upgrade::rollback::take_through(
                        &mut client,
                        &store,
                        next,
                        config.member.backup.compression,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            etcd.stop().await;
            let _ = std::fs::remove_file(&log);
            taken?
        }
        None => {
            crate::upgrade::rollback::take(
                &store,
                &config.member.backup.data_dir,
                from,
                next,
                config.member.backup.compression,
            )
            .await?
        }
    };
    match taken {
        Some((key, revision)) => tracing::info!(
            key,
            revision,
            written_by = from,
            seconds = started.elapsed().as_secs_f64(),
            "rollback point uploaded"
        ),
        None => tracing::info!("the store already holds a rollback point at the data's revision"),
    }
    Ok(())
}

/// `--previous-etcd` when it may take the rollback point: its release is of `from`'s minor, and
/// the data is a single member's (a private etcd on a member's data would reach its peers).
async fn previous_release(config: &RunConfig, reaper: &Reaper, from: &str) -> Option<std::path::PathBuf> {
    let path = config.previous_etcd.as_ref()?;
    let written = crate::etcd::version::Version::parse(&format!("{from}.0"))
        .or_else(|| crate::etcd::version::Version::parse(from))?;
    let release = crate::etcd::version::of_binary(reaper, path).await;
    match release {
        Some(r)
            if r.major == written.major && r.minor == written.minor && !config.member.is_cluster_member() =>
        {
            tracing::info!(etcd = %path.display(), release = %r, "the rollback point is taken through a private etcd of the previous release");
            Some(path.clone())
        }
        Some(r) if r.major == written.major && r.minor == written.minor => {
            tracing::info!(
                "--previous-etcd is not used for a cluster member's rollback point (a private etcd on its data would reach its peers): taken from the db file"
            );
            None
        }
        other => {
            tracing::warn!(
                etcd = %path.display(),
                release = other.map(|r| r.to_string()),
                written_by = from,
                "--previous-etcd is not of the release that wrote the data: the rollback point is taken from the db file"
            );
            None
        }
    }
}

/// The id of a forced cluster restore plan this member has yet to apply, if the store holds one.
async fn forced_plan(config: &RunConfig) -> Option<String> {
    let store = config.member.backup.open_store().ok()?;
    let plan = crate::cluster::restore::pending_plan(
        &store,
        &config.member.etcd.name,
        &config.member.backup.data_dir,
    )
    .await
    .ok()??;
    plan.force.then_some(plan.id)
}

/// Says once, at start, that a remote store's objects prove no writer: whoever can write to its
/// bucket can frame a backup (docs/security.md, "A hostile store").
fn warn_if_unsigned(backup: &crate::backup::BackupConfig) {
    let remote = !matches!(backup.store, crate::store::StoreUrl::File { .. });
    if remote && !backup.keys.signing.verifies() {
        tracing::warn!(
            store = %backup.store,
            "the store is not signed: anyone who can write to it can frame a backup, which a restore would use (a data dir it replaces is kept aside); give --sign-key (docs/security.md, \"A hostile store\")"
        );
    }
}

//! The run loop (`Terms`): one term after another until a stop signal: wait for ownership,
//! prepare the data dir, start etcd, serve, and fence or stop.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use super::config::RunConfig;
use crate::backup::{BackupHandle, Control};
use crate::etcd::supervisor::{Phase, Request};
use crate::ownership::OwnershipStatus;
use crate::ownership::fence::{self, FenceStatus};
use crate::process::pid1::{ExitStatus, Reaper};
use crate::process::signals::SignalEvent;
use crate::serve::state::Shared;
use crate::startup::{Decision, RestoreStats};

/// The run loop's state: everything it reads and the handles it drives.
pub(super) struct Terms {
    pub(super) config: RunConfig,
    pub(super) reaper: Reaper,
    pub(super) shared: Shared,
    pub(super) signals: mpsc::UnboundedReceiver<SignalEvent>,
    pub(super) requests: mpsc::Sender<Request>,
    pub(super) supervisor: JoinHandle<ExitStatus>,
    pub(super) backup: BackupHandle,
    pub(super) stopping: watch::Sender<bool>,
    pub(super) restoring: watch::Sender<Option<String>>,
    pub(super) fence: watch::Sender<FenceStatus>,
    pub(super) restores: watch::Sender<RestoreStats>,
    pub(super) member: watch::Sender<Option<String>>,
    pub(super) leave_refused: watch::Sender<Option<String>>,
    /// A repaired member's learner promotion, while it runs.
    pub(super) promote: Option<JoinHandle<()>>,
    /// `ctl leave` requests.
    pub(super) leave: mpsc::Receiver<()>,
    /// A standby's progress and promotion.
    pub(super) standby: watch::Sender<Option<crate::standby::StandbyStatus>>,
    /// `ctl promote` requests (the flag: forced).
    pub(super) promote_requests: mpsc::Receiver<bool>,
    /// A promoted standby's data dir is ready as it is: the first term starts etcd on it at once.
    pub(super) skip_prepare: bool,
    pub(super) ownership: watch::Receiver<OwnershipStatus>,
    pub(super) recheck: Arc<Notify>,
    /// A second stop signal came: exit without the tail upload.
    pub(super) hurry: bool,
    /// The flush before a graceful stop may take at most this long.
    pub(super) flush_budget: Duration,
    /// `--copy-to`: the final snapshot is handed to them too.
    pub(super) copies: crate::copies::Copies,
}

/// How often a leaderless cluster member looks for a restore plan, and after how long.
const PLAN_CHECK: Duration = Duration::from_secs(5);
const LEADERLESS_BEFORE_PLAN: Duration = Duration::from_secs(10);

/// How serving ended.
enum Served {
    Exit(ExitStatus),
    /// The kill is requested; the receiver answers once etcd is reaped.
    OwnershipLost(tokio::sync::oneshot::Receiver<()>),
    /// A cluster member's data was lost under a running warden: etcd is held down (the receiver
    /// answers once it is) and the start-up decision runs again.
    Repair(tokio::sync::oneshot::Receiver<()>),
}

impl Terms {
    pub(super) async fn run(&mut self) -> ExitStatus {
        if let Some(standby) = self.config.standby.clone()
            && let Err(status) = self.stand_by(standby).await
        {
            return status;
        }
        loop {
            if let Some(sig) = self.wait_for_ownership().await {
                tracing::info!(signal = %sig, "stop requested while etcd was not running");
                return self.finish().await;
            }
            if let Err(status) = self.prepare().await {
                return status;
            }
            if !self.may_serve() {
                tracing::warn!("ownership lost during the start-up check; etcd was not started");
                continue;
            }
            let taken = crate::etcd::ports::taken(&self.config.member.etcd);
            if !taken.is_empty() {
                tracing::error!(
                    addresses = %taken.join(", "),
                    "another process already listens on etcd's addresses (another etcd, e.g. a distribution's etcd.service?): the warden runs only its own etcd and did not start it; stop that process (`ss -ltnp` names it) and start the warden again"
                );
                return ExitStatus::Code(1);
            }
            let _ = self.requests.send(Request::Start).await;
            let killed = match self.serve().await {
                Served::Exit(status) => {
                    // In a cluster only the writer uploads, the tail too.
                    let writer = self
                        .shared
                        .backup
                        .borrow()
                        .role
                        .as_deref()
                        .is_none_or(|r| r == "writer");
                    if *self.stopping.borrow() && !self.hurry && writer {
                        self.upload_tail(status).await;
                    }
                    return status;
                }
                Served::OwnershipLost(killed) => killed,
                Served::Repair(held) => {
                    let _ = held.await;
                    continue;
                }
            };
            if let Some(status) = self.fence(killed).await {
                return status;
            }
        }
    }

    fn may_serve(&self) -> bool {
        self.ownership.borrow().may_serve
    }

    /// Handles the signals that mean the same in every phase; returns a stop signal to the caller.
    fn on_signal(&self, event: SignalEvent) -> Option<Signal> {
        match event {
            SignalEvent::Stop(sig) => return Some(sig),
            SignalEvent::Forward(sig) => {
                let _ = self.requests.try_send(Request::Forward(sig));
            }
            SignalEvent::FullSnapshot => {
                if self.backup.request_full() {
                    tracing::info!("SIGUSR1: full snapshot requested");
                } else {
                    tracing::info!("SIGUSR1: a full snapshot is already pending; coalesced");
                }
            }
            SignalEvent::DeltaSnapshot => {
                if self.backup.request_delta() {
                    tracing::info!("SIGUSR2: delta flush requested");
                }
            }
            SignalEvent::Reload => {
                tracing::info!("SIGHUP: re-reading the configuration and credentials, re-checking ownership");
                self.recheck.notify_one();
                let control = match self.reload() {
                    Some(backup) => Control::Reconfigure(Box::new(backup)),
                    None => Control::Reload,
                };
                let _ = self.backup.control.try_send(control);
            }
        }
        None
    }

    /// Builds the configuration again from the same arguments, the config file read afresh. Backup
    /// settings take effect at once; the rest (etcd's command line, listeners, ownership) are
    /// fixed for the warden's life and a change is logged as needing a restart. `None` when the
    /// new configuration is invalid: the old one stays in force.
    fn reload(&self) -> Option<crate::backup::BackupConfig> {
        let env: std::collections::HashMap<String, String> = std::env::vars().collect();
        let new = match RunConfig::from_args(self.config.source.clone(), &env) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration is invalid; keeping the one in force");
                return None;
            }
        };
        let fixed = [
            (
                "etcd command line",
                new.member.launch != self.config.member.launch,
            ),
            ("--listen", new.listen != self.config.listen),
            ("--admin-socket", new.admin_socket != self.config.admin_socket),
            (
                "ownership options",
                format!("{:?}", new.ownership) != format!("{:?}", self.config.ownership),
            ),
            ("restart and stop timing", new.policy != self.config.policy),
            (
                "--health-interval",
                new.health_interval != self.config.health_interval,
            ),
        ];
        for (what, changed) in fixed {
            if changed {
                tracing::warn!(
                    setting = what,
                    "SIGHUP: this setting changed but takes effect only after a restart"
                );
            }
        }
        Some(new.member.backup)
    }

    /// After a graceful stop, the revisions etcd acknowledged after the last flush (see
    /// `backup::tail`), within --stop-timeout. Logged, never fatal.
    async fn upload_tail(&self, status: ExitStatus) {
        let killed = status == ExitStatus::Signal(9);
        let limit = self.config.policy.stop_timeout;
        match tokio::time::timeout(
            limit,
            crate::backup::tail::upload_tail(
                &self.config.member.backup,
                &self.config.member.etcd,
                &self.config.member.launch.program,
                &self.reaper,
                killed,
            ),
        )
        .await
        {
            Ok(Ok(None)) => tracing::debug!("no revisions after the last flush"),
            Ok(Ok(Some((first, last)))) => {
                tracing::info!(
                    first,
                    last,
                    "revisions acknowledged during the stop uploaded from a private etcd"
                )
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the revisions acknowledged during the stop could not be uploaded; the next start uploads them from the data dir")
            }
            Err(_) => tracing::error!(
                limit_s = limit.as_secs(),
                "uploading the revisions acknowledged during the stop took longer than --stop-timeout; the next start uploads them from the data dir"
            ),
        }
    }

    /// Stops the supervisor (etcd is not running) and returns its status.
    async fn finish(&mut self) -> ExitStatus {
        self.stopping.send_replace(true);
        crate::serve::notify::stopping(&self.shared);
        let _ = self.requests.send(Request::Stop).await;
        (&mut self.supervisor).await.unwrap_or(ExitStatus::Code(1))
    }

    /// Until this host owns the data; `Some(signal)` when asked to stop meanwhile.
    async fn wait_for_ownership(&mut self) -> Option<Signal> {
        let mut announced = false;
        loop {
            if self.may_serve() {
                return None;
            }
            if !announced {
                tracing::info!("waiting for ownership to be confirmed before etcd gets its listeners");
                announced = true;
            }
            tokio::select! {
                _ = self.ownership.changed() => {}
                Some(ev) = self.signals.recv() => {
                    if let Some(sig) = self.on_signal(ev) {
                        return Some(sig);
                    }
                }
            }
        }
    }

    /// Validates (and if need be restores) the data dir. A stop signal meanwhile abandons it: the
    /// private etcd is killed, the target is left as it was.
    async fn prepare(&mut self) -> Result<(), ExitStatus> {
        if std::mem::take(&mut self.skip_prepare) {
            self.restoring.send_replace(None);
            return Ok(());
        }
        self.restoring
            .send_replace(Some("checking the data dir".to_owned()));
        let mut joined = None;
        {
            let prepare =
                crate::startup::prepare(&self.config.member, &self.reaper, &self.restoring, &self.member);
            tokio::pin!(prepare);
            let mut beat = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = beat.tick() => self.shared.supervisor_heartbeat.beat(),
                    decision = &mut prepare => match decision {
                        Ok(d) => {
                            tracing::info!(decision = ?d, "data dir ready");
                            if let Decision::Join { flags, learner, .. } = &d {
                                joined = Some((flags.clone(), *learner));
                            }
                            if let Decision::Restored { revision, backed_up_revision, target_revision, skipped, seconds, .. } = d {
                                self.restores.send_modify(|r| {
                                    r.total += 1;
                                    r.last_revision = Some(revision);
                                    r.last_backed_up_revision = Some(backed_up_revision);
                                    r.last_target_revision = Some(target_revision);
                                    r.older_than_target_total += u64::from(backed_up_revision < target_revision);
                                    r.last_skipped = skipped;
                                    r.last_seconds = Some(seconds);
                                    r.last_at = Some(SystemTime::now());
                                });
                            }
                            break;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "start-up restore failed; etcd is not started");
                            return Err(ExitStatus::Code(1));
                        }
                    },
                    Some(ev) = self.signals.recv() => {
                        if let Some(sig) = self.on_signal(ev) {
                            tracing::warn!(signal = %sig, "stop requested during the start-up check; etcd was not started");
                            return Err(ExitStatus::Code(128 + sig as i32));
                        }
                    }
                }
            }
        }
        if let Some((flags, learner)) = joined {
            self.join(&flags, learner).await?;
        }
        self.restoring.send_replace(None);
        Ok(())
    }

    /// A standby (`crate::standby`): follows the store until promoted (`Ok`: the data dir is
    /// ready for etcd), or until a stop signal (`Err`: the exit status). Promotion requests
    /// (`ctl promote`, SIGUSR2) are taken between steps; a stop signal also during one.
    async fn stand_by(&mut self, config: crate::standby::StandbyConfig) -> Result<(), ExitStatus> {
        let reaper = self.reaper.clone();
        let mut follower =
            crate::standby::Follower::new(self.config.member.clone(), config, self.standby.clone());
        match follower.interrupted_promotion() {
            Ok(Some(_)) => {
                self.time_promotion(Instant::now());
                self.skip_prepare = true;
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "standby: an interrupted promotion could not be finished; etcd is not started");
                return Err(ExitStatus::Code(1));
            }
        }
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        let mut promote: Option<bool> = None;
        tracing::info!(store = %self.config.member.store, "standby: following the store; etcd starts when promoted (`ctl promote` or SIGUSR2)");
        loop {
            if let Some(force) = promote.take() {
                let requested = Instant::now();
                // Requests queued meanwhile are this one; any of them forced forces it.
                let mut force = force;
                while let Ok(f) = self.promote_requests.try_recv() {
                    force |= f;
                }
                let promoted = {
                    let promotion = follower.promote(&reaper, force);
                    tokio::pin!(promotion);
                    loop {
                        tokio::select! {
                            r = &mut promotion => break r,
                            _ = beat.tick() => self.shared.supervisor_heartbeat.beat(),
                            Some(ev) = self.signals.recv() => {
                                if let SignalEvent::Stop(sig) = ev {
                                    tracing::warn!(signal = %sig, "stop requested during the promotion; etcd was not started");
                                    return Err(self.finish().await);
                                }
                            }
                        }
                    }
                };
                match promoted {
                    Ok(_) => {
                        self.time_promotion(requested);
                        self.skip_prepare = true;
                        return Ok(());
                    }
                    Err(why) => {
                        tracing::warn!(reason = %why, "standby: promotion refused; following on");
                        follower.refused(why);
                    }
                }
            }
            let mut stepped = false;
            let next_poll = tokio::time::sleep(follower.poll_interval());
            tokio::pin!(next_poll);
            let step = follower.step(&reaper);
            tokio::pin!(step);
            // Until the next poll, or a promotion once the step is done (a promotion never
            // interrupts a restore; a stop signal does).
            while !(stepped && promote.is_some()) {
                tokio::select! {
                    _ = &mut step, if !stepped => stepped = true,
                    _ = &mut next_poll, if stepped => break,
                    _ = beat.tick() => self.shared.supervisor_heartbeat.beat(),
                    Some(force) = self.promote_requests.recv(), if promote.is_none() => promote = Some(force),
                    Some(ev) = self.signals.recv() => match ev {
                        SignalEvent::Stop(sig) => {
                            tracing::info!(signal = %sig, "stop requested while on standby; etcd was never started");
                            return Err(self.finish().await);
                        }
                        SignalEvent::DeltaSnapshot => {
                            tracing::info!("SIGUSR2: promotion requested");
                            promote.get_or_insert(false);
                        }
                        SignalEvent::FullSnapshot => tracing::info!("SIGUSR1: a standby takes no snapshots (SIGUSR2 or `ctl promote` promotes it)"),
                        SignalEvent::Reload => tracing::info!("SIGHUP: a standby reads its configuration again when promoted"),
                        SignalEvent::Forward(sig) => tracing::debug!(signal = %sig, "no etcd runs on a standby: nothing to forward to"),
                    },
                }
            }
        }
    }

    /// Reports the time from a promotion's request to a ready etcd, once readiness says so.
    fn time_promotion(&self, requested: Instant) {
        let (shared, status) = (self.shared.clone(), self.standby.clone());
        tokio::spawn(async move {
            while requested.elapsed() < Duration::from_secs(600) {
                if shared.readiness().is_ok() {
                    let seconds = requested.elapsed().as_secs_f64();
                    status.send_modify(|s| {
                        if let Some(p) = s.as_mut().and_then(|s| s.promotion.as_mut()) {
                            p.seconds = Some(seconds);
                        }
                    });
                    tracing::info!(seconds, "standby: promoted and ready");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    /// A cluster member starts with the decision's etcd flags (joining its peers `existing`, or a
    /// restore plan's new cluster) and, as a learner, is promoted once it caught up.
    async fn join(&mut self, flags: &[(String, String)], learner: Option<u64>) -> Result<(), ExitStatus> {
        if !flags.is_empty() {
            let mut launch = self.config.member.launch.clone();
            let etcd = &self.config.member.etcd;
            let copy = crate::etcd::dirs::beside(&etcd.data_path(), ".warden-etcd-config.json");
            let env: std::collections::HashMap<String, String> = std::env::vars().collect();
            match crate::etcd::args::with_settings(
                &launch.args,
                &env,
                etcd.config_file.as_deref(),
                &copy,
                flags,
            ) {
                Ok(settings) => {
                    launch.args = settings.args;
                    launch.env = settings.env;
                }
                // Without them etcd could bootstrap a cluster of its own: it is not started.
                Err(e) => {
                    tracing::error!(error = %e, "cannot give etcd the settings of the start-up decision; etcd is not started");
                    return Err(ExitStatus::Code(1));
                }
            }
            let _ = self.requests.send(Request::SetLaunch(launch)).await;
        }
        if let Some(id) = learner {
            if let Some(old) = self.promote.take() {
                old.abort();
            }
            let Ok(me) = crate::startup::cluster::me(&self.config.member) else {
                return Ok(());
            };
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            let learner = crate::cluster::promote::Learner {
                id,
                client: self.config.member.client.clone(),
                peers: me.others,
                endpoints: self.config.member.cluster_endpoints.clone(),
                ours: me.client_urls,
                data: cwd.join(&self.config.member.etcd.data_dir),
            };
            self.promote = Some(tokio::spawn(crate::cluster::promote::run(
                learner,
                self.member.clone(),
            )));
        }
        Ok(())
    }

    /// `ctl leave`: remove this member (moving leadership away first), then hold etcd down, move
    /// its data aside and leave the marker that keeps a restart from rejoining with that WAL.
    /// `Some(0)` once left (the warden exits); `None` when it could not leave (logged; etcd runs on).
    async fn leave_cluster(&mut self) -> Option<ExitStatus> {
        self.member.send_replace(Some("leaving the cluster".into()));
        self.leave_refused.send_replace(None);
        let id = match crate::cluster::leave::leave(&self.config.member.client).await {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(error = %e, "cannot leave the cluster; this member stays");
                self.leave_refused.send_replace(Some(e));
                self.member.send_replace(None);
                return None;
            }
        };
        self.stopping.send_replace(true);
        let (tx, killed) = tokio::sync::oneshot::channel();
        let _ = self.requests.send(Request::Fence(tx)).await;
        let _ = killed.await;
        let data = std::env::current_dir()
            .unwrap_or_else(|_| "/".into())
            .join(&self.config.member.etcd.data_dir);
        let to = crate::etcd::dirs::beside(
            &data,
            &format!(
                ".left-{}",
                crate::store::layout::format_time(crate::store::layout::now_ms())
            ),
        );
        let moved = std::fs::rename(&data, &to).ok().map(|()| to);
        let left = crate::cluster::leave::Left {
            member_id: id,
            at_ms: crate::store::layout::now_ms(),
            moved_to: moved.clone(),
        };
        if let Err(e) = crate::etcd::dirs::write_fresh(
            &crate::cluster::leave::marker_path(&data),
            &serde_json::to_vec_pretty(&left).unwrap_or_default(),
        ) {
            tracing::error!(error = %e, "cannot write the left-the-cluster marker");
        }
        tracing::warn!(member = format!("{id:x}"), data_moved_to = ?moved, "this member left the cluster; the warden exits");
        Some(ExitStatus::Code(0))
    }

    /// etcd runs until a stop signal ends it or ownership is lost.
    async fn serve(&mut self) -> Served {
        let mut child = self.shared.child.clone();
        let cluster = self.config.member.backup.cluster;
        let mut plan_check = tokio::time::interval(PLAN_CHECK);
        plan_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leaderless_since: Option<Instant> = None;
        // Set once etcd answered healthy on its data: from then on, a data dir found gone or
        // broken when etcd dies is a loss to repair, never a new member to respawn empty.
        let mut health = self.shared.health.clone();
        let mut had_data = false;
        loop {
            tokio::select! {
                biased;
                // A cluster member without a leader for a while looks for a cluster restore plan
                // (one GET): when one names it, etcd is held down and the start-up decision, run
                // again, restores by it.
                _ = plan_check.tick(), if cluster => {
                    let h = self.shared.health.borrow().clone();
                    if h.healthy || h.leader.is_some_and(|l| l != 0) {
                        leaderless_since = None;
                        continue;
                    }
                    let since = *leaderless_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < LEADERLESS_BEFORE_PLAN || *self.stopping.borrow() {
                        continue;
                    }
                    let data = std::env::current_dir().unwrap_or_else(|_| "/".into()).join(&self.config.member.etcd.data_dir);
                    let Ok(store) = self.config.member.backup.open_store() else { continue };
                    if let Ok(Some(plan)) = crate::cluster::restore::pending_plan(&store, &self.config.member.etcd.name, &data).await {
                        tracing::warn!(plan = %plan.id, leaderless_s = since.elapsed().as_secs(), "no leader, and a cluster restore plan names this member: holding etcd down to restore by it");
                        let (tx, killed) = tokio::sync::oneshot::channel();
                        let _ = self.requests.send(Request::Fence(tx)).await;
                        return Served::Repair(killed);
                    }
                }
                Ok(()) = health.changed(), if !had_data => {
                    had_data = health.borrow_and_update().healthy;
                }
                // etcd died and its data is gone or broken: no respawn on it (a single member would
                // come back empty, as if its data were lost, and be backed up so; a cluster member
                // would bootstrap alone or crash on the peers' log); the start-up decision runs
                // again: a single member restores from the store, a cluster member repairs through
                // its peers.
                Ok(()) = child.changed(), if cluster || had_data => {
                    if child.borrow_and_update().phase != Phase::Backoff || *self.stopping.borrow() {
                        continue;
                    }
                    let data = std::env::current_dir().unwrap_or_else(|_| "/".into()).join(&self.config.member.etcd.data_dir);
                    let local = crate::etcd::local::check(&crate::etcd::MemberDirs::of(&self.config.member.etcd));
                    if local != crate::etcd::local::LocalData::Sound {
                        tracing::error!(data = %data.display(), state = ?local, "etcd died and this member's data is not sound: holding etcd down and deciding again (a single member restores from the store, a cluster member repairs through its peers)");
                        let (tx, killed) = tokio::sync::oneshot::channel();
                        let _ = self.requests.send(Request::Fence(tx)).await;
                        return Served::Repair(killed);
                    }
                }
                _ = self.ownership.changed() => {
                    if !self.may_serve() {
                        let (tx, killed) = tokio::sync::oneshot::channel();
                        let _ = self.requests.send(Request::Fence(tx)).await;
                        if *self.stopping.borrow() {
                            tracing::error!("ownership lost during the graceful stop: etcd killed; no final snapshot (the warden is exiting)");
                            continue;
                        }
                        return Served::OwnershipLost(killed);
                    }
                }
                done = &mut self.supervisor => return Served::Exit(done.unwrap_or(ExitStatus::Code(1))),
                Some(()) = self.leave.recv() => {
                    if let Some(status) = self.leave_cluster().await {
                        return Served::Exit(status);
                    }
                }
                Some(ev) = self.signals.recv() => {
                    let Some(sig) = self.on_signal(ev) else { continue };
                    if *self.stopping.borrow() {
                        tracing::warn!(signal = %sig, "second stop signal: killing etcd now");
                        self.hurry = true;
                        let _ = self.requests.send(Request::Stop).await;
                        let _ = self.requests.send(Request::Stop).await;
                        continue;
                    }
                    tracing::info!(signal = %sig, "stop requested: flushing the pending delta, then stopping etcd");
                    self.stopping.send_replace(true);
                    crate::serve::notify::stopping(&self.shared);
                    let handle = self.backup.clone();
                    let requests = self.requests.clone();
                    let budget = self.flush_budget;
                    tokio::spawn(async move {
                        handle.stop(budget).await;
                        let _ = requests.send(Request::Stop).await;
                    });
                }
            }
        }
    }

    /// Ownership was lost and the kill is requested: wait for etcd's death, take the final snapshot,
    /// stay fenced until ownership returns. `Some(status)` when the warden is to exit.
    async fn fence(&mut self, killed: tokio::sync::oneshot::Receiver<()>) -> Option<ExitStatus> {
        let decided = Instant::now();
        self.fence.send_modify(|f| {
            f.fenced_since = Some(SystemTime::now());
            f.step = Some("killing etcd".into());
            f.kills_total += 1;
        });
        // The supervisor has SIGKILLed the group; wait for the reap (the kill itself is not awaited).
        // Its answer, not the phase seen now (which may be stale), says no etcd of ours is left.
        let reaped = killed.await.is_ok();
        let kill_s = decided.elapsed().as_secs_f64();
        tracing::warn!(
            reaped,
            ms = kill_s * 1e3,
            "etcd killed (ownership lost); taking the final snapshot"
        );
        self.fence.send_modify(|f| f.last_kill_seconds = Some(kill_s));

        let (give_up_tx, mut give_up_rx) = watch::channel(false);
        let mut own = self.ownership.clone();
        let abandon = async move {
            loop {
                if own.borrow_and_update().may_serve || *give_up_rx.borrow_and_update() {
                    return;
                }
                tokio::select! {
                    r = own.changed() => if r.is_err() { std::future::pending::<()>().await },
                    r = give_up_rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                }
            }
        };
        let mut stop_at: Option<tokio::time::Instant> = None;
        let taken = {
            let final_snapshot = fence::take_final(&self.config.member, &self.reaper, &self.fence, abandon);
            tokio::pin!(final_snapshot);
            loop {
                tokio::select! {
                    done = &mut final_snapshot => break done,
                    Some(ev) = self.signals.recv() => {
                        let Some(sig) = self.on_signal(ev) else { continue };
                        if stop_at.is_some() {
                            tracing::warn!(signal = %sig, "second stop signal: abandoning the final snapshot");
                            give_up_tx.send_replace(true);
                        } else {
                            tracing::info!(signal = %sig, timeout_s = self.config.policy.stop_timeout.as_secs(), "stop requested: finishing the final snapshot first");
                            self.stopping.send_replace(true);
                            stop_at = Some(tokio::time::Instant::now() + self.config.policy.stop_timeout);
                        }
                    }
                    _ = tokio::time::sleep_until(stop_at.unwrap_or_else(tokio::time::Instant::now)), if stop_at.is_some() => {
                        tracing::error!("the final snapshot did not finish within --stop-timeout; abandoning it");
                        give_up_tx.send_replace(true);
                    }
                }
            }
        };
        if taken && let Some(info) = self.fence.borrow().last_final.clone() {
            self.copies.publish(&crate::copies::Published {
                key: info.key,
                revision: info.revision,
                at: SystemTime::now(),
            });
        }
        if stop_at.is_some() {
            return Some(self.finish().await);
        }
        self.fence.send_modify(|f| {
            f.step = Some(if taken {
                "fenced; final snapshot in the store".into()
            } else {
                "fenced; ownership returned before the final snapshot".into()
            })
        });
        // Fenced: no etcd, no listeners. Wait for ownership (or a stop).
        if let Some(sig) = self.wait_for_ownership().await {
            tracing::info!(signal = %sig, "stop requested while fenced");
            return Some(self.finish().await);
        }
        tracing::info!("ownership is back: validating the data dir and starting etcd");
        self.fence.send_modify(|f| {
            f.fenced_since = None;
            f.step = None;
        });
        None
    }
}

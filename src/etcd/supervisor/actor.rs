//! The one task that owns the etcd process.
//!
//! Other tasks never touch the child: they send a [`Request`] and read [`ChildState`] from a watch
//! channel. The actor feeds the pure [`Machine`] with events (exit statuses from the reaper, timers,
//! requests) and carries out the actions it returns. State is published before anything else is
//! done with an exit, so readiness turns 503 the instant etcd dies.

use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use super::launch::Launch;
use super::machine::{Action, Event, Machine, Phase, Policy};
use crate::process::pid1::{ExitStatus, Reaper, Spawned};
use crate::telemetry::Heartbeat;

/// What the rest of the warden may ask of the etcd child.
#[derive(Debug)]
pub enum Request {
    /// Start etcd: the first time, or again after a fence.
    Start,
    /// Ownership lost: SIGKILL etcd's process group now and keep it down. The reply comes once
    /// no etcd of this supervisor runs any more (reaped), so nothing else may touch the data dir
    /// before it.
    Fence(tokio::sync::oneshot::Sender<()>),
    /// Graceful stop (a second one escalates to SIGKILL).
    Stop,
    /// Pass a signal on to etcd.
    Forward(Signal),
    /// The command line for the next start and every respawn (a cluster member's start-up
    /// decision: join `existing`).
    SetLaunch(Launch),
}

/// The etcd child as others see it.
#[derive(Debug, Clone, Serialize)]
pub struct ChildState {
    pub phase: Phase,
    pub pid: Option<u32>,
    /// Counts spawns; a health result is only valid for the incarnation it was taken from.
    pub incarnation: u64,
    pub restarts: u64,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub started_at: Option<SystemTime>,
    pub last_exit: Option<ExitStatus>,
    /// The backoff chosen before the next start, while in `backoff`.
    pub backoff_seconds: Option<f64>,
    /// Why the last start was not even tried: another process holds etcd's addresses.
    pub held_back: Option<String>,
}

impl ChildState {
    pub fn initial() -> Self {
        Self {
            phase: Phase::Idle,
            pid: None,
            incarnation: 0,
            restarts: 0,
            started_at: None,
            last_exit: None,
            backoff_seconds: None,
            held_back: None,
        }
    }
}

pub struct Supervisor {
    machine: Machine,
    launch: Launch,
    reaper: Reaper,
    state: watch::Sender<ChildState>,
    heartbeat: Heartbeat,
    child: Option<Spawned>,
    restart_at: Option<tokio::time::Instant>,
    kill_at: Option<tokio::time::Instant>,
    /// Fence requests waiting for etcd to be gone.
    fenced_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// etcd's listen addresses, checked free before every start (`src/etcd/ports.rs`).
    addresses: Option<crate::etcd::EtcdArgs>,
}

impl Supervisor {
    pub fn new(
        policy: Policy,
        launch: Launch,
        reaper: Reaper,
        state: watch::Sender<ChildState>,
        heartbeat: Heartbeat,
    ) -> Self {
        Self {
            machine: Machine::new(policy, fastrand::u64(..)),
            launch,
            reaper,
            state,
            heartbeat,
            child: None,
            restart_at: None,
            kill_at: None,
            fenced_waiters: Vec::new(),
            addresses: None,
        }
    }

    /// Before every start (the respawns too), etcd's listen addresses must be free: while another
    /// process holds one, etcd is not started (it would fail to bind, and until it exited the
    /// health checks would be answered by that other process), the start counts as failed and is
    /// retried after the backoff, and `held_back` says why.
    pub fn checking_addresses(mut self, etcd: crate::etcd::EtcdArgs) -> Self {
        self.addresses = Some(etcd);
        self
    }

    /// Supervises etcd until a stop request ends it; returns etcd's last exit status. Nothing is
    /// started before the first [`Request::Start`].
    pub async fn run(mut self, mut requests: mpsc::Receiver<Request>) -> ExitStatus {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut event = None;
        loop {
            if let Some(ev) = event.take()
                && let Some(status) = self.step(ev)
            {
                self.release_fenced();
                return status;
            }
            self.release_fenced();
            let exit = async {
                match self.child.as_mut() {
                    Some(child) => (&mut child.exit).await.ok(),
                    None => std::future::pending().await,
                }
            };
            event = tokio::select! {
                biased;
                status = exit => Some(Event::Exited(status.unwrap_or(ExitStatus::Code(-1)))),
                Some(req) = requests.recv() => match req {
                    Request::Start => Some(Event::Start),
                    Request::Fence(reply) => {
                        self.fenced_waiters.push(reply);
                        Some(Event::Fence)
                    }
                    Request::Stop => Some(Event::Stop),
                    Request::Forward(sig) => {
                        self.signal_child(sig, false);
                        None
                    }
                    Request::SetLaunch(launch) => {
                        tracing::info!(args = ?launch.args, env = ?launch.env, "etcd's command line for the next start");
                        self.launch = launch;
                        None
                    }
                },
                _ = sleep_until(self.kill_at.unwrap_or_else(far_future)), if self.kill_at.is_some() => {
                    self.kill_at = None;
                    Some(Event::KillDue)
                }
                _ = sleep_until(self.restart_at.unwrap_or_else(far_future)), if self.restart_at.is_some() => {
                    self.restart_at = None;
                    Some(Event::RestartDue)
                }
                _ = tick.tick() => {
                    self.heartbeat.beat();
                    None
                }
            };
        }
    }

    /// Feeds one event to the machine and carries out its actions (a failed spawn feeds back).
    fn step(&mut self, first: Event) -> Option<ExitStatus> {
        let mut pending = vec![first];
        while let Some(event) = pending.pop() {
            if let Event::Exited(status) = event {
                let pid = self.child.take().map(|c| c.pid);
                let level_warn = self.machine.phase() == Phase::Running;
                if level_warn {
                    tracing::warn!(pid, %status, "etcd exited unexpectedly");
                } else {
                    tracing::info!(pid, %status, "etcd exited");
                }
            }
            let actions = self.machine.handle(event, Instant::now());
            // Publish first: readiness must see the exit before anything else happens.
            self.publish();
            for action in actions {
                match action {
                    Action::Spawn => {
                        if let Err(ev) = self.spawn() {
                            pending.push(ev);
                        }
                    }
                    Action::Terminate => self.signal_child(Signal::SIGTERM, false),
                    Action::Kill => self.signal_child(Signal::SIGKILL, true),
                    Action::ScheduleRestart(delay) => {
                        tracing::info!(
                            delay_ms = delay.as_millis() as u64,
                            restarts = self.machine.restarts(),
                            "etcd will be restarted after backoff"
                        );
                        self.restart_at = Some(tokio::time::Instant::now() + delay);
                    }
                    Action::ScheduleKill(after) => {
                        self.kill_at = Some(tokio::time::Instant::now() + after);
                    }
                    Action::Exit(status) => {
                        self.publish();
                        return Some(status);
                    }
                }
            }
            self.publish();
        }
        None
    }

    /// Answers fence requests once no etcd of ours is alive.
    fn release_fenced(&mut self) {
        if self.child.is_none()
            && matches!(self.machine.phase(), Phase::Fenced | Phase::Idle | Phase::Stopped)
        {
            for w in self.fenced_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    fn spawn(&mut self) -> Result<(), Event> {
        let taken = self
            .addresses
            .as_ref()
            .map(crate::etcd::ports::taken)
            .unwrap_or_default();
        if !taken.is_empty() {
            let why = format!(
                "another process listens on etcd's {}: etcd is not started until it is gone",
                taken.join(", ")
            );
            if self.state.borrow().held_back.as_deref() != Some(why.as_str()) {
                tracing::error!(addresses = %taken.join(", "), "another process listens on etcd's addresses (another etcd?): the warden runs only its own etcd and holds it back until they are free");
            }
            self.state.send_modify(|s| s.held_back = Some(why));
            return Err(Event::SpawnFailed);
        }
        let mut cmd = self.launch.command();
        match self.reaper.spawn(&mut cmd) {
            Ok(child) => {
                tracing::info!(pid = child.pid, program = %self.launch.program.display(), "etcd started");
                self.state.send_modify(|s| {
                    s.incarnation += 1;
                    s.started_at = Some(SystemTime::now());
                    s.held_back = None;
                });
                self.child = Some(child);
                Ok(())
            }
            Err(err) => {
                tracing::error!(error = %err, program = %self.launch.program.display(), "failed to start etcd");
                Err(Event::SpawnFailed)
            }
        }
    }

    /// Signals etcd; `group` targets its whole process group. ESRCH means it is already gone.
    fn signal_child(&self, sig: Signal, group: bool) {
        let Some(child) = self.child.as_ref() else {
            tracing::debug!(signal = %sig, "no etcd process to signal");
            return;
        };
        let pid = Pid::from_raw(child.pid as i32);
        let result = if group { killpg(pid, sig) } else { kill(pid, sig) };
        match result {
            Ok(()) => tracing::info!(pid = child.pid, signal = %sig, group, "signalled etcd"),
            Err(nix::errno::Errno::ESRCH) => {}
            Err(err) => tracing::warn!(pid = child.pid, signal = %sig, error = %err, "failed to signal etcd"),
        }
    }

    fn publish(&self) {
        let phase = self.machine.phase();
        let pid = self.child.as_ref().map(|c| c.pid);
        let restarts = self.machine.restarts();
        let last_exit = self.machine.last_exit();
        let backoff = self.machine.current_backoff().map(|d| d.as_secs_f64());
        self.state.send_if_modified(|s| {
            let changed = s.phase != phase
                || s.pid != pid
                || s.restarts != restarts
                || s.last_exit != last_exit
                || s.backoff_seconds != backoff;
            s.phase = phase;
            s.pid = pid;
            s.restarts = restarts;
            s.last_exit = last_exit;
            s.backoff_seconds = backoff;
            changed
        });
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86400 * 365)
}

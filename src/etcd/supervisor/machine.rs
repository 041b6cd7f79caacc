//! The etcd child's life cycle as a pure state machine: `handle(event, now) -> actions`.
//!
//! Every decision about spawning, respawning, backoff and stopping lives here, free of I/O and clocks
//! (the caller passes `now`; jitter comes from a seeded generator), so the table tests below pin the
//! behaviour that the actor in `actor.rs` carries out.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::process::pid1::ExitStatus;

/// Respawn policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// First delay after an unexpected exit.
    pub backoff_min: Duration,
    /// Ceiling for the delay.
    pub backoff_max: Duration,
    /// An etcd that ran at least this long before dying starts again from `backoff_min`.
    pub reset_after: Duration,
    /// SIGTERM to SIGKILL on a graceful stop.
    pub stop_timeout: Duration,
}

/// Where the etcd child is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not started yet.
    Idle,
    /// A process is alive.
    Running,
    /// Died unexpectedly; waiting out the backoff before the next start.
    Backoff,
    /// A new term's start waiting out the backoff of the last term's crash (no process yet; the
    /// run loop fenced etcd after it crashed, to decide again).
    Delayed,
    /// Graceful stop under way: SIGTERM sent, SIGKILL at the deadline.
    Stopping,
    /// Ownership lost: SIGKILL sent to the group, waiting for the exit. No restart follows.
    Fencing,
    /// Parked after a fence: no etcd runs until `Start` (ownership back).
    Fenced,
    /// Stopped for good; the warden exits with `status`.
    Stopped,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
            Self::Backoff => "backoff",
            Self::Delayed => "delayed",
            Self::Stopping => "stopping",
            Self::Fencing => "fencing",
            Self::Fenced => "fenced",
            Self::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Start etcd (first start, or after a fence).
    Start,
    /// Ownership lost: SIGKILL etcd's group now, no grace, and do not restart it.
    Fence,
    /// The spawn attempt failed (exec error); treated like an immediate exit.
    SpawnFailed,
    /// The running child exited.
    Exited(ExitStatus),
    /// The backoff delay is over.
    RestartDue,
    /// SIGTERM/SIGINT to the warden (or an internal stop request).
    Stop,
    /// The stop deadline passed.
    KillDue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start a new etcd process.
    Spawn,
    /// Send SIGTERM to etcd.
    Terminate,
    /// Send SIGKILL to etcd's process group.
    Kill,
    /// Wake up with `RestartDue` after this long.
    ScheduleRestart(Duration),
    /// Wake up with `KillDue` after this long.
    ScheduleKill(Duration),
    /// Supervision is over: exit with this status.
    Exit(ExitStatus),
}

/// The state machine. `restarts` counts respawns after unexpected exits.
#[derive(Debug)]
pub struct Machine {
    policy: Policy,
    phase: Phase,
    running_since: Option<Instant>,
    /// Unexpected exits in a row (reset after a healthy run); drives the backoff.
    failures: u32,
    restarts: u64,
    last_exit: Option<ExitStatus>,
    kill_sent: bool,
    current_backoff: Option<Duration>,
    /// Fenced while waiting out a crash's backoff (the run loop held etcd down to decide again,
    /// e.g. to repair its data): the next start still waits out a backoff, so a term that ends
    /// in a crash at once can never loop without delay.
    fenced_after_crash: bool,
    rng: fastrand::Rng,
}

impl Machine {
    pub fn new(policy: Policy, seed: u64) -> Self {
        Self {
            policy,
            phase: Phase::Idle,
            running_since: None,
            failures: 0,
            restarts: 0,
            last_exit: None,
            kill_sent: false,
            current_backoff: None,
            fenced_after_crash: false,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }
    pub fn restarts(&self) -> u64 {
        self.restarts
    }
    pub fn last_exit(&self) -> Option<ExitStatus> {
        self.last_exit
    }
    /// The delay chosen for the pending restart, while in `Backoff`.
    pub fn current_backoff(&self) -> Option<Duration> {
        self.current_backoff
    }

    /// The un-jittered delay after `failures` unexpected exits in a row (1 → `backoff_min`).
    pub fn base_backoff(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        self.policy
            .backoff_min
            .saturating_mul(1u32 << exp)
            .min(self.policy.backoff_max)
    }

    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use Phase::*;
        match (self.phase, event) {
            (Fenced, Event::Start) if std::mem::take(&mut self.fenced_after_crash) => {
                // The last term ended in a crash: its backoff holds for this start too.
                self.phase = Delayed;
                let delay = self.jittered(self.failures);
                self.current_backoff = Some(delay);
                vec![Action::ScheduleRestart(delay)]
            }
            (Idle | Fenced, Event::Start) | (Backoff | Delayed, Event::RestartDue) => {
                if self.phase == Fenced {
                    // A new term after a fence (ownership, not a crash): the crash-loop history
                    // of the last one does not carry over.
                    self.failures = 0;
                }
                self.phase = Running;
                self.running_since = Some(now);
                self.current_backoff = None;
                vec![Action::Spawn]
            }
            (Running, Event::Exited(status)) => {
                self.last_exit = Some(status);
                self.schedule_restart(now)
            }
            (Running, Event::SpawnFailed) => self.schedule_restart(now),
            (Running, Event::Stop) => {
                self.phase = Stopping;
                self.kill_sent = false;
                vec![Action::Terminate, Action::ScheduleKill(self.policy.stop_timeout)]
            }
            (Stopping, Event::Stop) | (Stopping, Event::KillDue) if !self.kill_sent => {
                self.kill_sent = true;
                vec![Action::Kill]
            }
            (Stopping, Event::Exited(status)) => {
                self.last_exit = Some(status);
                self.phase = Stopped;
                vec![Action::Exit(status)]
            }
            (Running, Event::Fence) => {
                self.phase = Fencing;
                vec![Action::Kill]
            }
            (Stopping, Event::Fence) if !self.kill_sent => {
                self.kill_sent = true;
                vec![Action::Kill]
            }
            (Backoff | Delayed, Event::Fence) => {
                self.phase = Fenced;
                self.current_backoff = None;
                self.fenced_after_crash = true;
                vec![]
            }
            (Fencing, Event::Exited(status)) => {
                self.last_exit = Some(status);
                self.running_since = None;
                self.phase = Fenced;
                vec![]
            }
            (Fencing, Event::Stop) => {
                // Already killed: just wait for the exit, then leave.
                self.phase = Stopping;
                self.kill_sent = true;
                vec![]
            }
            (Fenced, Event::Stop) => {
                // etcd was killed on purpose, not crashed: a clean exit.
                self.phase = Stopped;
                vec![Action::Exit(ExitStatus::Code(0))]
            }
            (Stopping, Event::SpawnFailed) | (Backoff | Delayed, Event::Stop) | (Idle, Event::Stop) => {
                self.phase = Stopped;
                self.current_backoff = None;
                vec![Action::Exit(self.last_exit.unwrap_or(ExitStatus::Code(0)))]
            }
            // Late timers and repeated requests change nothing.
            _ => Vec::new(),
        }
    }

    fn schedule_restart(&mut self, now: Instant) -> Vec<Action> {
        let uptime = self.running_since.map(|t| now.saturating_duration_since(t));
        if uptime.is_some_and(|u| u >= self.policy.reset_after) {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.restarts += 1;
        self.running_since = None;
        self.phase = Phase::Backoff;
        let delay = self.jittered(self.failures);
        self.current_backoff = Some(delay);
        vec![Action::ScheduleRestart(delay)]
    }

    /// The delay after `failures` unexpected exits in a row. "Equal jitter": half fixed, half
    /// random, so delays still grow monotonically.
    fn jittered(&mut self, failures: u32) -> Duration {
        let base = self.base_backoff(failures);
        base / 2 + base.mul_f64(self.rng.f64() / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn policy() -> Policy {
        Policy {
            backoff_min: S,
            backoff_max: 16 * S,
            reset_after: 60 * S,
            stop_timeout: 10 * S,
        }
    }

    #[test]
    fn start_spawns() {
        let mut m = Machine::new(policy(), 1);
        assert_eq!(m.handle(Event::Start, Instant::now()), vec![Action::Spawn]);
        assert_eq!(m.phase(), Phase::Running);
    }

    #[test]
    fn crash_loop_backoff_grows_and_caps() {
        let mut m = Machine::new(policy(), 7);
        let mut now = Instant::now();
        m.handle(Event::Start, now);
        let mut delays = Vec::new();
        for _ in 0..8 {
            now += Duration::from_millis(100);
            let actions = m.handle(Event::Exited(ExitStatus::Code(1)), now);
            let [Action::ScheduleRestart(d)] = actions[..] else {
                panic!("expected a scheduled restart, got {actions:?}")
            };
            delays.push(d);
            now += d;
            assert_eq!(m.handle(Event::RestartDue, now), vec![Action::Spawn]);
        }
        let bases = [1, 2, 4, 8, 16, 16, 16, 16];
        for (d, b) in delays.iter().zip(bases) {
            let b = b * S;
            assert!(*d >= b / 2 && *d <= b, "delay {d:?} outside [{:?}, {b:?}]", b / 2);
        }
        for pair in delays.windows(2).take(4) {
            assert!(pair[1] >= pair[0], "backoff shrank: {delays:?}");
        }
        assert_eq!(m.restarts(), 8);
    }

    #[test]
    fn healthy_run_resets_backoff() {
        let mut m = Machine::new(policy(), 3);
        let mut now = Instant::now();
        m.handle(Event::Start, now);
        for _ in 0..4 {
            now += Duration::from_millis(10);
            m.handle(Event::Exited(ExitStatus::Signal(9)), now);
            now += 20 * S;
            m.handle(Event::RestartDue, now);
        }
        now += 61 * S;
        let actions = m.handle(Event::Exited(ExitStatus::Signal(9)), now);
        let [Action::ScheduleRestart(d)] = actions[..] else {
            panic!("{actions:?}")
        };
        assert!(d <= S, "backoff not reset after a healthy run: {d:?}");
    }

    #[test]
    fn graceful_stop_then_exit_with_etcds_status() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        assert_eq!(
            m.handle(Event::Stop, now),
            vec![Action::Terminate, Action::ScheduleKill(10 * S)]
        );
        assert_eq!(m.phase(), Phase::Stopping);
        assert_eq!(
            m.handle(Event::Exited(ExitStatus::Code(0)), now),
            vec![Action::Exit(ExitStatus::Code(0))]
        );
        assert_eq!(m.phase(), Phase::Stopped);
        assert_eq!(m.restarts(), 0, "a requested stop is not a restart");
    }

    #[test]
    fn stop_timeout_kills_once() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Stop, now);
        assert_eq!(m.handle(Event::KillDue, now), vec![Action::Kill]);
        assert_eq!(m.handle(Event::KillDue, now), vec![]);
        assert_eq!(m.handle(Event::Stop, now), vec![]);
        assert_eq!(
            m.handle(Event::Exited(ExitStatus::Signal(9)), now),
            vec![Action::Exit(ExitStatus::Signal(9))]
        );
    }

    #[test]
    fn second_stop_kills_at_once() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Stop, now);
        assert_eq!(m.handle(Event::Stop, now), vec![Action::Kill]);
        assert_eq!(m.handle(Event::KillDue, now), vec![]);
    }

    #[test]
    fn stop_during_backoff_exits_with_last_status() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Exited(ExitStatus::Code(2)), now);
        assert_eq!(m.phase(), Phase::Backoff);
        assert_eq!(
            m.handle(Event::Stop, now),
            vec![Action::Exit(ExitStatus::Code(2))]
        );
        assert_eq!(m.handle(Event::RestartDue, now), vec![], "no spawn after stop");
    }

    #[test]
    fn fence_kills_at_once_and_parks_until_start() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        assert_eq!(
            m.handle(Event::Fence, now),
            vec![Action::Kill],
            "no SIGTERM, no grace"
        );
        assert_eq!(m.phase(), Phase::Fencing);
        assert_eq!(m.handle(Event::Fence, now), vec![], "one kill");
        assert_eq!(m.handle(Event::Exited(ExitStatus::Signal(9)), now), vec![]);
        assert_eq!(m.phase(), Phase::Fenced);
        assert_eq!(
            m.handle(Event::RestartDue, now),
            vec![],
            "a fenced etcd is not restarted"
        );
        assert_eq!(m.handle(Event::KillDue, now), vec![]);
        assert_eq!(m.restarts(), 0, "a fence is not a restart");
        assert_eq!(m.handle(Event::Start, now), vec![Action::Spawn]);
        assert_eq!(m.phase(), Phase::Running);
    }

    #[test]
    fn a_crash_loop_across_terms_keeps_its_backoff() {
        // etcd exits at once each time; each time the run loop fences it to decide again and
        // starts it again (a repair): never a start without the growing delay.
        let mut m = Machine::new(policy(), 5);
        let mut now = Instant::now();
        m.handle(Event::Start, now);
        let mut delays = Vec::new();
        for _ in 0..5 {
            now += Duration::from_millis(10);
            let crash = m.handle(Event::Exited(ExitStatus::Code(1)), now);
            assert!(matches!(crash[..], [Action::ScheduleRestart(_)]), "{crash:?}");
            assert_eq!(m.handle(Event::Fence, now), vec![]);
            let actions = m.handle(Event::Start, now);
            let [Action::ScheduleRestart(d)] = actions[..] else {
                panic!("a start after a crash's fence spawned without its backoff: {actions:?}")
            };
            delays.push(d);
            now += d;
            assert_eq!(m.handle(Event::RestartDue, now), vec![Action::Spawn]);
        }
        assert!(
            delays[4] >= 8 * S,
            "the backoff did not grow across terms: {delays:?}"
        );
        // A fence for ownership (no crash) starts at once, from a clean history.
        m.handle(Event::Fence, now);
        m.handle(Event::Exited(ExitStatus::Signal(9)), now);
        assert_eq!(m.handle(Event::Start, now), vec![Action::Spawn]);
    }

    #[test]
    fn fence_during_backoff_cancels_the_restart() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Exited(ExitStatus::Code(1)), now);
        assert_eq!(m.handle(Event::Fence, now), vec![]);
        assert_eq!(m.phase(), Phase::Fenced);
        assert_eq!(m.handle(Event::RestartDue, now), vec![]);
    }

    #[test]
    fn fence_during_a_graceful_stop_kills_now() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Stop, now);
        assert_eq!(m.handle(Event::Fence, now), vec![Action::Kill]);
        assert_eq!(m.handle(Event::KillDue, now), vec![]);
        assert_eq!(
            m.handle(Event::Exited(ExitStatus::Signal(9)), now),
            vec![Action::Exit(ExitStatus::Signal(9))]
        );
    }

    #[test]
    fn stop_while_fencing_or_fenced_exits() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        m.handle(Event::Fence, now);
        assert_eq!(
            m.handle(Event::Stop, now),
            vec![],
            "the kill is already under way"
        );
        assert_eq!(
            m.handle(Event::Exited(ExitStatus::Signal(9)), now),
            vec![Action::Exit(ExitStatus::Signal(9))]
        );
        let mut m = Machine::new(policy(), 1);
        m.handle(Event::Start, now);
        m.handle(Event::Fence, now);
        m.handle(Event::Exited(ExitStatus::Signal(9)), now);
        assert_eq!(
            m.handle(Event::Stop, now),
            vec![Action::Exit(ExitStatus::Code(0))]
        );
        assert_eq!(m.handle(Event::Start, now), vec![], "no start after stop");
    }

    #[test]
    fn idle_waits_for_start() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        assert_eq!(
            m.handle(Event::Fence, now),
            vec![],
            "nothing to kill before the first start"
        );
        assert_eq!(m.phase(), Phase::Idle);
        assert_eq!(m.handle(Event::RestartDue, now), vec![]);
        assert_eq!(m.handle(Event::Start, now), vec![Action::Spawn]);
    }

    #[test]
    fn spawn_failure_backs_off() {
        let mut m = Machine::new(policy(), 1);
        let now = Instant::now();
        m.handle(Event::Start, now);
        let actions = m.handle(Event::SpawnFailed, now);
        assert!(matches!(actions[..], [Action::ScheduleRestart(_)]), "{actions:?}");
        assert_eq!(m.phase(), Phase::Backoff);
    }
}

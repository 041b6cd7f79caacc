//! The single owner of `waitpid(-1)`: PID 1 duty and the child-subreaper bit.
//!
//! As PID 1 of a container, or as a subreaper under systemd, every orphan that etcd (or anything it
//! started) leaves behind becomes our child. Exactly one place may call `wait*`: a second caller would
//! steal exit statuses, which is why nothing in the warden uses `Child::wait` or `tokio::process`.
//! [`Reaper::reap`] drains `waitpid(-1, WNOHANG)` on every SIGCHLD (one signal can stand for many
//! exits) and hands each status to whoever spawned that pid; the rest are orphans, reaped and counted.
//!
//! Spawning holds the registry lock, so the reaper cannot collect a child before it is registered
//! (and cannot race the `waitpid` that std performs itself when `exec` fails).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl ExitStatus {
    /// The status a shell would report: the code, or 128 + the signal number.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit code {c}"),
            Self::Signal(s) => match nix::sys::signal::Signal::try_from(*s) {
                Ok(sig) => write!(f, "signal {sig}"),
                Err(_) => write!(f, "signal {s}"),
            },
        }
    }
}

/// A child spawned through the reaper: its pid, its piped output if any, and later its exit status.
#[derive(Debug)]
pub struct Spawned {
    pub pid: u32,
    pub exit: oneshot::Receiver<ExitStatus>,
    pub stdout: Option<std::process::ChildStdout>,
    pub stderr: Option<std::process::ChildStderr>,
}

#[derive(Default)]
struct Registry {
    waiting: HashMap<i32, oneshot::Sender<ExitStatus>>,
}

/// Routes exit statuses from the one `waitpid(-1)` loop to the tasks that spawned the processes.
#[derive(Clone, Default)]
pub struct Reaper {
    registry: Arc<Mutex<Registry>>,
    orphans_reaped: Arc<AtomicU64>,
}

/// Variables that belong to the warden and reach no program it starts (etcd, etcdutl, a private
/// etcd): systemd's notify protocol (etcd would send READY=1 itself), the warden's own settings,
/// which may carry secrets, and the store's cloud credentials (`AWS_*`, `AZURE_*`, `GOOGLE_*`).
pub fn is_private_env(key: &str) -> bool {
    matches!(
        key,
        "NOTIFY_SOCKET" | "WATCHDOG_USEC" | "WATCHDOG_PID" | "LISTEN_FDS" | "LISTEN_PID"
    ) || ["ETCD_WARDEN_", "AWS_", "AZURE_", "GOOGLE_"]
        .iter()
        .any(|p| key.starts_with(p))
}

impl Reaper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `cmd` (without the warden's private variables) and registers its pid before the
    /// reaper can see it exit.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Spawned> {
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(is_private_env) {
                cmd.env_remove(&key);
            }
        }
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        // Dropping a std Child neither waits nor kills; the reaper owns its status from here.
        drop(child);
        let (tx, rx) = oneshot::channel();
        registry.waiting.insert(pid as i32, tx);
        Ok(Spawned {
            pid,
            exit: rx,
            stdout,
            stderr,
        })
    }

    /// Collects every exited child. Call on each SIGCHLD, and once at start.
    pub fn reap(&self) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (pid, status) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _core)) => (pid, ExitStatus::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) => return,
                Ok(_) => continue, // stopped/continued: not an exit
                Err(Errno::EINTR) => continue,
                Err(Errno::ECHILD) => return,
                Err(err) => {
                    tracing::warn!(error = %err, "waitpid failed");
                    return;
                }
            };
            match registry.waiting.remove(&pid.as_raw()) {
                Some(tx) => {
                    tracing::debug!(pid = pid.as_raw(), %status, "child exited");
                    // The spawner may have stopped caring; that is fine.
                    let _ = tx.send(status);
                }
                None => {
                    self.orphans_reaped.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(pid = pid.as_raw(), %status, "reaped orphan");
                }
            }
        }
    }

    /// How many processes that nobody registered have been reaped.
    pub fn orphans_reaped(&self) -> u64 {
        self.orphans_reaped.load(Ordering::Relaxed)
    }
}

/// Runs a helper program to completion through the reaper, capturing its output (for etcdutl,
/// etcdctl, `etcd --version`). Output is read on threads so a chatty tool cannot block on a full pipe.
pub async fn run_to_completion(
    reaper: &Reaper,
    cmd: &mut Command,
) -> io::Result<(ExitStatus, String, String)> {
    run_bounded(reaper, cmd, None).await
}

/// `run_to_completion`, but a helper still running after `limit` is SIGKILLed (and reaped) and the
/// call fails with `TimedOut`: for probes of a program that may not be what it claims to be.
pub async fn run_bounded(
    reaper: &Reaper,
    cmd: &mut Command,
    limit: Option<std::time::Duration>,
) -> io::Result<(ExitStatus, String, String)> {
    use std::io::Read;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut spawned = reaper.spawn(cmd)?;
    let read = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                s = String::from_utf8_lossy(&buf).into_owned();
            }
            s
        })
    };
    let out = read(spawned.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>));
    let err = read(spawned.stderr.take().map(|o| Box::new(o) as Box<dyn Read + Send>));
    let dropped = || io::Error::other("the reaper dropped the exit status");
    let status = match limit {
        None => spawned.exit.await.map_err(|_| dropped())?,
        Some(limit) => match tokio::time::timeout(limit, &mut spawned.exit).await {
            Ok(status) => status.map_err(|_| dropped())?,
            Err(_) => {
                let _ = nix::sys::signal::kill(Pid::from_raw(spawned.pid as i32), Signal::SIGKILL);
                let _ = spawned.exit.await;
                // The reading threads end when the pipes close; a grandchild may hold them open.
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {}", humantime::format_duration(limit)),
                ));
            }
        },
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok((status, out, err))
}

/// What the warden is in its process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitRole {
    /// PID 1 of its PID namespace: orphans come to us by definition.
    Pid1,
    /// Not PID 1: the child-subreaper bit makes orphans of our descendants come to us.
    Subreaper,
}

/// Makes sure orphans below us are ours to reap.
pub fn become_reaper() -> io::Result<InitRole> {
    if nix::unistd::getpid().as_raw() == 1 {
        return Ok(InitRole::Pid1);
    }
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
    Ok(InitRole::Subreaper)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_like_a_shell() {
        assert_eq!(ExitStatus::Code(3).exit_code(), 3);
        assert_eq!(ExitStatus::Signal(9).exit_code(), 137);
        assert_eq!(ExitStatus::Signal(15).to_string(), "signal SIGTERM");
        assert_eq!(ExitStatus::Code(0).to_string(), "exit code 0");
    }
}

//! How etcd is started: the user's command line untouched, in its own process group, with the
//! warden's private environment removed.
//!
//! This is the one module allowed `unsafe`: a `pre_exec` hook that asks the kernel to SIGKILL etcd
//! if the warden dies (PR_SET_PDEATHSIG), so a crashed or SIGKILLed warden outside a container never
//! leaves an unsupervised etcd behind. The hook only calls async-signal-safe `prctl`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Variables that belong to the warden and must not reach etcd: systemd's notify protocol (etcd
/// would send READY=1 itself) and the warden's own settings, which may carry secrets.
pub fn is_private_env(key: &str) -> bool {
    matches!(
        key,
        "NOTIFY_SOCKET" | "WATCHDOG_USEC" | "WATCHDOG_PID" | "LISTEN_FDS" | "LISTEN_PID"
    ) || key.starts_with("ETCD_WARDEN_")
}

/// A fully resolved etcd command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl Launch {
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            // Own process group: a terminal's Ctrl-C reaches only the warden, and fencing can
            // SIGKILL etcd with everything it started.
            .process_group(0);
        for (key, _) in std::env::vars_os() {
            if let Some(k) = key.to_str()
                && is_private_env(k)
            {
                cmd.env_remove(&key);
            }
        }
        set_parent_death_signal(&mut cmd);
        cmd
    }
}

#[expect(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; prctl is async-signal-safe"
)]
fn set_parent_death_signal(cmd: &mut Command) {
    // SAFETY: the closure allocates nothing and only makes one prctl syscall.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_env() {
        for k in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "ETCD_WARDEN_STORE",
        ] {
            assert!(is_private_env(k), "{k}");
        }
        for k in ["ETCD_NAME", "ETCD_DATA_DIR", "PATH", "AWS_ACCESS_KEY_ID"] {
            assert!(!is_private_env(k), "{k}");
        }
    }
}

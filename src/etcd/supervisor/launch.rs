//! How etcd is started: the user's command line untouched, in its own process group, with the
//! warden's private environment removed.
//!
//! This is the one module allowed `unsafe`: `pre_exec` hooks, which run between fork and exec and
//! make one async-signal-safe syscall each. One asks the kernel to SIGKILL etcd if the warden dies
//! (PR_SET_PDEATHSIG), so a crashed or SIGKILLed warden outside a container never leaves an
//! unsupervised etcd behind; the other hands one open file to a helper (`pass_file`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use crate::process::pid1::is_private_env;

/// A fully resolved etcd command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Variables set in etcd's environment over the warden's own (a setting the operator gave
    /// as an `ETCD_*` variable and the warden changes, e.g. to join a cluster `existing`).
    pub env: Vec<(String, String)>,
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
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
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

/// Hands `file` to the program `cmd` starts, as the path `/proc/self/fd/N` that program can open:
/// a file with no name left (unlinked), whose dirty pages not yet written back the kernel then
/// drops once the last descriptor closes. Rust opens every file close-on-exec; the flag is
/// cleared in the child only, so no other program started meanwhile inherits the descriptor. The
/// caller keeps `file` open until the child has exited. None when the descriptor is one of 0, 1 and
/// 2 (this process started with them closed): the child's own stdio would replace it.
#[expect(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; fcntl is async-signal-safe"
)]
pub fn pass_file(cmd: &mut Command, file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    if fd <= 2 {
        return None;
    }
    // SAFETY: the closure allocates nothing and only makes one fcntl syscall on a descriptor the
    // caller keeps open until the child has exited.
    unsafe {
        cmd.pre_exec(move || {
            let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    Some(PathBuf::from(format!("/proc/self/fd/{fd}")))
}

/// Caps the private writable memory (heap) of the program `cmd` starts at `bytes`
/// (`RLIMIT_DATA`): a tool fed a hostile file fails to allocate instead of taking the host's
/// memory. Go's runtime reserves its address space without write access, which the limit does not
/// count, so Go programs (etcdutl) run normally under it.
#[expect(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; setrlimit is async-signal-safe"
)]
pub fn limit_data(cmd: &mut Command, bytes: u64) {
    // SAFETY: the closure allocates nothing and only makes one setrlimit syscall.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_DATA, bytes, bytes)
                .map_err(std::io::Error::from)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `cmd`: whether it exited 0, and its output. Waited for by its own pid, not through a
    /// `Reaper`: the reaper's `waitpid(-1)` would collect the children of the tests running beside
    /// this one in the same process (two of these did: one waited for an exit the other took).
    fn run(cmd: &mut Command) -> (bool, Vec<u8>) {
        #[allow(clippy::disallowed_methods, reason = "a test's own child, outside any reaper")]
        let out = cmd.stderr(Stdio::null()).output().unwrap();
        (out.status.success(), out.stdout)
    }

    /// The cap reaches the child (the shell's `ulimit -d` reports it, in KiB), and only the child.
    #[test]
    fn the_data_limit_reaches_the_child() {
        let mut sh = Command::new("sh");
        sh.args(["-c", "ulimit -d"]);
        limit_data(&mut sh, 256 << 20);
        assert_eq!(run(&mut sh), (true, b"262144\n".to_vec()));
        let (ok, out) = run(Command::new("sh").args(["-c", "ulimit -d"]));
        assert!(ok && out != b"262144\n", "{}", String::from_utf8_lossy(&out));
    }

    /// The child reads a file that has no name any more through the path it was given, and a
    /// program started without `pass_file` does not hold the descriptor.
    #[test]
    fn a_passed_file_reaches_that_child_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.db");
        std::fs::write(&path, b"etcd's database").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut cat = Command::new("cat");
        let passed = pass_file(&mut cat, &file).expect("a descriptor above 2");
        assert_eq!(run(cat.arg(&passed)), (true, b"etcd's database".to_vec()));
        let (ok, _) = run(Command::new("cat").arg(&passed));
        assert!(
            !ok,
            "a program started without pass_file opened {}",
            passed.display()
        );
    }

    #[test]
    fn private_env() {
        for k in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "ETCD_WARDEN_STORE",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AZURE_STORAGE_ACCOUNT_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ] {
            assert!(is_private_env(k), "{k}");
        }
        for k in ["ETCD_NAME", "ETCD_DATA_DIR", "PATH", "HOME", "GOGC"] {
            assert!(!is_private_env(k), "{k}");
        }
    }
}

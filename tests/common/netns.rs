//! A network namespace of the test's own, for what listens on fixed ports (kubeadm's etcd on
//! 127.0.0.1:2379/2381, a node address on :2380): a `sleep` started by `unshare --net` holds it,
//! its loopback is up with the addresses asked for, and the test reaches inside by `nsenter`
//! (commands) or by a thread that joins it (`run`, for the harness's own HTTP probes). The
//! holder is killed when this drops, which ends the namespace once nothing else is in it.

use std::process::{Child, Command, Stdio};

pub struct Netns {
    holder: Child,
}

impl Netns {
    /// A new namespace with `lo` up and each of `addrs` (IPv4, /32) on it.
    pub fn new(addrs: &[&str]) -> Self {
        let mut cmd = Command::new("unshare");
        cmd.args(["--net", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        super::dies_with_test(&mut cmd);
        let holder = cmd
            .spawn()
            .expect("unshare --net (util-linux) starts the namespace's holder");
        let ns = Netns { holder };
        // unshare enters the namespace before it execs sleep: wait until the holder is in one
        // that is not ours.
        let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
        super::wait_for(
            "the holder of the test's network namespace to enter it",
            std::time::Duration::from_secs(5),
            || {
                let theirs = std::fs::read_link(format!("/proc/{}/ns/net", ns.pid())).ok()?;
                (theirs != ours).then_some(())
            },
        );
        ns.ip(&["link", "set", "lo", "up"]);
        for a in addrs {
            ns.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        ns
    }

    pub fn pid(&self) -> i32 {
        self.holder.id() as i32
    }

    fn ip(&self, args: &[&str]) {
        let out = self.cmd("ip").args(args).output().expect("ip (iproute2) runs");
        assert!(
            out.status.success(),
            "ip {} in the test's namespace: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `program` run inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--target={}", self.pid()))
            .args(["--net", "--", program]);
        c
    }

    /// `f` on a thread that joined the namespace: its sockets (and the processes it spawns)
    /// are inside.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let ns = std::fs::File::open(format!("/proc/{}/ns/net", self.pid()))
            .expect("open the namespace of the holder");
        std::thread::scope(|s| {
            s.spawn(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("setns into the test's network namespace");
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

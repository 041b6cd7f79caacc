//! Podman for the container tests: its storage (vfs), run state and containers.conf all in one
//! tempdir per test, runc as the runtime (crun fails on these machines' cgroup layout), and the
//! containers, pods and images it made removed when it drops, pass or fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Podman with its own --root/--runroot and containers.conf under a tempdir. Removes the containers it
/// started and the images it built when dropped, before the tempdir goes.
pub struct Podman {
    dir: tempfile::TempDir,
    conf: PathBuf,
    pub containers: Vec<String>,
    pub pods: Vec<String>,
    pub images: Vec<String>,
    /// Runs podman inside this process's network namespace (`nsenter --net`): host-network
    /// containers and pods then live there.
    netns: Option<i32>,
}

impl Podman {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("containers.conf");
        // Without `default_ulimits = []` runc fails here with "error setting rlimit type 7: operation
        // not permitted"; the cgroup layout wants cgroupfs, not systemd.
        std::fs::write(
            &conf,
            format!(
                "[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = \"cgroupfs\"\ntmp_dir = \"{}\"\n",
                dir.path().join("tmp").display()
            ),
        )
        .expect("write containers.conf");
        Self {
            dir,
            conf,
            containers: Vec::new(),
            pods: Vec::new(),
            images: Vec::new(),
            netns: None,
        }
    }

    /// Podman run inside the network namespace of `pid` (a `common::netns::Netns`).
    pub fn in_netns(mut self, pid: i32) -> Self {
        self.netns = Some(pid);
        self
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `--root DIR --runroot DIR`: this run's own storage and run state (also for scripts/container-image).
    pub fn store_flags(&self) -> String {
        let p = self.dir.path();
        format!(
            "--root {} --runroot {}",
            p.join("root").display(),
            p.join("run").display()
        )
    }

    pub fn cmd(&self) -> Command {
        let mut c = match self.netns {
            Some(pid) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--target={pid}")).args(["--net", "--", "podman"]);
                c
            }
            None => Command::new("podman"),
        };
        c.env("CONTAINERS_CONF", &self.conf)
            .args(self.store_flags().split(' '))
            .args(["--storage-driver", "vfs", "--runtime", "runc"]);
        c
    }

    /// `podman ARGS`: stdout, or stderr (with the exit status) when it fails.
    pub fn try_run(&self, args: &[&str]) -> Result<String, String> {
        let out = self.cmd().args(args).output().map_err(|e| {
            format!("cannot run podman ({e}): install Debian's podman and runc (scripts/deps.sh need_podman)")
        })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "podman {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    }

    pub fn run(&self, args: &[&str]) -> String {
        self.try_run(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Builds the test image with scripts/container-image into `tag`.
    pub fn build_image(&mut self, tag: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/container-image");
        let ctx = self.dir.path().join("context");
        let t = Instant::now();
        self.images.push(tag.to_owned());
        let out = Command::new(&script)
            .arg(&ctx)
            .arg(tag)
            .env("CONTAINERS_CONF", &self.conf)
            .env("PODMAN_FLAGS", self.store_flags())
            .output()
            .expect("run scripts/container-image");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} failed ({}):\n{log}",
            script.display(),
            out.status
        );
        for line in log.lines().filter(|l| l.starts_with("container-image:")) {
            eprintln!("{line}");
        }
        eprintln!("image {tag} ready after {:?}", t.elapsed());
    }

    pub fn inspect(&self, ctr: &str, format: &str) -> String {
        self.run(&["inspect", "--format", format, ctr]).trim().to_owned()
    }

    pub fn logs(&self, ctr: &str) -> String {
        match self.cmd().args(["logs", ctr]).output() {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("(podman logs {ctr}: {e})"),
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for ctr in std::mem::take(&mut self.containers) {
            if std::thread::panicking() {
                eprintln!("---- podman logs {ctr} ----\n{}", self.logs(&ctr));
            }
            if let Err(e) = self.try_run(&["rm", "--force", "--volumes", "--time", "0", &ctr]) {
                eprintln!("cleanup: {e}");
            }
        }
        for pod in std::mem::take(&mut self.pods) {
            if let Err(e) = self.try_run(&["pod", "rm", "--force", "--time", "0", &pod]) {
                eprintln!("cleanup: {e}");
            }
        }
        for image in std::mem::take(&mut self.images) {
            if let Err(e) = self.try_run(&["rmi", "--force", &image]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

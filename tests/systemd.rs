//! systemd's notify protocol against a real datagram socket, and the environment etcd receives; the
//! shipped unit checked by systemd-analyze, and run by a real systemd booted with systemd-nspawn.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

#[test]
fn notify_ready_status_watchdog_stopping_and_clean_etcd_env() {
    let etcd = etcd34();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(dir.path());
    let has = |needle: &str| notify.has(needle);

    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let mut w = Warden::builder(&ip, &[], &argv)
        .env("NOTIFY_SOCKET", notify.path.to_str().unwrap())
        .env("WATCHDOG_USEC", "400000")
        .env("ETCD_WARDEN_STOP_TIMEOUT", "20s")
        .spawn();
    wait_for("READY=1 on the notify socket", Duration::from_secs(30), || {
        has("READY=1").then_some(())
    });
    assert!(
        matches!(w.get("/readyz"), Some((200, _))),
        "READY=1 sent before /readyz is 200"
    );
    wait_for("two WATCHDOG=1 pings", Duration::from_secs(5), || {
        (notify
            .messages()
            .iter()
            .filter(|m| m.contains("WATCHDOG=1"))
            .count()
            >= 2)
            .then_some(())
    });
    assert!(has("STATUS=running"), "{:?}", notify.messages());

    let etcd_pid = w.etcd_pid().unwrap();
    let environ = std::fs::read(format!("/proc/{etcd_pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    for var in ["NOTIFY_SOCKET=", "WATCHDOG_USEC=", "ETCD_WARDEN_STOP_TIMEOUT="] {
        assert!(
            !environ.split('\0').any(|kv| kv.starts_with(var)),
            "etcd inherited {var}"
        );
    }

    w.signal(Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(25));
    wait_for("STOPPING=1 on the notify socket", Duration::from_secs(5), || {
        has("STOPPING=1").then_some(())
    });
    let msgs = notify.messages();
    let ready_at = msgs.iter().position(|m| m.contains("READY=1")).unwrap();
    assert_eq!(
        msgs.iter().filter(|m| m.contains("READY=1")).count(),
        1,
        "READY=1 sent twice: {msgs:?}"
    );
    let stopping_at = msgs.iter().position(|m| m.contains("STOPPING=1")).unwrap();
    assert!(ready_at < stopping_at);
}

/// The shipped unit (systemd/etcd-warden.service), its binaries pointed at this build and etcd,
/// passes systemd's own checker without a warning; and a warden started as the unit starts it, with
/// a bad setting in its EnvironmentFile, exits with a status the unit does not restart on (it
/// restarted every 5 s on a configuration that cannot get better by itself).
#[test]
fn the_shipped_unit_passes_systemd_analyze_and_a_bad_configuration_is_not_restarted() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/etcd-warden.service"
    ))
    .unwrap();
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let local = unit
        .replace("/usr/local/bin/etcd-warden", WARDEN)
        .replace("-- /usr/bin/etcd", &format!("-- {}", etcd.display()));
    let path = dir.path().join("etcd-warden.service");
    std::fs::write(&path, &local).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs (source scripts/deps.sh && need_systemd_analyze)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );

    let key = |k: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{k}=")))
            .flat_map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(key("Restart"), ["on-failure"]);
    let prevent = key("RestartPreventExitStatus");
    // As the unit starts it: its Environment= lines, then a site file with a bad value.
    let mut cmd = std::process::Command::new(WARDEN);
    for kv in key("Environment") {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    let data = dir.path().join("data");
    cmd.env("ETCD_DATA_DIR", &data)
        .env("ETCD_WARDEN_ADMIN_SOCKET", dir.path().join("admin.sock"))
        .env("ETCD_WARDEN_STOP_TIMEOUT", "soon")
        .args(["run", "--", &etcd.display().to_string()]);
    let out = cmd.output().unwrap();
    let code = out.status.code().expect("an exit status").to_string();
    assert!(
        prevent.contains(&code),
        "a bad configuration exits {code}, which the unit restarts on (RestartPreventExitStatus={prevent:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!data.exists(), "a refused configuration created the data dir");
}

/// Where the unit finds things inside the container: the paths the unit and docs/systemd.md name.
const SITE_FILE: &str = "/etc/default/etcd-warden";
const PKI: &str = "/etc/etcd/pki";
const STORE: &str = "/srv/etcd-backups";
/// etcdctl inside the container, over TLS with the health-check client's certificate.
const ETCDCTL: &str = "etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/etcd/pki/ca.crt \
     --cert=/etc/etcd/pki/healthcheck-client.crt --key=/etc/etcd/pki/healthcheck-client.key --command-timeout=3s";

/// The container's machine name and cgroups: this prefix and the test's pid.
const MACHINE_PREFIX: &str = "etcd-warden-nspawn-";

/// The Debian tree scripts/deps.sh's need_nspawn builds (`$NSPAWN_ROOT`, else its cache path).
fn nspawn_root() -> PathBuf {
    let root = std::env::var_os("NSPAWN_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("ETCD_WARDEN_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cache/etcd-warden")
                })
                .join("nspawn-bookworm")
        });
    assert!(
        root.join("lib/systemd/systemd").exists(),
        "no Debian tree with systemd at {} (run scripts/test, or `source scripts/deps.sh; need_nspawn` and export NSPAWN_ROOT)",
        root.display()
    );
    root
}

/// A Debian tree booted by systemd-nspawn, systemd its PID 1, on a tmpfs overlay (the tree stays
/// as built), with a network namespace of its own (etcd's fixed ports meet no other test) and in
/// cgroups of its own under the host's hierarchies (nspawn without a host systemd puts its
/// `payload` and `supervisor` cgroups under its own). Dropped: halted (SIGTERM makes nspawn send
/// SIGRTMIN+3 to the container's systemd), waited for, and whatever is left of it killed by pid.
struct Container {
    nspawn: Option<Child>,
    /// The container's systemd as the host sees it.
    init: Option<i32>,
    cgroups: Vec<PathBuf>,
    log: PathBuf,
}

impl Container {
    /// Boots `root` as machine `name`, with `binds` (host path, path inside, writable) and
    /// nspawn's output in `log`; returns once the container's systemd reports `running`.
    fn boot(root: &Path, name: &str, binds: &[(&Path, &str, bool)], log: &Path) -> Self {
        let hierarchies: Vec<&Path> = [
            "/sys/fs/cgroup/systemd",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ]
        .iter()
        .map(Path::new)
        .filter(|h| h.join("cgroup.procs").exists())
        .collect();
        assert!(
            !hierarchies.is_empty(),
            "no cgroup hierarchy at /sys/fs/cgroup: systemd-nspawn needs one"
        );
        // The empty cgroups of an earlier run killed before it could remove them.
        for h in &hierarchies {
            for e in std::fs::read_dir(h).into_iter().flatten().flatten() {
                let stale = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(MACHINE_PREFIX))
                    .and_then(|pid| pid.parse::<i32>().ok())
                    .is_some_and(|pid| !alive(pid));
                if stale {
                    remove_cgroup(&e.path());
                }
            }
        }
        let cgroups: Vec<PathBuf> = hierarchies.iter().map(|h| h.join(name)).collect();
        let mut c = Self {
            nspawn: None,
            init: None,
            cgroups,
            log: log.to_owned(),
        };
        for cg in &c.cgroups {
            std::fs::create_dir_all(cg).unwrap_or_else(|e| panic!("create cgroup {}: {e}", cg.display()));
        }
        // nspawn dies of SIGTERM, not SIGKILL, with the test: SIGTERM halts the container, while a
        // SIGKILLed nspawn leaves the container's systemd running, orphaned.
        let join: Vec<String> = c
            .cgroups
            .iter()
            .map(|cg| format!("echo $$ > {}/cgroup.procs", cg.display()))
            .collect();
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "TERM", "--", "sh", "-c"])
            .arg(format!("{} && exec \"$@\"", join.join(" && ")))
            .arg("sh")
            .arg("systemd-nspawn")
            .args([
                "--quiet",
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
            ])
            .args(["--volatile=overlay", "--console=pipe"])
            .arg(format!("--machine={name}"))
            .arg("--directory")
            .arg(root);
        for (host, inside, writable) in binds {
            let flag = if *writable { "--bind" } else { "--bind-ro" };
            cmd.arg(format!("{flag}={}:{inside}", host.display()));
        }
        let out = std::fs::File::create(log).unwrap();
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        c.nspawn = Some(
            cmd.spawn()
                .expect("setpriv and systemd-nspawn run (source scripts/deps.sh && need_nspawn)"),
        );
        let nspawn = c.nspawn.as_ref().unwrap().id() as i32;
        c.init = Some(wait_for(
            "systemd-nspawn to start the container's systemd",
            Duration::from_secs(15),
            || {
                c.assert_nspawn_running();
                children_of(nspawn)
                    .into_iter()
                    .find(|(_, _, comm)| comm == "systemd")
                    .map(|(pid, _, _)| pid)
            },
        ));
        let state = wait_for(
            "the container's systemd to finish booting (systemctl is-system-running)",
            Duration::from_secs(30),
            || {
                c.assert_nspawn_running();
                let out = c.run(&["systemctl", "is-system-running"]);
                let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                // "offline" until its manager's socket answers (CI met it right after start).
                (!state.is_empty() && !["initializing", "starting", "offline"].contains(&state.as_str()))
                    .then_some(state)
            },
        );
        assert_eq!(
            state,
            "running",
            "the container booted {state}; failed units:\n{}",
            c.ok(&["systemctl", "--failed", "--no-legend"])
        );
        c
    }

    fn assert_nspawn_running(&mut self) {
        if let Some(st) = self.nspawn.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!(
                "systemd-nspawn exited ({st}); its output:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    /// `argv` inside the container: in all its namespaces, as root, with a clean environment.
    fn command(&self, argv: &[&str]) -> Command {
        let init = self.init.expect("the container's systemd").to_string();
        let mut cmd = Command::new("nsenter");
        cmd.args(["--target", &init, "--all", "--"])
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8");
        cmd
    }

    /// A host program (e.g. iproute2's `ip`) in the container's network namespace only.
    fn in_netns(&self, argv: &[&str]) {
        let init = self.init.expect("the container's systemd").to_string();
        let out = Command::new("nsenter")
            .args(["--target", &init, "--net", "--"])
            .args(argv)
            .output()
            .expect("nsenter runs");
        assert!(
            out.status.success(),
            "{argv:?} in the container's network namespace: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn run(&self, argv: &[&str]) -> std::process::Output {
        self.command(argv).output().expect("nsenter runs")
    }

    /// `argv` inside the container, which must succeed; its stdout.
    fn ok(&self, argv: &[&str]) -> String {
        let out = self.run(argv);
        assert!(
            out.status.success(),
            "{argv:?} in the container: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A shell script inside the container.
    fn sh(&self, script: &str) -> Result<String, String> {
        let out = self.run(&["sh", "-c", script]);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        if out.status.success() {
            Ok(text(&out.stdout))
        } else {
            Err(format!(
                "{}: {}{}",
                out.status,
                text(&out.stdout),
                text(&out.stderr)
            ))
        }
    }

    fn etcdctl(&self, args: &str) -> Result<String, String> {
        self.sh(&format!("{ETCDCTL} {args}"))
    }

    /// `systemctl show` of etcd-warden.service: one value per property in `props`.
    fn unit(&self, props: &[&str]) -> std::collections::HashMap<String, String> {
        let text = self.ok(&["systemctl", "show", "etcd-warden", "-p", &props.join(",")]);
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn journal(&self) -> String {
        String::from_utf8_lossy(
            &self
                .run(&["journalctl", "-u", "etcd-warden", "--no-pager", "-o", "cat"])
                .stdout,
        )
        .into_owned()
    }

    /// The unit's journal's last 80 lines: systemd's, the warden's and etcd's.
    fn journal_tail(&self) -> String {
        let j = self.journal();
        let lines: Vec<&str> = j.lines().collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    fn halt(&mut self) {
        let Some(mut nspawn) = self.nspawn.take() else {
            return;
        };
        let pid = Pid::from_raw(nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while nspawn.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if nspawn.try_wait().ok().flatten().is_none() {
            eprintln!("systemd-nspawn (pid {pid}) did not halt the container in 15 s: SIGKILL");
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
        // The container's systemd, then anything else left in the container's cgroups: all of
        // it started by this test's nspawn.
        if let Some(init) = self.init.filter(|p| alive(*p)) {
            let _ = nix::sys::signal::kill(Pid::from_raw(init), Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.processes();
            if left.is_empty() || Instant::now() >= deadline {
                if !left.is_empty() {
                    eprintln!("processes left in the container's cgroups: {left:?}");
                }
                break;
            }
            for p in left {
                let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for cg in &self.cgroups {
            remove_cgroup(cg);
        }
    }

    /// Every pid in the container's cgroups.
    fn processes(&self) -> Vec<i32> {
        let mut pids = vec![];
        for cg in &self.cgroups {
            let mut dirs = vec![];
            walk_dirs(cg, &mut dirs);
            for d in dirs {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

/// Removes the cgroup `cg` and those below it, deepest first; one that still holds a process stays.
fn remove_cgroup(cg: &Path) {
    let mut dirs = vec![];
    walk_dirs(cg, &mut dirs);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = std::fs::remove_dir(&d);
    }
}

fn walk_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk_dirs(&e.path(), out);
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() && self.init.is_some() && self.nspawn.is_some() {
            eprintln!(
                "---- journalctl -u etcd-warden, the end ----\n{}",
                self.journal_tail()
            );
        }
        self.halt();
        if std::thread::panicking() {
            eprintln!(
                "---- systemd-nspawn's console ({}) ----\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// A process of this test, killed by pid and waited for when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host address of docs/systemd.md's site file; the container's loopback carries it.
const HOST_IP: &str = "10.0.0.11";

/// docs/systemd.md's `/etc/default/etcd-warden` as written there (etcd's configuration in ETCD_*
/// variables, TLS with client certificates for clients and peers), with a file store in place of
/// its S3 bucket and its credentials, and the harness's quiet full-snapshot schedule.
fn site_settings() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/systemd.md")).unwrap();
    let block = doc
        .split("```sh\n# /etc/default/etcd-warden\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/systemd.md has a ```sh block that opens with # /etc/default/etcd-warden");
    assert!(
        block.contains(&format!("https://{HOST_IP}:2380")),
        "docs/systemd.md's site file no longer uses the host address {HOST_IP}:\n{block}"
    );
    let mut lines: Vec<String> = block
        .lines()
        .filter(|l| !l.starts_with("ETCD_WARDEN_STORE"))
        .map(str::to_owned)
        .collect();
    lines.push(format!("ETCD_WARDEN_STORE=file://{STORE}"));
    lines.push(format!(
        "ETCD_WARDEN_FULL_SNAPSHOT_SCHEDULE=\"{}\"",
        cluster::quiet_full_schedule()
    ));
    lines.join("\n") + "\n"
}

/// The shipped unit under a real systemd: a Debian 12 tree (Debian's systemd 252, dbus, journald)
/// booted with systemd-nspawn, the unit, this build's warden, etcd 3.6.16 and a site file installed
/// as docs/systemd.md installs them. `Type=notify` makes the unit active only once etcd answers;
/// the watchdog kills and restarts a stopped warden; `systemctl kill -s USR1` takes a full
/// snapshot; `systemctl stop` loses no acknowledged write; a refused configuration (exit 64) is
/// not restarted.
#[test]
fn the_shipped_unit_under_a_real_systemd() {
    let began = Instant::now();
    let root = nspawn_root();
    let etcd = default_etcd();
    let etcd_dir = etcd.parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pki = pki::make(HOST_IP, dir.path());
    let (state, store, dropins) = (
        dir.path().join("var-lib-etcd"),
        dir.path().join("store"),
        dir.path().join("etcd-warden.service.d"),
    );
    for d in [&state, &store, &dropins] {
        std::fs::create_dir(d).unwrap();
    }
    let site = dir.path().join("etcd-warden.site");
    std::fs::write(&site, site_settings()).unwrap();
    // docs/systemd.md: a file store outside /var/lib/etcd is added to ReadWritePaths= in a drop-in.
    std::fs::write(
        dropins.join("store.conf"),
        format!("[Service]\nReadWritePaths={STORE}\n"),
    )
    .unwrap();
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/etcd-warden.service");
    let warden = Path::new(WARDEN);
    let (etcd_bin, etcdctl_bin, etcdutl_bin) = (
        etcd_dir.join("etcd"),
        etcd_dir.join("etcdctl"),
        etcd_dir.join("etcdutl"),
    );
    let binds: Vec<(&Path, &str, bool)> = vec![
        (warden, "/usr/local/bin/etcd-warden", false),
        (&etcd_bin, "/usr/bin/etcd", false),
        (&etcdctl_bin, "/usr/bin/etcdctl", false),
        (&etcdutl_bin, "/usr/bin/etcdutl", false),
        (&unit, "/etc/systemd/system/etcd-warden.service", false),
        (&dropins, "/etc/systemd/system/etcd-warden.service.d", false),
        (&site, SITE_FILE, false),
        (&pki, PKI, false),
        (&state, "/var/lib/etcd", true),
        (&store, STORE, true),
    ];
    let name = format!("{MACHINE_PREFIX}{}", std::process::id());
    let c = Container::boot(&root, &name, &binds, &dir.path().join("nspawn.log"));
    let booted = began.elapsed();
    // The address of the docs' site file, on the container's own loopback.
    c.in_netns(&["ip", "address", "add", &format!("{HOST_IP}/32"), "dev", "lo"]);

    // docs/systemd.md's install: the service's user, then its files readable by it.
    c.ok(&[
        "sh",
        "-c",
        "id etcd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/etcd --shell /usr/sbin/nologin etcd",
    ]);
    let uid: u32 = c.ok(&["id", "-u", "etcd"]).trim().parse().unwrap();
    for p in std::iter::once(pki.clone())
        .chain(std::fs::read_dir(&pki).unwrap().flatten().map(|e| e.path()))
        .chain([store.clone()])
    {
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
    }

    // Type=notify: active only once etcd answers.
    let started = Instant::now();
    c.ok(&["systemctl", "enable", "--now", "--no-block", "etcd-warden"]);
    let (status, answered) = wait_for(
        "etcd-warden.service to become active (READY=1)",
        Duration::from_secs(30),
        || {
            let u = c.unit(&["ActiveState", "SubState", "StatusText"]);
            match u["ActiveState"].as_str() {
                "active" => {
                    // At once, no retry: systemd has just called the unit started.
                    let health = c.etcdctl("endpoint health");
                    Some((u, health))
                }
                "failed" => panic!("etcd-warden.service failed to start: {u:?}"),
                _ => None,
            }
        },
    );
    let ready_after = started.elapsed();
    assert!(
        answered.is_ok(),
        "etcd-warden.service was active before etcd answered ({status:?}): {answered:?}"
    );
    assert_eq!(status["SubState"], "running", "{status:?}");
    // And by the clocks: systemd entered `active` after etcd began to serve clients.
    let entered = c.ok(&[
        "systemctl",
        "show",
        "etcd-warden",
        "-p",
        "ActiveEnterTimestamp",
        "--value",
        "--timestamp=us+utc",
    ]);
    let active_at = match entered.split_whitespace().collect::<Vec<_>>()[..] {
        [_, day, time, "UTC"] => humantime::parse_rfc3339(&format!("{day}T{time}Z")).ok(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("ActiveEnterTimestamp {entered:?}"));
    let serving = wait_for(
        "etcd's \"serving client traffic securely\" in the unit's journal",
        Duration::from_secs(10),
        || last_logged(&c.journal(), "serving client traffic securely"),
    );
    assert!(
        serving <= active_at,
        "systemd had etcd-warden.service active at {} before etcd served clients at {}",
        humantime::format_rfc3339_micros(active_at),
        humantime::format_rfc3339_micros(serving)
    );
    let line = &status["StatusText"];
    assert!(
        line.starts_with("running; etcd pid ")
            && line.contains(" ready; restarts 0; store file:///srv/etcd-backups"),
        "the warden's status line under systemd: {line:?}"
    );
    c.etcdctl("put /smoke/k1 v1").unwrap();
    assert_eq!(
        c.etcdctl("get /smoke/k1 --print-value-only").unwrap().trim(),
        "v1"
    );

    // `systemctl kill -s USR1` (to every process of the unit: etcd ignores it) takes a full
    // snapshot.
    let store_url = format!("file://{}", store.display());
    let fulls = || {
        backups_list(&store_url, &[])
            .iter()
            .filter(|r| r["kind"] == "full")
            .count()
    };
    let before = wait_for(
        "the first full snapshot in the store",
        Duration::from_secs(30),
        || {
            let n = fulls();
            (n >= 1).then_some(n)
        },
    );
    let main_pid = c.unit(&["MainPID"])["MainPID"].clone();
    c.etcdctl("put /smoke/k2 v2").unwrap();
    c.ok(&["systemctl", "kill", "-s", "USR1", "etcd-warden"]);
    wait_for(
        "a full snapshot in the store after systemctl kill -s USR1",
        Duration::from_secs(20),
        || (fulls() > before).then_some(()),
    );
    let after = c.unit(&["MainPID", "StatusText", "WatchdogUSec"]);
    assert_eq!(
        after["MainPID"], main_pid,
        "the warden restarted on USR1: {after:?}"
    );
    assert_eq!(
        after["StatusText"], status["StatusText"],
        "etcd (or the warden's state) changed on USR1"
    );

    // The watchdog: a stopped warden sends no WATCHDOG=1; systemd kills it (SIGABRT) and
    // restarts it. systemd shows the watchdog of the run under way: the shipped unit's, then the
    // test's drop-in's: 5 s (30 s shipped) and 1 s between restarts (5 s shipped) keep the test short.
    let shipped = &after["WatchdogUSec"];
    assert!(
        !["", "0", "infinity"].contains(&shipped.as_str()),
        "the shipped unit runs without a watchdog under systemd: WatchdogUSec={shipped:?}"
    );
    std::fs::write(
        dropins.join("test-timing.conf"),
        "[Service]\nWatchdogSec=5s\nRestartSec=1s\n",
    )
    .unwrap();
    c.ok(&["systemctl", "daemon-reload"]);
    c.ok(&["systemctl", "restart", "--no-block", "etcd-warden"]);
    let timed = wait_for(
        "etcd-warden.service to be active again after the timing drop-in",
        Duration::from_secs(30),
        || {
            let u = c.unit(&["ActiveState", "MainPID", "NRestarts", "WatchdogUSec"]);
            (u["ActiveState"] == "active" && u["MainPID"] != main_pid).then_some(u)
        },
    );
    assert_eq!(timed["WatchdogUSec"], "5s", "{timed:?}");
    let main_pid = timed["MainPID"].clone();
    let restarts: u32 = timed["NRestarts"].parse().unwrap();
    let stopped = Instant::now();
    c.sh(&format!("kill -STOP {main_pid}")).unwrap();
    let again = wait_for(
        "systemd to kill the stopped warden for its watchdog and restart it",
        Duration::from_secs(30),
        || {
            let u = c.unit(&["ActiveState", "MainPID", "NRestarts"]);
            (u["ActiveState"] == "active"
                && u["MainPID"] != main_pid
                && u["NRestarts"].parse::<u32>().unwrap() > restarts)
                .then_some(u)
        },
    );
    let watchdog_after = stopped.elapsed();
    assert!(
        c.journal()
            .contains("etcd-warden.service: Failed with result 'watchdog'."),
        "the warden was restarted, but not by the watchdog ({again:?}):\n{}",
        c.journal_tail()
    );
    assert_eq!(
        c.etcdctl("get /smoke/k1 --print-value-only").unwrap().trim(),
        "v1"
    );

    // `systemctl stop` while a client writes: every acknowledged write is in the store.
    let acked_file = dir.path().join("acked.txt");
    let mut writer = Killed(
        c.command(&[
            "sh",
            "-c",
            &format!(
                "i=0; while [ $i -lt 100000 ]; do k=$(printf /acked/k%06d $i); \
                 {ETCDCTL} put $k v$i >/dev/null 2>&1 || exit 0; echo $k; i=$((i+1)); done"
            ),
        ])
        .stdout(std::fs::File::create(&acked_file).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let acked = || -> Vec<String> {
        std::fs::read_to_string(&acked_file)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    wait_for("30 acknowledged writes", Duration::from_secs(30), || {
        let n = acked().len();
        if n < 30 && writer.0.try_wait().unwrap().is_some() {
            panic!("the writer's etcdctl failed after {n} writes, before the stop");
        }
        (n >= 30).then_some(())
    });
    c.ok(&["systemctl", "stop", "--no-block", "etcd-warden"]);
    let stopped = wait_for("etcd-warden.service to stop", Duration::from_secs(60), || {
        let u = c.unit(&["ActiveState", "Result", "ExecMainStatus"]);
        ["inactive", "failed"]
            .contains(&u["ActiveState"].as_str())
            .then_some(u)
    });
    assert_eq!(
        (
            stopped["ActiveState"].as_str(),
            stopped["Result"].as_str(),
            stopped["ExecMainStatus"].as_str()
        ),
        ("inactive", "success", "143"),
        "systemctl stop did not end in a clean stop: {stopped:?}"
    );
    wait_for(
        "the writer to stop once etcd is gone",
        Duration::from_secs(20),
        || writer.0.try_wait().unwrap(),
    );
    let acked = acked();
    let (found, _) = keys_after_restore(&etcd, &store_url, &[], "/acked/");
    assert_none_lost(&acked, &found, "systemctl stop");

    // A bad setting in the site file: exit 64, and the unit stays failed.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&site)
        .unwrap()
        .write_all(b"ETCD_WARDEN_STOP_TIMEOUT=soon\n")
        .unwrap();
    c.ok(&["systemctl", "restart", "--no-block", "etcd-warden"]);
    // A manual restart sets NRestarts, systemd's count of its own restarts, to 0: an automatic
    // restart after exit 64 shows as SubState auto-restart or as a count above 0.
    let no_restart = |u: &std::collections::HashMap<String, String>| {
        assert!(
            u["SubState"] != "auto-restart" && u["NRestarts"] == "0",
            "systemd restarts the warden after it exited {}: {u:?}\n{}",
            u["ExecMainStatus"],
            c.journal_tail()
        );
    };
    let props = ["ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts"];
    let failed = wait_for(
        "etcd-warden.service to fail on a bad ETCD_WARDEN_STOP_TIMEOUT",
        Duration::from_secs(20),
        || {
            let u = c.unit(&props);
            no_restart(&u);
            (u["ActiveState"] == "failed").then_some(u)
        },
    );
    assert_eq!(
        (failed["Result"].as_str(), failed["ExecMainStatus"].as_str()),
        ("exit-code", "64"),
        "{failed:?}"
    );
    // Failed it stays, for three and a half RestartSec periods (1 s in the drop-in).
    let window = Instant::now();
    while window.elapsed() < Duration::from_millis(3500) {
        let u = c.unit(&props);
        no_restart(&u);
        assert_eq!(u["ActiveState"], "failed", "{u:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        c.journal().contains("--stop-timeout \"soon\""),
        "the journal does not name the bad setting:\n{}",
        c.journal_tail()
    );

    drop(c);
    eprintln!(
        "boot {booted:?}, active {ready_after:?} after start, watchdog restart {watchdog_after:?} after SIGSTOP, {} writes through the stop, whole test {:?}",
        acked.len(),
        began.elapsed()
    );
}

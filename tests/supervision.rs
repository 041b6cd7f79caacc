//! The warden supervising real etcd 3.4.23, 3.5.16, the newest 3.5 and 3.5.1 processes and misbehaving stand-ins (shell scripts):
//! readiness, graceful stop, SIGKILL escalation, respawn with backoff, signal forwarding.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);

fn sh(script: &str) -> Vec<String> {
    script_program(script)
}

/// A warden over `etcd` with its data dir in the returned temporary dir, which comes first so that
/// it is dropped last (bindings drop in reverse order): after the warden and its etcd are gone.
fn with_etcd(etcd: &Path, opts: &[&str]) -> (tempfile::TempDir, Warden, String) {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    (dir, Warden::start(&ip, opts, &argv), ip)
}

/// etcd's own word on its release: `etcdctl endpoint status` of the running server.
fn server_version(ctl: &Path, ip: &str) -> String {
    let out = etcdctl(ctl, ip, &["endpoint", "status", "-w", "json"]).expect("endpoint status");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("endpoint status JSON");
    v[0]["Status"]["version"]
        .as_str()
        .expect("a version in endpoint status")
        .to_owned()
}

/// `known`: the etcd issues the warden must report for this release (and only these).
fn supervise_real_etcd(etcd: &Path, known: &[&str]) {
    let ctl = etcdctl_for(etcd);
    let (_data, mut w, ip) = with_etcd(etcd, &["--stop-timeout", "20s"]);
    w.wait_ready(START);
    etcdctl(&ctl, &ip, &["put", "k", "v"]).expect("put through the supervised etcd");
    let status = w.status();
    assert_eq!(status["phase"], "running", "{status}");
    assert_eq!(status["etcd"]["healthy"], true, "{status}");
    assert!(status["etcd"]["revision"].as_i64().unwrap() >= 1, "{status}");
    let version = server_version(&ctl, &ip);
    assert_eq!(status["etcd"]["version"], version.as_str(), "{status}");
    let reported: Vec<&str> = status["etcd"]["known_issues"]
        .as_array()
        .expect("etcd.known_issues is a list")
        .iter()
        .map(|i| i["issue"].as_str().unwrap())
        .collect();
    assert_eq!(reported, known, "known issues of etcd {version}: {status}");
    for issue in known {
        assert!(
            w.log_text().contains(issue),
            "the log does not warn about {issue} for etcd {version}"
        );
    }
    let etcd_pid = w.etcd_pid().unwrap();

    let t = Instant::now();
    w.signal(Signal::SIGTERM);
    let code = w.wait_exit(Duration::from_secs(25));
    // etcd (Go) re-raises SIGTERM after its clean shutdown, so its status is "killed by SIGTERM".
    assert!(
        code == 0 || code == 143,
        "warden exit code {code} is not etcd's graceful status"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "graceful stop took {:?}",
        t.elapsed()
    );
    assert!(
        !alive(etcd_pid),
        "etcd {etcd_pid} still alive after the warden exited"
    );
    let log = w.log_text();
    assert!(log.contains("signalled etcd") && log.contains("SIGTERM"), "{log}");
    assert!(
        !log.contains("SIGKILL"),
        "a graceful stop must not need SIGKILL:\n{log}"
    );
}

#[test]
fn etcd_3_4_supervised_ready_and_stopped_gracefully() {
    supervise_real_etcd(&etcd34(), &[]);
}

#[test]
fn etcd_3_5_supervised_ready_and_stopped_gracefully() {
    supervise_real_etcd(
        &etcd35(),
        &[
            "etcd-io/etcd#19557",
            "etcd-io/etcd#20967",
            "etcd-io/etcd#20650",
            "etcd-io/etcd#21417",
            "etcd-io/etcd#21694",
        ],
    );
}

#[test]
fn etcd_3_5_newest_supervised_ready_and_stopped_gracefully() {
    supervise_real_etcd(&etcd35_newest(), &["etcd-io/etcd#21694"]);
}

#[test]
fn etcd_3_6_supervised_ready_and_stopped_gracefully() {
    supervise_real_etcd(&etcd36(), &["etcd-io/etcd#21432"]);
}

#[test]
fn etcd_3_7_supervised_ready_and_stopped_gracefully() {
    supervise_real_etcd(&etcd37(), &[]);
}

/// 3.5.1 runs (the warden never refuses a release) and is reported with its data-loss bug.
#[test]
fn etcd_3_5_1_runs_and_its_data_loss_bug_is_reported() {
    supervise_real_etcd(
        &etcd351(),
        &[
            "etcd-io/etcd#13766",
            "etcd-io/etcd#19557",
            "etcd-io/etcd#20967",
            "etcd-io/etcd#20650",
            "etcd-io/etcd#21417",
            "etcd-io/etcd#21694",
        ],
    );
}

#[test]
fn sigkilled_etcd_is_respawned_with_data_intact_and_unready_meanwhile() {
    let etcd = etcd34();
    let ctl = etcdctl_for(&etcd);
    let (_data, w, ip) = with_etcd(&etcd, &["--restart-backoff-min", "1s"]);
    w.wait_ready(START);
    etcdctl(&ctl, &ip, &["put", "survivor", "yes"]).unwrap();
    let first = w.etcd_pid().unwrap();

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    // Sampled from the kill until ready again: 503 within a few ms (the reaper tells the
    // supervisor at once), naming the exit, and never 200 again before the respawned etcd is
    // ready: the backoff is at least 500 ms (equal jitter of 1 s), so the 503 lasts that long.
    let mut samples: Vec<(Duration, u16, String)> = Vec::new();
    let recovered = wait_for(
        "/readyz to turn 503 and back to 200 after the kill",
        START,
        || {
            let (code, body) = w.get("/readyz").unwrap_or((0, "no answer".into()));
            samples.push((killed.elapsed(), code, body.trim().to_owned()));
            let seen_503 = samples.iter().any(|(_, c, _)| *c == 503);
            (seen_503 && code == 200).then(|| killed.elapsed())
        },
    );
    let first_503 = samples.iter().position(|(_, c, _)| *c == 503).unwrap();
    let (at, _, reason) = &samples[first_503];
    // The reason below is what tells the supervisor's word from a failed health check; the bound
    // only says it came promptly (health checks alone would take up to their timeout).
    assert!(
        *at < Duration::from_millis(1500),
        "503 only {at:?} after the kill: {samples:?}"
    );
    assert!(
        reason.contains("exited (signal SIGKILL)") && reason.contains("waiting to be restarted"),
        "the first 503 does not say etcd was killed: {samples:?}"
    );
    assert!(
        samples[first_503..samples.len() - 1]
            .iter()
            .all(|(_, c, _)| *c == 503),
        "ready again before the respawned etcd was: {samples:?}"
    );
    assert!(
        recovered - *at >= Duration::from_millis(450),
        "unready for only {:?}, less than half the backoff: {samples:?}",
        recovered - *at
    );
    let second = w.etcd_pid().unwrap();
    assert_ne!(first, second, "etcd was not respawned");
    let status = w.status();
    assert_eq!(status["etcd"]["restarts"], 1, "{status}");
    assert_eq!(status["etcd"]["last_exit"]["signal"], 9, "{status}");
    let got = etcdctl(&ctl, &ip, &["get", "survivor", "--print-value-only"]).unwrap();
    assert_eq!(got.trim(), "yes", "data lost across the respawn");
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(metrics.contains("etcd_warden_etcd_restarts_total 1"), "{metrics}");
}

#[test]
fn sigterm_returns_the_childs_exit_status() {
    let ip = unique_ip();
    let mut w = Warden::start(&ip, &[], &sh("trap 'exit 7' TERM; while :; do sleep 0.05; done"));
    wait_for("the child to run", Duration::from_secs(10), || w.etcd_pid());
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_exit(Duration::from_secs(10)), 7);
}

#[test]
fn child_ignoring_sigterm_is_killed_after_the_stop_timeout() {
    let ip = unique_ip();
    // SIG_IGN survives exec, so `sleep` ignores SIGTERM too.
    let mut w = Warden::start(
        &ip,
        &["--stop-timeout", "1500ms"],
        &sh("trap '' TERM; exec sleep 600"),
    );
    let child = wait_for("the child to run", Duration::from_secs(10), || w.etcd_pid());
    let t = Instant::now();
    w.signal(Signal::SIGTERM);
    let code = w.wait_exit(Duration::from_secs(15));
    let took = t.elapsed();
    assert_eq!(code, 137, "exit code should say SIGKILL");
    assert!(
        took >= Duration::from_millis(1400),
        "killed before the stop timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "stop timeout not honoured: {took:?}"
    );
    assert!(!alive(child));
}

#[test]
fn second_sigterm_kills_at_once() {
    let ip = unique_ip();
    let mut w = Warden::start(
        &ip,
        &["--stop-timeout", "60s"],
        &sh("trap '' TERM; exec sleep 600"),
    );
    wait_for("the child to run", Duration::from_secs(10), || w.etcd_pid());
    w.signal(Signal::SIGTERM);
    wait_for("the warden to report stopping", Duration::from_secs(5), || {
        (w.status()["etcd"]["phase"] == "stopping").then_some(())
    });
    let t = Instant::now();
    w.signal(Signal::SIGINT);
    assert_eq!(w.wait_exit(Duration::from_secs(10)), 137);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "second signal did not kill at once: {:?}",
        t.elapsed()
    );
}

#[test]
fn crash_loop_backs_off_longer_each_time_and_is_never_ready() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let script = format!("date +%s%N >> {}; exit 3", starts.display());
    let w = Warden::start(
        &ip,
        &["--restart-backoff-min", "100ms", "--restart-backoff-max", "5s"],
        &sh(&script),
    );
    let times: Vec<u128> = wait_for(
        "six starts of the crashing child",
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(&starts).unwrap_or_default();
            let t: Vec<u128> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            (t.len() >= 6).then_some(t)
        },
    );
    let gaps: Vec<f64> = times.windows(2).map(|p| (p[1] - p[0]) as f64 / 1e6).collect();
    // Equal jitter keeps delays non-decreasing: gap n+1 ≥ gap n, up to process start noise (≤ 100 ms
    // on a loaded 2-core CI machine).
    for pair in gaps.windows(2) {
        assert!(pair[1] + 100.0 >= pair[0], "backoff shrank: gaps {gaps:?} ms");
    }
    assert!(gaps[4] >= 3.0 * gaps[0], "backoff did not grow: gaps {gaps:?} ms");
    assert!(
        gaps[0] >= 45.0,
        "first restart faster than half of --restart-backoff-min: {gaps:?}"
    );
    let (code, reason) = w.get("/readyz").unwrap();
    assert_eq!(code, 503, "a crash-looping etcd must not be ready");
    assert!(!reason.is_empty());
    let status = w.status();
    assert!(status["etcd"]["restarts"].as_u64().unwrap() >= 5, "{status}");
    assert_eq!(status["phase"], "restarting", "{status}");
}

#[test]
fn other_signals_are_forwarded_to_etcd() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let script = format!(
        "trap 'echo QUIT >> {g}' QUIT; trap 'echo WINCH >> {g}' WINCH; echo traps > {g}; while :; do sleep 0.05; done",
        g = got.display()
    );
    let w = Warden::start(&ip, &[], &sh(&script));
    wait_for("the child to install its traps", Duration::from_secs(10), || {
        std::fs::read_to_string(&got)
            .is_ok_and(|t| t.contains("traps"))
            .then_some(())
    });
    w.signal(Signal::SIGQUIT);
    w.signal(Signal::SIGWINCH);
    wait_for(
        "the child to receive SIGQUIT and SIGWINCH",
        Duration::from_secs(5),
        || {
            let t = std::fs::read_to_string(&got).unwrap_or_default();
            (t.contains("QUIT") && t.contains("WINCH")).then_some(())
        },
    );
    assert_eq!(
        w.status()["etcd"]["restarts"],
        0,
        "a forwarded signal must not restart etcd"
    );
}

#[test]
fn json_logs_and_etcd_output_passed_through() {
    let ip = unique_ip();
    let mut w = Warden::start(
        &ip,
        &["--log-format", "json"],
        &sh("echo from-etcd-stdout; echo from-etcd-stderr >&2; exec sleep 600"),
    );
    wait_for("the child to print", Duration::from_secs(10), || {
        w.log_text().contains("from-etcd-stderr").then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(10));
    let log = w.log_text();
    assert!(
        log.lines().any(|l| l == "from-etcd-stdout"),
        "etcd's stdout altered:\n{log}"
    );
    assert!(
        log.lines().any(|l| l == "from-etcd-stderr"),
        "etcd's stderr altered:\n{log}"
    );
    let warden_lines: Vec<&str> = log.lines().filter(|l| !l.starts_with("from-etcd")).collect();
    assert!(!warden_lines.is_empty());
    for line in warden_lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }
}

/// Test hygiene: a warden a test lost track of (its thread died, its guard never dropped) is
/// killed with that thread, so it cannot answer for a later test on a reused address.
#[test]
fn a_warden_whose_test_thread_died_dies_with_it() {
    let ip = unique_ip();
    let pid = std::thread::spawn(move || {
        let w = Warden::start(&ip, &[], &sh("exec sleep 600"));
        wait_for("the stand-in etcd to start", START, || w.etcd_pid());
        let pid = w.pid();
        // Its temporary dir goes with the guard's other fields; the process is what is forgotten.
        let dir = w.dir.path().to_owned();
        std::mem::forget(w);
        let _ = std::fs::remove_dir_all(dir);
        pid
    })
    .join()
    .unwrap();
    wait_for(
        "the forgotten warden to die with its test thread",
        Duration::from_secs(10),
        || (!alive(pid)).then_some(()),
    );
}

/// Test hygiene: readiness is awaited from the warden the test started, not from whatever answers
/// on its address; one that exited fails the wait at once, with its log.
#[test]
fn wait_ready_is_not_satisfied_by_another_warden_on_the_address() {
    let etcd = default_etcd();
    let (_data, first, ip) = with_etcd(&etcd, &[]);
    first.wait_ready(START);
    let dir = tempfile::tempdir().unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let second = Warden::start(&ip, &[], &argv);
    let t = Instant::now();
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        second.wait_ready(Duration::from_secs(20))
    }))
    .expect_err("the second warden (its address taken) must not count as ready");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("exited") || msg.contains("not the one this test started"),
        "the wait should name why: {msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the wait should fail when the warden exits, not at its deadline ({:?})",
        t.elapsed()
    );
    first.wait_ready(START);
}

/// Readiness turns 503 naming the raised alarm and stays so: sampled for 2 s (ten health checks of
/// 200 ms), the warden alive and etcd not restarted for it.
fn unready_while_alarmed(w: &Warden, alarm: &str) {
    let (_, reason) = wait_for(&format!("readiness to turn 503 for {alarm}"), START, || {
        w.get("/readyz").filter(|(c, _)| *c == 503)
    });
    assert!(
        reason.contains(alarm),
        "the 503 does not name the alarm: {reason}"
    );
    let etcd = w.etcd_pid();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        let (code, body) = w.get("/readyz").unwrap();
        assert_eq!((code, body.contains(alarm)), (503, true), "{body}");
        assert_eq!(w.get("/livez").unwrap().0, 200);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(w.etcd_pid(), etcd, "etcd must not be restarted for an alarm");
    assert_eq!(
        w.status()["etcd"]["restarts"],
        0,
        "etcd must not be restarted for an alarm"
    );
}

/// A NOSPACE alarm makes readiness 503 naming it (docs/operations.md: readiness), for as
/// long as it is raised, sampled; the operator's fix (compact, defragment, `alarm disarm`) makes it
/// ready again. The alarm is real: etcd's own quota, raised by writes, checked with etcdctl.
#[test]
fn a_nospace_alarm_makes_readiness_503_until_it_is_disarmed() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    argv.extend(["--quota-backend-bytes".into(), (16 * 1024 * 1024).to_string()]);
    // The space keeper off: this is readiness following etcd's alarm, and the manual recovery it
    // documents (tests/space.rs has the keeper's own).
    let mut w = Warden::start(
        &ip,
        &["--health-interval", "200ms", "--space-keeper", "off"],
        &argv,
    );
    w.wait_ready(START);
    // Distinct 1 MiB values until etcd refuses: its backend is over the quota.
    let refused = rt().block_on(async {
        let mut c = pki::connect(&ip, None).await.unwrap();
        for i in 0..64u32 {
            let v: Vec<u8> = (0..1024 * 1024u32)
                .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 13) as u8)
                .collect();
            if let Err(e) = c.put(format!("fill{i}"), v, None).await {
                return e.to_string();
            }
        }
        panic!("64 MiB of writes never hit the 16 MiB quota");
    });
    assert!(refused.contains("database space exceeded"), "{refused}");
    let alarms = etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap();
    assert!(
        alarms.contains("NOSPACE"),
        "etcd lists no NOSPACE alarm: {alarms}"
    );
    unready_while_alarmed(&w, "NOSPACE");
    // The documented recovery: free space, defragment, disarm.
    let rev = etcd_revision(&ctl, &ip);
    etcdctl(&ctl, &ip, &["del", "fill", "--prefix"]).unwrap();
    etcdctl(&ctl, &ip, &["compact", &(rev + 1).to_string()]).unwrap();
    etcdctl(&ctl, &ip, &["defrag"]).unwrap();
    etcdctl(&ctl, &ip, &["alarm", "disarm"]).unwrap();
    assert_eq!(etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap().trim(), "");
    w.wait_ready(Duration::from_secs(10));
    etcdctl(&ctl, &ip, &["put", "after-disarm", "1"]).unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// A CORRUPT alarm (raised through etcd's own Alarm API, as its corruption check does) makes
/// readiness 503 naming it; `etcdctl alarm disarm` makes it ready again.
#[test]
fn a_corrupt_alarm_makes_readiness_503_until_it_is_disarmed() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (_data, mut w, ip) = with_etcd(&etcd, &["--health-interval", "200ms"]);
    w.wait_ready(START);
    rt().block_on(async {
        let mut c = pki::connect(&ip, None).await.unwrap();
        let member = c.status().await.unwrap().header().unwrap().member_id();
        let mut opts = etcd_client::AlarmOptions::new();
        opts.with_member(member);
        c.alarm(
            etcd_client::AlarmAction::Activate,
            etcd_client::AlarmType::Corrupt,
            Some(opts),
        )
        .await
        .unwrap();
    });
    let alarms = etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap();
    assert!(
        alarms.contains("CORRUPT"),
        "etcd lists no CORRUPT alarm: {alarms}"
    );
    unready_while_alarmed(&w, "CORRUPT");
    etcdctl(&ctl, &ip, &["alarm", "disarm"]).unwrap();
    assert_eq!(etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap().trim(), "");
    w.wait_ready(Duration::from_secs(10));
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

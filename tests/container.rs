#![allow(clippy::disallowed_methods)]
//! The warden as PID 1 of a real container: the FROM-scratch twin of the shipped Containerfile (built by
//! `scripts/container-image`: a static musl warden, etcd 3.6.16 (static), a static busybox), run by Debian's podman
//! with runc on the host network. Driven the way an operator drives it: `podman kill --signal USR1`
//! takes a full snapshot, an orphan left by `podman exec` is adopted and reaped by the warden, and
//! `podman stop` stops etcd gracefully, the container exiting with etcd's status.
//!
//! Podman's storage (vfs), run state and containers.conf all live in one tempdir per run; the container
//! and the image are removed when the test ends, pass or fail.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::podman::Podman;
use common::*;

fn status(http: &str) -> serde_json::Value {
    let (code, body) = http_get(http, "/status").expect("the warden answers /status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("/status is JSON")
}

/// The pid inside its PID namespace (last NSpid field) of a host pid.
fn ns_pid(host_pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

#[test]
fn warden_as_container_pid1_snapshots_on_usr1_reaps_orphans_and_stops_with_etcds_status() {
    let test_start = Instant::now();
    let mut podman = Podman::new();
    let id = std::process::id();
    let image = format!("localhost/etcd-warden-test:{id}");
    let name = format!("etcd-warden-test-{id}");
    podman.build_image(&image);

    // The warden's --listen from ETCD_WARDEN_LISTEN, etcd's command line after the image name.
    let ip = unique_ip();
    let http = format!("{ip}:2378");
    let listen = format!("ETCD_WARDEN_LISTEN={http}");
    // etcd's certificates, made on the host and mounted at the same path.
    let certs = tempfile::tempdir().unwrap();
    pki::make(&ip, certs.path());
    let certs_volume = format!("{0}:{0}:ro", certs.path().display());
    let mut args = vec![
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        "host",
        "--volume",
        &certs_volume,
        // A test killed before its guard runs leaves no container behind for long.
        "--timeout",
        "600",
        "--env",
        &listen,
        &image,
        "etcd",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    args.extend(etcd_args(&ip, Path::new("/var/lib/etcd/m1")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    podman.containers.push(name.clone());
    podman.run(&args);
    let started = Instant::now();

    wait_for(
        &format!("the warden in container {name} to report ready at {http}/readyz"),
        Duration::from_secs(60),
        || match http_get(&http, "/readyz") {
            Some((200, _)) => Some(()),
            other => {
                let state = podman.inspect(&name, "{{.State.Status}}");
                assert_eq!(
                    state, "running",
                    "container {name} is {state} before the warden was ready (last answer {other:?})"
                );
                None
            }
        },
    );
    eprintln!("podman run → /readyz 200: {:?}", started.elapsed());
    let st = status(&http);
    assert_eq!(st["warden"]["pid"], 1, "{st}");
    assert_eq!(st["warden"]["role"], "pid1", "{st}");
    assert_eq!(st["etcd"]["healthy"], true, "{st}");
    // The HEALTHCHECK command of the shipped Containerfile works inside the container.
    let probe = podman.run(&[
        "exec",
        &name,
        "etcd-warden",
        "probe",
        "--url",
        &format!("http://{http}/readyz"),
    ]);
    assert_eq!(probe.trim(), "ready");

    // SIGUSR1 through podman: one more full snapshot in the image's store, its own volume.
    let fulls = wait_for(
        "the first full snapshot (the store starts empty)",
        Duration::from_secs(30),
        || {
            status(&http)["backup"]["fulls_total"]
                .as_u64()
                .filter(|n| *n >= 1)
        },
    );
    podman.run(&["kill", "--signal", "USR1", &name]);
    let st = wait_for(
        "backup.fulls_total to grow after podman kill --signal USR1",
        Duration::from_secs(30),
        || {
            let st = status(&http);
            (st["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(st)
        },
    );
    assert_eq!(
        st["backup"]["store"], "file:///var/lib/etcd-backups",
        "backups off the data volume: {st}"
    );
    assert_eq!(st["backup"]["healthy"], true, "{st}");

    // An orphan: `podman exec` starts a shell from outside the container's PID namespace; the `sleep`
    // it leaves behind is reparented to the namespace's init, the warden. Once adopted it is killed
    // from the host, and the warden must reap it.
    let warden_host: i32 = podman
        .inspect(&name, "{{.State.Pid}}")
        .parse()
        .expect("podman inspect .State.Pid");
    assert_eq!(ns_pid(warden_host), Some(1), "the container's init is the warden");
    let reaped = status(&http)["warden"]["orphans_reaped"]
        .as_u64()
        .expect("warden.orphans_reaped");
    let out = podman.run(&[
        "exec",
        &name,
        "busybox",
        "sh",
        "-c",
        "busybox sleep 120 </dev/null >/dev/null 2>&1 & echo $!",
    ]);
    let orphan_ns: i32 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("pid of the orphan, got {out:?}"));
    let orphan = wait_for(
        &format!("the orphan (pid {orphan_ns} in the container) to be adopted by the warden"),
        Duration::from_secs(10),
        || {
            children_of(warden_host)
                .into_iter()
                .find(|(pid, _, _)| ns_pid(*pid) == Some(orphan_ns))
                .map(|(pid, _, _)| pid)
        },
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(orphan),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the orphan");
    wait_for(
        &format!("the orphan {orphan} to be reaped by the warden"),
        Duration::from_secs(10),
        || (!Path::new(&format!("/proc/{orphan}")).exists()).then_some(()),
    );
    let zombies: Vec<_> = children_of(warden_host)
        .into_iter()
        .filter(|(_, state, _)| *state == 'Z')
        .collect();
    assert!(zombies.is_empty(), "zombie children of the warden: {zombies:?}");
    wait_for(
        &format!("warden.orphans_reaped to grow from {reaped}"),
        Duration::from_secs(5),
        || (status(&http)["warden"]["orphans_reaped"].as_u64() > Some(reaped)).then_some(()),
    );

    etcdctl(
        &etcdctl_for(&default_etcd()),
        &ip,
        &["put", "survives-a-restart", "1"],
    )
    .expect("a write through the container's etcd");
    // podman stop: SIGTERM to PID 1, a graceful stop of etcd well within the 30 s grace, and the
    // container exits with etcd's status (etcd re-raises SIGTERM after a clean shutdown: 143).
    let t = Instant::now();
    podman.run(&["stop", "--time", "30", &name]);
    let stop_took = t.elapsed();
    assert!(
        stop_took < Duration::from_secs(20),
        "podman stop took {stop_took:?}"
    );
    assert_eq!(podman.inspect(&name, "{{.State.Status}}"), "exited");
    let code = podman.inspect(&name, "{{.State.ExitCode}}");
    let log = podman.logs(&name);
    assert_eq!(
        code, "143",
        "the container's exit code is not etcd's graceful status:\n{log}"
    );
    assert!(
        log.contains("signalled etcd") && log.contains("SIGTERM"),
        "no SIGTERM to etcd in the warden's log:\n{log}"
    );
    assert!(
        log.contains("etcd exited") && log.contains("etcd stopped; warden exiting"),
        "the warden did not see etcd exit:\n{log}"
    );
    assert!(
        !log.contains("SIGKILL"),
        "a graceful stop must not need SIGKILL:\n{log}"
    );
    // podman start on the same data: the start-up check runs a private etcd inside the image
    // (FROM scratch, no /tmp) and must keep the data dir, not call it broken.
    podman.run(&["start", &name]);
    wait_for("ready again after podman start", Duration::from_secs(60), || {
        matches!(http_get(&http, "/readyz"), Some((200, _))).then_some(())
    });
    let got = etcdctl(
        &etcdctl_for(&default_etcd()),
        &ip,
        &["get", "survives-a-restart", "--print-value-only"],
    )
    .unwrap();
    assert_eq!(got.trim(), "1");
    let log = podman.logs(&name);
    assert!(
        !log.contains("moved aside") && log.contains("the data dir is current"),
        "the restart did not keep the data dir as it was:\n{log}"
    );
    podman.run(&["stop", "--time", "30", &name]);
    eprintln!(
        "podman stop took {stop_took:?}; whole test {:?}",
        test_start.elapsed()
    );
}

//! The warden as PID 1 of a real PID namespace (`unshare --pid --fork --mount-proc`) and as a child
//! subreaper outside one: orphans that etcd's process tree leaves behind are reaped, none stays a zombie.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

/// A child that double-forks an orphan (`sleep 2`) and then keeps running as "etcd".
fn orphan_maker() -> Vec<String> {
    script_program("sh -c 'sleep 2 & exit 0'; exec sleep 600")
}

/// Follows the orphan from adoption by `warden` to its reaping; asserts no zombie child remains.
fn assert_orphan_adopted_and_reaped(w: &Warden, warden_host_pid: i32, etcd_host_pid: i32) {
    let orphan = wait_for(
        "the orphan `sleep 2` to be adopted by the warden",
        Duration::from_secs(10),
        || {
            children_of(warden_host_pid)
                .into_iter()
                .find(|(pid, _, comm)| comm == "sleep" && *pid != etcd_host_pid)
                .map(|(pid, _, _)| pid)
        },
    );
    wait_for(
        "the orphan to exit and be reaped",
        Duration::from_secs(15),
        || (!std::path::Path::new(&format!("/proc/{orphan}")).exists()).then_some(()),
    );
    let zombies: Vec<_> = children_of(warden_host_pid)
        .into_iter()
        .filter(|(_, s, _)| *s == 'Z')
        .collect();
    assert!(zombies.is_empty(), "zombie children of the warden: {zombies:?}");
    let status = w.status();
    assert!(
        status["warden"]["orphans_reaped"].as_u64().unwrap() >= 1,
        "{status}"
    );
}

#[test]
fn as_pid1_in_a_pid_namespace_reaps_orphans() {
    let ip = unique_ip();
    let mut w = Warden::builder_with(
        &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
        &ip,
        &["--stop-timeout", "5s"],
        &orphan_maker(),
    )
    .spawn();
    let status = wait_for(
        "the warden inside the namespace to answer",
        Duration::from_secs(10),
        || w.get("/status").filter(|(c, _)| *c == 200).map(|(_, b)| b),
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["warden"]["role"], "pid1", "{status}");
    assert_eq!(status["warden"]["pid"], 1, "{status}");

    // Host pids: unshare → warden (PID 1 inside) → sh (etcd stand-in).
    let warden_host = wait_for("unshare to fork the warden", Duration::from_secs(5), || {
        children_of(w.pid()).first().map(|c| c.0)
    });
    let nspid = std::fs::read_to_string(format!("/proc/{warden_host}/status")).unwrap();
    let line = nspid.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        line.split_whitespace().last() == Some("1"),
        "warden is not PID 1 in its namespace: {line}"
    );
    let etcd_host = wait_for("the child under the warden", Duration::from_secs(5), || {
        children_of(warden_host)
            .into_iter()
            .find(|c| c.2 == "sleep" || c.2 == "sh")
            .map(|c| c.0)
    });
    assert_orphan_adopted_and_reaped(&w, warden_host, etcd_host);

    // unshare does not forward signals: signal the warden (PID 1 inside) by its host pid.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(warden_host), Signal::SIGTERM).unwrap();
    // `sleep` dies of SIGTERM: the warden exits 128 + 15, and unshare passes that on.
    assert_eq!(w.wait_exit(Duration::from_secs(10)), 143);
}

#[test]
fn as_subreaper_outside_a_namespace_reaps_orphans() {
    let ip = unique_ip();
    let mut w = Warden::start(&ip, &["--stop-timeout", "5s"], &orphan_maker());
    let etcd = wait_for("the child to start", Duration::from_secs(10), || w.etcd_pid());
    assert_eq!(w.status()["warden"]["role"], "subreaper");
    assert_orphan_adopted_and_reaped(&w, w.pid(), etcd);
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_exit(Duration::from_secs(10)), 143);
}

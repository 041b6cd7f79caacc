//! systemd's notify protocol against a real datagram socket, and the environment etcd receives.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

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

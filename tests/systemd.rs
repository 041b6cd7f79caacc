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

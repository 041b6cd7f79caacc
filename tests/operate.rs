//! Operating the warden (part 5): signals as a control interface, the admin socket and `ctl`, and
//! the refusal of state-changing requests over TCP without the bearer token.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);

/// One HTTP/1.0 request with extra header lines; `(status, body)`.
fn request(addr: &str, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the warden");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let status = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        buf.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default(),
    )
}

#[test]
fn admin_socket_ctl_and_tcp_token() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef0123456789abcdef\n").unwrap();
    let socket_s = socket.display().to_string();
    let token_s = token_file.display().to_string();
    let (w, _) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &[
            "--admin-socket",
            &socket_s,
            "--admin-token-file",
            &token_s,
            "--delta-snapshot-period",
            "1h",
        ],
    );
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the admin socket must be 0600"
    );

    let (code, out, err) = ctl(&socket, &["status"]);
    assert_eq!(code, 0, "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).expect("ctl status prints JSON");
    assert_eq!(s["ready"], true, "{s}");

    let fulls = s["backup"]["fulls_total"].as_u64().unwrap();
    let (code, out, err) = ctl(&socket, &["snapshot", "full", "--wait", "--timeout", "30s"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stored: v1/full/full-"), "{out}");
    assert_eq!(w.status()["backup"]["fulls_total"].as_u64().unwrap(), fulls + 1);

    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "via-ctl", "1"]).unwrap();
    let (code, out, err) = ctl(&socket, &["snapshot", "delta", "--wait", "--timeout", "30s"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stored: v1/delta/"), "{out}");

    // Over TCP: refused without the token, accepted with it.
    let path = "/snapshot/full";
    let (code, body) = request(&w.http, "POST", path, &[]);
    assert_eq!(code, 401, "{body}");
    let (code, body) = request(
        &w.http,
        "POST",
        path,
        &["Authorization: Bearer wrong-token-wrong-token"],
    );
    assert_eq!(code, 403, "{body}");
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    assert_eq!(
        request(
            &w.http,
            "POST",
            path,
            &["Authorization: Bearer 0123456789abcdef0123456789abcdef"]
        )
        .0,
        202
    );
    wait_for(
        "the full snapshot requested over TCP with the token",
        START,
        || (w.status()["backup"]["fulls_total"].as_u64().unwrap() > fulls).then_some(()),
    );
    for (method, path) in [
        ("DELETE", "/snapshot/full"),
        ("POST", "/restore"),
        ("POST", "/kill"),
    ] {
        let (code, _) = request(
            &w.http,
            method,
            path,
            &["Authorization: Bearer 0123456789abcdef0123456789abcdef"],
        );
        assert!(code == 404 || code == 405, "{method} {path} answered {code}");
    }
    drop(w);
}

#[test]
fn tcp_refuses_state_changes_without_a_token_file_and_a_foreign_path_is_never_taken() {
    let etcd = etcd34();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    for headers in [&[][..], &["Authorization: Bearer anything-at-all-0000"][..]] {
        let (code, body) = request(&w.http, "POST", "/snapshot/full", headers);
        assert_eq!(code, 403, "{body}");
        assert!(body.contains("admin socket"), "{body}");
    }
    assert_eq!(w.status()["backup"]["fulls_total"].as_u64().unwrap(), fulls);
    drop(w);

    // --admin-socket naming a regular file: exit 64, the file untouched, etcd never started.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let out = Command::new(WARDEN)
        .args([
            "run",
            "--listen",
            &format!("{}:2378", unique_ip()),
            "--admin-socket",
        ])
        .arg(&file)
        .arg("--")
        .arg(&etcd)
        .arg("--data-dir")
        .arg(dir.path().join("other-data"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    assert!(!dir.path().join("other-data").exists());
    let (code, _, err) = ctl(&dir.path().join("nobody.sock"), &["status"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("is the warden running with --admin-socket?"),
        "{err}"
    );
}

#[test]
fn sigusr2_flushes_a_delta_now() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = warden_with_file_store(&etcd, &ip, dir.path(), &["--delta-snapshot-period", "1h"]);
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "flush-me", "1"]).unwrap();
    let rev = etcd_revision(&etcdctl_for(&etcd), &ip);
    wait_for("the put in the delta buffer", START, || {
        (w.status()["backup"]["pending_delta_events"].as_u64() >= Some(1)).then_some(())
    });
    assert_eq!(w.status()["backup"]["deltas_total"], 0);
    w.signal(Signal::SIGUSR2);
    wait_for("a delta after SIGUSR2", START, || {
        let s = w.status();
        (s["backup"]["deltas_total"] == 1 && s["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
}

#[test]
fn scheduled_defrag_under_load_keeps_readiness() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    // Health checks that give up after 100 ms would fail during a defrag of this DB.
    let (w, _) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &[
            "--defrag-schedule",
            "*/3 * * * * *",
            "--health-interval",
            "50ms",
            "--health-timeout",
            "100ms",
        ],
    );
    // ~150 MiB of history for the defrag to copy.
    rt().block_on(async {
        let mut c = pki::connect(&ip, None).await.unwrap();
        let big = "x".repeat(1 << 20);
        for i in 0..150 {
            c.put(format!("big{}", i % 10), big.as_str(), None).await.unwrap();
        }
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, ctl, ip) = (stop.clone(), ctl.clone(), ip.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                etcdctl(&ctl, &ip, &["put", &format!("w{n}"), "x"]).expect("a write during the defrags");
                n += 1;
            }
            n
        })
    };
    let before = w.status()["backup"]["defrags_total"].as_u64().unwrap();
    let mut polls = 0;
    let s = wait_for("three scheduled defrags", Duration::from_secs(40), || {
        let (code, body) = w.get("/readyz").unwrap();
        assert_eq!(code, 200, "readiness dropped during a defrag: {body}");
        polls += 1;
        let s = w.status();
        (s["backup"]["defrags_total"].as_u64().unwrap() >= before + 3).then_some(s)
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.join().unwrap();
    let d = &s["backup"]["last_defrag"];
    eprintln!("defrag: {d}, {polls} readiness polls, {writes} writes");
    assert!(writes > 10, "writes did not progress: {writes}");
    assert!(
        d["duration_seconds"].as_f64().unwrap() > 0.1,
        "the defrag must outlast the 100 ms health timeout for this test to mean anything: {d}"
    );
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(metrics.contains("etcd_warden_defrags_total"), "{metrics}");
}

/// Every metric's name, type, help and labels, with values redacted.
fn redact(exposition: &str) -> String {
    let mut out = Vec::new();
    for line in exposition.lines() {
        if line.starts_with('#') {
            out.push(line.to_owned());
            continue;
        }
        let series = match line.rfind('}') {
            Some(i) => &line[..=i],
            None => line.split_whitespace().next().unwrap_or(""),
        };
        out.push(format!("{series} <value>"));
    }
    out.join("\n") + "\n"
}

#[test]
fn metrics_exposition_matches_the_golden_file() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dns = common::dns::DnsServer::start(&ip);
    dns.set_owner("owner.test", "me");
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &[
            "--owner-name",
            "owner.test",
            "--owner-id",
            "me",
            "--owner-check-resolver",
            &dns.addr,
        ],
    );
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "k", "v"]).unwrap();
    wait_for("a delta", START, || {
        (w.status()["backup"]["deltas_total"].as_u64() >= Some(1)).then_some(())
    });
    let (code, metrics) = w.get("/metrics").unwrap();
    assert_eq!(code, 200);
    let got = redact(&metrics);
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/metrics.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, &got).unwrap();
    }
    let want =
        std::fs::read_to_string(&golden).expect("tests/golden/metrics.txt (UPDATE_GOLDEN=1 writes it)");
    assert_eq!(
        got, want,
        "the exposition changed; review it and run with UPDATE_GOLDEN=1 to accept"
    );
}

#[test]
fn sighup_rereads_the_config_file_and_keeps_the_old_one_when_the_new_is_invalid() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("warden.toml");
    std::fs::write(&config, "delta-snapshot-period = \"1h\"\n").unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let w = Warden::start(
        &ip,
        &["--config", config.to_str().unwrap(), "--store", &store],
        &argv,
    );
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "k1", "1"]).unwrap();
    wait_for("the put buffered", START, || {
        (w.status()["backup"]["pending_delta_events"].as_u64() >= Some(1)).then_some(())
    });

    // An invalid file: logged, the old settings stay, nothing else changes.
    std::fs::write(&config, "delta-snapshot-period = \"soon\"\n").unwrap();
    w.signal(Signal::SIGHUP);
    wait_for("the rejection in the log", START, || {
        w.log_text()
            .contains("the configuration is invalid; keeping the one in force")
            .then_some(())
    });
    assert_eq!(w.get("/readyz").unwrap().0, 200);

    // A valid one: the new delta period applies without a restart.
    std::fs::write(&config, "delta-snapshot-period = \"200ms\"\n").unwrap();
    w.signal(Signal::SIGHUP);
    wait_for("a delta under the reloaded period", START, || {
        (w.status()["backup"]["deltas_total"].as_u64() >= Some(1)).then_some(())
    });
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "k2", "2"]).unwrap();
    wait_for("a second delta without any signal", START, || {
        (w.status()["backup"]["deltas_total"].as_u64() >= Some(2)).then_some(())
    });
    assert_eq!(w.status()["etcd"]["restarts"], 0);
}

#[test]
fn snapshot_and_restore_show_progress_on_a_terminal() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let plain = PlainEtcd::start(&etcd, &ip, &data, "m1");
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "k", "v"]).unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    // `script` gives the command a pseudo-terminal, as an operator's shell would.
    let on_tty = |cmd: String| {
        let out = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{cmd}: {text}");
        text
    };
    let text = on_tty(format!(
        "{WARDEN} snapshot --store {store} {}",
        pki::warden_flags(&ip).join(" ")
    ));
    assert!(text.contains("full snapshot at revision"), "{text}");
    assert!(text.contains("(100%)") && text.contains("/s"), "{text}");
    plain.stop();
    let text = on_tty(format!(
        "{WARDEN} restore --store {store} --data-dir {} --name m1 --etcd {}",
        dir.path().join("restored").display(),
        etcd.display()
    ));
    assert!(
        text.contains("downloading v1/full/") && text.contains("ETA"),
        "{text}"
    );
}

/// Full snapshot requests coalesce (docs/operations.md: "one running, at most one more pending"), driven
/// through the admin socket with `ctl snapshot full`: one request while a full of ~32 MiB is
/// running is queued, every further one answers `coalesced`, exactly two fulls result and no third
/// follows; the store's own objects show the second started only after the first was complete.
#[test]
fn full_snapshot_requests_over_the_admin_socket_coalesce_one_running_one_pending() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let store_dir = dir.path().join("store");
    let (w, _) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &[
            "--admin-socket",
            socket.to_str().unwrap(),
            "--full-snapshot-schedule",
            "0 0 1 1 *",
        ],
    );
    // Values that do not compress: each full streams ~32 MiB through etcd's sha256 check.
    rt().block_on(async {
        let mut c = pki::connect(&ip, None).await.unwrap();
        for i in 0..32u32 {
            let v: Vec<u8> = (0..1024 * 1024u32)
                .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 13) as u8)
                .collect();
            c.put(format!("big{i}"), v, None).await.unwrap();
        }
    });
    let before = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    let request = || {
        let (code, out, err) = ctl(&socket, &["snapshot", "full"]);
        assert_eq!(code, 0, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("ctl prints the answer");
        assert_eq!(v["requested"], "full", "{v}");
        v["coalesced"].as_bool().expect("coalesced")
    };
    assert!(!request(), "the first request was coalesced with nothing running");
    wait_for("the requested full to be running", START, || {
        let s = w.status();
        assert_eq!(
            s["backup"]["fulls_total"].as_u64(),
            Some(before),
            "the full finished before it was seen running (too small to test coalescing): {s}"
        );
        s["backup"]["in_progress"].is_string().then_some(())
    });
    // While it runs: the next request waits, the rest have nothing to add.
    let answers: Vec<bool> = (0..4).map(|_| request()).collect();
    let s = w.status();
    assert!(
        s["backup"]["in_progress"].is_string() && s["backup"]["fulls_total"].as_u64() == Some(before),
        "the first full ended while the requests were sent; they prove nothing: {s}"
    );
    assert_eq!(
        answers,
        [false, true, true, true],
        "one pending request at most while a full runs"
    );
    wait_for("the pending full to complete", Duration::from_secs(60), || {
        let s = w.status();
        (s["backup"]["fulls_total"].as_u64() == Some(before + 2) && s["backup"]["in_progress"].is_null())
            .then_some(())
    });
    eprintln!(
        "the second full took {} s",
        w.status()["backup"]["last_full"]["duration_seconds"]
    );
    // And nothing more comes of the coalesced ones: sampled for 2 s.
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(2) {
        let s = w.status();
        assert_eq!(s["backup"]["fulls_total"].as_u64(), Some(before + 2), "{s}");
        assert!(s["backup"]["in_progress"].is_null(), "a third full: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Never two at once, in the store: a full's name carries the time it started, its file was
    // completed (renamed into place) when it ended.
    let mut fulls: Vec<(u64, std::time::SystemTime)> = std::fs::read_dir(store_dir.join("v1/full"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let started = etcd_warden::store::layout::SnapshotName::parse(&format!("v1/full/{name}"))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .created_ms;
            (started, e.metadata().unwrap().modified().unwrap())
        })
        .collect();
    fulls.sort();
    assert_eq!(fulls.len() as u64, before + 2, "{fulls:?}");
    for pair in fulls.windows(2) {
        let ended = pair[0]
            .1
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            pair[1].0 >= ended,
            "a full started at {} ms before the previous one was complete at {ended} ms",
            pair[1].0
        );
    }
}

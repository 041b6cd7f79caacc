//! Fault injection with real processes (part 6), each bounded in time: the warden SIGKILLed in the
//! middle of uploads, etcd SIGKILLed again and again under writes, the data dir's filesystem full,
//! the store down under load. What must hold: no partial object is ever visible, every listed
//! backup restores, no acknowledged write is lost, readiness never drops for a backup problem.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::stores::*;
use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);

fn argv(etcd: &std::path::Path, ip: &str, data: &std::path::Path) -> Vec<String> {
    let mut v = vec![etcd.display().to_string()];
    v.extend(etcd_args(ip, data));
    v
}

fn verify_store(store: &str, envs: &[(&str, String)]) -> String {
    let out = Command::new(WARDEN)
        .args(["backups", "verify", "--store", store])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "backups verify failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn warden_sigkilled_mid_upload_20_times_leaves_no_partial_object_and_every_backup_restores() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "backups");
    let env = s3_env(&moto.endpoint);
    let store = "s3://backups/kill";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // ~24 MiB of values that do not compress, so each full upload takes a while.
    {
        let plain = PlainEtcd::start(&etcd, &ip, &data, "m1");
        rt().block_on(async {
            let mut c = pki::connect(&ip, None).await.unwrap();
            for i in 0..48u32 {
                let v: Vec<u8> = (0..512 * 1024u32)
                    .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 13) as u8)
                    .collect();
                c.put(format!("big{i}"), v, None).await.unwrap();
            }
        });
        plain.stop();
    }
    let mut killed_uploading = 0;
    for round in 0..20u64 {
        let mut w = Warden::builder(&ip, &["--store", store], &argv(&etcd, &ip, &data))
            .envs(&env)
            .spawn();
        w.wait_ready(START);
        w.signal(Signal::SIGUSR1);
        // Kill at a different point of the upload each round.
        let delay = Duration::from_millis(40 * (round % 10));
        let t = Instant::now();
        wait_for("the snapshot to start", START, || {
            let s = w.status();
            (s["backup"]["in_progress"].is_string() || t.elapsed() >= delay).then_some(())
        });
        std::thread::sleep(delay.saturating_sub(t.elapsed()));
        if w.status()["backup"]["in_progress"].is_string() {
            killed_uploading += 1;
        }
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(w.pid()), Signal::SIGKILL);
        w.wait_exit(Duration::from_secs(10));
        wait_for("etcd to die with the warden", Duration::from_secs(10), || {
            port_free(&ip).then_some(())
        });
    }
    assert!(
        killed_uploading >= 5,
        "only {killed_uploading} kills landed during an upload"
    );
    // Not one of those uploads may be visible: all were cut short.
    let report = verify_store(store, &env);
    assert!(
        report.starts_with("0 objects"),
        "a partial upload became visible:\n{report}"
    );
    // One warden that lives long enough to complete a full snapshot, then dies the same way
    // during the next one.
    let w = Warden::builder(&ip, &["--store", store], &argv(&etcd, &ip, &data))
        .envs(&env)
        .spawn();
    w.wait_ready(START);
    wait_for("a complete full snapshot", Duration::from_secs(60), || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    w.signal(Signal::SIGUSR1);
    drop(w);
    // Everything listed verifies (no partial object under a snapshot name), and restores.
    let report = verify_store(store, &env);
    assert!(
        report.contains(", 0 problems") && !report.starts_with("0 objects"),
        "{report}"
    );
    let (keys, _) = keys_after_restore(&etcd, store, &env, "big");
    assert_eq!(keys.len(), 48, "{keys:?}");
}

fn port_free(ip: &str) -> bool {
    std::net::TcpStream::connect_timeout(&format!("{ip}:2379").parse().unwrap(), Duration::from_millis(200))
        .is_err()
}

#[test]
fn etcd_sigkilled_50_times_under_writes_is_respawned_and_loses_no_acknowledged_write() {
    // etcd 3.4: etcd 3.5.0–3.5.2 can lose acknowledged writes when SIGKILLed under load (its
    // consistent index could be persisted ahead of the data; etcd-io/etcd#13766, fixed in 3.5.3).
    // This suite caught 3.5.1 losing one write in 1 540 after 50 kills. The warden cannot repair
    // that; run etcd 3.4 or ≥ 3.5.3.
    let etcd = etcd34();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &["--restart-backoff-min", "10ms", "--restart-backoff-max", "100ms"],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), true);
    let mut last = w.etcd_pid().unwrap();
    for n in 0..50 {
        // Ready means etcd answered a linearizable read: it serves the writer again.
        wait_for(&format!("etcd serving between kills ({n})"), START, || {
            w.get("/readyz").is_some_and(|(c, _)| c == 200).then_some(())
        });
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(last), Signal::SIGKILL).unwrap();
        last = wait_for(&format!("respawn {n}"), START, || {
            w.etcd_pid().filter(|p| *p != last)
        });
    }
    w.wait_ready(START);
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    assert!(acked.len() > 50, "only {} writes acknowledged", acked.len());
    let s = w.status();
    assert!(s["etcd"]["restarts"].as_u64().unwrap() >= 50, "{s}");
    // In the live etcd …
    assert_none_lost(&acked, &live_keys(&etcd, &ip, "k"), "live etcd after 50 SIGKILLs");
    // … and in the store, once the last delta is flushed.
    w.signal(Signal::SIGUSR2);
    let rev = etcd_revision(&etcdctl_for(&etcd), &ip);
    wait_for("the store to catch up", START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    drop(w);
    verify_store(&store, &[]);
    let (restored, _) = keys_after_restore(&etcd, &store, &[], "k");
    assert_none_lost(&acked, &restored, "restore after 50 SIGKILLs");
}

#[test]
fn data_dir_filesystem_full_gives_clear_errors_and_loses_no_acknowledged_write() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    // etcd's certificates outside the tmpfs the data dir gets.
    pki::make(&ip, dir.path());
    let store = format!("file://{}", dir.path().join("store").display());
    // The warden and etcd run in their own mount namespace, with the data dir on a 256 MiB tmpfs
    // (etcd preallocates 64 MiB of WAL) and a 96 MiB ballast file the test removes later: enough
    // room for a restarted etcd's next WAL segment and the 4 MiB readiness wants free.
    let script = format!(
        "mount -t tmpfs -o size=256m tmpfs {m} && dd if=/dev/zero of={m}/ballast bs=1M count=96 status=none && exec \"$@\"",
        m = mnt.display()
    );
    let b = Warden::builder_with(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ],
        &ip,
        &[
            "--store",
            &store,
            "--delta-snapshot-period",
            "200ms",
            "--restart-backoff-min",
            "100ms",
        ],
        &argv(&etcd, &ip, &mnt.join("data")),
    );
    let w = b.spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    // Fill the disk with 256 KiB values until etcd can no longer write.
    let mut acked = Vec::new();
    rt().block_on(async {
        let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(3));
        let mut c = pki::connect(&ip, Some(opts)).await.unwrap();
        let v = vec![b'x'; 256 * 1024];
        for i in 0..1000 {
            let k = format!("k{i:06}");
            match c.put(k.as_str(), v.clone(), None).await {
                Ok(_) => acked.push(k),
                Err(_) => break,
            }
        }
    });
    assert!(acked.len() < 1000, "the 256 MiB filesystem never filled up");
    wait_for("readiness to drop with the disk full", START, || {
        w.get("/readyz").filter(|(c, _)| *c == 503)
    });
    // While the disk stays full, readiness stays 503 with a reason (no flapping back to ready
    // between etcd's restarts), and the warden itself stays live: sampled for 3 s.
    let full_since = Instant::now();
    let mut samples = 0;
    let mut reasons = std::collections::BTreeSet::new();
    while full_since.elapsed() < Duration::from_secs(3) {
        let (code, reason) = w.get("/readyz").expect("the warden answers with the disk full");
        assert_eq!(code, 503, "ready again with the disk still full: {reason}");
        assert!(
            !reason.trim().is_empty() && reason.trim() != "ready",
            "the 503 gives no reason: {reason:?}"
        );
        reasons.insert(reason.trim().to_owned());
        assert_eq!(
            w.get("/livez").unwrap().0,
            200,
            "the warden itself must stay alive"
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(samples >= 5, "only {samples} readiness samples in 3 s");
    eprintln!("readiness reasons with the disk full: {reasons:?}");
    let log = w.log_text();
    assert!(
        log.contains("no space left on device"),
        "the log must say why: {}",
        &log[log.len().saturating_sub(3000)..]
    );
    // Free space: etcd comes back by itself (the warden keeps restarting it) with every
    // acknowledged write, and the store catches up.
    let out = Command::new("nsenter")
        .args(["-t", &w.pid().to_string(), "-m", "rm"])
        .arg(mnt.join("ballast"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    w.wait_ready(Duration::from_secs(60));
    let ctl = etcdctl_for(&etcd);
    assert_none_lost(
        &acked,
        &live_keys(&etcd, &ip, "k"),
        "etcd after the disk filled up and space came back",
    );
    let rev = etcd_revision(&ctl, &ip);
    w.signal(Signal::SIGUSR2);
    wait_for("the store to catch up", START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    // Last, the filesystem filled by another process while etcd idles: an etcd on a full disk can
    // still answer reads (its WAL is preallocated), but not write; readiness says the disk is full.
    let in_ns = |cmd: &str| {
        let out = Command::new("nsenter")
            .args(["-t", &w.pid().to_string(), "-m", "sh", "-c", cmd])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    in_ns(&format!(
        "dd if=/dev/zero of={}/filler bs=1M status=none 2>/dev/null; true",
        mnt.display()
    ));
    wait_for(
        "readiness to say the data dir's filesystem is full",
        START,
        || {
            w.get("/readyz")
                .filter(|(c, r)| *c == 503 && r.contains("filesystem is full"))
        },
    );
    in_ns(&format!("rm {}/filler", mnt.display()));
    drop(w);
    let report = verify_store(&store, &[]);
    assert!(report.contains(", 0 problems"), "{report}");
    let (restored, _) = keys_after_restore(&etcd, &store, &[], "k");
    assert_none_lost(&acked, &restored, "store after the disk filled up");
}

#[test]
fn store_down_30s_under_load_never_drops_readiness_and_leaves_no_gap() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let (_moto, mut proxy, env) = moto_behind_proxy(&ip);
    let store = "s3://backups/outage";
    let dir = tempfile::tempdir().unwrap();
    // No scheduled full during the test (one at the hour would be a legal second full).
    let w = Warden::builder(
        &ip,
        &[
            "--store",
            store,
            "--delta-snapshot-period",
            "500ms",
            "--full-snapshot-schedule",
            "0 0 1 1 *",
        ],
        &argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    wait_for("backups healthy", START, || {
        (w.status()["backup"]["healthy"] == true).then_some(())
    });
    let before = w.status();
    let base = before["backup"]["chain_base"].as_i64().expect("a chain base");
    assert_eq!(before["backup"]["fulls_total"], 1, "{before}");
    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), false);
    proxy.cut();
    let outage = Instant::now();
    let mut polls = 0;
    // Scaled down from 10 minutes for CI: 30 s of outage under continuous writes.
    while outage.elapsed() < Duration::from_secs(30) {
        let (code, body) = w.get("/readyz").unwrap();
        assert_eq!(code, 200, "readiness dropped during the store outage: {body}");
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = w.status();
    assert_eq!(s["backup"]["healthy"], false, "{s}");
    proxy.restore();
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let rev = etcd_revision(&etcdctl_for(&etcd), &ip);
    wait_for(
        "the store to catch up after the outage",
        Duration::from_secs(90),
        || {
            let s = w.status();
            (s["backup"]["healthy"] == true && s["backup"]["backed_up_revision"].as_i64() >= Some(rev))
                .then_some(())
        },
    );
    assert!(
        polls > 200 && acked.len() > 100,
        "polls {polls}, writes {}",
        acked.len()
    );
    // The outage is bridged by the same chain: no new full, the same base.
    let s = w.status();
    assert_eq!(
        s["backup"]["fulls_total"], 1,
        "a full snapshot after the outage: {s}"
    );
    assert_eq!(s["backup"]["chain_base"], base, "the chain was abandoned: {s}");
    drop(w);
    assert_one_chain(store, &env, base, rev, "store after a 30 s outage");
    let report = verify_store(store, &env);
    assert!(
        report.contains("0 problems"),
        "a gap or a bad object after the outage:\n{report}"
    );
    let (restored, _) = keys_after_restore(&etcd, store, &env, "k");
    assert_none_lost(&acked, &restored, "restore after the outage");
}

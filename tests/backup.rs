//! Continuous backups against real etcd 3.4/3.5 and real stores (local files, moto's S3, azurite):
//! full + delta chains, restore of the full snapshot with etcdutl/etcdctl, lease records, a store
//! outage under write load with readiness held, a compacted watch, SIGTERM flushing the delta.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::stores::*;
use common::*;
use etcd_warden::format::delta_codec::Record;
use etcd_warden::snapshot::verify::{read_delta, read_full_to_file};
use etcd_warden::store::{Store, StoreUrl};
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);

fn etcd_argv(etcd: &Path, ip: &str, data: &Path) -> Vec<String> {
    let mut v = vec![etcd.display().to_string()];
    v.extend(etcd_args(ip, data));
    v
}

fn backed_up(w: &Warden) -> i64 {
    w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0)
}

fn wait_backed_up(w: &Warden, rev: i64, timeout: Duration) {
    wait_for(&format!("revision {rev} to be in the store"), timeout, || {
        (backed_up(w) >= rev).then_some(())
    });
}

fn warden_cli(args: &[&str], env: &[(&str, String)]) -> (i32, String) {
    let mut c = Command::new(WARDEN);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Full + deltas to a file store; the full snapshot restores with etcd's own tool; deltas carry
/// every revision and the lease of a leased key.
fn file_store_round_trip(etcd: &Path, v35: bool) {
    let ctl = etcdctl_for(etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store_url = format!("file://{}", store_dir.display());
    let mut w = Warden::start(
        &ip,
        &["--store", &store_url, "--delta-snapshot-period", "300ms"],
        &etcd_argv(etcd, &ip, &dir.path().join("data")),
    );
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });

    let lease_out = etcdctl(&ctl, &ip, &["lease", "grant", "600"]).unwrap();
    let lease_id = lease_out.split_whitespace().nth(1).unwrap().to_owned();
    etcdctl(&ctl, &ip, &["put", "leased", "v", &format!("--lease={lease_id}")]).unwrap();
    for i in 0..20 {
        etcdctl(&ctl, &ip, &["put", &format!("k{i:02}"), &format!("value-{i}")]).unwrap();
    }
    etcdctl(&ctl, &ip, &["del", "k00"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_backed_up(&w, rev, Duration::from_secs(20));

    // SIGUSR1: a full snapshot now (its coalescing is tested through the admin socket in
    // tests/operate.rs, where a full runs long enough to send requests during it).
    let before = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    w.signal(Signal::SIGUSR1);
    wait_for("the full snapshot SIGUSR1 asked for", START, || {
        let s = w.status();
        (s["backup"]["fulls_total"].as_u64().unwrap() > before
            && s["backup"]["last_full"]["revision"].as_i64() >= Some(rev))
        .then_some(())
    });
    let status = w.status();
    assert_eq!(status["backup"]["healthy"], true, "{status}");
    assert!(status["backup"]["seconds_since_last_success"].as_f64().unwrap() < 30.0);
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_snapshots_total{kind=\"delta\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("etcd_warden_backup_healthy 1"), "{metrics}");

    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    let (code, out) = warden_cli(&["backups", "verify", "--store", &store_url], &[]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = warden_cli(&["backups", "list", "--store", &store_url, "--json"], &[]);
    assert_eq!(code, 0, "{out}");

    let rt = rt();
    let store = Store::open(&StoreUrl::File {
        path: store_dir.clone(),
    })
    .unwrap();
    let fulls = rt.block_on(store.list_fulls()).unwrap();
    let (first_full, _) = fulls.first().unwrap();
    let (newest, _) = fulls.last().unwrap();
    assert!(
        newest.last_revision() >= rev,
        "newest full {} < {rev}",
        newest.last_revision()
    );

    // The first chain holds every revision after its full, the lease record before the leased put.
    let names: Vec<_> = fulls.iter().map(|(n, _)| *n).collect();
    let chain = rt.block_on(store.list_chain(first_full, &names)).unwrap();
    assert!(!chain.is_empty(), "no deltas after the first full snapshot");
    let mut records = Vec::new();
    for (n, _) in &chain {
        records.extend(rt.block_on(read_delta(&store, n)).unwrap());
    }
    let id = i64::from_str_radix(&lease_id, 16).unwrap();
    let lease_pos = records
        .iter()
        .position(|r| matches!(r, Record::Lease(l) if l.id == id && l.granted_ttl == 600))
        .expect("lease record with the granted TTL");
    let put_pos = records
        .iter()
        .position(|r| matches!(r, Record::Revision(rv) if rv.events.iter().any(|e| e.key == b"leased" && e.lease == id)))
        .expect("the leased put");
    assert!(lease_pos < put_pos, "lease record must precede its first put");
    let revs: Vec<i64> = records
        .iter()
        .filter_map(|r| {
            if let Record::Revision(rv) = r {
                Some(rv.revision)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(revs.first(), Some(&(first_full.last_revision() + 1)));
    assert!(
        revs.windows(2).all(|p| p[1] == p[0] + 1),
        "revisions not contiguous: {revs:?}"
    );

    // The newest full snapshot restores with etcd's own tool and holds every key.
    let db = dir.path().join("snap.db");
    rt.block_on(read_full_to_file(&store, newest, &db, &Default::default()))
        .unwrap();
    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let peer = format!("r1=https://{ip2}:2380");
    // etcd's own restore tool: etcdutl for 3.5, etcdctl (API v3) for 3.4.
    let mut tool = if v35 {
        Command::new(etcd.with_file_name("etcdutl"))
    } else {
        Command::new(&ctl)
    };
    let out = tool
        .env("ETCDCTL_API", "3")
        .args([
            "snapshot",
            "restore",
            db.to_str().unwrap(),
            "--data-dir",
            restored.to_str().unwrap(),
        ])
        .args(["--name", "r1", "--initial-cluster", &peer])
        .args(["--initial-advertise-peer-urls", &format!("https://{ip2}:2380")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = PlainEtcd::start(etcd, &ip2, &restored, "r1");
    let keys = etcdctl(&ctl, &ip2, &["get", "k", "--prefix", "--keys-only"]).unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 19, "{keys:?}");
    assert!(!keys.contains(&"k00"), "deleted key came back");
    assert_eq!(
        etcdctl(&ctl, &ip2, &["get", "k07", "--print-value-only"])
            .unwrap()
            .trim(),
        "value-7"
    );
    assert!(
        etcd_revision(&ctl, &ip2) >= newest.last_revision(),
        "the snapshot holds less than its name claims"
    );
    drop(plain);
}

#[test]
fn etcd_3_5_full_and_deltas_to_files_restore_with_etcdutl() {
    file_store_round_trip(&etcd35(), true);
}

#[test]
fn etcd_3_4_full_and_deltas_to_files_restore_with_etcdctl() {
    file_store_round_trip(&etcd34(), false);
}

#[test]
fn etcd_3_6_full_and_deltas_to_files_restore_with_etcdutl() {
    file_store_round_trip(&etcd36(), true);
}

#[test]
fn etcd_3_7_full_and_deltas_to_files_restore_with_etcdutl() {
    file_store_round_trip(&etcd37(), true);
}

#[test]
fn store_outage_under_writes_never_touches_readiness_and_backups_resume() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let (_moto, mut proxy, env) = moto_behind_proxy(&ip);
    let dir = tempfile::tempdir().unwrap();
    let store = "s3://backups/etcd/main";
    // No scheduled full during the test (one at the hour would be a legal second full).
    let mut w = Warden::builder(
        &ip,
        &[
            "--store",
            store,
            "--delta-snapshot-period",
            "500ms",
            "--full-snapshot-schedule",
            "0 0 1 1 *",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    wait_for("backups to be healthy", START, || {
        (w.status()["backup"]["healthy"] == true).then_some(())
    });
    let before = w.status();
    let base = before["backup"]["chain_base"].as_i64().expect("a chain base");
    assert_eq!(before["backup"]["fulls_total"], 1, "{before}");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, ctl, ip) = (stop.clone(), ctl.clone(), ip.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                etcdctl(&ctl, &ip, &["put", &format!("w{n}"), "x"]).expect("write during the outage");
                n += 1;
            }
            n
        })
    };
    let unready = Arc::new(std::sync::Mutex::new(Vec::new()));
    let monitor = {
        let (stop, unready, http) = (stop.clone(), unready.clone(), w.http.clone());
        std::thread::spawn(move || {
            let mut checks = 0;
            while !stop.load(Ordering::SeqCst) {
                match http_get(&http, "/readyz") {
                    Some((200, _)) => {}
                    other => unready.lock().unwrap().push(format!("{other:?}")),
                }
                checks += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            checks
        })
    };

    std::thread::sleep(Duration::from_secs(1)); // some deltas under load before the cut
    proxy.cut();
    let t = std::time::Instant::now();
    let status = wait_for("the outage to show in /status", Duration::from_secs(20), || {
        let s = w.status();
        (s["backup"]["healthy"] == false).then_some(s)
    });
    let shown_after = t.elapsed();
    assert!(
        status["backup"]["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{status}"
    );
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_backup_failures_total{kind=\"delta\""),
        "{metrics}"
    );
    assert!(metrics.contains("etcd_warden_backup_healthy 0"), "{metrics}");
    std::thread::sleep(Duration::from_secs(3));
    proxy.restore();
    wait_for(
        "backups to recover by themselves",
        Duration::from_secs(60),
        || (w.status()["backup"]["healthy"] == true).then_some(()),
    );
    stop.store(true, Ordering::SeqCst);
    let writes = writer.join().unwrap();
    let checks = monitor.join().unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_backed_up(&w, rev, Duration::from_secs(60));
    let unready = unready.lock().unwrap().clone();
    assert!(
        unready.is_empty(),
        "readiness dropped during the store outage: {unready:?}"
    );
    assert!(
        writes > 20 && checks > 30,
        "too little load: {writes} writes, {checks} readiness checks"
    );
    eprintln!(
        "outage visible in /status after {shown_after:?}; {writes} writes, {checks} readiness checks, all 200"
    );

    // The outage is bridged by the same chain: no new full, the same base.
    let s = w.status();
    assert_eq!(
        s["backup"]["fulls_total"], 1,
        "a full snapshot after the outage: {s}"
    );
    assert_eq!(s["backup"]["chain_base"], base, "the chain was abandoned: {s}");
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    assert_one_chain(store, &env, base, rev, "store after the outage");
    let (code, out) = warden_cli(&["backups", "verify", "--store", store], &env);
    assert_eq!(code, 0, "chain broken after the outage:\n{out}");
}

#[test]
fn compacted_watch_start_falls_back_to_a_full_snapshot() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store_url = format!("file://{}", dir.path().join("store").display());
    let opts = ["--store", store_url.as_str(), "--delta-snapshot-period", "300ms"];
    let mut w = Warden::start(&ip, &opts, &etcd_argv(&etcd, &ip, &data));
    w.wait_ready(START);
    etcdctl(&ctl, &ip, &["put", "a", "1"]).unwrap();
    wait_backed_up(&w, etcd_revision(&ctl, &ip), Duration::from_secs(20));
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    // Without the warden: more writes, then compaction past what the chain holds.
    let plain = PlainEtcd::start(&etcd, &ip, &data, "m1");
    for i in 0..5 {
        etcdctl(&ctl, &ip, &["put", &format!("b{i}"), "2"]).unwrap();
    }
    let rev = etcd_revision(&ctl, &ip);
    etcdctl(&ctl, &ip, &["compact", &rev.to_string()]).unwrap();
    plain.stop();

    let mut w = Warden::start(&ip, &opts, &etcd_argv(&etcd, &ip, &data));
    w.wait_ready(START);
    let status = wait_for("a full snapshot at or after the compaction", START, || {
        let s = w.status();
        (s["backup"]["last_full"]["revision"].as_i64().unwrap_or(0) >= rev).then_some(s)
    });
    assert_eq!(status["backup"]["healthy"], true, "{status}");
    assert!(
        w.log_text().contains("compacted"),
        "the compaction was not reported:\n{}",
        w.log_text()
    );
    etcdctl(&ctl, &ip, &["put", "c", "3"]).unwrap();
    wait_backed_up(&w, etcd_revision(&ctl, &ip), Duration::from_secs(20));
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let (code, out) = warden_cli(&["backups", "verify", "--store", &store_url], &[]);
    assert_eq!(code, 0, "{out}");
}

/// "A graceful stop loses nothing": with a client writing as fast as it can through the stop, every
/// write etcd acknowledged is in the store once the warden has exited, although the delta period
/// (1 h) never came: the last flush waits for the watch to reach etcd's revision, and what etcd
/// acknowledged after that is read from the stopped data dir and uploaded. 20 times in a row,
/// checked in the store's own objects.
#[test]
fn every_write_acknowledged_until_etcd_stops_is_in_the_store() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}", dir.path().join("store").display());
    let store = Store::open(&StoreUrl::File {
        path: dir.path().join("store"),
    })
    .unwrap();
    let rt = rt();
    for round in 0..20 {
        let mut w = Warden::start(
            &ip,
            &["--store", &store_url, "--delta-snapshot-period", "1h"],
            &etcd_argv(&etcd, &ip, &dir.path().join("data")),
        );
        w.wait_ready(START);
        // The chain is resumed (or started with a full) before the writes, so they are deltas'.
        wait_for("the backup chain to be open", START, || {
            w.status()["backup"]["backed_up_revision"].as_i64()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (ip, stop) = (ip.clone(), stop.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2));
                    let mut c = pki::connect(&ip, Some(opts)).await.unwrap();
                    let mut last = None;
                    for i in 0.. {
                        let key = format!("r{round}-w{i}");
                        match c.put(key.clone(), "x", None).await {
                            Ok(r) => last = Some((key, r.header().unwrap().revision())),
                            Err(_) if stop.load(Ordering::SeqCst) => break,
                            Err(_) => {}
                        }
                    }
                    last
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50 + 10 * round));
        w.signal(Signal::SIGTERM);
        stop.store(true, Ordering::SeqCst);
        w.wait_exit(START);
        let (key, rev) = writer.join().unwrap().expect("at least one write acknowledged");
        let fulls = rt.block_on(store.list_fulls()).unwrap();
        let names: Vec<_> = fulls.iter().map(|(n, _)| *n).collect();
        let newest = fulls.last().unwrap().0;
        let chain = rt.block_on(store.list_chain(&newest, &names)).unwrap();
        let in_store = chain.iter().any(|(n, _)| {
            rt.block_on(read_delta(&store, n)).unwrap().iter().any(|r| {
                matches!(r, Record::Revision(r) if r.revision == rev && r.events.iter().any(|e| e.key == key.as_bytes()))
            })
        });
        assert!(
            in_store,
            "round {round}: {key} (revision {rev}) was acknowledged before etcd stopped and is not in the store"
        );
    }
}

#[test]
fn sigterm_flushes_the_pending_delta_before_stopping_etcd() {
    let etcd = etcd34();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}", dir.path().join("store").display());
    let mut w = Warden::start(
        &ip,
        &["--store", &store_url, "--delta-snapshot-period", "1h"],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    );
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    for i in 0..5 {
        etcdctl(&ctl, &ip, &["put", &format!("late{i}"), "x"]).unwrap();
    }
    let rev = etcd_revision(&ctl, &ip);
    wait_for("the watch to buffer the writes", Duration::from_secs(10), || {
        (w.status()["backup"]["pending_delta_events"].as_u64() >= Some(5)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let rt = rt();
    let store = Store::open(&StoreUrl::File {
        path: dir.path().join("store"),
    })
    .unwrap();
    let fulls = rt.block_on(store.list_fulls()).unwrap();
    let names: Vec<_> = fulls.iter().map(|(n, _)| *n).collect();
    let newest = fulls.last().unwrap().0;
    let base = newest.last_revision();
    let chain = rt.block_on(store.list_chain(&newest, &names)).unwrap();
    let last = chain.last().map(|(n, _)| n.last_revision()).unwrap_or(base);
    assert_eq!(last, rev, "the delta pending at SIGTERM was not flushed");
}

#[test]
fn azure_blob_full_and_deltas_via_azurite() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let az = azurite(&ip, 10000);
    create_container(&az.endpoint, "etcd-backups");
    let env = azure_env(&az.endpoint);
    let store = "az://etcd-backups/cluster-a";
    let dir = tempfile::tempdir().unwrap();
    let mut w = Warden::builder(
        &ip,
        &[
            "--store",
            store,
            "--delta-snapshot-period",
            "300ms",
            "--compression",
            "gzip",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    for i in 0..10 {
        etcdctl(&ctl, &ip, &["put", &format!("az{i}"), "v"]).unwrap();
    }
    wait_backed_up(&w, etcd_revision(&ctl, &ip), Duration::from_secs(30));
    let status = w.status();
    assert!(
        status["backup"]["last_full"]["key"]
            .as_str()
            .unwrap()
            .contains("-gzip-"),
        "{status}"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let (code, out) = warden_cli(&["backups", "verify", "--store", store], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("delta"), "no delta verified:\n{out}");
}

#[test]
fn rotated_store_credentials_are_picked_up_without_a_restart() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let az = azurite(&ip, 10000);
    create_container(&az.endpoint, "rotate");
    let env: Vec<(&str, String)> = azure_env(&az.endpoint)
        .into_iter()
        .filter(|(k, _)| *k != "AZURE_STORAGE_ACCOUNT_KEY")
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds.env");
    let wrong = "d3JvbmctYnV0LXdlbGwtZm9ybWVkLWtleS0xMjM0NTY3ODkw";
    std::fs::write(&creds, format!("AZURE_STORAGE_ACCOUNT_KEY={AZURITE_KEY}\n")).unwrap();
    let mut w = Warden::builder(
        &ip,
        &[
            "--store",
            "az://rotate/x",
            "--store-credentials",
            creds.to_str().unwrap(),
            "--delta-snapshot-period",
            "300ms",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    wait_for("backups with the first key", START, || {
        (w.status()["backup"]["healthy"] == true).then_some(())
    });

    // Rotate to a key the store rejects: backups fail, etcd stays ready.
    std::fs::write(&creds, format!("AZURE_STORAGE_ACCOUNT_KEY={wrong}\n")).unwrap();
    etcdctl(&ctl, &ip, &["put", "during-bad-key", "1"]).unwrap();
    let status = wait_for("the rejected key to fail backups", START, || {
        let s = w.status();
        (s["backup"]["healthy"] == false).then_some(s)
    });
    assert_eq!(
        w.get("/readyz").unwrap().0,
        200,
        "a store failure must not make etcd unready"
    );
    assert!(
        !status.to_string().contains(wrong),
        "a credential leaked into /status"
    );

    // Rotate to the right key again: backups recover without a restart.
    std::fs::write(
        &creds,
        format!("# rotated\nAZURE_STORAGE_ACCOUNT_KEY={AZURITE_KEY}\n"),
    )
    .unwrap();
    wait_for(
        "backups to recover with the rotated key",
        Duration::from_secs(60),
        || (w.status()["backup"]["healthy"] == true).then_some(()),
    );
    etcdctl(&ctl, &ip, &["put", "after-rotation", "1"]).unwrap();
    wait_backed_up(&w, etcd_revision(&ctl, &ip), Duration::from_secs(30));
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let log = w.log_text();
    assert!(
        !log.contains(wrong) && !log.contains(AZURITE_KEY),
        "a credential leaked into the log"
    );
    assert!(
        log.contains("backups recovered") && log.contains("store credentials changed"),
        "{log}"
    );
}

#[test]
fn gcs_store_is_configured_from_the_environment() {
    // No emulator speaks object_store's GCS API; check that the configuration reaches the client:
    // the base URL from GOOGLE_BASE_URL is the one contacted, and no credential discovery happens.
    let ip = unique_ip();
    let env = vec![
        ("GOOGLE_BASE_URL", format!("http://{ip}:9")),
        ("GOOGLE_SKIP_SIGNATURE", "true".to_owned()),
    ];
    let (code, out) = warden_cli(&["backups", "list", "--store", "gs://my-bucket/etcd"], &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("{ip}:9")) && out.contains("my-bucket"),
        "GOOGLE_BASE_URL not honoured:\n{out}"
    );
    assert!(!out.contains("169.254.169.254"), "{out}");
    let (code, out) = warden_cli(&["backups", "list", "--store", "gs:///no-bucket"], &env);
    assert_eq!(code, 64, "{out}");
    assert!(out.contains("missing the bucket name"), "{out}");
}

#[test]
fn a_long_chain_is_cut_by_a_full_snapshot() {
    let etcd = etcd34();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}", dir.path().join("store").display());
    let mut w = Warden::start(
        &ip,
        &[
            "--store",
            &store_url,
            "--delta-snapshot-period",
            "200ms",
            "--full-snapshot-after-revisions",
            "20",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    );
    w.wait_ready(START);
    for i in 0..50 {
        etcdctl(&ctl, &ip, &["put", &format!("c{i}"), "v"]).unwrap();
    }
    wait_backed_up(&w, etcd_revision(&ctl, &ip), Duration::from_secs(20));
    let status = wait_for("a full snapshot started by the chain length", START, || {
        let s = w.status();
        (s["backup"]["fulls_total"].as_u64() >= Some(2)).then_some(s)
    });
    assert!(status["backup"]["chain_base"].as_i64().unwrap() > 1, "{status}");
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let (code, out) = warden_cli(&["backups", "verify", "--store", &store_url], &[]);
    assert_eq!(code, 0, "{out}");
}

/// Compaction overtook the chain (writes while no warden watched, then a compaction): the warden
/// cannot continue the chain, takes a full snapshot at once and counts a chain break with its
/// revision range in /status and metrics; never a silent gap.
#[test]
fn a_compacted_gap_is_a_counted_chain_break_and_a_new_full() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    for i in 0..5 {
        etcdctl(&ctl, &ip, &["put", &format!("before{i}"), "x"]).unwrap();
    }
    let backed = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {backed} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(backed)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let compacted = {
        let _plain = PlainEtcd::start(&etcd, &ip, &dir.path().join("data"), "m1");
        for i in 0..5 {
            etcdctl(&ctl, &ip, &["put", &format!("unwatched{i}"), "x"]).unwrap();
        }
        let rev = etcd_revision(&ctl, &ip);
        etcdctl(&ctl, &ip, &["compact", &rev.to_string()]).unwrap();
        rev
    };
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let mut w = Warden::start(
        &ip,
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &argv,
    );
    w.wait_ready(START);
    let status = wait_for("a counted chain break and the full after it", START, || {
        let st = w.status();
        (st["backup"]["chain_breaks_total"] == 1 && st["backup"]["chain_base"].as_i64() >= Some(compacted))
            .then_some(st)
    });
    let cb = &status["backup"]["last_chain_break"];
    assert_eq!(cb["after"], backed, "{status}");
    assert_eq!(cb["compacted"], compacted, "{status}");
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(metrics.contains("etcd_warden_chain_breaks_total 1"), "{metrics}");
    assert!(w.log_text().contains("CHAIN BREAK"), "{}", w.log_text());
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// `--delta-snapshot-max-bytes` bounds the delta buffer. With the store up, a buffer that reaches
/// 64 KiB is uploaded at once (the period, 1 h, never comes); with the store cut it is dropped
/// once it overflows, and a full snapshot follows as soon as the store is back. Every write etcd
/// acknowledged, before, during and after the outage, is in a restore from the store.
#[test]
fn delta_buffer_bound_uploads_early_and_a_dropped_buffer_is_followed_by_a_full() {
    const MAX: u64 = 64 * 1024;
    let etcd = default_etcd();
    let ip = unique_ip();
    let (_moto, mut proxy, env) = moto_behind_proxy(&ip);
    let store = "s3://backups/bounded";
    let dir = tempfile::tempdir().unwrap();
    let w = Warden::builder(
        &ip,
        &[
            "--store",
            store,
            "--delta-snapshot-period",
            "1h",
            "--delta-snapshot-max-bytes",
            "64KiB",
            "--full-snapshot-schedule",
            "0 0 1 1 *",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"] == 1 && w.status()["backup"]["healthy"] == true).then_some(())
    });
    let first_base = w.status()["backup"]["chain_base"].as_i64().unwrap();
    let rt = rt();
    let mut client = rt.block_on(async { pki::connect(&ip, None).await.unwrap() });
    let mut acked = Vec::new();
    let mut n = 0;
    let mut put = |acked: &mut Vec<String>| {
        let k = format!("k{n:06}");
        rt.block_on(client.put(k.as_str(), vec![b'v'; 4096], None))
            .unwrap();
        acked.push(k);
        n += 1;
    };

    // Store up: 160 KiB of writes are uploaded in deltas as the buffer fills, never held longer.
    for _ in 0..40 {
        put(&mut acked);
        let s = w.status();
        let pending = s["backup"]["pending_delta_bytes"].as_u64().unwrap();
        assert!(
            pending < MAX + 8192,
            "the buffer holds {pending} bytes, over its bound: {s}"
        );
    }
    let rev = etcd_revision(&etcdctl_for(&etcd), &ip);
    let s = wait_for("early deltas (the period is 1 h)", START, || {
        let s = w.status();
        (s["backup"]["deltas_total"].as_u64() >= Some(2)).then_some(s)
    });
    assert!(
        s["backup"]["backed_up_revision"].as_i64().unwrap() >= rev - 20,
        "more than the bound is waiting for the period: {s}"
    );
    let early = backups_list(store, &env);
    assert!(
        early.iter().filter(|r| r["kind"] == "delta").count() >= 2,
        "{early:#?}"
    );

    // Store cut: the buffer overflows and is dropped; etcd acknowledges writes all along.
    proxy.cut();
    let cut_at = w.log_text().len();
    let dropped = "delta buffer full and the store is failing: dropping it";
    wait_for(
        "the overflowing buffer to be dropped",
        Duration::from_secs(60),
        || {
            put(&mut acked);
            w.log_text()[cut_at..].contains(dropped).then_some(())
        },
    );
    for _ in 0..20 {
        put(&mut acked);
    }
    let during = etcd_revision(&etcdctl_for(&etcd), &ip);
    assert_eq!(w.status()["backup"]["fulls_total"], 1);

    // Store back: a full snapshot starts a new chain at or after every write made so far.
    proxy.restore();
    let s = wait_for(
        "the full after the dropped buffer",
        Duration::from_secs(60),
        || {
            let s = w.status();
            (s["backup"]["fulls_total"] == 2).then_some(s)
        },
    );
    let base = s["backup"]["chain_base"].as_i64().unwrap();
    for _ in 0..5 {
        put(&mut acked);
    }
    let last = etcd_revision(&etcdctl_for(&etcd), &ip);
    let mut w = w;
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    // In the store: the old chain ends where the dropped buffer began, the new full starts after
    // it (its name's revision is a lower bound read before the stream: the chain continues from
    // there), and the new chain reaches every write.
    let rows = backups_list(store, &env);
    let fulls: Vec<_> = rows.iter().filter(|r| r["kind"] == "full").collect();
    assert_eq!(
        fulls.len(),
        2,
        "one full at start, one after the dropped buffer: {rows:#?}"
    );
    assert_eq!(
        (fulls[0]["last"].as_i64(), fulls[1]["last"].as_i64()),
        (Some(first_base), Some(base))
    );
    let old_last = rows
        .iter()
        .filter(|r| r["kind"] == "delta" && r["chain"] == fulls[0]["chain"])
        .filter_map(|r| r["last"].as_i64())
        .max()
        .unwrap();
    assert!(
        old_last < base && old_last < during,
        "the dropped buffer's revisions were uploaded after all ({old_last}), or the full is older ({base}): {rows:#?}"
    );
    let new_last = rows
        .iter()
        .filter(|r| r["kind"] == "delta" && r["chain"] == fulls[1]["chain"])
        .filter_map(|r| r["last"].as_i64())
        .max()
        .unwrap_or(base);
    assert_eq!(
        new_last, last,
        "the new chain does not reach the last write: {rows:#?}"
    );
    let (code, out) = warden_cli(&["backups", "verify", "--store", store], &env);
    assert_eq!(code, 0, "{out}");
    let (restored, _) = keys_after_restore(&etcd, store, &env, "k");
    assert_none_lost(&acked, &restored, "restore after a dropped delta buffer");
}

/// A watch gap while the warden runs: the store is cut, etcd is SIGKILLed (the warden respawns it
/// and its delta watch must start again), and compaction passes the chain's next revision before
/// the store is back. The chain cannot continue: a counted chain break with its range, a new full
/// at or after the compaction, and a restore that holds every acknowledged write.
#[test]
fn a_watch_restarted_past_a_compaction_during_a_store_outage_starts_a_new_full() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let (_moto, mut proxy, env) = moto_behind_proxy(&ip);
    let store = "s3://backups/gap";
    let dir = tempfile::tempdir().unwrap();
    let mut w = Warden::builder(
        &ip,
        &[
            "--store",
            store,
            "--delta-snapshot-period",
            "200ms",
            "--restart-backoff-min",
            "100ms",
            "--full-snapshot-schedule",
            "0 0 1 1 *",
        ],
        &etcd_argv(&etcd, &ip, &dir.path().join("data")),
    )
    .envs(&env)
    .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"] == 1).then_some(())
    });
    let mut acked = Vec::new();
    let mut put = |n: usize| {
        for _ in 0..n {
            let k = format!("k{:06}", acked.len());
            etcdctl(&ctl, &ip, &["put", &k, "v"]).unwrap();
            acked.push(k);
        }
    };
    put(5);
    let backed = etcd_revision(&ctl, &ip);
    wait_backed_up(&w, backed, START);

    proxy.cut();
    put(5);
    let old = w.etcd_pid().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), Signal::SIGKILL).unwrap();
    wait_for("etcd respawned", START, || w.etcd_pid().filter(|p| *p != old));
    w.wait_ready(START);
    put(5);
    let compacted = etcd_revision(&ctl, &ip);
    etcdctl(&ctl, &ip, &["compact", &compacted.to_string()]).unwrap();
    assert_eq!(w.status()["backup"]["chain_breaks_total"], 0);
    proxy.restore();

    let s = wait_for(
        "a counted chain break and the full after it",
        Duration::from_secs(60),
        || {
            let s = w.status();
            (s["backup"]["fulls_total"] == 2 && s["backup"]["chain_base"].as_i64() >= Some(compacted))
                .then_some(s)
        },
    );
    assert_eq!(s["backup"]["chain_breaks_total"], 1, "{s}");
    // The break comes after what the old chain holds: at least what was stored before the cut,
    // more when the writes the watch had buffered before etcd's death were uploaded once the
    // store came back; never the compacted revisions etcd no longer has.
    let after = s["backup"]["last_chain_break"]["after"].as_i64().unwrap();
    assert!(
        (backed..compacted).contains(&after),
        "the break after {after}, outside [{backed}, {compacted}): {s}"
    );
    assert_eq!(s["backup"]["last_chain_break"]["compacted"], compacted, "{s}");
    let base = s["backup"]["chain_base"].as_i64().unwrap();
    put(3);
    let last = etcd_revision(&ctl, &ip);
    wait_backed_up(&w, last, START);
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let rows = backups_list(store, &env);
    let fulls: Vec<_> = rows.iter().filter(|r| r["kind"] == "full").collect();
    assert_eq!(fulls.len(), 2, "{rows:#?}");
    assert_eq!(fulls[1]["last"], base, "{rows:#?}");
    let old_last = rows
        .iter()
        .filter(|r| r["kind"] == "delta" && r["chain"] == fulls[0]["chain"])
        .filter_map(|r| r["last"].as_i64())
        .max();
    assert_eq!(
        old_last,
        Some(after),
        "the old chain must end where the break was counted: {rows:#?}"
    );
    let (code, out) = warden_cli(&["backups", "verify", "--store", store], &env);
    assert_eq!(code, 0, "{out}");
    let (restored, _) = keys_after_restore(&etcd, store, &env, "k");
    assert_none_lost(&acked, &restored, "restore after a chain break");
}

/// Every file under `root`, by path relative to it, with its bytes.
fn files(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            } else {
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    let mut out = Default::default();
    walk(root, root, &mut out);
    out
}

/// `backups copy` from a warden's file store to moto's S3 (another provider) and to another
/// directory: every backup object arrives byte for byte, the writer's head record does not;
/// `backups verify` passes on the S3 copy and a restore from it holds every acknowledged write; a
/// second run copies nothing, and a delta deleted from a copy is the only object copied again.
#[test]
fn backups_copy_brings_a_copy_in_another_store_up_to_date_with_only_the_missing_objects() {
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let etcd = default_etcd();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), false);
    std::thread::sleep(Duration::from_secs(1));
    w.signal(Signal::SIGUSR1);
    wait_for("a second full", Duration::from_secs(60), || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(2)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::SeqCst);
    let mut acked = writes.join().unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(60));
    let primary = dir.path().join("store");
    let backups: std::collections::BTreeMap<String, Vec<u8>> = files(&primary)
        .into_iter()
        .filter(|(k, _)| k.ends_with(".ews"))
        .collect();
    assert!(backups.len() >= 3, "fulls and deltas: {:?}", backups.keys());
    // A coordination record and an unfinished upload, which stay with the primary.
    std::fs::write(primary.join("v1/head.json"), "{}").unwrap();
    std::fs::write(primary.join("v1/full/full-unfinished.tmp"), "x").unwrap();

    let s3_ip = unique_ip();
    let moto = moto(&s3_ip, 5000);
    create_bucket(&moto.addr, "copy");
    let env = s3_env(&moto.endpoint);
    let run = |args: &[&str]| {
        let out = Command::new(WARDEN)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    let report = run(&[
        "backups",
        "copy",
        "--from",
        &store,
        "--to",
        "s3://copy/etcd",
        "--json",
    ]);
    assert_eq!(
        report["report"]["copied"].as_array().unwrap().len(),
        backups.len(),
        "{report:#}"
    );
    let mut in_s3 = s3_keys(&moto.endpoint, "copy");
    in_s3.sort();
    let expected: Vec<String> = backups.keys().map(|k| format!("etcd/{k}")).collect();
    assert_eq!(
        in_s3, expected,
        "the S3 copy holds the backup objects and nothing else"
    );
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--store", "s3://copy/etcd"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    acked.sort();
    let (found, _) = keys_after_restore(&etcd, "s3://copy/etcd", &env, "k");
    assert_none_lost(&acked, &found, "restored from the S3 copy");
    let again = run(&[
        "backups",
        "copy",
        "--from",
        &store,
        "--to",
        "s3://copy/etcd",
        "--json",
    ]);
    assert_eq!(again["report"]["copied"], serde_json::json!([]), "{again:#}");

    // A directory copy: byte for byte; one delta lost there is the one copied again.
    let copy_dir = dir.path().join("copy");
    let copy = format!("file://{}", copy_dir.display());
    run(&["backups", "copy", "--from", &store, "--to", &copy, "--json"]);
    assert_eq!(files(&copy_dir), backups, "the copy's objects, byte for byte");
    let lost = backups.keys().find(|k| k.contains("/delta/")).unwrap().clone();
    std::fs::remove_file(copy_dir.join(&lost)).unwrap();
    let report = run(&["backups", "copy", "--from", &store, "--to", &copy, "--json"]);
    assert_eq!(
        report["report"]["copied"],
        serde_json::json!([lost]),
        "{report:#}"
    );
    assert_eq!(files(&copy_dir), backups);
}

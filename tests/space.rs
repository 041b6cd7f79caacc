//! The space keeper against real etcd with a small quota (32 MiB): NOSPACE repaired by itself
//! without losing an acknowledged write, and data too large for the quota reported, not looped on.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const START: Duration = Duration::from_secs(60);
const QUOTA: &str = "33554432";

/// A warden over etcd 3.6.16 with a 32 MiB quota and a file store in `dir`.
fn small_quota_warden(dir: &Path, ip: &str) -> (Warden, String) {
    let store = format!("file://{}/store", dir.display());
    let mut argv = vec![default_etcd().display().to_string()];
    argv.extend(etcd_args(ip, &dir.join("data")));
    argv.extend(["--quota-backend-bytes".to_owned(), QUOTA.to_owned()]);
    let w = Warden::start(
        ip,
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &argv,
    );
    w.wait_ready(START);
    (w, store)
}

/// Puts `key` = `value`: `Ok`, or etcd's refusal (NOSPACE says "database space exceeded").
fn put(ctl: &Path, ip: &str, key: &str, value: &str) -> Result<(), String> {
    etcdctl(ctl, ip, &["put", key, value]).map(drop)
}

/// Writes 100 KiB values until etcd refuses with NOSPACE: `big_keys` of them over and over (history
/// a compaction frees), 0 meaning a new key each time (live data nothing frees); and after each,
/// a small `acked-N` key. Returns the acknowledged small keys.
fn fill_to_nospace(ctl: &Path, ip: &str, big_keys: usize) -> Vec<String> {
    let big = "x".repeat(100 << 10);
    let mut acked = Vec::new();
    for i in 0..2000 {
        let key = match big_keys {
            0 => format!("live-{i:05}"),
            n => format!("big-{}", i % n),
        };
        match put(ctl, ip, &key, &big) {
            Ok(()) => {}
            Err(e) if e.contains("database space exceeded") => return acked,
            Err(e) => panic!("put {key}: {e}"),
        }
        let small = format!("acked-{i:05}");
        match put(ctl, ip, &small, "v") {
            Ok(()) => acked.push(small),
            Err(e) if e.contains("database space exceeded") => return acked,
            Err(e) => panic!("put {small}: {e}"),
        }
    }
    panic!("2000 writes of 100 KiB and no NOSPACE under a 32 MiB quota")
}

/// NOSPACE from history (four keys overwritten with 100 KiB values): the warden compacts to the
/// newest revision its store holds, defragments and disarms; a write goes through again within
/// 60 s, etcd lists no alarm, and a restore of the store holds every write acknowledged before.
#[test]
fn nospace_is_repaired_by_itself_and_no_acknowledged_write_is_missing_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let ctl = etcdctl_for(&default_etcd());
    let (mut w, store) = small_quota_warden(dir.path(), &ip);
    let mut acked = fill_to_nospace(&ctl, &ip, 4);
    let full_at = Instant::now();
    assert!(acked.len() > 50, "only {} writes before NOSPACE", acked.len());
    wait_for("a write to go through after NOSPACE", START, || {
        put(&ctl, &ip, "after-nospace", "v").ok()
    });
    let took = full_at.elapsed();
    eprintln!("NOSPACE to writable: {:.1} s", took.as_secs_f64());
    acked.push("after-nospace".into());
    let alarms = etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap();
    assert!(alarms.trim().is_empty(), "alarms left: {alarms}");
    let status = w.status();
    assert_eq!(status["space"]["repairs_total"], 1, "{status}");
    let repair = &status["space"]["last_repair"];
    assert_eq!(repair["disarmed"], true, "{status}");
    let compacted = repair["compacted_to"].as_i64().expect("a compaction");
    assert!(
        repair["db_size_after"].as_i64() < repair["db_size_before"].as_i64(),
        "{status}"
    );
    // The compaction went no further than the store: a delta holds the compacted revision.
    let backed = backups_list(&store, &[])
        .iter()
        .filter_map(|r| r["last"].as_i64())
        .max()
        .unwrap();
    assert!(
        compacted <= backed,
        "compacted to {compacted}, the store held {backed}"
    );
    let metrics = w.get("/metrics").unwrap().1;
    assert!(metrics.contains("etcd_warden_space_repairs_total 1"), "{metrics}");

    let newest = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {newest} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest)).then_some(())
    });
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_exit(START);
    acked.sort();
    let (keys, _) = keys_after_restore(&default_etcd(), &store, &[], "acked-");
    let after = keys_after_restore(&default_etcd(), &store, &[], "after-nospace").0;
    let mut found = keys;
    found.extend(after);
    found.sort();
    assert_none_lost(&acked, &found, "after the NOSPACE repair");
}

/// NOSPACE from live data (every 100 KiB value under its own key): compaction frees nothing, so
/// the warden says the data is too large, with the numbers, leaves the alarm raised and does not
/// try again while nothing changed.
#[test]
fn data_too_large_for_the_quota_is_reported_once_and_not_looped_on() {
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let ctl = etcdctl_for(&default_etcd());
    let (w, _store) = small_quota_warden(dir.path(), &ip);
    fill_to_nospace(&ctl, &ip, 0);
    let status = wait_for("a NOSPACE repair", START, || {
        let s = w.status();
        (s["space"]["repairs_total"].as_u64() >= Some(1)).then_some(s)
    });
    let problem = status["space"]["last_repair"]["problem"]
        .as_str()
        .unwrap_or_else(|| panic!("no problem said: {status:#}"));
    assert!(
        problem.contains("too large") && problem.contains("--quota-backend-bytes 32 MiB"),
        "{problem}"
    );
    assert_eq!(status["space"]["last_repair"]["disarmed"], false, "{status}");
    assert!(
        w.log_text().contains("the data itself is too large"),
        "{}",
        w.log_text()
    );
    let alarms = etcdctl(&ctl, &ip, &["alarm", "list"]).unwrap();
    assert!(alarms.contains("NOSPACE"), "the alarm was disarmed: {alarms}");
    // Five more seconds of NOSPACE: no second attempt.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(w.status()["space"]["repairs_total"], 1, "a repair loop");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(status["space"]["nospace"], true, "{status}");
}

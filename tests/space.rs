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
    assert_eq!(
        status["backup"]["chain_breaks_total"], 0,
        "the repair's compaction broke the chain: {status}"
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

/// Three members at NOSPACE: the writer repairs it once for all, and etcd's own logs show each
/// member defragmented alone (no two defragmentations overlap, so at most one member at a time
/// answers nothing) and the leader of the moment last, after leadership moved away from it. Every
/// write acknowledged before is in the store.
#[test]
fn three_members_at_nospace_are_repaired_one_at_a_time_with_the_leader_last() {
    use common::cluster::*;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store = format!("file://{}/store", d.display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let mut wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let mut argv = member_args_token(&etcd, &ips, i, &d.join(format!("m{i}")), "space");
            argv.extend(["--quota-backend-bytes".to_owned(), QUOTA.to_owned()]);
            Some(Warden::start(
                &ips[i],
                &["--store", &store, "--delta-snapshot-period", "200ms"],
                &argv,
            ))
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let leader = the_writer(&wardens);
    let mut acked = fill_to_nospace(&ctl, &ips[leader], 4);
    let full_at = Instant::now();
    let through = wait_for("a write to go through after NOSPACE", START, || {
        ips.iter()
            .position(|ip| put(&ctl, ip, "after-nospace", "v").is_ok())
    });
    eprintln!(
        "three members: NOSPACE to writable in {:.1} s (through m{through})",
        full_at.elapsed().as_secs_f64()
    );
    acked.push("after-nospace".into());
    let alarms = etcdctl(&ctl, &ips[0], &["alarm", "list"]).unwrap();
    assert!(alarms.trim().is_empty(), "alarms left: {alarms}");

    // One repair for the cluster: the writer that took over in its middle (leadership moved to a
    // defragmented follower) leaves it to the writer that started it.
    let repairers: Vec<usize> = (0..3)
        .filter(|i| {
            wardens[*i]
                .as_ref()
                .unwrap()
                .log_text()
                .contains("etcd raised NOSPACE: repairing")
        })
        .collect();
    assert_eq!(
        repairers.len(),
        1,
        "more than one writer repaired NOSPACE: m{repairers:?}"
    );
    let mut rounds: Vec<(usize, std::time::SystemTime, std::time::SystemTime)> = (0..3)
        .map(|i| {
            let log = wardens[i].as_ref().unwrap().log_text();
            let start = last_logged(&log, "starting defragment")
                .unwrap_or_else(|| panic!("m{i} was not defragmented"));
            let end = last_logged(&log, "finished defragment").expect("a finished defragment");
            (i, start, end)
        })
        .collect();
    rounds.sort_by_key(|(_, start, _)| *start);
    for pair in rounds.windows(2) {
        assert!(
            pair[1].1 >= pair[0].2,
            "m{} started defragmenting before m{} finished: {rounds:?}",
            pair[1].0,
            pair[0].0
        );
    }
    assert_eq!(
        rounds.last().unwrap().0,
        leader,
        "the leader (m{leader}) was not defragmented last: {rounds:?}"
    );
    let longest = rounds
        .iter()
        .map(|(_, s, e)| e.duration_since(*s).unwrap_or_default())
        .max()
        .unwrap();
    eprintln!("longest member defragmentation: {:.2} s", longest.as_secs_f64());
    let now_leading = the_writer(&wardens);
    assert_ne!(
        now_leading, leader,
        "leadership did not move off m{leader} before its defragmentation"
    );
    let repairs: u64 = wardens
        .iter()
        .flatten()
        .map(|w| w.status()["space"]["repairs_total"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(repairs, 1, "one repair for the cluster");

    let newest = etcd_revision(&ctl, &ips[0]);
    wait_for(&format!("revision {newest} in the store"), START, || {
        wardens
            .iter()
            .flatten()
            .any(|w| w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest))
            .then_some(())
    });
    stop_all(&mut wardens);
    acked.sort();
    let (mut found, _) = keys_after_restore(&etcd, &store, &[], "acked-");
    found.extend(keys_after_restore(&etcd, &store, &[], "after-nospace").0);
    found.sort();
    assert_none_lost(&acked, &found, "after the cluster's NOSPACE repair");
}

/// Someone else compacts (as kube-apiserver does every 5 minutes, here every second for 20 s) at
/// etcd's current revision while a client writes steadily: the delta stream keeps up, so the chain
/// holds with no break counted, and a restore of the store has every acknowledged write.
#[test]
fn external_compaction_under_steady_writes_keeps_the_chain_and_every_write() {
    use common::cluster::writer;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let ctl = etcdctl_for(&default_etcd());
    let (mut w, store) = small_quota_warden(dir.path(), &ip);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ip.clone(), stop.clone());
    for _ in 0..20 {
        std::thread::sleep(Duration::from_secs(1));
        let rev = etcd_revision(&ctl, &ip);
        etcdctl(&ctl, &ip, &["compact", &rev.to_string()]).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let mut acked = writes.join().unwrap();
    assert!(acked.len() > 100, "only {} writes", acked.len());
    let newest = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {newest} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest)).then_some(())
    });
    let status = w.status();
    assert_eq!(status["backup"]["chain_breaks_total"], 0, "{status}");
    assert_eq!(
        status["backup"]["fulls_total"], 1,
        "a full after a break: {status}"
    );
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_exit(START);
    acked.sort();
    let (found, _) = keys_after_restore(&default_etcd(), &store, &[], "k");
    assert_none_lost(&acked, &found, "after 20 external compactions");
}

/// `--space-history` under steady writes and watch restarts: the writer compacts at least 1,000
/// times (counted by etcd's own compaction histogram, not only by the warden), never past the
/// revision the store held, so no compaction breaks the chain (no break, one full) and a restore
/// has every acknowledged write; the old revisions are really gone from etcd.
#[test]
fn the_history_window_compacts_a_thousand_times_under_writes_without_breaking_the_chain() {
    use common::cluster::paced_writer;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let ctl = etcdctl_for(&default_etcd());
    let store = format!("file://{}/store", dir.path().display());
    let mut argv = vec![default_etcd().display().to_string()];
    // Plain http: a thousand compactions, each behind a delta every 10 ms, take over 300 s of a
    // busy 2-core machine when every request pays TLS; what this test pins (no compaction breaks
    // the chain) does not depend on the transport.
    argv.extend(etcd_args_http(&ip, &dir.path().join("data")));
    // A 100 ms window, looked at every 10 ms; deltas every 10 ms so the store's revision moves.
    let mut w = Warden::start(
        &ip,
        &[
            "--store",
            &store,
            "--delta-snapshot-period",
            "10ms",
            "--space-history",
            "100ms",
        ],
        &argv,
    );
    w.wait_ready(START);
    let stop = Arc::new(AtomicBool::new(false));
    // A write every 5 ms or so, not as fast as etcd takes them: each compaction walks etcd's whole
    // key index, so unbounded writes (550 new keys a second) made the thousandth compaction cost
    // etcd a quarter of a second and the test take 150 s alone, over 300 s beside the suite.
    let writes = paced_writer(ip.clone(), stop.clone(), Duration::from_millis(5));
    let etcd_compactions = || -> u64 {
        let metrics = http_get(&format!("{ip}:2379"), "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count ")
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // A SIGHUP every 100 ms makes the writer open its watch again, from the revision after
    // the store's newest: a compaction past that revision would break the chain there.
    let started = Instant::now();
    wait_for(
        "1,000 compactions by etcd's own count",
        Duration::from_secs(300),
        || {
            w.signal(nix::sys::signal::Signal::SIGHUP);
            std::thread::sleep(Duration::from_millis(100));
            let status = w.status();
            assert_eq!(
                status["backup"]["chain_breaks_total"], 0,
                "a compaction broke the chain: {status}"
            );
            (etcd_compactions() >= 1000).then_some(())
        },
    );
    eprintln!("1,000 compactions in {:.1} s", started.elapsed().as_secs_f64());
    stop.store(true, Ordering::SeqCst);
    let mut acked = writes.join().unwrap();
    assert!(acked.len() > 500, "only {} writes", acked.len());
    let newest = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {newest} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest)).then_some(())
    });
    let status = w.status();
    assert!(
        status["space"]["history_compactions_total"].as_u64() >= Some(1000),
        "{status}"
    );
    assert_eq!(status["backup"]["chain_breaks_total"], 0, "{status}");
    assert_eq!(
        status["backup"]["fulls_total"], 1,
        "a full after a break: {status}"
    );
    // The first keys' revisions are compacted away in etcd.
    let old = etcdctl(&ctl, &ip, &["get", "k000000", "--rev", "3"]).unwrap_err();
    assert!(old.contains("compacted"), "{old}");
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_exit(START);
    acked.sort();
    let (found, _) = keys_after_restore(&default_etcd(), &store, &[], "k");
    assert_none_lost(&acked, &found, "after 1,000 history compactions");
}

/// Puts `mib` values of 1 MiB under their own keys (live data a defragmentation must copy).
fn fill_live(ip: &str, mib: usize) {
    rt().block_on(async {
        let mut c = pki::connect(ip, None).await.unwrap();
        let value = vec![b'x'; 1 << 20];
        for i in 0..mib {
            c.put(format!("live-{i:04}"), value.clone(), None).await.unwrap();
        }
    });
}

/// Runs `etcdctl defrag` (an operator's, not the warden's) while polling /readyz every 20 ms; the
/// answers seen during it and how long it took.
fn readyz_during_defrag(w: &Warden, ctl: &Path, ip: &str) -> (Vec<(u16, String)>, Duration) {
    let (ctl, ip2) = (ctl.to_owned(), ip.to_owned());
    let started = Instant::now();
    let defrag = std::thread::spawn(move || etcdctl(&ctl, &ip2, &["defrag", "--command-timeout", "120s"]));
    let mut seen = Vec::new();
    while !defrag.is_finished() {
        if let Some(answer) = w.get("/readyz") {
            seen.push(answer);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    defrag.join().unwrap().expect("etcdctl defrag");
    (seen, started.elapsed())
}

/// A defragmentation this warden did not start (a follower's is started by another member's
/// writer; here an operator's `etcdctl defrag`) blocks etcd's answers beyond the health timeout.
/// By default readiness holds its verdict through it (etcd is busy, not broken); with
/// `--space-defrag-not-ready` the member says not ready, naming the defragmentation, and is
/// ready again after.
#[test]
fn a_defragmentation_keeps_readiness_unless_the_operator_asks_for_not_ready() {
    let ctl = etcdctl_for(&default_etcd());
    for not_ready in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let ip = unique_ip();
        let mut argv = vec![default_etcd().display().to_string()];
        argv.extend(etcd_args(&ip, &dir.path().join("data")));
        let store = format!("file://{}/store", dir.path().display());
        let mut opts = vec![
            "--store",
            &store,
            "--health-timeout",
            "200ms",
            "--health-interval",
            "100ms",
        ];
        if not_ready {
            opts.push("--space-defrag-not-ready");
        }
        let w = Warden::start(&ip, &opts, &argv);
        w.wait_ready(START);
        fill_live(&ip, 300);
        w.wait_ready(START);
        let (seen, took) = readyz_during_defrag(&w, &ctl, &ip);
        eprintln!(
            "not_ready={not_ready}: defragmentation of 300 MiB took {:.2} s, {} answers",
            took.as_secs_f64(),
            seen.len()
        );
        assert!(took > Duration::from_millis(400), "too quick to tell: {took:?}");
        let refused: Vec<_> = seen.iter().filter(|(code, _)| *code != 200).collect();
        if not_ready {
            assert!(!refused.is_empty(), "ready all through the defragmentation");
            assert!(
                refused.iter().all(|(_, body)| body.contains("defragmenting")),
                "{refused:?}"
            );
            wait_for("ready again after the defragmentation", START, || {
                (w.get("/readyz")?.0 == 200).then_some(())
            });
        } else {
            assert!(
                refused.is_empty(),
                "not ready during a defragmentation: {refused:?}"
            );
        }
    }
}

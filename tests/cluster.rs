//! Three real etcd members on loopback, a warden each, one store: exactly one writer (the leader's
//! warden), and when the leader dies with its warden the next leader's warden continues the same
//! chain, so the store holds every write a client saw acknowledged.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use common::cluster::*;
use common::*;
use nix::sys::signal::Signal;

/// After a cluster's turbulence: the writer `w` backs up etcd's revision as seen through `ip`, the
/// store holds one full snapshot and a chain that verifies, and a restore holds every acknowledged
/// write. Returns the restored keys.
fn one_chain_nothing_lost(
    etcd: &Path,
    dir: &Path,
    store: &str,
    w: &Warden,
    ip: &str,
    acked: &[String],
    what: &str,
) -> (i64, Vec<String>) {
    one_chain_nothing_lost_after(etcd, dir, store, (w, ip), acked, what, 1)
}

/// The same when the store already held `fulls_before` full snapshots when the faults began.
fn one_chain_nothing_lost_after(
    etcd: &Path,
    dir: &Path,
    store: &str,
    (w, ip): (&Warden, &str),
    acked: &[String],
    what: &str,
    fulls_before: usize,
) -> (i64, Vec<String>) {
    let rev = etcd_revision(&etcdctl_for(etcd), ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let fulls = std::fs::read_dir(dir.join("store/v1/full")).unwrap().count();
    assert_eq!(
        fulls, fulls_before,
        "{what}: a new chain was started (or a follower wrote a full)"
    );
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--store", store])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{what}: the chain does not verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let (found, _) = keys_after_restore(etcd, store, &[], "k");
    assert_none_lost(acked, &found, what);
    (rev, found)
}

#[test]
fn etcd_3_5_one_writer_per_cluster_and_the_next_leader_continues_the_chain() {
    one_writer_and_handover(&etcd35());
}

#[test]
fn etcd_3_4_one_writer_per_cluster_and_the_next_leader_continues_the_chain() {
    one_writer_and_handover(&etcd34());
}

#[test]
fn etcd_3_5_newest_one_writer_per_cluster_and_the_next_leader_continues_the_chain() {
    one_writer_and_handover(&etcd35_newest());
}

#[test]
fn etcd_3_6_one_writer_per_cluster_and_the_next_leader_continues_the_chain() {
    one_writer_and_handover(&etcd36());
}

#[test]
fn etcd_3_7_one_writer_per_cluster_and_the_next_leader_continues_the_chain() {
    one_writer_and_handover(&etcd37());
}

fn one_writer_and_handover(etcd: &Path) {
    let etcd = etcd.to_path_buf();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-test");
    let first = the_writer(&wardens);
    // The writer is the raft leader's warden, by etcd's own word.
    let status = etcdctl(&ctl, &ips[first], &["endpoint", "status", "-w", "json"]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status[0]["Status"]["leader"], status[0]["Status"]["header"]["member_id"],
        "the writer's etcd is not the leader"
    );
    wait_for("the writer's first full snapshot", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });

    // Writes through a member that survives; the leader and its warden die mid-chain.
    let survivor = (first + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = std::time::Instant::now();
    let mut dead = wardens[first].take().unwrap();
    let dead_etcd = dead.etcd_pid().unwrap();
    dead.signal(Signal::SIGKILL);
    dead.wait_exit(START);
    wait_for("the dead leader's etcd to be gone", START, || {
        (!alive(dead_etcd)).then_some(())
    });
    let second = the_writer(&wardens);
    assert_ne!(second, first);
    let new_writer_s = killed_at.elapsed().as_secs_f64();
    let deltas_before = wardens[second].as_ref().unwrap().status()["backup"]["deltas_total"]
        .as_u64()
        .unwrap_or(0);
    wait_for("the new writer's first delta", START, || {
        (wardens[second].as_ref().unwrap().status()["backup"]["deltas_total"].as_u64() > Some(deltas_before))
            .then_some(())
    });
    eprintln!(
        "handover: new writer {new_writer_s:.2}s after the kill, its first delta {:.2}s after",
        killed_at.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    assert!(acked.len() > 50, "too few writes acknowledged: {}", acked.len());
    // The followers wrote nothing: one chain, contiguous across the handover.
    let (rev, _) = one_chain_nothing_lost(
        &etcd,
        dir.path(),
        &store,
        wardens[second].as_ref().unwrap(),
        &ips[survivor],
        &acked,
        "restore after the leader's death",
    );
    // Every member reports the backup state and who writes, from the writer's head object.
    let head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("store/v1/head.json")).unwrap()).unwrap();
    assert_eq!(head["member_name"], format!("m{second}"), "{head}");
    assert!(head["last_revision"].as_i64() >= Some(rev), "{head}");
    for (i, w) in wardens.iter().enumerate() {
        let Some(w) = w else { continue };
        let st = wait_for(
            &format!("m{i} to report the writer and the backed-up revision"),
            START,
            || {
                let st = w.status();
                let b = &st["backup"];
                (b["writer"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("m{second} ")))
                    && b["backed_up_revision"].as_i64() >= Some(rev))
                .then_some(st)
            },
        );
        let age = st["backup"]["seconds_since_last_success"].as_f64().unwrap();
        assert!(age < 30.0, "m{i} reports a backup {age} s old: {st}");
    }
    stop_all(&mut wardens);
}

/// Ten leader moves under writes: each new leader's warden takes over the same chain; no new full
/// snapshot, no gap, nothing lost.
#[test]
fn ten_leader_moves_under_writes_keep_one_chain() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-test");
    let mut leader = the_writer(&wardens);
    wait_for("the first full snapshot", START, || {
        (wardens[leader].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1))
            .then_some(())
    });
    let ids = member_ids(&ctl, &ips[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[0].clone(), stop.clone());
    for round in 0..10 {
        let next = (leader + 1 + round % 2) % 3;
        let id = ids.iter().find(|(n, _)| *n == format!("m{next}")).unwrap().1;
        etcdctl(&ctl, &ips[leader], &["move-leader", &format!("{id:x}")])
            .unwrap_or_else(|e| panic!("move-leader to m{next}: {e}"));
        let now = wait_for(
            &format!("m{next}'s warden to write (move {round})"),
            START,
            || {
                let w = the_writer(&wardens);
                (w == next).then_some(w)
            },
        );
        leader = now;
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    one_chain_nothing_lost(
        &etcd,
        dir.path(),
        &store,
        wardens[leader].as_ref().unwrap(),
        &ips[leader],
        &acked,
        "restore after ten leader moves",
    );
    drop(wardens);
}

/// Another cluster pointed at a prefix that a cluster already claimed writes nothing there and
/// says why (status, metrics); its readiness is untouched. The owner's record lists its members.
#[test]
fn a_second_cluster_on_a_claimed_prefix_writes_nothing() {
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let a_ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let a = start_members(&etcd, dir.path(), &store, &a_ips, "a", "cluster-a");
    let a_writer = the_writer(&a);
    wait_for("cluster A's first full snapshot", START, || {
        (a[a_writer].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let owner: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("store/v1/cluster.json")).unwrap()).unwrap();
    let names: Vec<&str> = owner["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{owner}");

    let b_ips: Vec<String> = (0..2).map(|_| unique_ip()).collect();
    let b = start_members(&etcd, dir.path(), &store, &b_ips, "b", "cluster-b");
    let b_writer = wait_for("cluster B's leader's warden to refuse the prefix", START, || {
        b.iter().flatten().find(|w| {
            w.status()["backup"]["foreign_prefix"]
                .as_str()
                .is_some_and(|why| why.contains("belongs to etcd cluster"))
        })
    });
    let st = b_writer.status();
    assert_eq!(st["backup"]["fulls_total"], 0, "{st}");
    assert_eq!(st["backup"]["deltas_total"], 0, "{st}");
    let (_, metrics) = b_writer.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_backup_foreign_prefix 1"),
        "{metrics}"
    );
    assert_eq!(
        b_writer.get("/readyz").unwrap().0,
        200,
        "a foreign prefix must not touch readiness"
    );
    let fulls = std::fs::read_dir(dir.path().join("store/v1/full"))
        .unwrap()
        .count();
    assert_eq!(fulls, 1, "cluster B wrote a full snapshot into A's prefix");
    let owner_after: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("store/v1/cluster.json")).unwrap()).unwrap();
    assert_eq!(
        owner_after["cluster_id"], owner["cluster_id"],
        "the claim changed hands"
    );
    drop(b);
    drop(a);
}

/// Steady-state cost of a cluster's backups, counted in moto's own request log: no listing, at
/// most two requests per delta (the delta, the head), and each follower one read of the head per
/// delta period.
#[test]
fn steady_state_is_two_requests_per_delta_and_no_listing() {
    use common::stores::{create_bucket, moto_with_log, s3_env};
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let log = dir.path().join("moto.log");
    let moto = moto_with_log(&ips[0], 5000, Some(&log));
    create_bucket(&moto.addr, "backups");
    let env = s3_env(&moto.endpoint);
    let store = "s3://backups/etcd/cost";
    let period = Duration::from_millis(500);
    let wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(&etcd, &ips, i, &dir.path().join(format!("m{i}")), "warden-cost");
            Some(
                Warden::builder(
                    &ips[i],
                    &["--store", store, "--delta-snapshot-period", "500ms"],
                    &argv,
                )
                .envs(&env)
                .spawn(),
            )
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let writer_i = the_writer(&wardens);
    let writer_w = wardens[writer_i].as_ref().unwrap();
    let ctl = etcdctl_for(&etcd);
    // After the chain's full, so the first write is a delta's.
    wait_for("the writer's first full snapshot", START, || {
        (writer_w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    etcdctl(&ctl, &ips[writer_i], &["put", "cost-first", "x"]).unwrap();
    wait_for("the writer's first delta", START, || {
        (writer_w.status()["backup"]["deltas_total"].as_u64() >= Some(1)).then_some(())
    });
    // Steady state: a write every 100 ms for 5 s, counted from here.
    let requests = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
            .filter(|r| {
                r.starts_with("GET ")
                    || r.starts_with("PUT ")
                    || r.starts_with("POST ")
                    || r.starts_with("HEAD ")
                    || r.starts_with("DELETE ")
            })
            .collect()
    };
    let before = requests(&std::fs::read_to_string(&log).unwrap()).len();
    let deltas_before = writer_w.status()["backup"]["deltas_total"].as_u64().unwrap();
    let t = std::time::Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(5) {
        etcdctl(&ctl, &ips[writer_i], &["put", &format!("cost{n}"), "x"]).unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let window = t.elapsed();
    let deltas = writer_w.status()["backup"]["deltas_total"].as_u64().unwrap() - deltas_before;
    let all = requests(&std::fs::read_to_string(&log).unwrap());
    let window_requests = &all[before..];
    let lists = window_requests
        .iter()
        .filter(|r| r.contains("list-type") || r.contains("?prefix") || r.contains("&prefix"))
        .count();
    let head_reads = window_requests
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains("head.json"))
        .count();
    let writes = window_requests
        .iter()
        .filter(|r| r.starts_with("PUT ") || r.starts_with("POST "))
        .count();
    let periods = (window.as_secs_f64() / period.as_secs_f64()).ceil() as usize + 1;
    eprintln!(
        "steady state over {window:?}: {deltas} deltas, {} requests ({writes} writes, {head_reads} head reads, {lists} listings)",
        window_requests.len()
    );
    assert!(deltas >= 5, "too few deltas in the window: {deltas}");
    assert_eq!(lists, 0, "a listing in steady state: {window_requests:?}");
    assert!(
        writes as u64 <= 2 * deltas + 2,
        "{writes} writes for {deltas} deltas: {window_requests:?}"
    );
    assert!(
        head_reads <= 2 * periods,
        "{head_reads} head reads by two followers in {periods} periods"
    );
    assert!(
        head_reads >= 2,
        "the followers did not read the head: {window_requests:?}"
    );
    let other = window_requests.len() - writes - head_reads;
    assert!(other <= 2, "unexpected requests: {window_requests:?}");
    // What each member's warden costs in memory (figures for README, not a timed assertion).
    let kib = |pid: i32, field: &str| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    for (i, w) in wardens.iter().enumerate() {
        let w = w.as_ref().unwrap();
        eprintln!(
            "m{i} warden ({}): RSS {} KiB, peak {} KiB",
            if i == writer_i { "writer" } else { "follower" },
            kib(w.pid(), "VmRSS:"),
            kib(w.pid(), "VmHWM:")
        );
    }
    drop(wardens);
}

/// Five members lose two, the leader among them, under writes: quorum holds, the next leader's
/// warden writes, the chain stays one and nothing acknowledged is lost.
#[test]
fn five_members_losing_two_keep_backing_up() {
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..5).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-five");
    let first = the_writer(&wardens);
    // The last two members join a cluster that already has quorum and say their names and client
    // URLs once they run: the writer's first full may predate that, and the changed member list
    // then makes it take another. The faults begin once the fulls settled: none in progress and
    // the count unchanged for 3 s (the membership is checked every 200 ms delta period).
    let fulls_now = |w: &Warden| {
        let b = &w.status()["backup"];
        b["in_progress"]
            .is_null()
            .then(|| b["fulls_total"].as_u64())
            .flatten()
    };
    let mut seen = (None, std::time::Instant::now());
    wait_for("the writer's full snapshots to settle", START, || {
        let now = fulls_now(wardens[first].as_ref().unwrap());
        if now != seen.0 {
            seen = (now, std::time::Instant::now());
        }
        (seen.0 >= Some(1) && seen.1.elapsed() >= Duration::from_secs(3)).then_some(())
    });
    let fulls_before = std::fs::read_dir(dir.path().join("store/v1/full"))
        .unwrap()
        .count();
    let other = (first + 1) % 5;
    let survivor = (first + 2) % 5;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(1000));
    for i in [first, other] {
        let mut w = wardens[i].take().unwrap();
        let pid = w.etcd_pid().unwrap();
        w.signal(Signal::SIGKILL);
        w.wait_exit(START);
        wait_for("a lost member's etcd to be gone", START, || {
            (!alive(pid)).then_some(())
        });
    }
    let second = the_writer(&wardens);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    one_chain_nothing_lost_after(
        &etcd,
        dir.path(),
        &store,
        (wardens[second].as_ref().unwrap(), &ips[survivor]),
        &acked,
        "restore after losing two of five",
        fulls_before,
    );
}

/// A cluster's scheduled defragmentation: the writer defragments each follower, one at a time,
/// then moves leadership to one of them and defragments its own member last (the next round is
/// the new leader's warden's). etcd's own logs show the members' defragmentations never overlap
/// and the round's leader last; every member's db shrinks, by etcd's own count.
#[test]
fn the_writer_defragments_followers_one_at_a_time_and_itself_last() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let wardens = start_members_with(
        &etcd,
        dir.path(),
        &store,
        &ips,
        "m",
        "warden-defrag",
        &["--defrag-schedule", "*/3 * * * * *"],
    );
    let writer_i = the_writer(&wardens);
    let db_size = |ip: &str| -> i64 {
        let out = etcdctl(&ctl, ip, &["endpoint", "status", "-w", "json"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["Status"]["dbSize"].as_i64().unwrap()
    };
    // Space to give back: 8 MiB written, then deleted and compacted.
    let big = "x".repeat(100 * 1024);
    for i in 0..80 {
        etcdctl(&ctl, &ips[writer_i], &["put", &format!("big{i}"), &big]).unwrap();
    }
    // Measured while the 8 MiB are live: no defragmentation can take a db below this yet.
    let before: Vec<i64> = ips.iter().map(|ip| db_size(ip)).collect();
    etcdctl(&ctl, &ips[writer_i], &["del", "big", "--prefix"]).unwrap();
    let rev = etcd_revision(&ctl, &ips[writer_i]);
    etcdctl(&ctl, &ips[writer_i], &["compact", &rev.to_string(), "--physical"]).unwrap();
    let rounds = |ws: &[Option<Warden>]| -> u64 {
        ws.iter()
            .flatten()
            .map(|w| w.status()["backup"]["defrags_total"].as_u64().unwrap_or(0))
            .sum()
    };
    let done = rounds(&wardens);
    // A round already under way may have defragmented some members before the compaction
    // (CI saw it: the leader had nothing left to give back); the second round to end started
    // after it, so every member has space to give back in that one.
    wait_for(
        "a whole defragmentation of the cluster after the compaction",
        START,
        || (rounds(&wardens) > done + 1).then_some(()),
    );
    // Every defragmentation of each member, by its etcd's log: (member, start, end); the one under
    // way as these logs are read has no end yet. Rounds go on every 3 s while the logs are read, so
    // every check below holds at any moment, not only between rounds.
    const MOVED: &str = "leadership moved to a defragmented follower before defragmenting this member";
    let logs: Vec<String> = wardens.iter().map(|w| w.as_ref().unwrap().log_text()).collect();
    let mut runs: Vec<(usize, SystemTime, Option<SystemTime>)> = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let starts = all_logged(log, "starting defragment");
        let ends = all_logged(log, "finished defragment");
        assert!(
            ends.len() == starts.len() || ends.len() + 1 == starts.len(),
            "m{i}'s etcd logged {} defragmentations started and {} finished",
            starts.len(),
            ends.len()
        );
        runs.extend(
            starts
                .iter()
                .enumerate()
                .map(|(k, s)| (i, *s, ends.get(k).copied())),
        );
    }
    runs.sort_by_key(|(_, start, _)| *start);
    let shown: Vec<String> = runs
        .iter()
        .map(|(m, start, end)| {
            let at = |t: &SystemTime| humantime::format_rfc3339_millis(*t).to_string();
            format!(
                "m{m} {}..{}",
                at(start),
                end.as_ref().map_or("(running)".into(), at)
            )
        })
        .collect();
    // One member at a time, in the whole run: each defragmentation ends before the next begins.
    for pair in runs.windows(2) {
        let (a, _, a_end) = pair[0];
        let (b, b_start, _) = pair[1];
        assert!(
            a_end.is_some_and(|end| b_start >= end),
            "m{b} started defragmenting before m{a} finished: {shown:#?}"
        );
    }
    // The newest round whose writer moved its leadership away: every other member was defragmented
    // after the round before it began and before the move, and the writer's own member only after.
    let mut moves: Vec<(SystemTime, usize)> = logs
        .iter()
        .enumerate()
        .flat_map(|(i, log)| warden_logged(log, MOVED).into_iter().map(move |t| (t, i)))
        .collect();
    moves.sort();
    let &(moved_at, writer) = moves.last().unwrap_or_else(|| {
        panic!("no writer moved its leadership away before defragmenting itself: {shown:#?}")
    });
    // The round before it ended when its writer's own member was defragmented, after its move.
    let round_began = moves.iter().rev().nth(1).map(|&(t, w)| {
        runs.iter()
            .find(|(m, start, _)| *m == w && *start > t)
            .and_then(|(.., end)| *end)
            .unwrap_or_else(|| {
                panic!("m{w} moved its leadership at {t:?} and was not defragmented after: {shown:#?}")
            })
    });
    let in_round = |start: SystemTime| round_began.is_none_or(|t| start > t) && start < moved_at;
    for i in (0..ips.len()).filter(|i| *i != writer) {
        assert!(
            runs.iter()
                .any(|(m, start, end)| *m == i && in_round(*start) && end.is_some_and(|end| end <= moved_at)),
            "m{i} was not defragmented in m{writer}'s round before it moved its leadership at {moved_at:?}: {shown:#?}"
        );
    }
    assert!(
        runs.iter().all(|(m, start, _)| *m != writer || !in_round(*start)),
        "m{writer} was defragmented in its own round before it moved its leadership away: {shown:#?}"
    );
    wait_for(
        &format!("m{writer}'s own defragmentation after it moved its leadership at {moved_at:?}"),
        START,
        || {
            let log = wardens[writer].as_ref().unwrap().log_text();
            all_logged(&log, "finished defragment")
                .iter()
                .any(|end| *end > moved_at)
                .then_some(())
        },
    );
    for (i, ip) in ips.iter().enumerate() {
        let after = db_size(ip);
        assert!(
            after < before[i],
            "m{i}'s db did not shrink: {} -> {after}",
            before[i]
        );
    }
    drop(wardens);
}

/// HashKV holds a member's writes back while it reads the whole database (5.7 s at 7.6 GiB,
/// bench/drill.py), so a restore drill compares its restore with a follower's HashKV, never the
/// leader's: the cluster's writes go on. Judged by etcd's own count of HashKV requests
/// (`etcd_mvcc_hash_rev_duration_seconds_count` on each member's metrics listener).
#[test]
fn restore_drills_compare_with_a_followers_hashkv_and_never_hold_the_leaders_writes() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members_with(
        &etcd,
        dir.path(),
        &store,
        &ips,
        "m",
        "warden-drill",
        &["--verify-schedule", "*/10 * * * * *"],
    );
    let writer = the_writer(&wardens);
    let leader = || {
        wait_for("a member to name its leader", START, || {
            let out = etcdctl(&ctl, &ips[0], &["endpoint", "status", "-w", "json"]).ok()?;
            let v: serde_json::Value = serde_json::from_str(&out).ok()?;
            let id = v[0]["Status"]["leader"].as_u64().filter(|id| *id != 0)?;
            member_ids(&ctl, &ips[0])
                .into_iter()
                .find(|(_, m)| *m == id)
                .map(|(name, _)| name)
        })
    };
    let metric = |ip: &str, name: &str| -> u64 {
        let (_, text) = http_get(&format!("{ip}:2381"), "/metrics").expect("etcd's metrics listener");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map(|n| n as u64)
            .unwrap_or_else(|| panic!("no {name} from {ip}"))
    };
    let each = |name: &str| -> Vec<u64> { ips.iter().map(|ip| metric(ip, name)).collect() };
    const HASHES: &str = "etcd_mvcc_hash_rev_duration_seconds_count";
    const ELECTIONS: &str = "etcd_server_leader_changes_seen_total";
    for i in 0..20 {
        etcdctl(&ctl, &ips[writer], &["put", &format!("k{i}"), "v"]).unwrap();
    }
    // From here on: etcd's own counts, and each warden's drills begun after this point.
    let leader_before = leader();
    let hashes_before = each(HASHES);
    let elections_before = each(ELECTIONS);
    let runs_before: Vec<u64> = wardens
        .iter()
        .flatten()
        .map(|w| {
            w.status()["backup"]["restore_drill"]["runs"]
                .as_u64()
                .unwrap_or(0)
        })
        .collect();
    let drills: Vec<serde_json::Value> = wardens
        .iter()
        .flatten()
        .zip(&runs_before)
        .map(|(w, before)| {
            wait_for(
                "a later restore drill compared with the live cluster",
                START,
                || {
                    let d = w.status()["backup"]["restore_drill"].clone();
                    (d["runs"].as_u64() > Some(*before) && d["matches_live"] == true).then_some(d)
                },
            )
        })
        .collect();
    assert_eq!(
        each(ELECTIONS),
        elections_before,
        "an election during the drills (the leader was {leader_before}): the test cannot say which member led"
    );
    for d in &drills {
        let with = d["compared_with"].as_str().unwrap_or_default();
        assert!(
            !with.is_empty() && with != leader_before,
            "a drill compared with {with:?}, the leader is {leader_before}: {d}"
        );
    }
    let asked: Vec<u64> = each(HASHES)
        .iter()
        .zip(&hashes_before)
        .map(|(now, before)| now - before)
        .collect();
    let leader_i: usize = leader_before.trim_start_matches('m').parse().unwrap();
    assert_eq!(
        asked[leader_i], 0,
        "the leader m{leader_i} answered HashKV: etcd's counts per member since the drills began {asked:?}"
    );
    assert!(
        asked.iter().sum::<u64>() >= drills.len() as u64,
        "etcd counted fewer HashKV requests than drills compared: {asked:?}"
    );
    stop_all(&mut wardens);
}

/// The leader cut off for 10 s (its etcd stopped with SIGSTOP, its warden running): the majority
/// elects a leader whose warden takes over; the old writer can add nothing the majority does not
/// have; once the old leader is back it follows with no action, and the store restores exactly
/// what the majority holds.
#[test]
fn a_partitioned_leader_hands_over_and_rejoins_as_a_follower() {
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-partition");
    let first = the_writer(&wardens);
    wait_for("the first full snapshot", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let survivor = (first + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(800));
    let frozen = nix::unistd::Pid::from_raw(wardens[first].as_ref().unwrap().etcd_pid().unwrap());
    nix::sys::signal::kill(frozen, Signal::SIGSTOP).unwrap();
    let second = wait_for("a writer among the majority", START, || {
        wardens
            .iter()
            .enumerate()
            .find(|(i, w)| *i != first && w.as_ref().is_some_and(|w| role(w) == "writer"))
            .map(|(i, _)| i)
    });
    std::thread::sleep(Duration::from_secs(8));
    nix::sys::signal::kill(frozen, Signal::SIGCONT).unwrap();
    wait_for("the old leader's warden to follow", START, || {
        (role(wardens[first].as_ref().unwrap()) == "follower").then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let now = the_writer(&wardens);
    let (_, found) = one_chain_nothing_lost(
        &etcd,
        dir.path(),
        &store,
        wardens[now].as_ref().unwrap(),
        &ips[survivor],
        &acked,
        "restore after the partition",
    );
    let live = live_keys(&etcd, &ips[second], "k");
    assert_eq!(found, live, "the store holds other keys than the majority");
}

#[test]
fn a_store_cut_with_the_leader_killed_in_it_is_filled_from_the_last_uploaded_revision() {
    store_cut_and_leader_killed(Duration::from_secs(60), false);
}

#[test]
fn compaction_during_a_store_cut_and_a_leader_death_is_one_counted_chain_break() {
    store_cut_and_leader_killed(Duration::from_secs(15), true);
}

/// The store is cut for `cut` while writes go on; a third of the way in, the leader and its warden
/// die (their buffered deltas with them). Once the store is back, the new writer continues from the
/// last revision the store holds — or, when `compact` let etcd compact that revision away during
/// the cut, takes a full and counts exactly one chain break. Either way every acknowledged write is
/// in the store.
fn store_cut_and_leader_killed(cut: Duration, compact: bool) {
    use common::stores::{Proxy, create_bucket, moto, s3_env};
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let moto = moto(&ips[0], 5000);
    create_bucket(&moto.addr, "backups");
    let mut proxy = Proxy::start(&format!("{}:5001", ips[0]), &moto.addr);
    let env = s3_env(&format!("http://{}", proxy.addr));
    let store = "s3://backups/etcd/cut";
    let wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(&etcd, &ips, i, &dir.path().join(format!("m{i}")), "warden-cut");
            let opts = ["--store", store, "--delta-snapshot-period", "500ms"];
            Some(Warden::builder(&ips[i], &opts, &argv).envs(&env).spawn())
        })
        .collect();
    let mut wardens = wardens;
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let first = the_writer(&wardens);
    wait_for("the writer's first full snapshot", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let survivor = (first + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    let before_cut = wait_for("a delta before the cut", START, || {
        let b = &wardens[first].as_ref().unwrap().status()["backup"];
        (b["deltas_total"].as_u64() >= Some(2)).then(|| b["backed_up_revision"].as_i64().unwrap())
    });

    proxy.cut();
    let cut_at = std::time::Instant::now();
    wait_for("the writer to see the store down", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["healthy"] == false).then_some(())
    });
    std::thread::sleep(cut / 3);
    let mut dead = wardens[first].take().unwrap();
    let dead_etcd = dead.etcd_pid().unwrap();
    dead.signal(Signal::SIGKILL);
    dead.wait_exit(START);
    wait_for("the dead leader's etcd to be gone", START, || {
        (!alive(dead_etcd)).then_some(())
    });
    let second = the_writer(&wardens);
    if compact {
        std::thread::sleep(Duration::from_secs(1));
        let rev = etcd_revision(&ctl, &ips[survivor]);
        etcdctl(&ctl, &ips[survivor], &["compact", &rev.to_string()]).unwrap();
    }
    std::thread::sleep(cut.saturating_sub(cut_at.elapsed()));
    proxy.restore();
    eprintln!(
        "store back after {:.1}s; the store held revision {before_cut} before the cut",
        cut_at.elapsed().as_secs_f64()
    );
    let healed_at = std::time::Instant::now();
    let w = wardens[second].as_ref().unwrap();
    wait_for("the new writer to upload after the cut", START, || {
        let b = &w.status()["backup"];
        (b["healthy"] == true && b["backed_up_revision"].as_i64() > Some(before_cut)).then_some(())
    });
    eprintln!(
        "the new writer uploaded {:.2}s after the store came back",
        healed_at.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let rev = etcd_revision(&ctl, &ips[survivor]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let st = w.status();
    let breaks = st["backup"]["chain_breaks_total"].as_u64().unwrap();
    let list = Command::new(WARDEN)
        .args(["backups", "list", "--json", "--store", store])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let fulls: Vec<i64> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "full")
        .map(|r| r["first"].as_i64().unwrap())
        .collect();
    if compact {
        assert_eq!(
            breaks, 1,
            "one chain break when compaction overtook the chain: {st}"
        );
        let b = &st["backup"]["last_chain_break"];
        assert_eq!(
            b["after"].as_i64(),
            Some(before_cut),
            "the break starts after the store's last revision: {st}"
        );
        assert!(b["compacted"].as_i64() > Some(before_cut), "{st}");
        assert_eq!(
            fulls.len(),
            2,
            "the break's full (and only it) came after the first: {fulls:?}"
        );
    } else {
        assert_eq!(breaks, 0, "no chain break without compaction: {st}");
        assert_eq!(fulls.len(), 1, "a new chain was started: {fulls:?}");
    }
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--deep", "--store", store, "--etcd"])
        .arg(&etcd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "the chain does not verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let (found, _) = keys_after_restore(&etcd, store, &env, "k");
    assert_none_lost(&acked, &found, "restore after the cut");
    assert_eq!(
        found,
        live_keys(&etcd, &ips[survivor], "k"),
        "the store holds other keys than the cluster"
    );
    stop_all(&mut wardens);
}

/// Runs this test again inside a network namespace of its own (`unshare --net`, loopback up), so
/// its iptables rules touch nothing else; `true` in the copy that should do the work.
fn in_own_netns(test: &str) -> bool {
    if std::env::var_os("ETCD_WARDEN_TEST_NETNS").is_some() {
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(
            up.success(),
            "ip link set lo up failed in the test's network namespace"
        );
        return true;
    }
    let out = Command::new("unshare")
        .arg("--net")
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture"])
        .env("ETCD_WARDEN_TEST_NETNS", "1")
        .output()
        .expect("unshare --net (util-linux) runs the test in its own network namespace");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the test failed in its network namespace"
    );
    false
}

/// A cgroup (v2) per member, so iptables can tell one member's packets from another's on the one
/// loopback (`-m cgroup`); removed when dropped.
struct MemberCgroups(Vec<std::path::PathBuf>);

impl MemberCgroups {
    fn new(n: usize) -> Self {
        let root = Path::new("/sys/fs/cgroup/unified");
        let root = if root.join("cgroup.procs").exists() {
            root
        } else {
            Path::new("/sys/fs/cgroup")
        };
        assert!(
            root.join("cgroup.procs").exists(),
            "no cgroup v2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup: the partition test needs one"
        );
        Self(
            (0..n)
                .map(|i| {
                    let p = root.join(format!("etcd-warden-test-{}-m{i}", std::process::id()));
                    std::fs::create_dir_all(&p).unwrap();
                    p
                })
                .collect(),
        )
    }

    /// The path iptables' cgroup match takes (relative to the v2 root).
    fn name(&self, i: usize) -> String {
        self.0[i].file_name().unwrap().to_string_lossy().into_owned()
    }

    /// A wrapper that puts the warden (and so its etcd) into member `i`'s cgroup before exec.
    fn wrapper(&self, i: usize) -> Vec<String> {
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {}/cgroup.procs && exec \"$@\"", self.0[i].display()),
            "sh".into(),
        ]
    }
}

impl Drop for MemberCgroups {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir(p);
        }
    }
}

fn iptables(args: &[&str]) {
    let st = Command::new("iptables").args(args).status().expect("iptables");
    assert!(st.success(), "iptables {args:?} failed");
}

#[test]
fn a_leader_cut_off_by_iptables_for_30s_writes_nothing_the_majority_lacks_and_rejoins() {
    if !in_own_netns("a_leader_cut_off_by_iptables_for_30s_writes_nothing_the_majority_lacks_and_rejoins") {
        return;
    }
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let groups = MemberCgroups::new(3);
    let mut wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(
                &etcd,
                &ips,
                i,
                &dir.path().join(format!("m{i}")),
                "warden-iptables",
            );
            let wrapper = groups.wrapper(i);
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            let schedule = common::cluster::quiet_full_schedule();
            let opts = [
                "--store",
                store.as_str(),
                "--delta-snapshot-period",
                "200ms",
                "--full-snapshot-schedule",
                &schedule,
            ];
            Some(Warden::builder_with(&wrapper, &ips[i], &opts, &argv).spawn())
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let first = the_writer(&wardens);
    wait_for("the first full snapshot", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let survivor = (first + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(800));

    // The leader's host loses the network: its etcd neither dials nor answers a peer, its warden
    // reaches no other member. Its own etcd's client port and the (local) store stay reachable.
    let g = groups.name(first);
    let rules: [Vec<&str>; 3] = [
        vec![
            "-m", "cgroup", "--path", &g, "-p", "tcp", "--dport", "2380", "-j", "DROP",
        ],
        vec![
            "-m", "cgroup", "--path", &g, "-p", "tcp", "--sport", "2380", "-j", "DROP",
        ],
        vec![
            "-m",
            "cgroup",
            "--path",
            &g,
            "-p",
            "tcp",
            "!",
            "-d",
            &ips[first],
            "--dport",
            "2379",
            "-j",
            "DROP",
        ],
    ];
    for r in &rules {
        let mut a = vec!["-A", "OUTPUT"];
        a.extend_from_slice(r);
        iptables(&a);
    }
    let cut_at = std::time::Instant::now();
    let second = wait_for("a writer among the majority", START, || {
        wardens
            .iter()
            .enumerate()
            .find(|(i, w)| *i != first && w.as_ref().is_some_and(|w| role(w) == "writer"))
            .map(|(i, _)| i)
    });
    eprintln!(
        "a new writer {:.2}s into the partition",
        cut_at.elapsed().as_secs_f64()
    );
    wait_for("the cut-off leader's warden to stop writing", START, || {
        (role(wardens[first].as_ref().unwrap()) != "writer").then_some(())
    });
    let cut_off_rev = |w: &Warden| w.status()["backup"]["backed_up_revision"].as_i64();
    let isolated_rev = cut_off_rev(wardens[first].as_ref().unwrap());
    std::thread::sleep(Duration::from_secs(30).saturating_sub(cut_at.elapsed()));
    // Still cut off: the old leader's warden wrote nothing after it stopped leading.
    assert_ne!(role(wardens[first].as_ref().unwrap()), "writer");
    iptables(&["-F", "OUTPUT"]);
    let healed_at = std::time::Instant::now();
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    wait_for("the old leader's warden to follow", START, || {
        (role(wardens[first].as_ref().unwrap()) == "follower").then_some(())
    });
    let status_rev = |ip: &str| -> Option<i64> {
        let out = etcdctl(&ctl, ip, &["endpoint", "status", "-w", "json"]).ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v[0]["Status"]["header"]["revision"].as_i64()
    };
    // etcd itself reconnects its peers (TCP retransmission backoff after 30 s of drops): up to ~45 s here.
    wait_for(
        "the old leader's etcd to catch up",
        Duration::from_secs(120),
        || (status_rev(&ips[first])? >= status_rev(&ips[second])?).then_some(()),
    );
    eprintln!(
        "the old leader caught up {:.2}s after the heal",
        healed_at.elapsed().as_secs_f64()
    );
    let now = the_writer(&wardens);
    assert_ne!(now, first, "the old leader's warden writes again");
    let (rev, found) = one_chain_nothing_lost(
        &etcd,
        dir.path(),
        &store,
        wardens[now].as_ref().unwrap(),
        &ips[survivor],
        &acked,
        "restore after the partition",
    );
    assert_eq!(
        found,
        live_keys(&etcd, &ips[second], "k"),
        "the store holds other keys than the majority"
    );
    // Every object's revisions are the majority's history: a restore hashes like the live cluster.
    let restored = dir.path().join("restored");
    let out = Command::new(WARDEN)
        .args(["restore", "--bump-revision", "0", "--store", &store, "--data-dir"])
        .arg(&restored)
        .args(["--name", "m1", "--etcd"])
        .arg(&etcd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ip = unique_ip();
    let plain = PlainEtcd::start(&etcd, &ip, &restored, "m1");
    let restored_rev = etcd_revision(&ctl, &ip);
    assert!(restored_rev >= rev, "restored {restored_rev}, backed up {rev}");
    assert_eq!(
        hashkv(&ctl, &ip, restored_rev),
        hashkv(&ctl, &ips[second], restored_rev),
        "the restored history differs from the majority's at revision {restored_rev}"
    );
    plain.stop();
    eprintln!(
        "partition: the cut-off warden's last backed-up revision {isolated_rev:?}, the store at {rev}, {} writes acknowledged",
        acked.len()
    );
    stop_all(&mut wardens);
}

/// The writer's full is held (failpoint) between its last byte and its completion; meanwhile its
/// etcd is frozen and leadership moves. The new writer continues the older chain past the frozen
/// one's revision and writes the head. When the old writer's full completes, it is not published:
/// the head keeps naming the new writer (a later raft term), and a restore of "latest" takes the
/// chain the new writer extended, not the newer-named full, so it holds every acknowledged write.
#[test]
fn a_full_finished_after_leadership_moved_never_becomes_the_head_nor_the_latest_point() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    const HOLD: u64 = 12;
    let wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(
                &etcd,
                &ips,
                i,
                &dir.path().join(format!("m{i}")),
                "warden-stale-full",
            );
            Some(
                Warden::builder(
                    &ips[i],
                    &["--store", &store, "--delta-snapshot-period", "200ms"],
                    &argv,
                )
                .env("ETCD_WARDEN_FAILPOINT", "full-before-complete")
                .env("ETCD_WARDEN_FAILPOINT_PAUSE", &HOLD.to_string())
                .spawn(),
            )
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let old = the_writer(&wardens);
    let old_w = wardens[old].as_ref().unwrap();
    wait_for("the first full (held for the failpoint)", START, || {
        (old_w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let survivor = (old + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    wait_for("writes under way", START, || {
        (etcd_revision(&ctl, &ips[survivor]) > 50).then_some(())
    });
    // A second full, held before it completes; then the writer's etcd freezes.
    old_w.signal(Signal::SIGUSR1);
    wait_for(
        "the old writer's second full to reach the failpoint",
        START,
        || (old_w.log_text().matches("failpoint reached: pausing").count() >= 2).then_some(()),
    );
    let frozen_at = etcd_revision(&ctl, &ips[old]);
    let frozen = nix::unistd::Pid::from_raw(old_w.etcd_pid().unwrap());
    nix::sys::signal::kill(frozen, Signal::SIGSTOP).unwrap();
    let new = wait_for("a writer among the majority", START, || {
        (0..3).find(|i| *i != old && role(wardens[*i].as_ref().unwrap()) == "writer")
    });
    let new_w = wardens[new].as_ref().unwrap();
    wait_for(
        "the new writer to back up past the frozen full's revision",
        START,
        || (new_w.status()["backup"]["backed_up_revision"].as_i64() > Some(frozen_at + 100)).then_some(()),
    );
    let read_head = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join("store/v1/head.json")).unwrap()).unwrap()
    };
    // Either it declines (and says so), or it wrote the head: whichever comes first is its decision.
    wait_for(
        "the old writer to complete its full and decide on publishing it",
        START,
        || {
            (old_w
                .log_text()
                .contains("lost leadership while its full snapshot uploaded")
                || read_head()["member_name"] == format!("m{old}"))
            .then_some(())
        },
    );
    let head = read_head();
    assert_eq!(
        head["member_name"],
        format!("m{new}"),
        "the head names another writer than the new leader's: {head}"
    );
    nix::sys::signal::kill(frozen, Signal::SIGCONT).unwrap();
    wait_for("the old writer's warden to follow", START, || {
        (role(old_w) == "follower").then_some(())
    });
    let head_after = read_head();
    assert!(
        head_after["raft_term"].as_u64() >= head["raft_term"].as_u64(),
        "the head went back to an earlier term: {head} then {head_after}"
    );
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let now = the_writer(&wardens);
    let rev = etcd_revision(&ctl, &ips[survivor]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (wardens[now].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
    // The completed, unpublished full is in the store, above the chain's base.
    let fulls: Vec<i64> = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "full")
        .map(|r| r["last"].as_i64().unwrap())
        .collect();
    assert!(fulls.len() >= 2, "the held full is not in the store: {fulls:?}");
    let (found, _) = keys_after_restore(&etcd, &store, &[], "k");
    assert_none_lost(
        &acked,
        &found,
        "restore of latest after a full finished past its leadership",
    );
    assert_eq!(
        found,
        live_keys(&etcd, &ips[survivor], "k"),
        "the restore differs from the cluster"
    );
}

/// The writer is stopped gracefully while clients keep writing through another member: it uploads
/// nothing after its leadership ends (no tail read through a private etcd on its member data,
/// which would dial the peers), every object in the store carries the cluster's id, and the next
/// writer's chain holds every acknowledged write.
#[test]
fn a_writers_graceful_stop_under_writes_leaves_no_object_outside_the_cluster() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-graceful");
    let old = the_writer(&wardens);
    wait_for("the first full", START, || {
        (wardens[old].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let survivor = (old + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(ips[survivor].clone(), stop.clone());
    wait_for("writes under way", START, || {
        (etcd_revision(&ctl, &ips[survivor]) > 100).then_some(())
    });
    // The other wardens are frozen meanwhile (their etcds serve on): nothing but the stopping
    // writer uploads until it is gone, so the revisions its etcd applied after its last flush
    // (writes go on until etcd stops) are a tail only it could upload.
    for i in (0..3).filter(|i| *i != old) {
        wardens[i].as_ref().unwrap().signal(Signal::SIGSTOP);
    }
    let mut w = wardens[old].take().unwrap();
    w.signal(Signal::SIGTERM);
    let code = w.wait_exit(START);
    for i in (0..3).filter(|i| *i != old) {
        wardens[i].as_ref().unwrap().signal(Signal::SIGCONT);
    }
    // etcd's own status: Go re-raises SIGTERM after its clean shutdown.
    assert!(code == 0 || code == 143, "exit {code}: {}", w.log_text());
    let log = w.log_text();
    let now = the_writer(&wardens);
    let handover = etcd_revision(&ctl, &ips[survivor]);
    wait_for(
        "the new writer to back up writes made after the handover",
        START,
        || {
            (wardens[now].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64()
                > Some(handover + 20))
            .then_some(())
        },
    );
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let rev = etcd_revision(&ctl, &ips[survivor]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (wardens[now].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
    let cluster: serde_json::Value =
        serde_json::from_str(&etcdctl(&ctl, &ips[survivor], &["endpoint", "status", "-w", "json"]).unwrap())
            .unwrap();
    let cluster_id = cluster[0]["Status"]["header"]["cluster_id"].as_u64().unwrap();
    let s = etcd_warden::store::Store::open(&store.parse().unwrap()).unwrap();
    let rows = backups_list(&store, &[]);
    rt().block_on(async {
        for r in &rows {
            let key = r["key"].as_str().unwrap();
            let h = etcd_warden::store::format::read_header(s.inner.as_ref(), key, &s.keys.signing)
                .await
                .unwrap();
            assert_eq!(
                h.cluster_id, cluster_id,
                "{key} was written outside the cluster:\n{log}"
            );
        }
    });
    assert!(
        !std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tail.log")),
        "a private etcd ran on the stopped writer's member data"
    );
    let (found, _) = keys_after_restore(&etcd, &store, &[], "k");
    assert_none_lost(&acked, &found, "restore after the writer's graceful stop");
    stop_all(&mut wardens);
}

/// A seeded, printed schedule of faults against three members under steady writes through all
/// three, for `ETCD_WARDEN_FAULT_SECONDS` (600 in CI): etcd SIGKILLed (its warden restarts it) or
/// SIGSTOPped for a while, a member cut off from its peers by iptables (in the test's own network
/// namespace), the store (moto's S3) cut off for every warden, the leader moved, and once, in the
/// middle, a follower's data dir deleted. One fault at a time, each healed before the next. At the
/// end: every write acknowledged more than (delta period + 5 s) before the end is in a restore of
/// the store, `backups verify --deep` passes (no gap inside a chain), the revisions between chains
/// are printed, the restored newest point hashes (HashKV) like the live cluster, and no member's
/// data was moved aside. `ETCD_WARDEN_FAULT_SEED` replays a schedule.
#[test]
fn randomized_fault_schedule_against_three_members_under_writes() {
    use common::stores::{create_bucket, moto, s3_env};
    if !in_own_netns("randomized_fault_schedule_against_three_members_under_writes") {
        return;
    }
    let seconds: u64 = std::env::var("ETCD_WARDEN_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("ETCD_WARDEN_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        });
    eprintln!("fault schedule: seed {seed} (ETCD_WARDEN_FAULT_SEED={seed} replays it), {seconds} s");
    let mut rng = fastrand::Rng::with_seed(seed);
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let s3_ip = unique_ip();
    let moto = moto(&s3_ip, 5000);
    create_bucket(&moto.addr, "backups");
    let env = s3_env(&format!("http://{}", moto.addr));
    let store = "s3://backups/cluster".to_owned();
    const DELTA: Duration = Duration::from_millis(500);
    let groups = MemberCgroups::new(3);
    let start = |i: usize| {
        let argv = member_args_token(
            &etcd,
            &ips,
            i,
            &dir.path().join(format!("m{i}")),
            "warden-schedule",
        );
        let wrapper = groups.wrapper(i);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let opts = ["--store", store.as_str(), "--delta-snapshot-period", "500ms"];
        Warden::builder_with(&wrapper, &ips[i], &opts, &argv)
            .envs(&env)
            .spawn()
    };
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let first = the_writer(&wardens);
    wait_for("the first full snapshot", START, || {
        (wardens[first].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    // Writes through all three members, each acknowledged one with the moment it was.
    let stop = Arc::new(AtomicBool::new(false));
    let endpoints: Vec<String> = ips.iter().map(|ip| pki::client_url(ip)).collect();
    let ctl_tls = pki::client_flags(&ips[0]);
    let writes = {
        let stop = stop.clone();
        let ips = ips.clone();
        std::thread::spawn(move || {
            rt().block_on(async move {
                let opts = etcd_client::ConnectOptions::new()
                    .with_timeout(Duration::from_secs(2))
                    .with_connect_timeout(Duration::from_secs(2));
                let mut acked: Vec<(String, std::time::Instant)> = Vec::new();
                let mut client = None;
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    if client.is_none() {
                        client = pki::connect_all(&ips, Some(opts.clone())).await.ok();
                    }
                    let k = format!("k{n:07}");
                    n += 1;
                    let ok = match client.as_mut() {
                        Some(c) => c.put(k.as_str(), "v", None).await.is_ok(),
                        None => false,
                    };
                    if ok {
                        acked.push((k, std::time::Instant::now()));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                acked
            })
        })
    };
    let healthy = |wardens: &[Option<Warden>], what: &str| {
        wait_for(
            &format!("all three members ready after {what}"),
            Duration::from_secs(150),
            || {
                wardens
                    .iter()
                    .flatten()
                    .all(|w| matches!(w.get("/readyz"), Some((200, _))))
                    .then_some(())
            },
        );
    };
    let began = std::time::Instant::now();
    let deleted_at = seconds / 2;
    let mut deleted: Option<usize> = None;
    let mut schedule: Vec<String> = Vec::new();
    let mut counts = std::collections::BTreeMap::<&str, u32>::new();
    while began.elapsed() < Duration::from_secs(seconds) {
        let at = began.elapsed().as_secs();
        let i = rng.usize(0..3);
        let hold = Duration::from_millis(rng.u64(2_000..10_000));
        let kind = if deleted.is_none() && at >= deleted_at {
            "delete a follower's data dir"
        } else {
            [
                "SIGKILL etcd",
                "SIGSTOP etcd",
                "partition a member",
                "cut the store",
                "move the leader",
            ][rng.usize(0..5)]
        };
        *counts.entry(kind).or_default() += 1;
        let line = format!("{at:>4}s {kind} m{i} for {:.1}s", hold.as_secs_f64());
        eprintln!("fault schedule: {line}");
        schedule.push(line);
        let w = wardens[i].as_ref().unwrap();
        match kind {
            "SIGKILL etcd" => {
                if let Some(pid) = w.etcd_pid() {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                }
                std::thread::sleep(hold);
            }
            "SIGSTOP etcd" => {
                if let Some(pid) = w.etcd_pid() {
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, Signal::SIGSTOP);
                    std::thread::sleep(hold);
                    let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
                }
            }
            "partition a member" => {
                let g = groups.name(i);
                let rules: [Vec<&str>; 2] = [
                    vec![
                        "-m", "cgroup", "--path", &g, "-p", "tcp", "--dport", "2380", "-j", "DROP",
                    ],
                    vec![
                        "-m", "cgroup", "--path", &g, "-p", "tcp", "--sport", "2380", "-j", "DROP",
                    ],
                ];
                for r in &rules {
                    let mut a = vec!["-A", "OUTPUT"];
                    a.extend_from_slice(r);
                    iptables(&a);
                }
                std::thread::sleep(hold);
                iptables(&["-F", "OUTPUT"]);
            }
            "cut the store" => {
                iptables(&[
                    "-A", "OUTPUT", "-p", "tcp", "-d", &s3_ip, "--dport", "5000", "-j", "DROP",
                ]);
                std::thread::sleep(hold);
                iptables(&["-F", "OUTPUT"]);
            }
            "move the leader" => {
                let leader = the_writer(&wardens);
                let to = (leader + 1 + rng.usize(0..2)) % 3;
                // Asked through every member: the one moved to may be between two faults' ends.
                let listed = Command::new(&ctl)
                    .args(&ctl_tls)
                    .args([
                        "--endpoints",
                        &endpoints.join(","),
                        "member",
                        "list",
                        "-w",
                        "json",
                    ])
                    .output()
                    .ok()
                    .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok());
                let id = listed.and_then(|v| {
                    v["members"].as_array()?.iter().find_map(|m| {
                        (m["name"].as_str()? == format!("m{to}"))
                            .then(|| m["ID"].as_u64())
                            .flatten()
                    })
                });
                if let Some(id) = id {
                    let _ = Command::new(&ctl)
                        .args(&ctl_tls)
                        .args([
                            "--endpoints",
                            &endpoints.join(","),
                            "move-leader",
                            &format!("{id:x}"),
                        ])
                        .output();
                }
            }
            _ => {
                // A follower (not the writer), its etcd killed and its data dir deleted: it rejoins
                // through its peers as a learner.
                let writer_i = the_writer(&wardens);
                let v = (writer_i + 1) % 3;
                let w = wardens[v].as_ref().unwrap();
                let pid = w.etcd_pid().unwrap();
                std::fs::remove_dir_all(dir.path().join(format!("m{v}"))).unwrap();
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
                // Its warden must have seen the kill before "all three ready" means anything (a
                // check right after the kill still read the last verdict, and the next fault then
                // asked the dead member).
                wait_for("the warden to see its etcd killed", START, || {
                    (w.etcd_pid() != Some(pid)).then_some(())
                });
                deleted = Some(v);
                schedule.push(format!("       (the follower was m{v})"));
            }
        }
        healthy(&wardens, kind);
    }
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    let ended = std::time::Instant::now();
    let now = the_writer(&wardens);
    let rev = etcd_revision(&ctl, &ips[now]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (wardens[now].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
    let breaks: u64 = wardens
        .iter()
        .flatten()
        .map(|w| w.status()["backup"]["chain_breaks_total"].as_u64().unwrap_or(0))
        .sum();
    eprintln!("fault schedule ({seed}):\n{}", schedule.join("\n"));
    eprintln!(
        "faults: {counts:?}; {} writes acknowledged; revision {rev}; {breaks} chain breaks counted",
        acked.len()
    );
    // The store verifies, deeply.
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--deep", "--store", &store, "--etcd"])
        .arg(&etcd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "backups verify --deep: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    // Within a chain, `verify` above fails on any gap. Between chains, the revisions written while a
    // new full was taken are in that full (its state), not in a delta: a point-in-time restore to
    // one of them reaches the revision before. Printed, with the breaks counted.
    let rows = backups_list(&store, &env);
    let mut chains: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    for r in &rows {
        let chain = r["chain"].as_str().unwrap_or_default().to_owned();
        let (first, last) = (r["first"].as_i64().unwrap(), r["last"].as_i64().unwrap());
        let e = chains.entry(chain).or_insert((first, last));
        e.0 = e.0.min(first);
        e.1 = e.1.max(last);
    }
    let mut spans: Vec<(i64, i64)> = chains.into_values().collect();
    spans.sort();
    let holes: Vec<i64> = spans
        .windows(2)
        .filter(|w| w[1].0 > w[0].1 + 1)
        .map(|w| w[1].0 - w[0].1 - 1)
        .collect();
    eprintln!(
        "{} chains {spans:?}; revisions only in a full's state between chains: {holes:?}; {breaks} breaks counted",
        spans.len()
    );
    // Every write acknowledged more than (delta period + 5 s) before the end is in a restore.
    let (found, _) = keys_after_restore(&etcd, &store, &env, "k");
    let due: Vec<String> = acked
        .iter()
        .filter(|(_, at)| ended.duration_since(*at) > DELTA + Duration::from_secs(5))
        .map(|(k, _)| k.clone())
        .collect();
    assert_none_lost(&due, &found, "restore after the fault schedule");
    let all: Vec<String> = acked.iter().map(|(k, _)| k.clone()).collect();
    assert_none_lost(
        &all,
        &found,
        "restore after the fault schedule (every acknowledged write)",
    );
    // The newest point hashes like the live cluster.
    let restored = dir.path().join("restored");
    let out = Command::new(WARDEN)
        .args(["restore", "--bump-revision", "0", "--store", &store, "--data-dir"])
        .arg(&restored)
        .args(["--name", "r", "--etcd"])
        .arg(&etcd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ip = unique_ip();
    let plain = PlainEtcd::start(&etcd, &ip, &restored, "r");
    let restored_rev = etcd_revision(&ctl, &ip);
    assert!(restored_rev >= rev, "restored {restored_rev}, live {rev}");
    assert_eq!(
        hashkv(&ctl, &ip, restored_rev),
        hashkv(&ctl, &ips[now], restored_rev),
        "the restored newest point differs from the live cluster at revision {restored_rev}"
    );
    plain.stop();
    // Nothing was moved aside (the deleted dir was gone, not moved).
    let aside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| [".broken-", ".behind-", ".before-"].iter().any(|s| n.contains(s)))
        .collect();
    assert!(
        aside.is_empty(),
        "member data moved aside: {aside:?} (deleted: {deleted:?})"
    );
    assert!(
        deleted.is_some() || seconds < 4,
        "the schedule never deleted a data dir"
    );
    stop_all(&mut wardens);
}

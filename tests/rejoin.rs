//! A member that lost its data rejoins through its peers (clusters part 2): removed, added back
//! as a learner, started `existing`, promoted — never restored from the store — and a member that
//! finds no quorum never bootstraps a second cluster. Real etcd members on loopback, a warden each.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use nix::sys::signal::Signal;

/// A member as `etcdctl member list -w json` shows it.
#[derive(Debug, Clone)]
struct Listed {
    id: u64,
    name: String,
    peer_urls: Vec<String>,
    learner: bool,
}

fn members(ctl: &Path, ip: &str) -> Option<Vec<Listed>> {
    let out = etcdctl(ctl, ip, &["member", "list", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    Some(
        v["members"]
            .as_array()?
            .iter()
            .map(|m| Listed {
                id: m["ID"].as_u64().unwrap_or(0),
                name: m["name"].as_str().unwrap_or("").to_owned(),
                peer_urls: m["peerURLs"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|u| u.as_str().map(str::to_owned)).collect())
                    .unwrap_or_default(),
                learner: m["isLearner"].as_bool().unwrap_or(false),
            })
            .collect(),
    )
}

/// The cluster ID as the member at `ip` reports it.
fn cluster_id(ctl: &Path, ip: &str) -> Option<u64> {
    let out = etcdctl(ctl, ip, &["endpoint", "status", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v[0]["Status"]["header"]["cluster_id"].as_u64()
}

/// Writes through `ip` until stopped; returns the acknowledged keys and the longest time without
/// an acknowledged write.
fn timed_writer(ip: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Vec<String>, Duration)> {
    std::thread::spawn(move || {
        rt().block_on(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(2));
            let mut client = pki::connect(&ip, Some(opts)).await.unwrap();
            let mut acked = Vec::new();
            let mut last = Instant::now();
            let mut longest = Duration::ZERO;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let k = format!("r{n:06}");
                n += 1;
                if client.put(k.as_str(), "v", None).await.is_ok() {
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                    acked.push(k);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (acked, longest)
        })
    })
}

fn data_dir(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("m{i}"))
}

/// A warden for member `i` of `ips` with `envs`, not yet ready.
fn member(etcd: &Path, dir: &Path, store: &str, ips: &[String], i: usize, envs: &[(&str, String)]) -> Warden {
    let argv = member_args_token(etcd, ips, i, &data_dir(dir, i), "warden-rejoin");
    Warden::builder(
        &ips[i],
        &["--store", store, "--delta-snapshot-period", "200ms"],
        &argv,
    )
    .envs(envs)
    .spawn()
}

/// Waits until the member with peer URL `peer` is a voter under its own name, with an id other
/// than `old`; returns the new id.
fn wait_voter(ctl: &Path, via: &str, name: &str, peer: &str, old: u64, timeout: Duration) -> u64 {
    wait_for(
        &format!("{name} to be a promoted voter with a new member id"),
        timeout,
        || {
            let list = members(ctl, via)?;
            let m = list.iter().find(|m| m.peer_urls.iter().any(|u| u == peer))?;
            (m.name == name && !m.learner && m.id != old && list.len() == 3).then_some(m.id)
        },
    )
}

/// The member's etcd holds the leader's history: same HashKV at the leader's revision.
fn same_history(ctl: &Path, member_ip: &str, leader_ip: &str, what: &str) {
    let rev = etcd_revision(ctl, leader_ip);
    wait_for(
        &format!("{what}: the member to reach revision {rev}"),
        START,
        || {
            let out = etcdctl(ctl, member_ip, &["endpoint", "status", "-w", "json"]).ok()?;
            let v: serde_json::Value = serde_json::from_str(&out).ok()?;
            (v[0]["Status"]["header"]["revision"].as_i64()? >= rev).then_some(())
        },
    );
    assert_eq!(
        hashkv(ctl, member_ip, rev),
        hashkv(ctl, leader_ip, rev),
        "{what}: the member's history differs from the leader's at revision {rev}"
    );
}

#[test]
fn etcd_3_5_a_follower_whose_data_dir_vanishes_rejoins_as_a_learner() {
    data_dir_vanishes(&etcd35());
}

#[test]
fn etcd_3_4_a_follower_whose_data_dir_vanishes_rejoins_as_a_learner() {
    data_dir_vanishes(&etcd34());
}

#[test]
fn etcd_3_5_newest_a_follower_whose_data_dir_vanishes_rejoins_as_a_learner() {
    data_dir_vanishes(&etcd35_newest());
}

#[test]
fn etcd_3_6_a_follower_whose_data_dir_vanishes_rejoins_as_a_learner() {
    data_dir_vanishes(&etcd36());
}

#[test]
fn etcd_3_7_a_follower_whose_data_dir_vanishes_rejoins_as_a_learner() {
    data_dir_vanishes(&etcd37());
}

/// A follower's data dir is deleted and its etcd SIGKILLed under a running warden: the warden
/// does not respawn etcd on nothing; it removes the old entry, adds the member as a learner, starts
/// it `existing`, and it is promoted — with a new member id, no backup downloaded, writes going on.
fn data_dir_vanishes(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(etcd, dir.path(), &store, &ips, "m", "warden-rejoin");
    let writer_i = the_writer(&wardens);
    let victim = (writer_i + 1) % 3;
    let old = member_ids(&ctl, &ips[writer_i])
        .into_iter()
        .find(|(n, _)| *n == format!("m{victim}"))
        .unwrap()
        .1;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = timed_writer(ips[writer_i].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(500));

    let w = wardens[victim].as_ref().unwrap();
    let etcd_pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(dir.path().join(format!("m{victim}"))).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(etcd_pid), Signal::SIGKILL).unwrap();
    let lost_at = Instant::now();
    let id = wait_voter(
        &ctl,
        &ips[writer_i],
        &format!("m{victim}"),
        &format!("https://{}:2380", ips[victim]),
        old,
        START,
    );
    let promoted_s = lost_at.elapsed().as_secs_f64();
    w.wait_ready(START);
    eprintln!("data loss -> promoted voter {id:x}: {promoted_s:.2}s");
    assert!(promoted_s < 60.0, "promoted after {promoted_s:.1}s");
    stop.store(true, Ordering::SeqCst);
    let (acked, longest) = writes.join().unwrap();
    assert!(acked.len() > 20, "too few writes: {}", acked.len());
    assert!(
        longest < Duration::from_secs(2),
        "writes failed for {longest:?} during the repair"
    );
    same_history(&ctl, &ips[victim], &ips[writer_i], "after the rejoin");
    // Rejoined through the peers, not from the store.
    let st = w.status();
    assert_eq!(st["restore"]["startup_restores"]["total"], 0, "{st}");
    let log = w.log_text();
    assert!(
        log.contains("rejoined as learner") || log.contains("added as a learner"),
        "{log}"
    );
    assert!(
        beside_done(dir.path(), victim),
        "the repair journal was not closed"
    );
    assert_eq!(members(&ctl, &ips[writer_i]).unwrap().len(), 3);
    stop_all(&mut wardens);
}

fn beside_done(dir: &Path, i: usize) -> bool {
    dir.join(format!("m{i}.warden-repair.done.json")).exists()
}

/// A follower's db is truncated while it is stopped, and its warden is killed right after the
/// repair removed the old entry, and again right after it added the learner (before it heard the
/// new id): each restart resumes from the journal, and the cluster ends with three voters, no
/// second learner, the broken dir kept aside. Meanwhile, with one peer down (no quorum), the repair
/// waits and changes nothing.
#[test]
fn a_truncated_db_is_kept_aside_and_the_repair_resumes_after_each_crash() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-rejoin");
    let writer_i = the_writer(&wardens);
    for n in 0..200 {
        etcdctl(
            &ctl,
            &ips[writer_i],
            &["put", &format!("t{n:04}"), &"x".repeat(1000)],
        )
        .unwrap();
    }
    let victim = (writer_i + 1) % 3;
    let other = (writer_i + 2) % 3;
    let old = member_ids(&ctl, &ips[writer_i])
        .into_iter()
        .find(|(n, _)| *n == format!("m{victim}"))
        .unwrap()
        .1;
    let mut w = wardens[victim].take().unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let data = data_dir(dir.path(), victim);
    let db = data.join("member/snap/db");
    // Cut inside the pages bbolt uses (its file is grown in 16 MiB steps, so half the file can be
    // all padding): four 4 KiB pages are left, the two meta pages among them.
    let len = 16 * 1024;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len)
        .unwrap();

    // No quorum (another member down too): the repair waits, says why, and moves nothing.
    let mut o = wardens[other].take().unwrap();
    o.signal(Signal::SIGTERM);
    o.wait_exit(START);
    let waiting = member(&etcd, dir.path(), &store, &ips, victim, &[]);
    let reason = wait_for("the repair to wait for quorum", START, || {
        let (code, body) = waiting.get("/readyz")?;
        (code == 503 && body.contains("a repair needs quorum")).then_some(body)
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(db.exists(), "the broken data dir moved without quorum: {reason}");
    assert_eq!(waiting.etcd_pid(), None, "etcd started on broken data");
    drop(waiting);
    wardens[other] = Some(member(&etcd, dir.path(), &store, &ips, other, &[]));
    wardens[other].as_ref().unwrap().wait_ready(START);

    // The repair dies after removing the old entry...
    let crash = |point: &str| {
        let mut c = member(
            &etcd,
            dir.path(),
            &store,
            &ips,
            victim,
            &[("ETCD_WARDEN_FAILPOINT", point.to_owned())],
        );
        let code = c.wait_exit(START);
        assert_ne!(code, 0, "the warden did not die at {point}");
    };
    crash("repair-after-remove");
    let list = members(&ctl, &ips[writer_i]).unwrap();
    assert_eq!(list.len(), 2, "the old entry is still there: {list:?}");
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("m{victim}.broken-"))
        })
        .collect();
    assert_eq!(aside.len(), 1, "the broken dir is not kept aside once");
    let kept = aside[0].path().join("member/snap/db");
    assert_eq!(
        std::fs::metadata(&kept).unwrap().len(),
        len,
        "the kept dir is not the broken one"
    );
    // ...and after adding the learner, before it heard the new id.
    crash("repair-after-add");
    let list = members(&ctl, &ips[writer_i]).unwrap();
    assert_eq!(list.iter().filter(|m| m.learner).count(), 1, "{list:?}");
    assert_eq!(list.len(), 3, "{list:?}");

    let w = member(&etcd, dir.path(), &store, &ips, victim, &[]);
    let id = wait_voter(
        &ctl,
        &ips[writer_i],
        &format!("m{victim}"),
        &format!("https://{}:2380", ips[victim]),
        old,
        START,
    );
    w.wait_ready(START);
    let list = members(&ctl, &ips[writer_i]).unwrap();
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|m| !m.learner), "{list:?}");
    assert!(list.iter().any(|m| m.id == id));
    same_history(&ctl, &ips[victim], &ips[writer_i], "after the resumed repair");
    wardens[victim] = Some(w);
    stop_all(&mut wardens);
}

/// Two of three data dirs wiped while the cluster was down: the two wardens find no leader, see
/// that the cluster existed (the surviving member's list, the store's record), and wait, saying
/// "quorum lost"; neither starts an etcd, so no second cluster id ever appears.
#[test]
fn two_members_wiped_while_stopped_never_bootstrap_a_new_cluster() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-rejoin");
    let writer_i = the_writer(&wardens);
    wait_for("the prefix claimed in the store", START, || {
        dir.path().join("store/v1/cluster.json").exists().then_some(())
    });
    let id = cluster_id(&ctl, &ips[writer_i]).unwrap();
    stop_all(&mut wardens);
    let kept = writer_i;
    for i in (0..3).filter(|i| *i != kept) {
        std::fs::remove_dir_all(data_dir(dir.path(), i)).unwrap();
    }
    let wardens: Vec<Warden> = (0..3)
        .map(|i| member(&etcd, dir.path(), &store, &ips, i, &[]))
        .collect();
    for i in (0..3).filter(|i| *i != kept) {
        let body = wait_for(&format!("m{i} to say quorum lost"), START, || {
            let (code, body) = wardens[i].get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(body)
        });
        assert!(
            body.contains("ran before") || body.contains("records cluster"),
            "{body}"
        );
    }
    // For a while: no etcd on the wiped members, and the only cluster id is the old one.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        for i in (0..3).filter(|i| *i != kept) {
            assert_eq!(wardens[i].etcd_pid(), None, "m{i} started an etcd without quorum");
            assert!(
                !data_dir(dir.path(), i).join("member").exists(),
                "m{i} bootstrapped"
            );
        }
        if let Some(now) = cluster_id(&ctl, &ips[kept]) {
            assert_eq!(now, id, "a second cluster id appeared");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_ne!(
        wardens[kept].get("/readyz").map(|r| r.0),
        Some(200),
        "a lone member is ready"
    );
}

/// `etcd-warden cluster restore --store … [extra]`; its stdout.
fn cluster_restore(store: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new(WARDEN)
        .args(["cluster", "restore", "--store", store])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster restore failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three members up with `n` keys written and backed up; returns the wardens and the revision
/// the store holds.
fn cluster_with_backups(
    etcd: &Path,
    dir: &Path,
    store: &str,
    ips: &[String],
    n: usize,
) -> (Vec<Option<Warden>>, i64) {
    let ctl = etcdctl_for(etcd);
    let wardens = start_members(etcd, dir, store, ips, "m", "warden-rejoin");
    let w = the_writer(&wardens);
    wait_for("the writer's first full", START, || {
        (wardens[w].as_ref().unwrap().status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    for i in 0..n {
        etcdctl(
            &ctl,
            &ips[w],
            &["put", &format!("q{i:04}"), &format!("value-{i}")],
        )
        .unwrap();
    }
    etcdctl(&ctl, &ips[w], &["del", "q0000"]).unwrap();
    let rev = etcd_revision(&ctl, &ips[w]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (wardens[w].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
    (wardens, rev)
}

/// Every member of `ips` ready, three voters, and all at one revision with one HashKV; returns
/// that revision and hash.
fn one_cluster_again(ctl: &Path, wardens: &[Warden], ips: &[String]) -> (i64, u64) {
    for w in wardens {
        w.wait_ready(START);
    }
    let list = members(ctl, &ips[0]).unwrap();
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|m| !m.learner), "{list:?}");
    let revs: Vec<i64> = ips.iter().map(|ip| etcd_revision(ctl, ip)).collect();
    assert!(
        revs.iter().all(|r| *r == revs[0]),
        "members at different revisions: {revs:?}"
    );
    // At the current revision (`--rev=0`): after --mark-compacted etcd 3.4 refuses the compacted
    // revision itself, which here is the current one.
    let hashes: Vec<u64> = ips.iter().map(|ip| hashkv(ctl, ip, 0)).collect();
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "members hash differently: {hashes:?}"
    );
    (revs[0], hashes[0])
}

/// All three data dirs lost: the wardens wait ("quorum lost", naming the command); one
/// `cluster restore --bump-revision 1000000 --mark-compacted` brings the three members back at
/// the backed-up revision plus the bump, equal everywhere, every key as it was, a watch from before
/// the loss told "compacted"; the old chain stays listed and restorable, the new cluster starts its
/// own chain with a full and takes over the prefix; a restart does not restore again.
#[test]
fn etcd_3_5_all_three_wiped_come_back_with_one_cluster_restore() {
    all_three_wiped(&etcd35());
}

#[test]
fn etcd_3_4_all_three_wiped_come_back_with_one_cluster_restore() {
    all_three_wiped(&etcd34());
}

#[test]
fn etcd_3_5_newest_all_three_wiped_come_back_with_one_cluster_restore() {
    all_three_wiped(&etcd35_newest());
}

#[test]
fn etcd_3_6_all_three_wiped_come_back_with_one_cluster_restore() {
    all_three_wiped(&etcd36());
}

#[test]
fn etcd_3_7_all_three_wiped_come_back_with_one_cluster_restore() {
    all_three_wiped(&etcd37());
}

fn all_three_wiped(etcd: &Path) {
    let etcd = etcd.to_path_buf();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let (mut wardens, rev) = cluster_with_backups(&etcd, dir.path(), &store, &ips, 300);
    let before = live_keys(&etcd, &ips[0], "q");
    let old_id = cluster_id(&ctl, &ips[0]).unwrap();
    stop_all(&mut wardens);
    let old_fulls: Vec<_> = std::fs::read_dir(dir.path().join("store/v1/full"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    for i in 0..3 {
        std::fs::remove_dir_all(data_dir(dir.path(), i)).unwrap();
    }
    let mut wardens: Vec<Warden> = (0..3)
        .map(|i| member(&etcd, dir.path(), &store, &ips, i, &[]))
        .collect();
    for (i, w) in wardens.iter().enumerate() {
        let body = wait_for(&format!("m{i} to say quorum lost"), START, || {
            let (code, body) = w.get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(body)
        });
        assert!(body.contains("etcd-warden cluster restore --store"), "{body}");
    }
    let out = cluster_restore(&store, &["--bump-revision", "1000000", "--mark-compacted"]);
    assert!(out.contains(&format!("to revision {rev}")), "{out}");
    let restored_at = Instant::now();
    let (now_rev, _) = one_cluster_again(&ctl, &wardens, &ips);
    eprintln!(
        "cluster restore -> three ready members: {:.2}s",
        restored_at.elapsed().as_secs_f64()
    );
    assert_eq!(
        now_rev,
        rev + 1_000_000,
        "not the backed-up revision plus the bump"
    );
    assert_eq!(
        live_keys(&etcd, &ips[1], "q"),
        before,
        "keys differ from before the loss"
    );
    let value = etcdctl(&ctl, &ips[2], &["get", "q0123", "--print-value-only"]).unwrap();
    assert_eq!(value.trim(), "value-123");
    let new_id = cluster_id(&ctl, &ips[0]).unwrap();
    assert_ne!(new_id, old_id, "the restored cluster kept the lost one's id");
    // A watch from before the loss is told the history is compacted.
    let watch = std::process::Command::new(&ctl)
        .args(pki::client_flags(&ips[0]))
        .args([
            "--endpoints",
            &pki::client_url(&ips[0]),
            "watch",
            "q",
            "--prefix",
            "--rev=5",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&watch.stdout),
        String::from_utf8_lossy(&watch.stderr)
    );
    assert!(
        said.contains("compacted"),
        "an old watch was not told compacted: {said}"
    );
    // The new cluster writes its own chain (a full at the restored revision) under the prefix
    // it took over; the old chain is still there and restorable.
    let writer_i = wait_for("a writer in the restored cluster", START, || {
        (0..3).find(|i| role(&wardens[*i]) == "writer")
    });
    wait_for("the new cluster's first full", START, || {
        (wardens[writer_i].status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let owner: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("store/v1/cluster.json")).unwrap()).unwrap();
    assert_eq!(owner["cluster_id"].as_u64(), Some(new_id), "{owner}");
    let fulls: Vec<_> = std::fs::read_dir(dir.path().join("store/v1/full"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    for f in &old_fulls {
        assert!(fulls.contains(f), "the old chain's {f:?} is gone");
    }
    assert!(
        fulls
            .iter()
            .any(|f| f.to_string_lossy().contains(&format!("{:020}", now_rev))),
        "no full at the restored revision {now_rev}: {fulls:?}"
    );
    let old = dir.path().join("old-chain");
    let out = std::process::Command::new(WARDEN)
        .args([
            "restore",
            "--store",
            &store,
            "--to-revision",
            &rev.to_string(),
            "--data-dir",
        ])
        .arg(&old)
        .arg("--etcd")
        .arg(&etcd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the old chain is not restorable: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A restarted member does not restore by the plan again.
    let mut w = wardens.remove(1);
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let w = member(&etcd, dir.path(), &store, &ips, 1, &[]);
    w.wait_ready(START);
    assert!(!w.log_text().contains("RESTORING"), "restored by the plan again");
    assert!(
        !std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with("m1.before-cluster-restore")),
        "m1 moved its restored data aside"
    );
}

/// Two data dirs lost, the third member intact and running without a leader: `cluster restore`
/// (no bump) restores all three — the intact one too, its dir kept aside — to exactly the
/// backed-up revision, with the HashKV the cluster had there before the loss.
#[test]
fn a_cluster_restore_reaches_the_exact_history_and_includes_the_intact_member() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let (mut wardens, rev) = cluster_with_backups(&etcd, dir.path(), &store, &ips, 200);
    let hash_before = hashkv(&ctl, &ips[0], rev);
    stop_all(&mut wardens);
    for i in 1..3 {
        std::fs::remove_dir_all(data_dir(dir.path(), i)).unwrap();
    }
    let wardens: Vec<Warden> = (0..3)
        .map(|i| member(&etcd, dir.path(), &store, &ips, i, &[]))
        .collect();
    for (i, w) in wardens.iter().enumerate().skip(1) {
        wait_for(&format!("m{i} to say quorum lost"), START, || {
            let (code, body) = w.get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(())
        });
    }
    wait_for("the intact member's etcd to run", START, || wardens[0].etcd_pid());
    cluster_restore(&store, &["--bump-revision", "0"]);
    let (now_rev, hash) = one_cluster_again(&ctl, &wardens, &ips);
    assert_eq!(now_rev, rev, "not exactly the backed-up revision");
    assert_eq!(
        hash, hash_before,
        "the restored history differs from the one before the loss"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with("m0.before-cluster-restore")),
        "the intact member's data was not kept aside"
    );
}

/// Five members, two followers' data dirs wiped at once: both rejoin — one learner at a time, as
/// etcd 3.4/3.5 allow (the second waits for the first's promotion) — with quorum held throughout.
#[test]
fn five_members_with_two_dirs_wiped_at_once_rejoin_one_learner_at_a_time() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..5).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-rejoin");
    let writer_i = the_writer(&wardens);
    let victims = [(writer_i + 1) % 5, (writer_i + 2) % 5];
    let old: Vec<u64> = member_ids(&ctl, &ips[writer_i])
        .into_iter()
        .filter(|(n, _)| victims.iter().any(|v| *n == format!("m{v}")))
        .map(|(_, id)| id)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = timed_writer(ips[writer_i].clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    for v in victims {
        let pid = wardens[v].as_ref().unwrap().etcd_pid().unwrap();
        std::fs::remove_dir_all(data_dir(dir.path(), v)).unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    }
    let lost_at = Instant::now();
    let mut most_learners = 0;
    let done = wait_for(
        "both wiped members to be voters again",
        Duration::from_secs(120),
        || {
            let list = members(&ctl, &ips[writer_i])?;
            most_learners = most_learners.max(list.iter().filter(|m| m.learner).count());
            let back = victims.iter().all(|v| {
                list.iter()
                    .any(|m| m.name == format!("m{v}") && !m.learner && !old.contains(&m.id))
            });
            (back && list.len() == 5).then_some(list)
        },
    );
    eprintln!(
        "two of five wiped -> both promoted: {:.2}s, at most {most_learners} learner at once",
        lost_at.elapsed().as_secs_f64()
    );
    for v in victims {
        for l in wardens[v]
            .as_ref()
            .unwrap()
            .log_text()
            .lines()
            .filter(|l| l.contains("learner"))
        {
            eprintln!("m{v}: {l}");
        }
    }
    assert!(most_learners <= 1, "two learners at once");
    assert!(done.iter().all(|m| !m.learner), "{done:?}");
    stop.store(true, Ordering::SeqCst);
    let (acked, longest) = writes.join().unwrap();
    assert!(acked.len() > 20, "too few writes: {}", acked.len());
    assert!(
        longest < Duration::from_secs(2),
        "writes failed for {longest:?}: quorum was lost"
    );
    for v in victims {
        wardens[v].as_ref().unwrap().wait_ready(START);
        same_history(&ctl, &ips[v], &ips[writer_i], &format!("m{v}"));
    }
    stop_all(&mut wardens);
}

/// Scale 1 → 3 under writes (each new member's warden adds it as a learner through the first one,
/// which then writes as the cluster's one writer or hands over) and back to 1 with `ctl leave`:
/// every acknowledged write in the store, the chain verifies, a left member never rejoins.
#[test]
fn scale_one_to_three_and_back_with_ctl_leave() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let socket = |i: usize| dir.path().join(format!("admin{i}.sock"));
    let start = |i: usize| {
        let argv = member_args_token(&etcd, &ips[..=i], i, &data_dir(dir.path(), i), "warden-scale");
        let sock = socket(i).display().to_string();
        let opts = [
            "--store",
            store.as_str(),
            "--delta-snapshot-period",
            "200ms",
            "--admin-socket",
            sock.as_str(),
        ];
        Warden::builder(&ips[i], &opts, &argv).spawn()
    };
    let m0 = start(0);
    m0.wait_ready(START);
    wait_for("the single member's first full", START, || {
        (m0.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writes = timed_writer(ips[0].clone(), stop.clone());
    let mut wardens = vec![Some(m0)];
    for i in 1..3 {
        let w = start(i);
        wait_for(&format!("m{i} to be a voter"), START, || {
            let list = members(&ctl, &ips[0])?;
            (list.len() == i + 1 && list.iter().all(|m| !m.learner && !m.name.is_empty())).then_some(())
        });
        w.wait_ready(START);
        wardens.push(Some(w));
    }
    let writer_i = the_writer(&wardens);
    eprintln!("scaled to three; m{writer_i} writes");
    // Back to one: m2 (made the leader first, so its leave moves leadership away), then m1.
    let m2_id = members(&ctl, &ips[0])
        .unwrap()
        .into_iter()
        .find(|m| m.name == "m2")
        .unwrap()
        .id;
    let all = ips
        .iter()
        .map(|ip| pki::client_url(ip))
        .collect::<Vec<_>>()
        .join(",");
    let moved = std::process::Command::new(&ctl)
        .args(pki::client_flags(&ips[0]))
        .args(["--endpoints", &all, "move-leader", &format!("{m2_id:x}")])
        .output()
        .unwrap();
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    wait_for("m2's warden to write", START, || {
        (role(wardens[2].as_ref().unwrap()) == "writer").then_some(())
    });
    for i in [2, 1] {
        let out = std::process::Command::new(WARDEN)
            .args(["ctl", "--admin-socket"])
            .arg(socket(i))
            .arg("leave")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctl leave m{i}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut w = wardens[i].take().unwrap();
        assert_eq!(
            w.wait_exit(START),
            0,
            "m{i}'s warden did not exit cleanly after leaving"
        );
        let list = members(&ctl, &ips[0]).unwrap();
        assert_eq!(list.len(), i, "m{i} still listed: {list:?}");
        assert!(left_marker(dir.path(), i), "no left marker for m{i}");
    }
    wait_for("m0 to write alone", START, || {
        (role(wardens[0].as_ref().unwrap()) == "writer").then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let (acked, longest) = writes.join().unwrap();
    eprintln!(
        "{} writes acknowledged, longest without one {longest:?}",
        acked.len()
    );
    // A left member's restart waits, never rejoining with the removed WAL.
    let again = start(2);
    let body = wait_for("the left member's restart to wait", START, || {
        let (code, body) = again.get("/readyz")?;
        (code == 503 && body.contains("left its cluster")).then_some(body)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(again.etcd_pid(), None, "{body}");
    assert_eq!(members(&ctl, &ips[0]).unwrap().len(), 1);
    drop(again);
    let w = wardens[0].as_ref().unwrap();
    let rev = etcd_revision(&ctl, &ips[0]);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let verify = std::process::Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let (found, _) = keys_after_restore(&etcd, &store, &[], "r");
    assert_none_lost(&acked, &found, "restore after scaling 1 -> 3 -> 1");
}

fn left_marker(dir: &Path, i: usize) -> bool {
    dir.join(format!("m{i}.warden-left.json")).exists()
}

/// A member restarted with a changed peer URL (another port): its warden updates the member through
/// a peer before etcd starts, and the cluster dials it at the new address.
#[test]
fn a_changed_peer_url_is_updated_through_a_peer() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-rejoin");
    let writer_i = the_writer(&wardens);
    let moved = (writer_i + 1) % 3;
    let mut w = wardens[moved].take().unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let old_url = format!("https://{}:2380", ips[moved]);
    let new_url = format!("https://{}:2390", ips[moved]);
    let argv: Vec<String> =
        member_args_token(&etcd, &ips, moved, &data_dir(dir.path(), moved), "warden-rejoin")
            .into_iter()
            .map(|a| a.replace(&old_url, &new_url))
            .collect();
    let w = Warden::builder(
        &ips[moved],
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &argv,
    )
    .spawn();
    w.wait_ready(START);
    let list = members(&ctl, &ips[writer_i]).unwrap();
    let m = list.iter().find(|m| m.name == format!("m{moved}")).unwrap();
    assert_eq!(m.peer_urls, vec![new_url.clone()], "{list:?}");
    // The moved member follows the cluster's writes at its new address.
    etcdctl(&ctl, &ips[writer_i], &["put", "after-move", "yes"]).unwrap();
    wait_for("the moved member to serve the new write", START, || {
        etcdctl(&ctl, &ips[moved], &["get", "after-move", "--print-value-only"])
            .ok()
            .filter(|v| v.trim() == "yes")
    });
    assert!(w.log_text().contains("peer URLs changed"), "{}", w.log_text());
    wardens[moved] = Some(w);
    stop_all(&mut wardens);
}

/// A cluster restore plan is bound to its chain and revision, and one is pending at a time: all
/// three data dirs lost, two members come back and restore by the plan, a second `cluster
/// restore` is refused (exit 64) unless `--replace`, the restored cluster writes and takes new
/// fulls under `--retention last:1`, and the third member, started late, still restores exactly
/// the plan's point (the retention kept that chain) and joins: one cluster, one HashKV. Once all
/// three applied it, the plan is retired.
#[test]
fn a_late_member_restores_the_plans_own_point_after_the_restored_cluster_moved_on() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let (mut wardens, rev) = cluster_with_backups(&etcd, dir.path(), &store, &ips, 200);
    stop_all(&mut wardens);
    for i in 0..3 {
        std::fs::remove_dir_all(data_dir(dir.path(), i)).unwrap();
    }
    let keep_one = [("ETCD_WARDEN_RETENTION", "last:1".to_owned())];
    let two: Vec<Warden> = (0..2)
        .map(|i| member(&etcd, dir.path(), &store, &ips, i, &keep_one))
        .collect();
    for (i, w) in two.iter().enumerate() {
        wait_for(&format!("m{i} to say quorum lost"), START, || {
            let (code, body) = w.get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(())
        });
    }
    // docs/restore.md's quorum-lost runbook, as written: its first block writes the plan.
    let runbook = runbook_blocks("docs/restore.md", "quorum");
    assert_eq!(runbook.len(), 2, "plan, check: {runbook:#?}");
    let endpoints = ips
        .iter()
        .map(|ip| pki::client_url(ip))
        .collect::<Vec<_>>()
        .join(",");
    // ETCDCTL_ENDPOINTS exported too, as docs/cluster.md's check step leaves it: etcdctl exits when
    // a flag shadows that variable, so the runbook must not pass --endpoints.
    let mut vars = vec![
        ("STORE", store.clone()),
        ("ENDPOINTS", endpoints.clone()),
        ("ETCDCTL_ENDPOINTS", endpoints),
    ];
    vars.extend(pki::etcdctl_env(&ips[0]));
    let bins = [Path::new(WARDEN).parent().unwrap(), etcd.parent().unwrap()];
    let out = run_block(
        &runbook[0],
        &vars,
        &bins,
        "the runbook's step 1 (cluster restore)",
    );
    assert!(out.contains(&format!("to revision {rev}")), "{out}");
    // A second plan while this one is pending: refused, naming the way out.
    let again = std::process::Command::new(WARDEN)
        .args(["cluster", "restore", "--store", &store])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(64), "{said}");
    assert!(said.contains("pending") && said.contains("--replace"), "{said}");
    for w in &two {
        w.wait_ready(START);
    }
    // The restored cluster moves on: writes, then fulls under last:1.
    for i in 0..50 {
        etcdctl(&ctl, &ips[0], &["put", &format!("after{i:03}"), "x"]).unwrap();
    }
    let writer_i = wait_for("a writer in the restored cluster", START, || {
        (0..2).find(|i| role(&two[*i]) == "writer")
    });
    let fulls_before = two[writer_i].status()["backup"]["fulls_total"]
        .as_u64()
        .unwrap_or(0);
    two[writer_i].signal(Signal::SIGUSR1);
    wait_for("a full of the restored cluster after its writes", START, || {
        (two[writer_i].status()["backup"]["fulls_total"].as_u64() > Some(fulls_before)).then_some(())
    });
    let listed = backups_list(&store, &[]);
    assert!(
        listed
            .iter()
            .any(|r| r["kind"] == "full" && r["last"].as_i64().unwrap() > rev),
        "no full of the restored cluster past the plan's revision: {listed:#?}"
    );
    // The third member, late.
    let late = member(&etcd, dir.path(), &store, &ips, 2, &keep_one);
    late.wait_ready(START);
    let log = late.log_text();
    assert!(
        log.contains("member restored by the cluster restore plan")
            && log.contains(&format!("backed_up_revision={rev}")),
        "the late member did not restore the plan's revision {rev}:\n{log}"
    );
    let mut all = two;
    all.push(late);
    one_cluster_again(&ctl, &all, &ips);
    // The runbook's step 3: every member answers its status and hash.
    let checked = run_block(&runbook[1], &vars, &bins, "the runbook's step 3 (check)");
    for ip in &ips {
        assert_eq!(
            checked.matches(&pki::client_url(ip)).count(),
            2,
            "status and hash of {ip}:\n{checked}"
        );
    }
    let revisions: std::collections::BTreeSet<&str> = checked
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"Revision\" : "))
        .collect();
    assert_eq!(revisions.len(), 1, "one revision on every member:\n{checked}");
    assert_eq!(
        checked.matches("\"Revision\" : ").count(),
        3,
        "a revision from every member:\n{checked}"
    );
    let value = etcdctl(&ctl, &ips[2], &["get", "after049", "--print-value-only"]).unwrap();
    assert_eq!(value.trim(), "x");
    let current: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("store/v1/cluster-restore/current.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        current["retired"], true,
        "the applied plan is still pending: {current}"
    );
    // With nothing pending, a new plan is accepted again.
    let listing = std::process::Command::new(WARDEN)
        .args(["backups", "list", "--store", &store])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listing.stdout);
    assert!(!text.contains("pending"), "{text}");
    stop_all(&mut all.into_iter().map(Some).collect::<Vec<_>>());
}

/// `ctl leave` on a member whose cluster would lose quorum without it (another member frozen) is
/// refused, saying so, and changes nothing; once the other is back, a follower leaves and the
/// store's member list (what `cluster restore` restores by default, shown by `backups list`)
/// follows at once, though leadership never moved.
#[test]
fn a_leave_that_would_lose_quorum_is_refused_and_the_store_follows_the_membership() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let socket = |i: usize| dir.path().join(format!("admin{i}.sock"));
    let mut wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(&etcd, &ips, i, &data_dir(dir.path(), i), "warden-leave");
            let sock = socket(i).display().to_string();
            Some(
                Warden::builder(
                    &ips[i],
                    &[
                        "--store",
                        &store,
                        "--delta-snapshot-period",
                        "200ms",
                        "--admin-socket",
                        &sock,
                    ],
                    &argv,
                )
                .spawn(),
            )
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let writer_i = the_writer(&wardens);
    let (leaving, frozen) = ((writer_i + 1) % 3, (writer_i + 2) % 3);
    let owner = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("store/v1/cluster.json")).unwrap_or_default())
            .unwrap_or_default()
    };
    wait_for("the store's member list to name three members", START, || {
        (owner(dir.path())["members"].as_array().map(Vec::len) == Some(3)).then_some(())
    });
    let ctl_leave = |i: usize| {
        std::process::Command::new(WARDEN)
            .args(["ctl", "--admin-socket"])
            .arg(socket(i))
            .arg("leave")
            .output()
            .unwrap()
    };
    let pid = nix::unistd::Pid::from_raw(wardens[frozen].as_ref().unwrap().etcd_pid().unwrap());
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let out = ctl_leave(leaving);
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a leave that loses quorum was done");
    assert!(said.contains("lose quorum"), "{said}");
    assert_eq!(members(&ctl, &ips[writer_i]).unwrap().len(), 3);
    wardens[leaving].as_ref().unwrap().wait_ready(START);
    wardens[frozen].as_ref().unwrap().wait_ready(START);
    let out = ctl_leave(leaving);
    assert!(
        out.status.success(),
        "ctl leave m{leaving}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut w = wardens[leaving].take().unwrap();
    assert_eq!(w.wait_exit(START), 0);
    assert_eq!(
        role(wardens[writer_i].as_ref().unwrap()),
        "writer",
        "leadership moved: this test is about a follower leaving"
    );
    wait_for(
        "the store's member list to drop the member that left",
        START,
        || {
            let names: Vec<String> = owner(dir.path())["members"]
                .as_array()?
                .iter()
                .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
                .collect();
            (names.len() == 2 && !names.contains(&format!("m{leaving}"))).then_some(())
        },
    );
    let listing = std::process::Command::new(WARDEN)
        .args(["backups", "list", "--store", &store])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listing.stdout);
    assert!(text.contains(&format!("  m{writer_i} ")), "{text}");
    assert!(!text.contains(&format!("  m{leaving} ")), "{text}");
    stop_all(&mut wardens);
}

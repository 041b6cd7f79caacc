//! The differential oracle: after a seeded random mix of writes on etcd as operators run it (TLS,
//! client certificates, etcd auth, `ETCD_*` variables), the warden's restore of revision R equals
//! `etcdutl snapshot restore` of a snapshot etcd itself took at R, bucket by bucket. The seed is
//! printed; `ORACLE_SEED=N` replays one.
//!
//! The mix: puts, deletes, range deletes, transactions, leases granted with keys attached, leases
//! granted with no key, keep-alives and revocations, a learner added and removed, and a
//! compaction; before it, seeded auth changes (users, roles, permissions, a password change) that
//! the warden must carry in a full.
//!
//! A compaction is the one deliberate difference (docs/design.md, "What a restore holds"): the
//! watch does not report compactions, so the warden's restore keeps the history etcd compacted
//! after the full. The oracle checks that etcd compacted at the revision the mix asked for, and
//! compares the warden's restore after compacting it there by etcd's rule (per key, the newest
//! revision at or below it unless a deletion; nothing else at or below it).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::prod::Prod;
use common::*;
use etcd_client::{
    CompactionOptions, Compare, CompareOp, DeleteOptions, MemberAddOptions, PutOptions, Txn, TxnOp,
};
use etcd_warden::format::bolt::{BoltFile, BucketValue};

const START: Duration = Duration::from_secs(90);

/// The buckets compared, and the meta key that the restores may hold differently: the member's
/// conf state, which etcd's snapshot at R holds as of R and the warden's full as of its own time
/// (the mix adds and removes a learner). The raft index and term are etcdutl's on both sides.
const BUCKETS: &[&str] = &[
    "key",
    "lease",
    "auth",
    "authUsers",
    "authRoles",
    "members",
    "members_removed",
    "cluster",
    "meta",
];
const META_OWN: &[&[u8]] = &[b"confState"];
/// The meta keys of a compaction: etcd's must name the mix's compaction, the warden's do not.
const META_COMPACT: &[&[u8]] = &[b"scheduledCompactRev", b"finishedCompactRev"];

type Dump = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// Every compared bucket of the db in `data` (read from a copy: the reader locks the file).
fn dump(data: &Path, scratch: &Path) -> Dump {
    let copy = scratch.join("db");
    std::fs::copy(data.join("member/snap/db"), &copy).unwrap();
    let db = BoltFile::open(&copy).unwrap();
    let mut out = Dump::new();
    for (_, name, value) in db.root_items().unwrap() {
        let name = String::from_utf8_lossy(&name).into_owned();
        if !BUCKETS.contains(&name.as_str()) {
            continue;
        }
        let b = BucketValue::parse(&value).unwrap();
        let mut items = BTreeMap::new();
        db.visit_bucket(&b, |k, v| {
            if !(name == "meta" && META_OWN.contains(&k)) {
                items.insert(k.to_vec(), v.to_vec());
            }
        })
        .unwrap();
        out.insert(name, items);
    }
    drop(db);
    std::fs::remove_file(&copy).unwrap();
    out
}

/// The user key of an mvcc `KeyValue` (field 1, first on the wire).
fn user_key(kv: &[u8]) -> Vec<u8> {
    assert_eq!(kv.first(), Some(&0x0a), "a KeyValue starts with its key");
    let (mut len, mut shift, mut at) = (0usize, 0, 1);
    loop {
        let b = kv[at];
        len |= usize::from(b & 0x7f) << shift;
        at += 1;
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    kv[at..at + len].to_vec()
}

/// The main revision of a `key` bucket entry (8 bytes big-endian, `_`, the sub revision, and `t`
/// for a deletion).
fn main_revision(k: &[u8]) -> i64 {
    i64::from_be_bytes(k[..8].try_into().unwrap())
}

/// `dump`'s `key` bucket compacted at `at` by etcd's rule: of each key's entries at or below
/// `at`, only the newest stays, and a deletion only when it is at `at` itself (etcd keeps a
/// tombstone at the compaction revision).
fn compact_at(dump: &mut Dump, at: i64) {
    let Some(keys) = dump.get_mut("key") else {
        return;
    };
    let mut newest: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (k, v) in keys.iter() {
        if main_revision(k) <= at {
            // Entries are in revision order: the last one seen per key is its newest.
            newest.insert(user_key(v), k.clone());
        }
    }
    let keep: std::collections::BTreeSet<Vec<u8>> = newest
        .into_values()
        .filter(|k| k.last() != Some(&b't') || main_revision(k) == at)
        .collect();
    keys.retain(|k, _| main_revision(k) > at || keep.contains(k));
}

/// The differences between two dumps, one line each (at most `limit`).
fn differences(want: &Dump, got: &Dump, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    for name in BUCKETS {
        let empty = BTreeMap::new();
        let (w, g) = (
            want.get(*name).unwrap_or(&empty),
            got.get(*name).unwrap_or(&empty),
        );
        for (k, v) in w {
            match g.get(k) {
                None => out.push(format!("{name}: {} missing", hex::encode(k))),
                Some(gv) if gv != v => out.push(format!(
                    "{name}: {} is {} (etcd: {})",
                    hex::encode(k),
                    hex::encode(gv),
                    hex::encode(v)
                )),
                _ => {}
            }
        }
        for k in g.keys().filter(|k| !w.contains_key(*k)) {
            out.push(format!("{name}: {} extra", hex::encode(k)));
        }
    }
    out.truncate(limit);
    out
}

/// `n` random operations of the mix on `c`; `leases` are the live leases it granted. With
/// `changes`, one learner is added and later removed, and etcd is compacted (physically, so the
/// compaction is finished before a snapshot) at a revision up to 20 writes back; returns that revision.
async fn mix(
    c: &mut etcd_client::Client,
    rng: &mut fastrand::Rng,
    n: usize,
    leases: &mut Vec<i64>,
    changes: bool,
) -> Option<i64> {
    let key = |rng: &mut fastrand::Rng| format!("/r/{}/{:02}", rng.u8(0..3), rng.u8(0..12));
    let (add_at, remove_at, compact_at) = if changes {
        let add = rng.usize(..n / 2);
        (add, rng.usize(add + 1..n), rng.usize(n / 2..n))
    } else {
        (n, n, n)
    };
    let mut learner = None;
    let mut compacted = None;
    for i in 0..n {
        if i == add_at {
            let url = format!("https://127.0.0.1:{}", rng.u16(20000..60000));
            let added = c
                .member_add([url], Some(MemberAddOptions::new().with_is_learner()))
                .await
                .unwrap();
            learner = Some(added.member().unwrap().id());
        }
        if i == remove_at {
            c.member_remove(learner.take().unwrap()).await.unwrap();
        }
        if i == compact_at {
            let now = c.get("nothing", None).await.unwrap().header().unwrap().revision();
            let at = now - rng.i64(0..20).min(now - 1);
            c.compact(at, Some(CompactionOptions::new().with_physical()))
                .await
                .unwrap();
            compacted = Some(at);
        }
        match rng.u8(0..100) {
            0..50 => {
                let v = format!(
                    "{{\"v\":{},\"pad\":\"{}\"}}",
                    rng.u32(..),
                    "x".repeat(rng.usize(0..200))
                );
                c.put(key(rng), v, None).await.unwrap();
            }
            50..65 => {
                c.delete(key(rng), None).await.unwrap();
            }
            65..72 => {
                let prefix = format!("/r/{}/0", rng.u8(0..3));
                c.delete(prefix, Some(DeleteOptions::new().with_prefix()))
                    .await
                    .unwrap();
            }
            72..88 => {
                let a = key(rng);
                // etcd refuses a transaction that names one key twice.
                let b = format!("{a}-other");
                let txn = Txn::new()
                    .when([Compare::version(a.clone(), CompareOp::Greater, 0)])
                    .and_then([
                        TxnOp::put(a.clone(), format!("txn-{}", rng.u32(..)), None),
                        TxnOp::delete(b.clone(), None),
                    ])
                    .or_else([TxnOp::put(b, "txn-else", None)]);
                c.txn(txn).await.unwrap();
            }
            88..94 => {
                let ttl = rng.i64(600..3600);
                let id = c.lease_grant(ttl, None).await.unwrap().id();
                leases.push(id);
                c.put(key(rng), "leased", Some(PutOptions::new().with_lease(id)))
                    .await
                    .unwrap();
            }
            // A lease with no key: no watch event shows it.
            94..97 => {
                let ttl = rng.i64(600..3600);
                leases.push(c.lease_grant(ttl, None).await.unwrap().id());
            }
            97 if !leases.is_empty() => {
                let id = leases[rng.usize(..leases.len())];
                c.lease_keep_alive(id).await.unwrap();
            }
            _ if !leases.is_empty() => {
                // Revoked: gone from etcd's lease set, and its keys deleted.
                let id = leases.swap_remove(rng.usize(..leases.len()));
                c.lease_revoke(id).await.unwrap();
            }
            _ => {}
        }
    }
    // A write after the last lease change: a lease set the warden lists at this revision or later
    // was listed after every change above.
    c.put("/r/end", format!("{}", rng.u32(..)), None).await.unwrap();
    compacted
}

/// Seeded auth changes: users with passwords, roles with permissions, grants, a password change.
async fn auth_changes(c: &mut etcd_client::Client, rng: &mut fastrand::Rng) {
    let users: Vec<String> = (0..rng.usize(1..4)).map(|i| format!("u{i}")).collect();
    let roles: Vec<String> = (0..rng.usize(1..3)).map(|i| format!("r{i}")).collect();
    for r in &roles {
        c.role_add(r.as_str()).await.unwrap();
        let perm = etcd_client::Permission::read_write(format!("/r/{}/", rng.u8(0..3))).with_prefix();
        c.role_grant_permission(r.as_str(), perm).await.unwrap();
    }
    for u in &users {
        c.user_add(u.as_str(), format!("pw-{}", rng.u32(..)), None)
            .await
            .unwrap();
        let r = &roles[rng.usize(..roles.len())];
        c.user_grant_role(u.as_str(), r.as_str()).await.unwrap();
    }
    let u = &users[rng.usize(..users.len())];
    c.user_change_password(u.as_str(), format!("pw2-{}", rng.u32(..)))
        .await
        .unwrap();
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn oracle(etcd: &Path) {
    let seed: u64 = std::env::var("ORACLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("oracle seed {seed} (replay with ORACLE_SEED={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let ctl = etcdctl_for(etcd);
    let utl = etcd.with_file_name("etcdutl");
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let prod = Prod::new(&ip, dir.path());
    let data = dir.path().join("data");
    let store = format!("file://{}", dir.path().join("store").display());
    let mut opts: Vec<String> = vec![
        "--store".into(),
        store.clone(),
        "--delta-snapshot-period".into(),
        "300ms".into(),
    ];
    opts.extend(prod.warden_opts());
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let env = prod.etcd_env(&data);
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let w = Warden::builder(&ip, &opts, &[etcd.display().to_string()])
        .envs(&env)
        .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    prod.enable_auth(&ctl);
    wait_for("a full snapshot after auth enable", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(())
    });
    w.wait_ready(START);

    // Auth changes, then a full that began after them (deltas carry no auth).
    rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        auth_changes(&mut c, &mut rng).await;
    });
    // After the last change: a full begun after an earlier one may miss the later ones.
    let changed_at = unix_now();
    wait_for("a full snapshot taken after the auth changes", START, || {
        let last = &w.status()["backup"]["last_full"];
        let began = last["at"].as_f64()? - last["duration_seconds"].as_f64()?;
        (began >= changed_at).then_some(())
    });

    let snap = dir.path().join("etcd-at-r.db");
    let mut leases = Vec::new();
    let (r, last, compacted) = rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        let before = c.get("nothing", None).await.unwrap().header().unwrap().revision();
        let compacted = mix(&mut c, &mut rng, 120, &mut leases, true)
            .await
            .expect("the mix compacts");
        // etcd's own snapshot at R, between two halves of the mix.
        let r = c.get("nothing", None).await.unwrap().header().unwrap().revision();
        assert!(r - before > 60, "the mix wrote little: revisions {before}..{r}");
        run(
            Command::new(&ctl)
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=https://{ip}:2379"))
                .arg(format!("--cacert={}", prod.pki.join("ca.crt").display()))
                .arg(format!(
                    "--cert={}",
                    prod.pki.join("healthcheck-client.crt").display()
                ))
                .arg(format!(
                    "--key={}",
                    prod.pki.join("healthcheck-client.key").display()
                ))
                .arg(format!("--user=root:{}", common::prod::ROOT_PASSWORD))
                .args(["snapshot", "save"])
                .arg(&snap),
            "etcdctl snapshot save",
        );
        // The lease set at R is in the store once the warden listed etcd's leases at R or later.
        wait_for(
            &format!("the warden to check etcd's leases at revision {r}"),
            START,
            || (w.status()["backup"]["leases_checked_revision"].as_i64() >= Some(r)).then_some(()),
        );
        mix(&mut c, &mut rng, 120, &mut leases, false).await;
        let last = c.get("nothing", None).await.unwrap().header().unwrap().revision();
        (r, last, compacted)
    });
    let status = run(
        Command::new(&utl)
            .args(["snapshot", "status", "-w", "json"])
            .arg(&snap),
        "etcdutl snapshot status",
    );
    let snap_rev = serde_json::from_str::<serde_json::Value>(&status).unwrap()["revision"]
        .as_i64()
        .unwrap();
    assert_eq!(snap_rev, r, "no write came between the read and the snapshot");
    wait_for(&format!("revision {last} in the store"), START, || {
        let head = backups_list(&store, &[])
            .iter()
            .filter_map(|x| x["last"].as_i64())
            .max()
            .unwrap_or(0);
        (head >= last).then_some(())
    });
    drop(w);

    let cluster = format!("m1=https://{ip}:2380");
    let peer = format!("https://{ip}:2380");
    let theirs = dir.path().join("etcdutl-restore");
    run(
        Command::new(&utl)
            .args(["snapshot", "restore"])
            .arg(&snap)
            .arg("--data-dir")
            .arg(&theirs)
            .args(["--name", "m1", "--initial-cluster", &cluster])
            .args(["--initial-advertise-peer-urls", &peer]),
        "etcdutl snapshot restore",
    );
    let ours = dir.path().join("warden-restore");
    run(
        Command::new(WARDEN)
            .args(["restore", "--store", &store, "--bump-revision", "0"])
            .args(["--to-revision", &r.to_string()])
            .arg("--data-dir")
            .arg(&ours)
            .args(["--name", "m1", "--initial-cluster", &cluster])
            .args(["--initial-advertise-peer-urls", &peer])
            .arg("--etcd")
            .arg(etcd),
        "etcd-warden restore --to-revision",
    );
    // The member's WAL and raft snapshot are etcdutl's own on both sides, byte for byte.
    let files = |root: &Path| -> BTreeMap<String, Vec<u8>> {
        ["member/wal", "member/snap"]
            .iter()
            .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().is_some_and(|n| n != "db"))
            .map(|p| {
                let name = p.strip_prefix(root).unwrap().display().to_string();
                (name, std::fs::read(&p).unwrap())
            })
            .collect()
    };
    let (their_files, our_files) = (files(&theirs), files(&ours));
    assert!(
        [".wal", ".snap"]
            .iter()
            .all(|x| their_files.keys().any(|n| n.ends_with(x))),
        "etcdutl's restore holds a WAL and a raft snapshot: {:?}",
        their_files.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        their_files.keys().collect::<Vec<_>>(),
        our_files.keys().collect::<Vec<_>>(),
        "the WAL and snap files of etcdutl's restore and the warden's"
    );
    for (name, bytes) in &their_files {
        assert!(
            *bytes == our_files[name],
            "{name} differs between etcdutl's restore and the warden's ({} and {} bytes)",
            bytes.len(),
            our_files[name].len()
        );
    }
    let scratch = tempfile::tempdir().unwrap();
    let (mut want, mut got) = (dump(&theirs, scratch.path()), dump(&ours, scratch.path()));
    for (side, d) in [("etcd", &mut want), ("the warden", &mut got)] {
        let meta = d.get_mut("meta").unwrap();
        let revs: Vec<Option<i64>> = META_COMPACT
            .iter()
            .map(|k| meta.remove(*k).map(|v| main_revision(&v)))
            .collect();
        if side == "etcd" {
            assert_eq!(
                revs,
                [Some(compacted), Some(compacted)],
                "etcd's snapshot at {r} names the mix's compaction at {compacted} (scheduled, finished)"
            );
        } else {
            assert!(
                revs.iter().all(|x| x.is_none_or(|x| x <= compacted)),
                "the warden's restore names a compaction after the mix's at {compacted}: {revs:?}"
            );
        }
    }
    // The model of etcd's compaction, checked against etcd: it leaves etcd's snapshot unchanged.
    let etcds = want.clone();
    compact_at(&mut want, compacted);
    let model = differences(&etcds, &want, 20);
    assert!(
        model.is_empty(),
        "seed {seed}: compacting etcd's own snapshot at {compacted} again changed it:\n{}",
        model.join("\n")
    );
    compact_at(&mut got, compacted);
    let diff = differences(&want, &got, 20);
    let listed: Vec<String> = backups_list(&store, &[])
        .iter()
        .map(|x| format!("{} {}..{}", x["kind"], x["first"], x["last"]))
        .collect();
    assert!(
        diff.is_empty(),
        "seed {seed}: the warden's restore of revision {r} differs from etcdutl's restore of etcd's snapshot at {r}:\n{}\nthe store: {listed:?}",
        diff.join("\n")
    );
}

#[test]
fn the_restore_at_r_equals_etcds_own_snapshot_at_r() {
    oracle(&default_etcd());
}

#[test]
fn etcd_3_7_the_restore_at_r_equals_etcds_own_snapshot_at_r() {
    oracle(&etcd37());
}

#[test]
fn etcd_3_5_the_restore_at_r_equals_etcds_own_snapshot_at_r() {
    oracle(&etcd35());
}

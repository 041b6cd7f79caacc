//! Backups written by Gardener's etcd-backup-restore (tests/fixtures/gbr: etcdbrctl itself backed up
//! etcd 3.5.16 under writes, see scripts/gbr-fixture): listed, verified and restored exactly, at the
//! newest revision and at points in time, for each of its compression policies; a delta whose
//! sha256 does not match is found and cuts the chain before it; `run` on a GBR prefix restores the
//! newest chain across both of GBR's layouts, writes its own backups beside GBR's and leaves every
//! GBR object as it was. Every restore is compared with etcd's own answer at that revision,
//! recorded when the fixture was made.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster::member_args_token;
use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use sha2::{Digest, Sha256};

const START: Duration = Duration::from_secs(60);
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gbr");
const POLICIES: [&str; 3] = ["gzip", "zlib", "lzw"];

fn expected() -> Value {
    let text = std::fs::read_to_string(Path::new(FIXTURE).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Every file under `root`, by path relative to it, with its sha256.
fn digests(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, sha256_hex(&std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// GBR's objects among `digests`: its v2/ layout and the older v1/Backup-<s>/ one.
fn gbr_objects(all: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    all.iter()
        .filter(|(k, _)| k.starts_with("v2/") || k.starts_with("v1/Backup-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A copy of one policy's store (the directory that holds `v2/`), after checking the fixture
/// against its SHA256SUMS.
fn fixture_copy(policy: &str) -> (tempfile::TempDir, PathBuf) {
    let sums = std::fs::read_to_string(Path::new(FIXTURE).join("SHA256SUMS")).unwrap();
    let mut n = 0;
    for line in sums.lines() {
        let (sum, path) = line.split_once("  ").expect("sha256sum lines");
        let data = std::fs::read(Path::new(FIXTURE).join(path)).unwrap();
        assert_eq!(
            sha256_hex(&data),
            sum,
            "the fixture's {path} is not what scripts/gbr-fixture wrote"
        );
        n += 1;
    }
    assert!(n >= 30, "SHA256SUMS lists {n} objects");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join(policy);
    copy_tree(&Path::new(FIXTURE).join("store").join(policy), &store);
    (dir, store)
}

/// `backups verify` of `url`: its exit code and what it printed on stdout (stderr after it).
fn verify(url: &str, env: &[(&str, String)]) -> (Option<i32>, String) {
    let out = Command::new(WARDEN)
        .args(["backups", "verify", "--store", url])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// GBR's names in `store`'s v2/: (kind, start, last, unix seconds, file name), by last revision.
fn gbr_names(store: &Path) -> Vec<(String, i64, i64, u64, String)> {
    let mut v: Vec<_> = std::fs::read_dir(store.join("v2"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.split('.').next().unwrap().to_owned();
            let f: Vec<&str> = stem.split('-').collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                name,
            )
        })
        .collect();
    v.sort_by_key(|(kind, _, last, secs, _)| (*last, *secs, kind.clone()));
    v
}

/// What etcd at `ip` holds, in the fixture's terms: key, sha256 of the value, create and mod
/// revision, version, lease.
fn state(ctl: &Path, ip: &str) -> (i64, Value) {
    let out = etcdctl(ctl, ip, &["get", "", "--prefix", "-w", "json"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let b64 = |s: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap_or(""))
            .unwrap()
    };
    let kvs: Vec<Value> = v["kvs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            serde_json::json!({
                "key": String::from_utf8(b64(&kv["key"])).unwrap(),
                "value_sha256": sha256_hex(&b64(&kv["value"])),
                "create_revision": kv["create_revision"],
                "mod_revision": kv["mod_revision"],
                "version": kv["version"],
                "lease": kv["lease"].as_i64().unwrap_or(0),
            })
        })
        .collect();
    (v["header"]["revision"].as_i64().unwrap(), Value::Array(kvs))
}

fn assert_state(ctl: &Path, ip: &str, exp: &Value, rev: i64, served: i64, what: &str) {
    let want = &exp["states"][rev.to_string()];
    assert!(want.is_array(), "the fixture has no state at revision {rev}");
    let (got_rev, got) = state(ctl, ip);
    assert_eq!(&got, want, "{what}: not etcd's own state at revision {rev}");
    assert_eq!(got_rev, served, "{what}: etcd serves another revision");
}

/// The TTL a restored etcd gives lease `id`, and the keys on it.
fn lease(ctl: &Path, ip: &str, id: &str) -> (i64, usize) {
    let hex_id = format!("{:x}", id.parse::<i64>().unwrap());
    let out = etcdctl(ctl, ip, &["lease", "timetolive", &hex_id, "--keys", "-w", "json"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    (
        v["granted-ttl"].as_i64().unwrap_or(-1),
        v["keys"].as_array().map_or(0, Vec::len),
    )
}

/// The fixture's two leases: the one the first full holds, and the one granted after it.
fn leases(exp: &Value) -> (String, String) {
    let mut early = None;
    let mut late = None;
    for (id, l) in exp["leases"].as_object().unwrap() {
        if l["in_the_first_full"] == true {
            early = Some(id.clone());
        } else {
            late = Some(id.clone());
        }
    }
    (early.unwrap(), late.unwrap())
}

struct Restored {
    out: std::process::Output,
    etcd: Option<PlainEtcd>,
    ip: String,
    _dir: tempfile::TempDir,
}

fn restore(store: &Path, args: &[&str]) -> Restored {
    restore_with(&default_etcd(), store, args)
}

/// `restore` by the tools and the etcd of release `etcd`.
fn restore_with(etcd: &Path, store: &Path, args: &[&str]) -> Restored {
    let etcd = etcd.to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("restored");
    let ip = unique_ip();
    let out = restore_command(&format!("file://{}", store.display()), &data, &etcd, &ip, &[])
        .args(args)
        .output()
        .unwrap();
    let etcd = data.exists().then(|| PlainEtcd::start(&etcd, &ip, &data, "m1"));
    Restored {
        out,
        etcd,
        ip,
        _dir: dir,
    }
}

#[test]
fn gbr_backups_restore_exactly_at_the_newest_revision_and_at_points_in_time() {
    gbr_restores_exactly(&default_etcd());
}

#[test]
fn etcd_3_7_gbr_backups_restore_exactly_at_the_newest_revision_and_at_points_in_time() {
    gbr_restores_exactly(&etcd37());
}

#[test]
fn etcd_3_5_gbr_backups_restore_exactly_at_the_newest_revision_and_at_points_in_time() {
    gbr_restores_exactly(&etcd35());
}

#[test]
fn etcd_3_5_newest_gbr_backups_restore_exactly_at_the_newest_revision_and_at_points_in_time() {
    gbr_restores_exactly(&etcd35_newest());
}

/// GBR's fixture (written by etcdbrctl from etcd 3.5.16) restored with release `etcd`'s tools and
/// served by its etcd: every stop revision exactly as etcd answered it then.
fn gbr_restores_exactly(etcd: &Path) {
    let exp = expected();
    let ctl = etcdctl_for(etcd);
    let final_rev = exp["final_revision"].as_i64().unwrap();
    let (early, late) = leases(&exp);
    let stops: Vec<i64> = exp["states"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.parse().unwrap())
        .collect();
    for policy in POLICIES {
        let (_dir, store) = fixture_copy(policy);
        let names = gbr_names(&store);
        let url = format!("file://{}", store.display());
        let (code, text) = verify(&url, &[]);
        assert!(code == Some(0), "{policy}: backups verify failed:\n{text}");
        assert!(
            text.contains(&format!("{} objects checked, 0 problems", names.len())),
            "{policy}: not every GBR object checked:\n{text}"
        );
        let rows = backups_list(&url, &[]);
        assert_eq!(rows.len(), names.len(), "{policy}: backups list: {rows:#?}");
        assert!(
            rows.iter()
                .all(|r| r["layout"] == "gbr-v2" && r["compression"] == policy),
            "{policy}: {rows:#?}"
        );

        // The newest revision, every key as etcd had it. Both leases are in the newest chain's
        // full snapshot, so both keep the TTLs etcd granted.
        let ttl_arg = if policy == "zlib" {
            vec!["--gbr-lease-ttl", "20m"]
        } else {
            vec![]
        };
        let r = restore_with(etcd, &store, &ttl_arg);
        assert!(
            r.out.status.success(),
            "{policy}: restore failed: {}",
            String::from_utf8_lossy(&r.out.stderr)
        );
        assert_state(
            &ctl,
            &r.ip,
            &exp,
            final_rev,
            final_rev,
            &format!("{policy}: latest"),
        );
        for id in [&early, &late] {
            let (ttl, keys) = lease(&ctl, &r.ip, id);
            assert_eq!(
                ttl,
                exp["leases"][id]["granted_ttl"].as_i64().unwrap(),
                "{policy}: a lease the full snapshot holds keeps its own TTL"
            );
            assert!(keys >= 1, "{policy}: no key on lease {id}");
        }
        r.etcd.unwrap().stop();

        // A revision inside one of this policy's deltas (another policy's delta ended there).
        let inside = stops
            .iter()
            .copied()
            .find(|&s| {
                names
                    .iter()
                    .any(|(k, start, last, _, _)| k == "Incr" && *start <= s && s < *last)
            })
            .expect("a stop revision inside a delta");
        let r = restore_with(etcd, &store, &["--to-revision", &inside.to_string()]);
        assert!(
            r.out.status.success(),
            "{policy}: restore --to-revision {inside}: {}",
            String::from_utf8_lossy(&r.out.stderr)
        );
        assert_state(
            &ctl,
            &r.ip,
            &exp,
            inside,
            inside,
            &format!("{policy}: --to-revision {inside}"),
        );
        r.etcd.unwrap().stop();

        // A time in the first chain: the newest delta written by then, whole.
        let (_, _, at_rev, secs, _) = names
            .iter()
            .filter(|(k, ..)| k == "Incr")
            .nth(3)
            .cloned()
            .unwrap();
        // GBR's names carry whole seconds: a delta named second S may have been cut up to S + 0.999,
        // so it is taken from S + 1 on (and the next one, named S + 1, not yet).
        let when =
            humantime::format_rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(secs + 1)).to_string();
        let mut args = vec!["--to-time", when.as_str()];
        args.extend(&ttl_arg);
        let r = restore_with(etcd, &store, &args);
        assert!(
            r.out.status.success(),
            "{policy}: restore --to-time {when}: {}",
            String::from_utf8_lossy(&r.out.stderr)
        );
        assert_state(
            &ctl,
            &r.ip,
            &exp,
            at_rev,
            at_rev,
            &format!("{policy}: --to-time {when}"),
        );
        // The first chain's full predates the late lease: GBR's deltas name it, never its TTL.
        assert_eq!(lease(&ctl, &r.ip, &early).0, 900, "{policy}: the full's lease");
        let want_ttl = if policy == "zlib" { 1200 } else { 3600 };
        let (ttl, keys) = lease(&ctl, &r.ip, &late);
        assert_eq!(
            ttl, want_ttl,
            "{policy}: a lease GBR never described gets --gbr-lease-ttl"
        );
        assert!(keys >= 1, "{policy}: no key on the late lease");
        r.etcd.unwrap().stop();
    }
}

#[test]
fn a_gbr_delta_whose_sha256_does_not_match_fails_verify_and_cuts_the_restore_before_it() {
    let exp = expected();
    let ctl = etcdctl_for(&default_etcd());
    let (_dir, store) = fixture_copy("gzip");
    // The first delta of the second chain: its JSON changed by one base64 character of a value, and
    // compressed again, so the JSON still parses and the gzip stream is sound: only GBR's own sha256
    // can tell.
    let names = gbr_names(&store);
    let fulls: Vec<_> = names.iter().filter(|n| n.0 == "Full").collect();
    let base = fulls.last().unwrap().2;
    let victim = names
        .iter()
        .find(|n| n.0 == "Incr" && n.1 == base + 1)
        .expect("a delta after the newest full")
        .4
        .clone();
    let path = store.join("v2").join(&victim);
    let mut data = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_end(&mut data)
        .unwrap();
    let json_end = data.len() - 32;
    let at = data[..json_end]
        .windows(9)
        .position(|w| w == b"\"value\":\"")
        .expect("a value in the delta")
        + 9;
    data[at] = if data[at] == b'A' { b'B' } else { b'A' };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&data).unwrap();
    std::fs::write(&path, gz.finish().unwrap()).unwrap();

    // And one stored byte flipped in a delta of the first chain: gzip's own check finds that one.
    let flipped = names
        .iter()
        .find(|n| n.0 == "Incr" && n.2 < base)
        .expect("a delta of the first chain")
        .4
        .clone();
    let path = store.join("v2").join(&flipped);
    let mut stored = std::fs::read(&path).unwrap();
    let mid = stored.len() / 2;
    stored[mid] ^= 0x40;
    std::fs::write(&path, stored).unwrap();

    let url = format!("file://{}", store.display());
    let (code, text) = verify(&url, &[]);
    assert_eq!(code, Some(1), "verify must fail:\n{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("FAIL") && l.contains(&victim))
        .unwrap_or_else(|| panic!("verify does not name {victim}:\n{text}"));
    assert!(line.contains("sha256"), "{line}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&flipped)),
        "verify does not name {flipped}, a byte of it flipped:\n{text}"
    );
    assert!(
        text.contains(&format!("{} objects checked, 2 problems", names.len())),
        "{text}"
    );

    let r = restore(&store, &[]);
    let stderr = String::from_utf8_lossy(&r.out.stderr);
    assert_eq!(
        r.out.status.code(),
        Some(2),
        "a restore that ends below the newest backup must say so: {stderr}"
    );
    assert!(
        stderr.contains(&victim),
        "the restore does not name {victim}: {stderr}"
    );
    assert_state(&ctl, &r.ip, &exp, base, base, "cut before the damaged delta");
    r.etcd.unwrap().stop();
}

/// GBR drops the events it had not yet put in a delta when it takes a full, so its chains can leave
/// revisions in no object: a `--to-revision` there restores up to the last delta below it, exits 2
/// and names the revision.
#[test]
fn a_revision_between_gbr_chains_restores_up_to_the_last_delta_below_it_and_says_so() {
    let exp = expected();
    let ctl = etcdctl_for(&default_etcd());
    let (_dir, store) = fixture_copy("gzip");
    let names = gbr_names(&store);
    let second = names.iter().rfind(|n| n.0 == "Full").unwrap().2;
    // The first chain's last delta, as GBR loses it: its events were in memory when the full came.
    let lost = names
        .iter()
        .find(|n| n.0 == "Incr" && n.2 == second)
        .expect("a delta ending at the second full");
    std::fs::remove_file(store.join("v2").join(&lost.4)).unwrap();
    let below = lost.1 - 1;
    let asked = lost.1 + 1;
    let r = restore(&store, &["--to-revision", &asked.to_string()]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&r.out.stdout),
        String::from_utf8_lossy(&r.out.stderr),
    );
    assert_eq!(r.out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("no backup holds revision {asked}")),
        "the restore does not name the revision: {stdout}"
    );
    assert_state(
        &ctl,
        &r.ip,
        &exp,
        below,
        below,
        "up to the last delta below the target",
    );
    r.etcd.unwrap().stop();
}

#[test]
fn run_on_a_gbr_prefix_restores_the_newest_chain_across_layouts_and_leaves_every_gbr_object_as_it_was() {
    let exp = expected();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let final_rev = exp["final_revision"].as_i64().unwrap();
    let (early, late) = leases(&exp);
    let (dir, store) = fixture_copy("zlib");
    // The newest chain moved to GBR's older layout (v1/Backup-<s>/, same names, same bytes), the
    // older one left in v2/: the restore must look in both to reach the newest revision.
    let names = gbr_names(&store);
    let newest_full = names.iter().rfind(|n| n.0 == "Full").unwrap().clone();
    let v1 = store.join(format!("v1/Backup-{}", newest_full.3));
    std::fs::create_dir_all(&v1).unwrap();
    for n in names
        .iter()
        .filter(|n| n.2 >= newest_full.2 && (n.0 == "Full" || n.1 > newest_full.2))
    {
        std::fs::rename(store.join("v2").join(&n.4), v1.join(&n.4)).unwrap();
    }
    let before = gbr_objects(&digests(&store));
    assert!(
        before.keys().any(|k| k.starts_with("v1/Backup-")) && before.keys().any(|k| k.starts_with("v2/"))
    );

    let ip = unique_ip();
    let data = dir.path().join("data");
    let url = format!("file://{}", store.display());
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &data));
    let mut w = Warden::builder(
        &ip,
        &[
            "--store",
            &url,
            "--delta-snapshot-period",
            "200ms",
            "--retention",
            "last:1",
        ],
        &argv,
    )
    .spawn();
    w.wait_ready(START);
    // An automatic restore raises the revision (--restore-bump-revision); the keys are GBR's.
    let bumped = final_rev + 1_000_000_000;
    assert_state(&ctl, &ip, &exp, final_rev, bumped, "run on the GBR prefix");
    assert_eq!(lease(&ctl, &ip, &early).0, 900, "the full's lease");
    assert_eq!(
        lease(&ctl, &ip, &late).0,
        600,
        "a lease in the newest full keeps its TTL"
    );

    // Its own backups beside GBR's: a write reaches the store, two more fulls make retention
    // (last:1) delete the warden's older ones, never GBR's.
    etcdctl(
        &ctl,
        &ip,
        &["put", "/after/switch", "written by a client of the warden"],
    )
    .unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for("the write after the switch in the store", START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0) >= rev).then_some(())
    });
    for _ in 0..2 {
        let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap_or(0);
        w.signal(Signal::SIGUSR1);
        wait_for("a full snapshot on SIGUSR1", START, || {
            (w.status()["backup"]["fulls_total"].as_u64().unwrap_or(0) > fulls).then_some(())
        });
    }
    let own_fulls = || {
        backups_list(&url, &[])
            .into_iter()
            .filter(|r| r["layout"] == "warden" && r["kind"] == "full")
            .count()
    };
    wait_for("retention down to one full of the warden's own", START, || {
        (own_fulls() == 1).then_some(())
    });
    etcdctl(
        &ctl,
        &ip,
        &[
            "put",
            "/after/retention",
            "in a delta of the warden's newest chain",
        ],
    )
    .unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for("the write after retention in the store", START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64().unwrap_or(0) >= rev).then_some(())
    });
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let after = digests(&store);
    assert_eq!(
        gbr_objects(&after),
        before,
        "GBR's objects changed, appeared or went away"
    );
    assert!(
        after.keys().any(|k| k.starts_with("v1/full/")) && after.keys().any(|k| k.starts_with("v1/delta/")),
        "no backups of the warden's own beside GBR's: {after:#?}"
    );
    // The warden's own chain is now the newest: a restore reaches the write after the switch.
    let (keys, _) = keys_after_restore(&etcd, &url, &[], "/");
    for k in ["/after/switch", "/after/retention", "/registry/early/leased"] {
        assert!(keys.contains(&k.to_owned()), "{k} not restored: {keys:?}");
    }
}

/// A three-member cluster whose data dirs are all gone, on a prefix that only GBR ever backed up: no
/// warden bootstraps an empty cluster over it (the GBR backups are evidence that one ran), and one
/// `cluster restore` brings every member back at GBR's newest backup, each key as etcd had it.
/// That backup is a full with nothing after it whose name, as GBR names fulls (with a revision read
/// before the stream began), says one revision less than its database holds: every member restores
/// that very file. GBR's objects stay as they were.
#[test]
fn a_cluster_on_a_gbr_prefix_never_bootstraps_empty_and_one_cluster_restore_brings_gbr_history_back() {
    let exp = expected();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (dir, store) = fixture_copy("lzw");
    let names = gbr_names(&store);
    let full = names.iter().rfind(|n| n.0 == "Full").unwrap().clone();
    let holds = full.2;
    for n in names.iter().filter(|n| n.0 == "Incr" && n.2 >= holds) {
        std::fs::remove_file(store.join("v2").join(&n.4)).unwrap();
    }
    let renamed = full
        .4
        .replace(&format!("-{holds:08}-"), &format!("-{:08}-", holds - 1));
    std::fs::rename(store.join("v2").join(&full.4), store.join("v2").join(&renamed)).unwrap();
    let before = gbr_objects(&digests(&store));
    let url = format!("file://{}", store.display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let wardens: Vec<Warden> = (0..3)
        .map(|i| {
            let argv = member_args_token(&etcd, &ips, i, &dir.path().join(format!("m{i}")), "from-gbr");
            Warden::builder(
                &ips[i],
                &["--store", &url, "--delta-snapshot-period", "200ms"],
                &argv,
            )
            .spawn()
        })
        .collect();
    for (i, w) in wardens.iter().enumerate() {
        let body = wait_for(
            &format!("m{i} to refuse to bootstrap over GBR's history"),
            START,
            || {
                let (code, body) = w.get("/readyz")?;
                (code == 503 && body.contains("etcd-backup-restore")).then_some(body)
            },
        );
        assert!(body.contains("etcd-warden cluster restore --store"), "{body}");
    }
    let cluster = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("m{i}=https://{ip}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new(WARDEN)
        .args([
            "cluster",
            "restore",
            "--bump-revision",
            "0",
            "--store",
            &url,
            "--initial-cluster",
            &cluster,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster restore: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for w in &wardens {
        w.wait_ready(START);
    }
    for ip in &ips {
        assert_state(&ctl, ip, &exp, holds, holds, &format!("member {ip}"));
    }
    drop(wardens);
    assert_eq!(gbr_objects(&digests(&store)), before, "GBR's objects changed");
}

/// GBR's layout in S3 (moto's server), as its S3 provider writes it under `<bucket>/<prefix>/`: the
/// newest chain in the older `v1/Backup-<s>/` layout, the rest in `v2/`, uploaded byte for byte with
/// boto3. `backups verify` checks every object and a restore reaches GBR's newest revision exactly.
#[test]
fn gbr_backups_in_s3_verify_and_restore_exactly_across_both_layouts() {
    use common::stores::*;
    let exp = expected();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let final_rev = exp["final_revision"].as_i64().unwrap();
    let (dir, store) = fixture_copy("gzip");
    let names = gbr_names(&store);
    let newest_full = names.iter().rfind(|n| n.0 == "Full").unwrap().clone();
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "backups");
    let mut keys = Vec::new();
    for n in &names {
        let key = if n.2 >= newest_full.2 && (n.0 == "Full" || n.1 > newest_full.2) {
            format!("etcd-main/v1/Backup-{}/{}", newest_full.3, n.4)
        } else {
            format!("etcd-main/v2/{}", n.4)
        };
        keys.push((key, store.join("v2").join(&n.4)));
    }
    let list = dir.path().join("uploads.txt");
    std::fs::write(
        &list,
        keys.iter()
            .map(|(k, p)| format!("{k}\t{}\n", p.display()))
            .collect::<String>(),
    )
    .unwrap();
    let up = Command::new("python3")
        .args([
            "-c",
            "import sys, boto3\n\
             s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')\n\
             for line in open(sys.argv[2]):\n\
             \x20   key, path = line.rstrip('\\n').split('\\t')\n\
             \x20   s3.put_object(Bucket='backups', Key=key, Body=open(path, 'rb').read())",
            &moto.endpoint,
        ])
        .arg(&list)
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "upload: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let env = s3_env(&moto.endpoint);
    let url = "s3://backups/etcd-main";
    let (code, text) = verify(url, &env);
    assert_eq!(code, Some(0), "verify:\n{text}");
    assert!(
        text.contains(&format!("{} objects checked, 0 problems", names.len())),
        "{text}"
    );
    let data = dir.path().join("restored");
    let rip = unique_ip();
    let out = restore_command(url, &data, &etcd, &rip, &env).output().unwrap();
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = PlainEtcd::start(&etcd, &rip, &data, "m1");
    assert_state(&ctl, &rip, &exp, final_rev, final_rev, "restored from S3");
    restored.stop();
    assert_eq!(
        s3_keys(&moto.endpoint, "backups").len(),
        names.len(),
        "the restore wrote to the store"
    );
}

/// etcd-backup-restore's fulls claim no size, so a compression bomb under the newest full's name
/// (256 MiB of zeros, gzipped to a few hundred KiB) would decompress until the disk was full.
/// Now what it may decompress to is the free space: on a 96 MiB tmpfs it stops there as a bad
/// object, and the restore falls back to the older full, with the disk never filled.
#[test]
fn a_gbr_compression_bomb_stops_at_the_free_space_and_the_restore_falls_back() {
    let (dir, store) = fixture_copy("gzip");
    let names = gbr_names(&store);
    let newest = names.iter().rfind(|n| n.0 == "Full").unwrap().4.clone();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::copy(&mut std::io::repeat(0).take(256 << 20), &mut gz).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "the bomb is small: {} bytes", bomb.len());
    std::fs::write(store.join("v2").join(&newest), &bomb).unwrap();

    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let restored = small.join("data");
    let etcd = default_etcd();
    let mut restore = restore_command(
        &format!("file://{}", store.display()),
        &restored,
        &etcd,
        &unique_ip(),
        &[],
    );
    restore.arg("--accept-older");
    let inner: Vec<String> = std::iter::once(restore.get_program().to_string_lossy().into_owned())
        .chain(restore.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    let script = format!(
        "mount -t tmpfs -o size=96m tmpfs '{}' && exec \"$@\"",
        small.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .args(&inner)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the restore failed:\n{said}");
    assert!(
        said.lines()
            .any(|l| l.contains(&newest) && l.contains("decompresses past") && l.contains("free")),
        "the bomb is not named as a bad object:\n{said}"
    );
    assert!(
        !said.contains("No space left"),
        "the bomb filled the file system:\n{said}"
    );
}

//! What a writer of the bucket who holds no key plants (issue 54): names and claims that no
//! object backs. Names only propose candidates; a candidate that does not pass the gate
//! (`store::gate`) is skipped and counted, so a healthy data dir stays where it is, a lost one is
//! restored from the genuine chain, and the revision moves no further than the verified newest plus
//! the bump. Judged by etcdctl (the keys, the revision) and the data dir's siblings, with the real
//! binary on a file store.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::objects::*;
use common::stores::*;
use common::*;
use nix::sys::signal::Signal;

const UP: Duration = Duration::from_secs(90);

/// The default bump a restore raises the revision by.
const BUMP: i64 = 1_000_000_000;

/// Siblings of the data dir the warden moved aside or built beside it.
fn aside(data: &Path) -> Vec<String> {
    let name = data.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(data.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with(&format!("{name}."))
                && [".broken-", ".behind-", ".restore-", "-restore-"]
                    .iter()
                    .any(|s| n.contains(s))
        })
        .collect()
}

/// A warden on `dir/data` with a file store, a key written and backed up, then stopped
/// gracefully: a healthy data dir at the store's newest revision. The store's URL, that revision.
fn backed_up(etcd: &Path, ip: &str, dir: &Path, opts: &[&str]) -> (String, i64) {
    let ctl = etcdctl_for(etcd);
    let (mut w, store) = warden_with_file_store(etcd, ip, dir, opts);
    etcdctl(&ctl, ip, &["put", "genuine", "v"]).unwrap();
    let rev = etcd_revision(&ctl, ip);
    wait_for(&format!("revision {rev} in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    w.signal(Signal::SIGTERM);
    let code = w.wait_exit(UP);
    assert!(code == 0 || code == 143, "exit {code}: {}", w.log_text());
    (store, rev)
}

/// What the warden does next on `dir/data`, as `warden_with_file_store` starts it.
fn restart(etcd: &Path, ip: &str, dir: &Path, store: &str, opts: &[&str]) -> Warden {
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, &dir.join("data")));
    let mut all = vec!["--store", store, "--delta-snapshot-period", "200ms"];
    all.extend_from_slice(opts);
    let w = Warden::start(ip, &all, &argv);
    w.wait_ready(UP);
    w
}

/// A full's name at `revision`, created in 2099 (newer than anything genuine).
fn full_name(revision: i64, ms: u32) -> String {
    format!("full-{revision:020}-20991231T000000{ms:03}Z-zstd-plain.ews")
}

/// Plants, beside the genuine fulls in `fulls`: an object whose header agrees with its name and
/// whose footer claims 10^15 bytes (300 bytes in all); 7 bytes of garbage named at
/// i64::MAX − 10^9 + 5 and one named at i64::MAX; a sparse 5 GiB object whose trailer claims a
/// 4 GiB footer; and `empties` empty objects named as newer fulls. The names planted.
fn plant(fulls: &Path, rev: i64, empties: usize) -> Vec<String> {
    let genuine = std::fs::read_dir(fulls).unwrap().flatten().next().unwrap().path();
    let mut planted = Vec::new();
    let mut put = |name: String, bytes: &[u8]| {
        std::fs::write(fulls.join(&name), bytes).unwrap();
        planted.push(name);
    };
    let claim = rev + 1000;
    let mut header = header_of(&genuine);
    header["revision"] = claim.into();
    header["created"] = "2099-12-31T00:00:00.001Z".into();
    let huge = framed(
        &header,
        &[0x28, 0xb5, 0x2f, 0xfd],
        &serde_json::json!({"raw_bytes": 1_000_000_000_000_000u64}),
    );
    assert!(huge.len() < 600, "{} bytes", huge.len());
    put(full_name(claim, 1), &huge);
    put(full_name(i64::MAX - BUMP + 5, 2), b"garbage");
    put(full_name(i64::MAX, 3), b"garbage");
    // Sparse: 5 GiB on paper, a trailer at its end that says the footer before it is 4 GiB.
    let sparse = full_name(claim + 1, 4);
    let f = std::fs::File::create(fulls.join(&sparse)).unwrap();
    let size = 5u64 << 30;
    f.set_len(size).unwrap();
    let mut trailer = u32::MAX.to_le_bytes().to_vec();
    trailer.extend_from_slice(&(1u64 << 30).to_le_bytes());
    trailer.extend_from_slice(&[0; 32]);
    trailer.extend_from_slice(b"EWEND001");
    std::os::unix::fs::FileExt::write_all_at(&f, &trailer, size - trailer.len() as u64).unwrap();
    for i in 0..empties {
        put(full_name(claim + 2 + i as i64, 5), b"");
    }
    planted.push(sparse);
    planted
}

/// The peak resident memory of `pid` (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

/// The checks both stores share, once the warden is ready on a healthy data dir the planted names
/// all claim to be behind: nothing moved aside, nothing restored, the revision etcd had, a
/// bounded /status and memory.
fn kept(w: &Warden, etcd: &Path, ip: &str, data: &Path, rev: i64) {
    let ctl = etcdctl_for(etcd);
    assert_eq!(
        aside(data),
        Vec::<String>::new(),
        "the healthy data dir was moved: {}",
        w.log_text()
    );
    assert_eq!(
        etcd_revision(&ctl, ip),
        rev,
        "the revision moved: {}",
        w.log_text()
    );
    assert_eq!(
        etcdctl(&ctl, ip, &["get", "genuine", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    let (_, body) = w.get("/status").unwrap();
    assert!(body.len() < 64 << 10, "/status is {} bytes", body.len());
    let rss = peak_rss(w.pid());
    assert!(rss < 256 << 20, "the warden peaked at {} MiB", rss >> 20);
}

/// The same after the data dir is lost: the genuine chain restored, bumped by the default from
/// its own revision and no further.
fn restored(w: &Warden, etcd: &Path, ip: &str, rev: i64, planted: &[String]) {
    let ctl = etcdctl_for(etcd);
    assert_eq!(
        etcdctl(&ctl, ip, &["get", "genuine", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    let now = etcd_revision(&ctl, ip);
    assert!(
        (rev + BUMP..rev + BUMP + 10).contains(&now),
        "restored at revision {now}, not {rev} + the bump: {}",
        w.log_text()
    );
    let log = w.log_text();
    assert!(
        log.contains("do not verify were skipped"),
        "the skipped objects are not said: {log}"
    );
    let named = log
        .lines()
        .filter(|l| planted.iter().any(|p| l.contains(p)))
        .count();
    assert!(named < 40, "{named} log lines name planted objects");
    let rss = peak_rss(w.pid());
    assert!(rss < 256 << 20, "the warden peaked at {} MiB", rss >> 20);
}

fn lose(dir: &Path, w: Warden) -> PathBuf {
    kill_node(w, UP);
    let data = dir.join("data");
    std::fs::remove_dir_all(&data).unwrap();
    data
}

/// A signed store: every planted name is unsigned, so none of them makes the healthy data dir
/// "behind" (on main the 300-byte full moved it aside and the restore failed; the 7-byte one bumped
/// the revision to i64::MAX − 10^9 + 5), and a lost data dir comes back from the genuine chain.
#[test]
fn planted_names_in_a_signed_store_move_nothing() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let (sign, _) = ed25519(dir.path(), "sign");
    let opts = ["--sign-key", sign.as_str()];
    let (store, rev) = backed_up(&etcd, &ip, dir.path(), &opts);
    let planted = plant(&dir.path().join("store/v1/full"), rev, 2000);

    let w = restart(&etcd, &ip, dir.path(), &store, &opts);
    kept(&w, &etcd, &ip, &dir.path().join("data"), rev);
    lose(dir.path(), w);
    let w = restart(&etcd, &ip, dir.path(), &store, &opts);
    restored(&w, &etcd, &ip, rev, &planted);
}

/// The default store, unsigned: what does not pass the gate (claims its size cannot hold,
/// garbage, a 4 GiB footer, empty objects, a 3 GiB restore plan) is skipped, and a lost data dir
/// is restored from the genuine chain (on main: "the snapshot needs 1000000067108864 bytes", and
/// etcd was not started).
#[test]
fn planted_names_in_an_unsigned_store_stop_no_restore() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let (store, rev) = backed_up(&etcd, &ip, dir.path(), &[]);
    let root = dir.path().join("store");
    let planted = plant(&root.join("v1/full"), rev, 200);
    // Records the warden reads after every full and at start: sparse, 3 GiB each.
    std::fs::create_dir_all(root.join("v1/cluster-restore")).unwrap();
    for record in [
        "v1/cluster-restore/current.json",
        "v1/head.json",
        "v1/cluster.json",
    ] {
        std::fs::File::create(root.join(record))
            .unwrap()
            .set_len(3 << 30)
            .unwrap();
    }

    let w = restart(&etcd, &ip, dir.path(), &store, &[]);
    kept(&w, &etcd, &ip, &dir.path().join("data"), rev);
    lose(dir.path(), w);
    let w = restart(&etcd, &ip, dir.path(), &store, &[]);
    restored(&w, &etcd, &ip, rev, &planted);
    // Backups go on beside the planted objects: a write reaches the store.
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ip, &["put", "after", "v"]).unwrap();
    let now = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {now} in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(now)).then_some(())
    });
}

/// S3 keys object_store cannot turn into paths (an empty, `.` or `..` segment) fail the whole
/// page they are in: on main one of them made every listing fail, so a lost data dir was never
/// restored. Planted in moto beside a genuine chain copied there, they are skipped; the restore,
/// judged by a plain etcd on its result, holds the genuine key at the genuine revision.
#[test]
fn keys_that_are_no_path_end_no_s3_listing() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let (store, rev) = backed_up(&etcd, &ip, dir.path(), &[]);
    let s3_ip = unique_ip();
    let moto = moto(&s3_ip, 5000);
    create_bucket(&moto.addr, "odd");
    let env = s3_env(&moto.endpoint);
    let copied = std::process::Command::new(WARDEN)
        .args(["backups", "copy", "--from", &store, "--to", "s3://odd/etcd"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let odd = [
        "etcd/v1/full/a//b.ews",
        "etcd/v1/full/x/../y.ews",
        "etcd/v1/full/./y.ews",
        "etcd/v1/full//z.ews",
        "etcd/v1/./x",
        "etcd/v1/delta//q.ews",
        "etcd/v2/../w",
    ];
    boto3(
        &moto.endpoint,
        "for k in sys.argv[1:]: s3.put_object(Bucket='odd', Key=k, Body=b'')",
        &odd,
    );
    let keys = s3_keys(&moto.endpoint, "odd");
    assert!(
        odd.iter().all(|k| keys.iter().any(|have| have == k)),
        "moto holds {keys:?}"
    );

    let restored = dir.path().join("restored");
    let envs: Vec<(&str, String)> = env.clone();
    let out = restore_command("s3://odd/etcd", &restored, &etcd, &ip, &envs)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the restore failed:\n{said}");
    let plain = PlainEtcd::start(&etcd, &ip, &restored, "m1");
    let ctl = etcdctl_for(&etcd);
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "genuine", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    assert_eq!(etcd_revision(&ctl, &ip), rev);
    plain.stop();
    // Every command that lists goes on past them: the listing, verify, a copy elsewhere.
    let copy = format!("file://{}", dir.path().join("copy").display());
    for args in [
        &["backups", "list", "--json", "--store", "s3://odd/etcd"][..],
        &["backups", "verify", "--store", "s3://odd/etcd"],
        &["backups", "copy", "--from", "s3://odd/etcd", "--to", &copy],
    ] {
        let out = std::process::Command::new(WARDEN)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let copied: Vec<_> = std::fs::read_dir(dir.path().join("copy/v1/full"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(copied.len(), 1, "the copy holds the genuine full: {copied:?}");
}

/// Retention decides from fulls that pass the gate: with `--retention last:1`, names planted as
/// newer fulls neither push the genuine newest full out (on main, retention kept the planted name
/// as "the newest" and deleted every genuine full and delta) nor get deleted themselves. Judged by
/// the store's files and by a restore of the store, read back with a plain etcd.
#[test]
fn planted_names_make_retention_delete_nothing_genuine() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let opts = ["--retention", "last:1"];
    let (store, rev) = backed_up(&etcd, &ip, dir.path(), &opts);
    let fulls = dir.path().join("store/v1/full");
    let planted = [full_name(rev + 1000, 1), full_name(rev + 2000, 2)];
    for name in &planted {
        std::fs::write(fulls.join(name), b"garbage").unwrap();
    }

    let w = restart(&etcd, &ip, dir.path(), &store, &opts);
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ip, &["put", "after", "v"]).unwrap();
    let fulls_before = w.status()["backup"]["fulls_total"].as_u64().unwrap_or(0);
    w.signal(Signal::SIGUSR1);
    wait_for("a full snapshot after the write", UP, || {
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls_before)).then_some(())
    });
    let now = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {now} in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(now)).then_some(())
    });
    // Retention has run after that full: the older genuine full went, as last:1 says.
    let genuine = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !planted.contains(n))
            .collect()
    };
    wait_for("retention to leave one genuine full", UP, || {
        (genuine(&fulls).len() == 1).then_some(())
    });
    for name in &planted {
        assert!(fulls.join(name).exists(), "retention deleted the planted {name}");
    }
    kill_node(w, UP);

    let restored = dir.path().join("restored");
    let out = restore_command(&store, &restored, &etcd, &ip, &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = PlainEtcd::start(&etcd, &ip, &restored, "m1");
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "after", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    assert_eq!(etcd_revision(&ctl, &ip), now);
    plain.stop();
}

/// Another cluster's forced restore plan copied into this prefix (its signature, with a key both
/// clusters share, would verify): a member of this cluster, which has quorum, does not apply it,
/// because the plan names the cluster it restores and this one is another. On main the member
/// moved its data aside and restored the plan's point.
#[test]
fn another_clusters_forced_plan_moves_no_member_of_a_cluster_with_quorum() {
    use common::cluster::{member_args_token, quiet_full_schedule, start_members, stop_all};
    let etcd = default_etcd();
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let store = format!("file://{}", dir.path().join("store").display());
    let token = "planted-plan";
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", token);
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ips[0], &["put", "genuine", "v"]).unwrap();
    let fulls = dir.path().join("store/v1/full");
    let full = wait_for("a full snapshot in the store", UP, || {
        std::fs::read_dir(&fulls)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.ends_with(".ews"))
    });
    let members: Vec<serde_json::Value> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| serde_json::json!({"name": format!("m{i}"), "peer_urls": [format!("https://{ip}:2380")]}))
        .collect();
    let plan = serde_json::json!({"format": 1, "id": "20991231T000000000Z", "created_ms": 1,
        "full": format!("v1/full/{full}"), "target_revision": 1, "bump_revision": 0,
        "token": "the-other-cluster", "members": members,
        "previous_cluster_id": 0xdead_beef_u64, "force": true});
    let plans = dir.path().join("store/v1/cluster-restore");
    std::fs::create_dir_all(&plans).unwrap();
    std::fs::write(plans.join("current.json"), plan.to_string()).unwrap();

    // Member 2's warden starts again: its start-up meets the plan while the others hold quorum.
    let mut w = wardens[2].take().unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
    let data = dir.path().join("m2");
    let argv = member_args_token(&etcd, &ips, 2, &data, token);
    let schedule = quiet_full_schedule();
    let opts = [
        "--store",
        store.as_str(),
        "--delta-snapshot-period",
        "200ms",
        "--full-snapshot-schedule",
        schedule.as_str(),
    ];
    let w = Warden::start(&ips[2], &opts, &argv);
    w.wait_ready(UP);
    let log = w.log_text();
    assert!(log.contains("restores another cluster"), "{log}");
    assert_eq!(
        aside(&data),
        Vec::<String>::new(),
        "member 2's data was moved: {log}"
    );
    let moved: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("before-cluster-restore"))
        .collect();
    assert!(moved.is_empty(), "moved aside by the plan: {moved:?}");
    assert_eq!(
        etcdctl(&ctl, &ips[2], &["get", "genuine", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    assert!(
        etcd_revision(&ctl, &ips[2]) < BUMP,
        "member 2 was restored with a bump: {log}"
    );
    wardens[2] = Some(w);
    stop_all(&mut wardens);
}

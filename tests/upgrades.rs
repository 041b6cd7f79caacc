//! etcd upgrades under the warden, with the real releases: the paths etcd supports start (3.5.30 →
//! 3.6.16 → 3.7.3, data and leases kept, the release recorded beside the data dir), and every path
//! it does not support is refused before etcd starts (exit 64), naming the supported path, with the
//! data dir byte for byte as it was: a skipped minor, an older release on newer storage, and 3.5
//! before 3.5.26 going to 3.6. `--allow-unsupported-upgrade` starts such a path and says so in
//! /status.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(60);

/// Every file under `dir`, with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path(), std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn record(data: &Path) -> Option<String> {
    std::fs::read_to_string(format!("{}.warden-etcd-release", data.display()))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A data dir written by a plain `etcd` (no warden, so no release record) holding `k=v`.
fn plain_data(etcd: &Path, dir: &Path, name: &str) -> PathBuf {
    let data = dir.join(name);
    let ip = unique_ip();
    let e = PlainEtcd::start(etcd, &ip, &data, "m1");
    etcdctl(&etcdctl_for(etcd), &ip, &["put", "k", "v"]).unwrap();
    e.stop();
    data
}

/// `run` with `etcd` on `data`, expected to refuse: its exit code and output.
fn refused_run(etcd: &Path, dir: &Path, data: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let ip = unique_ip();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, data));
    refused_run_argv(&ip, dir, &argv, extra)
}

/// The same with etcd's whole command line.
fn refused_run_argv(ip: &str, dir: &Path, argv: &[String], extra: &[&str]) -> (Option<i32>, String) {
    // Through the harness's builder, which adds what a TLS cluster's warden needs.
    let mut opts = vec!["--store".to_owned(), format!("file://{}/store", dir.display())];
    opts.extend(extra.iter().map(|s| (*s).to_owned()));
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let mut cmd = Warden::builder(ip, &opts, argv).cmd;
    let log = dir.join("refused-run.log");
    let file = std::fs::File::create(&log).unwrap();
    cmd.stdout(file.try_clone().unwrap()).stderr(file);
    let mut child = dies_with_test(&mut cmd).process_group(0).spawn().unwrap();
    // A start that is not refused keeps running: end it (its process group, etcd included) and
    // report what it said.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    (status.and_then(|s| s.code()), text)
}

fn warden_on(etcd: &Path, ip: &str, dir: &Path, data: &Path, extra: &[&str]) -> Warden {
    let store = format!("file://{}/store", dir.display());
    let mut opts = vec!["--store", store.as_str(), "--delta-snapshot-period", "200ms"];
    opts.extend_from_slice(extra);
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, data));
    let w = Warden::start(ip, &opts, &argv);
    w.wait_ready(START);
    w
}

#[test]
fn unsupported_paths_are_refused_before_etcd_starts_and_leave_the_data_dir_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: Vec<(&str, PathBuf, PathBuf, &str)> = vec![
        (
            "3.4.23 data under 3.6.16 (a skipped minor)",
            plain_data(&etcd34(), d, "from-3.4"),
            etcd36(),
            "run 3.5 on it first",
        ),
        (
            "3.5.30 data under 3.7.3 (a skipped minor)",
            plain_data(&etcd35_newest(), d, "from-3.5"),
            etcd37(),
            "run 3.6 on it first",
        ),
        (
            "3.6.16 data under 3.5.30 (older release, newer storage)",
            plain_data(&etcd36(), d, "from-3.6"),
            etcd35_newest(),
            "downgrade",
        ),
        (
            "3.7.3 data under 3.6.16 (older release, newer storage)",
            plain_data(&etcd37(), d, "from-3.7"),
            etcd36(),
            "downgrade",
        ),
    ];
    for (what, data, etcd, want) in &cases {
        let before = tree(data);
        let (code, text) = refused_run(etcd, d, data, &[]);
        assert_eq!(code, Some(64), "{what}: {text}");
        assert!(
            text.contains(want) && text.contains("--allow-unsupported-upgrade"),
            "{what}: does not name {want:?} and the override:\n{text}"
        );
        assert_eq!(tree(data), before, "{what}: the data dir changed");
        assert_eq!(record(data), None, "{what}: a release was recorded");
    }
}

/// 3.5.16 ran under the warden (so the release is known), then 3.6.16: refused, naming 3.5.26;
/// with `--allow-unsupported-upgrade` it starts, the data is there, and /status says it was allowed.
#[test]
fn a_3_5_release_before_3_5_26_is_refused_for_3_6_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let ip = unique_ip();
    let mut w = warden_on(&etcd35(), &ip, d, &data, &[]);
    etcdctl(&etcdctl_for(&etcd35()), &ip, &["put", "k", "from-3.5.16"]).unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    assert_eq!(record(&data).as_deref(), Some("3.5.16"));

    let before = tree(&data);
    let (code, text) = refused_run(&etcd36(), d, &data, &[]);
    assert_eq!(code, Some(64), "{text}");
    assert!(
        text.contains("etcd 3.5.16 last ran on this data dir") && text.contains("3.5.26"),
        "{text}"
    );
    assert_eq!(tree(&data), before, "the data dir changed");

    let w = warden_on(&etcd36(), &ip, d, &data, &["--allow-unsupported-upgrade"]);
    let upgrade = w.status()["etcd"]["upgrade"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        upgrade.contains("allowed by --allow-unsupported-upgrade"),
        "{upgrade:?}"
    );
    let value = etcdctl(&etcdctl_for(&etcd36()), &ip, &["get", "k", "--print-value-only"]).unwrap();
    assert_eq!(value.trim(), "from-3.5.16");
    assert_eq!(record(&data).as_deref(), Some("3.6.16"));
}

/// The supported path, one member: 3.5.30 → 3.6.16 → 3.7.3 under the warden, a key and a leased
/// key written at each step all there at the end (the lease with its TTL, read by etcdctl), the
/// release recorded at each start, nothing in /status about the upgrade. Before each newer minor
/// first starts, a rollback point of the older release's data is in the store (`backups list`:
/// its release, the one it was taken for, the revision etcd had at the stop), and the full names
/// its release. Then the way back: `restore --etcd-version 3.5` with 3.5.30 restores the point
/// taken before 3.6 (says how many revisions that loses), and etcd 3.5.30 serves exactly what
/// was written under 3.5.30.
#[test]
fn a_single_member_goes_3_5_to_3_6_to_3_7_keeping_data_and_leases_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let store = format!("file://{}/store", d.display());
    let ip = unique_ip();
    let mut leases: Vec<(String, String)> = Vec::new();
    let mut stopped_at = Vec::new();
    let mut newest = 0;
    for (etcd, release) in [
        (etcd35_newest(), "3.5.30"),
        (etcd36(), "3.6.16"),
        (etcd37(), "3.7.3"),
    ] {
        let ctl = etcdctl_for(&etcd);
        let mut w = warden_on(&etcd, &ip, d, &data, &[]);
        assert_eq!(record(&data).as_deref(), Some(release));
        assert_eq!(
            w.status()["etcd"]["upgrade"],
            serde_json::Value::Null,
            "{release}"
        );
        assert_eq!(w.status()["etcd"]["version"], release);
        // Everything the earlier releases wrote is there.
        for (i, (lease, key)) in leases.iter().enumerate() {
            let got = etcdctl(&ctl, &ip, &["get", key, "--print-value-only"]).unwrap();
            assert_eq!(got.trim(), format!("v{i}"), "{key} under {release}");
            let ttl = etcdctl(&ctl, &ip, &["lease", "timetolive", lease]).unwrap();
            assert!(
                ttl.contains("remaining(") && !ttl.contains("already expired"),
                "{release}: {ttl}"
            );
        }
        let granted = etcdctl(&ctl, &ip, &["lease", "grant", "3600"]).unwrap();
        let lease = granted.split_whitespace().nth(1).unwrap().to_owned();
        let key = format!("under-{release}");
        etcdctl(
            &ctl,
            &ip,
            &["put", &key, &format!("v{}", leases.len()), "--lease", &lease],
        )
        .unwrap();
        leases.push((lease, key));
        newest = etcd_revision(&ctl, &ip);
        wait_for(
            &format!("revision {newest} in the store under {release}"),
            START,
            || (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest)).then_some(()),
        );
        stopped_at.push(newest);
        w.signal(Signal::SIGTERM);
        w.wait_exit(START);
    }

    let listed = backups_list(&store, &[]);
    let points: Vec<(String, String, i64)> = listed
        .iter()
        .filter(|r| r["kind"] == "rollback")
        .map(|r| {
            (
                r["etcd_version"].as_str().unwrap().to_owned(),
                r["rollback_for"].as_str().unwrap().to_owned(),
                r["last"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        points,
        vec![
            ("3.5.30".to_owned(), "3.6.16".to_owned(), stopped_at[0]),
            ("3.6.16".to_owned(), "3.7.3".to_owned(), stopped_at[1]),
        ],
        "rollback points: {listed:#?}"
    );
    // The chain goes on across the upgrades: its full names the release that took it.
    assert!(
        listed
            .iter()
            .any(|r| r["kind"] == "full" && r["etcd_version"] == "3.5.30"),
        "no full labelled 3.5.30: {listed:#?}"
    );

    // Each delta's header names the release that served its revisions: one chain, three releases.
    let mut delta_releases = std::collections::BTreeSet::new();
    for f in tree(&d.join("store/v1/delta")).keys() {
        let bytes = std::fs::read(f).unwrap();
        assert_eq!(&bytes[..8], b"EWARDEN1", "{}", f.display());
        let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[12..12 + len]).unwrap();
        delta_releases.insert(header["etcd_version"].as_str().unwrap_or_default().to_owned());
    }
    for release in ["3.5.30", "3.6.16", "3.7.3"] {
        assert!(
            delta_releases.contains(release),
            "no delta labelled {release}: {delta_releases:?}"
        );
    }

    // The way back to 3.5, with 3.5.30's tools: docs/upgrades.md's runbook as written.
    let ip2 = unique_ip();
    let [block] = &runbook_blocks("docs/upgrades.md", "rollback")[..] else {
        panic!("one runbook-rollback block")
    };
    let vars = vec![
        ("STORE", store.clone()),
        ("DATA_DIR", data.display().to_string()),
        ("NAME", "m1".to_owned()),
        ("PEER_URL", format!("https://{ip2}:2380")),
        ("RELEASE", "3.5".to_owned()),
        ("OLD_ETCD", etcd35_newest().display().to_string()),
    ];
    let bins = [Path::new(WARDEN).parent().unwrap()];
    let said = run_block(block, &vars, &bins, "the rollback runbook");
    let back = data.clone();
    assert!(
        d.join("data.after-upgrade/member").is_dir(),
        "the data dir was not moved aside"
    );
    let lost = newest - stopped_at[0];
    assert!(
        said.contains(&format!("LOST by this rollback: {lost} revisions")),
        "the loss is not said ({lost} revisions): {said}"
    );
    let _plain = PlainEtcd::start(&etcd35_newest(), &ip2, &back, "m1");
    let ctl = etcdctl_for(&etcd35_newest());
    let keys = etcdctl(&ctl, &ip2, &["get", "under-", "--prefix", "--keys-only"]).unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        keys,
        vec!["under-3.5.30"],
        "the rollback point holds what 3.5.30 wrote, and only that"
    );
}

/// etcd 3.6.16 killed right after acknowledging writes (the newest may be in its WAL but not yet
/// in its db file), then 3.7.3 started with `--previous-etcd` 3.6.16: the rollback point is taken
/// by a private 3.6.16 on the data, so it holds every acknowledged write; `restore --etcd-version
/// 3.6` brings them back. With `--rollback-retention 3s`, the next full after that deletes the
/// point and only the point.
#[test]
fn the_previous_release_takes_the_rollback_point_after_a_crash_and_the_point_expires() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let store = format!("file://{}/store", d.display());
    let ip = unique_ip();
    let ctl36 = etcdctl_for(&etcd36());
    let w = warden_on(&etcd36(), &ip, d, &data, &[]);
    assert_eq!(record(&data).as_deref(), Some("3.6.16"));
    let mut acked = 0;
    for i in 0..30 {
        let out = etcdctl(&ctl36, &ip, &["put", &format!("crash-{i}"), "v", "-w", "json"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        acked = v["header"]["revision"].as_i64().unwrap();
    }
    // SIGKILL to the warden's process group: etcd dies with it, no clean stop.
    drop(w);

    let w = warden_on(
        &etcd37(),
        &ip,
        d,
        &data,
        &[
            "--previous-etcd",
            &etcd36().display().to_string(),
            "--rollback-retention",
            "3s",
        ],
    );
    assert!(
        w.log_text()
            .contains("through a private etcd of the previous release"),
        "{}",
        w.log_text()
    );
    let points: Vec<serde_json::Value> = backups_list(&store, &[])
        .into_iter()
        .filter(|r| r["kind"] == "rollback")
        .collect();
    assert_eq!(points.len(), 1, "{points:#?}");
    assert_eq!(points[0]["etcd_version"], "3.6.16", "{points:#?}");
    assert_eq!(points[0]["rollback_for"], "3.7.3", "{points:#?}");
    assert!(
        points[0]["last"].as_i64() >= Some(acked),
        "the rollback point ends before the last acknowledged write ({acked}): {points:#?}"
    );
    let back = d.join("back-to-3.6");
    let ip2 = unique_ip();
    let out = restore_command_bumped(&store, &back, &etcd36(), &ip2, &[])
        .args(["--etcd-version", "3.6"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    {
        let _plain = PlainEtcd::start(&etcd36(), &ip2, &back, "m1");
        let keys = etcdctl(&ctl36, &ip2, &["get", "crash-", "--prefix", "--keys-only"]).unwrap();
        assert_eq!(
            keys.lines().filter(|l| !l.is_empty()).count(),
            30,
            "acknowledged writes missing from the rollback point: {keys}"
        );
    }

    // Expiry: once 3 s have passed, the retention after the next full deletes the point.
    std::thread::sleep(Duration::from_secs(3));
    let fulls_before = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "full")
        .count();
    w.signal(Signal::SIGUSR1);
    wait_for("the rollback point to expire", START, || {
        let listed = backups_list(&store, &[]);
        (!listed.iter().any(|r| r["kind"] == "rollback")).then_some(listed)
    });
    let fulls_after = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "full")
        .count();
    assert!(
        fulls_after > fulls_before,
        "{fulls_before} fulls before, {fulls_after} after"
    );
}

/// Puts `k…` keys through any of `ips` (the client fails over while members restart) until told
/// to stop; the acknowledged ones.
fn writer_to_all(
    ips: Vec<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        rt().block_on(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(2));
            let mut client = None;
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if client.is_none() {
                    client = pki::connect_all(&ips, Some(opts.clone())).await.ok();
                }
                let k = format!("k{n:06}");
                n += 1;
                let ok = match client.as_mut() {
                    Some(c) => c.put(k.as_str(), "v", None).await.is_ok(),
                    None => false,
                };
                if ok {
                    acked.push(k);
                } else {
                    client = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            acked
        })
    })
}

/// The storage version each member reports (`etcdctl endpoint status`, 3.6 and later).
fn storage_versions(ctl: &Path, ips: &[String]) -> Vec<String> {
    ips.iter()
        .map(|ip| {
            etcdctl(ctl, ip, &["endpoint", "status", "-w", "json"])
                .ok()
                .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
                .and_then(|v| v[0]["Status"]["storageVersion"].as_str().map(str::to_owned))
                .unwrap_or_default()
        })
        .collect()
}

/// Whether `data` holds a raft snapshot file written after `since`.
fn snapshot_since(data: &Path, since: std::time::SystemTime) -> bool {
    std::fs::read_dir(data.join("member/snap"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.path().extension().is_some_and(|x| x == "snap")
                && e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t > since)
        })
}

/// A three-member rolling upgrade 3.5.30 → 3.6.16 → 3.7.3 under steady writes: each member's warden
/// restarted with the new binary, one at a time, each ready on the new release before the next.
/// On 3.6 the WAL still holds the v2 requests the cluster wrote under 3.5, which 3.7 cannot apply:
/// the first 3.7 start is refused (exit 64, the data dir as it was), naming the fix; once each
/// member ran 3.6 with a small --snapshot-count and took a raft snapshot, 3.7 starts. At the end
/// every acknowledged write is in a restore of the store, which holds one contiguous chain.
#[test]
fn three_members_roll_from_3_5_to_3_6_to_3_7_under_writes_losing_nothing() {
    // Plain http: the WAL history this test needs (etcd 3.5's v2 requests kept past the roll to
    // 3.6) depends on the order etcd decides its cluster version at bootstrap; TLS handshakes
    // make 3.5 decide 3.0 first, and 3.6 then takes a raft snapshot past those requests.
    use common::cluster::*;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store = format!("file://{}/store", d.display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let data = |i: usize| d.join(format!("m{i}"));
    let mut wardens = start_members_http(&etcd35_newest(), d, &store, &ips, "m", "rolling");
    let base = wait_for("the first full", START, || {
        let listed = backups_list(&store, &[]);
        listed
            .iter()
            .find(|r| r["kind"] == "full")
            .and_then(|r| r["last"].as_i64())
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = writer_to_all(ips.clone(), stop.clone());
    // One member at a time (of `members`) onto `etcd` with `extra` etcd flags.
    let roll_some = |wardens: &mut Vec<Option<Warden>>,
                     members: std::ops::Range<usize>,
                     etcd: &Path,
                     release: &str,
                     extra: &[&str]| {
        for i in members {
            // (A member already stopped is started.)
            if let Some(mut old) = wardens[i].take() {
                old.signal(Signal::SIGTERM);
                assert_eq!(old.wait_exit(START), 143, "m{i} stopping for {release}");
            }
            let mut argv = member_args_http(etcd, &ips, i, &data(i), "rolling");
            argv.extend(extra.iter().map(|s| s.to_string()));
            let w = Warden::start(
                &ips[i],
                &["--store", &store, "--delta-snapshot-period", "200ms"],
                &argv,
            );
            w.wait_ready(START);
            assert_eq!(w.status()["etcd"]["version"], release, "m{i}");
            wardens[i] = Some(w);
        }
    };
    let roll = |wardens: &mut Vec<Option<Warden>>, etcd: &Path, release: &str, extra: &[&str]| {
        roll_some(wardens, 0..3, etcd, release, extra)
    };
    // m0 stopped, then refused 3.7.3 (64, its data dir unchanged) with a message holding `said`.
    let refused_37_on_m0 = |wardens: &mut Vec<Option<Warden>>, said: &[&str]| {
        let mut m0 = wardens[0].take().unwrap();
        m0.signal(Signal::SIGTERM);
        assert_eq!(m0.wait_exit(START), 143);
        let before = tree(&data(0));
        let argv = member_args_http(&etcd37(), &ips, 0, &data(0), "rolling");
        let (code, text) = refused_run_argv(&ips[0], d, &argv, &[]);
        assert_eq!(code, Some(64), "{text}");
        assert!(said.iter().all(|s| text.contains(s)), "{text}");
        assert_eq!(tree(&data(0)), before, "the refused start changed m0's data dir");
    };
    let rolling = std::time::Instant::now();
    roll_some(&mut wardens, 0..1, &etcd36(), "3.6.16", &[]);
    // Mid-roll, m0's data went through 3.6 but the cluster version is still 3.5 (m1 and m2 run
    // 3.5.30): 3.7 on m0 is refused from what the peers say, nothing touched.
    refused_37_on_m0(&mut wardens, &["the cluster version is 3.5", "runs 3.5.30"]);
    roll_some(&mut wardens, 0..3, &etcd36(), "3.6.16", &[]);
    eprintln!(
        "three members rolled 3.5.30 -> 3.6.16 under writes in {:?}",
        rolling.elapsed()
    );
    let ctl36 = etcdctl_for(&etcd36());
    wait_for("every member's storage version at 3.6.0", START, || {
        storage_versions(&ctl36, &ips)
            .iter()
            .all(|v| v == "3.6.0")
            .then_some(())
    });

    // 3.7 on m0 now: refused, nothing touched.
    refused_37_on_m0(&mut wardens, &["v2 format", "--snapshot-count"]);
    let argv = member_args_http(&etcd36(), &ips, 0, &data(0), "rolling");
    let w = Warden::start(
        &ips[0],
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &argv,
    );
    w.wait_ready(START);
    wardens[0] = Some(w);

    // The fix the refusal names: 3.6 with a small --snapshot-count until each member snapshots.
    let since = std::time::SystemTime::now();
    roll(&mut wardens, &etcd36(), "3.6.16", &["--snapshot-count", "50"]);
    wait_for("a raft snapshot on every member", START, || {
        (0..3).all(|i| snapshot_since(&data(i), since)).then_some(())
    });
    let rolling = std::time::Instant::now();
    roll(&mut wardens, &etcd37(), "3.7.3", &[]);
    eprintln!(
        "three members rolled 3.6.16 -> 3.7.3 under writes in {:?}",
        rolling.elapsed()
    );
    let ctl = etcdctl_for(&etcd37());
    wait_for("every member's storage version at 3.7.0", START, || {
        storage_versions(&ctl, &ips)
            .iter()
            .all(|v| v == "3.7.0")
            .then_some(())
    });

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let acked = writes.join().unwrap();
    assert!(acked.len() > 100, "only {} writes acknowledged", acked.len());
    eprintln!("{} writes acknowledged during the upgrades", acked.len());
    let newest = etcd_revision(&ctl, &ips[0]);
    wait_for(&format!("revision {newest} in the store"), START, || {
        wardens
            .iter()
            .flatten()
            .any(|w| w.status()["backup"]["backed_up_revision"].as_i64() >= Some(newest))
            .then_some(())
    });
    stop_all(&mut wardens);
    assert_one_chain(&store, &[], base, newest, "after the rolling upgrade");
    let (keys, _) = keys_after_restore(&etcd37(), &store, &[], "k");
    assert_none_lost(&acked, &keys, "after the rolling upgrade");

    // Back to 3.5.30: one forced plan at the newest 3.5.30 rollback point, the members started
    // with 3.5.30 on the data 3.7.3 served; one cluster, one HashKV, at the point plus the bump.
    let point = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "rollback" && r["etcd_version"] == "3.5.30")
        .filter_map(|r| r["last"].as_i64())
        .max()
        .expect("a 3.5.30 rollback point");
    let [block] = &runbook_blocks("docs/upgrades.md", "rollback-cluster")[..] else {
        panic!("one runbook-rollback-cluster block")
    };
    run_block(
        block,
        &[("STORE", store.clone()), ("RELEASE", "3.5.30".to_owned())],
        &[Path::new(WARDEN).parent().unwrap()],
        "the cluster rollback runbook",
    );
    let back: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_http(&etcd35_newest(), &ips, i, &data(i), "rolling");
            Some(Warden::start(
                &ips[i],
                &["--store", &store, "--delta-snapshot-period", "200ms"],
                &argv,
            ))
        })
        .collect();
    for w in back.iter().flatten() {
        w.wait_ready(START);
        assert_eq!(w.status()["etcd"]["version"], "3.5.30");
    }
    let ctl = etcdctl_for(&etcd35_newest());
    let revs: Vec<i64> = ips.iter().map(|ip| etcd_revision(&ctl, ip)).collect();
    assert!(
        revs.iter().all(|r| *r == point + 1_000_000_000),
        "revisions {revs:?}, point {point}"
    );
    let hashes: Vec<u64> = ips.iter().map(|ip| hashkv(&ctl, ip, 0)).collect();
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "members hash differently: {hashes:?}"
    );
    let mut back = back;
    stop_all(&mut back);
}

/// etcd's own downgrade is a path the warden lets through: `etcd-warden downgrade 3.6` against
/// 3.7.3 (validate, enable, wait) lowers the storage version (as `etcdctl endpoint status` then
/// reports), and 3.6.16 starts on the data with it kept; before the downgrade the same start is
/// refused, and a downgrade by two minors is refused without touching etcd.
#[test]
fn etcds_own_downgrade_from_3_7_to_3_6_is_let_through() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let ip = unique_ip();
    let ctl = etcdctl_for(&etcd37());
    let mut w = warden_on(&etcd37(), &ip, d, &data, &[]);
    etcdctl(&ctl, &ip, &["put", "k", "written-by-3.7"]).unwrap();
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let (code, text) = refused_run(&etcd36(), d, &data, &[]);
    assert_eq!(code, Some(64), "3.6.16 before the downgrade: {text}");

    let w = warden_on(&etcd37(), &ip, d, &data, &[]);
    // One minor at a time, and 3.5 has no complete downgrade: refused, nothing changed.
    let client = pki::warden_flags(&ip);
    let out = Command::new(WARDEN)
        .args(["downgrade", "3.5"])
        .args(&client)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(WARDEN)
        .args(["downgrade", "3.6", "--timeout", "60s"])
        .args(&client)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("storage version is 3.6.0"), "{said}");
    // etcd's own word, not the command's.
    assert_eq!(
        storage_versions(&ctl, std::slice::from_ref(&ip)),
        vec!["3.6.0".to_owned()]
    );
    let mut w = w;
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    let w = warden_on(&etcd36(), &ip, d, &data, &[]);
    assert_eq!(w.status()["etcd"]["version"], "3.6.16");
    let got = etcdctl(&etcdctl_for(&etcd36()), &ip, &["get", "k", "--print-value-only"]).unwrap();
    assert_eq!(got.trim(), "written-by-3.7");
}

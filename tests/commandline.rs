//! The etcd command line read exactly as etcd reads it, with real etcd: boolean flags that stand
//! before a value flag, etcd's `--config-file`, `--wal-dir` on restarts and restores (single member
//! and cluster), and the refusal of what cannot be read or of another process on etcd's ports.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cluster::*;
use common::*;
use nix::sys::signal::Signal;

const UP: Duration = Duration::from_secs(60);

/// `endpoint status`'s member id of the etcd on `ip`.
fn member_id(ctl: &Path, ip: &str) -> u64 {
    let out = etcdctl(ctl, ip, &["endpoint", "status", "-w", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["Status"]["header"]["member_id"].as_u64().unwrap()
}

/// Siblings of `dir` that the warden moved aside (`<dir>.broken-…`, `<dir>.behind-…`, ...).
fn moved_aside(dir: &Path) -> Vec<String> {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with(&format!("{name}."))
                && (n.contains(".broken-") || n.contains(".behind-") || n.contains(".before-"))
        })
        .collect()
}

/// A graceful stop: etcd's own status (Go re-raises SIGTERM after its clean shutdown).
fn stopped(w: &mut Warden) {
    w.signal(Signal::SIGTERM);
    let code = w.wait_exit(UP);
    assert!(code == 0 || code == 143, "exit {code}: {}", w.log_text());
}

fn wal_segments(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".wal"))
                .count()
        })
        .unwrap_or(0)
}

fn booleans_before_values(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    // Each boolean stands right before a flag whose value it would swallow if it were read as
    // taking one: the data dir above all.
    let argv: Vec<String> = [
        etcd.display().to_string().as_str(),
        "--unsafe-no-fsync",
        "--data-dir",
        data.to_str().unwrap(),
        "--socket-reuse-address",
        "--name",
        "m1",
        "--enable-pprof",
        "--listen-client-urls",
        &format!("http://{ip}:2379"),
        "--socket-reuse-port",
        "--advertise-client-urls",
        &format!("http://{ip}:2379"),
        "--peer-skip-client-san-verification",
        "--listen-peer-urls",
        &format!("http://{ip}:2380"),
        "--initial-advertise-peer-urls",
        &format!("http://{ip}:2380"),
        "--initial-cluster",
        &format!("m1=http://{ip}:2380"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut b = Warden::builder(
        &ip,
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &argv,
    );
    b.cmd.current_dir(&cwd);
    let mut w = b.spawn();
    w.wait_ready(UP);
    etcdctl(&ctl, &ip, &["put", "k", "v"]).unwrap();
    let members = etcdctl(&ctl, &ip, &["member", "list"]).unwrap();
    assert!(members.contains(", m1, "), "etcd runs as m1: {members}");
    wait_for("a full snapshot of the data dir", UP, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    assert!(
        data.join("member/snap/db").exists(),
        "etcd's data is in --data-dir"
    );
    let stray: Vec<_> = std::fs::read_dir(&cwd)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        stray.is_empty(),
        "nothing in the working directory (a misread data dir): {stray:?}"
    );
    stopped(&mut w);
}

#[test]
fn booleans_before_value_flags_never_move_the_data_dir() {
    booleans_before_values(&default_etcd());
}

#[test]
fn etcd_3_7_booleans_before_value_flags_never_move_the_data_dir() {
    booleans_before_values(&etcd37());
}

#[test]
fn a_word_no_release_knows_is_refused_with_64_before_anything_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(WARDEN)
        .current_dir(dir.path())
        .args(["run", "--listen", &format!("{}:2378", unique_ip()), "--"])
        .arg(default_etcd())
        .args(["--unsafe-no-fsnyc", "--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--unsafe-no-fsnyc"),
        "the message names the word: {err}"
    );
    assert!(err.contains("--unsafe-no-fsnyc=VALUE"), "and the fix: {err}");
    assert_nothing_in(dir.path());
}

/// The upgrade options with a wrong value: exit 64 naming the option, nothing created.
#[test]
fn a_missing_previous_etcd_or_a_bad_rollback_retention_or_space_history_is_refused_with_64() {
    for (opts, named) in [
        (["--previous-etcd", "/nonexistent/etcd-3.5"], "--previous-etcd"),
        (["--rollback-retention", "a while"], "--rollback-retention"),
        (["--space-history", "0s"], "--space-history"),
        (["--space-history", "an hour"], "--space-history"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let err = refused_run(dir.path(), &opts);
        assert!(err.contains(named), "the message names {named}: {err}");
        assert_nothing_in(dir.path());
    }
}

/// `--copy-to` and `--copy-retention` with a wrong value: exit 64 naming the option and the fix,
/// nothing created (no copy directory, no data dir).
#[test]
fn a_copy_store_that_is_the_store_or_no_store_or_a_bad_copy_retention_is_refused_with_64() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/store", dir.path().display());
    let copy = format!("file://{}/copy", dir.path().display());
    for (opts, named) in [
        (vec!["--copy-to", store.as_str()], "is the --store"),
        (
            vec!["--copy-to", copy.as_str(), "--copy-to", copy.as_str()],
            "another --copy-to",
        ),
        (vec!["--copy-to", "s4://bucket/etcd"], "--copy-to"),
        (
            vec!["--copy-to", copy.as_str(), "--copy-retention", "last:0"],
            "--copy-retention",
        ),
        (vec!["--copy-retention", "last:3"], "no --copy-to store"),
    ] {
        let err = refused_run(
            dir.path(),
            &[&["--store", store.as_str()], opts.as_slice()].concat(),
        );
        assert!(err.contains(named), "{opts:?}: the message says {named:?}: {err}");
        assert_nothing_in(dir.path());
    }
}

/// `standby` never starts on a data dir that holds a member's data, nor as a member of a
/// cluster, nor with the WAL outside the data dir: exit 64 naming the fix, the data untouched.
#[test]
fn a_standby_on_a_members_data_or_in_a_cluster_is_refused_with_64() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/store", dir.path().display());
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("member/snap")).unwrap();
    std::fs::write(data.join("member/snap/db"), b"a member's data").unwrap();
    let standby = |etcd_flags: &[&str]| {
        let out = std::process::Command::new(WARDEN)
            .current_dir(dir.path())
            .args(["standby", "--listen", &format!("{}:2378", unique_ip())])
            .args(["--store", &store])
            .arg("--")
            .arg(default_etcd())
            .args(["--name", "m1", "--data-dir", data.to_str().unwrap()])
            .args(etcd_flags)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{etcd_flags:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = standby(&[]);
    assert!(
        err.contains("not a standby's") && err.contains("empty directory"),
        "{err}"
    );
    let err = standby(&[
        "--initial-cluster",
        "m1=http://127.0.0.1:2380,m2=http://127.0.0.2:2380,m3=http://127.0.0.3:2380",
    ]);
    assert!(err.contains("a standby is a single member"), "{err}");
    std::fs::remove_dir_all(&data).unwrap();
    let err = standby(&["--wal-dir", dir.path().join("wal").to_str().unwrap()]);
    assert!(err.contains("--wal-dir"), "{err}");
    // `run` on a standby's data dir that was never promoted: refused, the data untouched.
    std::fs::create_dir_all(data.join("member/snap")).unwrap();
    std::fs::write(data.join("member/snap/db"), b"a standby's data").unwrap();
    let marker = dir.path().join("data.standby");
    std::fs::write(&marker, format!("etcd-warden standby of {store}\n")).unwrap();
    let err = refused_run(dir.path(), &["--store", &store]);
    assert!(
        err.contains("is a standby's") && err.contains("ctl promote"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(data.join("member/snap/db")).unwrap(),
        b"a standby's data"
    );
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert!(!data.exists(), "nothing created");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "nothing created: {left:?}");
}

/// `run OPTS -- etcd --data-dir DIR/data` in `dir`: exits 64; its stderr.
fn refused_run(dir: &Path, opts: &[&str]) -> String {
    let out = std::process::Command::new(WARDEN)
        .current_dir(dir)
        .args(["run", "--listen", &format!("{}:2378", unique_ip())])
        .args(opts)
        .arg("--")
        .arg(default_etcd())
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{opts:?}: {err}");
    err
}

/// A refused command created nothing in `dir`.
fn assert_nothing_in(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "nothing created: {left:?}");
}

/// `--kube-encryption-config` naming a file that is not an EncryptionConfiguration: exit 64 before
/// etcd starts, the message names the option and the file's kind, nothing created.
#[test]
fn a_kube_encryption_config_that_is_no_encryption_configuration_is_refused_with_64() {
    let dir = tempfile::tempdir().unwrap();
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(conf.path(), "apiVersion: v1\nkind: Pod\n").unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(WARDEN)
        .current_dir(dir.path())
        .args(["run", "--listen", &format!("{}:2378", unique_ip())])
        .args(["--store", &format!("file://{}/store", dir.path().display())])
        .arg("--kube-encryption-config")
        .arg(conf.path())
        .arg("--")
        .arg(default_etcd())
        .args(["--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("kube-encryption-config") && err.contains("not an EncryptionConfiguration"),
        "{err}"
    );
    assert_nothing_in(dir.path());
}

/// etcd's `--config-file` with a `wal-dir`: the warden reads the member from the file (and ignores
/// the ETCD_* variables etcd ignores then), a restart keeps the member as it was (same id, nothing
/// moved aside), and a member whose data dir and wal dir are both lost is restored into both.
#[test]
fn a_config_file_with_a_wal_dir_restarts_in_place_and_restores_into_both_dirs() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let wal = dir.path().join("disk2").join("wal");
    let config = dir.path().join("etcd.yaml");
    std::fs::write(
        &config,
        format!(
            "name: m1\ndata-dir: {}\nwal-dir: {}\nlisten-client-urls: http://{ip}:2379\nadvertise-client-urls: http://{ip}:2379\n\
             listen-peer-urls: http://{ip}:2380\ninitial-advertise-peer-urls: http://{ip}:2380\ninitial-cluster: m1=http://{ip}:2380\n",
            data.display(),
            wal.display()
        ),
    )
    .unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let argv = vec![
        etcd.display().to_string(),
        "--config-file".into(),
        config.display().to_string(),
    ];
    let start = || {
        let w = Warden::builder(
            &ip,
            &["--store", &store, "--delta-snapshot-period", "200ms"],
            &argv,
        )
        .env("ETCD_DATA_DIR", "/nonexistent/ignored-by-etcd")
        .spawn();
        w.wait_ready(UP);
        w
    };

    let mut w = start();
    for i in 0..20 {
        etcdctl(&ctl, &ip, &["put", &format!("k{i}"), &format!("v{i}")]).unwrap();
    }
    let acked = etcd_revision(&ctl, &ip);
    let id = member_id(&ctl, &ip);
    assert!(wal_segments(&wal) > 0, "etcd writes its WAL into wal-dir");
    assert!(!data.join("member/wal").exists(), "and not into the data dir");
    wait_for("the writes in the store", UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(acked)).then_some(())
    });
    stopped(&mut w);

    // A plain restart: the same member on the same data, nothing moved aside.
    let mut w = start();
    assert_eq!(member_id(&ctl, &ip), id, "the same member after a restart");
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "k19", "--print-value-only"])
            .unwrap()
            .trim(),
        "v19"
    );
    assert!(
        moved_aside(&data).is_empty() && moved_aside(&wal).is_empty(),
        "nothing moved aside: {:?} {:?}",
        moved_aside(&data),
        moved_aside(&wal)
    );
    stopped(&mut w);

    // Both dirs lost: restored into both (the WAL into wal-dir), every acknowledged write back.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::remove_dir_all(&wal).unwrap();
    let mut w = start();
    assert!(wal_segments(&wal) > 0, "the restored WAL is in wal-dir");
    assert!(!data.join("member/wal").exists(), "not in the data dir");
    for i in 0..20 {
        assert_eq!(
            etcdctl(&ctl, &ip, &["get", &format!("k{i}"), "--print-value-only"])
                .unwrap()
                .trim(),
            format!("v{i}")
        );
    }
    assert!(
        etcd_revision(&ctl, &ip) > acked,
        "the restore bumps past what clients saw"
    );
    stopped(&mut w);
}

/// Three members with `--wal-dir`: stopped and started again, each comes back as itself (same
/// member ids, nothing moved aside, no member removed and re-added).
#[test]
fn a_cluster_with_wal_dirs_restarts_as_the_same_members() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let store = format!("file://{}", dir.path().join("store").display());
    let data = |i: usize| dir.path().join(format!("m{i}"));
    let wal = |i: usize| dir.path().join(format!("wal{i}"));
    let start = |i: usize| {
        let mut argv = member_args_token(&etcd, &ips, i, &data(i), "walcluster");
        argv.extend(["--wal-dir".to_owned(), wal(i).display().to_string()]);
        Warden::start(
            &ips[i],
            &["--store", &store, "--delta-snapshot-period", "200ms"],
            &argv,
        )
    };
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    etcdctl(&ctl, &ips[0], &["put", "k", "v"]).unwrap();
    let before = member_ids(&ctl, &ips[0]);
    stop_all(&mut wardens);
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let mut after = member_ids(&ctl, &ips[1]);
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(after, before, "the same three members");
    assert_eq!(
        etcdctl(&ctl, &ips[2], &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    for i in 0..3 {
        assert!(wal_segments(&wal(i)) > 0);
        assert!(
            moved_aside(&data(i)).is_empty() && moved_aside(&wal(i)).is_empty(),
            "member {i}: nothing moved aside"
        );
    }
    stop_all(&mut wardens);
}

/// Another etcd already on the addresses: the warden does not start its own, says which address
/// is taken, and leaves its data dir alone.
#[test]
fn another_process_on_etcds_addresses_is_refused_and_nothing_is_touched() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let other = PlainEtcd::start(&etcd, &ip, &dir.path().join("other"), "m1");
    let data: PathBuf = dir.path().join("data");
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &data));
    let mut w = Warden::start(
        &ip,
        &[
            "--store",
            &format!("file://{}", dir.path().join("store").display()),
        ],
        &argv,
    );
    let code = w.wait_exit(UP);
    let log = w.log_text();
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("another process already listens"), "{log}");
    assert!(
        log.contains(&format!("--listen-client-urls https://{ip}:2379/")),
        "names the address: {log}"
    );
    assert!(
        !data.join("member").exists(),
        "the warden's data dir is untouched"
    );
    other.stop();
}

/// Members configured only by `--config-file` (with a wal dir): one loses its data dir and its wal
/// dir while its peers keep quorum; it rejoins through them as a new member, etcd getting
/// `initial-cluster-state: existing` through the warden's copy of its config file (etcd ignores
/// flags next to a config file).
#[test]
fn a_member_configured_by_a_config_file_rejoins_through_its_peers() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let store = format!("file://{}", dir.path().join("store").display());
    let cluster = (0..3)
        .map(|j| format!("m{j}=http://{}:2380", ips[j]))
        .collect::<Vec<_>>()
        .join(",");
    let data = |i: usize| dir.path().join(format!("m{i}"));
    let wal = |i: usize| dir.path().join(format!("wal{i}"));
    let start = |i: usize| {
        let ip = &ips[i];
        let config = dir.path().join(format!("m{i}.yaml"));
        std::fs::write(
            &config,
            format!(
                "name: m{i}\ndata-dir: {}\nwal-dir: {}\nlisten-client-urls: http://{ip}:2379\nadvertise-client-urls: http://{ip}:2379\n\
                 listen-peer-urls: http://{ip}:2380\ninitial-advertise-peer-urls: http://{ip}:2380\ninitial-cluster: {cluster}\n\
                 initial-cluster-token: cfgcluster\ninitial-cluster-state: new\n",
                data(i).display(),
                wal(i).display()
            ),
        )
        .unwrap();
        let argv = vec![
            etcd.display().to_string(),
            "--config-file".into(),
            config.display().to_string(),
        ];
        Warden::start(
            ip,
            &["--store", &store, "--delta-snapshot-period", "200ms"],
            &argv,
        )
    };
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    etcdctl(&ctl, &ips[0], &["put", "k", "v"]).unwrap();
    let victim = 2;
    let old = member_ids(&ctl, &ips[0])
        .into_iter()
        .find(|(n, _)| n == "m2")
        .unwrap()
        .1;
    let w = wardens[victim].as_ref().unwrap();
    let pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(data(victim)).unwrap();
    std::fs::remove_dir_all(wal(victim)).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let new = wait_for("m2 back as a started voter with a new id", START, || {
        let out = etcdctl(&ctl, &ips[0], &["member", "list", "-w", "json"]).ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v["members"].as_array()?.iter().find_map(|m| {
            let started = m["name"] == "m2" && m["isLearner"].as_bool() != Some(true);
            let id = m["ID"].as_u64()?;
            (started && id != old).then_some(id)
        })
    });
    w.wait_ready(START);
    assert_ne!(new, old);
    assert_eq!(member_ids(&ctl, &ips[0]).len(), 3);
    assert_eq!(
        etcdctl(&ctl, &ips[victim], &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    let copy = std::fs::read_to_string(dir.path().join("m2.warden-etcd-config.json"))
        .expect("the warden's copy of m2's config");
    assert!(copy.contains("\"initial-cluster-state\": \"existing\""), "{copy}");
    assert!(
        wal_segments(&wal(victim)) > 0,
        "the rejoined member's WAL is in its wal dir"
    );
    stop_all(&mut wardens);
}

/// etcd dies and, before the warden restarts it, another etcd takes its addresses: the warden does
/// not start its own on them (it would fail to bind, and meanwhile the other one would answer its
/// health checks), readiness stays 503 saying why, and once the address is free again the warden's
/// own etcd comes back on its own data (the same member).
#[test]
fn another_etcd_on_the_address_while_etcd_is_down_holds_the_restart_back() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let mut w = Warden::start(
        &ip,
        &["--restart-backoff-min", "3s", "--restart-backoff-max", "3s"],
        &argv,
    );
    w.wait_ready(UP);
    etcdctl(&ctl, &ip, &["put", "k", "ours"]).unwrap();
    let id = member_id(&ctl, &ip);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.etcd_pid().unwrap()), Signal::SIGKILL).unwrap();
    let other = PlainEtcd::start(&etcd, &ip, &dir.path().join("other"), "m1");
    let held = wait_for("the restart held back", UP, || {
        let st = w.status();
        st["etcd"]["held_back"].as_str().map(str::to_owned)
    });
    assert!(
        held.contains(&format!("--listen-client-urls https://{ip}:2379/")),
        "{held}"
    );
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let (code, body) = w.get("/readyz").unwrap();
        assert_eq!(code, 503, "ready while another etcd holds the address: {body}");
        assert!(
            w.etcd_pid().is_none(),
            "the warden started its etcd on a taken address"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    other.stop();
    w.wait_ready(UP);
    assert_eq!(member_id(&ctl, &ip), id, "the warden's own member is back");
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "ours"
    );
    assert!(w.status()["etcd"]["held_back"].is_null());
    stopped(&mut w);
}

/// The warden's etcd has started (here a stand-in that never listens) and another etcd answers on
/// its client address: that etcd is not reported healthy or ready, and nothing of it is backed up
/// as this member's, because its listening socket is not the warden's child's.
#[test]
fn an_etcd_the_warden_did_not_start_is_never_reported_ready_nor_backed_up() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut argv = script_program("exec sleep 600");
    argv.extend(
        [
            "--data-dir",
            &dir.path().join("data").display().to_string(),
            "--listen-client-urls",
            &format!("http://{ip}:2379"),
            "--advertise-client-urls",
            &format!("http://{ip}:2379"),
            "--listen-peer-urls",
            &format!("http://{ip}:2380"),
        ]
        .map(str::to_owned),
    );
    let mut w = Warden::start(
        &ip,
        &[
            "--store",
            &format!("file://{}", store.display()),
            "--delta-snapshot-period",
            "200ms",
        ],
        &argv,
    );
    wait_for("the stand-in etcd to run", UP, || w.etcd_pid());
    // On plain http, as the stand-in's command line says etcd serves.
    let other = PlainEtcd::start_http(&etcd, &ip, &dir.path().join("other"), "foreign");
    let verdict = wait_for(
        "a health verdict on the etcd answering at the address",
        UP,
        || {
            let st = w.status();
            if st["etcd"]["healthy"] == true {
                return Some(Err(st));
            }
            let reason = st["etcd"]["health_reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            reason.contains("another process").then_some(Ok(reason))
        },
    );
    let reason =
        verdict.unwrap_or_else(|st| panic!("an etcd the warden did not start was reported healthy: {st}"));
    assert!(reason.contains(&format!("http://{ip}:2379")), "{reason}");
    let (code, body) = w.get("/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        !store.join("v1/full").exists() || std::fs::read_dir(store.join("v1/full")).unwrap().next().is_none(),
        "the other etcd was backed up as this member"
    );
    assert_eq!(w.status()["backup"]["fulls_total"].as_u64().unwrap_or(0), 0);
    other.stop();
    stopped(&mut w);
}

//! `diff` and `undo` against real etcd backed up by a warden: Kubernetes-like keys under
//! /registry/, a point noted, then keys under one prefix changed, deleted and created and others
//! changed outside it. The diff lists exactly those keys; the undo puts the prefix back as new
//! revisions (checked with etcdctl), keeps every change outside it, re-attaches a living lease,
//! leaves a key written meanwhile alone (a conflict), and a watch opened before sees ordinary
//! events and no error. `--to-time` picks the same point.

#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const START: Duration = Duration::from_secs(60);
const PREFIX: &str = "/registry/secrets/shop/";

/// A Secret as kube-apiserver would store it in JSON (custom resources are stored so; the kind,
/// namespace and name are what `diff` shows).
fn secret(ns: &str, name: &str, data: &str) -> String {
    format!(
        r#"{{"kind":"Secret","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}"}},"data":{{"v":"{data}"}}}}"#
    )
}

fn put(ctl: &std::path::Path, ip: &str, key: &str, value: &str) {
    etcdctl(ctl, ip, &["put", key, value]).unwrap_or_else(|e| panic!("put {key}: {e}"));
}

/// The value of `key` (`None`: absent) and its lease, from etcdctl.
fn get(ctl: &std::path::Path, ip: &str, key: &str) -> (Option<String>, i64) {
    let out = etcdctl(ctl, ip, &["get", key, "-w", "json"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    match v["kvs"].as_array().and_then(|a| a.first()) {
        Some(kv) => {
            use base64::Engine;
            let value = base64::engine::general_purpose::STANDARD
                .decode(kv["value"].as_str().unwrap())
                .unwrap();
            (
                Some(String::from_utf8(value).unwrap()),
                kv["lease"].as_i64().unwrap_or(0),
            )
        }
        None => (None, 0),
    }
}

fn warden(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut c = Command::new(WARDEN);
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

/// `diff --json`: the (action, key) pairs and the whole answer.
fn diff(store: &str, ip: &str, point: &[&str]) -> (Vec<(String, String)>, Value) {
    let client = pki::warden_flags(ip);
    let mut args = vec!["diff", "--store", store, "--prefix", PREFIX, "--json"];
    args.extend(client.iter().map(String::as_str));
    args.extend_from_slice(point);
    let out = warden(&args, &[]).output().unwrap();
    assert!(
        out.status.success(),
        "diff failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pairs = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["action"].as_str().unwrap().to_owned(),
                c["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (pairs, v)
}

#[test]
fn diff_lists_exactly_the_changed_keys_and_undo_puts_the_prefix_back_as_new_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let ip = unique_ip();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let key = |name: &str| format!("{PREFIX}{name}");

    // The state to go back to: half of it in a full snapshot (read from its bbolt file), half in
    // the deltas after it.
    for name in ["a", "b", "c"] {
        put(&ctl, &ip, &key(name), &secret("shop", name, "v0"));
        put(&ctl, &ip, &key(name), &secret("shop", name, "v1"));
    }
    w.signal(nix::sys::signal::Signal::SIGUSR1);
    wait_for("a second full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(2)).then_some(())
    });
    for name in ["d", "same"] {
        put(&ctl, &ip, &key(name), &secret("shop", name, "v1"));
    }
    let lease = etcdctl(&ctl, &ip, &["lease", "grant", "600"]).unwrap();
    let lease_id = lease.split_whitespace().nth(1).unwrap().to_owned();
    etcdctl(
        &ctl,
        &ip,
        &[
            "put",
            &key("leased"),
            &secret("shop", "leased", "v1"),
            "--lease",
            &lease_id,
        ],
    )
    .unwrap();
    put(&ctl, &ip, "/registry/configmaps/shop/x", "x1");
    put(&ctl, &ip, "/registry/secrets/other/z", "z1");
    let point = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {point} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(point)).then_some(())
    });
    // Every delta written from now on is newer than this.
    let at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();

    // The damage under the prefix, and changes outside it that must stay.
    put(&ctl, &ip, &key("a"), &secret("shop", "a", "v2"));
    etcdctl(&ctl, &ip, &["del", &key("b")]).unwrap();
    put(&ctl, &ip, &key("d"), &secret("shop", "d", "v2"));
    put(&ctl, &ip, &key("e"), &secret("shop", "e", "v2"));
    put(&ctl, &ip, &key("same"), &secret("shop", "same", "v1"));
    etcdctl(&ctl, &ip, &["del", &key("leased")]).unwrap();
    put(&ctl, &ip, "/registry/configmaps/shop/x", "x2");
    put(&ctl, &ip, "/registry/secrets/other/new", "n2");

    let expected: Vec<(String, String)> = [
        ("restore", "a"),
        ("re-create", "b"),
        ("restore", "d"),
        ("delete", "e"),
        ("re-create", "leased"),
    ]
    .iter()
    .map(|(a, k)| (a.to_string(), key(k)))
    .collect();
    let (by_rev, v) = diff(&store, &ip, &["--to-revision", &point.to_string()]);
    assert_eq!(by_rev, expected, "{v:#}");
    assert_eq!(v["point"]["revision"], point, "{v:#}");
    assert!(
        !v["point"]["full"]
            .as_str()
            .unwrap()
            .contains("-00000000000000000001-")
            && v["point"]["deltas"].as_u64() >= Some(1),
        "the point is read from the second full and its deltas: {v:#}"
    );
    assert_eq!(
        v["changes"][0]["object"],
        serde_json::json!({"kind": "Secret", "namespace": "shop", "name": "a"}),
        "{v:#}"
    );
    assert_eq!(v["by_prefix"][PREFIX]["restore"], 2, "{v:#}");
    let (by_time, v) = diff(&store, &ip, &["--to-time", &at]);
    assert_eq!(by_time, expected, "--to-time {at}: {v:#}");
    assert_eq!(
        v["point"]["revision"], point,
        "--to-time {at} picked another point: {v:#}"
    );

    // A watch from before the undo, on everything under /registry/.
    let before = etcd_revision(&ctl, &ip);
    let watch_ip = ip.clone();
    let watcher = std::thread::spawn(move || {
        rt().block_on(async move {
            let mut c = pki::connect(&watch_ip, None).await.unwrap();
            let opts = etcd_client::WatchOptions::new()
                .with_prefix()
                .with_start_revision(before + 1);
            let mut stream = c.watch("/registry/", Some(opts)).await.unwrap();
            let mut events = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while events.len() < 5 {
                let msg = tokio::time::timeout_at(deadline, stream.message())
                    .await
                    .expect("the watch saw the undo's events in time")
                    .expect("the watch stream")
                    .expect("a watch message");
                assert!(
                    !msg.canceled() && msg.compact_revision() == 0,
                    "the watch was cancelled: {msg:?}"
                );
                for e in msg.events() {
                    let kv = e.kv().unwrap();
                    events.push((
                        format!("{:?}", e.event_type()),
                        kv.key_str().unwrap().to_owned(),
                        kv.mod_revision(),
                    ));
                }
            }
            events
        })
    });

    // The undo, with a client writing `d` while it pauses between its read and its writes.
    let point_arg = point.to_string();
    let client = pki::warden_flags(&ip);
    let mut undo_args = vec![
        "undo",
        "--store",
        &store,
        "--to-revision",
        &point_arg,
        "--prefix",
        PREFIX,
        "--json",
    ];
    undo_args.extend(client.iter().map(String::as_str));
    let mut undo = warden(
        &undo_args,
        &[
            ("ETCD_WARDEN_FAILPOINT", "undo-before-write"),
            ("ETCD_WARDEN_FAILPOINT_PAUSE", "2"),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = BufReader::new(undo.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("writing back") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "undo ended before writing"
        );
    }
    put(&ctl, &ip, &key("d"), &secret("shop", "d", "meanwhile"));
    let out = undo.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(3), "conflicts exit 3: {report:#}");
    let conflicts = report["outcome"]["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{report:#}");
    assert_eq!(conflicts[0]["key"], key("d"), "{report:#}");
    assert_eq!(report["outcome"]["restored"], 1, "{report:#}");
    assert_eq!(report["outcome"]["recreated"], 2, "{report:#}");
    assert_eq!(report["outcome"]["deleted"], 1, "{report:#}");

    // What etcd holds now: the prefix as it was, the conflict left alone, the rest kept.
    assert_eq!(
        get(&ctl, &ip, &key("a")).0.as_deref(),
        Some(secret("shop", "a", "v1").as_str())
    );
    assert_eq!(
        get(&ctl, &ip, &key("b")).0.as_deref(),
        Some(secret("shop", "b", "v1").as_str())
    );
    assert_eq!(
        get(&ctl, &ip, &key("c")).0.as_deref(),
        Some(secret("shop", "c", "v1").as_str())
    );
    assert_eq!(
        get(&ctl, &ip, &key("d")).0.as_deref(),
        Some(secret("shop", "d", "meanwhile").as_str()),
        "the write made meanwhile was overwritten"
    );
    assert_eq!(get(&ctl, &ip, &key("e")).0, None);
    let (leased, lease) = get(&ctl, &ip, &key("leased"));
    assert_eq!(leased.as_deref(), Some(secret("shop", "leased", "v1").as_str()));
    // etcdctl prints the id with leading zeros (%016x); compared as numbers.
    assert_eq!(
        Ok(lease),
        i64::from_str_radix(&lease_id, 16),
        "the living lease {lease_id} was not re-attached"
    );
    assert_eq!(
        get(&ctl, &ip, "/registry/configmaps/shop/x").0.as_deref(),
        Some("x2")
    );
    assert_eq!(
        get(&ctl, &ip, "/registry/secrets/other/new").0.as_deref(),
        Some("n2")
    );
    let after = etcd_revision(&ctl, &ip);
    assert!(after > before + 1, "revisions moved forward: {before} -> {after}");

    // The watch from before saw the conflict's write and the undo's four as ordinary events.
    let mut events = watcher.join().unwrap();
    events.sort_by_key(|e| e.2);
    let keys: Vec<_> = events.iter().map(|(t, k, _)| format!("{t} {k}")).collect();
    assert_eq!(
        keys,
        vec![
            format!("Put {}", key("d")),
            format!("Put {}", key("a")),
            format!("Put {}", key("b")),
            format!("Delete {}", key("e")),
            format!("Put {}", key("leased")),
        ],
        "{events:?}"
    );

    // Run again: only the conflict differs; nothing else is written.
    let (left, _) = diff(&store, &ip, &["--to-revision", &point.to_string()]);
    assert_eq!(left, vec![("restore".to_owned(), key("d"))]);
}

/// `undo` without a prefix would put every key back: refused with 64 unless --all, nothing written.
#[test]
fn undo_without_a_prefix_is_refused_with_64() {
    let out = warden(
        &[
            "undo",
            "--store",
            "file:///nonexistent",
            "--to-revision",
            "5",
            "--endpoints",
            "http://127.0.0.1:1",
        ],
        &[],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("--prefix") && err.contains("--all"), "{err}");
}

/// etcd-backup-restore's backups (tests/fixtures/gbr, written by etcdbrctl itself): `diff
/// --against-latest` from a past revision lists exactly what etcd's own answers at the two
/// revisions (recorded when the fixture was made) differ by.
#[test]
fn diff_reads_etcd_backup_restore_backups_and_matches_etcds_own_answers() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gbr");
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("expected.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture.join("store/gzip"), dir.path());
    let url = format!("file://{}", dir.path().display());
    let latest = exp["final_revision"].as_i64().unwrap();
    for point in [14, 30, 53] {
        let out = warden(
            &[
                "diff",
                "--store",
                &url,
                "--to-revision",
                &point.to_string(),
                "--prefix",
                "/registry/",
                "--against-latest",
                "--json",
            ],
            &[],
        )
        .output()
        .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["point"]["revision"], point, "{v:#}");
        assert_eq!(v["against"]["revision"], latest, "{v:#}");
        let state = |rev: i64| -> std::collections::BTreeMap<String, (String, i64)> {
            exp["states"][rev.to_string()]
                .as_array()
                .unwrap()
                .iter()
                .filter(|kv| kv["key"].as_str().unwrap().starts_with("/registry/"))
                .map(|kv| {
                    (
                        kv["key"].as_str().unwrap().to_owned(),
                        (
                            kv["value_sha256"].as_str().unwrap().to_owned(),
                            kv["lease"].as_i64().unwrap(),
                        ),
                    )
                })
                .collect()
        };
        let (then, now) = (state(point), state(latest));
        let mut expected = Vec::new();
        for k in then
            .keys()
            .chain(now.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            match (then.get(k), now.get(k)) {
                (Some(_), None) => expected.push(("re-create".to_owned(), k.clone())),
                (None, Some(_)) => expected.push(("delete".to_owned(), k.clone())),
                (Some(a), Some(b)) if a != b => expected.push(("restore".to_owned(), k.clone())),
                _ => {}
            }
        }
        let got: Vec<(String, String)> = v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["action"].as_str().unwrap().to_owned(),
                    c["key"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert!(!expected.is_empty(), "revision {point}: nothing changed since");
        assert_eq!(got, expected, "revision {point}");
    }
}

//! What Kubernetes itself sees of the warden's restores: a real kube-apiserver (1.37.2, built from
//! k8s.io/kubernetes by scripts/deps.sh, `KUBE_APISERVER_BIN`) over etcd 3.7.3 under the warden,
//! asked over HTTPS with a static token (curl), as any client would.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::kube::{Kube, TOKEN, UP, encryption_config};
use common::*;
use nix::sys::signal::Signal;

/// A watch's events include the `ERROR` event with code 410 (Gone): the client must relist.
fn told_gone(events: &[serde_json::Value]) -> bool {
    events
        .iter()
        .any(|e| e["type"] == "ERROR" && e["object"]["code"] == 410)
}

fn rv(v: &serde_json::Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A warden on etcd 3.7.3 with a file store, kube-apiserver over it, namespace `w` holding 250
/// ConfigMaps and 250 Secrets, every one in the store. Returns the largest resourceVersion
/// kube-apiserver handed out and the list's.
fn cluster_with_objects(dir: &Path, extra: &[&str]) -> (Warden, Kube, String, String, u64, u64) {
    let etcd = etcd37();
    let ip = unique_ip();
    let (w, store) = warden_with_file_store(&etcd, &ip, dir, extra);
    let kube = Kube::start(&ip, std::slice::from_ref(&ip));
    kube.json(
        "POST",
        "/api/v1/namespaces",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})),
    );
    let mut max = 0;
    for i in 0..250 {
        let cm = kube.json(
            "POST",
            "/api/v1/namespaces/w/configmaps",
            Some(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm{i:03}")}, "data": {"i": i.to_string()}})),
        );
        let secret = kube.json(
            "POST",
            "/api/v1/namespaces/w/secrets",
            Some(&serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("s{i:03}")}, "stringData": {"i": i.to_string()}})),
        );
        max = max.max(rv(&cm)).max(rv(&secret));
    }
    let list = kube.json("GET", "/api/v1/namespaces/w/configmaps", None);
    let listed = rv(&list);
    let ctl = etcdctl_for(&etcd);
    let rev = etcd_revision(&ctl, &ip);
    // A full now (deltas may be off): the store holds every object.
    w.signal(Signal::SIGUSR1);
    wait_for(&format!("revision {rev} in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    (w, kube, store, ip, max, listed)
}

/// The data dir deleted under a running etcd, etcd SIGKILLed: the warden restores it from the store
/// (a respawn never starts it empty), and kube-apiserver, without a restart of its own, serves
/// every object again; every resourceVersion it hands out afterwards is above every one it handed
/// out before; a watch from a resourceVersion of before is told 410 Gone (the client relists)
/// instead of silently missing events; and its watch cache catches up with the restored etcd.
#[test]
fn kube_apiserver_sees_a_crash_restored_by_the_warden_as_newer_and_relists() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, kube, _store, _ip, max_before, listed) = cluster_with_objects(dir.path(), &[]);
    let pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let fault = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_for("kube-apiserver to serve a restored object", UP, || {
        let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps/cm123", None);
        (code == 200 && body.contains("\"123\"")).then_some(())
    });
    let reads_back = fault.elapsed();
    // The watch cache (a list at resourceVersion 0 is served from it) holds what etcd holds now.
    let fresh = kube.json(
        "POST",
        "/api/v1/namespaces/w/configmaps",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}})),
    );
    let after = rv(&fresh);
    wait_for(
        "kube-apiserver's watch cache to hold the object written after the restore",
        UP,
        || {
            let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps?resourceVersion=0", None);
            (code == 200 && body.contains("\"after\"")).then_some(())
        },
    );
    let cache_current = fault.elapsed();
    eprintln!(
        "kube-apiserver after the crash: reads back {:.2}s, watch cache current {:.2}s after the fault",
        reads_back.as_secs_f64(),
        cache_current.as_secs_f64()
    );
    assert!(
        after > max_before,
        "a resourceVersion handed out after the restore ({after}) is not above the ones before ({max_before})"
    );
    let cms = kube.list_when_ready("/api/v1/namespaces/w/configmaps");
    let secrets = kube.list_when_ready("/api/v1/namespaces/w/secrets");
    assert_eq!(
        cms["items"].as_array().map(Vec::len),
        Some(251),
        "the ConfigMaps listed after the restore"
    );
    assert!(
        secrets["items"].as_array().map_or(0, Vec::len) >= 250,
        "the Secrets listed after the restore: {}",
        secrets["items"].as_array().map_or(0, Vec::len)
    );
    assert!(rv(&cms) > max_before, "the list's resourceVersion went back");
    let events = kube.watch("/api/v1/namespaces/w/configmaps", &listed.to_string(), 3);
    assert!(
        told_gone(&events),
        "a watch from resourceVersion {listed} (before the loss) was not told 410 Gone: {events:?}\n{}",
        kube.log().lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    let status = w.status();
    assert_eq!(
        status["restore"]["startup_restores"]["total"], 1,
        "start-up restores after one crash: {}",
        status["restore"]
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
}

/// The same crash with the bump turned off (`--restore-bump-revision 0`), to show what the default
/// protects against: kube-apiserver hands out resourceVersions it already handed out before the
/// loss (the restored etcd continues from the backed-up revision), and a watch from a
/// resourceVersion of before is not told 410: a client that resumes there misses the restore.
#[test]
fn without_the_bump_kube_apiserver_hands_out_old_resource_versions_again() {
    let dir = tempfile::tempdir().unwrap();
    // Deltas off: what is written after the full is lost with the data dir, as what a delta period
    // had not uploaded yet would be.
    let (mut w, kube, _store, _ip, _, listed) = cluster_with_objects(
        dir.path(),
        &["--restore-bump-revision", "0", "--delta-snapshot-period", "0"],
    );
    let mut max_before = 0;
    for i in 0..100 {
        let cm = kube.json(
            "POST",
            "/api/v1/namespaces/w/configmaps",
            Some(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("late{i:03}")}})),
        );
        max_before = max_before.max(rv(&cm));
    }
    let pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_for("a restore", UP, || {
        (w.status()["restore"]["startup_restores"]["total"].as_u64() >= Some(1)).then_some(())
    });
    w.wait_ready(UP);
    let fresh = wait_for("kube-apiserver to take a write again", UP, || {
        let (code, body) = kube.req(
            "POST",
            "/api/v1/namespaces/w/configmaps",
            Some(
                &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}}),
            ),
        );
        (code == 201).then(|| serde_json::from_str::<serde_json::Value>(&body).unwrap())
    });
    let after = rv(&fresh);
    eprintln!(
        "without the bump: the highest resourceVersion before the loss {max_before}, the first after {after}"
    );
    assert!(
        after <= max_before,
        "without the bump the restored etcd should continue at the backed-up revision ({after} > {max_before})"
    );
    let events = kube.watch("/api/v1/namespaces/w/configmaps", &listed.to_string(), 3);
    assert!(!told_gone(&events), "{events:?}");
    // What a client reading kube-apiserver's cache sees: printed, for docs/kubernetes.md.
    let (_, cached) = kube.req("GET", "/api/v1/namespaces/w/configmaps?resourceVersion=0", None);
    let cached: serde_json::Value = serde_json::from_str(&cached).unwrap_or_default();
    let lost_in_cache = cached["items"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("late"))
                })
                .count()
        })
        .unwrap_or(0);
    eprintln!(
        "without the bump: a watch from {listed} (before the loss) got {} events and no 410; the cached list at resourceVersion 0 still shows {lost_in_cache} of the 100 ConfigMaps the restore lost",
        events.len()
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
}

/// Point in time: every ConfigMap of namespace `w` deleted and the namespace with them; the
/// operator stops the warden and restores the store `--to-time` of a moment before, with the bump;
/// the warden starts on it. kube-apiserver (never restarted) serves the namespace and its objects
/// again, and a watch from a resourceVersion of before is told 410 Gone, so watchers relist.
#[test]
fn a_point_in_time_restore_brings_a_deleted_namespace_back_and_watchers_relist() {
    let etcd = etcd37();
    let dir = tempfile::tempdir().unwrap();
    let (w, kube, store, ip, _, listed) = cluster_with_objects(dir.path(), &[]);
    let before = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    std::thread::sleep(Duration::from_millis(1_500));
    kube.json("DELETE", "/api/v1/namespaces/w/configmaps", None);
    kube.json("DELETE", "/api/v1/namespaces/w", None);
    let (code, _) = kube.req("GET", "/api/v1/namespaces/w/configmaps/cm123", None);
    assert_eq!(code, 404);
    let ctl = etcdctl_for(&etcd);
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("the deletes (revision {rev}) in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let mut w = w;
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
    let data = dir.path().join("data");
    std::fs::rename(&data, dir.path().join("data.before-restore")).unwrap();
    // restore's defaults: the revision raised and marked compacted.
    let out = restore_command_bumped(&store, &data, &etcd, &ip, &[])
        .args(["--to-time", &before])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore --to-time: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fault = Instant::now();
    let (mut w, _) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    wait_for(
        "kube-apiserver to serve the restored namespace's objects",
        UP,
        || {
            let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps/cm123", None);
            (code == 200 && body.contains("\"123\"")).then_some(())
        },
    );
    eprintln!(
        "point in time: kube-apiserver reads the restored objects {:.2}s after the warden started",
        fault.elapsed().as_secs_f64()
    );
    let ns = kube.json("GET", "/api/v1/namespaces/w", None);
    assert_eq!(ns["status"]["phase"], "Active", "{ns}");
    wait_for("the watch cache to list every restored ConfigMap", UP, || {
        let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps?resourceVersion=0", None);
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["items"].as_array()?.len() == 250).then_some(())
    });
    let events = kube.watch("/api/v1/namespaces/w/configmaps", &listed.to_string(), 3);
    assert!(
        told_gone(&events),
        "a watch from resourceVersion {listed} was not told 410 Gone: {events:?}"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
}

/// Undo instead of a restore: every ConfigMap of namespace `w` deleted, a Secret changed after the
/// point. `diff` names the ConfigMaps from kube-apiserver's own protobuf values; `undo --prefix
/// /registry/configmaps/w/` puts them back while kube-apiserver runs: it serves them again, a watch
/// opened before the undo gets 250 ADDED events and no 410, every resourceVersion is newer than any
/// before, and the Secret keeps its change.
#[test]
fn undo_brings_deleted_configmaps_back_under_a_running_kube_apiserver_with_ordinary_watch_events() {
    let etcd = etcd37();
    let dir = tempfile::tempdir().unwrap();
    let (w, kube, store, ip, max_before, _) = cluster_with_objects(dir.path(), &[]);
    let ctl = etcdctl_for(&etcd);
    let point = etcd_revision(&ctl, &ip);
    kube.json("DELETE", "/api/v1/namespaces/w/configmaps", None);
    let mut s = kube.json("GET", "/api/v1/namespaces/w/secrets/s007", None);
    s["stringData"] = serde_json::json!({"i": "changed"});
    kube.json("PUT", "/api/v1/namespaces/w/secrets/s007", Some(&s));
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("the deletes (revision {rev}) in the store"), UP, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    let etcd_client = pki::warden_flags(&ip);
    let args = |cmd: &'static str| {
        let mut c = Command::new(WARDEN);
        c.args([cmd, "--store", &store, "--to-revision", &point.to_string()])
            .args(["--prefix", "/registry/configmaps/w/", "--json"])
            .args(&etcd_client);
        c
    };
    let out = args("diff").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(diff["counts"]["re-create"], 250, "{diff:#}");
    assert_eq!(diff["counts"]["restore"], 0, "{diff:#}");
    assert_eq!(
        diff["changes"][0]["object"],
        serde_json::json!({"kind": "ConfigMap", "namespace": "w", "name": "cm000"}),
        "kube-apiserver's protobuf value decoded"
    );

    let listed = rv(&kube.json("GET", "/api/v1/namespaces/w/configmaps", None));
    let watcher = {
        let kube_url = kube.url.clone();
        std::thread::spawn(move || {
            let out = Command::new("curl")
                .args(["-sk", "--max-time", "30", "-H", &format!("Authorization: Bearer {TOKEN}")])
                .arg(format!(
                    "{kube_url}/api/v1/namespaces/w/configmaps?watch=1&resourceVersion={listed}&timeoutSeconds=20"
                ))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .collect::<Vec<_>>()
        })
    };
    // The watch is open before the undo writes (kube-apiserver answers a watch at once).
    std::thread::sleep(Duration::from_millis(500));
    let out = args("undo").output().unwrap();
    assert!(
        out.status.success(),
        "undo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"]["recreated"], 250, "{report:#}");

    let cm = kube.json("GET", "/api/v1/namespaces/w/configmaps/cm123", None);
    assert_eq!(cm["data"]["i"], "123", "{cm}");
    assert!(
        rv(&cm) > max_before,
        "resourceVersion {} not above {max_before}",
        rv(&cm)
    );
    let s = kube.json("GET", "/api/v1/namespaces/w/secrets/s007", None);
    assert_eq!(
        s["data"]["i"], "Y2hhbmdlZA==",
        "the Secret's change outside the prefix was kept: {s}"
    );
    let events = watcher.join().unwrap();
    assert!(
        !told_gone(&events),
        "a watch from before the undo was told 410: {events:?}"
    );
    let added = events.iter().filter(|e| e["type"] == "ADDED").count();
    assert_eq!(
        added, 250,
        "ADDED events for the re-created ConfigMaps: {events:?}"
    );
    let mut w = w;
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
}

/// Three etcd members under their wardens, kube-apiserver pointed at all three; every member's
/// data lost at once (quorum lost); one `cluster restore` with the bump. kube-apiserver, never
/// restarted, serves every object again, hands out resourceVersions above every earlier one, and
/// tells a watch from before 410 Gone.
#[test]
fn kube_apiserver_recovers_from_a_cluster_restore_without_a_restart() {
    use common::cluster::*;
    let etcd = etcd37();
    let ctl = etcdctl_for(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let mut wardens = start_members(&etcd, dir.path(), &store, &ips, "m", "warden-kube");
    let kube = Kube::start(&unique_ip(), &ips);
    kube.json(
        "POST",
        "/api/v1/namespaces",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})),
    );
    let mut max_before = 0;
    for i in 0..100 {
        let cm = kube.json(
            "POST",
            "/api/v1/namespaces/w/configmaps",
            Some(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm{i:03}")}, "data": {"i": i.to_string()}})),
        );
        max_before = max_before.max(rv(&cm));
    }
    let listed = rv(&kube.json("GET", "/api/v1/namespaces/w/configmaps", None));
    let writer = the_writer(&wardens);
    let rev = etcd_revision(&ctl, &ips[writer]);
    wait_for(&format!("revision {rev} in the store"), UP, || {
        (wardens[writer].as_ref().unwrap().status()["backup"]["backed_up_revision"].as_i64() >= Some(rev))
            .then_some(())
    });
    stop_all(&mut wardens);
    for i in 0..3 {
        std::fs::remove_dir_all(dir.path().join(format!("m{i}"))).unwrap();
    }
    let mut wardens: Vec<Option<Warden>> = (0..3)
        .map(|i| {
            let argv = member_args_token(&etcd, &ips, i, &dir.path().join(format!("m{i}")), "warden-kube");
            Some(Warden::start(
                &ips[i],
                &["--store", &store, "--delta-snapshot-period", "200ms"],
                &argv,
            ))
        })
        .collect();
    for (i, w) in wardens.iter().enumerate() {
        wait_for(&format!("m{i} to say quorum lost"), UP, || {
            let (code, body) = w.as_ref().unwrap().get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(())
        });
    }
    let out = Command::new(WARDEN)
        .args(["cluster", "restore", "--store", &store])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let restored_at = Instant::now();
    wait_for("kube-apiserver to serve a restored object", UP, || {
        let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps/cm042", None);
        (code == 200 && body.contains("\"42\"")).then_some(())
    });
    let reads_back = restored_at.elapsed();
    let fresh = wait_for("kube-apiserver to take a write", UP, || {
        let (code, body) = kube.req(
            "POST",
            "/api/v1/namespaces/w/configmaps",
            Some(
                &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}}),
            ),
        );
        (code == 201).then(|| serde_json::from_str::<serde_json::Value>(&body).unwrap())
    });
    wait_for(
        "kube-apiserver's watch cache to hold the write after the restore",
        UP,
        || {
            let (code, body) = kube.req("GET", "/api/v1/namespaces/w/configmaps?resourceVersion=0", None);
            (code == 200 && body.contains("\"after\"")).then_some(())
        },
    );
    eprintln!(
        "kube-apiserver after cluster restore: reads back {:.2}s, watch cache current {:.2}s after the command",
        reads_back.as_secs_f64(),
        restored_at.elapsed().as_secs_f64()
    );
    assert!(
        rv(&fresh) > max_before,
        "resourceVersion {} after, {max_before} before",
        rv(&fresh)
    );
    let events = kube.watch("/api/v1/namespaces/w/configmaps", &listed.to_string(), 3);
    assert!(
        told_gone(&events),
        "a watch from resourceVersion {listed} was not told 410 Gone: {events:?}"
    );
    stop_all(&mut wardens);
}

/// Secrets encrypted at rest by kube-apiserver with key1, then, after a key rotation, with key2.
/// `run --kube-encryption-config` checks each full it takes: while the warden's copy of the
/// configuration lacks key2, the full after the rotation makes backups unhealthy (never etcd
/// unready), and once the copy holds key2 the next full makes them healthy again. `backups verify
/// --kube-encryption-config` reads every full and names the keys its values need, as counted from
/// etcd's own answer (etcdctl), and fails for a configuration that lost key1.
#[test]
fn the_encryption_keys_each_full_needs_are_checked_by_run_and_by_backups_verify() {
    let etcd = etcd37();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("key1.yaml");
    let rotated = dir.path().join("key2-key1.yaml");
    let lost = dir.path().join("key2.yaml");
    let wardens_copy = dir.path().join("warden-encryption.yaml");
    encryption_config(&one, &["key1"]);
    encryption_config(&rotated, &["key2", "key1"]);
    encryption_config(&lost, &["key2"]);
    std::fs::copy(&one, &wardens_copy).unwrap();
    let (mut w, store) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &["--kube-encryption-config", wardens_copy.to_str().unwrap()],
    );
    // The check of the newest full, once it names that full.
    let checked = |w: &Warden| {
        wait_for("the key check of the newest full", UP, || {
            let s = w.status();
            let full = s["backup"]["last_full"]["key"].as_str()?.to_owned();
            (s["backup"]["kube_keys"]["full"].as_str() == Some(full.as_str())).then(|| s["backup"].clone())
        })
    };
    let metric = |w: &Warden| {
        let (_, text) = w.get("/metrics").unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("etcd_warden_backup_kube_keys_missing "))
            .map(str::to_owned)
    };
    let flag = |p: &Path| vec![format!("--encryption-provider-config={}", p.display())];
    let servers = vec![ip.clone()];
    let full_now = |w: &Warden| {
        let before = w.status()["backup"]["fulls_total"].as_u64().unwrap_or(0);
        w.signal(Signal::SIGUSR1);
        wait_for("a full snapshot", UP, || {
            (w.status()["backup"]["fulls_total"].as_u64() > Some(before)).then_some(())
        });
    };
    let secrets = |kube: &Kube, from: usize| {
        for i in from..from + 20 {
            kube.json(
                "POST",
                "/api/v1/namespaces/w/secrets",
                Some(&serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": format!("s{i:03}")}, "stringData": {"i": i.to_string()}})),
            );
        }
    };
    {
        let kube = Kube::start_with(&unique_ip(), &servers, &flag(&one));
        kube.json(
            "POST",
            "/api/v1/namespaces",
            Some(&serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})),
        );
        secrets(&kube, 0);
    }
    full_now(&w);
    let b = checked(&w);
    assert_eq!(
        b["kube_keys"]["needed"],
        serde_json::json!({"aescbc:key1": 20}),
        "{b}"
    );
    assert_eq!(b["kube_keys"]["missing"], serde_json::json!([]), "{b}");
    assert_eq!(
        b["kube_keys"]["note"],
        serde_json::Value::Null,
        "read from the full's own bytes as they streamed, not from etcd: {b}"
    );
    assert_eq!(b["healthy"], true, "{b}");
    assert_eq!(metric(&w).as_deref(), Some("0.0"));
    {
        let kube = Kube::start_with(&unique_ip(), &servers, &flag(&rotated));
        secrets(&kube, 100);
    }
    // kube-apiserver rotated to key2; the warden's copy still holds key1 only.
    full_now(&w);
    let b = checked(&w);
    assert_eq!(
        b["kube_keys"]["needed"],
        serde_json::json!({"aescbc:key1": 20, "aescbc:key2": 20}),
        "{b}"
    );
    assert_eq!(
        b["kube_keys"]["missing"],
        serde_json::json!(["aescbc:key2"]),
        "{b}"
    );
    assert_eq!(
        b["healthy"], false,
        "a full that cannot be decrypted is a backup problem: {b}"
    );
    assert!(
        b["last_error"].as_str().unwrap_or("").contains("aescbc:key2"),
        "{b}"
    );
    assert_eq!(metric(&w).as_deref(), Some("1.0"));
    assert_eq!(
        w.get("/readyz").map(|(code, _)| code),
        Some(200),
        "a backup problem never makes etcd unready"
    );
    // Deltas keep succeeding; backups stay unhealthy until a full passes.
    let before = w.status()["backup"]["deltas_total"].as_u64().unwrap_or(0);
    etcdctl(&ctl, &ip, &["put", "/unrelated", "x"]).unwrap();
    wait_for("a delta after the failed check", UP, || {
        (w.status()["backup"]["deltas_total"].as_u64() > Some(before)).then_some(())
    });
    assert_eq!(w.status()["backup"]["healthy"], false);
    std::fs::copy(&rotated, &wardens_copy).unwrap();
    full_now(&w);
    let b = checked(&w);
    assert_eq!(b["kube_keys"]["missing"], serde_json::json!([]), "{b}");
    assert_eq!(b["healthy"], true, "{b}");
    assert_eq!(metric(&w).as_deref(), Some("0.0"));
    // What etcd holds, by etcd's own tool.
    let out = etcdctl(
        &ctl,
        &ip,
        &["get", "/registry/secrets/", "--prefix", "-w", "json"],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut truth = std::collections::BTreeMap::<String, u64>::new();
    for kv in v["kvs"].as_array().unwrap() {
        let value = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            kv["value"].as_str().unwrap(),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&value);
        let key = ["key1", "key2"]
            .into_iter()
            .find(|k| text.starts_with(&format!("k8s:enc:aescbc:v1:{k}:")));
        *truth.entry(key.unwrap_or("plain").to_owned()).or_default() += 1;
    }
    assert_eq!(truth.get("key1"), Some(&20), "{truth:?}");
    assert_eq!(truth.get("key2"), Some(&20), "{truth:?}");
    let verify = |config: &Path| {
        let out = Command::new(WARDEN)
            .args(["backups", "verify", "--store", &store, "--kube-encryption-config"])
            .arg(config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = verify(&rotated);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("needs aescbc:key1 (20), aescbc:key2 (20): all in"),
        "{text}"
    );
    assert!(
        text.contains("needs aescbc:key1 (20): all in"),
        "the full before the rotation: {text}"
    );
    let (code, text) = verify(&lost);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("aescbc:key1 not in"), "{text}");
    // With --deep too.
    let out = Command::new(WARDEN)
        .args(["backups", "verify", "--deep", "--store", &store, "--etcd"])
        .arg(&etcd)
        .arg("--kube-encryption-config")
        .arg(&lost)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("aescbc:key1 not in") && text.contains("deep: etcd opened it"),
        "{text}"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(UP);
}

/// The key check reads the full's own revision, page by page past a page's size and past the
/// splits of the keyspace that keep etcd's counting narrow (thousands of keys, numbered and
/// random names, in several prefixes), and, when etcd (kube-apiserver compacts every five
/// minutes) has compacted that revision, the current state instead, saying which revision it read.
#[test]
fn the_key_check_reads_the_fulls_revision_or_the_current_one_after_a_compaction() {
    let etcd = etcd37();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let _e = PlainEtcd::start(&etcd, &ip, &dir.path().join("data"), "k");
    let rt = rt();
    let mut client = rt.block_on(pki::connect(&ip, None)).unwrap();
    // 1 200 values with key1 (more than two pages), a plain one, then 300 of them moved to key2.
    rt.block_on(async {
        for i in 0..1200 {
            let v = format!("k8s:enc:aescbc:v1:key1:{i}");
            client
                .put(format!("/registry/secrets/w/s{i:04}"), v, None)
                .await
                .unwrap();
        }
        client
            .put("/registry/configmaps/w/c", "k8s\0plain", None)
            .await
            .unwrap();
        // 4 000 plain pods and 800 secrets under random names in 20 namespaces, 100 per
        // transaction.
        let mut rng = fastrand::Rng::with_seed(44);
        let mut ops = Vec::new();
        for i in 0..4800 {
            let name: String = (0..12).map(|_| rng.alphanumeric().to_ascii_lowercase()).collect();
            let (key, value) = match i % 6 {
                0 => (
                    format!("/registry/secrets/ns{}/tok-{name}", i % 20),
                    format!("k8s:enc:aescbc:v1:key1:{i}"),
                ),
                _ => (
                    format!("/registry/pods/ns{}/pod-{name}", i % 20),
                    "k8s\0plain".to_owned(),
                ),
            };
            ops.push(etcd_client::TxnOp::put(key, value, None));
            if ops.len() == 100 {
                client
                    .txn(etcd_client::Txn::new().and_then(std::mem::take(&mut ops)))
                    .await
                    .unwrap();
            }
        }
    });
    let full_rev = etcd_revision(&ctl, &ip);
    rt.block_on(async {
        for i in 0..300 {
            let v = format!("k8s:enc:aescbc:v1:key2:{i}");
            client
                .put(format!("/registry/secrets/w/s{i:04}"), v, None)
                .await
                .unwrap();
        }
    });
    let now = etcd_revision(&ctl, &ip);
    let needed_at = |rev| {
        rt.block_on(etcd_warden::kube::encryption::needed_at(&mut client.clone(), rev))
            .unwrap()
    };
    let (at, needed) = needed_at(full_rev);
    assert_eq!(at, full_rev);
    assert_eq!(
        needed.into_iter().collect::<Vec<_>>(),
        [("aescbc:key1".to_owned(), 2000)]
    );
    etcdctl(&ctl, &ip, &["compact", &(now - 1).to_string()]).unwrap();
    let (at, needed) = needed_at(full_rev);
    assert_eq!(at, now, "after the compaction the current revision is read");
    assert_eq!(
        needed.into_iter().collect::<Vec<_>>(),
        [("aescbc:key1".to_owned(), 1700), ("aescbc:key2".to_owned(), 300)]
    );
    // What a full's own bytes say (`kube::needs`, as `run` reads each full while it streams and
    // `backups verify` a downloaded one), against etcd's answer at the same revision: after
    // deletes and a compaction, etcd's file holds free pages with values no key has any more.
    let mut deleter = client.clone();
    rt.block_on(async {
        for i in (300..1200).step_by(3) {
            let deleted = deleter
                .delete(format!("/registry/secrets/w/s{i:04}"), None)
                .await
                .unwrap();
            assert_eq!(deleted.deleted(), 1);
        }
    });
    let now = etcd_revision(&ctl, &ip);
    etcdctl(&ctl, &ip, &["compact", &now.to_string()]).unwrap();
    let saved = dir.path().join("saved.db");
    etcdctl(&ctl, &ip, &["snapshot", "save", saved.to_str().unwrap()]).unwrap();
    let from_file = etcd_warden::kube::needs::needed_in_file(&saved).unwrap();
    let (at, from_etcd) = needed_at(now);
    assert_eq!((from_file.revision, at), (now, now));
    assert_eq!(from_file.needed, from_etcd);
    assert_eq!(
        from_etcd.into_iter().collect::<Vec<_>>(),
        [("aescbc:key1".to_owned(), 1400), ("aescbc:key2".to_owned(), 300)]
    );
}

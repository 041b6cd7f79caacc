//! etcd as operators run it (`common::prod`): TLS for clients and peers with client certificates,
//! etcd auth on, the whole etcd configuration in `ETCD_*` variables. Each test here failed on a
//! warden that only ever met plain http without auth (issue 40).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::prod::Prod;
use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(90);

/// The newest revision any object of the store holds.
fn store_head(store: &str) -> i64 {
    backups_list(store, &[])
        .iter()
        .filter_map(|r| r["last"].as_i64())
        .max()
        .unwrap_or(0)
}

/// One member's production-shaped configuration in a fresh directory: (the directory, the member,
/// its data dir, a file store beside it).
fn one_member() -> (tempfile::TempDir, Prod, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let prod = Prod::new(&unique_ip(), dir.path());
    let data = dir.path().join("data");
    let store = format!("file://{}", dir.path().join("store").display());
    (dir, prod, data, store)
}

fn start(etcd: &Path, prod: &Prod, data: &Path, store: &str, extra: &[&str]) -> Warden {
    start_with_env(etcd, prod, data, store, extra, &[])
}

/// `start`, with more `ETCD_*` variables for etcd.
fn start_with_env(
    etcd: &Path,
    prod: &Prod,
    data: &Path,
    store: &str,
    extra: &[&str],
    more_env: &[(&str, &str)],
) -> Warden {
    let mut opts: Vec<String> = vec!["--store".into(), store.into()];
    opts.extend(prod.warden_opts());
    opts.extend(extra.iter().map(|s| s.to_string()));
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let mut env = prod.etcd_env(data);
    env.extend(more_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Warden::builder(&prod.ip, &opts, &[etcd.display().to_string()])
        .envs(&env)
        .spawn()
}

#[test]
fn auth_on_a_killed_member_restarts_on_its_own_data_with_every_acknowledged_write() {
    killed_member_keeps_its_data(&default_etcd());
}

#[test]
fn etcd_3_7_auth_on_a_killed_member_restarts_on_its_own_data_with_every_acknowledged_write() {
    killed_member_keeps_its_data(&etcd37());
}

/// Finding 1: with etcd auth on, the start-up validation's private etcd could not read the data
/// (etcd 3.6+ refuses `Status` without a user), so a healthy data dir was moved aside as broken
/// and the older backup restored: a write acknowledged after the last delta was lost, and the
/// revision bumped at every restart. Now the private etcd is read with a certificate only the
/// warden has, the data dir stays, and the crash's tail reaches the store.
fn killed_member_keeps_its_data(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (dir, prod, data, store) = one_member();
    // A long delta period: what is written after the last full is only in the data dir when the
    // warden is killed.
    let extra = ["--delta-snapshot-period", "1h"];
    let mut w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    prod.enable_auth(&ctl);
    w.wait_ready(START);
    let before = store_head(&store);
    let acked = rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        let mut rev = 0;
        for n in 0..20 {
            let r = c
                .put(format!("acked/{n:02}"), format!("v{n}"), None)
                .await
                .expect("put acknowledged");
            rev = r.header().unwrap().revision();
        }
        rev
    });
    assert!(
        acked > before,
        "the writes ({acked}) must be newer than the store ({before})"
    );
    let etcd_pid = w.etcd_pid().expect("etcd runs");
    w.signal(Signal::SIGKILL);
    w.wait_exit(START);
    wait_for("etcd to die with its warden", START, || {
        (!alive(etcd_pid)).then_some(())
    });

    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    let log = w.log_text();
    let (value, rev) = rt().block_on(async {
        let mut c = prod
            .client()
            .await
            .expect("connect as root over TLS after the restart (auth off: an older backup was restored)");
        let r = c.get("acked/19", None).await.expect("read");
        let value = r.kvs().first().map(|kv| kv.value_str().unwrap().to_owned());
        (value, r.header().unwrap().revision())
    });
    assert_eq!(
        value.as_deref(),
        Some("v19"),
        "the last acknowledged write is gone after a restart; log:\n{log}"
    );
    assert_eq!(
        rev, acked,
        "etcd's revision moved across a plain restart (a restore's bump?); log:\n{log}"
    );
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("data."))
        .collect();
    assert!(
        aside.is_empty(),
        "a healthy data dir was moved aside: {aside:?}; log:\n{log}"
    );
    // The private etcds' keys do not outlive them.
    let private_left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".private-tls-"))
        .collect();
    assert!(
        private_left.is_empty(),
        "the private etcds' keys are left behind: {private_left:?}"
    );
    // Backups go on with auth: a graceful stop flushes every acknowledged write to the store.
    let mut w = w;
    w.signal(Signal::SIGTERM);
    // etcd re-raises SIGTERM after a clean shutdown, and the warden exits with etcd's status.
    assert_eq!(w.wait_exit(START), 143, "graceful stop; log:\n{}", w.log_text());
    let head = store_head(&store);
    assert!(
        head >= acked,
        "the store ends at {head}, below the acknowledged {acked}"
    );
}

/// Turns etcd auth on and waits for a full snapshot begun after it: users and `auth enable` live
/// outside the key space that deltas carry.
fn enable_auth_and_back_it_up(w: &Warden, prod: &Prod, ctl: &Path) {
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    full_after(w, "auth enable", || prod.enable_auth(ctl));
}

/// Runs `change`, then waits for a full snapshot that began after it.
fn full_after(w: &Warden, what: &str, change: impl FnOnce()) {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    change();
    let changed_at = now();
    wait_for(&format!("a full snapshot taken after {what}"), START, || {
        let last = &w.status()["backup"]["last_full"];
        let began = last["at"].as_f64()? - last["duration_seconds"].as_f64()?;
        (began >= changed_at).then_some(())
    });
}

/// The writer counted no chain break and logged none: a restore's bumped revision starts a new
/// chain, and only a real gap (history compacted before it was backed up) is a break.
fn assert_no_chain_break(w: &Warden) {
    let log = w.log_text();
    assert!(!log.contains("CHAIN BREAK"), "a chain break was reported:\n{log}");
    assert_eq!(
        w.metric("etcd_warden_chain_breaks_total"),
        Some(0.0),
        "etcd_warden_chain_breaks_total"
    );
}

/// Puts `n` keys under `prefix` as root over TLS; returns the last revision.
fn put_keys(prod: &Prod, prefix: &str, n: usize) -> i64 {
    rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        let mut rev = 0;
        for i in 0..n {
            rev = c
                .put(format!("{prefix}/{i:03}"), "v", None)
                .await
                .expect("put acknowledged")
                .header()
                .unwrap()
                .revision();
        }
        rev
    })
}

fn revision_now(prod: &Prod) -> i64 {
    rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        c.get("nothing", None).await.unwrap().header().unwrap().revision()
    })
}

#[test]
fn a_fallback_to_an_older_chain_bumps_past_every_revision_the_store_names() {
    fallback_bumps_past_the_store(&default_etcd());
}

#[test]
fn etcd_3_7_a_fallback_to_an_older_chain_bumps_past_every_revision_the_store_names() {
    fallback_bumps_past_the_store(&etcd37());
}

/// Finding 4: a restore that falls back to an older chain (the newest full corrupt) bumped from
/// that chain's revision, below the revisions the newer chain (itself a bumped restore) had
/// already served: revisions handed out twice. The bump now clears every revision the store names.
fn fallback_bumps_past_the_store(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let prod = Prod::new(&ip, dir.path());
    let data = dir.path().join("data");
    let store_dir = dir.path().join("store");
    let store = format!("file://{}", store_dir.display());
    let extra = ["--delta-snapshot-period", "200ms"];
    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let a = put_keys(&prod, "/a", 5);
    wait_for(&format!("revision {a} in the store"), START, || {
        (store_head(&store) >= a).then_some(())
    });
    kill_node(w, START);
    std::fs::remove_dir_all(&data).unwrap();

    // Chain B: the restore of chain A, bumped, and writes on it.
    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    let restored = revision_now(&prod);
    assert!(
        restored > a + 500_000_000,
        "the first restore was bumped: {restored}"
    );
    let b = put_keys(&prod, "/b", 10);
    wait_for(&format!("revision {b} in the store"), START, || {
        (store_head(&store) >= b).then_some(())
    });
    // Finding 9: a restore starts a new chain; the bump's compaction is no chain break.
    assert_no_chain_break(&w);
    kill_node(w, START);
    let newest_full = backups_list(&store, &[])
        .into_iter()
        .filter(|r| r["kind"] == "full")
        .max_by_key(|r| r["last"].as_i64().unwrap())
        .unwrap();
    assert!(
        newest_full["last"].as_i64().unwrap() >= restored,
        "chain B has its own full: {newest_full}"
    );
    flip_middle_byte(&store_dir.join(newest_full["key"].as_str().unwrap()));
    std::fs::remove_dir_all(&data).unwrap();
    let named = store_head(&store);

    // The restore falls back to chain A; its revision must clear chain B's.
    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    let served = revision_now(&prod);
    let log = w.log_text();
    assert!(
        log.contains("trying an older chain"),
        "the restore did not fall back to chain A:\n{log}"
    );
    assert!(
        served > named,
        "the restored member serves revision {served}, not above {named}, which the store's newer chain names (handed out before); log:\n{log}"
    );
    let value = prod
        .etcdctl(&ctl, true, &["get", "/a/004", "--print-value-only"])
        .unwrap();
    assert_eq!(value.trim(), "v", "chain A's data");
    let c = put_keys(&prod, "/c", 1);
    wait_for(&format!("revision {c} in the store"), START, || {
        (store_head(&store) >= c).then_some(())
    });
    assert_no_chain_break(&w);
    let w = w;
    drop(w);
}

#[test]
fn a_password_change_and_auth_disable_after_the_full_survive_a_restore() {
    auth_changes_survive_a_restore(&default_etcd());
}

#[test]
fn etcd_3_7_a_password_change_and_auth_disable_after_the_full_survive_a_restore() {
    auth_changes_survive_a_restore(&etcd37());
}

/// Finding 2: auth lives outside the keyspace and its password hashes only in a full snapshot. A
/// password change or `auth disable` left the users, roles and (as the warden's client saw it)
/// the auth flag as they were, so no full was taken and a restore brought back the old password
/// and auth on. etcd's auth revision moves on both; the warden takes a full after either.
fn auth_changes_survive_a_restore(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (_dir, prod, data, store) = one_member();
    let extra = ["--delta-snapshot-period", "200ms"];
    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    full_after(&w, "a new user", || {
        rt().block_on(async {
            let mut c = prod.client().await.expect("connect as root over TLS");
            c.role_add("reader").await.unwrap();
            let read_a = etcd_client::Permission::read("a/").with_prefix();
            c.role_grant_permission("reader", read_a).await.unwrap();
            c.user_add("alice", "old-pw", None).await.unwrap();
            c.user_grant_role("alice", "reader").await.unwrap();
            c.put("a/x", "v", None).await.unwrap();
        })
    });
    full_after(&w, "a password change", || {
        rt().block_on(async {
            let mut c = prod.client().await.expect("connect as root over TLS");
            c.user_change_password("alice", "new-pw").await.unwrap();
        })
    });
    full_after(&w, "auth disable", || {
        rt().block_on(async {
            let mut c = prod.client().await.expect("connect as root over TLS");
            c.auth_disable().await.unwrap();
        })
    });
    kill_node(w, START);
    std::fs::remove_dir_all(&data).unwrap();

    let w = start(etcd, &prod, &data, &store, &extra);
    w.wait_ready(START);
    let log = w.log_text();
    let status = prod.etcdctl(&ctl, false, &["auth", "status"]).unwrap();
    assert!(
        status.contains("Authentication Status: false"),
        "auth was disabled before the restore: {status}\nlog:\n{log}"
    );
    prod.etcdctl(&ctl, false, &["auth", "enable"]).unwrap();
    let get = |pw: &str| {
        prod.etcdctl(
            &ctl,
            false,
            &[&format!("--user=alice:{pw}"), "get", "a/x", "--print-value-only"],
        )
    };
    assert_eq!(
        get("new-pw").map(|v| v.trim().to_owned()),
        Ok("v".to_owned()),
        "alice's new password"
    );
    let old = get("old-pw");
    assert!(
        old.as_ref().is_err_and(|e| e.contains("authentication failed")),
        "alice's old password must be refused after the restore: {old:?}"
    );
    drop(w);
}

/// etcd's member list through `prod`'s member: (name, id, learner); `root`: logged in as root
/// (auth on).
fn member_list_as(prod: &Prod, ctl: &Path, root: bool) -> Option<Vec<(String, u64, bool)>> {
    let out = prod.etcdctl(ctl, root, &["member", "list", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v["members"].as_array().map(|ms| {
        ms.iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or("").to_owned(),
                    m["ID"].as_u64().unwrap_or(0),
                    m["isLearner"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    })
}

fn hashkv_as(prod: &Prod, ctl: &Path, rev: i64, root: bool) -> u64 {
    let out = prod
        .etcdctl(
            ctl,
            root,
            &["endpoint", "hashkv", &format!("--rev={rev}"), "-w", "json"],
        )
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["HashKV"]["hash"].as_u64().unwrap()
}

fn status_revision_as(prod: &Prod, ctl: &Path, root: bool) -> Option<i64> {
    let out = prod
        .etcdctl(ctl, root, &["endpoint", "status", "-w", "json"])
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v[0]["Status"]["header"]["revision"].as_i64()
}

#[test]
fn a_tls_cluster_configured_by_env_boots_together_and_a_lost_member_rejoins() {
    tls_cluster_by_env(&default_etcd(), false);
}

#[test]
fn etcd_3_7_a_tls_cluster_configured_by_env_boots_together_and_a_lost_member_rejoins() {
    tls_cluster_by_env(&etcd37(), false);
}

#[test]
fn with_auth_on_a_lost_member_of_a_tls_cluster_rejoins() {
    tls_cluster_by_env(&default_etcd(), true);
}

#[test]
fn etcd_3_7_with_auth_on_a_lost_member_of_a_tls_cluster_rejoins() {
    tls_cluster_by_env(&etcd37(), true);
}

/// docs/cluster.md's three-member cluster, as its env file writes it: https for clients and peers
/// with client certificates, `--cluster-endpoints`, every etcd setting an `ETCD_*` variable
/// (`ETCD_INITIAL_CLUSTER_STATE=new` left in place). Finding 5: the three started together
/// deadlocked at boot (each warden's release check waited on a member that listened but had no
/// quorum). Finding 6: to rejoin a member whose data was lost, the warden added
/// `--initial-cluster-state existing` as a flag, which etcd 3.6 refuses beside the variable, and
/// restarted it in a tight loop. Now the warden changes the variable. `auth`: etcd auth on (the
/// wardens log in as root; the member add, the learner's promotion and the checks need it).
fn tls_cluster_by_env(etcd: &Path, auth: bool) {
    let ctl = etcdctl_for(etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let members = Prod::cluster(&ips, dir.path());
    let store = format!("file://{}", dir.path().join("store").display());
    let data = |i: usize| dir.path().join(format!("m{i}/data"));
    let start_member = |i: usize| cluster_member(etcd, &members, i, &data(i), &store, auth);
    // Started together, as a cluster's hosts boot.
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start_member(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let writer_i = common::cluster::the_writer(&wardens);
    if auth {
        enable_auth_and_back_it_up(wardens[writer_i].as_ref().unwrap(), &members[writer_i], &ctl);
    }
    let victim = (writer_i + 1) % 3;
    let name = format!("m{victim}");
    let old = wait_for("the member list", START, || {
        member_list_as(&members[writer_i], &ctl, auth)?
            .into_iter()
            .find(|m| m.0 == name)
            .map(|m| m.1)
    });
    if auth {
        put_keys(&members[writer_i], "/before", 20);
    } else {
        put_keys_plain(&members[writer_i], &ctl, "/before", 20);
    }

    let w = wardens[victim].as_ref().unwrap();
    let etcd_pid = w.etcd_pid().unwrap();
    std::fs::remove_dir_all(data(victim)).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(etcd_pid), Signal::SIGKILL).unwrap();
    wait_for(
        &format!("{name} to be a promoted voter with a new member id"),
        START,
        || {
            let list = member_list_as(&members[writer_i], &ctl, auth)?;
            let m = list.iter().find(|m| m.0 == name)?;
            (m.1 != old && !m.2 && list.len() == 3).then_some(())
        },
    );
    w.wait_ready(START);
    let restarts = w.status()["etcd"]["restarts"].as_u64().unwrap_or(0);
    assert!(
        restarts <= 3,
        "etcd was restarted {restarts} times for one rejoin; log:\n{}",
        w.log_text()
    );
    let rev = status_revision_as(&members[writer_i], &ctl, auth).unwrap();
    wait_for(&format!("{name} to reach revision {rev}"), START, || {
        (status_revision_as(&members[victim], &ctl, auth)? >= rev).then_some(())
    });
    assert_eq!(
        hashkv_as(&members[victim], &ctl, rev, auth),
        hashkv_as(&members[writer_i], &ctl, rev, auth),
        "the rejoined member's history differs from the leader's at revision {rev}"
    );
    common::cluster::stop_all(&mut wardens);
}

/// Member `i` of `members` under a warden configured wholly by variables (etcd's `ETCD_*`, the
/// warden's `ETCD_WARDEN_*`), TLS everywhere; `auth`: the warden logs in as root.
fn cluster_member(etcd: &Path, members: &[Prod], i: usize, data: &Path, store: &str, auth: bool) -> Warden {
    let endpoints = members
        .iter()
        .map(|m| format!("https://{}:2379", m.ip))
        .collect::<Vec<_>>()
        .join(",");
    let mut env = Prod::member_env(members, i, data, "prod-main");
    let m = &members[i];
    env.extend([
        ("ETCD_WARDEN_STORE".to_owned(), store.to_owned()),
        ("ETCD_WARDEN_CLUSTER_ENDPOINTS".to_owned(), endpoints),
        ("ETCD_WARDEN_DELTA_SNAPSHOT_PERIOD".to_owned(), "200ms".to_owned()),
        (
            "ETCD_WARDEN_ETCD_CERT".to_owned(),
            m.pki.join("healthcheck-client.crt").display().to_string(),
        ),
        (
            "ETCD_WARDEN_ETCD_KEY".to_owned(),
            m.pki.join("healthcheck-client.key").display().to_string(),
        ),
    ]);
    if auth {
        env.extend([
            ("ETCD_WARDEN_ETCD_USER".to_owned(), "root".to_owned()),
            (
                "ETCD_WARDEN_ETCD_PASSWORD_FILE".to_owned(),
                m.password_file.display().to_string(),
            ),
        ]);
    }
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Warden::builder(&m.ip, &[], &[etcd.display().to_string()])
        .envs(&env)
        .spawn()
}

#[test]
fn a_tls_cluster_with_auth_lost_entirely_comes_back_with_one_cluster_restore() {
    quorum_loss_with_auth(&default_etcd());
}

#[test]
fn etcd_3_7_a_tls_cluster_with_auth_lost_entirely_comes_back_with_one_cluster_restore() {
    quorum_loss_with_auth(&etcd37());
}

/// Quorum lost as operators run a cluster (TLS peers and clients, auth on, everything in
/// variables): all three data dirs gone, one `cluster restore` brings the three members back as
/// one cluster with every acknowledged key and the same auth (root logs in with its password, an
/// anonymous client is refused), each member's HashKV equal.
fn quorum_loss_with_auth(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let members = Prod::cluster(&ips, dir.path());
    let store = format!("file://{}", dir.path().join("store").display());
    let data = |i: usize| dir.path().join(format!("m{i}/data"));
    let start_member = |i: usize| cluster_member(etcd, &members, i, &data(i), &store, true);
    let mut wardens: Vec<Option<Warden>> = (0..3).map(|i| Some(start_member(i))).collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    let writer_i = common::cluster::the_writer(&wardens);
    let writer = wardens[writer_i].as_ref().unwrap();
    enable_auth_and_back_it_up(writer, &members[writer_i], &ctl);
    let acked = put_keys(&members[writer_i], "/q", 50);
    wait_for(&format!("revision {acked} in the store"), START, || {
        (store_head(&store) >= acked).then_some(())
    });
    common::cluster::stop_all(&mut wardens);
    for i in 0..3 {
        std::fs::remove_dir_all(data(i)).unwrap();
    }
    let wardens: Vec<Warden> = (0..3).map(start_member).collect();
    for (i, w) in wardens.iter().enumerate() {
        wait_for(&format!("m{i} to say quorum lost"), START, || {
            let (code, body) = w.get("/readyz")?;
            (code == 503 && body.contains("quorum lost")).then_some(())
        });
    }
    let out = std::process::Command::new(WARDEN)
        .args(["cluster", "restore", "--store", &store])
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
    let logs = || {
        wardens
            .iter()
            .map(|w| w.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let revs: Vec<i64> = members
        .iter()
        .map(|m| status_revision_as(m, &ctl, true).expect("status as root"))
        .collect();
    assert!(
        revs.iter().all(|r| *r == revs[0]),
        "members at different revisions: {revs:?}"
    );
    let hashes: Vec<u64> = members.iter().map(|m| hashkv_as(m, &ctl, 0, true)).collect();
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "members hash differently: {hashes:?}"
    );
    for m in &members {
        let keys = m
            .etcdctl(&ctl, true, &["get", "/q/", "--prefix", "--keys-only"])
            .unwrap_or_else(|e| panic!("get as root on {}: {e}\n{}", m.ip, logs()));
        assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 50, "on {}", m.ip);
        let anonymous = m.etcdctl(&ctl, false, &["get", "/q/000"]);
        assert!(anonymous.is_err(), "auth is off after the restore: {anonymous:?}");
    }
    let list = member_list_as(&members[0], &ctl, true).unwrap();
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|m| !m.2), "{list:?}");
}

/// Puts `n` keys through `prod`'s member with its client certificate (no etcd auth).
fn put_keys_plain(prod: &Prod, ctl: &Path, prefix: &str, n: usize) {
    for i in 0..n {
        prod.etcdctl(ctl, false, &["put", &format!("{prefix}/{i:03}"), "v"])
            .unwrap_or_else(|e| panic!("put: {e}"));
    }
}

#[test]
fn restore_waits_for_a_store_that_refuses_connections_at_first() {
    use common::stores::moto_behind_proxy;
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let prod = Prod::new(&ip, dir.path());
    let (_moto, mut proxy, env) = moto_behind_proxy(&ip);
    let store = "s3://backups/etcd/wait";
    let mut opts: Vec<String> = vec!["--store".into(), store.into()];
    opts.extend(prod.warden_opts());
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let mut all_env: Vec<(&str, String)> = env.clone();
    let etcd_env = prod.etcd_env(&dir.path().join("data"));
    all_env.extend(etcd_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let w = Warden::builder(&ip, &opts, &[etcd.display().to_string()])
        .envs(&all_env)
        .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot in S3", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    drop(w);

    // Finding 10: the store refuses connections for the first seconds of an operator's restore.
    proxy.cut();
    let restored = dir.path().join("restored");
    let mut cmd = std::process::Command::new(WARDEN);
    cmd.args([
        "restore",
        "--store",
        store,
        "--bump-revision",
        "0",
        "--name",
        "m1",
    ])
    .arg("--data-dir")
    .arg(&restored)
    .arg("--etcd")
    .arg(&etcd)
    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    dies_with_test(&mut cmd);
    let started = std::time::Instant::now();
    let child = cmd.spawn().unwrap();
    let outage = Duration::from_secs(6);
    std::thread::sleep(outage);
    proxy.restore();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the restore gave up on a store that was down for {outage:?}: {stderr}"
    );
    assert!(started.elapsed() >= outage, "{stderr}");
    assert!(
        stderr.contains("waiting for the store to answer"),
        "the restore did not say what it waited for: {stderr}"
    );
    assert!(restored.join("member/snap/db").is_file(), "{stderr}");
}

#[test]
fn undo_and_a_one_shot_snapshot_work_with_etcd_auth_on() {
    undo_with_auth(&default_etcd());
}

#[test]
fn etcd_3_7_undo_and_a_one_shot_snapshot_work_with_etcd_auth_on() {
    undo_with_auth(&etcd37());
}

/// The one-shot commands that talk to a running etcd (`undo`, `diff`, `snapshot`, `downgrade`)
/// had no way to log in: with etcd auth on, `undo` could not read or write a key. They take
/// `--etcd-user` and `--etcd-password-file` now, as `run` does.
fn undo_with_auth(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (_dir, prod, data, store) = one_member();
    let ip = prod.ip.clone();
    let w = start(etcd, &prod, &data, &store, &["--delta-snapshot-period", "200ms"]);
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let put = |k: &str, v: &str| prod.etcdctl(&ctl, true, &["put", k, v]).unwrap();
    put("/registry/secrets/shop/a", "v1");
    put("/registry/secrets/shop/b", "v1");
    put("/registry/configmaps/shop/x", "x1");
    let point = revision_now(&prod);
    wait_for(&format!("revision {point} in the store"), START, || {
        (store_head(&store) >= point).then_some(())
    });
    put("/registry/secrets/shop/a", "v2");
    prod.etcdctl(&ctl, true, &["del", "/registry/secrets/shop/b"])
        .unwrap();
    put("/registry/configmaps/shop/x", "x2");

    let client_args = |cmd: &str| -> Vec<String> {
        let mut a: Vec<String> = vec![cmd.into(), "--store".into(), store.clone()];
        a.extend([
            "--endpoints".to_owned(),
            format!("https://{ip}:2379"),
            "--etcd-ca".into(),
            prod.pki.join("ca.crt").display().to_string(),
            "--etcd-cert".into(),
            prod.pki.join("healthcheck-client.crt").display().to_string(),
            "--etcd-key".into(),
            prod.pki.join("healthcheck-client.key").display().to_string(),
        ]);
        a
    };
    let with_user = |mut a: Vec<String>| {
        a.extend(prod.warden_opts());
        a
    };
    let point_args = [
        "--prefix".to_owned(),
        "/registry/secrets/shop/".into(),
        "--to-revision".into(),
        point.to_string(),
    ];
    let mut undo = with_user(client_args("undo"));
    undo.extend(point_args.iter().cloned());
    let out = std::process::Command::new(WARDEN).args(&undo).output().unwrap();
    assert!(
        out.status.success(),
        "undo as root: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let get = |k: &str| {
        prod.etcdctl(&ctl, true, &["get", k, "--print-value-only"])
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(get("/registry/secrets/shop/a"), "v1", "a is back");
    assert_eq!(get("/registry/secrets/shop/b"), "v1", "b is back");
    assert_eq!(get("/registry/configmaps/shop/x"), "x2", "outside the prefix");

    // Without the user etcd refuses; the command says so and fails.
    let mut anonymous = client_args("undo");
    anonymous.extend(point_args.iter().cloned());
    let out = std::process::Command::new(WARDEN)
        .args(&anonymous)
        .output()
        .unwrap();
    assert!(!out.status.success(), "undo without credentials succeeded");

    // A one-shot full snapshot as root.
    let fulls = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "full")
        .count();
    let out = std::process::Command::new(WARDEN)
        .args(with_user(client_args("snapshot")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "snapshot as root: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now = backups_list(&store, &[])
        .iter()
        .filter(|r| r["kind"] == "full")
        .count();
    assert_eq!(now, fulls + 1, "one more full in the store");
    drop(w);
}

#[test]
fn a_standby_of_an_auth_cluster_is_promoted_with_its_users_and_leases() {
    standby_with_auth(&default_etcd());
}

#[test]
fn etcd_3_7_a_standby_of_an_auth_cluster_is_promoted_with_its_users_and_leases() {
    standby_with_auth(&etcd37());
}

/// A warm standby of a primary as operators run it (TLS, auth on, `ETCD_*` variables; the
/// standby configured the same way with its own certificates): promoted, it serves every write,
/// logs in with the primary's root password, and holds the lease granted with no key (finding 3:
/// it was missing after a promotion) but not the revoked one.
fn standby_with_auth(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (ip, sip) = (unique_ip(), unique_ip());
    let dir = tempfile::tempdir().unwrap();
    let prod = Prod::new(&ip, &dir.path().join("primary"));
    let sprod = Prod::new(&sip, &dir.path().join("standby"));
    let store = format!("file://{}", dir.path().join("store").display());
    let mut primary = start(
        etcd,
        &prod,
        &dir.path().join("primary/data"),
        &store,
        &["--delta-snapshot-period", "300ms"],
    );
    primary.wait_ready(START);
    enable_auth_and_back_it_up(&primary, &prod, &ctl);
    let (kept, revoked) = rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        let kept = c.lease_grant(3600, None).await.unwrap().id();
        let revoked = c.lease_grant(3600, None).await.unwrap().id();
        c.lease_revoke(revoked).await.unwrap();
        (kept, revoked)
    });
    let last = put_keys(&prod, "/a", 30);
    wait_for("the primary's lease set in the store", START, || {
        (primary.status()["backup"]["leases_checked_revision"].as_i64() >= Some(last)).then_some(())
    });

    let mut sopts: Vec<String> = [
        "--store",
        &store,
        "--standby-poll",
        "300ms",
        "--standby-quiet",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sopts.extend(sprod.warden_opts());
    let sopts: Vec<&str> = sopts.iter().map(String::as_str).collect();
    let senv = sprod.etcd_env(&dir.path().join("standby/data"));
    let senv: Vec<(&str, String)> = senv.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let standby = Warden::standby_builder(&sip, &sopts, &[etcd.display().to_string()])
        .envs(&senv)
        .spawn();
    wait_for("the standby to reach the primary's revision", START, || {
        standby.assert_running();
        let (_, body) = standby.get("/status")?;
        let s: serde_json::Value = serde_json::from_str(&body).ok()?;
        (s["standby"]["revision"].as_i64() >= Some(last)).then_some(())
    });
    primary.signal(Signal::SIGTERM);
    assert_eq!(primary.wait_exit(START), 143);
    wait_for("the store to be quiet for --standby-quiet", START, || {
        let (_, body) = standby.get("/status")?;
        let s: serde_json::Value = serde_json::from_str(&body).ok()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        s["standby"]["store_head_at"]
            .as_f64()
            .is_some_and(|at| now - at > 1.2)
            .then_some(())
    });
    standby.signal(Signal::SIGUSR2);
    standby.wait_ready(START);
    let log = standby.log_text();
    let keys = sprod
        .etcdctl(&ctl, true, &["get", "/a/", "--prefix", "--keys-only"])
        .unwrap_or_else(|e| panic!("read as root with the primary's password: {e}\nlog:\n{log}"));
    assert_eq!(
        keys.lines().filter(|l| !l.is_empty()).count(),
        30,
        "every key the primary acknowledged"
    );
    let leases = sprod.etcdctl(&ctl, true, &["lease", "list"]).unwrap();
    assert!(
        leases.contains(&format!("{kept:x}")),
        "the lease granted with no key is missing after the promotion: {leases}\nlog:\n{log}"
    );
    assert!(
        !leases.contains(&format!("{revoked:x}")),
        "the revoked lease came back: {leases}"
    );
    drop(standby);
}

#[test]
fn nospace_is_repaired_with_auth_on_and_the_quota_set_by_variable() {
    nospace_with_auth(&default_etcd());
}

#[test]
fn etcd_3_7_nospace_is_repaired_with_auth_on_and_the_quota_set_by_variable() {
    nospace_with_auth(&etcd37());
}

/// The space keeper on etcd as operators run it: the quota in `ETCD_QUOTA_BACKEND_BYTES`, auth
/// on. NOSPACE from history is repaired (compaction, defragmentation and disarm need the root
/// role: the warden's user), writes go through again, no chain break, and the store holds every
/// write acknowledged before.
fn nospace_with_auth(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (_dir, prod, data, store) = one_member();
    let w = start_with_env(
        etcd,
        &prod,
        &data,
        &store,
        &["--delta-snapshot-period", "200ms"],
        &[("ETCD_QUOTA_BACKEND_BYTES", "33554432")],
    );
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let acked = rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        let big = "x".repeat(100 << 10);
        let mut acked = Vec::new();
        for i in 0..2000 {
            let nospace = |e: &etcd_client::Error| e.to_string().contains("database space exceeded");
            match c.put(format!("big-{}", i % 4), big.as_str(), None).await {
                Ok(_) => {}
                Err(e) if nospace(&e) => return acked,
                Err(e) => panic!("put big-{i}: {e}"),
            }
            let small = format!("acked-{i:05}");
            match c.put(small.as_str(), "v", None).await {
                Ok(_) => acked.push(small),
                Err(e) if nospace(&e) => return acked,
                Err(e) => panic!("put {small}: {e}"),
            }
        }
        panic!("2000 writes of 100 KiB and no NOSPACE under a 32 MiB quota set by ETCD_QUOTA_BACKEND_BYTES")
    });
    assert!(acked.len() > 50, "only {} writes before NOSPACE", acked.len());
    wait_for("a write to go through after NOSPACE", START, || {
        prod.etcdctl(&ctl, true, &["put", "after-nospace", "v"]).ok()
    });
    let alarms = prod.etcdctl(&ctl, true, &["alarm", "list"]).unwrap();
    assert!(alarms.trim().is_empty(), "alarms left: {alarms}");
    let status = w.status();
    assert_eq!(status["space"]["repairs_total"], 1, "{status}");
    assert_no_chain_break(&w);
    let newest = revision_now(&prod);
    wait_for(&format!("revision {newest} in the store"), START, || {
        (store_head(&store) >= newest).then_some(())
    });
    kill_node(w, START);
    std::fs::remove_dir_all(&data).unwrap();
    let w = start_with_env(
        etcd,
        &prod,
        &data,
        &store,
        &[],
        &[("ETCD_QUOTA_BACKEND_BYTES", "33554432")],
    );
    w.wait_ready(START);
    let found = prod
        .etcdctl(&ctl, true, &["get", "acked-", "--prefix", "--keys-only"])
        .unwrap();
    let found: std::collections::BTreeSet<&str> = found.lines().filter(|l| !l.is_empty()).collect();
    let lost: Vec<&String> = acked.iter().filter(|k| !found.contains(k.as_str())).collect();
    assert!(
        lost.is_empty(),
        "acknowledged writes lost after the repair and a restore: {lost:?}"
    );
    drop(w);
}

/// An upgrade as operators run it (auth on, TLS, `ETCD_*` variables): 3.6.16 killed right after
/// acknowledging writes, then 3.7.3 started on the data with `--previous-etcd`. The rollback point
/// is taken by a private 3.6.16 on auth-protected data (on the old main it could not log in) and
/// holds every acknowledged write; `restore --etcd-version 3.6` brings them back under 3.6.16,
/// with the root password still working.
#[test]
fn an_upgrade_with_auth_on_takes_a_complete_rollback_point_after_a_crash() {
    let (etcd36, etcd37) = (default_etcd(), etcd37());
    let ctl = etcdctl_for(&etcd37);
    let (dir, prod, data, store) = one_member();
    let extra = ["--delta-snapshot-period", "200ms"];
    let w = start(&etcd36, &prod, &data, &store, &extra);
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let acked = put_keys(&prod, "/crash", 30);
    kill_node(w, START);

    let previous = etcd36.display().to_string();
    let w = start(
        &etcd37,
        &prod,
        &data,
        &store,
        &["--previous-etcd", &previous, "--delta-snapshot-period", "200ms"],
    );
    w.wait_ready(START);
    let log = w.log_text();
    assert!(
        log.contains("through a private etcd of the previous release"),
        "{log}"
    );
    let points: Vec<serde_json::Value> = backups_list(&store, &[])
        .into_iter()
        .filter(|r| r["kind"] == "rollback")
        .collect();
    assert_eq!(points.len(), 1, "{points:#?}\nlog:\n{log}");
    assert_eq!(points[0]["rollback_for"], "3.7.3", "{points:#?}");
    assert!(
        points[0]["last"].as_i64() >= Some(acked),
        "the rollback point ends before the last acknowledged write ({acked}): {points:#?}"
    );
    let keys = prod
        .etcdctl(&ctl, true, &["get", "/crash/", "--prefix", "--keys-only"])
        .unwrap();
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 30, "under 3.7.3");
    drop(w);

    let back = dir.path().join("back-to-3.6");
    let ip2 = unique_ip();
    let out = restore_command_bumped(&store, &back, &etcd36, &ip2, &[])
        .args(["--etcd-version", "3.6"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let root = format!("--user=root:{}", common::prod::ROOT_PASSWORD);
    let _plain = PlainEtcd::start_as(&etcd36, &ip2, &back, "m1", &[&root]);
    let keys = etcdctl(
        &etcdctl_for(&etcd36),
        &ip2,
        &[&root, "get", "/crash/", "--prefix", "--keys-only"],
    )
    .unwrap();
    assert_eq!(
        keys.lines().filter(|l| !l.is_empty()).count(),
        30,
        "acknowledged writes missing from the rollback point: {keys}"
    );
}

/// A lease granted, used by a put and revoked between two listings of etcd's leases that both
/// saw the same set (here: none): the delta held the lease's record (the put) and no set after
/// it, so a restore past the revocation brought the lease back (the oracle's seed 18, 1 run in
/// 300). The listing after a lease record is recorded whatever it holds.
#[test]
fn a_lease_granted_used_and_revoked_within_one_period_stays_revoked_in_a_restore() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (dir, prod, data, store) = one_member();
    let w = start(&etcd, &prod, &data, &store, &["--delta-snapshot-period", "2s"]);
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let first = put_keys(&prod, "/a", 1);
    wait_for(&format!("a lease check at revision {first}"), START, || {
        (w.status()["backup"]["leases_checked_revision"].as_i64() >= Some(first)).then_some(())
    });
    let (lease, end) = rt().block_on(async {
        let mut c = prod.client().await.expect("connect over TLS");
        let id = c.lease_grant(3600, None).await.unwrap().id();
        c.put(
            "/leased",
            "v",
            Some(etcd_client::PutOptions::new().with_lease(id)),
        )
        .await
        .unwrap();
        c.lease_revoke(id).await.unwrap();
        let end = c
            .put("/end", "v", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        (id, end)
    });
    wait_for(&format!("a lease check at revision {end}"), START, || {
        (w.status()["backup"]["leases_checked_revision"].as_i64() >= Some(end)).then_some(())
    });
    wait_for(&format!("revision {end} in the store"), START, || {
        (store_head(&store) >= end).then_some(())
    });
    drop(w);
    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let out = restore_command_bumped(&store, &restored, &etcd, &ip2, &[])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = format!("--user=root:{}", common::prod::ROOT_PASSWORD);
    let _plain = PlainEtcd::start_as(&etcd, &ip2, &restored, "m1", &[&root]);
    let leases = etcdctl(&ctl, &ip2, &[&root, "lease", "list"]).unwrap();
    assert!(
        !leases.contains(&format!("{lease:x}")),
        "the revoked lease came back: {leases}"
    );
}

#[test]
fn with_auth_on_the_encryption_key_check_reads_each_full_as_it_streams() {
    key_check_with_auth(&default_etcd());
}

#[test]
fn etcd_3_7_with_auth_on_the_encryption_key_check_reads_each_full_as_it_streams() {
    key_check_with_auth(&etcd37());
}

/// `--kube-encryption-config` on a member configured by `ETCD_*` variables, TLS with client
/// certificates, etcd auth on: the check of each full reads that full's own bytes as they stream
/// (no `note`, so etcd was not asked), its counts equal what etcdctl reads from etcd at that
/// revision, a key the warden's copy lacks makes backups unhealthy and never etcd unready, and
/// `backups verify` says the same of the stored full.
fn key_check_with_auth(etcd: &Path) {
    let ctl = etcdctl_for(etcd);
    let (dir, prod, data, store) = one_member();
    let wardens_copy = dir.path().join("encryption.yaml");
    let both = dir.path().join("key2-key1.yaml");
    common::kube::encryption_config(&wardens_copy, &["key1"]);
    common::kube::encryption_config(&both, &["key2", "key1"]);
    let w = start(
        etcd,
        &prod,
        &data,
        &store,
        &[
            "--delta-snapshot-period",
            "200ms",
            "--kube-encryption-config",
            wardens_copy.to_str().unwrap(),
        ],
    );
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    // 300 secrets under key1, 120 of them rewritten under key2, 40 of those deleted, plain
    // configmaps beside them: what a full needs is each key's newest value only.
    let written = rt().block_on(async {
        let mut c = prod.client().await.expect("connect as root over TLS");
        for i in 0..300 {
            let value = format!("k8s:enc:aescbc:v1:key1:{i}");
            c.put(format!("/registry/secrets/shop/s{i:03}"), value, None)
                .await
                .expect("put acknowledged");
            c.put(format!("/registry/configmaps/shop/c{i:03}"), "k8s\0plain", None)
                .await
                .expect("put acknowledged");
        }
        for i in 0..120 {
            let value = format!("k8s:enc:aescbc:v1:key2:{i}");
            c.put(format!("/registry/secrets/shop/s{i:03}"), value, None)
                .await
                .expect("put acknowledged");
        }
        let mut last = 0;
        for i in 0..40 {
            last = c
                .delete(format!("/registry/secrets/shop/s{i:03}"), None)
                .await
                .expect("delete acknowledged")
                .header()
                .unwrap()
                .revision();
        }
        last
    });
    w.signal(Signal::SIGUSR1);
    // The check of a full that holds every write above (a full begun during them holds less).
    let b = wait_for("the key check of a full after the writes", START, || {
        let s = w.status();
        let full = s["backup"]["last_full"]["key"].as_str()?.to_owned();
        let keys = &s["backup"]["kube_keys"];
        (keys["full"].as_str() == Some(full.as_str()) && keys["checked_revision"].as_i64() >= Some(written))
            .then(|| s["backup"].clone())
    });
    // What etcd holds, by etcd's own tool as root, at the revision the check read.
    let revision = b["kube_keys"]["checked_revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no checked revision: {b}"));
    let out = prod
        .etcdctl(
            &ctl,
            true,
            &["get", "/", "--prefix", "-w", "json", &format!("--rev={revision}")],
        )
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut truth = serde_json::Map::new();
    for kv in v["kvs"].as_array().unwrap() {
        let value = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            kv["value"].as_str().unwrap(),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&value);
        if let Some(rest) = text.strip_prefix("k8s:enc:aescbc:v1:") {
            let name = format!("aescbc:{}", rest.split(':').next().unwrap());
            let n = truth.get(&name).and_then(|n| n.as_u64()).unwrap_or(0);
            truth.insert(name, (n + 1).into());
        }
    }
    assert_eq!(
        serde_json::Value::Object(truth.clone()),
        serde_json::json!({"aescbc:key1": 180, "aescbc:key2": 80}),
        "etcdctl's count at revision {revision}"
    );
    assert_eq!(b["kube_keys"]["needed"], serde_json::Value::Object(truth), "{b}");
    assert_eq!(
        b["kube_keys"]["note"],
        serde_json::Value::Null,
        "read from the full's own bytes as they streamed, not from etcd: {b}"
    );
    assert_eq!(
        b["kube_keys"]["missing"],
        serde_json::json!(["aescbc:key2"]),
        "{b}"
    );
    assert_eq!(b["healthy"], false, "{b}");
    assert_eq!(
        w.get("/readyz").map(|(code, _)| code),
        Some(200),
        "a backup problem never makes etcd unready"
    );
    let out = std::process::Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store, "--kube-encryption-config"])
        .arg(&both)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("needs aescbc:key1 (180), aescbc:key2 (80): all in"),
        "{text}"
    );
    assert_no_chain_break(&w);
}

/// A restore drill on a member configured by `ETCD_*` variables, TLS with client certificates and
/// etcd auth on: the live HashKV (asked with the warden's credentials, on its own long connection)
/// equals the restored copy's, and the member it asked is named.
#[test]
fn with_auth_on_a_restore_drill_compares_with_the_live_hashkv() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (_dir, prod, data, store) = one_member();
    let w = start(
        &etcd,
        &prod,
        &data,
        &store,
        &[
            "--delta-snapshot-period",
            "200ms",
            "--verify-schedule",
            "*/3 * * * * *",
        ],
    );
    w.wait_ready(START);
    enable_auth_and_back_it_up(&w, &prod, &ctl);
    let written = put_keys(&prod, "/drill", 20);
    let d = wait_for("a drill of the revision written after auth enable", START, || {
        let d = w.status()["backup"]["restore_drill"].clone();
        (d["last_revision"].as_i64() >= Some(written)).then_some(d)
    });
    assert_eq!(d["matches_live"], true, "{d}");
    assert_eq!(d["compared_with"], "m1", "{d}");
    let live = prod
        .etcdctl(
            &ctl,
            true,
            &[
                "endpoint",
                "hashkv",
                &format!("--rev={}", d["last_revision"]),
                "-w",
                "json",
            ],
        )
        .unwrap();
    let live: serde_json::Value = serde_json::from_str(&live).unwrap();
    assert_eq!(
        d["last_hash"], live[0]["HashKV"]["hash"],
        "etcdctl's HashKV as root: {d}"
    );
}

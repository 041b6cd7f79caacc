//! Helpers for tests with several etcd members on loopback, a warden beside each.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;

/// How long a member (etcd and its warden) may take to come up.
pub const START: Duration = Duration::from_secs(60);

/// etcd's command line for member `i` of the cluster on `ips` (bootstrapped with `token`): TLS
/// for clients and peers with client certificates, one CA for every member (see `pki`).
pub fn member_args_token(etcd: &Path, ips: &[String], i: usize, data: &Path, token: &str) -> Vec<String> {
    member_args_as(etcd, ips, i, data, token, true)
}

/// The same on plain http, for a test whose subject depends on etcd's own bootstrap timing,
/// which TLS handshakes change (the rolling upgrade's WAL history).
pub fn member_args_http(etcd: &Path, ips: &[String], i: usize, data: &Path, token: &str) -> Vec<String> {
    member_args_as(etcd, ips, i, data, token, false)
}

fn member_args_as(etcd: &Path, ips: &[String], i: usize, data: &Path, token: &str, tls: bool) -> Vec<String> {
    let scheme = if tls { "https" } else { "http" };
    let cluster = ips
        .iter()
        .enumerate()
        .map(|(j, ip)| format!("m{j}={scheme}://{ip}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let ip = &ips[i];
    let mut args: Vec<String> = vec![
        etcd.display().to_string(),
        "--name".into(),
        format!("m{i}"),
        "--data-dir".into(),
        data.display().to_string(),
        "--listen-client-urls".into(),
        format!("{scheme}://{ip}:2379"),
        "--advertise-client-urls".into(),
        format!("{scheme}://{ip}:2379"),
        "--listen-peer-urls".into(),
        format!("{scheme}://{ip}:2380"),
        "--initial-advertise-peer-urls".into(),
        format!("{scheme}://{ip}:2380"),
        "--initial-cluster".into(),
        cluster,
        "--initial-cluster-token".into(),
        token.into(),
        "--initial-cluster-state".into(),
        "new".into(),
    ];
    if tls {
        let pki = super::pki::make(ip, data.parent().expect("the data dir has a parent"));
        args.extend(super::pki::etcd_flags(ip, &pki));
    }
    args
}

/// A warden (and its etcd) for each member of the cluster on `ips`, all on `store`, each ready.
pub fn start_members(
    etcd: &Path,
    dir: &Path,
    store: &str,
    ips: &[String],
    name: &str,
    token: &str,
) -> Vec<Option<Warden>> {
    start_members_with(etcd, dir, store, ips, name, token, &[])
}

pub fn start_members_with(
    etcd: &Path,
    dir: &Path,
    store: &str,
    ips: &[String],
    name: &str,
    token: &str,
    extra: &[&str],
) -> Vec<Option<Warden>> {
    start_members_as(etcd, dir, store, ips, (name, token), extra, true)
}

/// `start_members` on plain http (see `member_args_http`).
pub fn start_members_http(
    etcd: &Path,
    dir: &Path,
    store: &str,
    ips: &[String],
    name: &str,
    token: &str,
) -> Vec<Option<Warden>> {
    start_members_as(etcd, dir, store, ips, (name, token), &[], false)
}

fn start_members_as(
    etcd: &Path,
    dir: &Path,
    store: &str,
    ips: &[String],
    (name, token): (&str, &str),
    extra: &[&str],
    tls: bool,
) -> Vec<Option<Warden>> {
    let wardens: Vec<Option<Warden>> = (0..ips.len())
        .map(|i| {
            let argv = member_args_as(etcd, ips, i, &dir.join(format!("{name}{i}")), token, tls);
            let schedule = quiet_full_schedule();
            let mut opts = vec![
                "--store",
                store,
                "--delta-snapshot-period",
                "200ms",
                "--full-snapshot-schedule",
                &schedule,
            ];
            opts.extend_from_slice(extra);
            Some(Warden::start(&ips[i], &opts, &argv))
        })
        .collect();
    for w in wardens.iter().flatten() {
        w.wait_ready(START);
    }
    wardens
}

pub fn role(w: &Warden) -> String {
    w.status()["backup"]["role"].as_str().unwrap_or("").to_owned()
}

/// The index of the one warden that says it writes, once exactly one does.
pub fn the_writer(wardens: &[Option<Warden>]) -> usize {
    wait_for("exactly one writer among the wardens", START, || {
        let writers: Vec<usize> = wardens
            .iter()
            .enumerate()
            .filter(|(_, w)| w.as_ref().is_some_and(|w| role(w) == "writer"))
            .map(|(i, _)| i)
            .collect();
        let followers = wardens
            .iter()
            .filter(|w| w.as_ref().is_some_and(|w| role(w) == "follower"))
            .count();
        let alive = wardens.iter().filter(|w| w.is_some()).count();
        (writers.len() == 1 && followers == alive - 1).then(|| writers[0])
    })
}

/// Writes `k…` keys through `ip` (a member that stays up) until told to stop; the acknowledged ones.
pub fn writer(ip: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    paced_writer(ip, stop, Duration::ZERO)
}

/// `writer` with a pause of `every` after each write: fewer keys for etcd's index to walk at each
/// compaction, which costs etcd time in proportion to the keys it holds.
pub fn paced_writer(
    ip: String,
    stop: Arc<AtomicBool>,
    every: Duration,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        rt().block_on(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(2));
            let mut client = None;
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = super::pki::connect(&ip, Some(opts.clone())).await.ok();
                }
                let k = format!("k{n:06}");
                let ok = match client.as_mut() {
                    Some(c) => c.put(k.as_str(), "v", None).await.is_ok(),
                    None => false,
                };
                if ok {
                    acked.push(k);
                    n += 1;
                    if !every.is_zero() {
                        tokio::time::sleep(every).await;
                    }
                } else {
                    // An election is under way: the put was not acknowledged; try the next key.
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            acked
        })
    })
}

/// etcd's member ids by index, from `member list`.
pub fn member_ids(ctl: &Path, ip: &str) -> Vec<(String, u64)> {
    let out = etcdctl(ctl, ip, &["member", "list", "-w", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_owned(), m["ID"].as_u64().unwrap()))
        .collect()
}

/// etcd's HashKV of the member at `ip` at revision `rev`.
pub fn hashkv(ctl: &Path, ip: &str, rev: i64) -> u64 {
    let out = etcdctl(
        ctl,
        ip,
        &["endpoint", "hashkv", &format!("--rev={rev}"), "-w", "json"],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["HashKV"]["hash"].as_u64().unwrap()
}

/// Stops every warden still running, gracefully (SIGTERM), each within `START`.
pub fn stop_all(wardens: &mut [Option<Warden>]) {
    for w in wardens.iter_mut().flatten() {
        w.signal(nix::sys::signal::Signal::SIGTERM);
        w.wait_exit(START);
    }
}

/// A full-snapshot schedule that fires half an hour from now, once an hour: the default (the top of
/// every hour) would add a legitimate new chain to a cluster test that runs across the hour, and
/// those tests count the chains.
pub fn quiet_full_schedule() -> String {
    let minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
        % 60;
    format!("{} * * * *", (minute + 30) % 60)
}

//! Rule 2 against a real etcd and a real DNS server on loopback: ownership lost → 503 and etcd
//! SIGKILLed within one check interval, the public client and peer ports refuse (also while the
//! private etcd waits for a final snapshot retry), a final snapshot holds exactly the acknowledged
//! writes; a store that hangs never delays the kill; a SIGTERM waits for the final snapshot, a
//! second abandons it; never two processes on the data dir (from /proc); DNS timeouts and errors
//! never kill; a host that was never the owner never serves; ownership back → ready with all data.
#![allow(clippy::disallowed_methods)]

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::dns::{Answer, DnsServer};
use common::stores::*;
use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(30);
const OWNER: &str = "_etcd-owner.cluster.test";

fn argv(etcd: &Path, ip: &str, data: &Path) -> Vec<String> {
    let mut v = vec![etcd.display().to_string()];
    v.extend(etcd_args(ip, data));
    v
}

fn owner_opts<'a>(dns: &'a DnsServer, interval: &'a str) -> Vec<&'a str> {
    vec![
        "--owner-name",
        OWNER,
        "--owner-id",
        "host-a",
        "--owner-check-interval",
        interval,
        "--owner-check-timeout",
        "100ms",
        "--owner-check-resolver",
        dns.addr.as_str(),
    ]
}

/// A warden checking ownership at `dns` every `interval`, with a file store in `dir/store` and
/// etcd's data in `dir/data`; `extra` adds options. The builder (for env) and the store URL.
fn owner_warden(
    etcd: &Path,
    ip: &str,
    dns: &DnsServer,
    interval: &str,
    dir: &Path,
    extra: &[&str],
) -> (WardenBuilder, String) {
    let store = format!("file://{}", dir.join("store").display());
    let mut opts = owner_opts(dns, interval);
    opts.extend(["--store", store.as_str()]);
    opts.extend_from_slice(extra);
    (
        Warden::builder(ip, &opts, &argv(etcd, ip, &dir.join("data"))),
        store,
    )
}

/// The killed leader thread shows as a zombie while etcd's other threads still exit and its
/// sockets close; the warden's reap (`last_kill_seconds`) comes after the last of them.
fn wait_reaped(w: &Warden) {
    wait_for(
        "the warden to reap the killed etcd",
        Duration::from_secs(5),
        || {
            w.status()["ownership"]["fence"]["last_kill_seconds"]
                .as_f64()
                .map(|_| ())
        },
    );
}

fn keys_in_restored(etcd: &Path, store: &str) -> (Vec<String>, String) {
    keys_after_restore(etcd, store, &[], "k")
}

// Not on 3.5.1: etcd 3.5.0-3.5.2 itself can lose the last acknowledged write to a SIGKILL (the
// consistent index persisted ahead of the data, etcd-io/etcd#13766, fixed in 3.5.3); CI saw it here
// once with 3.5.1 (the final snapshot one revision short), as tests/faults.rs did.
#[test]
fn ownership_flip_under_writes_kills_at_once_final_snapshot_holds_every_acknowledged_write() {
    fencing_under_writes(&default_etcd());
}

#[test]
fn etcd_3_7_ownership_flip_under_writes_kills_at_once_final_snapshot_holds_every_acknowledged_write() {
    fencing_under_writes(&etcd37());
}

#[test]
fn etcd_3_4_ownership_flip_under_writes_kills_at_once_final_snapshot_holds_every_acknowledged_write() {
    fencing_under_writes(&etcd34());
}

fn fencing_under_writes(etcd: &Path) {
    let etcd = etcd.to_path_buf();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = owner_warden(
        &etcd,
        &ip,
        &dns,
        "200ms",
        dir.path(),
        &["--delta-snapshot-period", "200ms"],
    );
    let w = w.spawn();
    w.wait_ready(START);
    let s = w.status();
    assert_eq!(s["ownership"]["state"], "owner", "{s}");
    let etcd_pid = w.etcd_pid().expect("etcd runs");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), false);
    wait_for("writes to flow", START, || {
        (etcd_revision(&etcdctl_for(&etcd), &ip) > 200).then_some(())
    });

    let flipped = dns.set_owner(OWNER, "host-b");
    wait_for("etcd to be SIGKILLed", Duration::from_secs(5), || {
        (!alive(etcd_pid)).then_some(())
    });
    let killed_after = flipped.elapsed();
    assert!(
        killed_after < Duration::from_millis(1500),
        "etcd died {killed_after:?} after the flip (interval 200ms)"
    );
    let (code, body) = w.get("/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("owner"), "{body}");
    wait_reaped(&w);
    assert!(
        public_ports_refuse(&ip),
        "the public client port still accepts connections after the reap"
    );
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    assert!(acked.len() > 200, "only {} writes acknowledged", acked.len());

    let s = wait_for("the final snapshot", START, || {
        let s = w.status();
        (s["ownership"]["fence"]["final_snapshots_total"] == 1).then_some(s)
    });
    assert_eq!(s["phase"], "fenced", "{s}");
    assert!(s["ownership"]["fenced_since"].is_number(), "{s}");
    assert_eq!(s["ownership"]["state"], "not-owner", "{s}");
    assert_eq!(s["ownership"]["owner_seen"], "host-b", "{s}");
    assert!(
        s["etcd"]["pid"].is_null(),
        "etcd must stay down while fenced: {s}"
    );
    let final_key = s["ownership"]["fence"]["last_final"]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(final_key.ends_with("-final.ews"), "{final_key}");
    assert!(
        public_ports_refuse(&ip),
        "fenced, but the public client port accepts connections"
    );
    let (_, metrics) = w.get("/metrics").unwrap();
    for line in [
        "etcd_warden_fence_kills_total 1",
        "etcd_warden_final_snapshots_total 1",
        "etcd_warden_fenced 1",
        "etcd_warden_ownership_may_serve 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // The final snapshot holds exactly the writes the client saw acknowledged.
    let (keys, log) = keys_in_restored(&etcd, &store);
    assert_exactly_acked(&acked, &keys, &format!("the final snapshot\n{log}"));
    assert!(
        log.contains(&final_key),
        "the restore did not use the final snapshot {final_key}: {log}"
    );

    // Ownership back: ready again with all data, on the public port.
    dns.set_owner(OWNER, "host-a");
    w.wait_ready(START);
    let s = w.status();
    assert!(s["ownership"]["fenced_since"].is_null(), "{s}");
    // Compared with what the client saw acknowledged, not with the product's own restore.
    assert_exactly_acked(
        &acked,
        &live_keys(&etcd, &ip, "k"),
        "etcd after ownership returned",
    );
}

/// `found` (sorted) is what the writer saw acknowledged (`acked`, in order: k000000, k000001, …):
/// nothing lost, and nothing else but the one write in flight when etcd was killed (applied, its
/// answer lost).
fn assert_exactly_acked(acked: &[String], found: &[String], what: &str) {
    assert_none_lost(acked, found, what);
    let in_flight = format!("k{:06}", acked.len());
    let extra: Vec<_> = found
        .iter()
        .filter(|k| acked.binary_search(k).is_err() && **k != in_flight)
        .collect();
    assert!(
        extra.is_empty(),
        "{what}: {} keys no client write put there, e.g. {:?}",
        extra.len(),
        &extra[..extra.len().min(5)]
    );
}

/// Nothing answers on the public client port nor the public peer port.
fn public_ports_refuse(ip: &str) -> bool {
    [2379, 2380].iter().all(|port| {
        TcpStream::connect_timeout(
            &format!("{ip}:{port}").parse().unwrap(),
            Duration::from_millis(500),
        )
        .is_err()
    })
}

/// The first instant etcd `pid` is seen dead, polled every 2 ms (the measurement itself).
fn seen_dead_after(pid: i32, since: Instant, timeout: Duration) -> Duration {
    while alive(pid) {
        assert!(
            since.elapsed() < timeout,
            "etcd {pid} alive {timeout:?} after the flip"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    since.elapsed()
}

/// The private etcd of the final snapshot: a process of the warden's on `data` whose client
/// listener is not the public one.
fn private_etcd(w: &Warden, ip: &str, data: &Path) -> Option<i32> {
    processes_on(data).into_iter().map(|(pid, _)| pid).find(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        proc_stat(*pid).is_some_and(|(_, ppid)| ppid == w.pid())
            && cmdline.contains("--listen-client-urls")
            && !cmdline.contains(&format!("{ip}:2379"))
    })
}

#[test]
fn hung_store_at_the_flip_never_delays_the_kill_and_the_public_ports_stay_shut_between_retries() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "backups");
    let proxy = Proxy::start(&format!("{ip}:5001"), &moto.addr);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut opts = owner_opts(&dns, "200ms");
    opts.extend(["--store", "s3://backups/etcd", "--delta-snapshot-period", "200ms"]);
    // A request into the black hole gives up after 2 s (3 tries): a final snapshot attempt fails
    // in seconds, and the private etcd then waits for the next one.
    let mut env = s3_env(&format!("http://{ip}:5001"));
    env.push(("AWS_TIMEOUT", "2s".into()));
    let w = Warden::builder(&ip, &opts, &argv(&etcd, &ip, &data))
        .envs(&env)
        .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "before-the-flip", "1"]).unwrap();
    let etcd_pid = w.etcd_pid().unwrap();

    // The store accepts connections and never answers: no error comes back to hurry anything.
    proxy.hang();
    let flipped = dns.set_owner(OWNER, "host-b");
    let killed_after = seen_dead_after(etcd_pid, flipped, Duration::from_secs(5));
    assert!(
        killed_after < Duration::from_millis(200 + 300),
        "etcd SIGKILLed {killed_after:?} after the flip with the store hung (interval 200ms)"
    );
    // From the reap (the killed etcd's other threads close its sockets last) until an attempt has
    // failed and the private etcd waits for the next one, sampled: nothing answers on the public
    // ports.
    wait_reaped(&w);
    let sample = |what: &str| {
        assert!(
            public_ports_refuse(&ip),
            "{what}: the public client or peer port accepts connections"
        );
    };
    let s = wait_for("a failed final snapshot attempt", START, || {
        sample("fenced, final snapshot pending");
        let s = w.status();
        (s["ownership"]["fence"]["final_snapshot_failures_total"].as_u64() >= Some(1)).then_some(s)
    });
    assert_eq!(s["ownership"]["fence"]["final_snapshots_total"], 0, "{s}");
    assert_eq!(w.get("/readyz").unwrap().0, 503);
    let private = private_etcd(&w, &ip, &data).expect("the private etcd is kept up between retries");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        sample("between final snapshot retries");
        assert!(alive(private), "the private etcd went away between retries");
        std::thread::sleep(Duration::from_millis(50));
    }

    proxy.resume();
    let s = wait_for(
        "the final snapshot once the store answers",
        Duration::from_secs(90),
        || {
            sample("fenced, final snapshot retried");
            let s = w.status();
            (s["ownership"]["fence"]["final_snapshots_total"] == 1).then_some(s)
        },
    );
    assert!(s["etcd"]["pid"].is_null(), "{s}");
    wait_for("the private etcd to stop", Duration::from_secs(10), || {
        (!alive(private)).then_some(())
    });
    sample("fenced after the final snapshot");
    let (keys, _) = keys_after_restore(
        &etcd,
        "s3://backups/etcd",
        &s3_env(&format!("http://{ip}:5001")),
        "",
    );
    assert!(keys.iter().any(|k| k == "before-the-flip"), "{keys:?}");
}

#[test]
fn dns_timeouts_and_errors_never_kill_a_confirmed_owner() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let w = owner_warden(&etcd, &ip, &dns, "200ms", dir.path(), &[]).0.spawn();
    w.wait_ready(START);
    let etcd_pid = w.etcd_pid().unwrap();
    for (what, change) in [
        ("timeouts", Answer::Silence),
        ("SERVFAIL", Answer::ServFail),
        ("NXDOMAIN", Answer::Txt(Vec::new())),
        (
            "disagreeing records",
            Answer::Txt(vec!["host-a".into(), "host-b".into()]),
        ),
    ] {
        let before = w.status()["ownership"]["checks_unknown_total"].as_u64().unwrap();
        if what == "NXDOMAIN" {
            dns.remove(OWNER);
        } else {
            dns.set(OWNER, change);
        }
        // Watch readiness on every poll until three "unknown" checks have come and gone.
        wait_for(&format!("three checks answered by {what}"), START, || {
            let (code, body) = w.get("/readyz").unwrap();
            assert_eq!(code, 200, "{what} made a confirmed owner unready: {body}");
            assert!(alive(etcd_pid), "{what} killed etcd");
            let s = w.status();
            (s["ownership"]["checks_unknown_total"].as_u64().unwrap() >= before + 3).then_some(())
        });
        let s = w.status();
        assert_eq!(s["ownership"]["state"], "unknown", "{what}: {s}");
        assert_eq!(s["ownership"]["may_serve"], true, "{what}: {s}");
    }
    let (_, metrics) = w.get("/metrics").unwrap();
    assert!(
        metrics.contains("etcd_warden_ownership_checks_total{result=\"unknown\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("etcd_warden_fence_kills_total 0"), "{metrics}");
    assert!(
        w.log_text().contains("ownership check failed"),
        "unknown answers must be logged"
    );
    dns.set_owner(OWNER, "host-a");
    wait_for("the owner answer again", START, || {
        (w.status()["ownership"]["state"] == "owner").then_some(())
    });
    assert_eq!(w.etcd_pid(), Some(etcd_pid), "etcd was restarted");
}

#[test]
fn never_the_owner_never_serves_and_sighup_rechecks() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-b");
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    // An hour between checks: every check after the first comes from SIGHUP.
    let w = owner_warden(&etcd, &ip, &dns, "1h", dir.path(), &[]).0.spawn();
    wait_for("the first check", START, || {
        let (_, body) = w.get("/status")?;
        let s: serde_json::Value = serde_json::from_str(&body).ok()?;
        (s["ownership"]["checks_not_owner_total"] == 1).then_some(())
    });
    for n in 2..=3 {
        w.signal(Signal::SIGHUP);
        wait_for(&format!("check {n} after SIGHUP"), START, || {
            (w.status()["ownership"]["checks_not_owner_total"] == n).then_some(())
        });
    }
    let s = w.status();
    assert_eq!(s["phase"], "not-owner", "{s}");
    assert!(
        s["etcd"]["pid"].is_null() && s["etcd"]["incarnation"] == 0,
        "etcd was started: {s}"
    );
    assert_eq!(s["ownership"]["fence"]["kills_total"], 0, "{s}");
    let (code, body) = w.get("/readyz").unwrap();
    assert_eq!(code, 503);
    assert!(body.contains("not owner"), "{body}");
    assert!(public_ports_refuse(&ip));
    let objects = walk(&store_dir);
    assert!(
        objects.iter().all(|p| !p.contains("final")),
        "a final snapshot from a host that never served: {objects:?}"
    );

    dns.set_owner(OWNER, "host-a");
    w.signal(Signal::SIGHUP);
    w.wait_ready(START);
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "served", "1"])
        .expect("etcd serves once ownership is confirmed");
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

#[test]
fn stop_while_fenced_exits_cleanly_without_starting_etcd() {
    let etcd = etcd34();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(dir.path());
    let (w, store) = owner_warden(&etcd, &ip, &dns, "200ms", dir.path(), &[]);
    let mut w = w.env("NOTIFY_SOCKET", notify.path.to_str().unwrap()).spawn();
    w.wait_ready(START);
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "k-on-3.4", "1"]).unwrap();
    dns.set_owner(OWNER, "host-b");
    wait_for("the final snapshot on 3.4", START, || {
        (w.status()["ownership"]["fence"]["final_snapshots_total"] == 1).then_some(())
    });
    wait_for("STATUS=fenced on the notify socket", START, || {
        notify.has("STATUS=fenced").then_some(())
    });
    let started = Instant::now();
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_exit(Duration::from_secs(10)), 0, "{}", w.log_text());
    assert!(started.elapsed() < Duration::from_secs(5));
    let (keys, _) = keys_in_restored(&etcd, &store);
    assert_eq!(keys, vec!["k-on-3.4".to_owned()]);
}

type Crowded = Arc<std::sync::Mutex<Vec<Vec<(i32, String)>>>>;

/// Samples /proc for processes on `data` until `stop`: every sample with two or more goes into
/// the returned list as it is seen; the thread returns every pid ever seen on it, and the count.
fn sample_processes_on(
    data: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> (
    Crowded,
    std::thread::JoinHandle<(std::collections::BTreeSet<i32>, u64)>,
) {
    let crowded = Crowded::default();
    let list = crowded.clone();
    let thread = std::thread::spawn(move || {
        let (mut seen, mut samples) = (std::collections::BTreeSet::new(), 0);
        while !stop.load(Ordering::SeqCst) {
            let on = processes_on(&data);
            samples += 1;
            seen.extend(on.iter().map(|(pid, _)| *pid));
            if on.len() > 1 {
                list.lock().unwrap().push(on);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (seen, samples)
    });
    (crowded, thread)
}

fn assert_never_two(crowded: &Crowded) {
    let crowded = crowded.lock().unwrap().clone();
    assert!(
        crowded.is_empty(),
        "{} samples of /proc found two or more processes on the data dir at once, e.g. {:?}",
        crowded.len(),
        &crowded[..crowded.len().min(3)]
    );
}

#[test]
fn flapping_ownership_never_runs_two_etcds_on_the_data_dir_and_loses_nothing() {
    // etcd 3.4 for the same reason as the flip test: repeated SIGKILLs under writes.
    let etcd = etcd34();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let w = owner_warden(
        &etcd,
        &ip,
        &dns,
        "100ms",
        dir.path(),
        &["--delta-snapshot-period", "200ms"],
    )
    .0
    .spawn();
    w.wait_ready(START);
    // From /proc, not from the warden: whatever runs on the data dir (etcd, the private etcd of a
    // final snapshot or of the start-up check, anything holding a file in it).
    let sampling = Arc::new(AtomicBool::new(false));
    let (crowded, sampler) = sample_processes_on(dir.path().join("data"), sampling.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), true);
    // Flip every 150-350 ms for at least 6 s, and on until etcd has been killed twice and a final
    // snapshot has been taken (on a busy machine a restart can outlast several flips, which then
    // find no etcd to kill): kills, final snapshots and restarts overlap.
    let t = Instant::now();
    let mut flips = 0;
    let mut killing_losses = 0;
    let fence = |w: &Warden, what: &str| w.status()["ownership"]["fence"][what].as_u64().unwrap_or(0);
    // A final snapshot taken, or found already final at the data's revision.
    let finals_taken = |w: &Warden| {
        fence(w, "final_snapshots_total") as usize
            + w.log_text()
                .matches("the newest snapshot is already final")
                .count()
    };
    while t.elapsed() < Duration::from_secs(6)
        || fence(&w, "kills_total") < 2
        || fence(&w, "final_snapshots_total") < 1
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "flapping for 60 s did not kill etcd twice and take a final snapshot: {}",
            w.status()
        );
        assert_never_two(&crowded);
        let lose = flips % 2 == 0;
        let (kills, finals) = (fence(&w, "kills_total"), finals_taken(&w));
        dns.set_owner(OWNER, if lose { "host-b" } else { "host-a" });
        flips += 1;
        let until = Instant::now() + Duration::from_millis(150 + 50 * (flips % 5));
        while Instant::now() < until {
            assert_never_two(&crowded);
            std::thread::sleep(Duration::from_millis(20));
        }
        // Every third loss that killed etcd (one that came during a start-up check killed
        // nothing) is held until that etcd's final snapshot is taken, however long the private
        // etcd takes to come up on this machine; the other flips are short, so kills, final
        // snapshots and restarts overlap.
        if lose && fence(&w, "kills_total") > kills {
            killing_losses += 1;
            if killing_losses % 3 == 1 {
                wait_for("the final snapshot of the etcd this loss killed", START, || {
                    assert_never_two(&crowded);
                    (finals_taken(&w) > finals).then_some(())
                });
            }
        }
    }
    dns.set_owner(OWNER, "host-a");
    wait_for("the warden to report ready", Duration::from_secs(60), || {
        assert_never_two(&crowded);
        matches!(w.get("/readyz"), Some((200, _))).then_some(())
    });
    // The writer makes progress again on the settled owner before it stops.
    let rev = etcd_revision(&etcdctl_for(&etcd), &ip);
    wait_for("writes after the flapping", START, || {
        (etcd_revision(&etcdctl_for(&etcd), &ip) > rev + 10).then_some(())
    });
    sampling.store(true, Ordering::SeqCst);
    let (seen, samples) = sampler.join().unwrap();
    assert_never_two(&crowded);
    // The sampler saw the etcds come and go: the first, a private one or a restart, and the last.
    assert!(
        seen.len() >= 3,
        "only {seen:?} ever seen on the data dir in {samples} samples"
    );
    stop.store(true, Ordering::SeqCst);
    let acked = writes.join().unwrap();
    assert_none_lost(
        &acked,
        &live_keys(&etcd, &ip, "k"),
        &format!("after {flips} flips"),
    );
    let log = w.log_text();
    assert!(!log.contains("panic"), "etcd panicked during the flapping");
    // A start-up check after a final snapshot does not start a private etcd on the same files
    // again: interrupted again and again, it would otherwise never get etcd started on a busy
    // machine.
    eprintln!(
        "flips {flips}: {} validations by a private etcd, {} reused the fence's",
        log.matches("validating the data dir with a private etcd").count(),
        log.matches("not validated again").count()
    );
    let s = w.status();
    assert!(
        s["ownership"]["fence"]["kills_total"].as_u64().unwrap() >= 2,
        "{s}"
    );
}

/// A ready warden on moto's `backups/<prefix>` through `proxy`, with a first full and one
/// acknowledged write; then the store hangs and ownership is lost. Returns once the final
/// snapshot is under way and cannot finish: etcd killed, the private etcd up, the store silent.
fn final_snapshot_under_way(
    etcd: &Path,
    proxy: &Proxy,
    prefix: &str,
) -> (Warden, DnsServer, tempfile::TempDir) {
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = format!("s3://backups/{prefix}");
    let mut opts = owner_opts(&dns, "200ms");
    opts.extend(["--store", store.as_str()]);
    let w = Warden::builder(&ip, &opts, &argv(etcd, &ip, &data))
        .envs(&s3_env(&format!("http://{}", proxy.addr)))
        .spawn();
    w.wait_ready(START);
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    etcdctl(&etcdctl_for(etcd), &ip, &["put", "before-the-flip", "1"]).unwrap();
    proxy.hang();
    dns.set_owner(OWNER, "host-b");
    wait_reaped(&w);
    wait_for("the private etcd of the final snapshot", START, || {
        private_etcd(&w, &ip, &data)
    });
    (w, dns, dir)
}

fn finals(keys: &[String], prefix: &str) -> Vec<String> {
    keys.iter()
        .filter(|k| k.starts_with(&format!("{prefix}/")) && k.ends_with("-final.ews"))
        .cloned()
        .collect()
}

#[test]
fn sigterm_during_the_final_snapshot_lets_it_finish_and_a_second_sigterm_abandons_it() {
    let etcd = default_etcd();
    let moto_ip = unique_ip();
    let moto = moto(&moto_ip, 5000);
    create_bucket(&moto.addr, "backups");
    let proxy = Proxy::start(&format!("{moto_ip}:5001"), &moto.addr);

    // One SIGTERM: the warden waits for the final snapshot, however long the store takes.
    let (mut w, _dns, _dir) = final_snapshot_under_way(&etcd, &proxy, "once");
    w.signal(Signal::SIGTERM);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        assert!(
            w.child.try_wait().unwrap().is_none(),
            "the warden exited on one SIGTERM before the final snapshot was in the store"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(finals(&s3_keys(&moto.endpoint, "backups"), "once").is_empty());
    proxy.resume();
    assert_eq!(w.wait_exit(Duration::from_secs(60)), 0, "{}", w.log_text());
    let fins = finals(&s3_keys(&moto.endpoint, "backups"), "once");
    assert_eq!(
        fins.len(),
        1,
        "one final snapshot in the store when the warden exits: {fins:?}"
    );
    let (keys, log) = keys_after_restore(&etcd, "s3://backups/once", &s3_env(&moto.endpoint), "");
    assert!(keys.iter().any(|k| k == "before-the-flip"), "{keys:?}");
    assert!(log.contains(fins[0].trim_start_matches("once/")), "{log}");

    // Two SIGTERMs: the second abandons the final snapshot at once, store or no store.
    let (mut w, _dns, _dir) = final_snapshot_under_way(&etcd, &proxy, "twice");
    w.signal(Signal::SIGTERM);
    wait_for("the first SIGTERM to be taken", START, || {
        w.log_text()
            .contains("finishing the final snapshot first")
            .then_some(())
    });
    w.signal(Signal::SIGTERM);
    let t = Instant::now();
    w.wait_exit(Duration::from_secs(10));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the warden took {:?} to exit after the second SIGTERM",
        t.elapsed()
    );
    // Read from moto itself, the proxy still hung: a request the warden sent before it exited may
    // still sit in the proxy, and what it would do once delivered is not the warden's doing.
    let keys = s3_keys(&moto.endpoint, "backups");
    assert!(
        finals(&keys, "twice").is_empty(),
        "an abandoned final snapshot is in the store: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.starts_with("twice/")),
        "the warden's regular full is missing: {keys:?}"
    );
}

#[test]
fn a_regular_full_at_the_fence_revision_does_not_stand_in_for_the_final_snapshot() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dns = DnsServer::start(&ip);
    dns.set_owner(OWNER, "host-a");
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let w = owner_warden(&etcd, &ip, &dns, "200ms", dir.path(), &[]).0.spawn();
    w.wait_ready(START);
    // The revision etcd reports, and a regular full at exactly that revision in the store.
    let revision = etcd_revision(&etcdctl_for(&etcd), &ip);
    let full = format!("full-{revision:020}-");
    wait_for("a regular full at etcd's revision", START, || {
        walk(&store_dir)
            .iter()
            .any(|p| p.contains(&full) && !p.ends_with("-final.ews"))
            .then_some(())
    });
    dns.set_owner(OWNER, "host-b");
    wait_reaped(&w);
    let fin = wait_for("a final snapshot in the store", START, || {
        walk(&store_dir).into_iter().find(|p| p.ends_with("-final.ews"))
    });
    assert!(
        fin.contains(&full),
        "the final snapshot {fin} is not at etcd's revision {revision}"
    );
}

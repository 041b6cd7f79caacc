//! A warm standby (`etcd-warden standby`) in "another region": it follows the copy store that a
//! primary warden writes with `--copy-to` (moto's S3 server, two buckets), and is promoted after
//! the primary is killed. Checked against the revisions etcd acknowledged to a client and against
//! etcd itself (etcdctl) after the promotion.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::stores::*;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The delta period of the primary and the standby's poll.
const PERIOD: Duration = Duration::from_millis(500);

/// One write etcd acknowledged: when, which key, at which revision.
type Ack = (Instant, String, i64);

/// Writes `k000000`, `k000001`, … to etcd at `ip` every 10 ms until `stop` or the first failure,
/// noting each acknowledgement as it comes.
fn timed_writer(ip: &str, stop: Arc<AtomicBool>, acks: Arc<Mutex<Vec<Ack>>>) -> std::thread::JoinHandle<()> {
    let ip = ip.to_owned();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(2));
            let Ok(mut c) = pki::connect(&ip, Some(opts)).await else {
                return;
            };
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let k = format!("k{n:06}");
                match c.put(k.as_str(), format!("value-{n}"), None).await {
                    Ok(r) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        acks.lock().unwrap().push((Instant::now(), k, rev));
                        n += 1;
                    }
                    Err(_) => return,
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    })
}

/// moto's request log counted by what the warden did: `GET primary delta` (a delta object read
/// from the `primary` bucket), `PUT copy delta`, `LIST copy`, …
fn requests(log: &std::path::Path) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let Some(req) = line.split('"').nth(1) else {
            continue;
        };
        let mut parts = req.split_whitespace();
        let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
            continue;
        };
        let bucket = path
            .trim_start_matches('/')
            .split(['/', '?'])
            .next()
            .unwrap_or("");
        let what = if path.contains("list-type=2") {
            format!("LIST {bucket}")
        } else if path.contains("/v1/delta/") {
            format!("{method} {bucket} delta")
        } else {
            format!("{method} {bucket} other")
        };
        *out.entry(what).or_insert(0) += 1;
    }
    out
}

/// The primary writes to `s3://primary` and copies to `s3://copy`; the standby follows
/// `s3://copy`. Under steady writes the standby's revision is never older than what etcd had
/// acknowledged one delta period + 2 s before, readiness is 503 "standby, N revisions behind" and
/// no etcd listens on its address; a promotion while the primary writes is refused. The primary
/// (warden and etcd) is SIGKILLed; the standby is promoted in under 10 s, holds every write
/// acknowledged more than a period (+1 s for the upload and the copy) before the kill, serves a
/// revision above every one the primary handed out, and backs up to its store.
#[test]
fn a_standby_follows_the_copy_within_a_period_and_is_promoted_in_seconds_after_the_primary_dies() {
    let (ip, sip) = (unique_ip(), unique_ip());
    let pdir = tempfile::tempdir().unwrap();
    let moto_log = pdir.path().join("moto.log");
    let moto = moto_with_log(&ip, 5000, Some(&moto_log));
    create_bucket(&moto.addr, "primary");
    create_bucket(&moto.addr, "copy");
    let creds = pdir.path().join("copy.env");
    std::fs::write(&creds, format!("AWS_ENDPOINT_URL={}\n", moto.endpoint)).unwrap();
    let etcd = default_etcd();
    let ctl_bin = etcdctl_for(&etcd);
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &pdir.path().join("data")));
    let period = format!("{}ms", PERIOD.as_millis());
    let primary = Warden::builder(
        &ip,
        &[
            "--store",
            "s3://primary/etcd",
            "--copy-to",
            "s3://copy/etcd",
            "--copy-credentials",
            creds.to_str().unwrap(),
            "--delta-snapshot-period",
            &period,
        ],
        &argv,
    )
    .envs(&s3_env(&moto.endpoint))
    .spawn();
    primary.wait_ready(Duration::from_secs(30));
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let writer = timed_writer(&ip, stop.clone(), acks.clone());
    wait_for(
        "the copy store to hold the primary's full",
        Duration::from_secs(60),
        || (primary.status()["copies"][0]["objects_copied_total"].as_u64() >= Some(1)).then_some(()),
    );

    let sdir = tempfile::tempdir().unwrap();
    let socket = sdir.path().join("admin.sock");
    let mut sargv = vec![etcd.display().to_string()];
    sargv.extend(etcd_args(&sip, &sdir.path().join("data")));
    let standby = Warden::standby_builder(
        &sip,
        &[
            "--store",
            "s3://copy/etcd",
            "--standby-poll",
            &period,
            "--standby-quiet",
            "3s",
            "--delta-snapshot-period",
            &period,
            "--admin-socket",
            socket.to_str().unwrap(),
        ],
        &sargv,
    )
    .envs(&s3_env(&moto.endpoint))
    .spawn();
    wait_for(
        "the standby to restore and follow",
        Duration::from_secs(60),
        || {
            standby.assert_running();
            let (_, body) = standby.get("/status")?;
            let s: serde_json::Value = serde_json::from_str(&body).ok()?;
            (s["standby"]["state"] == "following").then_some(())
        },
    );

    // Following under steady writes for 10 s.
    let allowed = PERIOD + Duration::from_secs(2);
    let requests_before = requests(&moto_log);
    let (deltas_before, polls_before) = (
        primary.status()["backup"]["deltas_total"].as_u64().unwrap(),
        standby.status()["standby"]["polls_total"].as_u64().unwrap(),
    );
    let started = Instant::now();
    let (mut worst_behind, mut worst_seconds, mut samples) = (0i64, 0.0f64, 0);
    while started.elapsed() < Duration::from_secs(10) {
        let now = Instant::now();
        let s = standby.status();
        let rev = s["standby"]["revision"].as_i64().unwrap();
        let acked = acks.lock().unwrap().clone();
        // The newest revision etcd had acknowledged `allowed` ago must be in the standby.
        if let Some((_, _, due)) = acked
            .iter()
            .rev()
            .find(|(t, _, _)| now.duration_since(*t) >= allowed)
        {
            assert!(
                rev >= *due,
                "the standby is at revision {rev}, older than revision {due} that etcd acknowledged {allowed:?} ago: {:#}",
                s["standby"]
            );
        }
        // How long ago etcd acknowledged the oldest revision the standby does not hold.
        if let Some((t, _, r)) = acked.iter().find(|(_, _, r)| *r > rev) {
            worst_seconds = worst_seconds.max(now.duration_since(*t).as_secs_f64());
            worst_behind = worst_behind.max(acked.last().unwrap().2 - rev);
            let _ = r;
        }
        samples += 1;
        let (code, body) = standby.get("/readyz").unwrap();
        assert_eq!(code, 503, "a standby is never ready: {body}");
        assert!(
            body.starts_with("standby, ") && body.contains("revisions behind"),
            "readiness says it is a standby and how far behind: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(samples >= 20, "polled the standby {samples} times");
    let requests_after = requests(&moto_log);
    let deltas = primary.status()["backup"]["deltas_total"].as_u64().unwrap() - deltas_before;
    let polls = standby.status()["standby"]["polls_total"].as_u64().unwrap() - polls_before;
    let count = |what: &str| requests_after.get(what).unwrap_or(&0) - requests_before.get(what).unwrap_or(&0);
    let (copy_gets, copy_puts) = (count("GET primary delta"), count("PUT copy delta"));
    let (lists, standby_gets) = (count("LIST copy"), count("GET copy delta"));
    eprintln!(
        "requests in 10 s: {deltas} deltas; copying: {copy_gets} GET from the store, {copy_puts} PUT to the copy; the standby: {lists} listings in {polls} polls, {standby_gets} GET of deltas"
    );
    assert!(deltas >= 8, "the primary wrote {deltas} deltas in 10 s");
    assert!(
        copy_gets <= deltas + 1 && copy_puts <= deltas + 1 && copy_puts + 1 >= deltas,
        "copying costs one GET and one PUT per delta: {copy_gets} GET, {copy_puts} PUT for {deltas} deltas"
    );
    assert!(
        lists <= polls * 2 + 3,
        "a standby's poll lists the fulls and its chain's directory: {lists} listings in {polls} polls"
    );
    assert!(
        std::net::TcpStream::connect_timeout(&format!("{sip}:2379").parse().unwrap(), Duration::from_secs(1))
            .is_err(),
        "no etcd listens on the standby's client address before promotion"
    );
    assert!(
        standby.metric("etcd_warden_standby_lag_revisions").is_some(),
        "the standby's lag is in /metrics"
    );
    let listed = standby.metric("etcd_warden_standby_listed_age_seconds").unwrap();
    assert!(
        listed < 3.0,
        "the standby lists its store every poll: {listed} s since"
    );
    let delay = standby.metric("etcd_warden_standby_apply_delay_seconds").unwrap();
    assert!(
        delay < 3.0,
        "a delta reaches the standby within a poll and the copy: {delay} s"
    );
    let rss = standby.metric("etcd_warden_resident_memory_bytes").unwrap_or(0.0) / 1048576.0;
    eprintln!(
        "standby lag under steady writes: worst {worst_seconds:.2} s, {worst_behind} revisions behind ({samples} samples, period {PERIOD:?}); the standby's RSS {rss:.1} MiB"
    );

    // The primary still writes: no promotion.
    let (code, out, err) = ctl(&socket, &["promote"]);
    let out = format!("{out}{err}");
    assert_eq!(code, 1, "promotion refused while the primary writes: {out}");
    assert!(out.contains("still writing"), "{out}");
    assert_eq!(standby.status()["standby"]["state"], "following");
    assert_eq!(standby.get("/readyz").map(|(c, _)| c), Some(503));

    // The primary's host is lost: its warden and its etcd are SIGKILLed.
    let etcd_pid = primary.etcd_pid().expect("the primary's etcd runs");
    let killed_at = Instant::now();
    kill(Pid::from_raw(primary.pid()), Signal::SIGKILL).unwrap();
    kill(Pid::from_raw(etcd_pid), Signal::SIGKILL).unwrap();
    writer.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let acked = acks.lock().unwrap().clone();
    let newest_primary_revision = acked.last().unwrap().2;
    wait_for(
        "the store to be quiet for --standby-quiet",
        Duration::from_secs(30),
        || {
            let at = standby.status()["standby"]["store_head_at"].as_f64()?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            (now - at > 3.2).then_some(())
        },
    );
    let asked = Instant::now();
    let (code, out, err) = ctl(&socket, &["promote"]);
    let out = format!("{out}{err}");
    let took = asked.elapsed();
    assert_eq!(code, 0, "promotion: {out}\n{}", standby.log_text());
    assert!(out.contains("promoted"), "{out}");
    assert!(took < Duration::from_secs(10), "promoted in {took:?}: {out}");
    let s = standby.status();
    let reported = s["standby"]["promotion"]["seconds"].as_f64().unwrap();
    assert!(reported < 10.0, "the reported promotion time: {reported}");
    assert_eq!(
        standby.get("/readyz").map(|(c, _)| c),
        Some(200),
        "ready once promoted"
    );
    assert_eq!(s["phase"], "running");

    // Every write acknowledged more than a period (+1 s for the upload and the copy) before the
    // kill is there, and the revision is above everything the primary handed out.
    let due: Vec<String> = acked
        .iter()
        .filter(|(t, _, _)| killed_at.duration_since(*t) > PERIOD + Duration::from_secs(1))
        .map(|(_, k, _)| k.clone())
        .collect();
    assert!(due.len() > 100, "{} writes were due", due.len());
    let found = live_keys(&etcd, &sip, "k");
    assert_none_lost(&due, &found, "the promoted standby");
    let lost = acked.len()
        - found
            .iter()
            .filter(|k| acked.iter().any(|(_, a, _)| a == *k))
            .count();
    let revision = etcd_revision(&ctl_bin, &sip);
    assert!(
        revision > newest_primary_revision,
        "the promoted standby serves revision {revision}, above the primary's {newest_primary_revision}"
    );
    eprintln!(
        "promotion: {took:?} by ctl, {reported:.2} s reported; revision {revision} (primary's newest {newest_primary_revision}); acknowledged writes missing: {lost} of {} (all within the last {:?} before the kill)",
        acked.len(),
        PERIOD + Duration::from_secs(1)
    );

    // It backs up to its store: a full at its new revision.
    wait_for(
        "the promoted standby's first full",
        Duration::from_secs(60),
        || {
            let b = standby.status()["backup"].clone();
            (b["fulls_total"].as_u64() >= Some(1) && b["backed_up_revision"].as_i64() >= Some(revision))
                .then_some(())
        },
    );
    assert!(
        etcdctl(&ctl_bin, &sip, &["put", "after-promotion", "x"]).is_ok(),
        "the promoted member takes writes"
    );
}

/// The primary loses its data dir and restores itself from the store (a new full at a bumped
/// revision): no delta continues the standby's history, so it rebuilds from the new full and
/// follows on; once the primary is stopped, SIGUSR2 promotes it; a crash right after the bump
/// is finished at the next start. etcd 3.7.3, a file store.
#[test]
fn a_standby_rebuilds_across_a_restore_in_the_primary_and_sigusr2_promotes_it() {
    let (ip, sip) = (unique_ip(), unique_ip());
    let etcd = etcd37();
    let ctl_bin = etcdctl_for(&etcd);
    let root = tempfile::tempdir().unwrap();
    let store = format!("file://{}/store", root.path().display());
    let pdata = root.path().join("primary");
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &pdata));
    let opts = ["--store", store.as_str(), "--delta-snapshot-period", "500ms"];
    let mut primary = Warden::builder(&ip, &opts, &argv).spawn();
    primary.wait_ready(Duration::from_secs(30));
    for i in 0..30 {
        etcdctl(&ctl_bin, &ip, &["put", &format!("a{i:02}"), "x"]).unwrap();
    }
    let before = etcd_revision(&ctl_bin, &ip);

    let sdir = tempfile::tempdir().unwrap();
    let mut sargv = vec![etcd.display().to_string()];
    sargv.extend(etcd_args(&sip, &sdir.path().join("data")));
    let sopts = [
        "--store",
        store.as_str(),
        "--standby-poll",
        "500ms",
        "--standby-quiet",
        "1s",
    ];
    // The first promotion dies right after the bump is written (as a crash would).
    let mut standby = Warden::standby_builder(&sip, &sopts, &sargv)
        .env("ETCD_WARDEN_FAILPOINT", "standby-promote-after-bump")
        .spawn();
    let standing = |what: &str, f: &dyn Fn(&serde_json::Value) -> bool| {
        wait_for(what, Duration::from_secs(60), || {
            standby.assert_running();
            let (_, body) = standby.get("/status")?;
            let s: serde_json::Value = serde_json::from_str(&body).ok()?;
            f(&s["standby"]).then_some(())
        })
    };
    standing("the standby to reach the primary's revision", &|s| {
        s["revision"].as_i64() >= Some(before)
    });

    // The primary's data dir is lost; it restores itself at a bumped revision.
    primary.signal(Signal::SIGTERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), 143);
    std::fs::remove_dir_all(&pdata).unwrap();
    let primary = Warden::builder(&ip, &opts, &argv).spawn();
    primary.wait_ready(Duration::from_secs(60));
    for i in 0..20 {
        etcdctl(&ctl_bin, &ip, &["put", &format!("b{i:02}"), "x"]).unwrap();
    }
    let after = etcd_revision(&ctl_bin, &ip);
    assert!(
        after > 1_000_000_000,
        "the primary restored with the bump: {after}"
    );
    standing("the standby to rebuild past the primary's restore", &|s| {
        s["revision"].as_i64() >= Some(after) && s["rebuilds_total"].as_u64() >= Some(1)
    });

    // The primary stops; once the store is quiet, SIGUSR2 promotes the standby.
    let mut primary = primary;
    primary.signal(Signal::SIGTERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), 143);
    standing("the store to be quiet for --standby-quiet", &|s| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        s["store_head_at"].as_f64().is_some_and(|at| now - at > 1.2)
    });
    standby.signal(Signal::SIGUSR2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while standby.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the standby did not die at the failpoint: {}",
            standby.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = standby.log_text();
    assert!(
        first.contains("SIGUSR2: promotion requested") && first.contains("failpoint reached"),
        "{first}"
    );
    // Started again, it finishes the promotion (without a second bump) and starts etcd.
    let standby = Warden::standby_builder(&sip, &sopts, &sargv).spawn();
    standby.wait_ready(Duration::from_secs(30));
    assert!(
        standby
            .log_text()
            .contains("a promotion was interrupted; finishing it"),
        "{}",
        standby.log_text()
    );
    let mut keys = live_keys(&etcd, &sip, "a");
    keys.extend(live_keys(&etcd, &sip, "b"));
    assert_eq!(keys.len(), 50, "every key the primary acknowledged: {keys:?}");
    let revision = etcd_revision(&ctl_bin, &sip);
    assert!(
        revision > after && revision < after + 2_000_000_000,
        "promoted at {revision}: above the primary's {after}, bumped once"
    );
}

//! Copies in a second store (`run --copy-to`) and immutable backups (S3 Object Lock), against real
//! etcd and moto's S3 server: what the copy holds is listed with boto3 and restored with the
//! warden's own restore, checked against the writes etcd acknowledged.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use common::stores::*;
use common::*;
use nix::sys::signal::Signal;

/// The backup objects (`*.ews`) in `bucket`, sorted.
fn ews_keys(endpoint: &str, bucket: &str) -> Vec<String> {
    let mut keys: Vec<String> = s3_keys(endpoint, bucket)
        .into_iter()
        .filter(|k| k.ends_with(".ews"))
        .collect();
    keys.sort();
    keys
}

fn copy_status(w: &Warden) -> serde_json::Value {
    w.status()["copies"][0].clone()
}

/// A warden writing to `s3://primary/etcd` on moto, copying to `copy_url` with `copy_env` as the
/// copy's credentials file; delta period 500 ms. The directory holds its data dir and that file.
fn warden_with_copy(
    ip: &str,
    moto: &Emulator,
    copy_url: &str,
    copy_env: &str,
    extra: &[&str],
) -> (Warden, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("copy.env");
    std::fs::write(&creds, copy_env).unwrap();
    let etcd = default_etcd();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(ip, &dir.path().join("data")));
    let mut opts = vec![
        "--store",
        "s3://primary/etcd",
        "--copy-to",
        copy_url,
        "--copy-credentials",
        creds.to_str().unwrap(),
        "--delta-snapshot-period",
        "500ms",
    ];
    opts.extend_from_slice(extra);
    let w = Warden::builder(ip, &opts, &argv)
        .envs(&s3_env(&moto.endpoint))
        .spawn();
    w.wait_ready(Duration::from_secs(30));
    (w, dir)
}

/// The copy holds every backup object of the store; while the copy's store hangs (a black hole:
/// connections accepted, nothing answered) the store's deltas keep their pace, backups stay
/// healthy and readiness stays 200, while the copy's lag grows; once it answers again the copy
/// catches up, and a restore from the copy alone holds every write etcd acknowledged.
#[test]
fn the_copy_store_gets_every_object_and_a_dead_copy_never_holds_the_store_back() {
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "primary");
    create_bucket(&moto.addr, "copy");
    let proxy = Proxy::start(&format!("{ip}:5002"), &moto.addr);
    let (mut w, _dir) = warden_with_copy(
        &ip,
        &moto,
        "s3://copy/etcd",
        &format!("AWS_ENDPOINT_URL=http://{ip}:5002\n"),
        // The store keeps one chain, the copy all: what the store's retention would delete
        // during the outage must stay until the copy has it.
        &["--retention", "last:1", "--copy-retention", "last:100"],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writes = acked_writer(&ip, stop.clone(), false);
    wait_for("the copy to hold a delta", Duration::from_secs(60), || {
        let c = copy_status(&w);
        (c["objects_copied_total"].as_u64() >= Some(3) && c["lag_revisions"] == 0).then_some(())
    });
    assert_eq!(copy_status(&w)["healthy"], true);

    // The copy's store hangs for 8 s.
    proxy.hang();
    let before = w.status()["backup"].clone();
    let started = std::time::Instant::now();
    let mut worst_lag = 0.0f64;
    let mut fulls_asked = 0;
    while started.elapsed() < Duration::from_secs(8) {
        // Two new fulls during the outage: the store's retention runs after each.
        if started.elapsed() > Duration::from_secs(2 + 3 * fulls_asked) && fulls_asked < 2 {
            w.signal(Signal::SIGUSR1);
            fulls_asked += 1;
        }
        assert_eq!(
            w.get("/readyz").map(|(c, _)| c),
            Some(200),
            "readiness during the copy's outage"
        );
        let b = w.status()["backup"].clone();
        assert_eq!(
            b["healthy"], true,
            "the store's backups during the copy's outage: {b:#}"
        );
        worst_lag = worst_lag.max(copy_status(&w)["lag_seconds"].as_f64().unwrap_or(0.0));
        std::thread::sleep(Duration::from_millis(250));
    }
    let during = w.status()["backup"].clone();
    let deltas = during["deltas_total"].as_u64().unwrap() - before["deltas_total"].as_u64().unwrap();
    // 8 s at a 500 ms period is 16 deltas; a busy machine may merge a few.
    assert!(
        deltas >= 10,
        "the store's deltas kept their pace while the copy hung: {deltas} in 8 s"
    );
    assert_eq!(during["consecutive_failures"], 0, "no store failure: {during:#}");
    let c = copy_status(&w);
    assert!(
        c["lag_revisions"].as_i64() > Some(0) && worst_lag >= 5.0,
        "the copy's lag shows the outage (worst {worst_lag} s): {c:#}"
    );
    assert!(
        w.metric("etcd_warden_copy_lag_seconds").unwrap_or(0.0) >= 5.0,
        "the lag is in /metrics too"
    );

    proxy.resume();
    wait_for("the copy to catch up", Duration::from_secs(90), || {
        let c = copy_status(&w);
        (c["lag_revisions"] == 0 && c["healthy"] == true).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let mut acked = writes.join().unwrap();
    // Every write in the store (the last delta is published up to a period after the writer
    // stopped), then in the copy: only then are the writer's totals final.
    let last = etcd_revision(&etcdctl_for(&default_etcd()), &ip);
    wait_for(
        "the store and the copy to hold the last write",
        Duration::from_secs(30),
        || {
            let s = w.status();
            let c = &s["copies"][0];
            (s["backup"]["backed_up_revision"].as_i64() >= Some(last)
                && c["revision"].as_i64() >= Some(last)
                && c["behind_since"].is_null())
            .then_some(())
        },
    );
    let b = w.status()["backup"].clone();
    let published = b["fulls_total"].as_u64().unwrap() + b["deltas_total"].as_u64().unwrap();
    assert!(
        b["fulls_total"].as_u64() >= Some(3),
        "two fulls during the outage: {b:#}"
    );
    let copied = ews_keys(&moto.endpoint, "copy");
    assert_eq!(
        copied.len() as u64,
        published,
        "the copy holds every object the writer published, also those the store's retention (last:1) would have deleted before the copy got them: {copied:#?}"
    );
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_exit(Duration::from_secs(60)), 143, "{}", w.log_text());

    let primary = ews_keys(&moto.endpoint, "primary");
    assert!(primary.len() >= 3, "fulls and deltas: {primary:?}");
    let copied = ews_keys(&moto.endpoint, "copy");
    let missing: Vec<_> = primary.iter().filter(|k| !copied.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "every store object is in the copy: {missing:?}"
    );
    acked.sort();
    let (found, _) = keys_after_restore(&default_etcd(), "s3://copy/etcd", &s3_env(&moto.endpoint), "k");
    assert_none_lost(&acked, &found, "restored from the copy");
}

/// A copy bucket with S3 Object Lock (governance mode, one day by the bucket's default retention):
/// the copy's retention (last:1) deletes nothing that is locked, not even with a delete marker,
/// says when the first object becomes deletable, and deletes an object once its lock has passed.
#[test]
fn retention_never_deletes_an_object_under_object_lock_and_deletes_it_once_the_lock_passed() {
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "primary");
    boto3(
        &moto.endpoint,
        "s3.create_bucket(Bucket='locked', ObjectLockEnabledForBucket=True)\n\
         s3.put_object_lock_configuration(Bucket='locked', ObjectLockConfiguration={\
         'ObjectLockEnabled': 'Enabled', 'Rule': {'DefaultRetention': {'Mode': 'GOVERNANCE', 'Days': 1}}})",
        &[],
    );
    let (w, _dir) = warden_with_copy(
        &ip,
        &moto,
        "s3://locked/etcd",
        "",
        // The store keeps its default retention: with last:1 there it could delete a full before
        // the copy's turn came (a copy gets what the store still holds).
        &["--copy-retention", "last:1"],
    );
    let fulls_in = |bucket: &str| -> Vec<String> {
        ews_keys(&moto.endpoint, bucket)
            .into_iter()
            .filter(|k| k.contains("/full/"))
            .collect()
    };
    for n in 2..=4u64 {
        etcdctl_put(&ip, &format!("k{n}"));
        w.signal(Signal::SIGUSR1);
        wait_for(&format!("full {n} in the copy"), Duration::from_secs(60), || {
            (w.status()["backup"]["fulls_total"].as_u64() >= Some(n)).then_some(())
        });
    }
    wait_for(
        "the four fulls in the copy, its retention reporting the locked ones",
        Duration::from_secs(60),
        || {
            let c = copy_status(&w);
            (fulls_in("locked").len() >= 4 && c["retention_locked"]["objects"].as_u64() >= Some(3))
                .then_some(())
        },
    );
    let locked = fulls_in("locked");
    let markers = boto3(
        &moto.endpoint,
        "v = s3.list_object_versions(Bucket='locked')\n\
         print(len(v.get('DeleteMarkers', [])))",
        &[],
    );
    assert_eq!(markers.trim(), "0", "no delete marker hides a locked object");
    let c = copy_status(&w);
    let next = c["retention_locked"]["next_deletable_at"].as_f64().unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (next - now - 86_400.0).abs() < 600.0,
        "the first locked object becomes deletable in a day: {c:#}"
    );
    assert!(
        w.metric("etcd_warden_retention_locked_objects{store=\"s3://locked/etcd\"}") >= Some(3.0),
        "/metrics counts the locked objects"
    );

    // The oldest full's lock is shortened to two seconds (governance mode allows it with bypass).
    let oldest = locked[0].clone();
    boto3(
        &moto.endpoint,
        "until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)\n\
         s3.put_object_retention(Bucket='locked', Key=sys.argv[1], BypassGovernanceRetention=True, \
         Retention={'Mode': 'GOVERNANCE', 'RetainUntilDate': until})",
        &[&oldest],
    );
    std::thread::sleep(Duration::from_secs(3));
    etcdctl_put(&ip, "k5");
    w.signal(Signal::SIGUSR1);
    wait_for(
        "the oldest full to leave the copy",
        Duration::from_secs(60),
        || (!fulls_in("locked").contains(&oldest)).then_some(()),
    );
    let left = fulls_in("locked");
    assert_eq!(
        left.len(),
        locked.len(),
        "the other fulls stay locked, the new one arrived: {left:?}"
    );
}

fn etcdctl_put(ip: &str, key: &str) {
    rt().block_on(async {
        let mut c = pki::connect(ip, None).await.expect("connect to etcd");
        c.put(key, "v", None).await.expect("put");
    });
}

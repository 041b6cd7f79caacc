//! The runbooks in docs/ run as written: each ```` ```sh runbook-NAME ```` block is taken from the
//! document and run by bash (`set -e`) with the variables the runbook defines set to this test's
//! values; the steps that are no commands (stopping and starting the warden) the test does itself.
//! What the runbook promises is then checked with etcd's own client, against the writes the test
//! saw acknowledged.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const START: Duration = Duration::from_secs(60);

/// docs/restore.md, "Undo a bad write: point in time": a good value, then a bad write after the
/// point; the look-before-you-leap block shows the good value, the restore block puts the member
/// back to the point, the warden started again keeps it, and the full snapshot the last block asks
/// for makes it the store's newest: a later restore of the newest backup has the good value.
#[test]
fn the_point_in_time_runbook_runs_as_written() {
    let blocks = runbook_blocks("docs/restore.md", "pitr");
    assert_eq!(blocks.len(), 3, "look, restore, snapshot: {blocks:#?}");
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let socket_arg = socket.display().to_string();
    let (mut w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &["--admin-socket", &socket_arg]);
    let key = "/registry/configmaps/default/my-config";
    etcdctl(&ctl, &ip, &["put", key, "good"]).unwrap();
    let good = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {good} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(good)).then_some(())
    });
    // The point: after the good value's delta was written, a whole second before the bad write's.
    let point = std::time::SystemTime::now() + Duration::from_secs(1);
    wait_for("the clock to pass the point", Duration::from_secs(5), || {
        (std::time::SystemTime::now() > point + Duration::from_millis(50)).then_some(())
    });
    etcdctl(&ctl, &ip, &["put", key, "bad"]).unwrap();
    let bad = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {bad} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(bad)).then_some(())
    });

    let data = dir.path().join("data");
    let mut vars = vec![
        ("STORE", store.clone()),
        ("ADMIN_SOCKET", socket_arg.clone()),
        ("DATA_DIR", data.display().to_string()),
        ("NAME", "m1".to_owned()),
        ("PEER_URL", format!("https://{ip}:2380")),
        ("ETCD", etcd.display().to_string()),
        ("POINT", humantime::format_rfc3339_seconds(point).to_string()),
        // What an operator's shell may have exported (docs/cluster.md does): etcdctl exits when a
        // flag shadows it, so the runbook does not pass --endpoints.
        ("ETCDCTL_ENDPOINTS", pki::client_url(&ip)),
    ];
    // And the TLS files cluster.md exports for the production cluster.
    vars.extend(pki::etcdctl_env(&ip));
    let bins = [Path::new(WARDEN).parent().unwrap(), etcd.parent().unwrap()];

    // Step 2: look before you leap, while the warden still runs.
    let seen = run_block(&blocks[0], &vars, &bins, "step 2 (look)");
    assert!(
        seen.lines().any(|l| l == "good") && !seen.contains("bad"),
        "the look at the point shows {seen:?}"
    );
    // Step 3: stop the warden.
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);
    // Step 4: move aside, restore in place.
    run_block(&blocks[1], &vars, &bins, "step 4 (restore)");
    assert!(
        Path::new(&format!("{}.before-pitr", data.display()))
            .join("member")
            .is_dir()
    );
    // Step 5: the warden as before, then the full snapshot the runbook asks for.
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &data));
    let mut w = Warden::start(
        &ip,
        &[
            "--store",
            &store,
            "--delta-snapshot-period",
            "200ms",
            "--admin-socket",
            &socket_arg,
        ],
        &argv,
    );
    w.wait_ready(START);
    run_block(&blocks[2], &vars, &bins, "step 5 (full snapshot)");
    let value = etcdctl(&ctl, &ip, &["get", key, "--print-value-only"]).unwrap();
    assert_eq!(value.trim(), "good", "the member after the runbook");
    let revision = etcd_revision(&ctl, &ip);
    assert_eq!(
        revision,
        good + 1_000_000_000,
        "the point's revision raised by the default bump"
    );
    assert_eq!(
        w.status()["restore"]["startup_restores"]["total"],
        0,
        "run replaced the restored dir"
    );
    w.signal(Signal::SIGTERM);
    w.wait_exit(START);

    // The newest backup is now the restored history.
    let again = dir.path().join("again");
    let ip2 = unique_ip();
    let out = restore_command_bumped(&store, &again, &etcd, &ip2, &[])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _plain = PlainEtcd::start(&etcd, &ip2, &again, "m1");
    let value = etcdctl(&ctl, &ip2, &["get", key, "--print-value-only"]).unwrap();
    assert_eq!(
        value.trim(),
        "good",
        "a restore of the newest backup after the runbook"
    );
}

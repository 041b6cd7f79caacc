//! The store as hostile (issue 41): whoever can write one object into the bucket must not be able
//! to take etcd down or make the warden restore forged data. Each test plants what a review
//! planted, with the real binary.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const START: Duration = Duration::from_secs(60);

/// A 0-byte object whose name carries a multi-byte character where a digit belongs: the name
/// parser sliced it by byte index and aborted every command that lists the store (a running
/// `run` with its etcd, and every restart before etcd starts). Now it is no snapshot, and said so.
#[test]
fn a_name_with_a_multibyte_character_takes_nothing_down() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&default_etcd(), &ip, dir.path(), &[]);
    let hostile = dir
        .path()
        .join("store/v1/full/full-00000000000000000099-202é204T215500000Z-zstd-plain.ews");
    std::fs::write(&hostile, b"").unwrap();

    let out = Command::new(WARDEN)
        .args(["backups", "list", "--json", "--store", &store])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "backups list: {stderr}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        rows.as_array()
            .is_some_and(|r| r.iter().any(|r| r["kind"] == "full")),
        "the real full is not listed: {rows}"
    );

    // The running warden lists the store again at its next full: it and its etcd live on.
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    w.signal(nix::sys::signal::Signal::SIGUSR1);
    wait_for("a full snapshot after the object was planted", START, || {
        w.assert_running();
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(())
    });
    w.wait_ready(START);

    // A start with the data dir lost restores the real backups.
    let etcd_pid = w.etcd_pid().unwrap();
    let mut w = w;
    w.signal(nix::sys::signal::Signal::SIGKILL);
    w.wait_exit(START);
    wait_for("etcd to die with its warden", START, || {
        (!alive(etcd_pid)).then_some(())
    });
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let mut argv = vec![default_etcd().display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let w = Warden::start(&ip, &["--store", &store], &argv);
    w.wait_ready(START);
    assert_eq!(
        w.status()["restore"]["startup_restores"]["total"],
        1,
        "{}",
        w.log_text()
    );
}

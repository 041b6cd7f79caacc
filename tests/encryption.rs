//! age encryption of backups: the warden writes with the public key only; restore needs the
//! identity and fails clearly without it; the `age` CLI decrypts a payload cut out of an object.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

const START: Duration = Duration::from_secs(30);
const MARKER: &str = "plaintext-marker-7f3a9c";

fn keygen(dir: &Path) -> (std::path::PathBuf, String) {
    let key = dir.join("key.txt");
    let out = Command::new("age-keygen")
        .arg("-o")
        .arg(&key)
        .output()
        .expect("age-keygen is missing: install Debian's age package (scripts/deps.sh does)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("age-keygen").arg("-y").arg(&key).output().unwrap();
    (key, String::from_utf8(out.stdout).unwrap().trim().to_owned())
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The payload of an object, cut out as docs/FORMAT.md describes.
fn payload(object: &[u8]) -> &[u8] {
    let hlen = u32::from_le_bytes(object[8..12].try_into().unwrap()) as usize;
    let trailer = &object[object.len() - 52..];
    let footer_len = u32::from_le_bytes(trailer[0..4].try_into().unwrap()) as usize;
    &object[12 + hlen..object.len() - 52 - footer_len]
}

#[test]
fn encrypted_backups_restore_only_with_the_identity_and_age_decrypts_a_payload() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (key, recipient) = keygen(dir.path());
    // No compression: any plaintext that leaked would be visible in the objects.
    let (w, store) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &["--encrypt-to", &recipient, "--compression", "none"],
    );
    etcdctl(&etcdctl_for(&etcd), &ip, &["put", "secret", MARKER]).unwrap();
    wait_for("a delta holding the put", START, || {
        (w.status()["backup"]["deltas_total"].as_u64() >= Some(1)).then_some(())
    });
    drop(w);

    let objects = files(&dir.path().join("store"));
    assert!(objects.len() >= 2, "{objects:?}");
    for o in &objects {
        let name = o.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.contains("-none-age"),
            "{name} is not marked as age-encrypted"
        );
        let bytes = std::fs::read(o).unwrap();
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "{name} holds the value in plaintext"
        );
        assert!(payload(&bytes).starts_with(b"age-encryption.org/v1\n"), "{name}");
    }

    // Without the identity: the digests still verify; a restore fails and names the fix.
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let target = dir.path().join("restored");
    let out = Command::new(WARDEN)
        .args(["restore", "--store", &store, "--data-dir"])
        .arg(&target)
        .args(["--name", "m1", "--etcd"])
        .arg(&etcd)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--identity"), "the error must name the fix: {err}");
    assert!(!target.exists() || std::fs::read_dir(&target).unwrap().next().is_none());

    // With it: contents verified and restored.
    let verify = Command::new(WARDEN)
        .args(["backups", "verify", "--store", &store, "--identity"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let out = Command::new(WARDEN)
        .args(["restore", "--store", &store, "--data-dir"])
        .arg(&target)
        .args(["--name", "m1", "--etcd"])
        .arg(&etcd)
        .arg("--identity")
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rip = unique_ip();
    let plain = PlainEtcd::start(&etcd, &rip, &target, "m1");
    let got = etcdctl(
        &etcdctl_for(&etcd),
        &rip,
        &["get", "secret", "--print-value-only"],
    )
    .unwrap();
    plain.stop();
    assert_eq!(got.trim(), MARKER);

    // The age CLI decrypts a full snapshot's payload: etcd's database followed by its sha256.
    let full = objects
        .iter()
        .find(|p| p.to_string_lossy().contains("/full/"))
        .expect("a full snapshot");
    let cut = dir.path().join("payload.age");
    std::fs::write(&cut, payload(&std::fs::read(full).unwrap())).unwrap();
    let out = Command::new("age")
        .arg("-d")
        .arg("-i")
        .arg(&key)
        .arg(&cut)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let db = out.stdout;
    let (body, sha) = db.split_at(db.len() - 32);
    assert_eq!(
        Sha256::digest(body).as_slice(),
        sha,
        "age's output is not etcd's snapshot stream"
    );
}

/// The start-up restore of `run` from an encrypted store: without `--identity-file` the warden stops
/// with an error naming it and starts no empty etcd; with it, a lost data dir comes back holding
/// exactly the acknowledged writes, at the backed-up revision plus the default bump.
#[test]
fn a_start_up_restore_reads_an_encrypted_store_with_the_identity_file() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (key, recipient) = keygen(dir.path());
    let key = key.display().to_string();
    let (mut w, store) = warden_with_file_store(
        &etcd,
        &ip,
        dir.path(),
        &["--encrypt-to", &recipient, "--identity-file", &key],
    );
    for i in 0..10 {
        etcdctl(&ctl, &ip, &["put", &format!("enc{i}"), &format!("{MARKER}-{i}")]).unwrap();
    }
    etcdctl(&ctl, &ip, &["del", "enc4"]).unwrap();
    let before = etcdctl(&ctl, &ip, &["get", "enc", "--prefix"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_exit(START);
    let data = dir.path().join("data");
    std::fs::remove_dir_all(&data).unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &data));

    let mut without = Warden::start(&ip, &["--store", &store, "--encrypt-to", &recipient], &argv);
    let code = without.wait_exit(START);
    assert_ne!(code, 0, "{}", without.log_text());
    assert!(
        without.log_text().contains("no identity was given"),
        "the error must name the fix: {}",
        without.log_text()
    );
    assert!(!data.exists(), "an etcd was started on an empty data dir");

    let with = Warden::start(
        &ip,
        &[
            "--store",
            &store,
            "--encrypt-to",
            &recipient,
            "--identity-file",
            &key,
        ],
        &argv,
    );
    with.wait_ready(START);
    assert_eq!(
        etcdctl(&ctl, &ip, &["get", "enc", "--prefix"]).unwrap(),
        before,
        "the restored keys differ from the acknowledged writes"
    );
    assert_eq!(etcd_revision(&ctl, &ip), rev + 1_000_000_000, "restored revision");
    let status = with.status();
    assert_eq!(status["restore"]["startup_restores"]["total"], 1, "{status}");
}

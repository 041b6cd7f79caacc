//! The warden's client reads etcd's TLS flags and connects like any client would: HTTPS with etcd's
//! CA, and a client certificate when `--client-cert-auth` demands one, for its health checks and for
//! its backups (the snapshot stream and the watch). Certificates come from the openssl CLI at test
//! time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::prod::openssl;
use common::*;
use etcd_warden::store::{Store, StoreUrl};

const START: Duration = Duration::from_secs(60);

fn make_certs(dir: &Path, ip: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=warden-test-ca",
        "-days",
        "2",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=etcd"]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=IP:{ip},DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// etcd's command line for a client port that serves TLS only and demands client certificates.
fn tls_etcd_argv(etcd: &Path, ip: &str, d: &Path) -> Vec<String> {
    let f = |n: &str| d.join(n).display().to_string();
    vec![
        etcd.display().to_string(),
        "--name=m1".into(),
        format!("--data-dir={}", f("data")),
        format!("--listen-client-urls=https://{ip}:2379"),
        format!("--advertise-client-urls=https://{ip}:2379"),
        format!("--listen-peer-urls=http://{ip}:2380"),
        format!("--initial-advertise-peer-urls=http://{ip}:2380"),
        format!("--initial-cluster=m1=http://{ip}:2380"),
        "--client-cert-auth".into(),
    ]
}

/// etcdctl over TLS with the client certificate (the server's, which is also a client certificate).
fn etcdctl_tls(ctl: &Path, ip: &str, d: &Path, args: &[&str]) -> String {
    let f = |n: &str| d.join(n).display().to_string();
    let out = Command::new(ctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://{ip}:2379"))
        .arg(format!("--cacert={}", f("ca.crt")))
        .arg(format!("--cert={}", f("server.crt")))
        .arg(format!("--key={}", f("server.key")))
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ready_through_tls_with_client_cert_auth_from_etcds_own_flags() {
    let etcd = default_etcd();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d, &ip);
    let f = |n: &str| d.join(n).display().to_string();
    let argv = tls_etcd_argv(&etcd, &ip, d);
    // The TLS files come through ETCD_* variables, as in many container set-ups.
    let w = Warden::builder(&ip, &[], &argv)
        .env("ETCD_CERT_FILE", &f("server.crt"))
        .env("ETCD_KEY_FILE", &f("server.key"))
        .env("ETCD_TRUSTED_CA_FILE", &f("ca.crt"))
        .spawn();
    w.wait_ready(Duration::from_secs(30));
    let status = w.status();
    assert_eq!(status["etcd"]["healthy"], true, "{status}");

    // And etcd really demands the client certificate: a client without one is refused.
    let ctl = etcdctl_for(&etcd);
    let out = Command::new(&ctl)
        .env("ETCDCTL_API", "3")
        .args([
            format!("--endpoints=https://{ip}:2379"),
            format!("--cacert={}", f("ca.crt")),
            "--command-timeout=3s".into(),
            "get".into(),
            "x".into(),
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "etcd accepted a client without a certificate"
    );
}

/// Backups over mutual TLS: the first full snapshot and the deltas after it reach the store, and
/// the chain restores to exactly what etcdctl read from the live etcd.
#[test]
fn backups_over_mutual_tls_restore_to_what_etcdctl_saw() {
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d, &ip);
    let f = |n: &str| d.join(n).display().to_string();
    let store_dir = d.join("store");
    let store = format!("file://{}", store_dir.display());
    let w = Warden::builder(
        &ip,
        &["--store", &store, "--delta-snapshot-period", "200ms"],
        &tls_etcd_argv(&etcd, &ip, d),
    )
    .env("ETCD_CERT_FILE", &f("server.crt"))
    .env("ETCD_KEY_FILE", &f("server.key"))
    .env("ETCD_TRUSTED_CA_FILE", &f("ca.crt"))
    .spawn();
    w.wait_ready(Duration::from_secs(30));
    wait_for("the first full snapshot", Duration::from_secs(30), || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });

    for i in 0..20 {
        etcdctl_tls(&ctl, &ip, d, &["put", &format!("k{i:02}"), &format!("value-{i}")]);
    }
    etcdctl_tls(&ctl, &ip, d, &["del", "k03"]);
    let live = etcdctl_tls(&ctl, &ip, d, &["get", "k", "--prefix", "-w", "json"]);
    let live: serde_json::Value = serde_json::from_str(&live).unwrap();
    let rev = live["header"]["revision"].as_i64().unwrap();
    let live_kvs = etcdctl_tls(&ctl, &ip, d, &["get", "k", "--prefix"]);
    assert_eq!(live_kvs.lines().count(), 2 * 19, "{live_kvs}");
    wait_for(
        &format!("revision {rev} in the store"),
        Duration::from_secs(20),
        || (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(()),
    );
    drop(w);

    // In the store: one full snapshot (before the writes) and deltas carrying every write.
    let rt = rt();
    let s = Store::open(&StoreUrl::File { path: store_dir }).unwrap();
    let (full, chain) = rt
        .block_on(s.newest_checked_chain())
        .unwrap()
        .expect("a full snapshot");
    assert!(
        full.last_revision() < rev,
        "the full snapshot holds the writes (rev {} ≥ {rev}): the deltas would not be tested",
        full.last_revision()
    );
    assert!(!chain.is_empty(), "no delta after the full snapshot");
    let last = chain.iter().map(|n| n.last_revision()).max().unwrap();
    assert!(last >= rev, "the deltas end at {last}, before {rev}");

    // Restored with the product's restore, read back with etcdctl from a plain etcd.
    let restored = restored_etcd(&etcd, &store, &[]);
    let restored_kvs = etcdctl(&ctl, &restored.ip, &["get", "k", "--prefix"]).unwrap();
    assert_eq!(
        restored_kvs, live_kvs,
        "restored keys and values differ from etcdctl's view"
    );
    restored.etcd.stop();
}

/// docs/cluster.md's certificate recipe, run as written (the example addresses replaced by this
/// test's): a member started with its certificates, as the env file configures them (TLS for
/// clients and peers, client certificates demanded), serves etcdctl with the warden's
/// certificate, and never logs `tls: bad certificate` from its own gateway, which dials the
/// member's client URL with the server certificate (the recipe once issued it for serverAuth
/// only).
#[test]
fn the_cluster_docs_certificates_serve_a_member_without_bad_certificate_errors() {
    let [block] = &runbook_blocks("docs/cluster.md", "certs")[..] else {
        panic!("docs/cluster.md has one runbook-certs block");
    };
    assert!(
        block.contains("10.0.0.1$i"),
        "the recipe's example addresses changed:\n{block}"
    );
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = (0..3).map(|_| unique_ip()).collect();
    let block = format!(
        "cd \"$WORK\"\n{}",
        block.replace("10.0.0.1$i", "$(printenv IP$i)")
    );
    let vars = vec![
        ("WORK", dir.path().display().to_string()),
        ("IP1", ips[0].clone()),
        ("IP2", ips[1].clone()),
        ("IP3", ips[2].clone()),
    ];
    run_block(&block, &vars, &[], "docs/cluster.md's certificate recipe");
    let pki = dir.path().join("pki");
    let f = |n: &str| pki.join(n).display().to_string();
    let ip = &ips[0];
    let etcd = default_etcd();
    let log_path = dir.path().join("etcd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(&etcd);
    cmd.args([
        "--name=etcd-1".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls=https://{ip}:2379"),
        format!("--advertise-client-urls=https://{ip}:2379"),
        format!("--listen-peer-urls=https://{ip}:2380"),
        format!("--initial-advertise-peer-urls=https://{ip}:2380"),
        format!("--initial-cluster=etcd-1=https://{ip}:2380"),
        format!("--cert-file={}", f("etcd-1-server.crt")),
        format!("--key-file={}", f("etcd-1-server.key")),
        format!("--trusted-ca-file={}", f("ca.crt")),
        "--client-cert-auth".to_owned(),
        format!("--peer-cert-file={}", f("etcd-1-peer.crt")),
        format!("--peer-key-file={}", f("etcd-1-peer.key")),
        format!("--peer-trusted-ca-file={}", f("ca.crt")),
        "--peer-client-cert-auth".to_owned(),
    ])
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    dies_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let ctl = etcdctl_for(&etcd);
    let etcdctl = |args: &[&str]| {
        Command::new(&ctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://{ip}:2379"))
            .arg(format!("--cacert={}", f("ca.crt")))
            .arg(format!("--cert={}", f("warden.crt")))
            .arg(format!("--key={}", f("warden.key")))
            .arg("--command-timeout=5s")
            .args(args)
            .output()
            .unwrap()
    };
    wait_for(
        "etcd to answer etcdctl with the warden's certificate",
        START,
        || etcdctl(&["endpoint", "health"]).status.success().then_some(()),
    );
    let out = etcdctl(&["put", "k", "v"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The gateway's connection is up by the time etcd says it serves; give a retry loop time too.
    wait_for("etcd's log to say it serves client traffic", START, || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("serving client traffic securely")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    let text = std::fs::read_to_string(&log_path).unwrap();
    let bad = text.lines().filter(|l| l.contains("bad certificate")).count();
    assert_eq!(
        bad,
        0,
        "etcd logged bad certificates with the recipe's certificates:\n{}",
        text.lines()
            .filter(|l| l.contains("bad certificate"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

//! The warden's client reads etcd's TLS flags and connects like any client would: HTTPS with etcd's
//! CA, and a client certificate when `--client-cert-auth` demands one. Certificates come from the
//! openssl CLI at test time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl CLI is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

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

#[test]
fn ready_through_tls_with_client_cert_auth_from_etcds_own_flags() {
    let etcd = etcd35();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d, &ip);
    let f = |n: &str| d.join(n).display().to_string();
    let argv = vec![
        etcd.display().to_string(),
        "--name=m1".into(),
        format!("--data-dir={}", f("data")),
        format!("--listen-client-urls=https://{ip}:2379"),
        format!("--advertise-client-urls=https://{ip}:2379"),
        format!("--listen-peer-urls=http://{ip}:2380"),
        format!("--initial-advertise-peer-urls=http://{ip}:2380"),
        format!("--initial-cluster=m1=http://{ip}:2380"),
        "--client-cert-auth".into(),
    ];
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

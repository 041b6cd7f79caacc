//! The certificates of the harness's etcds, laid out as kubeadm lays them out (`pki/etcd/` with
//! `ca`, `server`, `peer` and `healthcheck-client`): one CA for the whole test run, made once in
//! cargo's temporary directory for tests, and a member's certificates for its address, made
//! beside its data dir when the harness first builds an etcd command line for that address.
//! Every etcd of the harness serves TLS to clients and peers and demands client certificates;
//! the warden finds its identity in etcd's own flags, as it does on a kubeadm node.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::prod::{issue_member, make_ca};

/// The members' `pki/etcd` directories by address, in this test process.
static MADE: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The run's CA (`ca.crt`, `ca.key`), made once; several test processes may race to make it.
fn ca() -> PathBuf {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join("test-ca");
    if dir.join("ca.crt").exists() {
        return dir;
    }
    let tmp = base.join(format!("test-ca.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    make_ca(&tmp, "3650");
    // The first rename wins; a loser's directory is not empty-renamed over it.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    assert!(dir.join("ca.crt").exists(), "the test CA in {}", dir.display());
    dir
}

/// The `pki/etcd` directory of the member on `ip`, made under `beside` the first time.
pub fn make(ip: &str, beside: &Path) -> PathBuf {
    let mut made = MADE.lock().unwrap();
    let made = made.get_or_insert_with(HashMap::new);
    if let Some(p) = made.get(ip) {
        return p.clone();
    }
    let ca = ca();
    let pki = beside.join(format!("pki-{ip}/pki/etcd"));
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::copy(ca.join("ca.crt"), pki.join("ca.crt")).unwrap();
    issue_member(&pki, &ca, ip);
    made.insert(ip.to_owned(), pki.clone());
    pki
}

/// The `pki/etcd` directory of the harness's member on `ip`, if the harness made one.
pub fn of(ip: &str) -> Option<PathBuf> {
    MADE.lock().unwrap().as_ref()?.get(ip).cloned()
}

/// `of`, for a member the harness must have made.
pub fn must(ip: &str) -> PathBuf {
    of(ip).unwrap_or_else(|| panic!("no harness certificates for {ip}: start its etcd with the harness"))
}

/// etcd's TLS flags for the member on `ip` whose certificates are in `pki`, and kubeadm's plain
/// http metrics listener on port 2381.
pub fn etcd_flags(ip: &str, pki: &Path) -> Vec<String> {
    let f = |n: &str| pki.join(n).display().to_string();
    vec![
        format!("--listen-metrics-urls=http://{ip}:2381"),
        format!("--cert-file={}", f("server.crt")),
        format!("--key-file={}", f("server.key")),
        format!("--trusted-ca-file={}", f("ca.crt")),
        "--client-cert-auth".into(),
        format!("--peer-cert-file={}", f("peer.crt")),
        format!("--peer-key-file={}", f("peer.key")),
        format!("--peer-trusted-ca-file={}", f("ca.crt")),
        "--peer-client-cert-auth".into(),
    ]
}

/// etcdctl's (and the warden's one-shot commands') TLS flags for the member on `ip`: the CA and
/// the health-check client's certificate.
pub fn client_flags(ip: &str) -> Vec<String> {
    let pki = must(ip);
    let f = |n: &str| pki.join(n).display().to_string();
    vec![
        format!("--cacert={}", f("ca.crt")),
        format!("--cert={}", f("healthcheck-client.crt")),
        format!("--key={}", f("healthcheck-client.key")),
    ]
}

/// The warden's one-shot commands' options for the member on `ip` (`--endpoints` and, with
/// harness certificates, `--etcd-ca`, `--etcd-cert`, `--etcd-key`).
pub fn warden_flags(ip: &str) -> Vec<String> {
    let mut out = vec!["--endpoints".to_owned(), client_url(ip)];
    if let Some(pki) = of(ip) {
        let f = |n: &str| pki.join(n).display().to_string();
        out.extend([
            "--etcd-ca".to_owned(),
            f("ca.crt"),
            "--etcd-cert".to_owned(),
            f("healthcheck-client.crt"),
            "--etcd-key".to_owned(),
            f("healthcheck-client.key"),
        ]);
    }
    out
}

/// etcdctl's environment for the member on `ip` (`ETCDCTL_CACERT`, `ETCDCTL_CERT`,
/// `ETCDCTL_KEY`), as a runbook's reader exports it.
pub fn etcdctl_env(ip: &str) -> Vec<(&'static str, String)> {
    let pki = must(ip);
    let f = |n: &str| pki.join(n).display().to_string();
    vec![
        ("ETCDCTL_CACERT", f("ca.crt")),
        ("ETCDCTL_CERT", f("healthcheck-client.crt")),
        ("ETCDCTL_KEY", f("healthcheck-client.key")),
    ]
}

/// The client URL of the member on `ip`: https when the harness made its certificates.
pub fn client_url(ip: &str) -> String {
    match of(ip) {
        Some(_) => format!("https://{ip}:2379"),
        None => format!("http://{ip}:2379"),
    }
}

/// `opts` (or defaults) with the TLS of the member on `ip`, if it has harness certificates.
pub fn options(ip: &str, opts: Option<etcd_client::ConnectOptions>) -> etcd_client::ConnectOptions {
    let opts = opts.unwrap_or_else(|| {
        etcd_client::ConnectOptions::new()
            .with_timeout(Duration::from_secs(5))
            .with_connect_timeout(Duration::from_secs(2))
    });
    match of(ip) {
        Some(pki) => {
            let read = |n: &str| std::fs::read(pki.join(n)).unwrap();
            opts.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")))
                    .identity(etcd_client::Identity::from_pem(
                        read("healthcheck-client.crt"),
                        read("healthcheck-client.key"),
                    )),
            )
        }
        None => opts,
    }
}

/// A client of the member on `ip` as an application has one (TLS with a client certificate).
pub async fn connect(
    ip: &str,
    opts: Option<etcd_client::ConnectOptions>,
) -> Result<etcd_client::Client, etcd_client::Error> {
    etcd_client::Client::connect([client_url(ip)], Some(options(ip, opts))).await
}

/// A client of the members on `ips` (one CA signs them all).
pub async fn connect_all(
    ips: &[String],
    opts: Option<etcd_client::ConnectOptions>,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let urls: Vec<String> = ips.iter().map(|ip| client_url(ip)).collect();
    etcd_client::Client::connect(urls, Some(options(&ips[0], opts))).await
}

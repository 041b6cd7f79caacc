//! etcd as operators run it: TLS for clients and peers with client-certificate auth (certificates
//! laid out as kubeadm lays them out under `pki/etcd/`, made with the openssl CLI), etcd auth on
//! with a root user the warden logs in as (`--etcd-user`, `--etcd-password-file`), and etcd's
//! whole configuration in `ETCD_*` variables, as an env file or a unit's EnvironmentFile sets it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const ROOT_PASSWORD: &str = "root-pw-4f2a";

/// One member's production-shaped configuration on `ip`.
pub struct Prod {
    pub ip: String,
    /// `pki/etcd` as kubeadm writes it: ca, server, peer, healthcheck-client.
    pub pki: PathBuf,
    pub password_file: PathBuf,
}

/// Runs the openssl CLI in `dir`; fails the test with its stderr.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI (scripts/deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA (`ca.crt`, `ca.key`) in `dir`, valid for `days`.
pub fn make_ca(dir: &Path, days: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=etcd-ca",
            "-days",
            days,
        ],
    );
}

/// `name.crt`/`name.key` in `dir` signed by `ca/ca.crt`, with `cn` and `ext` (an openssl
/// extension section's lines).
fn issue(dir: &Path, ca: &Path, name: &str, cn: &str, ext: &str) {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    let subj = format!("/CN={cn}");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subj,
        ],
    );
    std::fs::write(dir.join(&extfile), ext).unwrap();
    let (ca_crt, ca_key) = (
        ca.join("ca.crt").display().to_string(),
        ca.join("ca.key").display().to_string(),
    );
    // A random serial: several test processes may sign with one CA at once.
    let serial = fastrand::u64(1..u64::MAX >> 1).to_string();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-set_serial",
            &serial,
            "-out",
            &crt,
            "-days",
            "3650",
            "-extfile",
            &extfile,
        ],
    );
}

/// A member's certificates in `pki` signed by `ca/ca.*`, as kubeadm makes them: server and peer
/// certificates for localhost, the loopback and the member's address `ip`, usable both ways; a
/// client certificate for health checks.
pub fn issue_member(pki: &Path, ca: &Path, ip: &str) {
    let san = format!("subjectAltName=DNS:localhost,IP:127.0.0.1,IP:{ip},IP:::1\n");
    let both = "extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n";
    issue(pki, ca, "server", "etcd-server", &format!("{san}{both}"));
    issue(pki, ca, "peer", "etcd-peer", &format!("{san}{both}"));
    issue(
        pki,
        ca,
        "healthcheck-client",
        "kube-etcd-healthcheck-client",
        "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    );
}

impl Prod {
    /// Certificates and the root password file under `dir`.
    pub fn new(ip: &str, dir: &Path) -> Self {
        let pki = dir.join("pki/etcd");
        std::fs::create_dir_all(&pki).unwrap();
        make_ca(&pki, "2");
        Self::issued(ip, dir)
    }

    /// One member per address, each with its own certificates under `dir/m<i>` from one CA.
    pub fn cluster(ips: &[String], dir: &Path) -> Vec<Self> {
        let ca = Self::new(&ips[0], &dir.join("m0"));
        let mut out = vec![ca];
        for (i, ip) in ips.iter().enumerate().skip(1) {
            let pki = dir.join(format!("m{i}/pki/etcd"));
            std::fs::create_dir_all(&pki).unwrap();
            for f in ["ca.crt", "ca.key"] {
                std::fs::copy(out[0].pki.join(f), pki.join(f)).unwrap();
            }
            out.push(Self::issued(ip, &dir.join(format!("m{i}"))));
        }
        out
    }

    /// The member's certificates signed by `dir/pki/etcd/ca.*`, and the root password file.
    fn issued(ip: &str, dir: &Path) -> Self {
        let pki = dir.join("pki/etcd");
        issue_member(&pki, &pki, ip);
        let password_file = dir.join("etcd-root.password");
        std::fs::write(&password_file, format!("{ROOT_PASSWORD}\n")).unwrap();
        Self {
            ip: ip.to_owned(),
            pki,
            password_file,
        }
    }

    /// Member `i` of the cluster of `members` as docs/cluster.md's env file configures it: every
    /// etcd setting an `ETCD_*` variable, https for clients and peers, client certificates.
    pub fn member_env(members: &[Prod], i: usize, data: &Path, token: &str) -> Vec<(String, String)> {
        let me = &members[i];
        let cluster = members
            .iter()
            .enumerate()
            .map(|(j, m)| format!("m{j}=https://{}:2380", m.ip))
            .collect::<Vec<_>>()
            .join(",");
        let mut env = me.etcd_env(data);
        for (k, v) in env.iter_mut() {
            match k.as_str() {
                "ETCD_NAME" => *v = format!("m{i}"),
                "ETCD_INITIAL_CLUSTER" => v.clone_from(&cluster),
                _ => {}
            }
        }
        env.push(("ETCD_INITIAL_CLUSTER_TOKEN".into(), token.into()));
        env.push(("ETCD_INITIAL_CLUSTER_STATE".into(), "new".into()));
        env
    }

    fn file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }

    /// A single member `m1`'s whole configuration as `ETCD_*` variables.
    pub fn etcd_env(&self, data: &Path) -> Vec<(String, String)> {
        let ip = &self.ip;
        [
            ("ETCD_NAME", "m1".to_owned()),
            ("ETCD_DATA_DIR", data.display().to_string()),
            ("ETCD_LISTEN_CLIENT_URLS", format!("https://{ip}:2379")),
            ("ETCD_ADVERTISE_CLIENT_URLS", format!("https://{ip}:2379")),
            ("ETCD_LISTEN_PEER_URLS", format!("https://{ip}:2380")),
            ("ETCD_INITIAL_ADVERTISE_PEER_URLS", format!("https://{ip}:2380")),
            ("ETCD_INITIAL_CLUSTER", format!("m1=https://{ip}:2380")),
            ("ETCD_CERT_FILE", self.file("server.crt")),
            ("ETCD_KEY_FILE", self.file("server.key")),
            ("ETCD_TRUSTED_CA_FILE", self.file("ca.crt")),
            ("ETCD_CLIENT_CERT_AUTH", "true".to_owned()),
            ("ETCD_PEER_CERT_FILE", self.file("peer.crt")),
            ("ETCD_PEER_KEY_FILE", self.file("peer.key")),
            ("ETCD_PEER_TRUSTED_CA_FILE", self.file("ca.crt")),
            ("ETCD_PEER_CLIENT_CERT_AUTH", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The warden's options for etcd auth.
    pub fn warden_opts(&self) -> Vec<String> {
        vec![
            "--etcd-user".into(),
            "root".into(),
            "--etcd-password-file".into(),
            self.password_file.display().to_string(),
        ]
    }

    /// etcdctl over TLS with the health-check client's certificate; `user`: log in as root.
    pub fn etcdctl(&self, etcdctl: &Path, user: bool, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://{}:2379", self.ip))
            .arg(format!("--cacert={}", self.file("ca.crt")))
            .arg(format!("--cert={}", self.file("healthcheck-client.crt")))
            .arg(format!("--key={}", self.file("healthcheck-client.key")))
            .arg("--command-timeout=5s");
        if user {
            cmd.arg(format!("--user=root:{ROOT_PASSWORD}"));
        }
        let out = cmd.args(args).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Adds the root user and turns etcd auth on.
    pub fn enable_auth(&self, etcdctl: &Path) {
        for args in [
            &["user", "add", &format!("root:{ROOT_PASSWORD}")][..],
            &["auth", "enable"],
        ] {
            self.etcdctl(etcdctl, false, args)
                .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"));
        }
    }

    /// A client as an application would have: TLS with a client certificate, logged in as root.
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        let read = |n: &str| std::fs::read(self.pki.join(n)).unwrap();
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")))
            .identity(etcd_client::Identity::from_pem(
                read("healthcheck-client.crt"),
                read("healthcheck-client.key"),
            ));
        let opts = etcd_client::ConnectOptions::new()
            .with_tls(tls)
            .with_user("root", ROOT_PASSWORD)
            .with_timeout(Duration::from_secs(5))
            .with_connect_timeout(Duration::from_secs(2));
        etcd_client::Client::connect([format!("https://{}:2379", self.ip)], Some(opts)).await
    }
}

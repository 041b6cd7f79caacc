//! A real kube-apiserver (1.37.2, built from k8s.io/kubernetes by scripts/deps.sh,
//! `KUBE_APISERVER_BIN`) over etcd members of the harness, over TLS with a client certificate as
//! kubeadm configures it, asked over HTTPS with a static token (curl), as any client would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use nix::sys::signal::Signal;

use super::*;

pub const UP: Duration = Duration::from_secs(120);
pub const TOKEN: &str = "etcd-warden-test-token";

pub fn kube_apiserver() -> PathBuf {
    let p = std::env::var_os("KUBE_APISERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(
        p.is_file(),
        "KUBE_APISERVER_BIN is not set to kube-apiserver: run `source scripts/deps.sh && need_kube_apiserver` (scripts/test does)"
    );
    p
}

/// A kube-apiserver on `ip:6443` over `etcd_servers`, with a static token, its own serving
/// certificate and service-account keys made here; killed with the test.
pub struct Kube {
    child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Drop for Kube {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }
}

pub fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Kube {
    pub fn start(ip: &str, etcd: &[String]) -> Self {
        Self::start_with(ip, etcd, &[])
    }

    /// With more flags (e.g. `--encryption-provider-config`).
    /// kube-apiserver of the etcd members on `etcd`, over TLS with a client certificate as
    /// kubeadm configures it (`--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
    pub fn start_with(ip: &str, etcd: &[String], extra: &[String]) -> Self {
        let etcd_servers = etcd
            .iter()
            .map(|ip| pki::client_url(ip))
            .collect::<Vec<_>>()
            .join(",");
        let pki = pki::must(&etcd[0]);
        let tls: Vec<String> = [
            ("etcd-cafile", "ca.crt"),
            ("etcd-certfile", "healthcheck-client.crt"),
            ("etcd-keyfile", "healthcheck-client.key"),
        ]
        .iter()
        .map(|(flag, f)| format!("--{flag}={}", pki.join(f).display()))
        .collect();
        let dir = tempfile::tempdir().unwrap();
        openssl(&["genrsa", "-out", "sa.key", "2048"], dir.path());
        openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], dir.path());
        std::fs::write(
            dir.path().join("tokens.csv"),
            format!("{TOKEN},admin,admin,system:masters\n"),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("kube-apiserver.log")).unwrap();
        let d = |f: &str| dir.path().join(f).display().to_string();
        let mut cmd = Command::new(kube_apiserver());
        cmd.args([
            &format!("--etcd-servers={etcd_servers}"),
            &format!("--bind-address={ip}"),
            &format!("--advertise-address={ip}"),
            "--endpoint-reconciler-type=none",
            "--secure-port=6443",
            &format!("--cert-dir={}", d("certs")),
            &format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=AlwaysAllow",
            "--service-account-issuer=https://kubernetes.default.svc",
            &format!("--service-account-key-file={}", d("sa.pub")),
            &format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/24",
            "--enable-priority-and-fairness=false",
        ])
        .args(tls)
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null());
        dies_with_test(&mut cmd);
        let child = cmd.spawn().expect("spawn kube-apiserver");
        let k = Kube {
            child,
            url: format!("https://{ip}:6443"),
            dir,
        };
        wait_for("kube-apiserver to report ready", UP, || {
            (k.req("GET", "/readyz", None).0 == 200).then_some(())
        });
        k
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }

    /// One request; `(status, body)`, status 0 when nothing answered.
    pub fn req(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, String) {
        self.request(method, path, "application/json", body)
    }

    /// `method path` with a body of `content_type`: `(status, body)`, status 0 when nothing answered.
    fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&serde_json::Value>,
    ) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sk", "--max-time", "10", "-X", method, "-w", "\n%{http_code}"])
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .args(["-H", &format!("Content-Type: {content_type}")]);
        if let Some(b) = body {
            cmd.args(["--data-binary", &b.to_string()]);
        }
        let out = cmd
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    pub fn json(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> serde_json::Value {
        let (code, text) = self.req(method, path, body);
        assert!((200..300).contains(&code), "{method} {path}: {code} {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
    }

    /// A list once kube-apiserver serves it: after a restore each resource's watch cache
    /// relists from etcd, and until it has, kube-apiserver answers 429 "storage is
    /// (re)initializing" with a Retry-After, as clients (client-go) expect and wait out. Any other
    /// answer but 200 fails.
    pub fn list_when_ready(&self, path: &str) -> serde_json::Value {
        let body = wait_for(&format!("kube-apiserver to serve {path} (not 429)"), UP, || {
            let (code, body) = self.req("GET", path, None);
            assert!(code == 200 || code == 429, "GET {path}: {code} {body}");
            (code == 200).then_some(body)
        });
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// The events a watch from `rv` delivers within `seconds` (it ends by itself).
    pub fn watch(&self, path: &str, rv: &str, seconds: u32) -> Vec<serde_json::Value> {
        let (code, text) = self.req(
            "GET",
            &format!("{path}?watch=1&resourceVersion={rv}&timeoutSeconds={seconds}"),
            None,
        );
        assert_eq!(code, 200, "watch {path} from {rv}: {text}");
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Kube {
    /// One request with a body of `content_type` (e.g. a merge patch): `(status, body)`.
    pub fn req_with(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &serde_json::Value,
    ) -> (u16, String) {
        self.request(method, path, content_type, Some(body))
    }

    /// A kubeconfig at `path` for this kube-apiserver, as kubeadm's admin.conf: its serving
    /// certificate as the authority, the static token as the user.
    pub fn write_kubeconfig(&self, path: &Path) {
        let ca = std::fs::read(self.dir.path().join("certs/apiserver.crt"))
            .expect("kube-apiserver's self-signed serving certificate");
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: admin@kubernetes\n  context: {{cluster: kubernetes, user: admin}}\ncurrent-context: admin@kubernetes\nusers:\n- name: admin\n  user: {{token: {TOKEN}}}\n",
                self.url
            ),
        )
        .unwrap();
    }
}

/// An EncryptionConfiguration for Secrets with these aescbc keys (the first encrypts), identity last.
pub fn encryption_config(path: &Path, keys: &[&str]) {
    let keys: String = keys
        .iter()
        .map(|k| {
            let secret =
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("{k:-<32}"));
            format!("      - name: {k}\n        secret: {secret}\n")
        })
        .collect();
    std::fs::write(
        path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n{keys}  - identity: {{}}\n"
        ),
    )
    .unwrap();
}

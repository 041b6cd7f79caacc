//! kubeadm itself (1.37.2, built from k8s.io/kubernetes by scripts/deps.sh, `KUBEADM_BIN`) renders
//! the etcd static pod with the shipped patches (kubeadm/patches) and configuration lines
//! (kubeadm/kubeadm-config.yaml), in a root of the test's own (`--rootfs`): the manifest runs the
//! warden in front of kubeadm's own etcd command line, on /var/lib/etcd/data, with the probes on
//! the warden.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;

fn kubeadm() -> PathBuf {
    let p = std::env::var_os("KUBEADM_BIN")
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(
        p.is_file(),
        "KUBEADM_BIN is not set to kubeadm: run `source scripts/deps.sh && need_kube_apiserver` (scripts/test does)"
    );
    p
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// kubeadm's configuration for `init` on this node: the shipped lines, with the patches where the
/// root has them and the node's own address and name, as an operator's configuration adds them.
fn init_config(patches: &str) -> String {
    let shipped = std::fs::read_to_string(repo("kubeadm/kubeadm-config.yaml")).unwrap();
    let mut docs = Vec::new();
    for doc in shipped.split("\n---\n") {
        let mut v: Value = serde_yaml_ng::from_str(doc).unwrap();
        match v["kind"].as_str() {
            Some("InitConfiguration") => {
                assert!(
                    v["patches"]["directory"].is_string(),
                    "the shipped InitConfiguration names the patches: {doc}"
                );
                v["patches"]["directory"] = patches.into();
                let mut endpoint = serde_yaml_ng::Mapping::new();
                endpoint.insert("advertiseAddress".into(), "10.0.0.11".into());
                v["localAPIEndpoint"] = Value::Mapping(endpoint);
                let mut node = serde_yaml_ng::Mapping::new();
                node.insert("name".into(), "cp-1".into());
                v["nodeRegistration"] = Value::Mapping(node);
            }
            // `join` reads this one; `init` would refuse it beside an InitConfiguration.
            Some("JoinConfiguration") => {
                assert!(
                    v["patches"]["directory"].is_string(),
                    "the shipped JoinConfiguration names the patches: {doc}"
                );
                continue;
            }
            _ => {}
        }
        docs.push(serde_yaml_ng::to_string(&v).unwrap());
    }
    docs.join("---\n")
}

#[test]
fn kubeadm_renders_the_etcd_pod_with_the_warden_in_front_of_etcd() {
    let root = tempfile::tempdir().unwrap();
    let patches = root.path().join("etcd-warden-patches");
    std::fs::create_dir(&patches).unwrap();
    for e in std::fs::read_dir(repo("kubeadm/patches")).unwrap().flatten() {
        std::fs::copy(e.path(), patches.join(e.file_name())).unwrap();
    }
    std::fs::write(
        root.path().join("kubeadm.yaml"),
        init_config("/etcd-warden-patches"),
    )
    .unwrap();
    let out = Command::new(kubeadm())
        .args(["init", "phase", "etcd", "local", "--rootfs"])
        .arg(root.path())
        .args(["--config", "/kubeadm.yaml"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubeadm init phase etcd local:\n{said}");
    assert!(
        said.contains("Applied patch of type \"application/strategic-merge-patch+json\" to target \"etcd\"")
            && said.contains("Applied patch of type \"application/json-patch+json\" to target \"etcd\""),
        "kubeadm did not apply both patches:\n{said}"
    );
    let manifest = std::fs::read_to_string(root.path().join("etc/kubernetes/manifests/etcd.yaml")).unwrap();
    let pod: Value = serde_yaml_ng::from_str(&manifest).unwrap();
    let c = &pod["spec"]["containers"][0];
    let command: Vec<&str> = c["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // The warden, then kubeadm's own etcd command line, whole.
    assert_eq!(command[..4], ["etcd-warden", "run", "--", "etcd"], "{manifest}");
    for flag in [
        "--data-dir=/var/lib/etcd/data",
        "--name=cp-1",
        "--client-cert-auth=true",
        "--cert-file=/etc/kubernetes/pki/etcd/server.crt",
        "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.11:2379",
    ] {
        assert!(
            command.contains(&flag),
            "kubeadm's {flag} is missing: {command:?}"
        );
    }
    assert_eq!(
        c["image"].as_str(),
        Some("registry.example.com/etcd-warden:VERSION")
    );
    let probe = |name: &str| {
        (
            c[name]["httpGet"]["path"].as_str(),
            c[name]["httpGet"]["port"].as_u64(),
        )
    };
    assert_eq!(probe("startupProbe"), (Some("/livez"), Some(2378)), "{manifest}");
    assert_eq!(probe("livenessProbe"), (Some("/livez"), Some(2378)), "{manifest}");
    assert_eq!(
        probe("readinessProbe"),
        (Some("/readyz"), Some(2378)),
        "{manifest}"
    );
    let env: Vec<(&str, &str)> = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert!(env.contains(&("ETCD_WARDEN_LISTEN", "127.0.0.1:2378")), "{env:?}");
    assert_eq!(
        pod["spec"]["terminationGracePeriodSeconds"].as_u64(),
        Some(90),
        "a graceful stop outlasts kubelet's default 30 s"
    );
    // The data volume is /var/lib/etcd whole: the data dir is no mount of its own, so the warden can
    // move it aside and restore beside it.
    let mounts: Vec<(&str, &str)> = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    assert!(mounts.contains(&("etcd-data", "/var/lib/etcd")), "{mounts:?}");
    assert!(
        !mounts.iter().any(|(_, p)| *p == "/var/lib/etcd/data"),
        "the data dir is a mount of its own: {mounts:?}"
    );
    let volume = pod["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "etcd-data")
        .unwrap();
    assert_eq!(volume["hostPath"]["path"].as_str(), Some("/var/lib/etcd"));
}

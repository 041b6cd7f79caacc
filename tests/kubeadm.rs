//! kubeadm itself (1.37.2, built from k8s.io/kubernetes by scripts/deps.sh, `KUBEADM_BIN`) renders
//! the etcd static pod with the shipped patches (kubeadm/patches) and configuration lines
//! (kubeadm/kubeadm-config.yaml), in a root of the test's own (`--rootfs`): the manifest runs the
//! warden in front of kubeadm's own etcd command line, on /var/lib/etcd/data, with the probes on
//! the warden.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::kube::{Kube, openssl};
use common::netns::Netns;
use common::podman::Podman;
use common::*;
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

/// How a node comes into the cluster: `kubeadm init` (the first control-plane node) or `kubeadm
/// join --control-plane` (the others).
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Init,
    Join,
}

/// The patches directory inside a node's root.
const PATCHES: &str = "/etcd-warden-patches";

/// kubeadm's configuration on a node: the shipped lines, each naming the patches where the
/// root has them, with the node's own name and address added as an operator's configuration
/// adds them. `init` keeps the InitConfiguration (a JoinConfiguration beside it is refused);
/// `join` keeps the JoinConfiguration, discovering the cluster from /etc/kubernetes/discovery.conf
/// (the ClusterConfiguration then comes from the cluster, as kubeadm init uploaded it).
fn node_config(role: Role, name: &str, ip: &str) -> String {
    let shipped = std::fs::read_to_string(repo("kubeadm/kubeadm-config.yaml")).unwrap();
    let mut docs = Vec::new();
    let map = |pairs: &[(&str, Value)]| {
        let mut m = serde_yaml_ng::Mapping::new();
        for (k, v) in pairs {
            m.insert((*k).into(), v.clone());
        }
        Value::Mapping(m)
    };
    let mut kinds = Vec::new();
    for doc in shipped.split("\n---\n") {
        let mut v: Value = serde_yaml_ng::from_str(doc).unwrap();
        let kind = v["kind"].as_str().unwrap_or_default().to_owned();
        kinds.push(kind.clone());
        let node = map(&[("name", name.into())]);
        match kind.as_str() {
            "InitConfiguration" | "JoinConfiguration" => {
                assert!(
                    v["patches"]["directory"].is_string(),
                    "the shipped {kind} names the patches: {doc}"
                );
                v["patches"]["directory"] = PATCHES.into();
                v["nodeRegistration"] = node;
                let endpoint = map(&[("advertiseAddress", ip.into()), ("bindPort", 6443.into())]);
                if kind == "InitConfiguration" {
                    if role != Role::Init {
                        continue;
                    }
                    v["localAPIEndpoint"] = endpoint;
                } else {
                    if role != Role::Join {
                        continue;
                    }
                    v["controlPlane"] = map(&[("localAPIEndpoint", endpoint)]);
                    v["discovery"] = map(&[(
                        "file",
                        map(&[("kubeConfigPath", "/etc/kubernetes/discovery.conf".into())]),
                    )]);
                }
            }
            // `kubeadm upgrade apply|node --config`: the patches for the manifests it writes again.
            "UpgradeConfiguration" => {
                for part in ["apply", "node"] {
                    assert!(
                        v[part]["patches"]["directory"].is_string(),
                        "the shipped UpgradeConfiguration names the patches for `upgrade {part}`: {doc}"
                    );
                    v[part]["patches"]["directory"] = PATCHES.into();
                }
            }
            // Uploaded by `init`; `join` and the upgrades read it back from the cluster.
            "ClusterConfiguration" if role == Role::Join => continue,
            _ => {}
        }
        docs.push(serde_yaml_ng::to_string(&v).unwrap());
    }
    for kind in [
        "InitConfiguration",
        "JoinConfiguration",
        "ClusterConfiguration",
        "UpgradeConfiguration",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "kubeadm/kubeadm-config.yaml has no {kind}"
        );
    }
    docs.join("---\n")
}

/// A control-plane node's root for kubeadm's `--rootfs`: the shipped patches in
/// /etcd-warden-patches, the configuration in /kubeadm.yaml, and what kubeadm writes
/// (/etc/kubernetes/...).
struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        Self::with(Role::Init, "cp-1", NODE_IP)
    }

    fn with(role: Role, name: &str, ip: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let patches = root.path().join(PATCHES.trim_start_matches('/'));
        std::fs::create_dir(&patches).unwrap();
        for e in std::fs::read_dir(repo("kubeadm/patches")).unwrap().flatten() {
            std::fs::copy(e.path(), patches.join(e.file_name())).unwrap();
        }
        std::fs::write(root.path().join("kubeadm.yaml"), node_config(role, name, ip)).unwrap();
        std::fs::create_dir_all(root.path().join("etc/kubernetes/manifests")).unwrap();
        Node { root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel.trim_start_matches('/'))
    }

    /// `kubeadm ARGS --rootfs ROOT --config /kubeadm.yaml`: what it said; a failure fails the test.
    fn kubeadm(&self, args: &[&str]) -> String {
        self.kubeadm_env(args, &[])
    }

    /// The same with variables set; bounded in time (discovery retries for minutes).
    fn kubeadm_env(&self, args: &[&str], vars: &[(&str, &str)]) -> String {
        let out = Command::new("timeout")
            .args(["-s", "KILL", "120"])
            .arg(kubeadm())
            .args(args)
            .arg("--rootfs")
            .arg(self.root.path())
            .args(["--config", "/kubeadm.yaml"])
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "kubeadm {} ({}):\n{said}",
            args.join(" "),
            out.status
        );
        said
    }

    /// `kubeadm init phase etcd local`: the etcd manifest as kubeadm wrote it, after checking
    /// that kubeadm applied both shipped patches.
    fn render_etcd(&self) -> String {
        let said = self.kubeadm(&["init", "phase", "etcd", "local"]);
        assert_patched(&said);
        std::fs::read_to_string(self.path("etc/kubernetes/manifests/etcd.yaml")).unwrap()
    }
}

/// kubeadm said it applied both shipped patches to the etcd manifest.
fn assert_patched(said: &str) {
    assert!(
        said.contains("Applied patch of type \"application/strategic-merge-patch+json\" to target \"etcd\"")
            && said.contains("Applied patch of type \"application/json-patch+json\" to target \"etcd\""),
        "kubeadm did not apply both patches:\n{said}"
    );
}

/// The etcd container's command line of a rendered manifest.
fn command_of(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn kubeadm_renders_the_etcd_pod_with_the_warden_in_front_of_etcd() {
    let manifest = Node::new().render_etcd();
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
        Some(IMAGE),
        "the image's tag is the etcd version inside, which `kubeadm upgrade` compares"
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
    // The store on the data volume, not in the image's own /var/lib/etcd-backups, which no
    // volume backs here: it would go with the container.
    assert!(
        env.contains(&("ETCD_WARDEN_STORE", "file:///var/lib/etcd/data.backups")),
        "{env:?}"
    );
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

/// kubeadm's etcd flags name the node's address, 10.0.0.11 (init_config).
const NODE_IP: &str = "10.0.0.11";
/// The image name the shipped patch gives; the test tags its image so.
const IMAGE: &str = "registry.example.com/etcd-warden:3.6.16-0";

/// The start-up window of the container `c`: how long the kubelet lets its startupProbe fail
/// before it kills the container (kubeadm's initialDelaySeconds + failureThreshold × periodSeconds).
fn startup_window(c: &Value) -> Duration {
    let p = &c["startupProbe"];
    let n = |k: &str, default: u64| p[k].as_u64().unwrap_or(default);
    Duration::from_secs(n("initialDelaySeconds", 0) + n("failureThreshold", 3) * n("periodSeconds", 10))
}

/// `etcdctl ARGS` inside `ns` against kubeadm's etcd, with kubeadm's own client certificate (the
/// one its health checks use).
fn kubeadm_etcdctl(ns: &Netns, node: &Node, args: &[&str]) -> Result<String, String> {
    let pki = node.path("etc/kubernetes/pki/etcd");
    let out = ns
        .cmd(etcdctl_for(&default_etcd()).to_str().unwrap())
        .arg("--endpoints=https://127.0.0.1:2379")
        .arg(format!("--cacert={}", pki.join("ca.crt").display()))
        .arg(format!("--cert={}", pki.join("healthcheck-client.crt").display()))
        .arg(format!("--key={}", pki.join("healthcheck-client.key").display()))
        .args(["--command-timeout=5s", "--dial-timeout=3s"])
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `/readyz` of the warden inside `ns` (127.0.0.1:2378, as the patch sets it).
fn ready(ns: &Netns) -> Option<(u16, String)> {
    ns.run(|| http_get("127.0.0.1:2378", "/readyz"))
}

/// The pod kubeadm rendered, run by a real Pod runner: Podman's `kube play` (the kubelet needs a
/// systemd and a CRI runtime these machines lack; see docs/kubernetes.md), with the image
/// scripts/container-image builds tagged as the patch names it, in a network namespace of the
/// test's own (kubeadm's ports are fixed) holding the node's address. Only the host side of the
/// hostPath volumes moves into the test's root; the container sees kubeadm's paths. Driven as a
/// kubelet would: the pod comes ready; etcd killed inside is restarted by the warden with every
/// write; a deletion (SIGTERM, kubeadm's grace) stops it gracefully; the data dir deleted on the
/// node is restored at the next start from the store on the data volume, within the startup
/// probe's window, with every acknowledged write.
#[test]
fn the_pod_kubeadm_renders_runs_under_podman_and_survives_etcd_killed_and_the_data_dir_lost() {
    let node = Node::new();
    for cert in ["etcd-ca", "etcd-server", "etcd-peer", "etcd-healthcheck-client"] {
        node.kubeadm(&["init", "phase", "certs", cert]);
    }
    let manifest = node.render_etcd();
    let mut pod: Value = serde_yaml_ng::from_str(&manifest).unwrap();
    let window = startup_window(&pod["spec"]["containers"][0]);
    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap();
    for v in pod["spec"]["volumes"].as_sequence_mut().unwrap() {
        let host = v["hostPath"]["path"].as_str().unwrap().to_owned();
        let moved = node.path(&host);
        std::fs::create_dir_all(&moved).unwrap();
        v["hostPath"]["path"] = moved.display().to_string().into();
    }
    let pod_yaml = node.path("pod.yaml");
    std::fs::write(&pod_yaml, serde_yaml_ng::to_string(&pod).unwrap()).unwrap();
    let pod_yaml = pod_yaml.to_str().unwrap();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let ctr = format!("{name}-etcd");

    let ns = Netns::new(&[NODE_IP]);
    let mut podman = Podman::new().in_netns(ns.pid());
    podman.build_image(IMAGE);
    let play = |podman: &mut Podman| {
        podman.pods.push(name.clone());
        let t = Instant::now();
        podman.run(&["kube", "play", pod_yaml]);
        wait_for(
            &format!("the warden of pod {name} to answer /readyz 200 within the startup window {window:?}"),
            window,
            || match ready(&ns) {
                Some((200, _)) => Some(()),
                _ => {
                    let state = podman.inspect(&ctr, "{{.State.Status}}");
                    assert_eq!(state, "running", "container {ctr} is {state} before it was ready");
                    None
                }
            },
        );
        t.elapsed()
    };
    let first = play(&mut podman);
    eprintln!("kube play → /readyz 200: {first:?} (window {window:?})");

    let mut acked = Vec::new();
    let write = |acked: &mut Vec<String>, from: usize, to: usize| {
        for i in from..to {
            let key = format!("/registry/configmaps/w/c{i:03}");
            if kubeadm_etcdctl(&ns, &node, &["put", &key, "v"]).is_ok() {
                acked.push(key);
            }
        }
    };
    write(&mut acked, 0, 20);
    assert_eq!(acked.len(), 20, "writes through kubeadm's etcd failed");

    // etcd killed inside the pod: the warden (the container's init) starts it again.
    let warden: i32 = podman
        .inspect(&ctr, "{{.State.Pid}}")
        .parse()
        .expect("podman inspect .State.Pid");
    let etcd = children_of(warden)
        .into_iter()
        .find(|(_, _, comm)| comm == "etcd")
        .map(|(pid, _, _)| pid)
        .unwrap_or_else(|| panic!("no etcd under the warden {warden}: {:?}", children_of(warden)));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(etcd),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for(
        "a new etcd under the warden, ready again, after etcd was killed",
        Duration::from_secs(60),
        || {
            let again = children_of(warden)
                .into_iter()
                .any(|(pid, _, comm)| comm == "etcd" && pid != etcd);
            (again && matches!(ready(&ns), Some((200, _)))).then_some(())
        },
    );
    assert_eq!(
        podman.inspect(&ctr, "{{.State.Pid}}"),
        warden.to_string(),
        "the container was restarted, not etcd alone"
    );
    write(&mut acked, 20, 40);

    // The pod deleted: SIGTERM and kubeadm's grace, as the kubelet stops it.
    let t = Instant::now();
    podman.run(&["pod", "stop", "--time", &grace.to_string(), &name]);
    let stop_took = t.elapsed();
    let log = podman.logs(&ctr);
    assert_eq!(
        podman.inspect(&ctr, "{{.State.ExitCode}}"),
        "143",
        "etcd's graceful status, not a kill:\n{log}"
    );
    let kills: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("signalled etcd") && l.contains("SIGKILL"))
        .collect();
    assert!(
        log.contains("signalled etcd") && kills.is_empty(),
        "no graceful stop of etcd (SIGTERM, no SIGKILL): {kills:?}\n{log}"
    );
    podman.run(&["kube", "down", pod_yaml]);
    podman.pods.retain(|p| *p != name);

    // The node's data dir lost; the backups stay on the data volume beside it.
    let data = node.path("var/lib/etcd/data");
    assert!(
        data.join("member").is_dir(),
        "etcd's data is not where kubeadm's dataDir says"
    );
    assert!(
        node.path("var/lib/etcd/data.backups").is_dir(),
        "no store on the data volume"
    );
    std::fs::remove_dir_all(&data).unwrap();
    let second = play(&mut podman);
    eprintln!("kube play with the data dir lost → /readyz 200: {second:?}; graceful stop {stop_took:?}");
    let log = podman.logs(&ctr);
    let restored = log
        .lines()
        .find(|l| l.contains("data dir restored"))
        .unwrap_or_else(|| panic!("no restore at the pod's start:\n{log}"));
    eprintln!("{restored}");
    let mut found: Vec<String> =
        kubeadm_etcdctl(&ns, &node, &["get", "/registry/", "--prefix", "--keys-only"])
            .expect("read back after the restore")
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
    found.sort();
    assert_none_lost(&acked, &found, "the restore at the pod's start");
    podman.run(&["pod", "stop", "--time", &grace.to_string(), &name]);
}

/// A kubelet's kubeconfig for `name` at `path`: kubeadm reads the node's name from its client
/// certificate (`system:node:NAME`).
fn kubelet_conf(path: &Path, name: &str, server: &str) {
    let dir = path.parent().unwrap();
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "kubelet.key",
            "-out",
            "kubelet.crt",
            "-days",
            "1",
            "-subj",
            &format!("/O=system:nodes/CN=system:node:{name}"),
        ],
        dir,
    );
    let b64 = |f: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join(f)).unwrap())
    };
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster: {{server: {server}, insecure-skip-tls-verify: true}}\ncontexts:\n- name: node\n  context: {{cluster: kubernetes, user: node}}\ncurrent-context: node\nusers:\n- name: node\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64("kubelet.crt"),
            b64("kubelet.key")
        ),
    )
    .unwrap();
}

/// kubeadm's other ways to write the etcd manifest, against a real kube-apiserver (over the
/// warden's etcd) holding what `kubeadm init` uploads:
/// - `kubeadm join --control-plane` (its dry run, which renders the manifest it would write)
///   puts the warden in front of etcd on the dataDir it reads back from the cluster, with the
///   JoinConfiguration's patches;
/// - `kubeadm upgrade apply` and `kubeadm upgrade node` given the shipped file read the patches
///   from its UpgradeConfiguration. Their dry runs render the control plane only; for etcd the
///   real upgrade calls the renderer `init` uses (`CreateLocalEtcdStaticPodManifestFile`, in
///   kubeadm's phases/upgrade/staticpods.go) with this same directory and the cluster's
///   ClusterConfiguration, which the first test and the join cover.
#[test]
fn kubeadm_join_and_both_upgrades_write_the_warden_from_the_cluster_configuration_and_the_patches() {
    // kubeadm refuses a loopback address for the node, so the node's address (kube-apiserver's,
    // the warden's and etcd's) lives in a network namespace of the test's own, and the whole
    // test runs there.
    let ns = Netns::new(&[NODE_IP]);
    ns.run(|| join_and_upgrades(NODE_IP));
}

fn join_and_upgrades(ip: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (_warden, _store) = warden_with_file_store(&default_etcd(), ip, dir.path(), &[]);
    let kube = Kube::start(ip, &[ip.to_owned()]);
    let admin = ["--kubeconfig", "/etc/kubernetes/admin.conf"];

    // cp-1, after `kubeadm init`: what init uploads (its ClusterConfiguration, the kubelets'
    // configuration, the cluster-info `join` discovers) and the manifests it wrote. Its address
    // is kube-apiserver's: kubeadm init talks to the API server on the node's own address.
    let cp1 = Node::with(Role::Init, "cp-1", ip);
    kube.write_kubeconfig(&cp1.path("etc/kubernetes/admin.conf"));
    for phase in [
        &["upload-config", "kubeadm"][..],
        &["upload-config", "kubelet"],
        &["bootstrap-token", "--skip-token-print"],
    ] {
        let args: Vec<&str> = ["init", "phase"]
            .iter()
            .chain(phase)
            .chain(&admin)
            .copied()
            .collect();
        cp1.kubeadm(&args);
    }
    let cm = kube.json(
        "GET",
        "/api/v1/namespaces/kube-system/configmaps/kubeadm-config",
        None,
    );
    assert!(
        cm["data"]["ClusterConfiguration"]
            .as_str()
            .is_some_and(|c| c.contains("dataDir: /var/lib/etcd/data")),
        "kubeadm uploaded no dataDir of the warden's layout: {cm}"
    );
    cp1.kubeadm(&["init", "phase", "control-plane", "all"]);
    let etcd_before = cp1.render_etcd();

    // cp-2 joins as a control-plane node. The phases skipped need a kubelet, a container
    // runtime, or write the node's own certificates and kubeconfigs (a dry run would refuse the
    // admin.conf given to it).
    let cp2 = Node::with(Role::Join, "cp-2", "10.0.0.12");
    kube.write_kubeconfig(&cp2.path("etc/kubernetes/discovery.conf"));
    std::fs::create_dir_all(cp2.path("dry")).unwrap();
    kube.write_kubeconfig(&cp2.path("dry/admin.conf"));
    let said = cp2.kubeadm_env(
        &[
            "join",
            "--dry-run",
            "--skip-phases=preflight,control-plane-prepare,kubelet-start,kubelet-wait-bootstrap,wait-control-plane",
        ],
        &[("KUBEADM_JOIN_DRYRUN_DIR", "/dry")],
    );
    assert_patched(&said);
    assert!(
        said.contains("[etcd] Would add etcd member: https://10.0.0.12:2380"),
        "{said}"
    );
    let joined = std::fs::read_to_string(cp2.path("dry/etcd.yaml"))
        .unwrap_or_else(|e| panic!("kubeadm join wrote no etcd manifest ({e}):\n{said}"));
    let pod: Value = serde_yaml_ng::from_str(&joined).unwrap();
    let command = command_of(&pod);
    assert_eq!(command[..4], ["etcd-warden", "run", "--", "etcd"], "{joined}");
    for flag in [
        "--data-dir=/var/lib/etcd/data",
        "--name=cp-2",
        "--initial-advertise-peer-urls=https://10.0.0.12:2380",
    ] {
        assert!(
            command.iter().any(|c| c == flag),
            "the joined manifest lacks {flag}: {command:?}"
        );
    }
    let c = &pod["spec"]["containers"][0];
    assert_eq!(
        c["readinessProbe"]["httpGet"]["port"].as_u64(),
        Some(2378),
        "{joined}"
    );
    assert_eq!(
        c["startupProbe"]["httpGet"]["path"].as_str(),
        Some("/livez"),
        "{joined}"
    );

    // Upgrades on cp-1: the node as kubeadm finds it in the cluster (its Node with the kubelet's
    // version, its kube-apiserver's mirror pod with the advertised endpoint, its kubelet.conf).
    kube.json(
        "POST",
        "/api/v1/namespaces/kube-system/serviceaccounts",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})),
    );
    kube.json(
        "POST",
        "/api/v1/nodes",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cp-1"}})),
    );
    let (code, body) = kube.req_with(
        "PATCH",
        "/api/v1/nodes/cp-1/status",
        "application/merge-patch+json",
        &serde_json::json!({"status": {"nodeInfo": {"kubeletVersion": "v1.37.2"}}}),
    );
    assert_eq!(code, 200, "{body}");
    kube.json(
        "POST",
        "/api/v1/namespaces/kube-system/pods",
        Some(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kube-apiserver-cp-1",
                "labels": {"component": "kube-apiserver", "tier": "control-plane"},
                "annotations": {"kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": format!("{ip}:6443")}},
            "spec": {"nodeName": "cp-1", "containers": [{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.37.2"}]}})),
    );
    kubelet_conf(&cp1.path("etc/kubernetes/kubelet.conf"), "cp-1", &kube.url);
    for (what, args, dry) in [
        (
            "upgrade node",
            &["upgrade", "node", "--dry-run", "--ignore-preflight-errors=all"][..],
            ("KUBEADM_UPGRADE_DRYRUN_DIR", "/dry-node"),
        ),
        (
            "upgrade apply",
            &[
                "upgrade",
                "apply",
                "v1.37.2",
                "--dry-run",
                "--yes",
                "--ignore-preflight-errors=all",
            ],
            ("KUBEADM_UPGRADE_DRYRUN_DIR", "/dry-apply"),
        ),
    ] {
        let said = cp1.kubeadm_env(args, &[dry]);
        assert!(
            said.contains(&format!("[patches] Reading patches from path \"{PATCHES}\""))
                && said.contains("Found the following patch files: [etcd0+strategic.yaml etcd1+json.json]"),
            "`kubeadm {what} --config` did not take the shipped patches:\n{said}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(cp1.path("etc/kubernetes/manifests/etcd.yaml")).unwrap(),
        etcd_before,
        "a dry run changed the etcd manifest"
    );
}

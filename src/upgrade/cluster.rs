//! A cluster member's release against what its peers run. The data dir tells which storage the
//! member wrote; the peers tell where the cluster is: etcd's cluster version (the lowest minor
//! every member runs, or the target of an enabled downgrade) and each member's release. A member
//! may start one minor above the cluster version at most (etcd refuses more, or worse), never
//! below it unless a downgrade to its minor is enabled, and a step to the next minor needs every
//! member at the patch release etcd requires for it (3.5.26 before 3.6).
//!
//! The peers are asked at etcd's peer listener (`GET /version`: `etcdserver`, `etcdcluster`;
//! plain http, no quorum needed) and, for TLS peers, through `--cluster-endpoints` (each member's
//! release from its status; the cluster version is then the lowest minor among them).

use crate::cluster::peers;
use crate::etcd::version::Version;
use crate::startup::member::MemberConfig;

use super::{UpgradePath, minimum_before_next};

/// One other member's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRelease {
    /// Its peer or client URL.
    pub at: String,
    pub server: Version,
    /// The cluster version it reported (`etcdcluster`), when asked at its peer listener.
    pub cluster: Option<Version>,
}

#[derive(serde::Deserialize)]
struct VersionAnswer {
    etcdserver: String,
    etcdcluster: String,
}

/// How long one member may take to say its release.
const ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// What the other members answered; those that did not are skipped (logged).
pub async fn peer_releases(cfg: &MemberConfig) -> Vec<PeerRelease> {
    let Ok(me) = crate::startup::cluster::me(cfg) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for peer in &me.others {
        match peers::peer_get(peer, "/version").await {
            Ok(body) => match serde_json::from_slice::<VersionAnswer>(&body) {
                Ok(v) => {
                    if let Some(server) = Version::parse(&v.etcdserver) {
                        out.push(PeerRelease {
                            at: peer.clone(),
                            server,
                            // "not_decided" until the cluster has a version.
                            cluster: Version::parse(&v.etcdcluster),
                        });
                    }
                }
                Err(e) => failures.push(format!("{peer}/version: {e}")),
            },
            Err(e) => failures.push(e),
        }
    }
    if out.is_empty() {
        let ours: Vec<String> = me.client_urls.clone();
        for endpoint in cfg.cluster_endpoints.iter().filter(|e| !ours.contains(e)) {
            let answer = async {
                let mut c = peers::connect(&cfg.client, endpoint).await?;
                let status = c.status().await.map_err(|e| e.to_string())?;
                Version::parse(status.version()).ok_or_else(|| format!("release {:?}", status.version()))
            };
            // One deadline for the whole question: a member that listens but has no quorum yet
            // (it waits for this one to start) must never hold this start up.
            let answer = async {
                tokio::time::timeout(ANSWER, answer)
                    .await
                    .map_err(|_| format!("no answer within {ANSWER:?}"))?
            };
            match answer.await {
                Ok(server) => out.push(PeerRelease {
                    at: endpoint.clone(),
                    server,
                    cluster: None,
                }),
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
    }
    if !failures.is_empty() {
        tracing::info!(unanswered = ?failures, "release check: peers that did not say their release");
    }
    out
}

/// Whether `binary` may join the members that answered. No answer: nothing to check.
pub fn check(binary: Version, peers: &[PeerRelease]) -> UpgradePath {
    let Some(lowest) = peers.iter().map(|p| p.server).min() else {
        return UpgradePath::Supported;
    };
    // etcd reports 3.0 (its minimum) until every member has said its release: undecided, not a
    // cluster at 3.0 (no 3.4+ member runs in one). Taken literally it would refuse the member
    // whose start decides it, forever.
    let cluster = peers
        .iter()
        .filter_map(|p| p.cluster)
        .filter(|c| !(c.major == 3 && c.minor == 0))
        .min()
        .unwrap_or(lowest);
    if binary.major != 3 || cluster.major != 3 {
        return UpgradePath::Supported;
    }
    let (b, c) = (binary.minor, cluster.minor);
    let said = peers
        .iter()
        .map(|p| format!("{} runs {}", p.at, p.server))
        .collect::<Vec<_>>()
        .join(", ");
    if b > c + 1 {
        return UpgradePath::Unsupported(format!(
            "the cluster version is 3.{c} ({said}) and etcd {binary} joins a cluster one minor below it at most: move every member to 3.{} first",
            c + 1
        ));
    }
    if b < c {
        return UpgradePath::Unsupported(format!(
            "the cluster version is 3.{c} ({said}) and etcd {binary} is older: an older member joins only after etcd's downgrade to 3.{b} \
             is enabled (`etcd-warden downgrade 3.{b} --endpoints ...`), or after a cluster restore of a backup that 3.{b} wrote"
        ));
    }
    if b == c + 1
        && let Some((minimum, why)) = minimum_before_next(c)
    {
        let behind: Vec<String> = peers
            .iter()
            .filter(|p| p.server.minor == c && p.server < minimum)
            .map(|p| format!("{} runs {}", p.at, p.server))
            .collect();
        if !behind.is_empty() {
            return UpgradePath::Unsupported(format!(
                "etcd supports {binary} in a 3.{c} cluster only when every member runs {minimum} or later{why}, and {}: move those members to {minimum} or a newer 3.{c} first",
                behind.join(", ")
            ));
        }
    }
    UpgradePath::Supported
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn peer(server: &str, cluster: Option<&str>) -> PeerRelease {
        PeerRelease {
            at: "http://m2:2380".into(),
            server: v(server),
            cluster: cluster.map(v),
        }
    }

    #[test]
    fn a_member_may_lead_the_cluster_version_by_one_minor_and_never_trail_it() {
        let mid_roll = [peer("3.5.30", Some("3.5.0")), peer("3.6.16", Some("3.5.0"))];
        assert_eq!(check(v("3.6.16"), &mid_roll), UpgradePath::Supported);
        assert!(
            matches!(check(v("3.7.3"), &mid_roll), UpgradePath::Unsupported(m) if m.contains("cluster version is 3.5"))
        );
        let done = [peer("3.6.16", Some("3.6.0")), peer("3.6.16", Some("3.6.0"))];
        assert_eq!(check(v("3.7.3"), &done), UpgradePath::Supported);
        assert!(matches!(check(v("3.5.30"), &done), UpgradePath::Unsupported(m) if m.contains("downgrade")));
        // An enabled downgrade lowers the cluster version to its target.
        let downgrading = [peer("3.6.16", Some("3.5.0"))];
        assert_eq!(check(v("3.5.30"), &downgrading), UpgradePath::Supported);
    }

    #[test]
    fn every_member_must_be_at_the_patch_release_the_next_minor_needs() {
        let old = [peer("3.5.16", Some("3.5.0")), peer("3.5.30", Some("3.5.0"))];
        assert!(
            matches!(check(v("3.6.16"), &old), UpgradePath::Unsupported(m) if m.contains("runs 3.5.16") && m.contains("3.5.26"))
        );
        assert_eq!(check(v("3.5.30"), &old), UpgradePath::Supported);
    }

    #[test]
    fn a_cluster_version_not_decided_yet_refuses_no_one() {
        // etcd 3.5 while a member has not said its release yet (after a cluster restore, the
        // third member started late).
        let undecided = [peer("3.5.16", Some("3.0.0")), peer("3.5.16", Some("3.0.0"))];
        assert_eq!(check(v("3.5.16"), &undecided), UpgradePath::Supported);
        assert!(matches!(
            check(v("3.7.3"), &undecided),
            UpgradePath::Unsupported(_)
        ));
    }

    #[test]
    fn without_a_reported_cluster_version_the_lowest_release_stands_for_it() {
        let tls = [peer("3.5.30", None), peer("3.6.16", None)];
        assert!(matches!(check(v("3.7.3"), &tls), UpgradePath::Unsupported(_)));
        assert_eq!(check(v("3.6.16"), &[]), UpgradePath::Supported);
    }
}

//! What the other members say, before this member's etcd runs: their member lists (etcd's peer
//! endpoint `/members`, plain HTTP, which answers with or without quorum) and, through a voter's
//! client URL, the authoritative list and the membership changes a repair makes.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use crate::etcd::ClientConfig;

/// How long one peer may take to answer.
const ASK: Duration = Duration::from_secs(2);

/// A member as etcd's peer endpoint and its member list describe it.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
pub struct Member {
    #[serde(default)]
    pub id: u64,
    /// Empty in etcd's member list until the member has started (and for added members).
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    /// Empty until the member has started once and published itself through raft.
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl Member {
    /// Has this member ever run (published its client URLs through raft)?
    pub fn started(&self) -> bool {
        !self.client_urls.is_empty()
    }

    pub fn has_peer_url(&self, urls: &[String]) -> bool {
        self.peer_urls.iter().any(|u| urls.iter().any(|o| same_url(u, o)))
    }
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

impl From<&etcd_client::Member> for Member {
    fn from(m: &etcd_client::Member) -> Self {
        Self {
            id: m.id(),
            name: m.name().to_owned(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
        }
    }
}

/// `GET <peer_url>/members`: the member list as that member knows it (no quorum needed).
pub async fn members_from_peer(peer_url: &str) -> Result<Vec<Member>, String> {
    let body = peer_get(peer_url, "/members").await?;
    serde_json::from_slice::<Vec<Member>>(&body).map_err(|e| format!("{peer_url}/members: member list: {e}"))
}

/// `GET <peer_url><path>` on etcd's peer listener (plain http only), within [`ASK`].
pub async fn peer_get(peer_url: &str, path: &str) -> Result<Bytes, String> {
    let url = url::Url::parse(peer_url).map_err(|e| format!("peer URL {peer_url}: {e}"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "peer URL {peer_url}: only plain http peer URLs are asked directly; give the members' client URLs with --cluster-endpoints"
        ));
    }
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port().unwrap_or(2380);
    let ask = async {
        let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", format!("{host}:{port}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        Ok(body)
    };
    match tokio::time::timeout(ASK, ask).await {
        Ok(r) => r.map_err(|e| format!("{peer_url}{path}: {e}")),
        Err(_) => Err(format!("{peer_url}{path}: no answer within {ASK:?}")),
    }
}

/// What the other members said.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    /// The authoritative member list, from a voter of a cluster with a leader, and that voter's
    /// client URL. `None`: no member answered with a leader (no quorum, or none up).
    pub quorum: Option<(Vec<Member>, String)>,
    /// The cluster ID that voter's answers carried (with `quorum`; 0 when it said none).
    pub quorum_cluster: u64,
    /// The member lists the peers' `/members` answered with (no quorum needed).
    pub peer_lists: Vec<(String, Vec<Member>)>,
    /// Why each peer or endpoint that failed did, for the log.
    pub failures: Vec<String>,
}

impl Survey {
    /// The best member list known: the voter's, else the first peer's.
    pub fn members(&self) -> Option<&[Member]> {
        self.quorum
            .as_ref()
            .map(|(m, _)| m.as_slice())
            .or_else(|| self.peer_lists.first().map(|(_, m)| m.as_slice()))
    }

    /// Evidence from the peers that this member (by its peer URLs) ran before.
    pub fn we_started_before(&self, ours: &[String]) -> bool {
        self.peer_lists
            .iter()
            .flat_map(|(_, l)| l)
            .chain(self.quorum.iter().flat_map(|(l, _)| l))
            .any(|m| m.has_peer_url(ours) && m.started())
    }
}

/// Asks the other members: `peers` are their peer URLs (from `--initial-cluster`), `endpoints`
/// client URLs given by the operator (`--cluster-endpoints`); `ours` our own client URLs, skipped.
pub async fn survey(
    client: &ClientConfig,
    peers: &[String],
    endpoints: &[String],
    ours: &[String],
) -> Survey {
    let mut s = Survey::default();
    let mut candidates: Vec<String> = endpoints.to_vec();
    for p in peers {
        match members_from_peer(p).await {
            Ok(list) => {
                for m in list.iter().filter(|m| !m.is_learner) {
                    for c in &m.client_urls {
                        if !candidates.iter().any(|x| same_url(x, c)) {
                            candidates.push(c.clone());
                        }
                    }
                }
                s.peer_lists.push((p.clone(), list));
            }
            Err(e) => s.failures.push(e),
        }
    }
    candidates.retain(|c| !ours.iter().any(|o| same_url(o, c)));
    for endpoint in candidates {
        match voter_view(client, &endpoint).await {
            Ok(Some((list, cluster))) => {
                s.quorum = Some((list, endpoint));
                s.quorum_cluster = cluster;
                break;
            }
            Ok(None) => s.failures.push(format!("{endpoint}: no leader")),
            Err(e) => s.failures.push(format!("{endpoint}: {e}")),
        }
    }
    s
}

/// A client on one other member's client URL, with this warden's TLS and credentials.
pub async fn connect(client: &ClientConfig, endpoint: &str) -> Result<etcd_client::Client, String> {
    let mut cfg = client.clone();
    cfg.endpoints = vec![endpoint.to_owned()];
    cfg.timeout = ASK;
    tokio::time::timeout(ASK * 2, cfg.connect())
        .await
        .map_err(|_| format!("no connection within {:?}", ASK * 2))?
        .map_err(|e| crate::telemetry::error_chain(&e))
}

/// The member list through `endpoint`, if that member sees a leader and is a voter. Every call
/// has its own deadline: a member that accepts connections but is not serving yet (etcd without
/// quorum at boot) holds a request open with no end, and the client's own timeout did not cut it.
async fn voter_view(client: &ClientConfig, endpoint: &str) -> Result<Option<(Vec<Member>, u64)>, String> {
    let within = |what: &str| format!("{what}: no answer within {ASK:?}");
    let mut c = connect(client, endpoint).await?;
    let status = tokio::time::timeout(ASK, c.status())
        .await
        .map_err(|_| within("status"))?
        .map_err(|e| e.to_string())?;
    if status.leader() == 0 || status.is_learner() {
        return Ok(None);
    }
    // A leader that lost its followers still says it leads until its election timeout passes, and
    // answers the member list from its own state: a linearizable read proves the quorum.
    match tokio::time::timeout(ASK, c.get("etcd-warden-quorum-check", None)).await {
        Ok(Ok(_)) => {}
        _ => return Ok(None),
    }
    let list = tokio::time::timeout(ASK, c.member_list())
        .await
        .map_err(|_| within("member list"))?
        .map_err(|e| e.to_string())?;
    let cluster = status.header().map_or(0, |h| h.cluster_id());
    Ok(Some((list.members().iter().map(Member::from).collect(), cluster)))
}

/// Why a membership change failed, as far as the repair cares.
#[derive(Debug)]
pub enum ChangeError {
    /// etcd 3.4/3.5 allow one learner at a time: another member is repairing.
    TooManyLearners,
    /// The member is not there (already removed): the step is done.
    NotFound,
    Other(String),
}

fn change_error(e: etcd_client::Error) -> ChangeError {
    let msg = e.to_string();
    if msg.contains("too many learner members") {
        ChangeError::TooManyLearners
    } else if msg.contains("member not found") {
        ChangeError::NotFound
    } else {
        ChangeError::Other(msg)
    }
}

/// How long a membership change may take (it goes through raft).
const CHANGE: Duration = Duration::from_secs(10);

/// `change` within [`CHANGE`].
async fn bounded<T>(
    change: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ChangeError> {
    tokio::time::timeout(CHANGE, change)
        .await
        .map_err(|_| ChangeError::Other(format!("no answer within {CHANGE:?}")))?
        .map_err(change_error)
}

pub async fn remove(client: &ClientConfig, endpoint: &str, id: u64) -> Result<(), ChangeError> {
    let mut c = connect(client, endpoint).await.map_err(ChangeError::Other)?;
    bounded(c.member_remove(id)).await.map(drop)
}

/// Adds a learner with `peer_urls`; its new member id.
pub async fn add_learner(
    client: &ClientConfig,
    endpoint: &str,
    peer_urls: &[String],
) -> Result<u64, ChangeError> {
    let mut c = connect(client, endpoint).await.map_err(ChangeError::Other)?;
    let opts = etcd_client::MemberAddOptions::new().with_is_learner();
    let r = bounded(c.member_add(peer_urls, Some(opts))).await?;
    r.member()
        .map(|m| m.id())
        .ok_or_else(|| ChangeError::Other("member add answered without the member".into()))
}

pub async fn promote(client: &ClientConfig, endpoint: &str, id: u64) -> Result<(), ChangeError> {
    let mut c = connect(client, endpoint).await.map_err(ChangeError::Other)?;
    bounded(c.member_promote(id)).await.map(drop)
}

/// Gives member `id` these peer URLs (etcd's member update).
pub async fn update(
    client: &ClientConfig,
    endpoint: &str,
    id: u64,
    peer_urls: &[String],
) -> Result<(), ChangeError> {
    let mut c = connect(client, endpoint).await.map_err(ChangeError::Other)?;
    bounded(c.member_update(id, peer_urls.to_vec())).await.map(drop)
}

//! The HTTP endpoints ([`ENDPOINTS`]): on `--listen` (TCP) and on the admin socket
//! (`--admin-socket`, a unix socket with mode 0600, so only its owner can connect).
//!
//! The POSTs are served on the admin socket, and over TCP only with `Authorization: Bearer <token>`
//! matching `--admin-token-file` (401 without it, 403 with a wrong one or when no token file is
//! configured). Nothing on any listener can kill, restore or delete.
//!
//! `/readyz` reads the watch channels at request time, so it turns 503 the moment the supervisor
//! publishes that etcd exited, without waiting for the next health check.
//!
//! A client cannot hold the warden's descriptors: a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`], a connection lives at most [`CONNECTION_LIFETIME`], and each listener
//! serves at most [`MAX_CONNECTIONS`] at once; past that the oldest is closed for the newest, so a
//! probe still gets its answer while idle connections pile up.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::backup::BackupHandle;
use crate::serve::state::Shared;

const PLAIN: &str = "text/plain; charset=utf-8";

/// The most connections one listener serves at once.
pub const MAX_CONNECTIONS: usize = 128;
/// How long a request's headers may take to arrive (an idle connection included).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection is served at most (a scraper's keep-alive reconnects).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// The connections one listener serves, oldest first. A connection holds one of
/// [`MAX_CONNECTIONS`] slots until its task is gone (its socket closed), and a slot is taken before
/// the next accept: when all are held, the oldest connection is closed and its slot awaited, so the
/// listener never holds more sockets than that, however fast clients connect.
#[derive(Clone)]
struct Connections {
    open: Arc<Mutex<Open>>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            open: Arc::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        }
    }
}

#[derive(Default)]
struct Open {
    last_id: u64,
    tasks: VecDeque<(u64, tokio::task::AbortHandle)>,
}

impl Connections {
    /// A free slot, closing the oldest connection while there is none.
    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        loop {
            if let Ok(p) = self.slots.clone().try_acquire_owned() {
                return p;
            }
            let oldest = {
                let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
                open.tasks.pop_front()
            };
            if let Some((_, task)) = oldest {
                task.abort();
            }
            // The closed connection's task gives its slot back when it is dropped.
            let wait = self.slots.clone().acquire_owned();
            if let Ok(Ok(p)) = tokio::time::timeout(Duration::from_millis(100), wait).await {
                return p;
            }
        }
    }

    fn admit(&self, spawn: impl FnOnce(Connections, u64) -> tokio::task::JoinHandle<()>) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.last_id += 1;
        let id = open.last_id;
        // Spawned under the lock, so the task's `done` cannot run before it is listed.
        let handle = spawn(self.clone(), id);
        open.tasks.push_back((id, handle.abort_handle()));
    }

    fn done(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = open.tasks.iter().position(|(c, _)| *c == id) {
            open.tasks.remove(i);
        }
    }
}

const READYZ: &str = "/readyz";
const READY_ALIAS: &str = "/healthz/ready";
const LIVEZ: &str = "/livez";
const STATUS: &str = "/status";
const METRICS: &str = "/metrics";
const SNAPSHOT_FULL: &str = "/snapshot/full";
const SNAPSHOT_DELTA: &str = "/snapshot/delta";
const CLUSTER_LEAVE: &str = "/cluster/leave";
const STANDBY_PROMOTE: &str = "/standby/promote";

/// One endpoint: method, path, where it is served, and what it answers.
#[derive(Debug)]
pub struct Endpoint {
    pub method: &'static str,
    pub path: &'static str,
    pub served: &'static str,
    pub answer: &'static str,
}

const BOTH: &str = "--listen and the admin socket";
const WITH_TOKEN: &str = "the admin socket; --listen with `Authorization: Bearer` and --admin-token-file";

/// Every endpoint `route` serves; docs/reference.md is generated from this table.
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        method: "GET",
        path: READYZ,
        served: BOTH,
        answer: "200 `ready` when etcd is healthy and this host may serve (ownership); else 503 with the reason. Never reflects backups.",
    },
    Endpoint {
        method: "GET",
        path: READY_ALIAS,
        served: BOTH,
        answer: "the same as /readyz",
    },
    Endpoint {
        method: "GET",
        path: LIVEZ,
        served: BOTH,
        answer: "200 `ok` while the warden's own loops are beating; else 503 with the reason",
    },
    Endpoint {
        method: "GET",
        path: STATUS,
        served: BOTH,
        answer: "200 JSON: phase, ready, not_ready_reason, etcd, ownership, backup, member, restore, warden",
    },
    Endpoint {
        method: "GET",
        path: METRICS,
        served: BOTH,
        answer: "200 Prometheus/OpenMetrics text (the metrics below)",
    },
    Endpoint {
        method: "POST",
        path: SNAPSHOT_FULL,
        served: WITH_TOKEN,
        answer: "202 `{\"requested\": \"full\", \"coalesced\": bool}`: a full snapshot, as SIGUSR1; 401 without a token, 403 with a wrong one or none configured",
    },
    Endpoint {
        method: "POST",
        path: SNAPSHOT_DELTA,
        served: WITH_TOKEN,
        answer: "202: a delta flush, as SIGUSR2; 401/403 as above",
    },
    Endpoint {
        method: "POST",
        path: CLUSTER_LEAVE,
        served: "the admin socket only (403 over --listen)",
        answer: "202 `{\"leaving\": true}`: this member leaves its cluster (`etcd-warden ctl leave`)",
    },
];

/// Binds `addr` (so a port clash fails the start, before etcd is spawned).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Binds the admin socket with mode 0600. A stale socket (nobody listening) is replaced; anything
/// else at the path — a live socket, a file, a directory — is an error and is left alone.
pub fn bind_admin(path: &Path) -> Result<UnixListener, String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err("another process is listening on it (stop it or pick another path)".into());
            }
            std::fs::remove_file(path).map_err(|e| format!("remove the stale socket: {e}"))?;
        }
        Ok(_) => {
            return Err("exists and is not a socket (the warden leaves it alone; pick another path)".into());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("{e} (does the directory exist?)"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod 0600: {e}"))?;
    Ok(listener)
}

/// Who is asking: anyone on the network, or the owner of the admin socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Network,
    Socket,
}

/// What the state-changing endpoints can do, and how TCP callers prove they may.
pub struct Actions {
    pub backup: BackupHandle,
    /// `--admin-token-file`, read at each request (so a rotated token applies at once).
    pub token_file: Option<PathBuf>,
    /// `POST /cluster/leave` (admin socket only): the run loop makes this member leave.
    pub leave: tokio::sync::mpsc::Sender<()>,
    /// `POST /standby/promote[?force=true]` (admin socket only): a standby promotes itself (the
    /// flag: forced). `None`: this warden is no standby.
    pub promote: Option<tokio::sync::mpsc::Sender<bool>>,
}

/// Serves TCP connections until cancelled.
pub async fn serve(listener: TcpListener, shared: Shared, actions: Arc<Actions>, cancel: CancellationToken) {
    let conns = Connections::default();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = async {
                let slot = conns.slot().await;
                listener.accept().await.map(|(s, _)| (s, slot))
            } => a,
        };
        match accepted {
            Ok((stream, slot)) => connection(
                stream,
                slot,
                shared.clone(),
                actions.clone(),
                Access::Network,
                &conns,
            ),
            Err(err) => accept_failed(err).await,
        }
    }
}

/// Serves the admin socket until cancelled, then removes it.
pub async fn serve_admin(
    listener: UnixListener,
    path: PathBuf,
    shared: Shared,
    actions: Arc<Actions>,
    cancel: CancellationToken,
) {
    let conns = Connections::default();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => break,
            a = async {
                let slot = conns.slot().await;
                listener.accept().await.map(|(s, _)| (s, slot))
            } => a,
        };
        match accepted {
            Ok((stream, slot)) => connection(
                stream,
                slot,
                shared.clone(),
                actions.clone(),
                Access::Socket,
                &conns,
            ),
            Err(err) => accept_failed(err).await,
        }
    }
    let _ = std::fs::remove_file(&path);
}

async fn accept_failed(err: std::io::Error) {
    tracing::warn!(error = %err, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn connection<S>(
    stream: S,
    slot: tokio::sync::OwnedSemaphorePermit,
    shared: Shared,
    actions: Arc<Actions>,
    access: Access,
    conns: &Connections,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    conns.admit(move |conns, id| {
        tokio::spawn(async move {
            // Given back with the socket, when this task ends or is aborted.
            let _slot = slot;
            let service = service_fn(move |req| {
                let (shared, actions) = (shared.clone(), actions.clone());
                async move { Ok::<_, Infallible>(route(&req, &shared, &actions, access)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                Ok(Err(err)) => tracing::debug!(error = %err, "http connection ended with an error"),
                Ok(Ok(())) => {}
                Err(_) => tracing::debug!("http connection closed after its lifetime"),
            }
            conns.done(id);
        })
    });
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn route(
    req: &Request<Incoming>,
    shared: &Shared,
    actions: &Actions,
    access: Access,
) -> Response<Full<Bytes>> {
    if req.method() == Method::POST {
        return post(req, shared, actions, access);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and POST are served here\n",
            PLAIN,
        );
    }
    match req.uri().path() {
        READYZ | READY_ALIAS => match shared.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n", PLAIN),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"), PLAIN),
        },
        LIVEZ => match shared.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n", PLAIN),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"), PLAIN),
        },
        STATUS => {
            let body = serde_json::to_vec_pretty(&shared.status_json()).unwrap_or_default();
            text(StatusCode::OK, body, "application/json")
        }
        METRICS => text(
            StatusCode::OK,
            crate::serve::metrics::render(shared),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found (try /readyz, /livez, /status or /metrics)\n",
            PLAIN,
        ),
    }
}

/// Equal-time comparison: how much of a guess matched must not show in the response time.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a network caller may not change anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    NoTokenFile,
    Unreadable,
    Missing,
    Wrong,
}

impl Refusal {
    fn response(self) -> Response<Full<Bytes>> {
        let (status, body) = match self {
            Self::NoTokenFile => (
                StatusCode::FORBIDDEN,
                "state-changing requests are not served over TCP without --admin-token-file; use the admin socket (etcd-warden ctl)\n",
            ),
            Self::Unreadable => (StatusCode::FORBIDDEN, "the admin token file cannot be read\n"),
            Self::Missing => (StatusCode::UNAUTHORIZED, "a bearer token is required\n"),
            Self::Wrong => (StatusCode::FORBIDDEN, "wrong token\n"),
        };
        let mut resp = text(status, body, PLAIN);
        if self == Self::Missing {
            resp.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer realm=\"etcd-warden\""),
            );
        }
        resp
    }
}

fn authorize(req: &Request<Incoming>, actions: &Actions) -> Result<(), Refusal> {
    let path = actions.token_file.as_ref().ok_or(Refusal::NoTokenFile)?;
    let token = match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => {
            tracing::error!(path = %path.display(), "cannot read the admin token file; refusing the request");
            return Err(Refusal::Unreadable);
        }
    };
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(Refusal::Missing)?;
    if same(given.trim().as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err(Refusal::Wrong)
    }
}

fn post(
    req: &Request<Incoming>,
    shared: &Shared,
    actions: &Actions,
    access: Access,
) -> Response<Full<Bytes>> {
    if req.uri().path() == CLUSTER_LEAVE {
        // Removing a member from its cluster is never offered over the network.
        if access == Access::Network {
            return text(
                StatusCode::FORBIDDEN,
                "POST /cluster/leave is served on the admin socket only\n",
                PLAIN,
            );
        }
        let queued = actions.leave.try_send(()).is_ok();
        tracing::warn!(queued, "leave requested over the admin socket");
        return text(StatusCode::ACCEPTED, "{\"leaving\": true}\n", "application/json");
    }
    if req.uri().path() == STANDBY_PROMOTE {
        // Creating a second live cluster by mistake is not offered over the network.
        if access == Access::Network {
            return text(
                StatusCode::FORBIDDEN,
                "POST /standby/promote is served on the admin socket only\n",
                PLAIN,
            );
        }
        let Some(promote) = &actions.promote else {
            return text(
                StatusCode::CONFLICT,
                "this warden is not a standby (etcd-warden standby)\n",
                PLAIN,
            );
        };
        if shared
            .standby
            .borrow()
            .as_ref()
            .is_some_and(|s| s.state == crate::standby::State::Promoted)
        {
            return text(StatusCode::CONFLICT, "this standby is already promoted\n", PLAIN);
        }
        let force = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "force=true" || p == "force=1"));
        let queued = promote.try_send(force).is_ok();
        tracing::warn!(force, queued, "promotion requested over the admin socket");
        return text(
            StatusCode::ACCEPTED,
            format!(
                "{}\n",
                json!({ "promoting": true, "force": force, "coalesced": !queued })
            ),
            "application/json",
        );
    }
    let kind = match req.uri().path() {
        SNAPSHOT_FULL => "full",
        SNAPSHOT_DELTA => "delta",
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found (POST /snapshot/full or /snapshot/delta)\n",
                PLAIN,
            );
        }
    };
    if access == Access::Network
        && let Err(refused) = authorize(req, actions)
    {
        tracing::warn!(
            path = req.uri().path(),
            reason = ?refused,
            "refused a state-changing request over TCP"
        );
        return refused.response();
    }
    let queued = match kind {
        "full" => actions.backup.request_full(),
        _ => actions.backup.request_delta(),
    };
    tracing::info!(kind, via = ?access, coalesced = !queued, "snapshot requested over HTTP");
    let body = json!({ "requested": kind, "coalesced": !queued });
    text(StatusCode::ACCEPTED, format!("{body}\n"), "application/json")
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn token_comparison() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3cre"));
        assert!(!same(b"s3cret", b"s3cres"));
        assert!(!same(b"", b"x"));
    }
}

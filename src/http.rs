//! The HTTP endpoints on `--listen`. Read-only: nothing here can kill, restore or delete.
//!
//!     GET /readyz   200 "ready" | 503 reason      (rule 1: etcd's health, never backups)
//!     GET /livez    200 "ok"    | 503 reason      (the warden's own loops are beating)
//!     GET /status   JSON: phase, etcd, ownership, backup, warden
//!     GET /metrics  Prometheus text exposition
//!
//! `/readyz` reads the watch channels at request time, so it turns 503 the moment the supervisor
//! publishes that etcd exited, without waiting for the next health check.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::state::Shared;

/// Binds `addr` (so a port clash fails the start, before etcd is spawned).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until cancelled.
pub async fn serve(listener: TcpListener, shared: Shared, cancel: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&req, &shared)) }
            });
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %err, "http connection ended with an error");
            }
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn route(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served here\n", PLAIN);
    }
    match req.uri().path() {
        "/readyz" | "/healthz/ready" => match shared.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n", PLAIN),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"), PLAIN),
        },
        "/livez" => match shared.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n", PLAIN),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"), PLAIN),
        },
        "/status" => {
            let body = serde_json::to_vec_pretty(&shared.status_json()).unwrap_or_default();
            text(StatusCode::OK, body, "application/json")
        }
        "/metrics" => text(
            StatusCode::OK,
            crate::metrics::render(shared),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found (try /readyz, /livez, /status or /metrics)\n",
            PLAIN,
        ),
    }
}

//! `etcd-warden probe`: exit 0 exactly when the warden's `/readyz` answers 200. For Kubernetes exec
//! probes and container HEALTHCHECKs where no HTTP client is available in the image.

use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use thiserror::Error;

use super::parse_duration_arg;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("--url {url:?}: {reason} (write http://HOST:PORT/readyz)")]
    BadUrl { url: String, reason: String },
    #[error("reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} answered {status}: {body}")]
    NotReady { url: String, status: u16, body: String },
}

impl ProbeError {
    /// 64 for a bad URL (usage), 1 for not ready or unreachable.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::BadUrl { .. } => 64,
            _ => 1,
        }
    }
}

/// Asks `/readyz` once; `Ok` carries the body of a 200.
pub async fn probe(url: &str, timeout: Duration) -> Result<String, ProbeError> {
    let parsed = url::Url::parse(url).map_err(|e| ProbeError::BadUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    if parsed.scheme() != "http" {
        return Err(ProbeError::BadUrl {
            url: url.to_owned(),
            reason: format!(
                "scheme {:?} is not served (the warden speaks plain http)",
                parsed.scheme()
            ),
        });
    }
    let host = parsed.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = parsed.port().unwrap_or(80);
    let unreachable = |reason: String| ProbeError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let ask = async {
        let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(conn);
        let req = Request::get(parsed.path())
            .header("host", format!("{host}:{port}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
            .unwrap_or_default();
        if status == 200 {
            Ok(body)
        } else {
            Err(ProbeError::NotReady {
                url: url.to_owned(),
                status,
                body,
            })
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        ))),
    }
}

pub const DEFAULT_PROBE_URL: &str = "http://127.0.0.1:2378/readyz";

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The warden's readiness URL.
    #[arg(long, env = "ETCD_WARDEN_PROBE_URL", default_value = DEFAULT_PROBE_URL)]
    pub url: String,
    /// Give up after this long.
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    pub timeout: Duration,
}

/// Runs `probe`.
pub fn main(args: ProbeArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("etcd-warden: start runtime: {err}");
            return 1;
        }
    };
    match runtime.block_on(probe(&args.url, args.timeout)) {
        Ok(body) => {
            println!("{body}");
            0
        }
        Err(err) => {
            eprintln!("etcd-warden: {err}");
            err.exit_code()
        }
    }
}

//! `etcd-warden ctl`: the admin socket's client. `status` prints /status; `snapshot full|delta`
//! asks for a snapshot and, with `--wait`, follows /status until it is in the store; `leave`
//! takes this member out of its cluster.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use clap::{Args, Subcommand};

use super::parse_duration_arg;

/// One request over the unix socket: `(status, body)`.
pub async fn request(socket: &Path, method: Method, path: &str) -> Result<(u16, String), String> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "connect to {}: {e} (is the warden running with --admin-socket?)",
            socket.display()
        )
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "etcd-warden")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

async fn status(socket: &Path) -> Result<serde_json::Value, String> {
    let (code, body) = request(socket, Method::GET, "/status").await?;
    if code != 200 {
        return Err(format!("/status answered {code}: {}", body.trim()));
    }
    serde_json::from_str(&body).map_err(|e| format!("/status is not JSON: {e}"))
}

/// Runs `ctl`; returns the exit code (0 done, 1 failed).
pub async fn ctl(args: CtlArgs) -> i32 {
    let socket = args.admin_socket.as_path();
    let result = match args.command {
        CtlCommand::Status => status(socket)
            .await
            .map(|s| println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default())),
        CtlCommand::Snapshot { kind, wait, timeout } => snapshot(socket, kind, wait, timeout).await,
        CtlCommand::Leave { timeout } => leave(socket, timeout).await,
        CtlCommand::Promote { force, timeout } => promote(socket, force, timeout).await,
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("etcd-warden ctl: {e}");
            1
        }
    }
}

/// Asks the warden to leave its cluster and waits until it has (it exits: its socket is gone).
async fn leave(socket: &Path, timeout: Duration) -> Result<(), String> {
    let (code, body) = request(socket, Method::POST, "/cluster/leave").await?;
    if code != 202 {
        return Err(format!("/cluster/leave answered {code}: {}", body.trim()));
    }
    let started = Instant::now();
    let deadline = started + timeout;
    let mut seen = false;
    while Instant::now() < deadline {
        match status(socket).await {
            Err(_) => {
                println!("left the cluster: the warden stopped etcd, moved its data aside and exited");
                return Ok(());
            }
            Ok(s) => {
                let leaving = !s["member"]["holding_back"].is_null() || s["phase"] == "stopping";
                seen |= leaving;
                if !leaving && (seen || started.elapsed() > Duration::from_secs(5)) {
                    return Err(match s["member"]["leave_refused"].as_str() {
                        Some(why) => format!("the member did not leave: {why}; it stays in the cluster"),
                        None => "the member could not leave (see the warden's log); it stays in the cluster"
                            .into(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(format!(
        "the warden had not left after {}",
        humantime::format_duration(timeout)
    ))
}

/// Asks a standby to promote itself and waits until its etcd is ready (or the request is refused).
async fn promote(socket: &Path, force: bool, timeout: Duration) -> Result<(), String> {
    let before = status(socket).await?;
    if before["standby"].is_null() {
        return Err("this warden is not a standby (etcd-warden standby)".into());
    }
    let asked_before = before["standby"]["promotion"]["requested_at"].clone();
    let path = if force {
        "/standby/promote?force=true"
    } else {
        "/standby/promote"
    };
    let (code, body) = request(socket, Method::POST, path).await?;
    if code != 202 {
        return Err(format!("{path} answered {code}: {}", body.trim()));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let s = status(socket).await?;
        let p = &s["standby"]["promotion"];
        if p["requested_at"] != asked_before && !p["requested_at"].is_null() {
            if let Some(why) = p["refused"].as_str() {
                return Err(format!("promotion refused: {why}"));
            }
            if let Some(secs) = p["seconds"].as_f64() {
                println!(
                    "promoted: etcd is ready at revision {} (the backed-up revision {} plus the bump) after {secs:.2}s; backups go to {}",
                    p["revision"],
                    p["backed_up_revision"],
                    s["backup"]["store"].as_str().unwrap_or("the store")
                );
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not promoted within {} (standby state: {}; see the warden's log)",
                humantime::format_duration(timeout),
                s["standby"]["state"]
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn snapshot(socket: &Path, kind: SnapshotKind, wait: bool, timeout: Duration) -> Result<(), String> {
    let before = status(socket).await?;
    let (path, counter) = match kind {
        SnapshotKind::Full => ("/snapshot/full", "fulls_total"),
        SnapshotKind::Delta => ("/snapshot/delta", "deltas_total"),
    };
    let (code, body) = request(socket, Method::POST, path).await?;
    if code != 202 {
        return Err(format!("{path} answered {code}: {}", body.trim()));
    }
    println!("{}", body.trim());
    if !wait {
        return Ok(());
    }
    let count_before = before["backup"][counter].as_u64().unwrap_or(0);
    let revision = before["etcd"]["revision"].as_i64().unwrap_or(0);
    let deadline = Instant::now() + timeout;
    loop {
        let s = status(socket).await?;
        let b = &s["backup"];
        let done = match kind {
            SnapshotKind::Full => b[counter].as_u64().unwrap_or(0) > count_before,
            SnapshotKind::Delta => {
                b["backed_up_revision"].as_i64().unwrap_or(0) >= revision
                    && b["pending_delta_events"].as_u64().unwrap_or(0) == 0
            }
        };
        if done {
            let last = match kind {
                SnapshotKind::Full => &b["last_full"],
                SnapshotKind::Delta => &b["last_delta"],
            };
            println!(
                "stored: {} (revision {})",
                last["key"].as_str().unwrap_or("-"),
                b["backed_up_revision"]
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not stored within {}; last backup error: {}",
                humantime::format_duration(timeout),
                b["last_error"].as_str().unwrap_or("none")
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The running warden's --admin-socket.
    #[arg(long, env = "ETCD_WARDEN_ADMIN_SOCKET", value_name = "PATH")]
    pub admin_socket: PathBuf,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Print the warden's /status (JSON).
    Status,
    /// This member leaves its cluster for good: leadership moves away, the member is removed, etcd
    /// stops, its data dir is moved aside, and the warden exits (a restart waits, never rejoining
    /// with the removed WAL).
    Leave {
        /// Give up waiting for the warden to finish after this long.
        #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
    /// A standby becomes a new single-member cluster at a bumped revision (SIGUSR2 does the same);
    /// prints the time from the request to a ready etcd.
    Promote {
        /// Promote even while the store's newest object is younger than --standby-quiet, or when
        /// the store cannot be read.
        #[arg(long)]
        force: bool,
        /// Give up waiting for a ready etcd after this long.
        #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
    /// Ask for a snapshot now (full = SIGUSR1, delta = SIGUSR2).
    Snapshot {
        #[arg(value_enum)]
        kind: SnapshotKind,
        /// Wait until it is in the store (a delta: until everything etcd held at the request is).
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long.
        #[arg(long, default_value = "10m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SnapshotKind {
    Full,
    Delta,
}

/// Runs `ctl`.
pub fn main(args: CtlArgs) -> i32 {
    super::one_shot_quiet(ctl(args))
}

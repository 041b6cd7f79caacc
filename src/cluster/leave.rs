//! `etcd-warden ctl leave`: this member leaves its cluster for good (scale-down). Leadership moves
//! away first if it leads, the member is removed through another voter, then (in the run loop)
//! etcd is stopped, the data dir moved aside and a marker left beside it, so a restart never
//! rejoins with the removed member's WAL: the warden waits, not ready, until the marker is removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::peers;
use crate::etcd::ClientConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Left {
    pub member_id: u64,
    pub at_ms: u64,
    /// Where the removed member's data went.
    pub moved_to: Option<PathBuf>,
}

pub fn marker_path(data: &Path) -> PathBuf {
    crate::restore::startup::beside(data, ".warden-left.json")
}

pub fn marker(data: &Path) -> Option<Left> {
    serde_json::from_slice(&std::fs::read(marker_path(data)).ok()?).ok()
}

/// Moves leadership away if this member leads, then removes it through another voter; its id.
pub async fn leave(client: &ClientConfig) -> Result<u64, String> {
    let mut own = client
        .connect()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let status = own.status().await.map_err(|e| format!("status: {e}"))?;
    let me = status
        .header()
        .map(|h| h.member_id())
        .ok_or("status without a header")?;
    let list = own.member_list().await.map_err(|e| format!("member list: {e}"))?;
    let others: Vec<peers::Member> = list
        .members()
        .iter()
        .map(peers::Member::from)
        .filter(|m| m.id != me && !m.is_learner && m.started())
        .collect();
    let Some(next) = others.first() else {
        return Err("this is the only voting member: a cluster cannot lose its last member".into());
    };
    if status.leader() == me {
        tracing::info!(to = %next.name, "leaving: moving leadership away first");
        own.move_leader(next.id)
            .await
            .map_err(|e| format!("move leadership to {}: {e}", next.name))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = own.status().await.map_err(|e| format!("status: {e}"))?;
            if s.leader() != me && s.leader() != 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err("leadership did not move within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // etcd refuses a removal ("unhealthy cluster") until the remaining members have been
    // connected for a while (strict reconfiguration check): asked again for up to half a minute.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        for m in &others {
            for endpoint in &m.client_urls {
                match peers::remove(client, endpoint, me).await {
                    Ok(()) | Err(peers::ChangeError::NotFound) => {
                        tracing::warn!(member = format!("{me:x}"), via = %endpoint, "this member was removed from the cluster");
                        return Ok(me);
                    }
                    Err(e) => last = format!("{endpoint}: {e:?}"),
                }
            }
        }
        tracing::info!(why = %last, "the removal was refused; asking again");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!("no other member removed this one within 30 s ({last})"))
}

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
    crate::etcd::dirs::beside(data, ".warden-left.json")
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
    // The cluster must keep quorum without this member: a majority of the voters that remain has
    // to answer now, or the removal leaves a cluster that cannot write.
    let voters_left = others.len();
    let mut healthy = Vec::new();
    let mut down = Vec::new();
    for m in &others {
        if answers_with_leader(client, m).await {
            healthy.push(m.name.clone());
        } else {
            down.push(m.name.clone());
        }
    }
    if let Err(why) = keeps_quorum(voters_left, healthy.len()) {
        return Err(format!(
            "{why} (answering: {}; not answering: {}): bring the others back first",
            if healthy.is_empty() {
                "none".to_owned()
            } else {
                healthy.join(", ")
            },
            down.join(", ")
        ));
    }
    let next = others.iter().find(|m| healthy.contains(&m.name)).unwrap_or(next);
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

/// Whether `voters_left` voters, `healthy` of them answering, still have a quorum; why not.
pub fn keeps_quorum(voters_left: usize, healthy: usize) -> Result<(), String> {
    let quorum = voters_left / 2 + 1;
    if healthy >= quorum {
        Ok(())
    } else {
        Err(format!(
            "without this member the cluster has {voters_left} voters and needs {quorum} of them, but only {healthy} answer with a leader: leaving would lose quorum"
        ))
    }
}

/// Whether member `m` answers on one of its client URLs and sees a leader.
async fn answers_with_leader(client: &ClientConfig, m: &peers::Member) -> bool {
    for endpoint in &m.client_urls {
        if let Ok(mut c) = peers::connect(client, endpoint).await
            && let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await
            && s.leader() != 0
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::keeps_quorum;

    #[test]
    fn leaving_needs_a_majority_of_the_voters_that_remain() {
        // Three members, one leaves: two remain, both must answer.
        assert!(keeps_quorum(2, 2).is_ok());
        assert!(keeps_quorum(2, 1).is_err());
        // Five members, one leaves: four remain, three must answer.
        assert!(keeps_quorum(4, 3).is_ok());
        assert!(keeps_quorum(4, 2).is_err());
        assert!(keeps_quorum(1, 1).is_ok());
    }
}

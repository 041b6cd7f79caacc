//! Who writes: the warden whose etcd is the raft leader (and a voter), checked every second.

use std::time::Duration;

use etcd_client::Client;

/// How often a cluster member's warden checks who leads.
pub const LEADERSHIP_CHECK: Duration = Duration::from_secs(1);

/// Who a status answer came from: cluster, member, raft term.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

/// Whether the etcd behind `client` is the raft leader and a voter: `Some(Err(leader))` names
/// another member (0: none known), `None` when etcd does not answer.
pub async fn leads(client: &mut Client) -> Option<Result<Identity, u64>> {
    let s = tokio::time::timeout(LEADERSHIP_CHECK, client.status())
        .await
        .ok()?
        .ok()?;
    let h = s.header()?;
    let me = Identity {
        cluster_id: h.cluster_id(),
        member_id: h.member_id(),
        raft_term: h.raft_term(),
    };
    Some(if s.leader() == me.member_id && !s.is_learner() {
        Ok(me)
    } else {
        Err(s.leader())
    })
}

/// The writer's part in a repair: promotes every learner etcd says has caught up, so a learner
/// whose own warden died is not left behind. etcd refuses a learner that is not in sync yet; that
/// refusal is the normal answer until it is, and is not logged above debug.
pub async fn promote_caught_up_learners(client: &mut Client) {
    let Ok(Ok(list)) = tokio::time::timeout(LEADERSHIP_CHECK, client.member_list()).await else {
        return;
    };
    for m in list
        .members()
        .iter()
        .filter(|m| m.is_learner() && !m.name().is_empty())
    {
        match tokio::time::timeout(LEADERSHIP_CHECK, client.member_promote(m.id())).await {
            Ok(Ok(_)) => {
                tracing::info!(
                    member = m.name(),
                    id = format!("{:x}", m.id()),
                    "promoted a learner that caught up"
                )
            }
            Ok(Err(e)) => tracing::debug!(member = m.name(), error = %e, "learner not promoted yet"),
            Err(_) => {}
        }
    }
}

/// How many members etcd's member list names (learners too); `None` when etcd does not answer.
pub async fn member_count(client: &mut Client) -> Option<usize> {
    let list = tokio::time::timeout(LEADERSHIP_CHECK, client.member_list())
        .await
        .ok()?
        .ok()?;
    Some(list.members().len())
}

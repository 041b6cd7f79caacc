//! A cluster restore plan (`etcd-warden cluster restore`), for a cluster that lost quorum:
//! `v1/cluster-restore/<id>.json` (written create-if-absent), `v1/cluster-restore/current.json`
//! (the newest plan, read with one GET — never a listing), and one
//! `v1/cluster-restore/<id>.done-<member>.json` per member that restored by it.
//!
//! One plan is pending at a time: a second is refused unless it says `--replace` (members that
//! applied the first then apply the second too). Once every member it names applied it, the plan
//! is retired: kept as history (`retired: true`, in both objects), no longer pending, and
//! retention no longer keeps its chain for it.

use serde::{Deserialize, Serialize};

use super::layout::VERSION_DIR;
use super::{Store, StoreError};

fn dir() -> String {
    format!("{VERSION_DIR}/cluster-restore")
}

pub fn key(id: &str) -> String {
    format!("{}/{id}.json", dir())
}

fn current() -> String {
    format!("{}/current.json", dir())
}

fn done_key(id: &str, member: &str) -> String {
    format!("{}/{id}.done-{member}.json", dir())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub format: u32,
    pub id: String,
    pub created_ms: u64,
    /// The full snapshot every member restores from, and the exact revision it ends at.
    pub full: String,
    pub target_revision: i64,
    /// Raise the restored revision by this much and mark everything up to it compacted (0: off).
    pub bump_revision: u64,
    /// The new cluster's `--initial-cluster-token`: a cluster distinct from the lost one.
    pub token: String,
    pub members: Vec<PlanMember>,
    /// The cluster that owned the prefix; its record passes to the restored cluster.
    pub previous_cluster_id: u64,
    /// Members apply it even while their cluster has quorum.
    pub force: bool,
    /// The full has no delta after it: members restore that very file, and `target_revision` is
    /// only its name's lower bound (the database may hold a few revisions more).
    #[serde(default)]
    pub full_only: bool,
    /// The pending plan this one replaced (`cluster restore --replace`): members restored by that
    /// one restore by this one too.
    #[serde(default)]
    pub replaces: Option<String>,
    /// Every member applied it: history, no longer pending.
    #[serde(default)]
    pub retired: bool,
}

impl Plan {
    /// The chain the plan restores from (its full snapshot's).
    pub fn chain(&self) -> Option<super::ChainId> {
        super::SnapshotName::parse(&self.full)
            .ok()
            .and_then(|n| n.chain())
    }

    /// `--initial-cluster` of the restored cluster.
    pub fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .flat_map(|m| m.peer_urls.iter().map(move |u| format!("{}={u}", m.name)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDone {
    pub member: String,
    pub revision: i64,
    pub at_ms: u64,
}

impl Store {
    /// Writes `plan` (create-if-absent) and points `current.json` at it; `false` when a plan with
    /// that id exists already. The caller checked that no other plan is pending (or replaces it).
    pub async fn put_plan(&self, plan: &Plan) -> Result<bool, StoreError> {
        if !self.put_json(&key(&plan.id), plan, true).await? {
            return Ok(false);
        }
        self.put_json(&current(), plan, false).await?;
        Ok(true)
    }

    /// The members `plan` names that have not restored by it yet.
    pub async fn plan_waiting_for(&self, plan: &Plan) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for m in &plan.members {
            if self.plan_done(&plan.id, &m.name).await?.is_none() {
                out.push(m.name.clone());
            }
        }
        Ok(out)
    }

    /// Retires the current plan when every member applied it; `true` when it is (now) retired.
    pub async fn retire_plan_if_applied(&self, plan: &Plan) -> Result<bool, StoreError> {
        if plan.retired {
            return Ok(true);
        }
        if !self.plan_waiting_for(plan).await?.is_empty() {
            return Ok(false);
        }
        let retired = Plan {
            retired: true,
            ..plan.clone()
        };
        self.put_json(&key(&plan.id), &retired, false).await?;
        // current.json moves on only if it still names this plan (a replacement stays current).
        if self.current_plan().await?.is_some_and(|c| c.id == plan.id) {
            self.put_json(&current(), &retired, false).await?;
        }
        tracing::info!(plan = %plan.id, "every member restored by the cluster restore plan: retired (kept as history)");
        Ok(true)
    }

    pub async fn current_plan(&self) -> Result<Option<Plan>, StoreError> {
        self.get_json(&current()).await
    }

    pub async fn mark_plan_done(&self, id: &str, done: &PlanDone) -> Result<(), StoreError> {
        self.put_json(&done_key(id, &done.member), done, false)
            .await
            .map(drop)
    }

    pub async fn plan_done(&self, id: &str, member: &str) -> Result<Option<PlanDone>, StoreError> {
        self.get_json(&done_key(id, member)).await
    }
}

//! Quorum loss in one command. `etcd-warden cluster restore` writes a plan into the store (the
//! exact full snapshot and revision, a new cluster token, the members — by default those the store
//! recorded); every member's warden that finds it while its cluster has no quorum (or at start-up
//! when the plan says `--force`) moves its data aside, restores that chain to that revision with
//! its own name and peer URLs, starts etcd `new`, and records that it is done: all members come up
//! at the same revision with the same history. A member restored by a plan never restores by it
//! again (a marker beside its data dir, `<data-dir>.warden-plan.json`, and one in the store).

use std::path::Path;

use crate::restore::Target;
use crate::restore::marker::{PlanApplied as Marker, plan_applied as marker};
use crate::store::Store;
use crate::store::plan::{Plan, PlanMember};

/// The store's current plan, when it names this member and this member has not restored by it.
pub async fn pending_plan(store: &Store, name: &str, data: &Path) -> Result<Option<Plan>, String> {
    let err = |e: crate::store::StoreError| crate::telemetry::error_chain(&e);
    let Some(plan) = store.current_plan().await.map_err(err)? else {
        return Ok(None);
    };
    if plan.retired {
        return Ok(None);
    }
    if !plan.members.iter().any(|m| m.name == name) {
        return Ok(None);
    }
    if marker(data).is_some_and(|m| m.plan == plan.id) {
        return Ok(None);
    }
    // Done once already (its data dir was lost since): it rejoins through its peers instead.
    if store.plan_done(&plan.id, name).await.map_err(err)?.is_some() {
        return Ok(None);
    }
    Ok(Some(plan))
}

/// Whether this member applies `plan` now (a pure rule, the driver asks the store and the peers).
/// `quorum`: the cluster ID of the quorum this member sees (0 when its answers named none), `None`
/// without one.
/// - its cluster has no quorum (what the plan is for);
/// - or the plan says `--force` and names this very cluster (the cluster the store recorded when
///   it was written): a forced plan another cluster wrote, copied into this prefix, never makes a
///   cluster that has quorum restore someone else's data;
/// - or the quorum it sees is the plan's own new cluster (another member restored by it already),
///   which this member must join the same way;
/// - or its data came from the plan this one replaced (`--replace`): that cluster is abandoned.
pub fn applies(plan: &Plan, quorum: Option<u64>, others_done: bool, marker: Option<&Marker>) -> bool {
    let Some(cluster) = quorum else { return true };
    let ours = plan.previous_cluster_id == 0 || cluster == 0 || plan.previous_cluster_id == cluster;
    (plan.force && ours)
        || others_done
        || plan
            .replaces
            .as_ref()
            .is_some_and(|r| marker.is_some_and(|m| &m.plan == r))
}

/// Whether another member named by `plan` restored by it already (the plan is under way).
pub async fn others_done(store: &Store, plan: &Plan, me: &str) -> bool {
    for m in plan.members.iter().filter(|m| m.name != me) {
        if let Ok(Some(_)) = store.plan_done(&plan.id, &m.name).await {
            return true;
        }
    }
    false
}

/// What `cluster restore` was asked.
pub struct PlanRequest {
    pub target: Target,
    pub bump_revision: u64,
    /// `name=peer-url,...`; `None`: the member list the store recorded.
    pub initial_cluster: Option<String>,
    pub force: bool,
    /// Replace a pending plan.
    pub replace: bool,
}

/// Why no plan was written.
#[derive(Debug)]
pub enum PlanError {
    /// Another plan is pending and `--replace` was not given (bad usage).
    Pending(String),
    /// The target asks for what the store does not hold (bad usage).
    Beyond(String),
    Other(String),
}

impl From<String> for PlanError {
    fn from(e: String) -> Self {
        Self::Other(e)
    }
}

impl From<&str> for PlanError {
    fn from(e: &str) -> Self {
        Self::Other(e.to_owned())
    }
}

/// Writes the plan for `req` into `store`; the plan, or why not.
pub async fn write_plan(store: &Store, req: &PlanRequest) -> Result<Plan, PlanError> {
    let err = |e: crate::store::StoreError| crate::telemetry::error_chain(&e);
    let pending = match store.current_plan().await.map_err(err)? {
        Some(p) if !store.retire_plan_if_applied(&p).await.map_err(err)? => Some(p),
        _ => None,
    };
    if let Some(p) = &pending
        && !req.replace
    {
        let waiting = store.plan_waiting_for(p).await.map_err(err)?;
        return Err(PlanError::Pending(format!(
            "plan {} is pending (members {} have not restored by it yet): two plans at once would split the members between two clusters. Wait for it, or give --replace to replace it (members that applied it restore by the new one too)",
            p.id,
            waiting.join(", ")
        )));
    }
    let owner = store.get_owner().await.map_err(err)?;
    let members: Vec<PlanMember> = match (&req.initial_cluster, &owner) {
        (Some(c), _) => {
            let mut out: Vec<PlanMember> = Vec::new();
            for entry in c.split(',').filter(|e| !e.trim().is_empty()) {
                let (n, u) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("--initial-cluster entry {entry:?} is not name=peer-url"))?;
                match out.iter_mut().find(|m| m.name == n.trim()) {
                    Some(m) => m.peer_urls.push(u.trim().to_owned()),
                    None => out.push(PlanMember {
                        name: n.trim().to_owned(),
                        peer_urls: vec![u.trim().to_owned()],
                    }),
                }
            }
            out
        }
        (None, Some(o)) => o
            .members
            .iter()
            .filter(|m| !m.is_learner && !m.name.is_empty())
            .map(|m| PlanMember {
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
            })
            .collect(),
        (None, None) => {
            return Err("the store records no cluster at this prefix: give the members with --initial-cluster name=peer-url,...".into());
        }
    };
    if members.is_empty() {
        return Err("no members to restore (the store's record lists none): give --initial-cluster".into());
    }
    // What passed the gate only: a plan never names a planted object, nor bumps past one.
    let screened = store.screened_catalog().await.map_err(err)?;
    let (fulls, chains) = (screened.fulls, screened.chains);
    let candidates = match req.target {
        // A rollback point is restored as it is, outside the chains.
        Target::Rollback(point) => vec![crate::restore::plan::Candidate {
            full: point,
            deltas: Vec::new(),
            target_revision: point.last_revision(),
            stop_at: None,
            gap: None,
        }],
        target => {
            crate::restore::plan::candidates(&fulls, &|c| chains.get(&c).cloned().unwrap_or_default(), target)
        }
    };
    let chosen = candidates
        .first()
        .ok_or_else(|| format!("the store has no backup for {:?}", req.target))?;
    // Every member would restore less than asked: refused, as the offline `restore` refuses to
    // call such a result what was asked for.
    if let Target::Revision(r) = req.target
        && chosen.gap.is_none()
        && chosen.target_revision < r
    {
        return Err(PlanError::Beyond(format!(
            "--to-revision {r}: the store's backups reach revision {} only (give a revision at most {}, or leave --to-revision out for the newest)",
            chosen.target_revision, chosen.target_revision
        )));
    }
    // The bump clears every revision any object names (an older chain below a newer one's).
    let named = crate::restore::plan::newest_named(&fulls, &chains);
    let bump_revision = crate::restore::plan::bump_amount(chosen.target_revision, req.bump_revision, named);
    let now = crate::store::layout::now_ms();
    let id = crate::store::layout::format_time(now);
    let plan = Plan {
        format: 1,
        id: id.clone(),
        created_ms: now,
        full: chosen.full.key(),
        target_revision: chosen.target_revision,
        bump_revision,
        token: format!("etcd-warden-restore-{id}").to_lowercase(),
        members,
        previous_cluster_id: owner.map(|o| o.cluster_id).unwrap_or(0),
        force: req.force,
        full_only: chosen.deltas.is_empty() && chosen.stop_at.is_none(),
        replaces: pending.map(|p| p.id),
        retired: false,
    };
    if !store.put_plan(&plan).await.map_err(err)? {
        return Err(PlanError::Other(format!(
            "a plan with id {id} exists already; run the command again"
        )));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(force: bool, replaces: Option<&str>) -> Plan {
        Plan {
            format: 1,
            id: "B".into(),
            created_ms: 0,
            full: "v1/full/x".into(),
            target_revision: 10,
            bump_revision: 0,
            token: "t".into(),
            members: Vec::new(),
            previous_cluster_id: 0,
            force,
            full_only: false,
            replaces: replaces.map(str::to_owned),
            retired: false,
        }
    }

    fn marker(plan: &str) -> Marker {
        Marker {
            plan: plan.into(),
            revision: 10,
            at_ms: 0,
        }
    }

    #[test]
    fn who_applies_a_plan() {
        const Q: Option<u64> = Some(7);
        // No quorum: what a plan is for.
        assert!(applies(&plan(false, None), None, false, None));
        // A quorum of the old cluster: only when forced.
        assert!(!applies(&plan(false, None), Q, false, None));
        assert!(applies(&plan(true, None), Q, false, None));
        // Forced, for the cluster it names; another cluster's forced plan moves none of this one.
        let of = |cluster| Plan {
            previous_cluster_id: cluster,
            ..plan(true, None)
        };
        assert!(applies(&of(7), Q, false, None));
        assert!(!applies(&of(8), Q, false, None));
        assert!(applies(&of(8), None, false, None));
        assert!(applies(&of(8), Some(0), false, None));
        // The quorum is the plan's own new cluster (another member restored by it): join it.
        assert!(applies(&plan(false, None), Q, true, None));
        assert!(applies(&of(8), Q, true, None));
        // A replacement: the members restored by the replaced plan (whose cluster may well have
        // quorum) move on to it; a member restored by some other, older plan does not.
        assert!(applies(&plan(false, Some("A")), Q, false, Some(&marker("A"))));
        assert!(!applies(&plan(false, Some("A")), Q, false, Some(&marker("Z"))));
        assert!(!applies(&plan(false, Some("A")), Q, false, None));
    }
}

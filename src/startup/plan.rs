//! Applying a cluster restore plan at start-up (`crate::cluster::restore` writes and reads the
//! plans): this member's data moved aside, the plan's chain restored to the plan's revision with
//! this member's name and peer URLs, both markers written, and etcd started `new`.

use std::path::Path;

use tokio::sync::watch;

use super::Decision;
use super::member::MemberConfig;
use crate::process::pid1::Reaper;
use crate::restore::marker::{PlanApplied, plan_path};
use crate::restore::{RestoreOptions, Target};
use crate::store::plan::{Plan, PlanDone};
use crate::store::{SnapshotName, Store};

/// Restores this member by `plan`; the flags etcd starts with. `Err`: why not (retried).
pub async fn apply(
    cfg: &MemberConfig,
    reaper: &Reaper,
    store: &Store,
    data: &Path,
    plan: &Plan,
    status: &watch::Sender<Option<String>>,
) -> Result<Decision, String> {
    let name = &cfg.etcd.name;
    let me = plan
        .members
        .iter()
        .find(|m| &m.name == name)
        .ok_or_else(|| format!("restore plan {} does not name member {name}", plan.id))?;
    tracing::warn!(plan = %plan.id, full = %plan.full, revision = plan.target_revision, token = %plan.token, "RESTORING this member by the cluster restore plan");
    status.send_replace(Some(format!(
        "restoring by cluster restore plan {} (revision {})",
        plan.id, plan.target_revision
    )));
    let dirs = crate::etcd::MemberDirs {
        data: data.to_owned(),
        wal: cfg.etcd.wal_path(),
    };
    let suffix = format!(".before-cluster-restore-{}", plan.id);
    let mut moved = false;
    if !dirs.is_empty() {
        let to = dirs.move_aside(&suffix)?;
        tracing::warn!(from = %data.display(), to = %to.display(), "member data moved aside for the cluster restore (kept, not deleted)");
        moved = true;
    }
    let opts = RestoreOptions {
        progress: crate::restore::execute::Progress::to(|_| {}),
        data_dir: data.to_owned(),
        wal_dir: dirs.wal.clone(),
        etcd: cfg.launch.program.clone(),
        tool: None,
        name: name.clone(),
        initial_cluster: Some(plan.initial_cluster()),
        initial_advertise_peer_urls: Some(me.peer_urls.join(",")),
        initial_cluster_token: Some(plan.token.clone()),
        // The plan's own chain and revision, never "the newest backup at apply time": a member
        // that applies late restores what the others did (retention keeps that chain meanwhile).
        target: match (
            crate::store::rollback::parse(&plan.full),
            SnapshotName::parse(&plan.full).ok().and_then(|n| n.chain()),
        ) {
            (Some(point), _) => Target::Rollback(point),
            (None, Some(chain)) if plan.full_only => Target::Full(chain),
            (None, Some(chain)) => Target::ChainAt(chain, plan.target_revision),
            (None, None) => {
                return Err(format!(
                    "restore plan {}: {:?} is not a full snapshot's key",
                    plan.id, plan.full
                ));
            }
        },
        // Fixed when the plan was written (clearing the store's revisions then): every member
        // lands on the same revision however the store grew since.
        bump_revision: plan.bump_revision,
        bump_clears_store: false,
        store_wait: crate::restore::execute::STORE_WAIT,
    };
    let put_back = |why: String| -> String {
        if !moved {
            return why;
        }
        match dirs.put_back(&suffix, &format!(".failed-cluster-restore-{}", plan.id)) {
            Ok(()) => why,
            Err(e) => format!("{why}; and putting the member's data back failed: {e}"),
        }
    };
    let report = crate::restore::restore(store, &opts, reaper).await.map_err(|e| {
        put_back(format!(
            "restore by plan {}: {}",
            plan.id,
            crate::telemetry::error_chain(&e)
        ))
    })?;
    // Every member must end at the plan's revision: the same committed history (a later full at
    // that same revision, e.g. a final one, holds the same state as the plan's).
    let same = if plan.full_only {
        report.full == plan.full
    } else {
        report.backed_up_revision == plan.target_revision
    };
    if !same {
        return Err(put_back(format!(
            "restore by plan {} reached {} at revision {}, the plan says {} at {}: not starting a member that would differ from the others",
            plan.id, report.full, report.backed_up_revision, plan.full, plan.target_revision
        )));
    }
    let now = crate::store::layout::now_ms();
    let mark = PlanApplied {
        plan: plan.id.clone(),
        revision: report.backed_up_revision,
        at_ms: now,
    };
    crate::etcd::dirs::write_fresh(
        &plan_path(data),
        &serde_json::to_vec_pretty(&mark).unwrap_or_default(),
    )
    .map_err(|e| format!("write {}: {e}", plan_path(data).display()))?;
    let done = PlanDone {
        member: name.clone(),
        revision: report.backed_up_revision,
        at_ms: now,
    };
    match store.mark_plan_done(&plan.id, &done).await {
        Ok(()) => {
            if let Err(e) = store.retire_plan_if_applied(plan).await {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot retire the plan (the writer tries again before its retention)");
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot record in the store that this member restored by the plan (the local marker keeps it from restoring again)");
        }
    }
    tracing::info!(plan = %plan.id, revision = report.revision, backed_up_revision = report.backed_up_revision, seconds = report.seconds, "member restored by the cluster restore plan: starting etcd `new`");
    Ok(Decision::Join {
        flags: vec![
            ("initial-cluster-state".into(), "new".into()),
            ("initial-cluster".into(), plan.initial_cluster()),
            ("initial-cluster-token".into(), plan.token.clone()),
        ],
        learner: None,
        reason: format!("restored by cluster restore plan {}", plan.id),
    })
}

//! Before etcd starts: one decision ([`decide`], a pure table) over what this member's data, the
//! store and the peers say, and a thin driver that gathers those facts, carries the action out
//! (a restore, a step of a repair through the peers, a restore plan) and asks again until the
//! action starts etcd. A single member and a cluster member are rows of the same table. The
//! actions: `restore` (this member's data from the store), `cluster` (a cluster member's facts
//! and repair steps through its peers), `plan` (a cluster restore plan). It calls `cluster`,
//! `restore` and everything below them.

pub mod cluster;
pub mod decide;
pub mod member;
pub mod plan;
pub mod restore;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

use crate::cluster::journal::Journal;
use crate::etcd::MemberDirs;
use crate::process::pid1::Reaper;
use decide::{Action, Facts, Local};
use member::MemberConfig;

/// What start-up decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start etcd on the data dir as it is.
    Keep(String),
    /// The data dir was restored (and the old one, if any, moved to this path).
    Restored {
        /// What etcd serves: the backed-up revision plus the bump.
        revision: i64,
        backed_up_revision: i64,
        /// The newest revision the store's names promised; above `backed_up_revision` when
        /// objects were corrupt or missing (`skipped`).
        target_revision: i64,
        skipped: Vec<String>,
        moved_aside: Option<PathBuf>,
        seconds: f64,
    },
    /// A cluster member starts with these etcd flags set (`--initial-cluster-state existing` and
    /// the current members to join its peers; a restore plan's `new` cluster); `learner`: it
    /// starts as that learner and waits to be promoted.
    Join {
        flags: Vec<(String, String)>,
        learner: Option<u64>,
        reason: String,
    },
}

/// Start-up restores done by this warden, for /status and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RestoreStats {
    pub total: u64,
    /// The revision the last restore left etcd at (the backed-up one plus the bump).
    pub last_revision: Option<i64>,
    /// The newest backed-up revision the last restore reached.
    pub last_backed_up_revision: Option<i64>,
    /// What it aimed at: the newest revision the store's names promised.
    pub last_target_revision: Option<i64>,
    /// Objects the last restore could not use (key: why), so it restored less than the target.
    pub last_skipped: Vec<String>,
    /// Restores that ended below their target, in all.
    pub older_than_target_total: u64,
    pub last_seconds: Option<f64>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_at: Option<std::time::SystemTime>,
}

/// How long a cluster member waits before looking again.
const RETRY: Duration = Duration::from_secs(2);

/// Says `what` on `channel` (and in the log, once per change).
fn say(channel: &watch::Sender<Option<String>>, what: &str) {
    if channel.borrow().as_deref() != Some(what) {
        tracing::warn!("{what}");
        channel.send_replace(Some(what.to_owned()));
    }
}

/// A step of the start-up check, for /status.
fn step(status: &watch::Sender<Option<String>>, what: &str) {
    if status.borrow().as_deref() != Some(what) {
        tracing::info!(step = what, "start-up check");
        status.send_replace(Some(what.to_owned()));
    }
}

/// Runs the start-up check; `Err` only for what must stop the warden. `status`: what the check is
/// doing (a restore's progress); `member`: what holds this member back (readiness says it).
pub async fn prepare(
    cfg: &MemberConfig,
    reaper: &Reaper,
    status: &watch::Sender<Option<String>>,
    member: &watch::Sender<Option<String>>,
) -> Result<Decision, String> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let dirs = MemberDirs {
        data: cwd.join(&cfg.etcd.data_dir),
        wal: cfg.etcd.wal_path(),
    };
    let mut store_delay = Duration::from_secs(1);
    let decision = loop {
        let left = crate::cluster::leave::marker(&dirs.data).map(|l| {
            format!(
                "this member left its cluster (member {:x}, `ctl leave`); remove {} to start it again as a new member",
                l.member_id,
                crate::cluster::leave::marker_path(&dirs.data).display()
            )
        });
        // A data dir of a cluster (members added at run time to what was started as one) is a
        // cluster member's, whatever the flags say: a lone restore would fork it.
        let round = if cfg.is_cluster_member() {
            cluster_round(cfg, reaper, &dirs, left, status, member).await?
        } else {
            single_round(cfg, reaper, &dirs, left, status, member, &mut store_delay).await?
        };
        if let Some(d) = round {
            break d;
        }
    };
    status.send_replace(None);
    member.send_replace(None);
    Ok(decision)
}

/// One look at a single member; `None`: it waited, look again.
async fn single_round(
    cfg: &MemberConfig,
    reaper: &Reaper,
    dirs: &MemberDirs,
    left: Option<String>,
    status: &watch::Sender<Option<String>>,
    member: &watch::Sender<Option<String>>,
    store_delay: &mut Duration,
) -> Result<Option<Decision>, String> {
    let local = crate::startup::restore::local_fact(dirs);
    let offline = (local != Local::Missing)
        .then(|| crate::startup::restore::offline_revision(dirs))
        .flatten();
    let mut facts = Facts {
        left,
        offline,
        ..Facts::new(false, local)
    };
    let mut cluster_id = None;
    loop {
        let action = decide::decide(&facts);
        tracing::debug!(?action, "start-up decision");
        match action {
            Action::ListStore => {
                step(status, "listing backups");
                // Opened on every attempt: a fixed credentials file is picked up while waiting.
                let listed = match crate::startup::restore::open_store(cfg) {
                    Ok(store) => crate::startup::restore::newest_backup(&store).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = &listed {
                    tracing::error!(error = %e, "cannot list the store");
                }
                facts.newest_backup = Some(listed);
            }
            Action::Validate => {
                step(status, "validating the data dir with a private etcd");
                (facts.local, cluster_id) = crate::startup::restore::validate(cfg, reaper, dirs).await;
                match &facts.local {
                    Local::At(r) => tracing::info!(local = r, "the data dir starts"),
                    Local::Broken(e) => tracing::error!(error = %e, "the data dir does not start"),
                    Local::Unknown(e) => {
                        tracing::warn!(error = %e, "the data dir could not be validated: no evidence against it")
                    }
                    _ => {}
                }
            }
            Action::Start(reason) => {
                if let Local::At(local) = facts.local {
                    tracing::info!(local, reason, "the data dir is current; starting etcd on it");
                } else {
                    tracing::info!(reason, "starting etcd on the data dir as it is");
                }
                return Ok(Some(Decision::Keep(reason)));
            }
            Action::CatchUp { from } => {
                step(status, "catching up from the store's deltas");
                let newest = facts
                    .newest_backup
                    .clone()
                    .and_then(Result::ok)
                    .flatten()
                    .unwrap_or(from);
                match crate::startup::restore::catch_up_member(cfg, status, dirs, (from, cluster_id), newest)
                    .await
                {
                    Ok(decision) => return Ok(Some(decision)),
                    Err(why) => {
                        tracing::warn!(
                            local = from,
                            newest_backup = newest,
                            why,
                            "the data dir is behind the store and cannot be caught up from its deltas: restoring the newest backup instead"
                        );
                        facts.catch_up = Some(why);
                    }
                }
            }
            Action::Restore { aside, floor } => {
                step(status, "restoring from the store");
                let newest = facts.newest_backup.clone().and_then(Result::ok).flatten();
                return crate::startup::restore::restore_member(
                    cfg, reaper, status, dirs, aside, floor, newest,
                )
                .await
                .map(Some);
            }
            Action::Wait(why) => {
                if facts.left.is_some() || matches!(facts.local, Local::Unknown(_)) {
                    say(member, &why);
                    tokio::time::sleep(RETRY).await;
                } else {
                    // The store, while the data dir is empty: backed off up to 30 s.
                    tracing::error!(retry_in_s = store_delay.as_secs(), "{why}");
                    step(status, "waiting for the store (data dir empty)");
                    tokio::time::sleep(*store_delay).await;
                    *store_delay = (*store_delay * 2).min(Duration::from_secs(30));
                }
                return Ok(None);
            }
            other => return Err(format!("start-up: {other:?} is no single member's action")),
        }
    }
}

/// The store's pending cluster restore plan for this member and the fact the table reads of it:
/// whether it applies (quorum lost, or `--force`, or the other members already restored by it).
async fn plan_facts(
    store: Option<&crate::store::Store>,
    name: &str,
    data: &std::path::Path,
    quorum: Option<u64>,
) -> (
    Result<Option<crate::store::plan::Plan>, String>,
    Option<Result<Option<bool>, String>>,
) {
    let plan = match store {
        Some(store) => crate::cluster::restore::pending_plan(store, name, data).await,
        None => Ok(None),
    };
    let fact = match &plan {
        Ok(Some(p)) => {
            let others_done = match store {
                Some(store) if quorum.is_some() && !p.force => {
                    crate::cluster::restore::others_done(store, p, name).await
                }
                _ => false,
            };
            let marker = crate::restore::marker::plan_applied(data);
            let applies = crate::cluster::restore::applies(p, quorum, others_done, marker.as_ref());
            if p.force
                && !applies
                && let Some(cluster) = quorum
            {
                tracing::warn!(
                    plan = p.id,
                    plan_cluster = format!("{:x}", p.previous_cluster_id),
                    this_cluster = format!("{cluster:x}"),
                    "a forced cluster restore plan in the store restores another cluster: not applied (this cluster has quorum)"
                );
            }
            Some(Ok(Some(applies)))
        }
        Ok(None) => Some(Ok(None)),
        Err(e) => Some(Err(e.clone())),
    };
    (plan, fact)
}

/// Why a cluster member waits, with what the operator can do about it.
fn wait_reason(why: String, facts: &Facts, journal: Option<&Journal>, cfg: &MemberConfig) -> String {
    match (&facts.existed, journal.and_then(|j| j.moved_aside.as_ref())) {
        (Some(Ok(e)), _) if !e.is_empty() => format!(
            "{why}. Bring a majority of the members back, or restore the whole cluster from the store: etcd-warden cluster restore --store {}",
            cfg.store
        ),
        (_, Some(kept)) if !facts.peers.quorum => {
            format!("{why} (the broken data dir is kept at {})", kept.display())
        }
        _ => why,
    }
}

/// One look at a cluster member; `None`: it waited or changed something, look again.
async fn cluster_round(
    cfg: &MemberConfig,
    reaper: &Reaper,
    dirs: &MemberDirs,
    left: Option<String>,
    status: &watch::Sender<Option<String>>,
    member: &watch::Sender<Option<String>>,
) -> Result<Option<Decision>, String> {
    use crate::startup::cluster as cs;
    let me = cs::me(cfg)?;
    let data = &dirs.data;
    if left.is_some() {
        // A member that left its cluster never rejoins on its own: the table says why it waits.
        let f = Facts {
            left,
            ..Facts::new(true, Local::Missing)
        };
        if let Action::Wait(why) = decide::decide(&f) {
            say(member, &why);
        }
        tokio::time::sleep(RETRY).await;
        return Ok(None);
    }
    step(status, "asking the other members");
    let journal = Journal::load(data)?;
    let local = crate::etcd::local::check(dirs);
    let survey =
        crate::cluster::peers::survey(&cfg.client, &me.others, &cfg.cluster_endpoints, &me.client_urls).await;
    tracing::debug!(quorum = survey.quorum.is_some(), failures = ?survey.failures, "the other members asked");
    let store = cfg.backup.open_store().ok();
    let quorum = survey.quorum.as_ref().map(|_| survey.quorum_cluster);
    let (plan, plan_fact) = plan_facts(store.as_ref(), &me.name, data, quorum).await;
    let round = cs::Round {
        cfg,
        me: &me,
        data,
        survey: &survey,
        local: &local,
    };
    let mut facts = Facts {
        plan: plan_fact,
        peers: cs::peers_fact(&me, &survey, &local).await,
        journal: journal.as_ref().map(|j| j.learner_id),
        ..Facts::new(true, cs::local_fact(&local))
    };
    loop {
        let action = decide::decide(&facts);
        tracing::debug!(?action, "start-up decision");
        let waited = |why: String| {
            let why = if survey.failures.is_empty() {
                why
            } else {
                format!("{why} ({})", survey.failures.join("; "))
            };
            say(member, &why);
        };
        match action {
            Action::AskHistory => {
                facts.existed = Some(cs::history(cfg, &me, &survey).await);
            }
            Action::Wait(why) => {
                waited(wait_reason(why, &facts, journal.as_ref(), cfg));
                tokio::time::sleep(RETRY).await;
                return Ok(None);
            }
            Action::Start(reason) => {
                if journal.is_some() {
                    // A journal without a learner: that repair never got to start etcd, and this
                    // data came from elsewhere (an operator's restore). It is what etcd starts on.
                    Journal::finish(data);
                }
                tracing::info!(data = %data.display(), reason, "starting etcd as configured");
                return Ok(Some(Decision::Keep(reason)));
            }
            Action::ApplyPlan => {
                let (Ok(Some(plan)), Some(store)) = (&plan, &store) else {
                    return Err("start-up: a plan to apply without a plan".into());
                };
                return match plan::apply(cfg, reaper, store, data, plan, member).await {
                    Ok(d) => Ok(Some(d)),
                    Err(e) => {
                        waited(format!("cluster restore plan {}: {e}; retrying", plan.id));
                        tokio::time::sleep(RETRY).await;
                        Ok(None)
                    }
                };
            }
            Action::UpdatePeerUrls { id } => {
                if let Err(e) = cs::update_peer_urls(cfg, &me, &survey, id).await {
                    waited(e);
                    tokio::time::sleep(RETRY).await;
                }
                return Ok(None);
            }
            Action::ResumeRepair { learner } => {
                tracing::info!(
                    learner = format!("{learner:x}"),
                    "member data present and a repair journal: resuming the repair at the learner's promotion"
                );
                return Ok(Some(Decision::Join {
                    flags: Vec::new(),
                    learner: Some(learner),
                    reason: "resuming a repair: the learner waits for its promotion".into(),
                }));
            }
            Action::JoinListed { id, learner } => {
                return cs::join_listed(&round, journal, id, learner).map(Some);
            }
            Action::RemoveEntry { id, move_aside } => {
                say(
                    member,
                    &format!("repairing: removing the old member entry {id:x}"),
                );
                if let Err(e) = cs::remove_entry(&round, journal, id, move_aside).await {
                    waited(e);
                    tokio::time::sleep(RETRY).await;
                }
                // Look again: the add comes with a fresh member list.
                return Ok(None);
            }
            Action::AddLearner => {
                say(
                    member,
                    &format!("repairing: adding member {} as a learner", me.name),
                );
                return match cs::add_learner(&round, journal).await? {
                    Ok(d) => Ok(Some(d)),
                    Err(why) => {
                        waited(why);
                        tokio::time::sleep(RETRY).await;
                        Ok(None)
                    }
                };
            }
            other => return Err(format!("start-up: {other:?} is no cluster member's action")),
        }
    }
}

//! A member's start-up decision, before its etcd starts, from its own data and what its peers say:
//!
//! | our data | peers | decision |
//! |---|---|---|
//! | sound | any | start as configured |
//! | missing | a leader; we are not listed | add us as a learner, start `existing` |
//! | missing | a leader; listed, never started | start `existing` (a learner if listed as one) |
//! | missing or broken | a leader; listed and started before | repair: move the dir aside, remove the old entry, add a learner, start `existing` |
//! | broken | no leader | wait, change nothing: a repair needs quorum |
//! | missing | no leader; the peers or the store show this cluster existed | wait: "quorum lost", never bootstrap a second cluster |
//! | missing | no leader; no record of the cluster | first boot, as configured |
//!
//! Every decision is logged with its evidence. The repair's steps are journaled
//! ([`super::journal`]) so a warden killed at any step resumes it. A member rejoins through its
//! peers, never from the store: restoring one member from a backup while the others keep quorum
//! would fork the cluster.

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use super::journal::Journal;
use super::local::{self, LocalData};
use super::peers::{self, ChangeError, Member, Survey};
use crate::config::RunConfig;
use crate::pid1::Reaper;
use crate::restore::startup::Decision;

use crate::failpoint::die as failpoint;

/// How long to wait before asking the peers again.
const RETRY: Duration = Duration::from_secs(2);

/// This member, as its etcd flags describe it.
pub struct Me {
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    /// The other members' peer URLs from `--initial-cluster`.
    pub others: Vec<String>,
}

pub fn me(cfg: &RunConfig) -> Result<Me, String> {
    let name = cfg.etcd.name.clone();
    let cluster = cfg.etcd.initial_cluster.clone().unwrap_or_default();
    let mut mine = Vec::new();
    let mut others = Vec::new();
    for entry in cluster.split(',').filter(|e| !e.trim().is_empty()) {
        let (n, url) = entry
            .split_once('=')
            .ok_or_else(|| format!("--initial-cluster entry {entry:?} is not name=peer-url"))?;
        if n.trim() == name {
            mine.push(url.trim().to_owned());
        } else {
            others.push(url.trim().to_owned());
        }
    }
    let peer_urls = match cfg.etcd.initial_advertise_peer_urls.as_deref() {
        Some(u) => u
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        None => mine,
    };
    if peer_urls.is_empty() {
        return Err(format!(
            "member {name:?} has no peer URL: --initial-cluster names no {name}=URL and --initial-advertise-peer-urls is not set"
        ));
    }
    Ok(Me {
        name,
        peer_urls,
        client_urls: cfg
            .etcd
            .advertise_client_urls
            .iter()
            .map(|u| u.to_string())
            .collect(),
        others,
    })
}

fn say(status: &watch::Sender<Option<String>>, what: &str) {
    if status.borrow().as_deref() != Some(what) {
        tracing::warn!("{what}");
        status.send_replace(Some(what.to_owned()));
    }
}

/// The `--initial-cluster` for starting `existing` with the members `list` names (ours under our
/// name: an added member has no name in the list yet).
fn existing_cluster(me: &Me, list: &[Member], cfg: &RunConfig) -> String {
    let configured: Vec<(String, String)> = cfg
        .etcd
        .initial_cluster
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter_map(|e| {
            e.split_once('=')
                .map(|(n, u)| (n.trim().to_owned(), u.trim().to_owned()))
        })
        .collect();
    let mut out = Vec::new();
    for m in list {
        let name = if m.has_peer_url(&me.peer_urls) {
            me.name.clone()
        } else if !m.name.is_empty() {
            m.name.clone()
        } else {
            match configured
                .iter()
                .find(|(_, u)| m.has_peer_url(std::slice::from_ref(u)))
            {
                Some((n, _)) => n.clone(),
                None => format!("{:x}", m.id),
            }
        };
        for u in &m.peer_urls {
            out.push(format!("{name}={u}"));
        }
    }
    out.join(",")
}

fn join_existing(cluster: String) -> Vec<(String, String)> {
    vec![
        ("initial-cluster-state".into(), "existing".into()),
        ("initial-cluster".into(), cluster),
    ]
}

/// Decides how this member starts, repairing it through its peers when its data is lost.
/// `status`: what holds this member back, for readiness and /status.
pub async fn prepare(
    cfg: &RunConfig,
    reaper: &Reaper,
    status: &watch::Sender<Option<String>>,
) -> Result<Decision, String> {
    let me = me(cfg)?;
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let data = cwd.join(&cfg.etcd.data_dir);
    loop {
        match step(cfg, reaper, &me, &data, status).await? {
            Some(d) => {
                status.send_replace(None);
                return Ok(d);
            }
            None => tokio::time::sleep(RETRY).await,
        }
    }
}

/// One look at the member's state; `None`: wait and look again.
async fn step(
    cfg: &RunConfig,
    reaper: &Reaper,
    me: &Me,
    data: &Path,
    status: &watch::Sender<Option<String>>,
) -> Result<Option<Decision>, String> {
    let journal = Journal::load(data)?;
    let dirs = crate::etcd::MemberDirs {
        data: data.to_owned(),
        wal: cfg.etcd.wal_path(),
    };
    let local = local::check(&dirs);
    let survey = peers::survey(&cfg.client, &me.others, &cfg.cluster_endpoints, &me.client_urls).await;
    // A cluster restore plan for this member, while the cluster has no quorum (or forced).
    if let Ok(store) = cfg.backup.open_store() {
        let plan = match super::restore::pending_plan(&store, &me.name, data).await {
            Ok(p) => p,
            Err(e) if survey.quorum.is_none() => {
                say(
                    status,
                    &format!("no quorum, and the store cannot be read for a restore plan ({e}): waiting"),
                );
                return Ok(None);
            }
            Err(_) => None,
        };
        // With quorum only when forced, or when that quorum is the plan's own new cluster: other
        // members restored by it already, and this one must join them the same way.
        let in_progress = match &plan {
            Some(p) if survey.quorum.is_some() && !p.force => {
                super::restore::others_done(&store, p, &me.name).await
            }
            _ => false,
        };
        let marker = super::restore::marker(data);
        if let Some(plan) =
            plan.filter(|p| super::restore::applies(p, survey.quorum.is_some(), in_progress, marker.as_ref()))
        {
            return match super::restore::apply(cfg, reaper, &store, data, &plan, status).await {
                Ok(d) => Ok(Some(d)),
                Err(e) => {
                    say(
                        status,
                        &format!("cluster restore plan {}: {e}; retrying", plan.id),
                    );
                    Ok(None)
                }
            };
        }
    }
    if local == LocalData::Sound
        && let Some((list, voter)) = &survey.quorum
        && let Some(m) = list.iter().find(|m| m.name == me.name && m.started())
        && !m.peer_urls.iter().all(|u| {
            me.peer_urls
                .iter()
                .any(|o| o.trim_end_matches('/') == u.trim_end_matches('/'))
        })
    {
        if m.is_learner {
            // etcd before 3.5.31 / 3.6.12 promotes a learner that gets a MemberUpdate
            // (etcd-io/etcd#21694): a learner is never updated, whatever the release.
            say(
                status,
                &format!(
                    "this member is learner {:x} and its peer URLs changed from {:?} to {:?}: the warden never updates a learner (etcd-io/etcd#21694 promotes it); remove it (`etcdctl member remove {:x}`) and it rejoins with the new URLs",
                    m.id, m.peer_urls, me.peer_urls, m.id
                ),
            );
            return Ok(None);
        }
        // Our flags advertise other peer URLs than the cluster has for us: tell the cluster
        // (through a voter) before etcd starts, so the peers dial the new address.
        match peers::update(&cfg.client, voter, m.id, &me.peer_urls).await {
            Ok(()) => {
                tracing::warn!(member = format!("{:x}", m.id), from = ?m.peer_urls, to = ?me.peer_urls, "this member's peer URLs changed: updated through a peer")
            }
            Err(e) => {
                say(
                    status,
                    &format!(
                        "updating this member's peer URLs from {:?} to {:?} failed ({e:?}); retrying",
                        m.peer_urls, me.peer_urls
                    ),
                );
                return Ok(None);
            }
        }
    }
    if local == LocalData::Sound {
        // A repair that got as far as starting etcd resumes at the promotion; otherwise the data
        // is what etcd starts on.
        return Ok(Some(match journal {
            Some(j) if j.learner_id.is_some() => {
                tracing::info!(
                    learner = format!("{:x}", j.learner_id.unwrap_or(0)),
                    "member data present and a repair journal: resuming the repair at the learner's promotion"
                );
                Decision::Join {
                    flags: Vec::new(),
                    learner: j.learner_id,
                    reason: "resuming a repair: the learner waits for its promotion".into(),
                }
            }
            other => {
                if other.is_some() {
                    // A journal without a learner: that repair never got to start etcd, and this
                    // data came from elsewhere (an operator's restore). It is what etcd starts on.
                    Journal::finish(data);
                }
                tracing::info!(data = %data.display(), "member data dir is sound: starting etcd as configured");
                Decision::Keep("member data dir sound".into())
            }
        }));
    }
    // Someone else serving as this member must not be disturbed (two etcds, one identity).
    for u in &me.peer_urls {
        if peers::members_from_peer(u).await.is_ok() {
            say(
                status,
                &format!(
                    "another process serves as member {} at {u}: its data dir is not touched and no etcd is started",
                    me.name
                ),
            );
            return Ok(None);
        }
    }
    let Some((list, voter)) = survey.quorum.clone() else {
        if let Some(j) = &journal {
            say(
                status,
                &format!(
                    "repair under way ({}), waiting for a member to answer with a leader to finish it ({})",
                    match &j.moved_aside {
                        Some(p) => format!("the broken data dir is kept at {}", p.display()),
                        None => "nothing moved".to_owned(),
                    },
                    survey.failures.join("; ")
                ),
            );
            return Ok(None);
        }
        return no_quorum(cfg, me, &local, &survey, status).await;
    };
    let evidence = format!(
        "our data: {}; a leader is seen through {voter}; members: {}",
        match &local {
            LocalData::Missing => "missing".to_owned(),
            LocalData::Broken(why) => format!("broken ({why})"),
            LocalData::Sound => "sound".to_owned(),
        },
        list.iter()
            .map(|m| format!(
                "{}{} {:x}{}",
                if m.name.is_empty() { "(unstarted)" } else { &m.name },
                if m.is_learner { " learner" } else { "" },
                m.id,
                if m.has_peer_url(&me.peer_urls) {
                    " = us"
                } else {
                    ""
                }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let listed = list.iter().find(|m| m.has_peer_url(&me.peer_urls)).cloned();
    let mut journal = journal.unwrap_or_else(|| Journal {
        format: 1,
        why: evidence.clone(),
        started_ms: crate::store::layout::now_ms(),
        ..Journal::default()
    });
    match listed {
        // Listed and never started: our own learner from an interrupted repair, or a member
        // added for us, or a first boot that came late: start `existing` as that member.
        Some(m) if !m.started() && local == LocalData::Missing => {
            let learner = m.is_learner.then_some(m.id);
            if learner.is_some() && journal.learner_id.is_none() {
                journal.learner_id = learner;
                journal.adding = false;
                journal.save(data)?;
            }
            tracing::info!(
                evidence,
                member = format!("{:x}", m.id),
                "listed but never started: starting etcd `existing`"
            );
            Ok(Some(Decision::Join {
                flags: join_existing(existing_cluster(me, &list, cfg)),
                learner,
                reason: format!("joined as listed member {:x}", m.id),
            }))
        }
        // Listed and started before, but our data is gone or broken: remove that entry first.
        Some(m) => {
            if let LocalData::Broken(why) = &local {
                let suffix = format!(
                    ".broken-{}",
                    crate::store::layout::format_time(crate::store::layout::now_ms())
                );
                let to = crate::restore::startup::beside(data, &suffix);
                journal.moved_aside = Some(to.clone());
                journal.save(data)?;
                // With --wal-dir the WAL goes aside too (to `<wal-dir><suffix>`): the learner
                // must start on an empty WAL.
                crate::etcd::MemberDirs {
                    data: data.to_owned(),
                    wal: cfg.etcd.wal_path(),
                }
                .move_aside(&suffix)?;
                tracing::warn!(why, from = %data.display(), to = %to.display(), "broken member data moved aside (kept, not deleted)");
            }
            tracing::warn!(
                evidence,
                member = format!("{:x}", m.id),
                "this member's data is lost while its peers keep quorum: repairing through the peers (remove, add as learner, start `existing`)"
            );
            say(
                status,
                &format!("repairing: removing the old member entry {:x}", m.id),
            );
            journal.old_member_id = Some(m.id);
            journal.save(data)?;
            match peers::remove(&cfg.client, &voter, m.id).await {
                Ok(()) | Err(ChangeError::NotFound) => {
                    journal.removed = true;
                    journal.save(data)?;
                    tracing::info!(member = format!("{:x}", m.id), "old member entry removed");
                    failpoint("repair-after-remove");
                }
                Err(e) => {
                    say(
                        status,
                        &format!("repairing: removing member {:x} failed ({e:?}); retrying", m.id),
                    );
                    return Ok(None);
                }
            }
            // Look again: the add comes with a fresh member list.
            Ok(None)
        }
        None => {
            say(
                status,
                &format!("repairing: adding member {} as a learner", me.name),
            );
            journal.adding = true;
            journal.save(data)?;
            match peers::add_learner(&cfg.client, &voter, &me.peer_urls).await {
                Ok(id) => {
                    failpoint("repair-after-add");
                    journal.learner_id = Some(id);
                    journal.adding = false;
                    journal.save(data)?;
                    tracing::info!(
                        evidence,
                        learner = format!("{id:x}"),
                        "added as a learner: starting etcd `existing`"
                    );
                    let mut members = list.clone();
                    members.push(Member {
                        id,
                        name: String::new(),
                        peer_urls: me.peer_urls.clone(),
                        client_urls: Vec::new(),
                        is_learner: true,
                    });
                    Ok(Some(Decision::Join {
                        flags: join_existing(existing_cluster(me, &members, cfg)),
                        learner: Some(id),
                        reason: format!("rejoined as learner {id:x}"),
                    }))
                }
                Err(ChangeError::TooManyLearners) => {
                    say(
                        status,
                        "repairing: another member is a learner (etcd allows one at a time): waiting for its promotion",
                    );
                    Ok(None)
                }
                Err(e) => {
                    say(
                        status,
                        &format!("repairing: adding this member as a learner failed ({e:?}); retrying"),
                    );
                    Ok(None)
                }
            }
        }
    }
}

/// No member answered with a leader.
async fn no_quorum(
    cfg: &RunConfig,
    me: &Me,
    local: &LocalData,
    survey: &Survey,
    status: &watch::Sender<Option<String>>,
) -> Result<Option<Decision>, String> {
    let failures = survey.failures.join("; ");
    if let LocalData::Broken(why) = local {
        say(
            status,
            &format!(
                "member data is broken ({why}) and no member answers with a leader: a repair needs quorum; waiting, nothing changed ({failures})"
            ),
        );
        return Ok(None);
    }
    let mut evidence = Vec::new();
    if survey.we_started_before(&me.peer_urls) {
        evidence.push("a peer's member list shows this member ran before".to_owned());
    } else if let Some(list) = survey.members()
        && list.iter().any(Member::started)
    {
        evidence.push("a peer's member list shows members that ran".to_owned());
    }
    match cfg.backup.open_store() {
        Ok(store) => match store.get_owner().await {
            // Evidence only when the record is this member's cluster's (it lists our peer URL): a
            // prefix another cluster claimed says nothing about ours (that one writes nothing there).
            Ok(Some(o))
                if o.members.iter().any(|m| {
                    m.peer_urls.iter().any(|u| {
                        me.peer_urls
                            .iter()
                            .any(|p| p.trim_end_matches('/') == u.trim_end_matches('/'))
                    })
                }) =>
            {
                evidence.push(format!(
                    "the store records cluster {:x} (claimed by {})",
                    o.cluster_id, o.claimed_by
                ));
            }
            Ok(_) => {}
            Err(e) => {
                say(
                    status,
                    &format!(
                        "member data missing, no member answers with a leader, and the store cannot be read ({}): waiting rather than bootstrapping a cluster that may exist",
                        crate::telemetry::error_chain(&e)
                    ),
                );
                return Ok(None);
            }
        },
        Err(e) => tracing::debug!(error = %e, "no store to ask whether the cluster existed"),
    }
    // A prefix that etcd-backup-restore backed up (a switch from it, `crate::gbr`) had a cluster
    // too, though no warden recorded it.
    if evidence.is_empty()
        && let Ok(store) = cfg.backup.open_store()
    {
        match store.gbr_catalog_with_meta().await {
            Ok((fulls, _)) => {
                if let Some((newest, _)) = fulls.last() {
                    evidence.push(format!(
                        "the store holds etcd-backup-restore's backups (newest {})",
                        newest.key()
                    ));
                }
            }
            Err(e) => {
                say(
                    status,
                    &format!(
                        "member data missing, no member answers with a leader, and the store cannot be listed ({}): waiting rather than bootstrapping a cluster that may exist",
                        crate::telemetry::error_chain(&e)
                    ),
                );
                return Ok(None);
            }
        }
    }
    if evidence.is_empty() {
        tracing::info!(
            peers = failures,
            "member data missing, no leader, no record of this cluster: first boot as configured"
        );
        return Ok(Some(Decision::Keep("first boot of the cluster".into())));
    }
    say(
        status,
        &format!(
            "quorum lost: this member's data is missing and no member answers with a leader, while {}; etcd is not started (a new cluster would fork the old one). Bring a majority of the members back, or restore the whole cluster from the store: etcd-warden cluster restore --store {}",
            evidence.join(" and "),
            cfg.store
        ),
    );
    Ok(None)
}

//! A cluster member's part of the start-up (`crate::startup` decides, from the table in
//! `crate::startup::decide`): the facts only the peers and the store can give, and the repair's
//! steps through the peers. Every step is logged with its evidence and journaled
//! ([`crate::cluster::journal`]) so a warden killed at any step resumes it. A member rejoins through its
//! peers, never from the store: restoring one member from a backup while the others keep quorum
//! would fork the cluster.

use std::path::Path;

use super::member::MemberConfig;
use crate::cluster::journal::Journal;
use crate::cluster::peers::{self, ChangeError, Member, Survey};
use crate::etcd::local::LocalData;
use crate::startup::Decision;
use crate::startup::decide::{Listed, Local, Peers};

use crate::failpoint::die as failpoint;

/// This member, as its etcd flags describe it.
pub struct Me {
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    /// The other members' peer URLs from `--initial-cluster`.
    pub others: Vec<String>,
}

pub fn me(cfg: &MemberConfig) -> Result<Me, String> {
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

/// The `--initial-cluster` for starting `existing` with the members `list` names (ours under our
/// name: an added member has no name in the list yet).
fn existing_cluster(me: &Me, list: &[Member], cfg: &MemberConfig) -> String {
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

/// The table's view of the local data.
pub fn local_fact(local: &LocalData) -> Local {
    match local {
        LocalData::Missing => Local::Missing,
        LocalData::Sound => Local::Sound,
        LocalData::Broken(why) => Local::Broken(why.clone()),
    }
}

/// The table's view of the peers: quorum, our entry by peer URL, our entry by name when its peer
/// URLs changed, and another process serving as this member.
pub async fn peers_fact(me: &Me, survey: &Survey, local: &LocalData) -> Peers {
    let listed = |m: &Member| Listed {
        id: m.id,
        started: m.started(),
        learner: m.is_learner,
    };
    let list = survey
        .quorum
        .as_ref()
        .map(|(l, _)| l.as_slice())
        .unwrap_or_default();
    let moved = list
        .iter()
        .find(|m| m.name == me.name && m.started())
        .filter(|m| {
            !m.peer_urls.iter().all(|u| {
                me.peer_urls
                    .iter()
                    .any(|o| o.trim_end_matches('/') == u.trim_end_matches('/'))
            })
        })
        .map(listed);
    // Someone else serving as this member must not be disturbed (two etcds, one identity); asked
    // only when this member's data is not sound (its own etcd is not running yet then).
    let mut impostor = None;
    if *local != LocalData::Sound {
        for u in &me.peer_urls {
            if peers::members_from_peer(u).await.is_ok() {
                impostor = Some(format!(
                    "another process serves as member {} at {u}: its data dir is not touched and no etcd is started",
                    me.name
                ));
                break;
            }
        }
    }
    Peers {
        quorum: survey.quorum.is_some(),
        by_url: list.iter().find(|m| m.has_peer_url(&me.peer_urls)).map(listed),
        moved,
        impostor,
    }
}

/// Our peer URLs changed: tell the cluster (through a voter) before etcd starts, so the peers dial
/// the new address.
pub async fn update_peer_urls(cfg: &MemberConfig, me: &Me, survey: &Survey, id: u64) -> Result<(), String> {
    let Some((list, voter)) = &survey.quorum else {
        return Err("no voter to ask".into());
    };
    let from = list
        .iter()
        .find(|m| m.id == id)
        .map(|m| m.peer_urls.clone())
        .unwrap_or_default();
    match peers::update(&cfg.client, voter, id, &me.peer_urls).await {
        Ok(()) => {
            tracing::warn!(member = format!("{id:x}"), from = ?from, to = ?me.peer_urls, "this member's peer URLs changed: updated through a peer");
            Ok(())
        }
        Err(e) => Err(format!(
            "updating this member's peer URLs from {from:?} to {:?} failed ({e:?}); retrying",
            me.peer_urls
        )),
    }
}

/// The member list and the voter asked, with the evidence line for the log.
fn evidence(me: &Me, local: &LocalData, list: &[Member], voter: &str) -> String {
    format!(
        "our data: {}; a leader is seen through {voter}; members: {}",
        match local {
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
    )
}

fn journal_or_new(journal: Option<Journal>, why: String) -> Journal {
    journal.unwrap_or_else(|| Journal {
        format: 1,
        why,
        started_ms: crate::store::layout::now_ms(),
        ..Journal::default()
    })
}

/// What one look at the member found: the repair's steps read it.
pub struct Round<'a> {
    pub cfg: &'a MemberConfig,
    pub me: &'a Me,
    pub data: &'a Path,
    pub survey: &'a Survey,
    pub local: &'a LocalData,
}

/// Listed and never started: our own learner from an interrupted repair, or a member added for
/// us, or a first boot that came late: start `existing` as that member.
pub fn join_listed(
    r: &Round<'_>,
    journal: Option<Journal>,
    id: u64,
    learner: bool,
) -> Result<Decision, String> {
    let Round {
        cfg,
        me,
        data,
        survey,
        local,
    } = *r;
    let (list, voter) = survey.quorum.clone().ok_or("no voter to ask")?;
    let why = evidence(me, local, &list, &voter);
    let mut journal = journal_or_new(journal, why.clone());
    let learner = learner.then_some(id);
    if learner.is_some() && journal.learner_id.is_none() {
        journal.learner_id = learner;
        journal.adding = false;
        journal.save(data)?;
    }
    tracing::info!(
        evidence = why,
        member = format!("{id:x}"),
        "listed but never started: starting etcd `existing`"
    );
    Ok(Decision::Join {
        flags: join_existing(existing_cluster(me, &list, cfg)),
        learner,
        reason: format!("joined as listed member {id:x}"),
    })
}

/// Listed and started before, but our data is gone or broken: remove that entry first (a broken
/// dir moved aside before, kept). `Err`: why not yet (retried); a journal that cannot be written
/// is `Err` too, and stops nothing else.
pub async fn remove_entry(
    r: &Round<'_>,
    journal: Option<Journal>,
    id: u64,
    move_aside: bool,
) -> Result<(), String> {
    let Round {
        cfg,
        me,
        data,
        survey,
        local,
    } = *r;
    let (list, voter) = survey.quorum.clone().ok_or("no voter to ask")?;
    let why = evidence(me, local, &list, &voter);
    let mut journal = journal_or_new(journal, why.clone());
    if move_aside && let LocalData::Broken(broken) = local {
        let suffix = format!(
            ".broken-{}",
            crate::store::layout::format_time(crate::store::layout::now_ms())
        );
        let to = crate::etcd::dirs::beside(data, &suffix);
        journal.moved_aside = Some(to.clone());
        journal.save(data)?;
        // With --wal-dir the WAL goes aside too (to `<wal-dir><suffix>`): the learner must start on
        // an empty WAL.
        crate::etcd::MemberDirs {
            data: data.to_owned(),
            wal: cfg.etcd.wal_path(),
        }
        .move_aside(&suffix)?;
        tracing::warn!(why = broken, from = %data.display(), to = %to.display(), "broken member data moved aside (kept, not deleted)");
    }
    tracing::warn!(
        evidence = why,
        member = format!("{id:x}"),
        "this member's data is lost while its peers keep quorum: repairing through the peers (remove, add as learner, start `existing`)"
    );
    journal.old_member_id = Some(id);
    journal.save(data)?;
    match peers::remove(&cfg.client, &voter, id).await {
        Ok(()) | Err(ChangeError::NotFound) => {
            journal.removed = true;
            journal.save(data)?;
            tracing::info!(member = format!("{id:x}"), "old member entry removed");
            failpoint("repair-after-remove");
            Ok(())
        }
        Err(e) => Err(format!(
            "repairing: removing member {id:x} failed ({e:?}); retrying"
        )),
    }
}

/// Not listed: add this member as a learner and start `existing`. `Ok(Err(why))`: not yet.
pub async fn add_learner(
    r: &Round<'_>,
    journal: Option<Journal>,
) -> Result<Result<Decision, String>, String> {
    let Round {
        cfg,
        me,
        data,
        survey,
        local,
    } = *r;
    let (list, voter) = survey.quorum.clone().ok_or("no voter to ask")?;
    let why = evidence(me, local, &list, &voter);
    let mut journal = journal_or_new(journal, why.clone());
    journal.adding = true;
    journal.save(data)?;
    match peers::add_learner(&cfg.client, &voter, &me.peer_urls).await {
        Ok(id) => {
            failpoint("repair-after-add");
            journal.learner_id = Some(id);
            journal.adding = false;
            journal.save(data)?;
            tracing::info!(
                evidence = why,
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
            Ok(Ok(Decision::Join {
                flags: join_existing(existing_cluster(me, &members, cfg)),
                learner: Some(id),
                reason: format!("rejoined as learner {id:x}"),
            }))
        }
        Err(ChangeError::TooManyLearners) => Ok(Err(
            "repairing: another member is a learner (etcd allows one at a time): waiting for its promotion"
                .into(),
        )),
        Err(e) => Ok(Err(format!(
            "repairing: adding this member as a learner failed ({e:?}); retrying"
        ))),
    }
}

/// Evidence that this member's cluster existed, for a member whose data is missing while no member
/// answers with a leader: a peer's list showing members that ran, the store's record of this
/// cluster, etcd-backup-restore's backups under the prefix. `Err`: the store cannot be read.
pub async fn history(cfg: &MemberConfig, me: &Me, survey: &Survey) -> Result<Vec<String>, String> {
    let mut evidence = Vec::new();
    if survey.we_started_before(&me.peer_urls) {
        evidence.push("a peer's member list shows this member ran before".to_owned());
    } else if let Some(list) = survey.members()
        && list.iter().any(Member::started)
    {
        evidence.push("a peer's member list shows members that ran".to_owned());
    }
    let store = match cfg.backup.open_store() {
        Ok(store) => store,
        Err(e) => {
            tracing::debug!(error = %e, "no store to ask whether the cluster existed");
            return Ok(evidence);
        }
    };
    match store.get_owner().await {
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
        Err(e) => return Err(crate::telemetry::error_chain(&e)),
    }
    // A prefix that etcd-backup-restore backed up (a switch from it, `crate::store::gbr`) had a cluster
    // too, though no warden recorded it.
    if evidence.is_empty() {
        let (fulls, _) = store
            .gbr_catalog_with_meta()
            .await
            .map_err(|e| crate::telemetry::error_chain(&e))?;
        if let Some((newest, _)) = fulls.last() {
            evidence.push(format!(
                "the store holds etcd-backup-restore's backups (newest {})",
                newest.key()
            ));
        }
    }
    Ok(evidence)
}

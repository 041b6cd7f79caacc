//! How a member starts, as one pure function of what the driver found out: the local data dir, the
//! store, the peers, a pending cluster restore plan, a repair journal and the leave marker. A single
//! member and a cluster member are rows of the same table; the driver (`super::prepare`) gathers
//! facts, calls [`decide`], carries the action out and asks again until the action starts etcd.
//! Facts the table needs but the driver has not gathered yet (the store's newest backup, the local
//! revision, the history of the cluster) are asked for by an action, so costly checks run only
//! where a row depends on them.
//!
//! | leave marker | member | local data | store / peers / plan | action |
//! |---|---|---|---|---|
//! | yes | any | any | any | wait until the marker is removed |
//! | — | single | any | store not asked | list the store |
//! | — | single | missing | store unreachable | wait for the store (never start an empty etcd that looks like data loss) |
//! | — | single | present | store unreachable | start etcd on it |
//! | — | single | any | no backup | start etcd as is (a new member when empty) |
//! | — | single | missing | newest backup N | restore |
//! | — | single | present | newest backup N | validate it with a private etcd |
//! | — | single | at revision R ≥ N | newest backup N | start etcd on it |
//! | — | single | at revision R < N | newest backup N, no catch-up tried | catch up: the store's revisions after R written into its db, once shown to be the store's history (`crate::restore::catchup`) |
//! | — | single | at revision R < N | newest backup N, the catch-up refused or failed | move it aside (behind), restore, never below R |
//! | — | single | broken (etcd refused it) | newest backup N | move it aside (broken), restore, never below its db file's revision |
//! | — | single | unknown, db file at D ≥ N | newest backup N | start etcd on it |
//! | — | single | unknown, db file below N or unreadable | newest backup N | wait, change nothing, validate again |
//! | — | cluster | any | no quorum, plan unreadable | wait |
//! | — | cluster | any | a plan that applies | restore by the plan |
//! | — | cluster | sound | quorum; our entry has other peer URLs | a learner: wait; a voter: update the URLs |
//! | — | cluster | sound | a repair journal with a learner | start as that learner (resume at the promotion) |
//! | — | cluster | sound | — | start etcd on it |
//! | — | cluster | missing/broken | another process serves as this member | wait, touch nothing |
//! | — | cluster | missing/broken | no quorum, a repair journal | wait for quorum to finish the repair |
//! | — | cluster | broken | no quorum | wait, change nothing |
//! | — | cluster | missing | no quorum, history not asked | ask the peers' lists and the store whether the cluster existed |
//! | — | cluster | missing | no quorum, the cluster existed | wait: "quorum lost" (never a second cluster) |
//! | — | cluster | missing | no quorum, no record of it | first boot as configured |
//! | — | cluster | missing | quorum; listed, never started | start `existing` as that member |
//! | — | cluster | missing/broken | quorum; listed, started before | remove the old entry (a broken dir moved aside first) |
//! | — | cluster | missing | quorum; not listed | add as a learner, start `existing` |

/// The local data dir.
#[derive(Debug, Clone, PartialEq)]
pub enum Local {
    /// No data dir, or an empty one.
    Missing,
    /// Data is there, not validated yet (a single member validates it with a private etcd).
    Present,
    /// The files etcd opens first are sound (a cluster member's check, without starting etcd).
    Sound,
    /// Validated: a private etcd served it at this revision.
    At(i64),
    /// etcd cannot start on it: why (etcd's own refusal).
    Broken(String),
    /// The private etcd could not be asked (no answer in time, no process): no evidence either
    /// way, so nothing may be moved or restored on it.
    Unknown(String),
}

/// The entry of this member in the cluster's member list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub id: u64,
    /// It ran before (etcd lists a name only for a member that started).
    pub started: bool,
    pub learner: bool,
}

/// What the peers say (cluster members).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peers {
    /// A member answered with a leader and a linearizable read.
    pub quorum: bool,
    /// Our entry, found by our peer URL.
    pub by_url: Option<Listed>,
    /// Our entry found by our name, started, whose peer URLs differ from ours (changed flags).
    pub moved: Option<Listed>,
    /// Another process answers on our peer URL as this member.
    pub impostor: Option<String>,
}

/// Everything the table reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Set while the leave marker is there: why the member waits.
    pub left: Option<String>,
    /// More than one member (flags, or the data dir's own membership).
    pub cluster: bool,
    pub local: Local,
    /// The revision of the data dir's db file, read offline (`None`: missing or unreadable): the
    /// floor no restore may go below, whatever the private etcd said or failed to say.
    pub offline: Option<i64>,
    /// Single member: the newest revision a restore would reach (`Ok(None)`: no backup); `None`
    /// while not asked.
    pub newest_backup: Option<Result<Option<i64>, String>>,
    /// Cluster: the store's plan for this member — `Ok(Some(applies))` when one is pending for it,
    /// `Err` when the store cannot be read (`None`: no store configured).
    pub plan: Option<Result<Option<bool>, String>>,
    pub peers: Peers,
    /// A repair journal: `Some(learner id)` once the repair added our learner.
    pub journal: Option<Option<u64>>,
    /// Evidence that the cluster existed (a peer's list, the store's record, GBR's backups):
    /// `None` while not asked, `Err` when the store cannot be read.
    pub existed: Option<Result<Vec<String>, String>>,
    /// Single member behind the store: why catching it up was refused or failed (`None`: not
    /// tried yet).
    pub catch_up: Option<String>,
}

impl Facts {
    /// What a driver knows before asking anything but the local checks.
    pub fn new(cluster: bool, local: Local) -> Self {
        Self {
            left: None,
            cluster,
            local,
            offline: None,
            newest_backup: None,
            plan: None,
            peers: Peers::default(),
            journal: None,
            existed: None,
            catch_up: None,
        }
    }
}

/// Why the data dir is moved aside before a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aside {
    Behind,
    Broken,
}

impl Aside {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Behind => "behind",
            Self::Broken => "broken",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Change nothing; say why and look again.
    Wait(String),
    /// Start etcd as configured, on the data dir as it is.
    Start(String),
    /// Gather: the store's newest backup.
    ListStore,
    /// Gather: start a private etcd on the data dir and read its revision.
    Validate,
    /// Gather: whether the cluster existed.
    AskHistory,
    /// Restore from the store (single member): the data dir moved aside first when there is one;
    /// `floor`: the local revision nothing older may replace.
    Restore {
        aside: Option<Aside>,
        floor: Option<i64>,
    },
    /// Write the store's revisions after `from` into the data dir's own db (single member behind
    /// the store), when it is shown to be the store's history; else say why.
    CatchUp { from: i64 },
    /// Restore by the store's cluster restore plan.
    ApplyPlan,
    /// Tell the cluster (through a voter) this member's new peer URLs.
    UpdatePeerUrls { id: u64 },
    /// A repair got as far as adding our learner: start as it and wait for the promotion.
    ResumeRepair { learner: u64 },
    /// Start `existing` as the listed, never-started member.
    JoinListed { id: u64, learner: bool },
    /// Remove our old entry (moving a broken dir aside first), then look again.
    RemoveEntry { id: u64, move_aside: bool },
    /// Add this member as a learner and start `existing`.
    AddLearner,
}

/// The table.
pub fn decide(f: &Facts) -> Action {
    if let Some(why) = &f.left {
        return Action::Wait(why.clone());
    }
    if f.cluster { cluster(f) } else { single(f) }
}

fn single(f: &Facts) -> Action {
    let newest = match &f.newest_backup {
        None => return Action::ListStore,
        Some(Err(e)) if f.local == Local::Missing => {
            return Action::Wait(format!(
                "the data dir is empty and the store cannot be listed ({e}): waiting for the store rather than starting an empty etcd"
            ));
        }
        Some(Err(_)) => return Action::Start("store unreachable; local data kept".into()),
        Some(Ok(None)) => {
            return Action::Start(if f.local == Local::Missing {
                "no backups: starting a new member".into()
            } else {
                "no backups to compare with".into()
            });
        }
        Some(Ok(Some(n))) => *n,
    };
    match &f.local {
        Local::Missing => Action::Restore {
            aside: None,
            floor: None,
        },
        Local::Present | Local::Sound => Action::Validate,
        Local::At(r) if *r >= newest => Action::Start(format!("local revision {r} ≥ newest backup {newest}")),
        Local::At(r) if f.catch_up.is_none() => Action::CatchUp { from: *r },
        Local::At(r) => Action::Restore {
            aside: Some(Aside::Behind),
            floor: Some((*r).max(f.offline.unwrap_or(0))),
        },
        Local::Broken(_) => Action::Restore {
            aside: Some(Aside::Broken),
            floor: f.offline,
        },
        Local::Unknown(why) => match f.offline {
            Some(d) if d >= newest => Action::Start(format!(
                "the data dir could not be validated ({why}), but its db file is at revision {d} ≥ newest backup {newest}"
            )),
            Some(d) => Action::Wait(format!(
                "the data dir could not be validated ({why}) and its db file is at revision {d}, below the newest backup {newest} (its WAL may hold more): nothing moved or restored; validating again"
            )),
            None => Action::Wait(format!(
                "the data dir could not be validated ({why}) and its db file cannot be read offline: nothing moved or restored; validating again"
            )),
        },
    }
}

fn cluster(f: &Facts) -> Action {
    let p = &f.peers;
    match &f.plan {
        Some(Err(e)) if !p.quorum => {
            return Action::Wait(format!(
                "no quorum, and the store cannot be read for a restore plan ({e}): waiting"
            ));
        }
        Some(Ok(Some(true))) => return Action::ApplyPlan,
        _ => {}
    }
    if matches!(f.local, Local::Sound | Local::At(_)) {
        if p.quorum
            && let Some(m) = p.moved
        {
            if m.learner {
                return Action::Wait(format!(
                    "this member is learner {:x} and its peer URLs changed: the warden never updates a learner (etcd-io/etcd#21694 promotes it); remove it (`etcdctl member remove {:x}`) and it rejoins with the new URLs",
                    m.id, m.id
                ));
            }
            return Action::UpdatePeerUrls { id: m.id };
        }
        if let Some(Some(learner)) = f.journal {
            return Action::ResumeRepair { learner };
        }
        return Action::Start("member data dir sound".into());
    }
    if let Some(who) = &p.impostor {
        return Action::Wait(who.clone());
    }
    if !p.quorum {
        if f.journal.is_some() {
            return Action::Wait(
                "repair under way, waiting for a member to answer with a leader to finish it".into(),
            );
        }
        if let Local::Broken(why) = &f.local {
            return Action::Wait(format!(
                "member data is broken ({why}) and no member answers with a leader: a repair needs quorum; waiting, nothing changed"
            ));
        }
        return match &f.existed {
            None => Action::AskHistory,
            Some(Err(e)) => Action::Wait(format!(
                "member data missing, no member answers with a leader, and the store cannot be read ({e}): waiting rather than bootstrapping a cluster that may exist"
            )),
            Some(Ok(evidence)) if evidence.is_empty() => Action::Start("first boot of the cluster".into()),
            Some(Ok(evidence)) => Action::Wait(format!(
                "quorum lost: this member's data is missing and no member answers with a leader, while {}; etcd is not started (a new cluster would fork the old one)",
                evidence.join(" and ")
            )),
        };
    }
    match p.by_url {
        Some(m) if !m.started && f.local == Local::Missing => Action::JoinListed {
            id: m.id,
            learner: m.learner,
        },
        Some(m) => Action::RemoveEntry {
            id: m.id,
            move_aside: matches!(f.local, Local::Broken(_)),
        },
        None => Action::AddLearner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(local: Local, newest: Option<Result<Option<i64>, String>>) -> Facts {
        Facts {
            newest_backup: newest,
            ..Facts::new(false, local)
        }
    }

    fn offline(f: Facts, revision: i64) -> Facts {
        Facts {
            offline: Some(revision),
            ..f
        }
    }

    fn refused(f: Facts) -> Facts {
        Facts {
            catch_up: Some("not this store's history".into()),
            ..f
        }
    }

    fn member(local: Local, quorum: bool) -> Facts {
        Facts {
            peers: Peers {
                quorum,
                ..Peers::default()
            },
            plan: Some(Ok(None)),
            ..Facts::new(true, local)
        }
    }

    const LISTED: Listed = Listed {
        id: 7,
        started: true,
        learner: false,
    };

    #[test]
    fn the_leave_marker_holds_every_row() {
        for f in [single(Local::Missing, None), member(Local::Sound, true)] {
            let f = Facts {
                left: Some("left".into()),
                ..f
            };
            assert_eq!(decide(&f), Action::Wait("left".into()));
        }
    }

    #[test]
    fn single_member_rows() {
        use Action::*;
        let err = || Some(Err("down".to_owned()));
        let rows: Vec<(Facts, Action)> = vec![
            (single(Local::Missing, None), ListStore),
            (single(Local::Present, None), ListStore),
            (single(Local::Missing, err()), Wait(String::new())),
            (single(Local::Present, err()), Start(String::new())),
            (single(Local::Missing, Some(Ok(None))), Start(String::new())),
            (single(Local::Present, Some(Ok(None))), Start(String::new())),
            (
                single(Local::Missing, Some(Ok(Some(10)))),
                Restore {
                    aside: None,
                    floor: None,
                },
            ),
            (single(Local::Present, Some(Ok(Some(10)))), Validate),
            (single(Local::At(10), Some(Ok(Some(10)))), Start(String::new())),
            (single(Local::At(11), Some(Ok(Some(10)))), Start(String::new())),
            (single(Local::At(9), Some(Ok(Some(10)))), CatchUp { from: 9 }),
            (
                refused(single(Local::At(9), Some(Ok(Some(10))))),
                Restore {
                    aside: Some(Aside::Behind),
                    floor: Some(9),
                },
            ),
            (
                single(Local::Broken("x".into()), Some(Ok(Some(10)))),
                Restore {
                    aside: Some(Aside::Broken),
                    floor: None,
                },
            ),
            // The db file's own revision is the floor, whatever the private etcd said.
            (
                offline(single(Local::Broken("x".into()), Some(Ok(Some(10)))), 7),
                Restore {
                    aside: Some(Aside::Broken),
                    floor: Some(7),
                },
            ),
            (
                refused(offline(single(Local::At(5), Some(Ok(Some(10)))), 8)),
                Restore {
                    aside: Some(Aside::Behind),
                    floor: Some(8),
                },
            ),
            // Nothing learnt is no evidence: never moved aside or restored on that.
            (
                single(Local::Unknown("timeout".into()), Some(Ok(Some(10)))),
                Wait(String::new()),
            ),
            (
                offline(single(Local::Unknown("timeout".into()), Some(Ok(Some(10)))), 9),
                Wait(String::new()),
            ),
            (
                offline(single(Local::Unknown("timeout".into()), Some(Ok(Some(10)))), 10),
                Start(String::new()),
            ),
        ];
        for (f, want) in rows {
            assert!(
                same_row(&decide(&f), &want),
                "{f:?}: {:?}, want {want:?}",
                decide(&f)
            );
        }
    }

    #[test]
    fn cluster_member_rows() {
        use Action::*;
        let with = |mut f: Facts, g: &dyn Fn(&mut Facts)| {
            g(&mut f);
            f
        };
        let rows: Vec<(Facts, Action)> = vec![
            // Plans.
            (
                with(member(Local::Missing, false), &|f| {
                    f.plan = Some(Err("down".into()))
                }),
                Wait(String::new()),
            ),
            (
                with(member(Local::Sound, true), &|f| f.plan = Some(Err("down".into()))),
                Start(String::new()),
            ),
            (
                with(member(Local::Sound, true), &|f| f.plan = Some(Ok(Some(true)))),
                ApplyPlan,
            ),
            (
                with(member(Local::Sound, true), &|f| f.plan = Some(Ok(Some(false)))),
                Start(String::new()),
            ),
            // Sound data.
            (member(Local::Sound, false), Start(String::new())),
            (
                with(member(Local::Sound, true), &|f| f.peers.moved = Some(LISTED)),
                UpdatePeerUrls { id: 7 },
            ),
            (
                with(member(Local::Sound, true), &|f| {
                    f.peers.moved = Some(Listed {
                        learner: true,
                        ..LISTED
                    })
                }),
                Wait(String::new()),
            ),
            (
                with(member(Local::Sound, false), &|f| f.journal = Some(Some(9))),
                ResumeRepair { learner: 9 },
            ),
            (
                with(member(Local::Sound, false), &|f| f.journal = Some(None)),
                Start(String::new()),
            ),
            // Someone else is this member.
            (
                with(member(Local::Missing, true), &|f| {
                    f.peers.impostor = Some("other".into())
                }),
                Wait(String::new()),
            ),
            // No quorum.
            (
                with(member(Local::Missing, false), &|f| f.journal = Some(None)),
                Wait(String::new()),
            ),
            (member(Local::Broken("x".into()), false), Wait(String::new())),
            (member(Local::Missing, false), AskHistory),
            (
                with(member(Local::Missing, false), &|f| {
                    f.existed = Some(Err("down".into()))
                }),
                Wait(String::new()),
            ),
            (
                with(member(Local::Missing, false), &|f| {
                    f.existed = Some(Ok(vec!["x".into()]))
                }),
                Wait(String::new()),
            ),
            (
                with(member(Local::Missing, false), &|f| {
                    f.existed = Some(Ok(Vec::new()))
                }),
                Start(String::new()),
            ),
            // Quorum: repair through the peers.
            (
                with(member(Local::Missing, true), &|f| {
                    f.peers.by_url = Some(Listed {
                        started: false,
                        learner: true,
                        ..LISTED
                    })
                }),
                JoinListed { id: 7, learner: true },
            ),
            (
                with(member(Local::Missing, true), &|f| f.peers.by_url = Some(LISTED)),
                RemoveEntry {
                    id: 7,
                    move_aside: false,
                },
            ),
            (
                with(member(Local::Broken("x".into()), true), &|f| {
                    f.peers.by_url = Some(Listed {
                        started: false,
                        ..LISTED
                    })
                }),
                RemoveEntry {
                    id: 7,
                    move_aside: true,
                },
            ),
            (member(Local::Missing, true), AddLearner),
        ];
        for (f, want) in rows {
            assert!(
                same_row(&decide(&f), &want),
                "{f:?}: {:?}, want {want:?}",
                decide(&f)
            );
        }
    }

    /// Equal actions; a `Wait` or `Start` matches by kind (their texts are for people).
    fn same_row(got: &Action, want: &Action) -> bool {
        match (got, want) {
            (Action::Wait(_), Action::Wait(_)) | (Action::Start(_), Action::Start(_)) => true,
            _ => got == want,
        }
    }
}

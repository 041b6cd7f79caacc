//! The writer's part of keeping etcd's space: defragmentation between snapshots, compaction of
//! `--space-history`, and the NOSPACE repair.

use std::time::{Duration, SystemTime};

use etcd_client::Client;

use super::status::DefragInfo;
use super::writer::Backup;
use super::writer::Outcome;
use crate::snapshot::delta::DeltaBuffer;
use crate::store::Store;

/// How long a cluster's new writer leaves a NOSPACE alarm to the writer before it, when its own
/// member is already defragmented (see `keep_space`).
const TAKEOVER_GRACE: Duration = Duration::from_secs(60);

impl Backup {
    /// The scheduled defragmentation while streaming; a leadership it moved ends the stream.
    pub(super) async fn defrag_between(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        if !self.defrag(client).await {
            return None;
        }
        self.flush(store, buf).await;
        self.status.send_modify(|s| s.role = Some("follower".into()));
        Some(Outcome::Reconnect)
    }

    /// The space keeper's check while streaming; a leadership its work moved ends the stream.
    pub(super) async fn keep_space_between(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        if !self.keep_space(client, store, buf).await {
            return None;
        }
        self.flush(store, buf).await;
        self.status.send_modify(|s| s.role = Some("follower".into()));
        Some(Outcome::Reconnect)
    }

    /// Defragments etcd's backend. While it runs etcd answers nothing, so the health loop is told
    /// to hold its verdict (rule 1: a single member's readiness is not a defrag's business).
    /// `true`: this member's leadership was moved away for it (the caller hands over).
    pub(super) async fn defrag(&mut self, client: &mut Client) -> bool {
        // A cluster's writer defragments the followers first, one at a time and only while every
        // member is healthy, and its own member (the leader) last, once leadership moved to a
        // follower: a blocked leader would stall every write until an election.
        let mut moved = false;
        if self.cfg.cluster {
            let Some(followers) = self.defrag_followers(client).await else {
                return false;
            };
            if let Some(target) = followers.first() {
                match crate::space::keeper::move_leader(client, *target).await {
                    Ok(()) => {
                        tracing::info!(
                            to = format!("{target:x}"),
                            "leadership moved to a defragmented follower before defragmenting this member"
                        );
                        moved = true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot move leadership away: defragmenting this member as the leader")
                    }
                }
            }
        }
        let size = |c: &mut Client| {
            let mut c = c.clone();
            async move { c.status().await.map(|s| s.db_size()).unwrap_or(0) }
        };
        let before = size(client).await;
        tracing::info!(db_size = before, "defragmenting etcd");
        let started = std::time::Instant::now();
        self.defragmenting.send_replace(true);
        // Its own connection: the answer comes only when the defrag is done, far beyond the
        // health timeout that bounds the shared client's requests.
        let mut long = self.cfg.client.clone();
        long.timeout = crate::etcd::client::WHOLE_DATABASE;
        let result = match long.connect().await {
            Ok(mut c) => c.defragment().await.map(drop).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        self.defragmenting.send_replace(false);
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(_) => {
                let after = size(client).await;
                tracing::info!(
                    db_size_before = before,
                    db_size_after = after,
                    seconds = took,
                    "defragmentation done"
                );
                self.status.send_modify(|s| {
                    s.defrags_total += 1;
                    s.last_defrag = Some(DefragInfo {
                        at: Some(SystemTime::now()),
                        duration_seconds: took,
                        db_size_before: before,
                        db_size_after: after,
                    });
                });
            }
            Err(err) => {
                tracing::error!(error = %err, "defragmentation failed");
                self.status.send_modify(|s| {
                    *s.failures_total.entry("defrag:etcd".into()).or_default() += 1;
                    s.last_error = Some(format!("defrag: {err}"));
                    s.last_error_at = Some(SystemTime::now());
                });
            }
        }
        moved
    }

    /// `keeper::compact_to(r, physical)` on a connection of its own with the `WHOLE_DATABASE`
    /// timeout; on `client` when that connection cannot be made.
    async fn physical_compaction(&self, client: &mut Client, r: i64) -> Result<Option<i64>, String> {
        let mut long = self.cfg.client.clone();
        long.timeout = crate::etcd::client::WHOLE_DATABASE;
        match long.connect().await {
            Ok(mut c) => crate::space::keeper::compact_to(&mut c, r, true).await,
            Err(_) => crate::space::keeper::compact_to(client, r, true).await,
        }
    }

    /// The followers' part of a cluster's defragmentation: the voters defragmented; `None` when it
    /// did not happen (a member unhealthy or unreachable, or a defrag failed), and the leader's own
    /// is then skipped too.
    pub(super) async fn defrag_followers(&mut self, client: &mut Client) -> Option<Vec<u64>> {
        let members = match client.member_list().await {
            Ok(r) => r.members().to_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the members: no defragmentation this time");
                return None;
            }
        };
        let me = self.identity.member_id;
        let mut followers = Vec::new();
        for m in members.iter().filter(|m| m.id() != me) {
            let mut cfg = self.cfg.client.clone();
            cfg.endpoints = m.client_urls().to_vec();
            let healthy = match cfg.connect().await {
                Ok(mut c) => match c.status().await {
                    // A NOSPACE alarm is no reason to hold back: the repair is what ends it.
                    Ok(s) if s.leader() != 0 && s.errors().iter().all(|e| e.contains("NOSPACE")) => Some(c),
                    _ => None,
                },
                Err(_) => None,
            };
            match healthy {
                Some(_) if cfg.endpoints.is_empty() => {}
                Some(_) => followers.push((m.name().to_owned(), cfg, m.id(), m.is_learner())),
                None => {
                    tracing::warn!(
                        member = m.name(),
                        "a member is not healthy: no defragmentation of the cluster this time"
                    );
                    return None;
                }
            }
        }
        let mut voters = Vec::new();
        for (name, mut cfg, id, learner) in followers {
            cfg.timeout = crate::etcd::client::WHOLE_DATABASE;
            let started = std::time::Instant::now();
            tracing::info!(member = %name, "defragmenting a follower");
            let result = match cfg.connect().await {
                Ok(mut c) => c.defragment().await.map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => {
                    tracing::info!(member = %name, seconds = started.elapsed().as_secs_f64(), "follower defragmented");
                    if !learner {
                        voters.push(id);
                    }
                }
                Err(err) => {
                    tracing::error!(member = %name, error = %err, "defragmenting a follower failed: the rest of the cluster waits for the next schedule");
                    self.status.send_modify(|s| {
                        *s.failures_total.entry("defrag:etcd".into()).or_default() += 1;
                        s.last_error = Some(format!("defrag of {name}: {err}"));
                        s.last_error_at = Some(SystemTime::now());
                    });
                    return None;
                }
            }
        }
        Some(voters)
    }

    /// The writer's part of keeping space (`crate::space`), between snapshots: NOSPACE repaired,
    /// and a defragmentation when the free pages make it pay. `true`: leadership moved away for a
    /// defragmentation (hand over).
    pub(super) async fn keep_space(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> bool {
        if !self.cfg.space.enabled {
            return false;
        }
        let Some(sample) = self.health.borrow().space.clone() else {
            return false;
        };
        if sample.nospace {
            if let Some((in_use, at)) = self.space_refused
                && sample.db_size_in_use >= in_use
                && at.elapsed() < Duration::from_secs(600)
            {
                return false;
            }
            // A writer that just took over in a cluster, on a member already defragmented (under
            // half the quota; a member at NOSPACE is near it): the previous writer moved
            // leadership here in the middle of its own repair (it defragments itself last, then
            // disarms). Repairing now would defragment members
            // under it a second time, overlapping its defragmentation. It gets a grace; if it
            // died instead, this writer repairs once the grace is over.
            if self.cfg.cluster && self.writer_since.elapsed() < TAKEOVER_GRACE {
                // The size asked now: the health sample can predate the previous writer's
                // defragmentation of this member (etcd answers nothing while it defragments, and
                // the sample is held through it), which made two writers repair at once.
                let Ok(status) = client.status().await else {
                    return false;
                };
                if status.db_size() < sample.quota / 2 {
                    tracing::debug!(
                        db_size = status.db_size(),
                        quota = sample.quota,
                        "NOSPACE raised while this member is under half the quota, just after taking over: leaving the repair to the previous writer for now"
                    );
                    return false;
                }
            }
            return self.repair_nospace(client, store, buf, sample).await;
        }
        if let Some(why) = self.cfg.space.defrag_pays(&sample)
            && self
                .paying_defrag_at
                .is_none_or(|t| t.elapsed() > Duration::from_secs(600))
        {
            tracing::info!(
                db_size = sample.db_size,
                in_use = sample.db_size_in_use,
                seconds_to_nospace = sample.seconds_to_nospace,
                "{why}"
            );
            self.paying_defrag_at = Some(std::time::Instant::now());
            return self.defrag(client).await;
        }
        false
    }

    /// `--space-history`: compacts what is older than the window, never past the revision the
    /// store held a window ago (so never past what the delta chain holds: the watch that feeds it
    /// starts above that revision, and a compaction cannot cancel it).
    pub(super) async fn compact_history(&mut self, client: &mut Client) {
        let Some(window) = self.cfg.space.history else {
            return;
        };
        let Some(backed_up) = self.status.borrow().backed_up_revision else {
            return;
        };
        let Some(target) = self.history.target(std::time::Instant::now(), backed_up, window) else {
            return;
        };
        match crate::space::keeper::compact_to(client, target, false).await {
            Ok(done) => {
                self.history.compacted(target);
                if done.is_some() {
                    tracing::debug!(revision = target, "history older than --space-history compacted");
                    self.status.send_modify(|s| {
                        s.space_compactions_total += 1;
                        s.space_compacted_revision = Some(target);
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "compaction for --space-history failed; trying again at the next look")
            }
        }
    }

    /// NOSPACE: compact to the newest revision the store holds (every write up to it is backed up,
    /// so nothing is lost), defragment member by member, disarm; or say the data is too large.
    pub(super) async fn repair_nospace(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        sample: crate::space::Sample,
    ) -> bool {
        let started = std::time::Instant::now();
        tracing::warn!(
            db_size = sample.db_size,
            in_use = sample.db_size_in_use,
            quota = sample.quota,
            "etcd raised NOSPACE: repairing (compaction to the backed-up revision, defragmentation, disarm)"
        );
        // What etcd sent so far goes to the store first: the compaction stops at what it holds.
        self.flush(store, buf).await;
        let backed_up = self.status.borrow().backed_up_revision;
        let compacted_to = match backed_up {
            // A physical compaction answers when etcd has removed the history: at gigabytes, far
            // beyond the health timeout of the shared client.
            Some(r) => match self.physical_compaction(client, r).await {
                Ok(done) => {
                    self.history.compacted(r);
                    done
                }
                Err(e) => {
                    tracing::error!(error = %e, "NOSPACE repair: compaction failed");
                    None
                }
            },
            None => {
                tracing::warn!("NOSPACE repair: no revision is backed up yet, so nothing is compacted");
                None
            }
        };
        let moved = self.defrag(client).await;
        let after = match client.status().await {
            Ok(s) => (s.db_size(), s.raft_used_db_size()),
            Err(_) => (sample.db_size, sample.db_size_in_use),
        };
        let verdict = crate::space::after_repair(after.1, sample.quota, compacted_to.or(backed_up));
        let disarmed = match &verdict {
            Ok(()) => match crate::space::keeper::disarm_nospace(client).await {
                Ok(n) => {
                    tracing::info!(alarms = n, "NOSPACE disarmed");
                    self.space_refused = None;
                    true
                }
                Err(e) => {
                    tracing::error!(error = %e, "NOSPACE repair: disarming failed");
                    false
                }
            },
            Err(problem) => {
                tracing::error!("{problem}");
                self.space_refused = Some((after.1, std::time::Instant::now()));
                false
            }
        };
        let repair = crate::space::Repair {
            at: Some(SystemTime::now()),
            compacted_to,
            db_size_before: sample.db_size,
            db_size_after: after.0,
            db_size_in_use_after: after.1,
            quota: sample.quota,
            seconds: started.elapsed().as_secs_f64(),
            disarmed,
            problem: verdict.err(),
        };
        tracing::info!(
            compacted_to,
            db_size_before = repair.db_size_before,
            db_size_after = repair.db_size_after,
            seconds = repair.seconds,
            disarmed,
            "NOSPACE repair done"
        );
        self.status.send_modify(|s| {
            s.space_repairs_total += 1;
            s.last_space_repair = Some(repair);
        });
        moved
    }
}

//! Leadership and fencing in the store: only the warden whose etcd leads writes; it claims the
//! prefix for its cluster, writes the head object, and stops when a later writer took over.

use std::time::Duration;

use etcd_client::Client;
use tokio::sync::oneshot;

use super::handle::Control;
use super::members::members_of;
use super::status::SnapInfo;
use super::writer::Backup;
use super::writer::Outcome;
use crate::backup::leadership::{LEADERSHIP_CHECK, leads};
use crate::snapshot::delta::DeltaBuffer;
use crate::store::head::{Head, Uploaded};
use crate::store::{ChainId, Store};

pub(super) enum Leadership {
    Leader,
    Stop(oneshot::Sender<()>),
    /// etcd did not answer: connect again.
    Retry,
}

impl Backup {
    /// The leadership check while streaming. A single member that became a cluster, a later
    /// writer, three unanswered checks or another leader end the stream (after a flush); the
    /// leader keeps its learners promoted and the store's member record current.
    pub(super) async fn on_leadership_tick(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        if !self.cfg.cluster {
            // The cluster ID every object names (a catch-up compares it with a data dir's).
            if self.identity.cluster_id == 0
                && let Some(Ok(me)) = leads(client).await
            {
                self.identity = me;
            }
            // Scaled up at run time (members added to a single member): one writer from now on,
            // the leader's warden.
            if crate::backup::leadership::member_count(client)
                .await
                .is_some_and(|n| n > 1)
            {
                tracing::info!(
                    "etcd's member list now has several members: cluster mode (only the leader's warden writes)"
                );
                self.flush(store, buf).await;
                self.cfg.cluster = true;
                return Some(Outcome::Reconnect);
            }
            return None;
        }
        let now = leads(client).await;
        if let Some(Ok(me)) = now {
            self.identity = me;
            self.unanswered = 0;
            // A repaired member's learner is promoted by the writer too, so a learner whose own
            // warden died is not left behind.
            crate::backup::leadership::promote_caught_up_learners(client).await;
            self.keep_members_current(client, store).await;
        }
        if self.superseded_in.is_some() {
            tracing::warn!("a later writer wrote the head object: handing over");
            self.status.send_modify(|s| s.role = Some("follower".into()));
            return Some(Outcome::Reconnect);
        }
        if now.is_none() {
            self.unanswered += 1;
            if self.unanswered >= 3 {
                // etcd does not say whether it still leads: another member may, so this one stops
                // writing (what it buffered was committed; it goes up as the chain's last delta).
                tracing::warn!(
                    "this member's etcd did not answer three leadership checks in a row: flushing the buffered delta and writing nothing more until it says it leads"
                );
                self.flush(store, buf).await;
                self.unanswered = 0;
                self.status.send_modify(|s| s.role = Some("follower".into()));
                return Some(Outcome::Reconnect);
            }
        }
        if let Some(Err(leader)) = now {
            tracing::info!(
                leader = format!("{leader:x}"),
                "this member's etcd no longer leads: flushing the buffered delta and handing over"
            );
            self.flush(store, buf).await;
            self.status.send_modify(|s| s.role = Some("follower".into()));
            return Some(Outcome::Reconnect);
        }
        None
    }

    /// Before a cluster's writer writes: the prefix is claimed for this cluster (create-if-absent)
    /// or already is; its member list is kept current there. `Ok(false)`: another cluster owns
    /// the prefix, so nothing is written (said in /status and metrics; readiness is untouched).
    pub(super) async fn claim_prefix(&mut self, client: &mut Client, store: &Store) -> Result<bool, ()> {
        let Some(members) = members_of(client).await else {
            tracing::debug!("cannot list the members before claiming the prefix");
            return Err(());
        };
        let now = crate::store::layout::now_ms();
        let ours = crate::store::owner::Owner {
            format: 1,
            cluster_id: self.identity.cluster_id,
            claimed_by: format!("{} ({:x})", self.cfg.member_name, self.identity.member_id),
            claimed_ms: now,
            members: members.clone(),
            updated_ms: now,
        };
        let owner = match store.claim(&ours).await {
            Ok(o) => o,
            Err(e) => {
                self.failed("store", "claim", &e);
                return Err(());
            }
        };
        // A cluster restored by the store's current plan takes over the record of the cluster it
        // replaces (its own marker says it restored by that plan).
        if owner.cluster_id != self.identity.cluster_id
            && let Ok(Some(plan)) = store.current_plan().await
            && plan.previous_cluster_id == owner.cluster_id
            && crate::restore::marker::plan_applied(&self.cfg.data_dir).is_some_and(|m| m.plan == plan.id)
        {
            tracing::warn!(plan = %plan.id, previous = format!("{:x}", owner.cluster_id), now = format!("{:x}", self.identity.cluster_id), "this cluster was restored by the store's cluster restore plan: it takes over the prefix");
            let ours = crate::store::owner::Owner {
                claimed_by: format!("{} after cluster restore plan {}", ours.claimed_by, plan.id),
                ..ours
            };
            if let Err(e) = store.put_owner(&ours).await {
                self.failed("store", "claim", &e);
                return Err(());
            }
            self.status.send_modify(|s| s.foreign_prefix = None);
            return Ok(true);
        }
        if owner.cluster_id != self.identity.cluster_id {
            let why = format!(
                "the store prefix belongs to etcd cluster {:x} (claimed by {}), this is cluster {:x}: writing nothing there (point --store at this cluster's own prefix)",
                owner.cluster_id, owner.claimed_by, self.identity.cluster_id
            );
            tracing::error!("{why}");
            self.status.send_modify(|s| {
                s.foreign_prefix = Some(why.clone());
                s.healthy = Some(false);
                s.last_error = Some(why);
            });
            return Ok(false);
        }
        self.status.send_modify(|s| s.foreign_prefix = None);
        if owner.members == members {
            self.recorded_members = Some(members);
        } else {
            self.keep_members_current(client, store).await;
        }
        Ok(true)
    }

    /// The writer's head object after an upload (clusters only): one small PUT. A failure is
    /// logged and left to the next upload; it never fails the backup.
    pub(super) async fn put_head(
        &mut self,
        store: &Store,
        chain: ChainId,
        revision: i64,
        full: Option<Uploaded>,
        delta: Option<Uploaded>,
    ) {
        if !self.cfg.cluster {
            return;
        }
        let prev = self.head.take().filter(|h| h.chain == chain || full.is_some());
        let head = Head {
            format: 1,
            cluster_id: self.identity.cluster_id,
            member_id: self.identity.member_id,
            member_name: self.cfg.member_name.clone(),
            raft_term: self.identity.raft_term,
            chain,
            last_revision: revision,
            last_full: full.or_else(|| prev.as_ref().and_then(|h| h.last_full.clone())),
            last_delta: delta.or_else(|| prev.as_ref().and_then(|h| h.last_delta.clone())),
            updated_ms: crate::store::layout::now_ms(),
        };
        match store.put_head(&head).await {
            Ok(crate::store::head::HeadWrite::Written) => {}
            Ok(crate::store::head::HeadWrite::Superseded(theirs)) => {
                tracing::warn!(
                    writer = %theirs.member_name,
                    their_term = theirs.raft_term,
                    our_term = head.raft_term,
                    "a writer of a later raft term wrote the head object: this member no longer leads; writing nothing more"
                );
                self.superseded_in = Some(theirs.raft_term);
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot update the head object; the next upload tries again");
            }
        }
        self.head = Some(head);
    }

    /// Whether this writer still leads, asked of its etcd right now (clusters; a single member
    /// always writes): a timeout counts as no.
    pub(super) async fn still_leads(&mut self, client: &mut Client) -> bool {
        if !self.cfg.cluster {
            return true;
        }
        match leads(client).await {
            Some(Ok(me)) if self.superseded_in.is_none_or(|t| me.raft_term > t) => {
                self.identity = me;
                self.superseded_in = None;
                true
            }
            _ => false,
        }
    }

    /// A follower's view of the backups: the writer's head object, read once per delta period.
    pub(super) async fn follow_head(&mut self) {
        let head = match self.cfg.open_store() {
            Ok(store) => store.get_head().await,
            Err(e) => Err(e),
        };
        match head {
            Ok(Some(h)) => {
                let at = |ms: u64| Some(std::time::UNIX_EPOCH + Duration::from_millis(ms));
                self.status.send_modify(|s| {
                    s.writer = Some(format!("{} ({:x})", h.member_name, h.member_id));
                    s.backed_up_revision = Some(h.last_revision);
                    s.chain_base = Some(h.chain.base);
                    s.last_success_at = at(h.updated_ms);
                    let info = |u: &Uploaded| SnapInfo {
                        key: u.key.clone(),
                        revision: u.revision,
                        at: at(u.at_ms),
                        stored_bytes: 0,
                        raw_bytes: 0,
                        duration_seconds: 0.0,
                    };
                    s.last_full = h.last_full.as_ref().map(info);
                    s.last_delta = h.last_delta.as_ref().map(info);
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %crate::telemetry::error_chain(&e), "cannot read the head object")
            }
        }
    }

    /// In a cluster, waits while this member's etcd does not lead (checked every second): one
    /// writer per cluster, whose chain the next leader's warden continues from the store.
    pub(super) async fn wait_leadership(&mut self, client: &mut Client) -> Leadership {
        let mut said = None;
        let mut last_read = None;
        let head_every = self.cfg.delta_period.max(LEADERSHIP_CHECK);
        loop {
            match leads(client).await {
                Some(Ok(me)) if self.superseded_in.is_some_and(|t| me.raft_term <= t) => {
                    if said != Some(u64::MAX) {
                        tracing::warn!(
                            term = me.raft_term,
                            head_term = self.superseded_in,
                            "this member's etcd says it leads, in a raft term the head object's writer already passed: following"
                        );
                        said = Some(u64::MAX);
                    }
                    self.status.send_modify(|s| s.role = Some("follower".into()));
                }
                Some(Ok(me)) => {
                    self.identity = me;
                    self.superseded_in = None;
                    self.unanswered = 0;
                    self.recorded_members = None;
                    tracing::info!("this member's etcd leads: writing backups");
                    let name = format!("{} ({:x})", self.cfg.member_name, me.member_id);
                    self.status.send_modify(|s| {
                        s.role = Some("writer".into());
                        s.writer = Some(name);
                    });
                    return Leadership::Leader;
                }
                Some(Err(leader)) => {
                    if last_read.is_none_or(|t: tokio::time::Instant| t.elapsed() >= head_every) {
                        last_read = Some(tokio::time::Instant::now());
                        self.follow_head().await;
                    }
                    if said != Some(leader) {
                        tracing::info!(
                            leader = format!("{leader:x}"),
                            "another member leads: its warden writes backups; following"
                        );
                        said = Some(leader);
                    }
                    self.status.send_modify(|s| {
                        s.role = Some("follower".into());
                        s.pending_delta_bytes = 0;
                        s.pending_delta_events = 0;
                    });
                }
                None => return Leadership::Retry,
            }
            tokio::select! {
                Some(c) = self.control_rx.recv() => match c {
                    Control::Stop(reply) => return Leadership::Stop(reply),
                    Control::Reload => {}
                    Control::Reconfigure(cfg) => self.cfg = *cfg,
                },
                _ = tokio::time::sleep(LEADERSHIP_CHECK) => {}
            }
        }
    }
}

//! The delta stream: etcd's watch grouped into revisions in the delta buffer, flushed as delta
//! objects on the period, the size limit, a request or a stop.

use std::time::{Duration, SystemTime};

use etcd_client::{Client, EventType as EtcdEventType, WatchOptions};

use super::fulls::next_at;
use super::handle::Control;
use super::leases::{LeaseSetAt, lease_granted_ttl};
use super::status::{ChainBreak, SnapInfo};
use super::writer::{Backup, Outcome, SPACE_CHECK, mtime};
use crate::backup::leadership::LEADERSHIP_CHECK;
use crate::format::delta_codec::{Event, EventType, Lease, Revision};
use crate::snapshot::delta::{self, DeltaBuffer};
use crate::store::head::Uploaded;
use crate::store::{ChainId, Store};

/// Why watch events could not go into a delta buffer.
pub(super) enum AppendError {
    /// A revision does not follow the buffer's last: the chain cannot go on.
    Gap(delta::GapError),
    /// etcd did not tell a lease's TTL (after retries).
    Lease,
}

/// Groups a watch response's events by revision into `buf`, recording each lease's granted TTL
/// before the first put that uses it, and `set` (a lease set etcd reported at a revision the
/// stream had not reached) right after its revision.
pub(super) async fn append_events(
    client: &mut Client,
    buf: &mut DeltaBuffer,
    events: &[etcd_client::Event],
    set: &mut Option<LeaseSetAt>,
) -> Result<(), AppendError> {
    let push = |buf: &mut DeltaBuffer, done: &Revision, set: &mut Option<LeaseSetAt>| {
        buf.push(done).map_err(AppendError::Gap)?;
        if let Some(s) = set.take_if(|s| s.revision <= buf.last()) {
            // Past its revision (a stream that started after it) the set is stale: the next
            // check records a fresh one.
            if s.revision == buf.last() {
                buf.push_lease_set(s.leases);
            }
        }
        Ok::<_, AppendError>(())
    };
    let mut current: Option<Revision> = None;
    for ev in events {
        let Some(kv) = ev.kv() else { continue };
        let rev = kv.mod_revision();
        let kind = match ev.event_type() {
            EtcdEventType::Put => EventType::Put,
            EtcdEventType::Delete => EventType::Delete,
        };
        if kind == EventType::Put && buf.needs_lease(kv.lease()) {
            // The lease's record goes right before the revision that first uses it, never before
            // an earlier revision still being grouped: a point-in-time restore that stops at
            // that earlier revision must not get a lease granted after it.
            if let Some(done) = current.take_if(|r| r.revision != rev) {
                push(buf, &done, set)?;
            }
            let granted_ttl = lease_granted_ttl(client, kv.lease())
                .await
                .map_err(|_| AppendError::Lease)?;
            buf.push_lease(Lease {
                id: kv.lease(),
                granted_ttl,
            });
        }
        let event = Event {
            kind,
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            lease: kv.lease(),
            create_revision: kv.create_revision(),
            version: kv.version(),
        };
        match current.as_mut() {
            Some(r) if r.revision == rev => r.events.push(event),
            _ => {
                if let Some(done) = current.take() {
                    push(buf, &done, set)?;
                }
                current = Some(Revision {
                    revision: rev,
                    events: vec![event],
                });
            }
        }
    }
    if let Some(done) = current.take() {
        push(buf, &done, set)?;
    }
    Ok(())
}

/// A watch over every key from the revision after `after`, for deltas.
pub(super) async fn watch_after(
    client: &Client,
    after: i64,
) -> Result<etcd_client::WatchStream, etcd_client::Error> {
    let opts = WatchOptions::new().with_all_keys().with_start_revision(after + 1);
    let mut wc = client.watch_client().max_decoding_message_size(64 * 1024 * 1024);
    wc.watch(vec![0u8], Some(opts)).await
}

/// Reads one response of `watch` into `buf`, leaving out the events after revision `upto`: a
/// watch read up to a revision known in advance (the tail after a stop, a chain closed at the
/// revision of the full that follows it).
pub(super) async fn read_upto(
    client: &mut Client,
    watch: &mut etcd_client::WatchStream,
    buf: &mut DeltaBuffer,
    upto: i64,
) -> Result<(), String> {
    let resp = watch
        .message()
        .await
        .map_err(|e| format!("read the watch: {e}"))?
        .ok_or("the watch ended early")?;
    if resp.canceled() {
        return Err(format!(
            "the watch was canceled (compacted at {}): revisions {}..={upto} cannot be read",
            resp.compact_revision(),
            buf.last() + 1
        ));
    }
    let events = resp.events();
    let n = events.partition_point(|e| e.kv().is_none_or(|kv| kv.mod_revision() <= upto));
    append_events(client, buf, &events[..n], &mut None)
        .await
        .map_err(|e| match e {
            AppendError::Gap(g) => g.to_string(),
            AppendError::Lease => "a lease's TTL could not be read".into(),
        })
}

impl Backup {
    /// Who writes this writer's deltas, as their headers record it.
    pub(super) fn delta_writer(&self) -> delta::Writer {
        delta::Writer {
            cluster_id: self.identity.cluster_id,
            member_id: self.identity.member_id,
            raft_term: self.identity.raft_term,
            etcd_version: self.health.borrow().version.clone().unwrap_or_default(),
        }
    }

    /// Flushes the buffer. On failure the events go back into the buffer for the next attempt.
    pub(super) async fn flush(&mut self, store: &Store, buf: &mut DeltaBuffer) -> bool {
        let Some(pending) = buf.take() else { return true };
        match delta::upload(store, &pending, self.cfg.compression, self.delta_writer()).await {
            Ok(r) => {
                self.succeeded();
                self.status.send_modify(|s| {
                    s.last_delta = Some(SnapInfo {
                        key: r.name.key(),
                        revision: pending.last,
                        at: Some(SystemTime::now()),
                        stored_bytes: r.stored_bytes,
                        raw_bytes: r.raw_bytes,
                        duration_seconds: r.duration.as_secs_f64(),
                    });
                    s.deltas_total += 1;
                    s.backed_up_revision = Some(pending.last);
                    s.pending_delta_bytes = buf.len() as u64;
                    s.pending_delta_events = buf.pending_events();
                });
                let delta = Uploaded {
                    key: r.name.key(),
                    revision: pending.last,
                    at_ms: r.name.created_ms,
                };
                self.published(&delta, pending.last);
                self.put_head(store, pending.chain, pending.last, None, Some(delta))
                    .await;
                true
            }
            Err(err) => {
                self.failed("delta", err.reason(), &err);
                buf.restore(pending);
                false
            }
        }
    }

    /// The watch for deltas from the revision after `after` (the buffer's last); `None` when deltas
    /// are off.
    async fn open_watch(
        &self,
        client: &mut Client,
        after: i64,
    ) -> Result<Option<etcd_client::WatchStream>, Outcome> {
        if self.cfg.delta_period.is_zero() {
            return Ok(None);
        }
        match watch_after(client, after).await {
            Ok(w) => Ok(Some(w)),
            Err(err) => {
                tracing::warn!(error = %err, "failed to open the watch for deltas");
                Err(Outcome::Reconnect)
            }
        }
    }

    /// Streams the chain `(chain, after)` until something ends it: a stop, a reload, a lost
    /// leadership, a watch that cannot go on. Each branch hands its work to the part that owns it.
    pub(super) async fn stream(
        &mut self,
        client: &mut Client,
        store: &Store,
        (chain, after): (ChainId, i64),
    ) -> Outcome {
        let mut buf = DeltaBuffer::new(chain, after);
        let mut watch = match self.open_watch(client, buf.last()).await {
            Ok(w) => w,
            Err(o) => return o,
        };
        let mut t = Timers::new(self);
        self.writer_since = std::time::Instant::now();
        loop {
            if let Some(o) = self
                .full_if_due_by_revisions(client, store, &mut buf, &mut t)
                .await
            {
                return o;
            }
            let full_due = sleep_until(t.next_full);
            let defrag_due = sleep_until(t.next_defrag);
            let watch_msg = async {
                match watch.as_mut() {
                    Some(w) => w.message().await,
                    None => std::future::pending().await,
                }
            };
            let ended = tokio::select! {
                biased;
                Some(c) = self.control_rx.recv() => {
                    Some(self.on_control(c, client, store, &mut buf, &mut watch).await)
                }
                Some(()) = self.delta_rx.recv() => {
                    self.flush(store, &mut buf).await;
                    None
                }
                Some(()) = self.full_rx.recv() => self.full_during_stream(client, store, &mut buf).await,
                _ = defrag_due => {
                    let o = self.defrag_between(client, store, &mut buf).await;
                    // The next one counted from the end of this one, as before the split.
                    t.next_defrag = self.cfg.defrag_schedule.as_ref().and_then(next_at);
                    o
                }
                _ = t.history.tick(), if self.cfg.space.history.is_some() => {
                    self.compact_history(client).await;
                    None
                }
                _ = t.space.tick() => self.keep_space_between(client, store, &mut buf).await,
                _ = full_due => {
                    t.next_full = self.next_full_at();
                    self.full_during_stream(client, store, &mut buf).await
                }
                _ = t.leadership.tick() => self.on_leadership_tick(client, store, &mut buf).await,
                _ = t.tick.tick() => self.on_tick(client, store, &mut buf).await,
                msg = watch_msg => self.on_watch(client, store, &mut buf, msg).await,
            };
            if let Some(o) = ended {
                return o;
            }
        }
    }

    /// A request from another task while streaming: each ends the stream after a flush.
    async fn on_control(
        &mut self,
        c: Control,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        watch: &mut Option<etcd_client::WatchStream>,
    ) -> Outcome {
        match c {
            Control::Stop(reply) => {
                self.catch_up(client, store, buf, watch).await;
                self.flush(store, buf).await;
                Outcome::Stop(reply)
            }
            Control::Reload => {
                self.flush(store, buf).await;
                Outcome::Reconnect
            }
            Control::Reconfigure(cfg) => {
                self.flush(store, buf).await;
                tracing::info!("backup settings reloaded");
                self.cfg = *cfg;
                Outcome::Reopen
            }
        }
    }

    /// The delta period's tick: new store credentials re-open the store; the lease set is
    /// checked, the buffer flushed, and what lives outside the keyspace compared.
    async fn on_tick(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        if let Some(path) = &self.cfg.credentials
            && mtime(path) != self.creds_mtime
        {
            tracing::info!(path = %path.display(), "store credentials changed: re-opening the store");
            self.flush(store, buf).await;
            return Some(Outcome::Reopen);
        }
        // Leases first: a set listed at the buffer's last revision goes up in the same delta (in
        // an empty buffer it waits for the next revision).
        self.check_leases(client, buf).await;
        if !buf.is_empty() {
            self.flush(store, buf).await;
        }
        self.check_outside(client, store, buf).await
    }

    /// One message of the delta watch into the buffer; `Some` ends the stream.
    pub(super) async fn on_watch(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        msg: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    ) -> Option<Outcome> {
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                self.flush(store, buf).await;
                return Some(Outcome::Reconnect);
            }
            Err(err) => {
                tracing::warn!(error = %err, "delta watch ended");
                self.flush(store, buf).await;
                return Some(Outcome::Reconnect);
            }
        };
        if resp.canceled() {
            self.flush(store, buf).await;
            if resp.compact_revision() > 0 {
                // A chain break, never a silent gap: revisions wanted..compacted are in no delta
                // (they may have been overwritten since); the full that follows starts a new chain.
                let wanted = buf.last() + 1;
                let compacted = resp.compact_revision();
                tracing::error!(
                    compact_revision = compacted,
                    wanted,
                    "CHAIN BREAK: the chain's next revision was compacted before it was backed up: taking a full snapshot"
                );
                self.status.send_modify(|s| {
                    s.chain_breaks_total += 1;
                    s.last_chain_break = Some(ChainBreak {
                        after: wanted - 1,
                        compacted,
                        at: Some(SystemTime::now()),
                    });
                });
                return Some(Outcome::NeedFull);
            }
            tracing::warn!(reason = resp.cancel_reason(), "delta watch canceled");
            return Some(Outcome::Reconnect);
        }
        // One revision at a time: a response that holds many (a watch catching up) is uploaded as
        // the buffer reaches its bound, never held whole above it.
        let events = resp.events();
        let mut from = 0;
        while from < events.len() {
            let rev = events[from].kv().map(|kv| kv.mod_revision());
            let to = events[from..]
                .iter()
                .position(|e| e.kv().map(|kv| kv.mod_revision()) != rev)
                .map_or(events.len(), |n| from + n);
            if let Err(o) = self.append(client, buf, &events[from..to]).await {
                self.flush(store, buf).await;
                return Some(o);
            }
            from = to;
            if buf.len() >= self.cfg.delta_max_bytes {
                let ok = self.flush(store, buf).await;
                if !ok && buf.len() >= self.cfg.delta_max_bytes {
                    tracing::error!(
                        bytes = buf.len(),
                        "delta buffer full and the store is failing: dropping it; a full snapshot follows once the store is back"
                    );
                    drop(buf.take());
                    return Some(Outcome::NeedFull);
                }
            }
        }
        self.status.send_modify(|s| {
            s.pending_delta_bytes = buf.len() as u64;
            s.pending_delta_events = buf.pending_events();
        });
        None
    }

    /// Before the last flush of a graceful stop: every revision etcd has acknowledged so far must
    /// be in the buffer, so the watch is read until it reaches etcd's current revision (the caller
    /// bounds the wait). A write acknowledged just before the stop signal is then in the store.
    pub(super) async fn catch_up(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        watch: &mut Option<etcd_client::WatchStream>,
    ) {
        let Some(w) = watch.as_mut() else { return };
        let target = match tokio::time::timeout(Duration::from_secs(2), client.status()).await {
            Ok(Ok(s)) => s.header().map(|h| h.revision()).unwrap_or(0),
            _ => {
                tracing::warn!("cannot read etcd's revision at the stop; flushing what the watch delivered");
                return;
            }
        };
        while buf.last() < target {
            let msg = w.message().await;
            if self.on_watch(client, store, buf, msg).await.is_some() {
                return;
            }
        }
        tracing::debug!(
            revision = target,
            "the delta watch reached etcd's revision at the stop"
        );
    }

    /// Groups a watch response's events by revision into the buffer; records lease TTLs.
    pub(super) async fn append(
        &mut self,
        client: &mut Client,
        buf: &mut DeltaBuffer,
        events: &[etcd_client::Event],
    ) -> Result<(), Outcome> {
        let due = self.lease_set_due.as_ref().map(|s| s.revision);
        match append_events(client, buf, events, &mut self.lease_set_due).await {
            Ok(()) => {
                if let Some(at) = due.filter(|_| self.lease_set_due.is_none()) {
                    self.status.send_modify(|s| s.leases_checked_revision = Some(at));
                }
                Ok(())
            }
            Err(AppendError::Gap(gap)) => {
                self.failed("delta", "gap", &gap);
                Err(Outcome::NeedFull)
            }
            Err(AppendError::Lease) => Err(Outcome::Reconnect),
        }
    }
}

/// The stream's clocks: the delta period, the next scheduled full and defragmentation, and the
/// intervals of the leadership, space and history checks.
pub(super) struct Timers {
    pub(super) period: Duration,
    tick: tokio::time::Interval,
    next_full: Option<tokio::time::Instant>,
    next_defrag: Option<tokio::time::Instant>,
    /// No chain-length full before this (one per period at most).
    pub(super) chain_full_not_before: tokio::time::Instant,
    leadership: tokio::time::Interval,
    space: tokio::time::Interval,
    history: tokio::time::Interval,
}

impl Timers {
    fn new(b: &Backup) -> Self {
        let period = if b.cfg.delta_period.is_zero() {
            Duration::from_secs(3600)
        } else {
            b.cfg.delta_period
        };
        let every = |d: Duration| {
            let mut i = tokio::time::interval(d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Timers {
            period,
            tick,
            next_full: b.next_full_at(),
            next_defrag: b.cfg.defrag_schedule.as_ref().and_then(next_at),
            chain_full_not_before: tokio::time::Instant::now(),
            leadership: every(LEADERSHIP_CHECK),
            space: every(SPACE_CHECK),
            history: every(crate::space::History::every(
                b.cfg.space.history.unwrap_or(Duration::from_secs(600)),
            )),
        }
    }
}

/// Sleeps until `at`; never, without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

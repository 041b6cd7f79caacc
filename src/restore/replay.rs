//! The fallback way deltas reach a restored member: replayed through a private etcd on loopback
//! ports, each original revision as exactly one transaction (slower: etcd's write path caps it).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, LeaseGrantOptions, Txn, TxnOp};

use super::execute::Failure;
use super::plan::Candidate;
use super::write::{Applied, Step, replay_progress, step};
use crate::etcd::private::{PrivateEtcd, restored_revision};
use crate::format::delta_codec::{EventType, Record};
use crate::snapshot::verify::{ObjectError, read_delta};
use crate::store::Store;
use crate::store::layout::Kind;
use crate::telemetry::Progress;

/// The next delta's records, fetched while the current one is applied.
type Prefetch = Option<tokio::task::JoinHandle<Result<Vec<Record>, ObjectError>>>;

async fn next_records(
    store: &Store,
    cand: &Candidate,
    i: usize,
    prefetch: &mut Prefetch,
) -> Result<Vec<Record>, ObjectError> {
    let records = match prefetch.take() {
        Some(h) => h.await.map_err(|e| ObjectError::Local(e.to_string()))??,
        None => read_delta(store, &cand.deltas[i]).await?,
    };
    if let Some(next) = cand.deltas.get(i + 1) {
        let (store, next) = (store.clone(), *next);
        *prefetch = Some(tokio::spawn(async move { read_delta(&store, &next).await }));
    }
    Ok(records)
}

pub(super) async fn apply_deltas(
    store: &Store,
    private: &PrivateEtcd,
    cand: &Candidate,
    progress: &Progress,
) -> Result<(i64, u64), Failure> {
    let mut client = private.client().await.map_err(Failure::Local)?;
    let current = restored_revision(&mut client).await.map_err(Failure::Local)?;
    tracing::info!(revision = current, "full snapshot restored; applying deltas");
    let (replay_started, replay_from) = (Instant::now(), current);
    if let Some(stop) = cand.stop_at
        && current > stop
    {
        // An older full may still reach the target.
        return Err(Failure::BadFull(format!(
            "the full snapshot already holds revision {current}, past the target {stop}"
        )));
    }
    // Leases present in the snapshot and granted during replay are kept alive while we replay, so no
    // expiry inserts revisions the original history did not have.
    let mut leases: HashSet<i64> = client
        .leases()
        .await
        .map(|r| r.leases().iter().map(|l| l.id()).collect())
        .unwrap_or_default();
    let mut last_keepalive = Instant::now();
    let mut pipe = Pipeline::new(client.kv_client(), current);
    let mut prefetch: Prefetch = None;
    let mut seen = Applied::default();
    for (i, delta) in cand.deltas.iter().enumerate() {
        let records = next_records(store, cand, i, &mut prefetch)
            .await
            .map_err(|e| Failure::delta(i, e))?;
        for rec in records {
            match rec {
                // Through etcd, a lease set only grants what is missing: revoking here could
                // delete keys and add revisions the history does not have.
                Record::Lease(_) | Record::LeaseSet(_) => {
                    let grants = match rec {
                        Record::Lease(l) => vec![l],
                        Record::LeaseSet(set) => set,
                        Record::Revision(_) => unreachable!("matched above"),
                    };
                    for l in grants {
                        grant_lease(&mut client, &mut leases, l).await?;
                    }
                }
                Record::Revision(r) => {
                    let next = step(&r, pipe.enqueued, cand, delta)
                        .map_err(|reason| Failure::BadDelta { index: i, reason })?;
                    match next {
                        Step::Skip => {
                            seen.check(&r, delta)
                                .map_err(|reason| Failure::BadDelta { index: i, reason })?;
                            continue;
                        }
                        Step::Stop => {
                            pipe.finish().await.map_err(Failure::Local)?;
                            return Ok((pipe.applied_rev, pipe.applied));
                        }
                        Step::Apply => {}
                    }
                    let ops: Vec<TxnOp> = r
                        .events
                        .iter()
                        .map(|e| match e.kind {
                            EventType::Put => {
                                let opts = (e.lease != 0 && leases.contains(&e.lease))
                                    .then(|| etcd_client::PutOptions::new().with_lease(e.lease));
                                TxnOp::put(e.key.clone(), e.value.clone(), opts)
                            }
                            EventType::Delete => TxnOp::delete(e.key.clone(), None),
                        })
                        .collect();
                    // The next transaction may only apply after this one: a key this revision puts
                    // carries it as mod_revision exactly then. A delete-only revision has no such
                    // proof (a key can also be absent because an earlier put was not applied yet),
                    // so the pipeline drains behind it instead.
                    let guard = r
                        .events
                        .iter()
                        .find(|e| e.kind == EventType::Put)
                        .map(|e| Compare::mod_revision(e.key.clone(), CompareOp::Equal, r.revision));
                    pipe.push(r.revision, ops, guard).await.map_err(Failure::Local)?;
                    seen.record(&r);
                }
            }
            if last_keepalive.elapsed() > Duration::from_secs(1) && !leases.is_empty() {
                keep_alive(&mut client, &leases).await;
                last_keepalive = Instant::now();
            }
        }
        let current = pipe.applied_rev;
        if let Kind::Delta { last, .. } = delta.kind {
            tracing::debug!(
                delta = i + 1,
                of = cand.deltas.len(),
                revision = current,
                through = last,
                "delta applied"
            );
        }
        replay_progress(progress, cand, i, replay_from, current, replay_started);
    }
    pipe.finish().await.map_err(Failure::Local)?;
    tracing::info!(
        revisions = pipe.applied,
        reorders = pipe.reorders,
        revision = pipe.applied_rev,
        "deltas replayed"
    );
    Ok((pipe.applied_rev, pipe.applied))
}

/// How many transactions may be in flight during a replay.
const WINDOW: usize = 32;

type TxnFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<etcd_client::TxnResponse, etcd_client::Error>> + Send>,
>;

/// Replays revisions with up to [`WINDOW`] transactions in flight, still strictly in order: each
/// transaction carries a guard that holds only once the previous revision is applied (a key that
/// revision puts has it as mod_revision, which no other transaction can produce while an earlier
/// one is missing). A transaction that etcd happens to take before its predecessor fails the
/// guard, changes nothing, and is sent again; after a delete-only revision, which no key can prove,
/// the pipeline drains. So revision numbers and every key's mod_revision come out exactly as in the
/// original.
struct Pipeline {
    kv: etcd_client::KvClient,
    /// Sent transactions in order, and their responses in the same order. The futures live on this
    /// task (not spawned), so requests go on the wire in order and etcd rarely reorders them.
    window: std::collections::VecDeque<(i64, Txn)>,
    inflight: futures_util::stream::FuturesOrdered<TxnFuture>,
    prev_guard: Option<Compare>,
    /// The last revision handed to the pipeline.
    enqueued: i64,
    /// The last revision confirmed applied.
    applied_rev: i64,
    applied: u64,
    /// Times etcd took a transaction before its predecessor (each costs one resend round).
    reorders: u64,
}

impl Pipeline {
    fn new(kv: etcd_client::KvClient, current: i64) -> Self {
        Self {
            kv,
            window: std::collections::VecDeque::new(),
            inflight: futures_util::stream::FuturesOrdered::new(),
            prev_guard: None,
            enqueued: current,
            applied_rev: current,
            applied: 0,
            reorders: 0,
        }
    }

    fn send(&mut self, rev: i64, txn: Txn) {
        let mut kv = self.kv.clone();
        let t = txn.clone();
        self.inflight.push_back(Box::pin(async move { kv.txn(t).await }));
        self.window.push_back((rev, txn));
    }

    async fn next_response(&mut self, rev: i64) -> Result<etcd_client::TxnResponse, String> {
        use futures_util::StreamExt;
        match self.inflight.next().await {
            Some(r) => r.map_err(|e| format!("apply revision {rev}: {e}")),
            None => Err(format!("no response for revision {rev}")),
        }
    }

    async fn push(
        &mut self,
        rev: i64,
        ops: Vec<TxnOp>,
        guard_for_next: Option<Compare>,
    ) -> Result<(), String> {
        let txn = match self.prev_guard.take() {
            Some(g) => Txn::new().when(vec![g]).and_then(ops),
            None => Txn::new().and_then(ops),
        };
        self.enqueued = rev;
        self.send(rev, txn);
        match guard_for_next {
            Some(g) => self.prev_guard = Some(g),
            // No key proves this revision applied: wait until it is, so the next needs no guard.
            None => self.finish().await?,
        }
        while self.window.len() >= WINDOW {
            self.complete_front().await?;
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<(), String> {
        while !self.window.is_empty() {
            self.complete_front().await?;
        }
        Ok(())
    }

    fn confirm(&mut self, rev: i64, resp: &etcd_client::TxnResponse) -> Result<(), String> {
        let got = resp.header().map(|h| h.revision()).unwrap_or(0);
        if got != rev {
            return Err(format!("applying revision {rev} produced revision {got}"));
        }
        self.applied_rev = rev;
        self.applied += 1;
        Ok(())
    }

    async fn complete_front(&mut self) -> Result<(), String> {
        let Some((rev, txn)) = self.window.pop_front() else {
            return Ok(());
        };
        let resp = self.next_response(rev).await?;
        if resp.succeeded() {
            return self.confirm(rev, &resp);
        }
        // Taken before its predecessor. Everything after it fails its guard too; collect them,
        // apply this one alone (its predecessor is confirmed now), then send the rest again.
        let mut rest = Vec::new();
        while let Some((r, t)) = self.window.pop_front() {
            let resp = self.next_response(r).await?;
            if resp.succeeded() {
                return Err(format!("revision {r} was applied out of order"));
            }
            rest.push((r, t));
        }
        let resp = self
            .kv
            .txn(txn)
            .await
            .map_err(|e| format!("apply revision {rev}: {e}"))?;
        if !resp.succeeded() {
            return Err(format!(
                "revision {rev} failed its order guard after its predecessor was applied"
            ));
        }
        self.confirm(rev, &resp)?;
        self.reorders += 1;
        tracing::debug!(
            revision = rev,
            resent = rest.len(),
            "replay reordered by etcd; resending"
        );
        for (r, t) in rest {
            self.send(r, t);
        }
        Ok(())
    }
}

async fn keep_alive(client: &mut Client, leases: &HashSet<i64>) {
    for id in leases {
        if let Ok((mut keeper, mut stream)) = client.lease_keep_alive(*id).await {
            let _ = keeper.keep_alive().await;
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.message()).await;
        }
    }
}

/// Grants `l` in the replaying etcd unless it holds it already or it was gone when recorded.
async fn grant_lease(
    client: &mut etcd_client::Client,
    leases: &mut HashSet<i64>,
    l: crate::format::delta_codec::Lease,
) -> Result<(), Failure> {
    if leases.contains(&l.id) || l.granted_ttl <= 0 {
        return Ok(());
    }
    match client
        .lease_grant(l.granted_ttl, Some(LeaseGrantOptions::new().with_id(l.id)))
        .await
    {
        Ok(_) => {}
        Err(e) if e.to_string().contains("lease already exists") => {}
        Err(e) => return Err(Failure::Local(format!("grant lease {:x}: {e}", l.id))),
    }
    leases.insert(l.id);
    Ok(())
}

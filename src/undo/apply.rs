//! Writing the past back: each changed key put back to its value at the point, or deleted when it
//! did not exist then, as new revisions. Every write is guarded by the key's state when the diff
//! read it (its `mod_revision`, or "absent"), so a change made meanwhile is reported as a conflict
//! and left alone (or overwritten with `--force`). Keys go in transactions of [`BATCH`]; a batch
//! whose guard fails is retried key by key to tell the conflicts from the rest.

use std::collections::HashMap;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::Serialize;

use super::{Action, Change};

/// Keys per transaction (etcd's default `--max-txn-ops` is 128; each key takes a compare and an op).
const BATCH: usize = 64;
/// Value bytes per transaction, below etcd's default `--max-request-bytes` (1.5 MiB); a key whose
/// value alone is larger goes in a transaction of its own.
const BATCH_BYTES: usize = 1 << 20;

/// `changes` cut into transactions of at most [`BATCH`] keys and [`BATCH_BYTES`] of values.
fn batches(changes: &[Change]) -> Vec<&[Change]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in changes.iter().enumerate() {
        let size = c.key.len() + c.past.as_ref().map_or(0, |p| p.size);
        if i > start && (i - start == BATCH || bytes + size > BATCH_BYTES) {
            out.push(&changes[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < changes.len() {
        out.push(&changes[start..]);
    }
    out
}

#[derive(Debug, Clone, Serialize)]
pub struct Conflict {
    pub key: String,
    /// The mod_revision the diff read (0: the key did not exist).
    pub expected_mod_revision: i64,
    /// What the key has now (0: deleted).
    pub found_mod_revision: i64,
}

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub restored: usize,
    pub deleted: usize,
    pub recreated: usize,
    /// Changed by someone else since the diff: left alone.
    pub conflicts: Vec<Conflict>,
    /// Conflicting keys written anyway (`--force`).
    pub forced: usize,
    /// Keys whose lease at the point no longer exists: written without a lease.
    pub leases_gone: Vec<(String, i64)>,
    /// etcd's revision after the last write.
    pub revision: i64,
}

fn guard(c: &Change) -> Compare {
    match &c.now {
        Some(now) => Compare::mod_revision(c.key.clone(), CompareOp::Equal, now.mod_revision),
        None => Compare::version(c.key.clone(), CompareOp::Equal, 0),
    }
}

/// Puts every change back (`changes` from [`super::diff`] with the past values kept).
pub async fn undo(client: &mut Client, changes: &[Change], force: bool) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    let mut lease_alive: HashMap<i64, bool> = HashMap::new();
    for batch in batches(changes) {
        let mut ops = Vec::with_capacity(batch.len());
        for c in batch {
            ops.push(op(client, c, &mut lease_alive, &mut out).await?);
        }
        let resp = client
            .txn(
                Txn::new()
                    .when(batch.iter().map(guard).collect::<Vec<_>>())
                    .and_then(ops.clone()),
            )
            .await
            .map_err(|e| format!("write back {} keys: {e}", batch.len()))?;
        out.revision = resp.header().map(|h| h.revision()).unwrap_or(out.revision);
        if resp.succeeded() {
            batch.iter().for_each(|c| count(&mut out, c.action));
            continue;
        }
        // Someone changed a key of this batch since the diff: one by one, to tell which.
        for (c, op) in batch.iter().zip(ops) {
            let get = TxnOp::get(c.key.clone(), None);
            let resp = client
                .txn(
                    Txn::new()
                        .when(vec![guard(c)])
                        .and_then(vec![op.clone()])
                        .or_else(vec![get]),
                )
                .await
                .map_err(|e| format!("write back {}: {e}", String::from_utf8_lossy(&c.key)))?;
            out.revision = resp.header().map(|h| h.revision()).unwrap_or(out.revision);
            if resp.succeeded() {
                count(&mut out, c.action);
                continue;
            }
            let found = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    etcd_client::TxnOpResponse::Get(g) => {
                        Some(g.kvs().first().map_or(0, |kv| kv.mod_revision()))
                    }
                    _ => None,
                })
                .unwrap_or(0);
            if force {
                let resp = client
                    .txn(Txn::new().and_then(vec![op]))
                    .await
                    .map_err(|e| format!("write back {}: {e}", String::from_utf8_lossy(&c.key)))?;
                out.revision = resp.header().map(|h| h.revision()).unwrap_or(out.revision);
                out.forced += 1;
                count(&mut out, c.action);
            } else {
                out.conflicts.push(Conflict {
                    key: String::from_utf8_lossy(&c.key).into_owned(),
                    expected_mod_revision: c.now.as_ref().map_or(0, |n| n.mod_revision),
                    found_mod_revision: found,
                });
            }
        }
    }
    Ok(out)
}

fn count(out: &mut Outcome, action: Action) {
    match action {
        Action::Restore => out.restored += 1,
        Action::Delete => out.deleted += 1,
        Action::Recreate => out.recreated += 1,
    }
}

/// The write that returns `c` to the past: a put with its value (and its lease while that lease
/// lives), or a delete.
async fn op(
    client: &mut Client,
    c: &Change,
    lease_alive: &mut HashMap<i64, bool>,
    out: &mut Outcome,
) -> Result<TxnOp, String> {
    let Some(past) = &c.past else {
        return Ok(TxnOp::delete(c.key.clone(), None));
    };
    let value = past
        .value
        .clone()
        .ok_or_else(|| "the past value was not kept (internal error)".to_owned())?;
    let mut opts = None;
    if past.lease != 0 {
        let alive = match lease_alive.get(&past.lease) {
            Some(a) => *a,
            None => {
                // etcd answers TTL -1 for a lease it does not know (expired or revoked).
                let a = client
                    .lease_time_to_live(past.lease, None)
                    .await
                    .map(|r| r.ttl() > 0)
                    .unwrap_or(false);
                lease_alive.insert(past.lease, a);
                a
            }
        };
        if alive {
            opts = Some(PutOptions::new().with_lease(past.lease));
        } else {
            out.leases_gone
                .push((String::from_utf8_lossy(&c.key).into_owned(), past.lease));
        }
    }
    Ok(TxnOp::put(c.key.clone(), value, opts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::undo::Entry;

    fn change(size: usize) -> Change {
        Change {
            action: Action::Recreate,
            key: b"k".to_vec(),
            past: Some(Entry::new(b"k", &vec![0; size], 1, 1, 0, false)),
            now: None,
        }
    }

    #[test]
    fn transactions_stay_under_etcds_op_and_request_size_limits() {
        let small: Vec<_> = (0..130).map(|_| change(10)).collect();
        let sizes: Vec<_> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![64, 64, 2]);
        // 600 KiB values: one per transaction pair would pass 1 MiB, so one each; a 2 MiB value
        // goes alone.
        let big = vec![change(600 << 10), change(600 << 10), change(2 << 20), change(10)];
        let sizes: Vec<_> = batches(&big).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1, 1, 1, 1]);
        assert!(batches(&[]).is_empty());
    }
}

//! The keys under a prefix at a past point, from the store: the chain a restore to that point
//! would use (`restore::plan`), its full snapshot downloaded and verified to a scratch file and
//! its `key` bucket read a page at a time, then its deltas applied up to the point. Nothing is
//! restored and no etcd runs. Backups written by etcd-backup-restore read the same way.

use std::path::{Path, PathBuf};

use super::{Entry, Filter, State};
use crate::format::delta_codec::{EventType, Record};
use crate::restore::plan::{self, Target};
use crate::snapshot::verify::{read_delta, read_full_to_file};
use crate::store::Store;

/// The state at the point, and where it came from.
#[derive(Debug)]
pub struct Point {
    /// The revision the state is at.
    pub revision: i64,
    pub full: String,
    pub deltas: usize,
    pub state: State,
    /// Said when the backups do not reach the revision asked for.
    pub note: Option<String>,
}

/// Removes the scratch file however the read ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The keys `filter` wants at `target`. The full snapshot passes through a scratch file in
/// `scratch_dir` (as large as the database), removed after.
pub async fn state_at(
    store: &Store,
    target: Target,
    filter: &Filter,
    scratch_dir: &Path,
) -> Result<Point, String> {
    let crate::store::gate::Screened { fulls, chains, .. } = store
        .screened_catalog()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let cands = plan::candidates(&fulls, &|c| chains.get(&c).cloned().unwrap_or_default(), target);
    let Some(cand) = cands.into_iter().next() else {
        return Err(format!(
            "no backup in {} reaches {target} (`etcd-warden backups list` shows what is there)",
            store.url
        ));
    };
    let limit = cand.stop_at.unwrap_or(i64::MAX);
    let file = Scratch(scratch_dir.join(format!(
        "etcd-warden-diff-{}-{}.db",
        std::process::id(),
        crate::store::layout::now_ms()
    )));
    read_full_to_file(store, &cand.full, &file.0, &crate::telemetry::Progress::default())
        .await
        .map_err(|e| format!("{}: {e}", cand.full.key()))?;
    let (path, f) = (file.0.clone(), filter.clone());
    let (mut state, mut current, compacted) =
        tokio::task::spawn_blocking(move || read_full(&path, &f, limit))
            .await
            .map_err(|e| e.to_string())??;
    drop(file);
    if compacted > limit {
        return Err(format!(
            "{} holds no history before revision {compacted} (compacted), so it cannot show revision {limit}: choose a later point",
            cand.full.key()
        ));
    }
    'deltas: for d in &cand.deltas {
        let records = read_delta(store, d)
            .await
            .map_err(|e| format!("{}: {e}", d.key()))?;
        for rec in records {
            let Record::Revision(r) = rec else { continue };
            if r.revision <= current {
                continue;
            }
            if r.revision > limit {
                break 'deltas;
            }
            for ev in r.events {
                if !filter.wants(&ev.key) {
                    continue;
                }
                match ev.kind {
                    EventType::Put => {
                        let e = Entry::new(
                            &ev.key,
                            &ev.value,
                            ev.create_revision,
                            r.revision,
                            ev.lease,
                            filter.keep_values,
                        );
                        state.insert(ev.key, e);
                    }
                    EventType::Delete => {
                        state.remove(&ev.key);
                    }
                }
            }
            current = r.revision;
        }
    }
    let note = match target {
        Target::Revision(r) if current < r => Some(format!(
            "the backups reach revision {current}, not {r}: this is the state at {current}"
        )),
        _ => cand.gap.as_ref().map(|(after, _)| {
            format!(
                "the chain has a gap before {}: this is the state before it",
                after.key()
            )
        }),
    };
    Ok(Point {
        revision: current,
        full: cand.full.key(),
        deltas: cand.deltas.len(),
        state,
        note,
    })
}

/// The full snapshot's keys at `limit` (or its newest revision): its revision and its compaction.
fn read_full(path: &Path, filter: &Filter, limit: i64) -> Result<(State, i64, i64), String> {
    let mut state = State::new();
    let mut newest = 1;
    let mut bad = None;
    let compacted = crate::format::mvcc::read_history(path, |rev, tombstone, kv| {
        if rev > limit {
            return;
        }
        newest = newest.max(rev);
        let Some(fields) = crate::format::proto::fields(kv) else {
            bad.get_or_insert(rev);
            return;
        };
        let bytes = |n| fields.iter().find(|f| f.0 == n).map(|f| f.3).unwrap_or_default();
        let int = |n| fields.iter().find(|f| f.0 == n).map(|f| f.2 as i64).unwrap_or(0);
        let key = bytes(1);
        if !filter.wants(key) {
            return;
        }
        if tombstone {
            state.remove(key);
        } else {
            let e = Entry::new(key, bytes(5), int(2), int(3), int(6), filter.keep_values);
            state.insert(key.to_vec(), e);
        }
    })
    .map_err(|e| format!("read {}: {e}", path.display()))?;
    if let Some(rev) = bad {
        return Err(format!("the entry of revision {rev} is no mvccpb.KeyValue"));
    }
    Ok((state, newest.max(compacted.min(limit)), compacted))
}

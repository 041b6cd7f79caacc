//! A data dir behind the store caught up in place: the revisions it misses are written into its own
//! db file from the store's deltas, as a standby follows its store, instead of moving it aside and
//! restoring the whole full. The cost is the missing revisions', not the database's size.
//!
//! Only where the data is this store's history up to its revision, shown before a byte is written:
//! - the warden's own chains continue its revision `R` without a gap up to the store's newest;
//! - a delta of the chain that continues `R` also holds `R` (and the revisions before it back to
//!   its start): every one of those revisions, read from the local db, carries the same events as
//!   the delta records (the digests of `crate::format::delta_codec`), and the local db holds each
//!   of them whole (none at or below its compaction);
//! - that delta was written for the same etcd cluster (its header's cluster ID, which the
//!   validation's etcd reported for the data dir; unknown on either side refuses), and the db file
//!   is at the revision that etcd served;
//! - the chains crossed on the way recorded the same membership and auth (the fulls' `outside`
//!   fingerprints): a change there starts a new full, and deltas do not carry it; and each is
//!   entered with its earliest delta, where the writer began it (else it may continue another
//!   history);
//! - etcd applied every entry of its WAL to the db (the WAL's last index is not above the db's
//!   consistent index): etcd replays newer entries at start, on top of what is written here.
//!
//! Anything else is the full restore as before (the caller's fallback). The revisions are written
//! by `write` and committed once, with the revision bump of a restore and its marker: a crash
//! leaves the file as it was or caught up.

use std::path::PathBuf;
use std::time::Instant;

use super::plan::{self, Candidate};
use super::write::{Applied, Around, DeltaFetcher, write_deltas};
use crate::format::delta_codec::revision_digest;
use crate::format::mvcc::{MvccFile, revisions_after};
use crate::store::Store;
use crate::store::layout::SnapshotName;
use crate::telemetry::Progress;

pub struct CatchUpOptions {
    pub data_dir: PathBuf,
    /// `--wal-dir`, when the WAL is outside the data dir.
    pub wal_dir: Option<PathBuf>,
    /// The revision etcd served on this data dir (its validation): the db file must be at it.
    pub served: i64,
    /// The cluster ID etcd reported on this data dir (its validation); unknown refuses.
    pub cluster_id: Option<u64>,
    /// The newest revision the store holds: a catch-up reaches it or does not happen.
    pub newest: i64,
    /// The restore's revision bump (`--restore-bump-revision`).
    pub bump_revision: u64,
    pub progress: Progress,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CaughtUp {
    /// The data dir's revision before.
    pub from: i64,
    /// The backed-up revision reached.
    pub revision: i64,
    /// What etcd serves: `revision` plus the bump.
    pub served: i64,
    pub bumped_by: u64,
    pub deltas: usize,
    pub revisions_applied: u64,
    pub seconds: f64,
}

/// Catches the data dir up to `opts.newest`, or says why it cannot (nothing changed then).
pub async fn catch_up(store: &Store, opts: &CatchUpOptions) -> Result<CaughtUp, String> {
    // In place, nothing of the data before is kept: only deltas whose writer is proven may be
    // written so. Without signatures anyone who can write to the bucket can frame a delta, and
    // the full restore keeps the data dir aside instead.
    if !store.keys.signing.verifies() {
        return Err(
            "the store is not signed (--sign-key or --verify-key): its deltas are written in place only when they authenticate"
                .into(),
        );
    }
    let started = Instant::now();
    let db = opts.data_dir.join("member").join("snap").join("db");
    let from = MvccFile::open(&db)
        .map_err(|e| format!("open {}: {e}", db.display()))?
        .revision();
    if from != opts.served {
        return Err(format!(
            "the db file is at revision {from} and etcd served {}: its WAL holds more",
            opts.served
        ));
    }
    let screened = store
        .screened_catalog()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let (fulls, chains) = (screened.fulls, screened.chains);
    let Continuation { cand, fulls_crossed } = continuation(&fulls, &chains, from, opts.newest)?;
    same_history_outside(store, &fulls_crossed, &cand.deltas[0], opts.cluster_id).await?;
    let (known, consistent_index) = local_digests(&db, &cand.deltas[0], from)?;
    applied_wal(opts, consistent_index)?;

    let reached = cand.target_revision;
    let bumped_by = plan::bump_amount(reached, opts.bump_revision, plan::newest_named(&fulls, &chains));
    let served = reached + bumped_by as i64;
    let data_dir = opts.data_dir.clone();
    let before_commit: super::write::BeforeCommit = Box::new(move |file: &mut MvccFile| {
        if file.revision() != reached {
            return Err(format!(
                "the deltas reached revision {} only, not the {reached} their names promise",
                file.revision()
            ));
        }
        if bumped_by > 0 {
            file.bump_and_mark_compacted(bumped_by)
                .map_err(|e| format!("bump the revision: {e}"))?;
        }
        // Before the commit: the writer must never meet the bumped data without it.
        super::marker::record(&data_dir, reached, served)
    });
    tracing::info!(
        from,
        to = reached,
        deltas = cand.deltas.len(),
        "the data dir is this store's history up to its revision: writing the revisions it misses into its db"
    );
    let file = MvccFile::open(&db).map_err(|e| format!("open {}: {e}", db.display()))?;
    let fetcher = DeltaFetcher::start(store, &cand);
    let around = Around {
        known,
        before_commit: Some(before_commit),
    };
    let (revision, applied) = write_deltas(fetcher, file, &cand, &opts.progress, true, around)
        .await
        .map_err(|e| e.message(&cand))?;
    Ok(CaughtUp {
        from,
        revision,
        served,
        bumped_by,
        deltas: cand.deltas.len(),
        revisions_applied: applied,
        seconds: started.elapsed().as_secs_f64(),
    })
}

struct Continuation {
    /// The deltas from the one that holds `from` to the store's newest; `full`: the last one's
    /// chain.
    cand: Candidate,
    /// The fulls whose chains those deltas are in.
    fulls_crossed: Vec<SnapshotName>,
}

/// The warden's own deltas that continue revision `from` up to `newest`, starting with one that
/// holds `from` itself (the proof's revisions). Pure: the store's listing in, the plan out.
fn continuation(
    fulls: &[SnapshotName],
    chains: &crate::store::Catalog,
    from: i64,
    newest: i64,
) -> Result<Continuation, String> {
    let own: Vec<SnapshotName> = fulls.iter().filter(|f| f.is_own()).copied().collect();
    let (base, newer) = plan::chains_to_list(&own, None, from);
    let mut deltas: Vec<(SnapshotName, SnapshotName)> = base
        .iter()
        .chain(newer.iter())
        .filter_map(|f| Some((f, chains.get(&f.chain()?)?)))
        .flat_map(|(f, ds)| ds.iter().filter(|d| d.is_own()).map(|d| (*d, *f)))
        .collect();
    let (mut next, chain_full) = plan::continuing(from, base, &mut deltas);
    let (Some(last), Some(chain_full)) = (next.last().copied(), chain_full) else {
        return Err(format!(
            "no delta of the warden's in the store continues revision {from}"
        ));
    };
    if last.last_revision() < newest {
        return Err(format!(
            "the deltas continue revision {from} only up to {} (a gap, or a restore since), below the newest backup {newest}",
            last.last_revision()
        ));
    }
    // The proof needs revision `from` itself from the same chain as the revision after it.
    if plan::first_revision(&next[0]) > from {
        let chain = next[0].chain();
        let holder = deltas
            .iter()
            .map(|(d, _)| *d)
            .filter(|d| d.chain() == chain && plan::first_revision(d) <= from && d.last_revision() >= from)
            .min_by_key(|d| (plan::first_revision(d), d.created_ms))
            .ok_or_else(|| {
                format!(
                    "no delta of the chain that continues revision {from} holds that revision itself, to compare the local data with"
                )
            })?;
        next.insert(0, holder);
    }
    // Into another chain only with its earliest delta: the writer starts a new chain's deltas
    // where the old chain's ended (also when writes came during the full), so entering there is
    // where the two meet, and any revisions before are compared where the two overlap. A delta
    // further into that chain could follow another history (a restore without a bump to an
    // earlier point started it).
    for pair in next.windows(2) {
        let (was, now) = (pair[0].chain(), pair[1].chain());
        if was == now {
            continue;
        }
        let earliest = deltas
            .iter()
            .filter(|(d, _)| d.chain() == now)
            .map(|(d, _)| plan::first_revision(d))
            .min();
        if earliest != Some(plan::first_revision(&pair[1])) {
            return Err(format!(
                "{} continues revision {} in another chain than {}, but is not that chain's first delta: the chains cannot be shown to be one history",
                pair[1].key(),
                pair[0].last_revision(),
                pair[0].key(),
            ));
        }
    }
    let mut fulls_crossed: Vec<SnapshotName> = Vec::new();
    for d in &next {
        if let Some((_, f)) = deltas.iter().find(|(x, _)| x == d)
            && !fulls_crossed.contains(f)
        {
            fulls_crossed.push(*f);
        }
    }
    Ok(Continuation {
        cand: Candidate {
            full: chain_full,
            target_revision: last.last_revision(),
            deltas: next,
            stop_at: None,
            gap: None,
        },
        fulls_crossed,
    })
}

/// The same cluster wrote the proof's delta, and no chain crossed recorded other membership or
/// auth than the first.
async fn same_history_outside(
    store: &Store,
    fulls_crossed: &[SnapshotName],
    proof: &SnapshotName,
    cluster_id: Option<u64>,
) -> Result<(), String> {
    let header = |key: String| async move {
        crate::store::format::read_header(store.inner.as_ref(), &key, &store.keys.signing)
            .await
            .map_err(|e| crate::telemetry::error_chain(&e))
    };
    let proof_header = header(proof.key()).await?;
    let Some(ours) = cluster_id else {
        return Err(
            "etcd did not say which cluster this data dir is: it cannot be compared with the store's".into(),
        );
    };
    if proof_header.cluster_id == 0 {
        return Err(format!(
            "{} does not say which cluster wrote it (a single member's delta from before 2026-12-05): it cannot be compared with this data dir's",
            proof.key()
        ));
    }
    if proof_header.cluster_id != ours {
        return Err(format!(
            "{} was written for cluster {:x}, and this data dir is cluster {ours:x}'s",
            proof.key(),
            proof_header.cluster_id
        ));
    }
    if fulls_crossed.len() > 1 {
        let mut seen = None;
        for f in fulls_crossed {
            let outside = header(f.key()).await?.outside.ok_or_else(|| {
                format!(
                    "{} records no membership and auth fingerprint: the chains crossed cannot be shown to agree",
                    f.key()
                )
            })?;
            match &seen {
                None => seen = Some(outside),
                Some(first) if *first != outside => {
                    return Err(format!(
                        "etcd's membership or auth changed between the chains to cross ({}): deltas do not carry that",
                        f.key()
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The digests of the local db's revisions from the proof delta's first to `from`: every one must
/// be there whole (above the db's compaction), and the delta must carry the same. Also the db's
/// consistent index.
fn local_digests(db: &std::path::Path, proof: &SnapshotName, from: i64) -> Result<(Applied, u64), String> {
    let after = plan::first_revision(proof) - 1;
    let mut digests: Vec<(i64, [u8; 32])> = Vec::new();
    let tail = revisions_after(db, after, |r| {
        if r.revision <= from {
            digests.push((r.revision, revision_digest(r)));
        }
    })
    .map_err(|e| format!("read {}: {e}", db.display()))?;
    if from <= tail.compacted {
        return Err(format!(
            "the local db is compacted at revision {} (its own revision {from}): its last revision cannot be compared",
            tail.compacted
        ));
    }
    let low = after.max(tail.compacted);
    digests.retain(|(r, _)| *r > low);
    let whole = digests
        .iter()
        .enumerate()
        .all(|(i, (r, _))| *r == low + 1 + i as i64)
        && digests.last().is_some_and(|(r, _)| *r == from);
    if !whole {
        return Err(format!(
            "the local db does not hold every revision from {} to {from}",
            low + 1
        ));
    }
    Ok((Applied::known(digests), tail.consistent_index))
}

/// etcd applied every entry of the WAL to the db: it replays the others at start, on top of
/// whatever is written here.
fn applied_wal(opts: &CatchUpOptions, applied: u64) -> Result<(), String> {
    let wal = opts
        .wal_dir
        .clone()
        .unwrap_or_else(|| opts.data_dir.join("member").join("wal"));
    let replay = crate::format::wal::replay(&wal)
        .ok_or_else(|| format!("the WAL in {} cannot be read", wal.display()))?;
    if replay.last_index > applied {
        return Err(format!(
            "the WAL holds raft entries up to index {} and the db applied up to {applied}: etcd would replay the rest on top",
            replay.last_index
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_796_000_000_000;

    fn full(revision: i64, created_ms: u64) -> SnapshotName {
        SnapshotName::parse(&format!(
            "v1/full/full-{revision:020}-{}-zstd-plain.ews",
            crate::store::layout::format_time(created_ms)
        ))
        .unwrap()
    }

    fn delta(base: SnapshotName, first: i64, last: i64, created_ms: u64) -> SnapshotName {
        let chain = base.chain().unwrap();
        SnapshotName::parse(&format!(
            "{}/delta-{first:020}-{last:020}-{}-zstd-plain.ews",
            crate::store::layout::delta_dir(chain.base, Some(chain.base_created_ms)),
            crate::store::layout::format_time(created_ms)
        ))
        .unwrap()
    }

    fn catalog(pairs: &[(SnapshotName, Vec<SnapshotName>)]) -> crate::store::Catalog {
        pairs
            .iter()
            .map(|(f, ds)| (f.chain().unwrap(), ds.clone()))
            .collect()
    }

    #[test]
    fn the_continuation_starts_with_the_delta_that_holds_the_local_revision() {
        let f0 = full(10, T);
        let ds = vec![
            delta(f0, 11, 20, T + 1),
            delta(f0, 21, 30, T + 2),
            delta(f0, 31, 35, T + 3),
        ];
        let c = continuation(&[f0], &catalog(&[(f0, ds.clone())]), 20, 35).unwrap();
        assert_eq!(c.cand.deltas, ds, "20 ends the first delta: that one comes first");
        assert_eq!((c.cand.target_revision, c.cand.full), (35, f0));
        let c = continuation(&[f0], &catalog(&[(f0, ds.clone())]), 25, 35).unwrap();
        assert_eq!(c.cand.deltas, ds[1..].to_vec());
        assert_eq!(c.fulls_crossed, vec![f0]);
    }

    #[test]
    fn a_gap_a_shortfall_or_no_holder_of_the_local_revision_is_no_continuation() {
        let f0 = full(10, T);
        let gap = vec![delta(f0, 11, 20, T + 1), delta(f0, 25, 30, T + 2)];
        assert!(continuation(&[f0], &catalog(&[(f0, gap)]), 15, 30).is_err());
        let short = vec![delta(f0, 11, 20, T + 1)];
        assert!(continuation(&[f0], &catalog(&[(f0, short)]), 15, 30).is_err());
        // Revision 10 is the full's own: no delta holds it to compare with.
        let from_full = vec![delta(f0, 11, 20, T + 1)];
        let e = continuation(&[f0], &catalog(&[(f0, from_full)]), 10, 20)
            .err()
            .unwrap();
        assert!(e.contains("holds that revision itself"), "{e}");
    }

    /// A point-in-time restore to revision 15 without a bump started chain B; the old chain A went
    /// on to 30. A disk at 12 follows A to 30, and B's delta that starts at 31 would continue it
    /// with B's history: refused, since it is not B's first.
    #[test]
    fn a_chain_is_entered_only_at_its_start() {
        let (a, b) = (full(10, T), full(15, T + 100));
        let err = continuation(
            &[a, b],
            &catalog(&[
                (a, vec![delta(a, 11, 20, T + 1), delta(a, 21, 30, T + 2)]),
                (b, vec![delta(b, 16, 20, T + 101), delta(b, 31, 40, T + 102)]),
            ]),
            12,
            40,
        )
        .err()
        .unwrap();
        assert!(err.contains("is not that chain's first delta"), "{err}");
    }

    /// A full taken under writes whose old chain was not closed at the full's revision (a store
    /// written before the writer did so, or a close that failed): the old chain ends at 28, the
    /// full is at 30, and the new chain's deltas start after it. Revisions 29 and 30 are in the
    /// full only: no catch-up.
    #[test]
    fn a_full_taken_under_writes_leaves_a_gap_no_catch_up_crosses() {
        let (a, b) = (full(10, T), full(30, T + 100));
        let err = continuation(
            &[a, b],
            &catalog(&[
                (a, vec![delta(a, 11, 28, T + 1)]),
                (b, vec![delta(b, 31, 40, T + 101)]),
            ]),
            20,
            40,
        )
        .err()
        .unwrap();
        assert!(err.contains("only up to 28"), "{err}");
    }

    #[test]
    fn a_periodic_full_is_crossed_and_named() {
        let (f0, f1) = (full(10, T), full(30, T + 100));
        let c = continuation(
            &[f0, f1],
            &catalog(&[
                (f0, vec![delta(f0, 11, 30, T + 1)]),
                (f1, vec![delta(f1, 31, 40, T + 101)]),
            ]),
            20,
            40,
        )
        .unwrap();
        assert_eq!(c.fulls_crossed, vec![f0, f1]);
        assert_eq!((c.cand.full, c.cand.target_revision), (f1, 40));
    }
}

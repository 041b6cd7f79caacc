//! Which snapshots to delete: a pure function of what is in the store, the clock and the policy.
//!
//! Rules, in order of strength:
//! 1. The newest full snapshot (by revision) and every delta of its chain are never deleted.
//! 2. `last:N` keeps the N newest full snapshots.
//! 3. `exponential` keeps every full from the last hour, the newest one of each hour for a day, of
//!    each day for a week and of each week for four weeks.
//! 4. Deltas are kept for the newest chain and for chains whose full is younger than one hour (the
//!    point-in-time window); older kept chains keep their full only. Deltas whose full is gone (or
//!    was never uploaded) go once a newer full exists.
//!
//! Deletion never races an upload: the backup loop runs retention between its own uploads.
//! `plan` is a pure function; `apply` runs it against a store and leaves locked objects alone.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::layout::{ChainId, Kind, SnapshotName};

const HOUR_MS: u64 = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// All for `keep_all`, then hourly/daily/weekly buckets.
    Exponential {
        keep_all: Duration,
        hours: u64,
        days: u64,
        weeks: u64,
    },
    /// The newest N full snapshots.
    Last(usize),
}

impl Default for Policy {
    fn default() -> Self {
        Self::Exponential {
            keep_all: Duration::from_secs(3600),
            hours: 24,
            days: 7,
            weeks: 4,
        }
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "exponential" {
            return Ok(Self::default());
        }
        if let Some(n) = s.strip_prefix("last:") {
            return match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(Self::Last(n)),
                _ => Err(format!("{s:?}: last:N needs N ≥ 1 (write e.g. last:24)")),
            };
        }
        Err(format!("{s:?}: unknown retention (use exponential or last:N)"))
    }
}

/// Keys to delete, given every full snapshot and every delta chain in the store. `pinned`: chains
/// kept whole whatever the policy (those a pending cluster restore plan names).
pub fn plan(
    fulls: &[SnapshotName],
    chains: &BTreeMap<ChainId, Vec<SnapshotName>>,
    now_ms: u64,
    policy: Policy,
    pinned: &[ChainId],
) -> Vec<String> {
    let mut by_rev: Vec<&SnapshotName> = fulls.iter().collect();
    by_rev.sort_by_key(|n| (n.last_revision(), n.created_ms));
    let Some(newest) = by_rev.last().copied() else {
        return Vec::new(); // nothing to anchor on: delete nothing
    };
    let mut keep: HashSet<String> = HashSet::new();
    keep.insert(newest.key());
    // The chain still being written after a newer full (`live_chain`: a writer that lost
    // leadership during its full) and the pinned chains are kept whole.
    let whole: Vec<ChainId> = super::layout::live_chain(fulls, chains)
        .into_iter()
        .chain(pinned.iter().copied())
        .collect();
    for f in fulls
        .iter()
        .filter(|f| f.chain().is_some_and(|c| whole.contains(&c)))
    {
        keep.insert(f.key());
    }
    let newest_rev = newest.last_revision();

    match policy {
        Policy::Last(n) => {
            for f in by_rev.iter().rev().take(n) {
                keep.insert(f.key());
            }
        }
        Policy::Exponential {
            keep_all,
            hours,
            days,
            weeks,
        } => {
            let keep_all_ms = keep_all.as_millis() as u64;
            let mut buckets: HashSet<(u8, u64)> = HashSet::new();
            // Newest first, so the first full seen in a bucket is the one kept.
            for f in by_rev.iter().rev() {
                let age = now_ms.saturating_sub(f.created_ms);
                if age <= keep_all_ms {
                    keep.insert(f.key());
                    continue;
                }
                let spans = [
                    (0u8, HOUR_MS, hours),
                    (1, 24 * HOUR_MS, days),
                    (2, 7 * 24 * HOUR_MS, weeks),
                ];
                for (tier, width, count) in spans {
                    if age <= width * count && buckets.insert((tier, f.created_ms / width)) {
                        keep.insert(f.key());
                    }
                }
            }
        }
    }

    let pitr_ms = match policy {
        Policy::Exponential { keep_all, .. } => keep_all.as_millis() as u64,
        Policy::Last(_) => HOUR_MS,
    };
    let mut delete: Vec<String> = fulls
        .iter()
        .filter(|f| !keep.contains(&f.key()))
        .map(|f| f.key())
        .collect();
    let kept_fulls: BTreeMap<ChainId, &SnapshotName> = fulls
        .iter()
        .filter(|f| keep.contains(&f.key()))
        .filter_map(|f| Some((f.chain()?, f)))
        .collect();
    let newest_chain = newest.chain();
    for (chain, deltas) in chains {
        let keep_chain = if Some(*chain) == newest_chain || chain.base > newest_rev || whole.contains(chain) {
            true // the newest chain, or one started after it whose full is still uploading
        } else {
            kept_fulls
                .get(chain)
                .is_some_and(|f| now_ms.saturating_sub(f.created_ms) <= pitr_ms)
        };
        if !keep_chain {
            delete.extend(
                deltas
                    .iter()
                    .filter(|d| matches!(d.kind, Kind::Delta { .. }))
                    .map(|d| d.key()),
            );
        }
    }
    delete.sort();
    delete
}

/// What one retention pass did.
#[derive(Debug, Default)]
pub struct Applied {
    pub deleted: usize,
    /// Objects the policy would delete that an S3 Object Lock still protects: left alone.
    pub locked: Vec<(String, super::lock::Lock)>,
}

impl Applied {
    /// When the first locked object becomes deletable (`None`: none is locked, or only by legal
    /// holds, which have no date).
    pub fn next_deletable(&self) -> Option<std::time::SystemTime> {
        self.locked
            .iter()
            .filter(|(_, l)| !l.legal_hold)
            .filter_map(|(_, l)| l.until)
            .min()
    }
}

/// Deletes what the policy (and `rollback_keep`, for rollback points) no longer keeps in `store`,
/// apart from the objects an Object Lock protects, which stay until their date has passed. Only
/// this program's objects: etcd-backup-restore's beside them stay as they are.
pub async fn apply(
    store: &super::Store,
    policy: Policy,
    rollback_keep: Option<Duration>,
    pinned: &[ChainId],
) -> Result<Applied, super::StoreError> {
    let (fulls, chains) = screened(store, store.own_catalog().await?).await?;
    let now_ms = super::layout::now_ms();
    let mut doomed = plan(&fulls, &chains, now_ms, policy, pinned);
    // Rollback points go once `--rollback-retention` has passed since each was taken.
    if let Some(keep) = rollback_keep {
        match crate::store::rollback::list(store).await {
            Ok(points) => {
                for key in crate::store::rollback::expired(&points, now_ms, keep) {
                    tracing::info!(key, keep = %humantime::format_duration(keep), "rollback point expired");
                    doomed.push(key);
                }
            }
            Err(e) => tracing::warn!(error = %e, "retention: cannot list the rollback points"),
        }
    }
    let mut applied = Applied::default();
    let now = std::time::SystemTime::now();
    for key in doomed {
        match store.lock(&key).await? {
            Some(lock) if lock.holds(now) => applied.locked.push((key, lock)),
            _ => {
                store.delete(&key).await?;
                applied.deleted += 1;
            }
        }
    }
    if !applied.locked.is_empty() {
        tracing::info!(
            store = %store.url,
            locked = applied.locked.len(),
            next_deletable = applied.next_deletable().map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            "retention leaves objects under S3 Object Lock in place until their retention date"
        );
    }
    Ok(applied)
}

/// The listing as retention may decide from it: fulls that pass the gate (`gate::check`). A full
/// that does not, and its chain, are left out: such an object neither counts as a newer full
/// (planted names would push genuine fulls out of `last:N` or an hour's bucket) nor is deleted
/// (what did not verify is not provably the warden's own).
async fn screened(
    store: &super::Store,
    (fulls, mut chains): (Vec<SnapshotName>, super::Catalog),
) -> Result<(Vec<SnapshotName>, super::Catalog), super::StoreError> {
    let listed: Vec<_> = fulls.iter().map(|n| (*n, None)).collect();
    let checked =
        super::gate::check_all(store, &listed)
            .await
            .map_err(|reason| super::StoreError::Check {
                url: store.url.to_string(),
                reason,
            })?;
    let mut rejected = super::gate::Rejected::default();
    let mut kept = Vec::with_capacity(fulls.len());
    for (n, r) in fulls.into_iter().zip(checked) {
        match r {
            Ok(_) => kept.push(n),
            Err(why) => {
                if let Some(c) = n.chain() {
                    chains.remove(&c);
                }
                rejected.add(n.key(), why);
            }
        }
    }
    if let Some(s) = rejected.summary() {
        tracing::warn!(
            skipped = rejected.count,
            "retention: {s}; neither kept nor deleted"
        );
    }
    Ok((kept, chains))
}

/// Objects retention would have deleted that an S3 Object Lock keeps (the last pass).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RetentionLocked {
    pub objects: usize,
    /// When the first of them becomes deletable (`None`: only legal holds keep them).
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub next_deletable_at: Option<SystemTime>,
}

impl RetentionLocked {
    pub fn of(applied: &Applied) -> Option<Self> {
        (!applied.locked.is_empty()).then(|| Self {
            objects: applied.locked.len(),
            next_deletable_at: applied.next_deletable(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::layout::{Compression, Encryption};

    const NOW: u64 = 1_800_000_000_000;

    fn full(rev: i64, age_ms: u64) -> SnapshotName {
        SnapshotName {
            kind: Kind::Full {
                revision: rev,
                is_final: false,
            },
            created_ms: NOW - age_ms,
            compression: Compression::Zstd,
            encryption: Encryption::Plain,
            layout: crate::store::layout::Layout::Warden,
        }
    }

    /// A delta of the chain that `of` starts.
    fn delta(of: &SnapshotName, first: i64, last: i64, age_ms: u64) -> SnapshotName {
        let c = of.chain().expect("a full");
        SnapshotName {
            kind: Kind::Delta {
                base: c.base,
                base_created_ms: Some(c.base_created_ms),
                first,
                last,
            },
            ..full(0, age_ms)
        }
    }

    fn chain(of: &SnapshotName) -> ChainId {
        of.chain().expect("a full")
    }

    fn revs(fulls: &[SnapshotName], deleted: &[String]) -> Vec<i64> {
        fulls
            .iter()
            .filter(|f| deleted.contains(&f.key()))
            .map(|f| f.last_revision())
            .collect()
    }

    /// One full every 30 minutes for 40 days. NOW is 08:00 UTC, 32 h into its (epoch-aligned) week,
    /// so the calendar buckets fall at known ages, derived by hand below from the rules in the module
    /// comment, not from `plan`.
    #[test]
    fn exponential_table() {
        let fulls: Vec<SnapshotName> = (0..40 * 48u64)
            .map(|i| full(10_000 - i as i64, i * HOUR_MS / 2))
            .collect();
        assert_eq!(NOW % (24 * HOUR_MS), 8 * HOUR_MS, "the table below assumes 08:00");
        assert_eq!(NOW % (7 * 24 * HOUR_MS), 32 * HOUR_MS, "and 32 h into the week");
        let deleted = plan(&fulls, &BTreeMap::new(), NOW, Policy::default(), &[]);
        // Kept ages in half hours.
        let kept: Vec<u64> = fulls
            .iter()
            .filter(|f| !deleted.contains(&f.key()))
            .map(|f| (NOW - f.created_ms) / (HOUR_MS / 2))
            .collect();
        // The last hour, all: 0, 30 min, 60 min.
        let mut want: Vec<u64> = vec![0, 1, 2];
        // Hourly for a day: the newest of each clock hour older than the last hour, 1.5 h … 23.5 h
        // (the 24 h old one shares the 23.5 h one's hour).
        want.extend((3..=47).step_by(2));
        // Daily for a week: the newest of each day; today's (1.5 h) and yesterday's (8.5 h) are kept
        // already, then 32.5 h, 56.5 h, … 152.5 h (the next, 176.5 h, is past 7 days).
        want.extend((65..=305).step_by(48));
        // Weekly for 4 weeks: this week's (1.5 h) and last week's (32.5 h) are kept already, then
        // 200.5 h, 368.5 h, 536.5 h (the next, 704.5 h, is past 4 weeks).
        want.extend([401, 737, 1073]);
        assert_eq!(kept, want, "kept ages in half hours");
        let band = |lo: u64, hi: u64| kept.iter().filter(|a| **a > lo && **a <= hi).count();
        assert_eq!(kept.iter().filter(|a| **a <= 2).count(), 3, "last hour");
        assert_eq!(band(2, 48), 23, "hourly band, 1 h … 24 h");
        assert_eq!(band(48, 7 * 48), 6, "daily band, 1 d … 7 d");
        assert_eq!(band(7 * 48, 28 * 48), 3, "weekly band, 7 d … 28 d");
        assert_eq!(band(28 * 48, u64::MAX), 0, "older than 4 weeks");
        assert_eq!(deleted.len(), fulls.len() - 35);
    }

    #[test]
    fn newest_full_and_its_deltas_survive_everything() {
        let fulls = vec![full(100, 90 * 24 * HOUR_MS), full(50, 91 * 24 * HOUR_MS)];
        let (c100, c50) = (chain(&fulls[0]), chain(&fulls[1]));
        let mut chains = BTreeMap::new();
        chains.insert(c100, vec![delta(&fulls[0], 101, 150, 89 * 24 * HOUR_MS)]);
        chains.insert(c50, vec![delta(&fulls[1], 51, 99, 91 * 24 * HOUR_MS)]);
        let deleted = plan(&fulls, &chains, NOW, Policy::Last(1), &[]);
        assert_eq!(revs(&fulls, &deleted), vec![50]);
        assert!(!deleted.contains(&chains[&c100][0].key()));
        assert!(deleted.contains(&chains[&c50][0].key()));
    }

    #[test]
    fn last_n_and_old_chains_lose_deltas_only() {
        let fulls = vec![full(300, 0), full(200, 2 * HOUR_MS), full(100, 4 * HOUR_MS)];
        let (c300, c200, c100) = (chain(&fulls[0]), chain(&fulls[1]), chain(&fulls[2]));
        let mut chains = BTreeMap::new();
        chains.insert(c200, vec![delta(&fulls[1], 201, 299, 2 * HOUR_MS)]);
        chains.insert(c100, vec![delta(&fulls[2], 101, 199, 4 * HOUR_MS)]);
        chains.insert(c300, vec![delta(&fulls[0], 301, 310, 0)]);
        let deleted = plan(&fulls, &chains, NOW, Policy::Last(2), &[]);
        assert_eq!(revs(&fulls, &deleted), vec![100]);
        assert!(
            deleted.contains(&chains[&c200][0].key()),
            "deltas of a 2 h old chain kept"
        );
        assert!(deleted.contains(&chains[&c100][0].key()));
        assert!(!deleted.contains(&chains[&c300][0].key()));
    }

    #[test]
    fn chain_newer_than_newest_full_is_kept_and_empty_store_deletes_nothing() {
        let fulls = vec![full(100, 0)];
        let uploading = full(120, 0);
        let mut chains = BTreeMap::new();
        chains.insert(chain(&uploading), vec![delta(&uploading, 121, 130, 0)]);
        assert!(plan(&fulls, &chains, NOW, Policy::Last(1), &[]).is_empty());
        assert!(plan(&[], &chains, NOW, Policy::Last(1), &[]).is_empty());
    }

    /// Another history at the newest full's revision (a restore without a bump): its deltas are not
    /// the newest chain's and go with their own full.
    #[test]
    fn a_second_history_at_the_same_revision_is_not_the_newest_chain() {
        let newest = full(100, 0);
        let other = full(100, 30 * 24 * HOUR_MS);
        let fulls = vec![other, newest];
        let mut chains = BTreeMap::new();
        chains.insert(chain(&newest), vec![delta(&newest, 101, 110, 0)]);
        chains.insert(chain(&other), vec![delta(&other, 101, 120, 30 * 24 * HOUR_MS)]);
        let deleted = plan(&fulls, &chains, NOW, Policy::Last(1), &[]);
        assert!(!deleted.contains(&chains[&chain(&newest)][0].key()));
        assert!(deleted.contains(&chains[&chain(&other)][0].key()));
        assert!(deleted.contains(&other.key()));
    }

    /// A writer that lost leadership finished a full (revision 400) after the next writer had
    /// resumed the older chain (base 100) and went on extending it past 400 for two hours: that
    /// chain is the live history, and keeps every delta whatever the policy.
    #[test]
    fn the_chain_a_new_writer_extends_past_a_stale_full_keeps_its_deltas() {
        let base = full(100, 3 * HOUR_MS);
        let stale = full(400, 2 * HOUR_MS + 60_000);
        let fulls = vec![base, stale];
        let mut chains = BTreeMap::new();
        chains.insert(
            chain(&base),
            vec![
                delta(&base, 101, 390, 2 * HOUR_MS + 120_000),
                delta(&base, 391, 900, 2 * HOUR_MS),
                delta(&base, 901, 950, 1000),
            ],
        );
        let deleted = plan(&fulls, &chains, NOW, Policy::Last(1), &[]);
        assert!(
            deleted.is_empty(),
            "the live chain (or its full) was deleted: {deleted:?}"
        );
        // Once a newer full follows the live chain's deltas, the chain is an old one again.
        let newer = full(960, 0);
        let fulls = vec![base, stale, newer];
        let deleted = plan(&fulls, &chains, NOW, Policy::Last(1), &[]);
        assert_eq!(revs(&fulls, &deleted), vec![100, 400]);
    }

    #[test]
    fn a_pinned_chain_is_kept_whole() {
        let fulls = vec![full(300, 0), full(100, 40 * 24 * HOUR_MS)];
        let old = chain(&fulls[1]);
        let mut chains = BTreeMap::new();
        chains.insert(old, vec![delta(&fulls[1], 101, 199, 40 * 24 * HOUR_MS)]);
        assert_eq!(plan(&fulls, &chains, NOW, Policy::Last(1), &[]).len(), 2);
        assert!(plan(&fulls, &chains, NOW, Policy::Last(1), &[old]).is_empty());
    }

    #[test]
    fn parse_policy() {
        assert_eq!("exponential".parse::<Policy>(), Ok(Policy::default()));
        assert_eq!("last:3".parse::<Policy>(), Ok(Policy::Last(3)));
        assert!("last:0".parse::<Policy>().is_err());
        assert!("forever".parse::<Policy>().is_err());
    }
}

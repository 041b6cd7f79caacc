//! Which objects a restore uses: a pure function of the store's listing and the target.
//!
//! Candidates are chains, newest first: a full snapshot plus the contiguous run of its deltas that
//! reaches the target. The executor tries them in order; when one fails verification it falls back
//! to the next and says so. A chain whose deltas have a gap ends at the gap (its later deltas are
//! unusable), which is still a valid, older point in time.

use crate::store::layout::{ChainId, Kind, SnapshotName};

/// How far to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Everything the store has.
    Latest,
    /// Stop after this revision (point in time by revision).
    Revision(i64),
    /// Stop after the last delta created at or before this Unix time in milliseconds. Deltas are
    /// applied whole (a delta's events carry no timestamps), so the result is the state as of the
    /// newest delta written before the time.
    Time(u64),
    /// Exactly this full snapshot, whatever revision its database holds, and none of its deltas (a
    /// cluster restore plan that chose a full with nothing after it: every member restores the
    /// same file, though its name says only a lower bound of its revision).
    Full(ChainId),
    /// That chain (its full snapshot and deltas) up to this revision, and no other: a cluster
    /// restore plan, so every member restores the same point of the same history, however late it
    /// applies the plan and whatever was written to the store since.
    ChainAt(ChainId, i64),
    /// Exactly this rollback point (`upgrade::rollback`): a full snapshot outside the chains.
    Rollback(SnapshotName),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Latest => f.write_str("the newest backup"),
            Self::Revision(r) => write!(f, "revision {r}"),
            Self::Time(ms) => write!(
                f,
                "the time {}",
                humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(*ms)
                )
            ),
            Self::Full(c) | Self::ChainAt(c, _) => write!(f, "the chain of the full at revision {}", c.base),
            Self::Rollback(n) => write!(f, "the rollback point {}", n.key()),
        }
    }
}

/// One way to restore: a full snapshot and the deltas to apply after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub full: SnapshotName,
    pub deltas: Vec<SnapshotName>,
    /// The revision the restore ends at, if known from the names (a full snapshot's true revision
    /// may exceed its name's lower bound when no delta follows).
    pub target_revision: i64,
    /// Apply revisions up to and including this one (`None`: all of the listed deltas).
    pub stop_at: Option<i64>,
    /// A gap in the listing before the target: `(the first delta after it, the revision the
    /// chain's deltas reach beyond it, capped at the target)`. The chain ends at the gap, so the
    /// restore reaches less than the store lists (a deleted or never-uploaded delta).
    pub gap: Option<(SnapshotName, i64)>,
}

impl Candidate {
    /// Drops delta `index` and everything after it: the chain ends at the revision before it.
    pub fn cut_before(&mut self, index: usize) {
        self.deltas.truncate(index);
        self.target_revision = match self.deltas.last().map(|d| d.kind) {
            Some(Kind::Delta { last, .. }) => last,
            _ => self.full.last_revision(),
        };
        self.stop_at = self.stop_at.filter(|s| *s < self.target_revision);
    }
}

/// Candidates in preference order (newest usable first).
pub fn candidates(
    fulls: &[SnapshotName],
    chain_of: &dyn Fn(ChainId) -> Vec<SnapshotName>,
    target: Target,
) -> Vec<Candidate> {
    let (only, target) = match target {
        Target::ChainAt(c, r) => (Some(c), Target::Revision(r)),
        t => (None, t),
    };
    let mut fulls: Vec<&SnapshotName> = fulls
        .iter()
        .filter(|f| only.is_none() || f.chain() == only)
        .filter(|f| match target {
            Target::Latest => true,
            Target::Revision(r) | Target::ChainAt(_, r) => f.last_revision() <= r,
            Target::Time(t) => f.created_ms <= t,
            Target::Full(c) => f.chain() == Some(c),
            // Never among the chains (the executor takes it as it is).
            Target::Rollback(_) => false,
        })
        .collect();
    fulls.sort_by_key(|f| (f.last_revision(), f.created_ms));
    let mut out = Vec::new();
    for full in fulls.into_iter().rev() {
        let base = full.last_revision();
        let Some(chain) = full.chain() else { continue };
        // Only the deltas of this very full: another full at the same revision is another history.
        let mut deltas: Vec<SnapshotName> = chain_of(chain)
            .into_iter()
            .filter(|d| matches!(d.kind, Kind::Delta { base: b, .. } if b == base))
            .collect();
        deltas.sort_by_key(|d| match d.kind {
            Kind::Delta { first, last, .. } => (first, last, d.created_ms),
            Kind::Full { .. } => (0, 0, 0),
        });
        let mut chosen = Vec::new();
        let mut next = base.saturating_add(1);
        let mut gap: Option<(SnapshotName, i64)> = None;
        for d in deltas {
            let Kind::Delta { first, last, .. } = d.kind else {
                continue;
            };
            if last < next {
                continue; // fully covered by what we have (an overlapping retry)
            }
            if gap.is_none() && first > next {
                // A gap: the chain ends here. It costs the restore revisions when the target
                // wants any past it (a revision inside the gap too).
                let wanted = match target {
                    Target::Full(_) | Target::Rollback(_) => false,
                    Target::Latest => true,
                    Target::Revision(r) | Target::ChainAt(_, r) => r >= next,
                    Target::Time(t) if d.created_ms <= t => true,
                    // The missing delta was written between the last one taken and this one,
                    // perhaps before the target time: its revisions count as asked for, so a
                    // restore that cannot tell never passes for complete.
                    Target::Time(_) => {
                        gap = Some((d, first.saturating_sub(1)));
                        break;
                    }
                };
                if !wanted {
                    break;
                }
                gap = Some((d, last));
                continue;
            }
            match target {
                Target::Full(_) => break,
                // The delta right after the target too: a lease set it opens with is etcd's
                // leases at the target (`delta_codec`); its revisions are not applied.
                Target::Revision(r) if first > r.saturating_add(1) => break,
                Target::Time(t) if d.created_ms > t => break,
                _ => {}
            }
            if let Some((_, beyond)) = gap.as_mut() {
                *beyond = (*beyond).max(last);
                continue;
            }
            chosen.push(d);
            next = last.saturating_add(1);
        }
        if let (Some((_, beyond)), Target::Revision(r)) = (gap.as_mut(), target) {
            *beyond = (*beyond).min(r);
        }
        let reached = next.saturating_sub(1);
        let (target_revision, stop_at) = match target {
            Target::Revision(r) if reached >= r => (r, Some(r)),
            Target::Revision(_) => (reached, None),
            _ => (reached, None),
        };
        out.push(Candidate {
            full: *full,
            deltas: chosen,
            target_revision,
            stop_at,
            gap,
        });
    }
    // Within one program's chains the newest full comes first, whatever its reach: two histories
    // at one revision (a restore without a bump) must not make the abandoned one win. Between the
    // warden's own chains and GBR's, one history (the same etcd, backed up by whichever program led
    // during a switch), the one that reaches further comes first.
    // A full taken by a writer that lost leadership mid-way is older than the chain the next
    // writer kept extending (`live_chain`): that chain comes first when it reaches as far.
    let catalog: std::collections::BTreeMap<ChainId, Vec<SnapshotName>> = out
        .iter()
        .filter_map(|c| c.full.chain())
        .map(|c| (c, chain_of(c)))
        .collect();
    let all_fulls: Vec<SnapshotName> = out.iter().map(|c| c.full).collect();
    if let Some(live) = crate::store::layout::live_chain(&all_fulls, &catalog)
        && let Some(i) = out.iter().position(|c| c.full.chain() == Some(live))
        && out[i].target_revision >= out[0].target_revision
    {
        let c = out.remove(i);
        out.insert(0, c);
    }
    if let Some(first) = out.first() {
        let own = first.full.is_own();
        if let Some(i) = out.iter().position(|c| c.full.is_own() != own)
            && out[i].target_revision > first.target_revision
        {
            let c = out.remove(i);
            out.insert(0, c);
        }
    }
    out
}

/// The newest revision any object of a listing names, every chain's: what a bump must clear.
pub fn newest_named(fulls: &[SnapshotName], chains: &crate::store::Catalog) -> i64 {
    fulls
        .iter()
        .map(|f| f.last_revision())
        .chain(chains.values().flatten().map(|d| d.last_revision()))
        .max()
        .unwrap_or(0)
}

/// How much to bump a restore that reached `restored`, asked to bump by `bump`, when the store
/// names revisions up to `named`: `bump`, unless that would not clear `named` (a fallback to an
/// older chain, below a newer chain that clients were served); then as far again past `named`.
/// 0 stays 0: the operator asked for an exact copy.
pub fn bump_amount(restored: i64, bump: u64, named: i64) -> u64 {
    if bump == 0 {
        return 0;
    }
    let landed = restored.saturating_add(bump.min(i64::MAX as u64) as i64);
    if landed > named {
        bump
    } else {
        bump.saturating_add(named.saturating_sub(restored) as u64)
    }
}

/// The fulls whose chains can continue revision `at` (a standby's poll, a catch-up): the followed
/// one (while the store holds it), else the newest at or below `at`; and every full after it.
pub fn chains_to_list(
    fulls: &[SnapshotName],
    followed: Option<SnapshotName>,
    at: i64,
) -> (Option<SnapshotName>, Vec<SnapshotName>) {
    let base = match followed {
        Some(c) if fulls.contains(&c) => Some(c),
        _ => fulls.iter().rfind(|f| f.last_revision() <= at).copied(),
    };
    let order = |f: &SnapshotName| (f.last_revision(), f.created_ms);
    let newer = fulls
        .iter()
        .filter(|f| base.is_none_or(|b| order(f) > order(&b)))
        .copied()
        .collect();
    (base, newer)
}

/// The deltas (each with its chain's full) that continue revision `at`, in order, and the full of
/// the last one's chain. Where two chains continue the same revision, `base`'s comes first.
pub fn continuing(
    at: i64,
    base: Option<SnapshotName>,
    deltas: &mut [(SnapshotName, SnapshotName)],
) -> (Vec<SnapshotName>, Option<SnapshotName>) {
    deltas.sort_by_key(|(d, full)| (first_revision(d), Some(*full) != base, d.created_ms));
    let mut next = Vec::new();
    let mut chain_full = None;
    let mut want = at.saturating_add(1);
    for (d, full) in deltas.iter() {
        if first_revision(d) <= want && d.last_revision() >= want {
            chain_full = Some(*full);
            next.push(*d);
            want = d.last_revision().saturating_add(1);
        }
    }
    (next, chain_full)
}

pub fn first_revision(n: &SnapshotName) -> i64 {
    match n.kind {
        crate::store::layout::Kind::Delta { first, .. } => first,
        crate::store::layout::Kind::Full { revision, .. } => revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bump_clears_every_revision_the_store_names() {
        const B: u64 = 1_000_000_000;
        for (restored, bump, named, want) in [
            // The newest chain restored: the bump as asked.
            (100, B, 100, B),
            // Point in time below the newest: the asked bump already clears it.
            (100, B, 150, B),
            // An older chain below a bumped newer one (issue 40 finding 4): as far past it again.
            (2_000_000_006, B, 3_000_000_015, B + 1_000_000_009),
            // Landing exactly on a named revision is no clearance.
            (100, 50, 150, 100),
            // An exact copy stays exact.
            (100, 0, 10_000, 0),
        ] {
            let got = bump_amount(restored, bump, named);
            assert_eq!(got, want, "restored {restored}, bump {bump}, named {named}");
            if bump > 0 {
                assert!(restored + got as i64 > named);
            }
        }
    }
    use crate::store::layout::{Compression, Encryption};

    fn full(rev: i64, t: u64) -> SnapshotName {
        SnapshotName {
            kind: Kind::Full {
                revision: rev,
                is_final: false,
            },
            created_ms: t,
            compression: Compression::Zstd,
            encryption: Encryption::Plain,
            layout: crate::store::layout::Layout::Warden,
        }
    }
    /// An older-layout delta (its chain found by `legacy_owner`).
    fn delta(base: i64, first: i64, last: i64, t: u64) -> SnapshotName {
        SnapshotName {
            kind: Kind::Delta {
                base,
                base_created_ms: None,
                first,
                last,
            },
            ..full(0, t)
        }
    }

    /// A delta of the chain that `of` starts.
    fn delta_of(of: &SnapshotName, first: i64, last: i64, t: u64) -> SnapshotName {
        let c = of.chain().unwrap();
        SnapshotName {
            kind: Kind::Delta {
                base: c.base,
                base_created_ms: Some(c.base_created_ms),
                first,
                last,
            },
            ..full(0, t)
        }
    }

    /// What `Store::catalog` does: each delta under the chain it names (or its legacy owner).
    fn chains<'a>(
        fulls: &'a [SnapshotName],
        ds: Vec<SnapshotName>,
    ) -> impl Fn(ChainId) -> Vec<SnapshotName> + 'a {
        move |c| {
            ds.iter()
                .filter(|d| d.chain().or_else(|| crate::store::layout::legacy_owner(d, fulls)) == Some(c))
                .copied()
                .collect()
        }
    }

    /// During a switch GBR's chain and the warden's are one history: whichever reaches further
    /// leads, the rest follow newest full first.
    #[test]
    fn between_gbr_and_own_chains_the_further_reaching_one_comes_first() {
        let gbr = crate::store::gbr::names::parse("v2/Full-00000000-00000050-1000").unwrap();
        let gbr_deltas = crate::store::gbr::names::chains(
            &[gbr],
            &[crate::store::gbr::names::parse("v2/Incr-00000051-00000150-1200").unwrap()],
        );
        let own = full(100, 1_100_000);
        let own_deltas = vec![delta_of(&own, 101, 120, 1_150_000)];
        let of = |c: ChainId| -> Vec<SnapshotName> {
            if Some(c) == own.chain() {
                return own_deltas.clone();
            }
            gbr_deltas
                .iter()
                .find(|(g, _)| *g == c)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let cs = candidates(&[gbr, own], &of, Target::Latest);
        assert_eq!((cs[0].full, cs[0].target_revision), (gbr, 150), "{cs:#?}");
        assert_eq!(cs[1].full, own);
        // Once the warden's own chain reaches further, it leads.
        let cs = candidates(
            &[gbr, own],
            &|c| {
                if Some(c) == own.chain() {
                    vec![delta_of(&own, 101, 200, 1_300_000)]
                } else {
                    of(c)
                }
            },
            Target::Latest,
        );
        assert_eq!((cs[0].full, cs[0].target_revision), (own, 200));
    }

    /// Two histories whose fulls share revision 10 (a restore landed there twice): each candidate
    /// holds only its own full's deltas, whatever their revisions.
    #[test]
    fn two_histories_at_one_revision_never_mix() {
        let (old, new) = (full(10, 100), full(10, 700));
        let fulls = [old, new];
        let c = chains(
            &fulls,
            vec![
                delta_of(&old, 11, 30, 200),
                delta_of(&old, 31, 60, 600),
                delta_of(&new, 11, 20, 800),
            ],
        );
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!(cs.len(), 2);
        assert_eq!((cs[0].full, cs[0].target_revision), (new, 20));
        assert!(
            cs[0].deltas.iter().all(|d| d.chain() == new.chain()),
            "{:?}",
            cs[0].deltas
        );
        assert_eq!((cs[1].full, cs[1].target_revision), (old, 60));
        assert!(cs[1].deltas.iter().all(|d| d.chain() == old.chain()));
        // Older-layout deltas go with the newest full at their base created before them.
        let c = chains(&fulls, vec![delta(10, 11, 30, 200), delta(10, 11, 15, 800)]);
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!((cs[0].full, cs[0].target_revision), (new, 15));
        assert_eq!((cs[1].full, cs[1].target_revision), (old, 30));
    }

    /// A writer that lost leadership during its full published it (revision 40, created at 300)
    /// after the next writer resumed the chain of full 10 and went on past it: latest is that chain,
    /// not the newer full, and a revision target past 40 is reached through it too.
    #[test]
    fn a_full_finished_after_leadership_moved_does_not_hide_the_live_chain() {
        let (base, stale) = (full(10, 100), full(40, 300));
        let fulls = [base, stale];
        let c = chains(
            &fulls,
            vec![delta_of(&base, 11, 35, 250), delta_of(&base, 36, 70, 400)],
        );
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!((cs[0].full, cs[0].target_revision), (base, 70));
        assert_eq!((cs[1].full, cs[1].target_revision), (stale, 40));
        let cs = candidates(&fulls, &c, Target::Revision(60));
        assert_eq!((cs[0].full, cs[0].target_revision), (base, 60));
        // A newer full after the chain's last delta is the newest point again.
        let fulls = [base, stale, full(70, 500)];
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!(cs[0].full, fulls[2]);
    }

    #[test]
    fn latest_uses_the_newest_chain_and_falls_back_in_order() {
        let fulls = [full(10, 100), full(50, 500)];
        let c = chains(
            &fulls,
            vec![
                delta(10, 11, 30, 200),
                delta(10, 31, 49, 400),
                delta(50, 51, 60, 600),
            ],
        );
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0].full, fulls[1]);
        assert_eq!(cs[0].target_revision, 60);
        assert_eq!(cs[1].full, fulls[0]);
        assert_eq!(cs[1].deltas.len(), 2);
        assert_eq!(cs[1].target_revision, 49);
    }

    #[test]
    fn point_in_time_by_revision_stops_inside_a_delta() {
        let fulls = [full(10, 100), full(50, 500)];
        let c = chains(&fulls, vec![delta(10, 11, 30, 200), delta(10, 31, 49, 400)]);
        let cs = candidates(&fulls, &c, Target::Revision(35));
        assert_eq!(cs.len(), 1, "the full at 50 is past the target");
        assert_eq!(cs[0].deltas.len(), 2);
        assert_eq!(cs[0].stop_at, Some(35));
        assert_eq!(cs[0].target_revision, 35);
        // The delta after the target is read for the lease set it may open with.
        let cs = candidates(&fulls, &c, Target::Revision(10));
        assert_eq!(cs[0].deltas.len(), 1);
        assert_eq!(cs[0].stop_at, Some(10));
        let cs = candidates(&fulls, &c, Target::Revision(30));
        assert_eq!(cs[0].deltas.len(), 2);
        assert_eq!(cs[0].stop_at, Some(30));
    }

    #[test]
    fn point_in_time_by_time_and_gaps() {
        let fulls = [full(10, 100)];
        let c = chains(
            &fulls,
            vec![
                delta(10, 11, 20, 200),
                delta(10, 21, 30, 300),
                delta(10, 35, 40, 400),
            ],
        );
        let cs = candidates(&fulls, &c, Target::Time(250));
        assert_eq!(cs[0].deltas.len(), 1);
        assert_eq!(cs[0].target_revision, 20);
        let cs = candidates(&fulls, &c, Target::Latest);
        assert_eq!(cs[0].target_revision, 30, "the chain ends at the gap");
        assert_eq!(
            cs[0].gap,
            Some((delta(10, 35, 40, 400), 40)),
            "and says what it lists beyond"
        );
        let cs = candidates(&fulls, &c, Target::Revision(37));
        assert_eq!(cs[0].gap.map(|(_, beyond)| beyond), Some(37));
        let cs = candidates(&fulls, &c, Target::Revision(32));
        assert_eq!(
            (cs[0].target_revision, cs[0].gap.map(|(_, beyond)| beyond)),
            (30, Some(32)),
            "a target inside the gap is not reached either"
        );
        let cs = candidates(&fulls, &c, Target::Revision(30));
        assert_eq!(cs[0].gap, None);
        let cs = candidates(&fulls, &c, Target::Time(350));
        assert_eq!(
            cs[0].gap,
            Some((delta(10, 35, 40, 400), 34)),
            "the missing delta may have been written before the target time"
        );
    }

    #[test]
    fn overlapping_retry_is_skipped() {
        let fulls = [full(10, 100)];
        let c = chains(
            &fulls,
            vec![
                delta(10, 11, 20, 200),
                delta(10, 11, 25, 210),
                delta(10, 26, 30, 300),
            ],
        );
        let cs = candidates(&fulls, &c, Target::Latest);
        // 11-20 then 11-25 overlaps (first < next) but extends: it is taken from 21 on.
        assert_eq!(cs[0].target_revision, 30);
    }

    fn full_at(revision: i64, created_ms: u64) -> SnapshotName {
        SnapshotName::parse(&format!(
            "v1/full/full-{revision:020}-{}-zstd-plain.ews",
            crate::store::layout::format_time(created_ms)
        ))
        .unwrap()
    }

    fn chain_delta(
        base: SnapshotName,
        first: i64,
        last: i64,
        created_ms: u64,
    ) -> (SnapshotName, SnapshotName) {
        let chain = base.chain().unwrap();
        let key = format!(
            "{}/delta-{first:020}-{last:020}-{}-zstd-plain.ews",
            crate::store::layout::delta_dir(chain.base, Some(chain.base_created_ms)),
            crate::store::layout::format_time(created_ms)
        );
        (SnapshotName::parse(&key).unwrap(), base)
    }

    const T0: u64 = 1_796_000_000_000;

    /// A handover between writers: the new writer extends the chain of F0 while the old one's
    /// late full F1 sits at a higher revision. A standby past F1's revision that follows F0 still
    /// lists F0's chain and takes its deltas; the newest full at or below its revision alone
    /// (F1) would have hidden them.
    #[test]
    fn the_followed_chain_is_listed_past_a_later_full_of_another_writer() {
        let (f0, f1) = (full_at(10, T0), full_at(50, T0 + 5_000));
        let fulls = [f0, f1];
        let (base, newer) = chains_to_list(&fulls, Some(f0), 60);
        assert_eq!(base, Some(f0));
        assert_eq!(newer, vec![f1]);
        let (base_untracked, _) = chains_to_list(&fulls, None, 60);
        assert_eq!(
            base_untracked,
            Some(f1),
            "without the followed chain, F1 would be the base"
        );
        let mut deltas = vec![
            chain_delta(f0, 11, 60, T0 + 1_000),
            chain_delta(f0, 61, 70, T0 + 9_000),
            chain_delta(f0, 71, 75, T0 + 9_500),
        ];
        let (next, chain) = continuing(60, base, &mut deltas);
        assert_eq!(
            next.iter().map(|d| d.last_revision()).collect::<Vec<_>>(),
            vec![70, 75]
        );
        assert_eq!(chain, Some(f0));
    }

    /// A periodic full: the old chain ends, the new one goes on; the deltas continue across, the
    /// followed one preferred where both cover a revision, and a gap stops the run.
    #[test]
    fn deltas_continue_across_chains_in_order_and_stop_at_a_gap() {
        let (f0, f1) = (full_at(10, T0), full_at(30, T0 + 5_000));
        let (base, newer) = chains_to_list(&[f0, f1], Some(f0), 20);
        assert_eq!((base, newer.clone()), (Some(f0), vec![f1]));
        let mut deltas = vec![
            chain_delta(f0, 21, 30, T0 + 4_000),
            chain_delta(f1, 31, 40, T0 + 6_000),
            chain_delta(f0, 31, 38, T0 + 6_500), // covers 31 too: the followed chain's comes first
            chain_delta(f1, 45, 50, T0 + 8_000), // after a gap (41..44 in no delta)
        ];
        let (next, chain) = continuing(20, base, &mut deltas);
        assert_eq!(
            next.iter()
                .map(|d| (d.chain().unwrap().base, d.last_revision()))
                .collect::<Vec<_>>(),
            vec![(10, 30), (10, 38), (30, 40)]
        );
        assert_eq!(chain, Some(f1), "the chain followed from then on");
        let (none, no_chain) = continuing(50, Some(f1), &mut deltas);
        assert!(none.is_empty() && no_chain.is_none());
    }
}

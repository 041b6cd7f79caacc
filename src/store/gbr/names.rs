//! GBR's object keys, read and written back exactly, and which full each of its deltas extends.
//!
//!     v2/<Kind>-<start>-<last>-<unix seconds>[.gz|.zlib|.Z][.final]
//!     v1/Backup-<unix seconds>/<the same name>      (the older layout, still read by GBR)
//!
//! `<Kind>` is `Full` (start always 0) or `Incr`; revisions are `%08d` (eight digits at least).
//! GCS's upload chunks (`<name>/0000000001`) and anything else that does not read back to the
//! very same key are not snapshots.

use crate::store::layout::{ChainId, Compression, Encryption, Kind, Layout, SnapshotName};

/// How GBR compressed an object: its `--compression-policy`, told by the name's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GbrCompression {
    None,
    /// `.gz`: Go's compress/gzip (GBR's default).
    Gzip,
    /// `.zlib`: compress/zlib.
    Zlib,
    /// `.Z`: compress/lzw, LSB first, 8-bit literals (a raw code stream, not compress(1)'s file).
    Lzw,
}

impl GbrCompression {
    fn suffix(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Gzip => ".gz",
            Self::Zlib => ".zlib",
            Self::Lzw => ".Z",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Zlib => "zlib",
            Self::Lzw => "lzw",
        }
    }
}

/// What a GBR key says beyond [`SnapshotName`]'s common fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GbrName {
    /// The older layout's `v1/Backup-<seconds>/` directory.
    pub v1_dir: Option<u64>,
    /// The name's start revision (0 for a full; for a delta, the revision after its predecessor).
    pub start: i64,
    pub compression: GbrCompression,
}

/// The key of a GBR snapshot (relative to the store's prefix).
pub fn key(n: &SnapshotName, g: &GbrName) -> String {
    let (kind, last, fin) = match n.kind {
        Kind::Full { revision, is_final } => ("Full", revision, if is_final { ".final" } else { "" }),
        Kind::Delta { last, .. } => ("Incr", last, ""),
    };
    let dir = match g.v1_dir {
        Some(secs) => format!("v1/Backup-{secs}"),
        None => "v2".to_owned(),
    };
    format!(
        "{dir}/{kind}-{:08}-{last:08}-{}{}{fin}",
        g.start,
        n.created_ms / 1000,
        g.compression.suffix()
    )
}

/// Reads a GBR key; `None` for anything GBR did not write as a snapshot. A delta's chain is not in
/// its name: it reads as extending revision `start - 1` of no known full until [`chains`].
pub fn parse(key: &str) -> Option<SnapshotName> {
    let (v1_dir, name) = if let Some(name) = key.strip_prefix("v2/") {
        (None, name)
    } else {
        let rest = key.strip_prefix("v1/Backup-")?;
        let (secs, name) = rest.split_once('/')?;
        (Some(digits(secs)?), name)
    };
    if name.contains('/') {
        return None; // a GCS or Swift upload chunk
    }
    let (stem, is_final) = match name.strip_suffix(".final") {
        Some(s) => (s, true),
        None => (name, false),
    };
    let (stem, compression) = [
        (".gz", GbrCompression::Gzip),
        (".zlib", GbrCompression::Zlib),
        (".Z", GbrCompression::Lzw),
    ]
    .into_iter()
    .find_map(|(suffix, c)| stem.strip_suffix(suffix).map(|s| (s, c)))
    .unwrap_or((stem, GbrCompression::None));
    let mut parts = stem.split('-');
    let (kind, start, last, secs) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (start, last, secs) = (digits(start)? as i64, digits(last)? as i64, digits(secs)?);
    if start > last {
        return None;
    }
    let kind = match (kind, is_final) {
        ("Full", _) => Kind::Full {
            revision: last,
            is_final,
        },
        ("Incr", false) if start >= 1 => Kind::Delta {
            base: start - 1,
            base_created_ms: None,
            first: start,
            last,
        },
        _ => return None,
    };
    let n = SnapshotName {
        kind,
        // The end of the named second: GBR's names carry whole seconds, and `--to-time` must not
        // take a delta cut up to a second after the time asked for.
        created_ms: secs.checked_mul(1000)?.checked_add(999)?,
        compression: Compression::None,
        encryption: Encryption::Plain,
        layout: Layout::Gbr(GbrName {
            v1_dir,
            start,
            compression,
        }),
    };
    // Only what reads back to the very key: no other padding, no stray suffix.
    (n.key() == key).then_some(n)
}

fn digits(s: &str) -> Option<u64> {
    (!s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// GBR's chains as GBR's own restore reads them: from a full, the delta that starts right after it,
/// then the one that starts right after that, and so on (GBR starts each delta at its predecessor's
/// last revision + 1). Time plays no part: etcd-druid's compaction job uploads its full minutes
/// after the sidecar cut the delta that follows it, and a new leader's clock may lag the old one's.
/// Only when two deltas start at the same revision (two histories, after a restore to an older
/// point) does it choose: the first written at or after what it follows, else the newest. A delta
/// that several fulls reach (a new full, or a compacted one, in the middle of a run of deltas)
/// goes to the newest of them, so each chain ends where the next full takes over, as the warden's
/// own do. Returns the chains by their full, and the deltas no full reaches (theirs removed by
/// GBR's garbage collection, which can keep deltas longer than their full), each in a chain of its
/// own that no full starts ([`orphan`]).
pub fn chains(fulls: &[SnapshotName], deltas: &[SnapshotName]) -> Vec<(ChainId, Vec<SnapshotName>)> {
    let mut by_first: std::collections::HashMap<i64, Vec<usize>> = std::collections::HashMap::new();
    for (i, d) in deltas.iter().enumerate() {
        if let Kind::Delta { first, .. } = d.kind {
            by_first.entry(first).or_default().push(i);
        }
    }
    let mut fulls: Vec<&SnapshotName> = fulls.iter().filter(|f| f.is_full()).collect();
    fulls.sort_by_key(|f| (f.last_revision(), f.created_ms));
    // Oldest full first, so a newer full that reaches a delta takes it over.
    let mut owner: Vec<Option<ChainId>> = vec![None; deltas.len()];
    for f in &fulls {
        let Some(chain) = f.chain() else { continue };
        let (mut next, mut after) = (f.last_revision() + 1, f.created_ms);
        while let Some(starting) = by_first.get(&next) {
            let pick = starting
                .iter()
                .copied()
                .filter(|&i| deltas[i].created_ms >= after)
                .min_by_key(|&i| deltas[i].created_ms)
                .or_else(|| starting.iter().copied().max_by_key(|&i| deltas[i].created_ms));
            let Some(i) = pick else { break };
            owner[i] = Some(chain);
            next = deltas[i].last_revision() + 1;
            after = deltas[i].created_ms;
        }
    }
    let mut out: Vec<(ChainId, Vec<SnapshotName>)> = fulls
        .iter()
        .filter_map(|f| f.chain())
        .map(|c| (c, Vec::new()))
        .collect();
    for (i, d) in deltas.iter().enumerate() {
        let Kind::Delta { first, .. } = d.kind else {
            continue;
        };
        match owner[i] {
            Some(chain) => {
                if let Some((_, v)) = out.iter_mut().find(|(c, _)| *c == chain) {
                    v.push(in_chain(d, chain));
                }
            }
            None => {
                let chain = ChainId {
                    base: first - 1,
                    base_created_ms: 0,
                };
                out.push((chain, vec![in_chain(d, chain)]));
            }
        }
    }
    out
}

fn in_chain(d: &SnapshotName, chain: ChainId) -> SnapshotName {
    let mut d = *d;
    if let Kind::Delta {
        ref mut base,
        ref mut base_created_ms,
        ..
    } = d.kind
    {
        *base = chain.base;
        *base_created_ms = Some(chain.base_created_ms);
    }
    d
}

/// A delta in a chain that no full starts (its full removed by GBR's garbage collection).
pub fn orphan(d: &SnapshotName) -> bool {
    !d.is_own() && d.chain().is_some_and(|c: ChainId| c.base_created_ms == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_exactly_and_nothing_else_reads() {
        for key in [
            "v2/Full-00000000-00009002-1565021494",
            "v2/Full-00000000-00009002-1565021494.gz",
            "v2/Full-00000000-00009002-1565021494.gz.final",
            "v2/Full-00000000-123456789-1565021494.Z",
            "v2/Incr-00009003-00009050-1565021514.zlib",
            "v1/Backup-1565021000/Full-00000000-00000010-1565021000.gz",
            "v1/Backup-1565021000/Incr-00000011-00000020-1565021010.gz",
        ] {
            let n = parse(key).unwrap_or_else(|| panic!("{key} did not parse"));
            assert_eq!(n.key(), key);
        }
        for key in [
            "v2/Full-00000000-00009002-1565021494.gz/0000000001",
            "v2/Full-0-9002-1565021494.gz",
            "v2/Incr-00009003-00009050-1565021514.gz.final",
            "v2/Incr-00000000-00000050-1565021514",
            "v2/Full-00000000-00009002-1565021494.zst",
            "v2/Full-00000000-00009002-1565021494.gz.tmp",
            "v2/Incr-00009050-00009003-1565021514.gz",
            "v2/full-00000000-00009002-1565021494.gz",
            "v1/full/full-00000000000000000010-20261201T120000000Z-zstd-plain.ews",
            "v1/other/Full-00000000-00000010-1565021000.gz",
            "v3/Full-00000000-00009002-1565021494.gz",
        ] {
            assert_eq!(parse(key), None, "{key}");
        }
    }

    fn of(chains: &[(ChainId, Vec<SnapshotName>)], full: &SnapshotName) -> Vec<(i64, i64)> {
        chains
            .iter()
            .find(|(c, _)| Some(*c) == full.chain())
            .map(|(_, v)| {
                v.iter()
                    .map(|d| match d.kind {
                        Kind::Delta { first, last, .. } => (first, last),
                        Kind::Full { revision, .. } => (revision, revision),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn chains_follow_revisions_not_clocks() {
        let k = |s: &str| parse(s).unwrap();
        // etcd-druid's compaction job: the full at 30 uploaded (t=2000) after the sidecar cut the
        // delta that follows it (t=1900): the compacted full's chain takes over from there.
        let fulls = [
            k("v2/Full-00000000-00000010-1000"),
            k("v2/Full-00000000-00000030-2000"),
        ];
        let deltas = [
            k("v2/Incr-00000011-00000020-1500"),
            k("v2/Incr-00000021-00000030-1800"),
            k("v2/Incr-00000031-00000035-1900"),
            k("v2/Incr-00000036-00000040-2100"),
            // Kept by GBR's garbage collection after its full went: in no chain.
            k("v2/Incr-00000003-00000009-900"),
        ];
        let chains = chains(&fulls, &deltas);
        assert_eq!(of(&chains, &fulls[0]), [(11, 20), (21, 30)]);
        assert_eq!(of(&chains, &fulls[1]), [(31, 35), (36, 40)]);
        let lone: Vec<_> = chains.iter().filter(|(c, _)| c.base_created_ms == 0).collect();
        assert_eq!(lone.len(), 1);
        assert_eq!(lone[0].0.base, 2);
        assert!(orphan(&lone[0].1[0]) && !orphan(&chains[0].1[0]));
        assert_eq!(
            chains.iter().map(|(_, v)| v.len()).sum::<usize>(),
            deltas.len(),
            "each delta in one chain"
        );
    }

    #[test]
    fn two_deltas_at_one_revision_follow_the_history_written_after_the_full() {
        let k = |s: &str| parse(s).unwrap();
        // History A went on from 30; a restore to 30 started history B with a new full at 30.
        let fulls = [
            k("v2/Full-00000000-00000030-1000"),
            k("v2/Full-00000000-00000030-5000"),
        ];
        let deltas = [
            k("v2/Incr-00000031-00000040-2000"),
            k("v2/Incr-00000041-00000050-3000"),
            k("v2/Incr-00000031-00000034-6000"),
        ];
        let chains = chains(&fulls, &deltas);
        assert_eq!(of(&chains, &fulls[0]), [(31, 40), (41, 50)]);
        assert_eq!(of(&chains, &fulls[1]), [(31, 34)]);
    }
}

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
/// its name: it reads as extending revision `start - 1` of no known full until [`assign_chains`].
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
        created_ms: secs.checked_mul(1000)?,
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

/// Puts each GBR delta in the chain of the full it extends, as GBR's own restore does: the newest
/// full (by revision, then time) below the delta's start, written no later than the delta. A delta
/// with no such full extends revision `start - 1` of a chain no full starts (`backups verify`
/// reports it; a restore never reaches it).
pub fn assign_chains(fulls: &[SnapshotName], deltas: &mut [SnapshotName]) {
    for d in deltas.iter_mut() {
        let Kind::Delta {
            first,
            ref mut base,
            ref mut base_created_ms,
            ..
        } = d.kind
        else {
            continue;
        };
        let owner = fulls
            .iter()
            .filter(|f| f.last_revision() < first && f.created_ms <= d.created_ms)
            .max_by_key(|f| (f.last_revision(), f.created_ms));
        match owner {
            Some(f) => {
                *base = f.last_revision();
                *base_created_ms = Some(f.created_ms);
            }
            None => {
                *base = first - 1;
                *base_created_ms = Some(0);
            }
        }
    }
}

/// A chain that no full starts (its full deleted by GBR's garbage collection).
pub fn orphan(d: &SnapshotName) -> bool {
    d.chain().is_some_and(|c: ChainId| c.base_created_ms == 0)
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

    #[test]
    fn deltas_extend_the_newest_full_below_them_written_before_them() {
        let k = |s: &str| parse(s).unwrap();
        let fulls = [
            k("v2/Full-00000000-00000010-1000"),
            k("v2/Full-00000000-00000030-2000"),
            // A full at the same revision, later: another history (a restore) that owns what follows it.
            k("v2/Full-00000000-00000030-3000"),
        ];
        let mut deltas = vec![
            k("v2/Incr-00000011-00000020-1500"),
            k("v2/Incr-00000021-00000030-1900"),
            k("v2/Incr-00000031-00000040-2500"),
            k("v2/Incr-00000031-00000035-3500"),
            k("v2/Incr-00000005-00000009-900"),
        ];
        assign_chains(&fulls, &mut deltas);
        let chains: Vec<Option<(i64, u64)>> = deltas
            .iter()
            .map(|d| d.chain().map(|c| (c.base, c.base_created_ms)))
            .collect();
        assert_eq!(
            chains,
            [
                Some((10, 1_000_000)),
                Some((10, 1_000_000)),
                Some((30, 2_000_000)),
                Some((30, 3_000_000)),
                Some((4, 0)),
            ]
        );
        assert!(orphan(&deltas[4]) && !orphan(&deltas[0]));
    }
}

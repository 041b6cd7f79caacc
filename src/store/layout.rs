//! Key layout of the backup store: pure functions from a snapshot's facts to its object key and back.
//!
//!     <prefix>/v1/full/full-<rev>-<created>-<compression>-<encryption>[-final].ews
//!     <prefix>/v1/delta/<base>-<base created>/delta-<first>-<last>-<created>-<compression>-<encryption>.ews
//!
//! Revisions are 20-digit zero-padded decimals and `created` is UTC `YYYYMMDDTHHMMSSmmmZ`, so names
//! sort sensibly in listings, but ordering always uses the parsed numbers. Deltas live under the
//! exact full snapshot they extend (its revision and creation time: a [`ChainId`]), so finding a
//! chain lists only that chain, the cost of a listing never grows with the bucket, and two histories
//! whose fulls share a revision (a restore, a fallback) never mix. Deltas written before the chain
//! directory named the full's time sit in `<base>/` and belong to the newest full at that revision
//! created before them ([`legacy_owner`]). docs/FORMAT.md is the reference.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

pub const VERSION_DIR: &str = "v1";
pub const EXTENSION: &str = "ews";

/// Payload compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Zstd,
    Gzip,
    None,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Gzip => "gzip",
            Self::None => "none",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "zstd" => Self::Zstd,
            "gzip" => Self::Gzip,
            "none" => Self::None,
            _ => return None,
        })
    }
}

/// Payload encryption (`age` arrives with part 5; `plain` today).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    Plain,
    Age,
}

impl Encryption {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Age => "age",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "plain" => Self::Plain,
            "age" => Self::Age,
            _ => return None,
        })
    }
}

/// What a snapshot object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// etcd's database as of at least `revision` (a proven lower bound; see docs/FORMAT.md).
    Full { revision: i64, is_final: bool },
    /// Every event of revisions `first..=last`, extending the chain of the full snapshot at `base`
    /// created at `base_created_ms` (`None`: the older layout that named the revision only).
    Delta {
        base: i64,
        base_created_ms: Option<u64>,
        first: i64,
        last: i64,
    },
}

/// A chain: the full snapshot it starts from, by revision and creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ChainId {
    pub base: i64,
    pub base_created_ms: u64,
}

impl fmt::Display for ChainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.base, format_time(self.base_created_ms))
    }
}

/// The chain an older-layout delta (directory `<base>/`) belongs to: the newest full snapshot at
/// revision `base` created at or before the delta. `None` when there is none (its full is gone).
pub fn legacy_owner(delta: &SnapshotName, fulls: &[SnapshotName]) -> Option<ChainId> {
    let Kind::Delta { base, .. } = delta.kind else {
        return None;
    };
    fulls
        .iter()
        .filter(|f| f.is_full() && f.last_revision() == base && f.created_ms <= delta.created_ms)
        .map(|f| f.created_ms)
        .max()
        .map(|base_created_ms| ChainId {
            base,
            base_created_ms,
        })
}

/// The chain still being written: the one holding the newest object (by creation time) among the
/// warden's own, when that chain reaches beyond every newer full snapshot. A full that a writer took
/// just before it lost leadership (its snapshot started before the new writer's later deltas, so it
/// is older than them, yet names a higher revision than their chain's base) must not pass for the
/// newest point: the chain the new writer kept extending holds more. `None` when the newest object
/// is a full, or its chain does not reach further than that full.
///
/// Clocks: each object's time is its writer's; a stale full is older than the new writer's deltas
/// by at least one election plus one delta period, far more than the skew of synced hosts.
pub fn live_chain(
    fulls: &[SnapshotName],
    chains: &std::collections::BTreeMap<ChainId, Vec<SnapshotName>>,
) -> Option<ChainId> {
    let own_fulls: Vec<&SnapshotName> = fulls.iter().filter(|f| f.is_own() && f.is_full()).collect();
    let (chain, newest_delta) = chains
        .iter()
        .filter(|(c, _)| own_fulls.iter().any(|f| f.chain() == Some(**c)))
        .filter_map(|(c, ds)| {
            ds.iter()
                .filter(|d| d.is_own() && !d.is_full())
                .max_by_key(|d| d.created_ms)
                .map(|d| (*c, d))
        })
        .max_by_key(|(_, d)| d.created_ms)?;
    let reach = chains[&chain]
        .iter()
        .map(SnapshotName::last_revision)
        .max()
        .unwrap_or(chain.base);
    // Every full created after the chain's base and before its newest delta, at a revision above
    // the base, is a full of the same history that the chain outgrew (or it would be newer).
    let newer: Vec<&&SnapshotName> = own_fulls
        .iter()
        .filter(|f| f.last_revision() > chain.base)
        .collect();
    let outgrown = newer
        .iter()
        .all(|f| f.created_ms < newest_delta.created_ms && f.last_revision() < reach);
    (!newer.is_empty() && outgrown).then_some(chain)
}

/// Who wrote an object, and so how its key reads and its bytes decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// This program's own format (docs/FORMAT.md).
    Warden,
    /// Gardener's etcd-backup-restore, read in place (`crate::store::gbr`); never written or deleted.
    Gbr(crate::store::gbr::GbrName),
    /// A rollback point: this program's format, under `v1/rollback/` (`crate::store::rollback`).
    Rollback,
}

/// A snapshot's identity, as encoded in its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SnapshotName {
    pub kind: Kind,
    /// Creation time, millisecond precision.
    pub created_ms: u64,
    /// The warden's own payload encoding; `None` and `Plain` for another layout, whose own
    /// encoding `layout` names.
    pub compression: Compression,
    pub encryption: Encryption,
    pub layout: Layout,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("not a snapshot key: {key:?} ({reason})")]
pub struct ParseError {
    pub key: String,
    pub reason: &'static str,
}

impl SnapshotName {
    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.created_ms)
    }

    /// The highest revision this object covers.
    pub fn last_revision(&self) -> i64 {
        match self.kind {
            Kind::Full { revision, .. } => revision,
            Kind::Delta { last, .. } => last,
        }
    }

    pub fn is_full(&self) -> bool {
        matches!(self.kind, Kind::Full { .. })
    }

    /// The chain a full snapshot starts, or a delta extends (`None` for an older-layout delta:
    /// see [`legacy_owner`]).
    pub fn chain(&self) -> Option<ChainId> {
        match self.kind {
            Kind::Full { revision, .. } => Some(ChainId {
                base: revision,
                base_created_ms: self.created_ms,
            }),
            Kind::Delta {
                base,
                base_created_ms,
                ..
            } => base_created_ms.map(|base_created_ms| ChainId {
                base,
                base_created_ms,
            }),
        }
    }

    /// Written by this program (retention and the backup loop touch nothing else).
    pub fn is_own(&self) -> bool {
        self.layout == Layout::Warden
    }

    /// A delta in a chain that no full starts: etcd-backup-restore's garbage collection removed
    /// its full (`crate::store::gbr::names`).
    pub fn is_orphan(&self) -> bool {
        crate::store::gbr::names::orphan(self)
    }

    /// How the payload is compressed, as `backups list` shows it.
    pub fn compression_label(&self) -> &'static str {
        match self.layout {
            Layout::Warden | Layout::Rollback => self.compression.as_str(),
            Layout::Gbr(g) => g.compression.as_str(),
        }
    }

    /// The key relative to the store's prefix.
    pub fn key(&self) -> String {
        if let Layout::Gbr(g) = &self.layout {
            return crate::store::gbr::names::key(self, g);
        }
        let created = format_time(self.created_ms);
        let (c, e) = (self.compression.as_str(), self.encryption.as_str());
        let full_dir = if self.layout == Layout::Rollback {
            "rollback"
        } else {
            "full"
        };
        match self.kind {
            Kind::Full { revision, is_final } => {
                let fin = if is_final { "-final" } else { "" };
                format!("{VERSION_DIR}/{full_dir}/full-{revision:020}-{created}-{c}-{e}{fin}.{EXTENSION}")
            }
            Kind::Delta {
                base,
                base_created_ms,
                first,
                last,
            } => {
                let dir = delta_dir(base, base_created_ms);
                format!("{dir}/delta-{first:020}-{last:020}-{created}-{c}-{e}.{EXTENSION}")
            }
        }
    }

    /// Parses a key relative to the store's prefix.
    /// Reads a key of this program's layout or of GBR's (`crate::store::gbr::names`).
    pub fn parse(key: &str) -> Result<Self, ParseError> {
        if key.starts_with("v2/") || key.starts_with("v1/Backup-") {
            return crate::store::gbr::names::parse(key).ok_or(ParseError {
                key: key.to_owned(),
                reason: "not a snapshot of etcd-backup-restore's layout",
            });
        }
        let err = |reason| ParseError {
            key: key.to_owned(),
            reason,
        };
        let rest = key
            .strip_prefix(VERSION_DIR)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or(err("outside v1/"))?;
        let stem = rest
            .strip_suffix(&format!(".{EXTENSION}"))
            .ok_or(err("extension is not .ews"))?;
        let num = |s: &str| -> Result<i64, ParseError> {
            if s.len() != 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("revision is not 20 digits"));
            }
            s.parse().map_err(|_| err("revision out of range"))
        };
        if let Some(file) = stem.strip_prefix("full/full-") {
            let parts: Vec<&str> = file.split('-').collect();
            let (is_final, parts) = match parts.as_slice() {
                [head @ .., "final"] if head.len() == 4 => (true, head.to_vec()),
                p if p.len() == 4 => (false, p.to_vec()),
                _ => return Err(err("full snapshot name has the wrong number of fields")),
            };
            Ok(Self {
                kind: Kind::Full {
                    revision: num(parts[0])?,
                    is_final,
                },
                created_ms: parse_time(parts[1]).ok_or(err("bad creation time"))?,
                compression: Compression::parse(parts[2]).ok_or(err("unknown compression"))?,
                encryption: Encryption::parse(parts[3]).ok_or(err("unknown encryption"))?,
                layout: Layout::Warden,
            })
        } else if let Some(rest) = stem.strip_prefix("delta/") {
            let (dir, file) = rest
                .split_once('/')
                .ok_or(err("delta outside its chain directory"))?;
            let (base, base_created_ms) = match dir.split_once('-') {
                Some((b, t)) => (b, Some(parse_time(t).ok_or(err("bad chain creation time"))?)),
                None => (dir, None),
            };
            let file = file
                .strip_prefix("delta-")
                .ok_or(err("delta name does not start with delta-"))?;
            let parts: Vec<&str> = file.split('-').collect();
            if parts.len() != 5 {
                return Err(err("delta name has the wrong number of fields"));
            }
            let (base, first, last) = (num(base)?, num(parts[0])?, num(parts[1])?);
            if first > last || first <= base {
                return Err(err("delta revision range is inconsistent"));
            }
            Ok(Self {
                kind: Kind::Delta {
                    base,
                    base_created_ms,
                    first,
                    last,
                },
                created_ms: parse_time(parts[2]).ok_or(err("bad creation time"))?,
                compression: Compression::parse(parts[3]).ok_or(err("unknown compression"))?,
                encryption: Encryption::parse(parts[4]).ok_or(err("unknown encryption"))?,
                layout: Layout::Warden,
            })
        } else {
            Err(err("neither full/ nor delta/"))
        }
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// The directory listing all full snapshots.
pub fn full_dir() -> String {
    format!("{VERSION_DIR}/full")
}

/// The directory holding the deltas of the chain based on the full snapshot at `base` created at
/// `base_created_ms` (`None`: the older directory named by the revision only).
pub fn delta_dir(base: i64, base_created_ms: Option<u64>) -> String {
    match base_created_ms {
        Some(t) => format!("{VERSION_DIR}/delta/{base:020}-{}", format_time(t)),
        None => format!("{VERSION_DIR}/delta/{base:020}"),
    }
}

/// A chain directory's name (`<base>` or `<base>-<created>`) parsed.
pub fn parse_chain_dir(name: &str) -> Option<(i64, Option<u64>)> {
    let (b, t) = match name.split_once('-') {
        Some((b, t)) => (b, Some(parse_time(t)?)),
        None => (name, None),
    };
    (b.len() == 20 && b.bytes().all(|c| c.is_ascii_digit()))
        .then(|| b.parse().ok())
        .flatten()
        .map(|b| (b, t))
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `YYYYMMDDTHHMMSSmmmZ` from Unix milliseconds.
pub fn format_time(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    let s = humantime::format_rfc3339_millis(t).to_string(); // 2026-11-29T16:30:00.123Z
    s.chars().filter(|c| !matches!(c, '-' | ':' | '.')).collect()
}

/// Unix milliseconds from `format_time`'s form; `None` for anything else.
pub fn parse_time(s: &str) -> Option<u64> {
    // 20261129T163000123Z → 2026-11-29T16:30:00.123Z
    // Total: any name from the store is checked byte by byte before it is sliced (a multi-byte
    // character would otherwise put a slice off a character boundary and abort the warden).
    let b = s.as_bytes();
    let shaped = b.len() == 19
        && b.iter().enumerate().all(|(i, c)| match i {
            8 => *c == b'T',
            18 => *c == b'Z',
            _ => c.is_ascii_digit(),
        });
    if !shaped {
        return None;
    }
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}.{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15],
        &s[15..18]
    );
    let t = humantime::parse_rfc3339(&rfc).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<SnapshotName> {
        let mut v = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..500u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let rev = (seed >> 20) as i64 % 10_000_000_000 + 1;
            let created_ms = 1_600_000_000_000 + (seed % 400_000_000_000);
            let compression = [Compression::Zstd, Compression::Gzip, Compression::None][(i % 3) as usize];
            let encryption = if i % 5 == 0 {
                Encryption::Age
            } else {
                Encryption::Plain
            };
            let kind = if i % 2 == 0 {
                Kind::Full {
                    revision: rev,
                    is_final: i % 4 == 0,
                }
            } else {
                Kind::Delta {
                    base: rev,
                    base_created_ms: (i % 3 != 1).then_some(created_ms - 5),
                    first: rev + 1,
                    last: rev + 1 + (seed % 1000) as i64,
                }
            };
            v.push(SnapshotName {
                kind,
                created_ms,
                compression,
                encryption,
                layout: Layout::Warden,
            });
        }
        v
    }

    #[test]
    fn any_character_anywhere_in_a_name_is_refused_not_a_panic() {
        // Each character of real names replaced by multi-byte ones, and cut at every character:
        // every result is a parse error or a name, never a panic.
        for n in names().into_iter().take(40) {
            let key = n.key();
            let chars: Vec<char> = key.chars().collect();
            for i in 0..chars.len() {
                for c in ['é', '€', '😀', '\u{0}'] {
                    let mut v = chars.clone();
                    v[i] = c;
                    let _ = SnapshotName::parse(&v.iter().collect::<String>());
                }
                let _ = SnapshotName::parse(&chars[..i].iter().collect::<String>());
            }
        }
        let hostile = "v1/full/full-00000000000000000099-202é204T215500000Z-zstd-plain.ews";
        assert!(SnapshotName::parse(hostile).is_err());
    }

    #[test]
    fn parse_format_round_trip() {
        for n in names() {
            assert_eq!(SnapshotName::parse(&n.key()), Ok(n), "{}", n.key());
        }
    }

    #[test]
    fn known_names() {
        let n = SnapshotName {
            kind: Kind::Full {
                revision: 42,
                is_final: true,
            },
            created_ms: 1_795_969_800_123,
            compression: Compression::Zstd,
            encryption: Encryption::Plain,
            layout: Layout::Warden,
        };
        assert_eq!(
            n.key(),
            "v1/full/full-00000000000000000042-20261129T163000123Z-zstd-plain-final.ews"
        );
        let d = SnapshotName {
            kind: Kind::Delta {
                base: 42,
                base_created_ms: Some(1_795_969_700_000),
                first: 43,
                last: 99,
            },
            ..n
        };
        assert_eq!(
            d.key(),
            "v1/delta/00000000000000000042-20261129T162820000Z/delta-00000000000000000043-00000000000000000099-20261129T163000123Z-zstd-plain.ews"
        );
        // The older layout, still read.
        let old = "v1/delta/00000000000000000042/delta-00000000000000000043-00000000000000000099-20261129T163000123Z-zstd-plain.ews";
        let parsed = SnapshotName::parse(old).expect("older delta key");
        assert!(matches!(
            parsed.kind,
            Kind::Delta {
                base: 42,
                base_created_ms: None,
                first: 43,
                last: 99
            }
        ));
        assert_eq!(parsed.key(), old);
        assert_eq!(parsed.chain(), None);
        let chain = d.chain().expect("chain");
        assert_eq!(chain.base, 42);
        assert_eq!(
            parse_chain_dir("00000000000000000042-20261129T162820000Z"),
            Some((42, Some(1_795_969_700_000)))
        );
        assert_eq!(parse_chain_dir("00000000000000000042"), Some((42, None)));
        assert_eq!(parse_chain_dir("42"), None);
    }

    /// Two fulls at one revision (a restore, a fallback): an older-layout delta belongs to the newest
    /// full created before it, never to one created after it.
    #[test]
    fn legacy_deltas_belong_to_the_full_before_them() {
        let full = |created_ms| SnapshotName {
            kind: Kind::Full {
                revision: 42,
                is_final: false,
            },
            created_ms,
            compression: Compression::Zstd,
            encryption: Encryption::Plain,
            layout: Layout::Warden,
        };
        let fulls = [full(1_000), full(5_000)];
        let delta = |created_ms| SnapshotName {
            kind: Kind::Delta {
                base: 42,
                base_created_ms: None,
                first: 43,
                last: 50,
            },
            ..full(created_ms)
        };
        let owner = |d| legacy_owner(&d, &fulls).map(|c| c.base_created_ms);
        assert_eq!(owner(delta(2_000)), Some(1_000));
        assert_eq!(owner(delta(6_000)), Some(5_000));
        assert_eq!(owner(delta(500)), None);
    }

    #[test]
    fn rejects_foreign_keys() {
        for k in [
            "v1/full/full-42-20261129T163000123Z-zstd-plain.ews",
            "v1/full/full-00000000000000000042-20261129T163000123Z-brotli-plain.ews",
            "v1/full/full-00000000000000000042-20261129T163000123Z-zstd-plain.tmp",
            "v2/full/full-00000000000000000042-20261129T163000123Z-zstd-plain.ews",
            "v1/delta/00000000000000000042/delta-00000000000000000040-00000000000000000099-20261129T163000123Z-zstd-plain.ews",
            "v1/delta/00000000000000000042-yesterday/delta-00000000000000000043-00000000000000000099-20261129T163000123Z-zstd-plain.ews",
            "v1/other/x.ews",
        ] {
            assert!(SnapshotName::parse(k).is_err(), "{k}");
        }
    }
}

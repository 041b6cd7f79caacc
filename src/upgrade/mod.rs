//! Upgrades: which etcd release a data dir was written by, and whether the binary about to start on
//! it takes a path etcd supports. etcd moves one minor at a time, and only from certain patch
//! releases (3.5 must be at 3.5.26 or later before 3.6, or removed members can come back,
//! etcd-io/etcd#20967; 3.6 at 3.6.11 or later before 3.7); an older binary on a newer data dir
//! needs etcd's own downgrade completed first. The warden refuses any other path before etcd
//! touches the data (exit 64), unless `--allow-unsupported-upgrade` says the operator knows better.
//!
//! The data dir's version is read as etcd reads it (`schema.UnsafeDetectSchemaVersion`): the `meta`
//! bucket's `storageVersion` (3.6 and later; etcd's downgrade lowers it), else 3.5 when `meta`
//! holds the consistent index's `term` (written since 3.5), else 3.4. The patch release that last
//! ran on the data is known only from the warden's own record beside the data dir
//! (`<data-dir>.warden-etcd-release`), written when etcd under the warden reports its release.

pub mod cluster;
pub mod rollback;

use std::path::Path;

use crate::etcd::version::{Version, last_release};
use crate::format::bolt::{BoltFile, BucketValue};

/// The storage version of the data dir's db, `None` when there is no readable db.
pub fn data_version(data_dir: &Path) -> Option<Version> {
    stored_version(data_dir).map(|(v, _)| v)
}

/// The storage version, and whether the db says it (`storageVersion`) rather than etcd's fallback.
fn stored_version(data_dir: &Path) -> Option<(Version, bool)> {
    let db = BoltFile::open(&data_dir.join("member").join("snap").join("db")).ok()?;
    let root = db.root_items().ok()?;
    let (_, _, meta) = root.iter().find(|(_, k, _)| k.as_slice() == b"meta")?;
    let items = db.bucket_items(&BucketValue::parse(meta).ok()?).ok()?;
    let value = |key: &[u8]| {
        items
            .iter()
            .find(|(_, k, _)| k.as_slice() == key)
            .map(|(_, _, v)| v.clone())
    };
    if let Some(v) = value(b"storageVersion") {
        return Version::parse(&String::from_utf8_lossy(&v)).map(|v| (v, true));
    }
    let term = value(b"term").filter(|t| t.len() == 8 && t.iter().any(|b| *b != 0));
    let fallback = if term.is_some() {
        Version::new(3, 5, 0)
    } else {
        Version::new(3, 4, 0)
    };
    Some((fallback, false))
}

/// The oldest patch release of minor `from` that etcd supports upgrading to the next minor from.
fn minimum_before_next(from_minor: u32) -> Option<(Version, &'static str)> {
    match from_minor {
        5 => Some((
            Version::new(3, 5, 26),
            " (etcd-io/etcd#20967: removed members can come back)",
        )),
        6 => Some((Version::new(3, 6, 11), "")),
        _ => None,
    }
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradePath {
    /// The same minor, or a supported step.
    Supported,
    /// A supported step as far as the data shows, but which patch release ran last is unknown.
    Unverified(String),
    /// A path etcd does not support, with what to do instead.
    Unsupported(String),
}

/// Whether starting `binary` on data written with storage version `data` (last started by
/// `last`, when recorded) is a path etcd supports.
pub fn check(binary: Version, data: Version, last: Option<Version>) -> UpgradePath {
    if binary.major != 3 || data.major != 3 {
        return UpgradePath::Supported;
    }
    let (b, d) = (binary.minor, data.minor);
    if b < d {
        return UpgradePath::Unsupported(format!(
            "the data dir holds etcd 3.{d} storage and etcd {binary} is older: an older release needs etcd's own downgrade completed first \
             (etcdctl downgrade validate 3.{b}, then downgrade enable 3.{b}, with 3.{d} running), or a restore of a backup that 3.{b} wrote"
        ));
    }
    if b > d + 1 {
        return UpgradePath::Unsupported(format!(
            "etcd {binary} on a data dir with etcd 3.{d} storage skips a minor release: etcd upgrades one minor at a time; run 3.{} on it first",
            d + 1
        ));
    }
    if b == d + 1
        && let Some((minimum, why)) = minimum_before_next(d)
    {
        return match last {
            Some(l) if l.minor == d && l < minimum => UpgradePath::Unsupported(format!(
                "etcd {l} last ran on this data dir, and etcd supports {binary} only after {minimum} or later{why}: run {minimum} or a newer 3.{d} on it first"
            )),
            Some(l) if l.minor == d => UpgradePath::Supported,
            _ => UpgradePath::Unverified(format!(
                "etcd {binary} starts on a data dir with etcd 3.{d} storage, and which 3.{d} release ran on it last is unknown; etcd supports this only from {minimum} or later{why}"
            )),
        };
    }
    UpgradePath::Supported
}

/// A path's consequence: `Err` refuses the start; a note for the log and /status otherwise.
fn verdict(
    path: UpgradePath,
    allow: bool,
    binary: Version,
    data_dir: &Path,
) -> Result<Option<String>, String> {
    match path {
        UpgradePath::Supported => Ok(None),
        UpgradePath::Unverified(m) => {
            tracing::warn!(etcd = %binary, "{m}");
            Ok(Some(m))
        }
        UpgradePath::Unsupported(m) if allow => {
            tracing::warn!(etcd = %binary, "--allow-unsupported-upgrade: starting anyway: {m}");
            Ok(Some(format!("allowed by --allow-unsupported-upgrade: {m}")))
        }
        UpgradePath::Unsupported(m) => Err(format!(
            "{m}. etcd was not started and the data dir {} is untouched (--allow-unsupported-upgrade starts it anyway)",
            data_dir.display()
        )),
    }
}

/// What the check before the start decided.
#[derive(Debug, Default)]
pub struct Gate {
    /// For the log and /status (`.etcd.upgrade`).
    pub note: Option<String>,
    /// A newer minor release is about to start on this data for the first time: the release that
    /// wrote the data (or its minor, `3.5`, when no release was recorded), for the rollback point.
    pub upgrade_from: Option<String>,
}

/// Before etcd starts on `data_dir`: `Err` refuses the start (exit 64) with what to do. `peers`:
/// what the other members of a cluster run ([`cluster::peer_releases`]), checked first. No data
/// dir, or a binary that did not say its version: nothing to check on the data.
pub fn gate(
    data_dir: &Path,
    wal_dir: &Path,
    binary: Option<Version>,
    peers: &[cluster::PeerRelease],
    allow: bool,
) -> Result<Gate, String> {
    let Some(binary) = binary else {
        return Ok(Gate::default());
    };
    let cluster_note = verdict(cluster::check(binary, peers), allow, binary, data_dir)?;
    let Some((stored, said)) = stored_version(data_dir) else {
        return Ok(Gate {
            note: cluster_note,
            upgrade_from: None,
        });
    };
    let last = last_release(data_dir);
    // etcd 3.6 writes `storageVersion` only once the cluster version reached 3.6, and a member's db
    // can lack it after 3.6 served it (seen on one member of three in a rolling upgrade). Without
    // the key, a release the warden saw serve this data, one minor above etcd's fallback, is what
    // the data went through. A key that is there is etcd's word (its downgrade lowers it).
    let data = match last {
        Some(l) if !said && l.major == stored.major && l.minor == stored.minor + 1 => {
            Version::new(l.major, l.minor, 0)
        }
        _ => stored,
    };
    let mut path = check(binary, data, last);
    if matches!(path, UpgradePath::Supported | UpgradePath::Unverified(_))
        && binary.major == 3
        && binary.minor >= 7
        && let Some(replay) = crate::format::wal::replay(wal_dir)
        && replay.v2_requests > 0
    {
        path = UpgradePath::Unsupported(format!(
            "the WAL in {} holds {} requests in etcd 3.5's v2 format after its last raft snapshot (index {}), written while the cluster ran 3.5; \
             etcd {binary} cannot apply them and panics at start (\"unmarshal should never fail\"). Let etcd 3.6 take a raft snapshot past them first: \
             run 3.6 on this member until it has applied --snapshot-count more entries (default 10000), or restart it on 3.6 with a small \
             --snapshot-count (such as 100) until a new file appears in member/snap",
            wal_dir.display(),
            replay.v2_requests,
            replay.snapshot_index
        ));
    }
    let note = verdict(path, allow, binary, data_dir)?.or(cluster_note);
    let upgrade_from = (binary.major == data.major && binary.minor > data.minor).then(|| match last {
        Some(l) if l.major == data.major && l.minor == data.minor => l.to_string(),
        _ => format!("{}.{}", data.major, data.minor),
    });
    if last.is_some_and(|l| l != binary) {
        tracing::info!(from = %last.unwrap_or(binary), to = %binary, storage = %data, "etcd release changed on this data dir");
    }
    Ok(Gate { note, upgrade_from })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn the_paths_etcd_supports_and_the_ones_it_does_not() {
        use UpgradePath::*;
        assert_eq!(check(v("3.6.16"), v("3.6.0"), None), Supported);
        assert_eq!(check(v("3.6.16"), v("3.5.0"), Some(v("3.5.30"))), Supported);
        assert_eq!(check(v("3.7.3"), v("3.6.0"), Some(v("3.6.16"))), Supported);
        assert_eq!(check(v("3.5.16"), v("3.4.0"), None), Supported);
        assert!(matches!(check(v("3.6.16"), v("3.5.0"), None), Unverified(_)));
        assert!(
            matches!(check(v("3.6.16"), v("3.5.0"), Some(v("3.5.16"))), Unsupported(m) if m.contains("3.5.26"))
        );
        assert!(
            matches!(check(v("3.7.3"), v("3.6.0"), Some(v("3.6.10"))), Unsupported(m) if m.contains("3.6.11"))
        );
        assert!(
            matches!(check(v("3.6.16"), v("3.4.0"), None), Unsupported(m) if m.contains("run 3.5 on it first"))
        );
        assert!(
            matches!(check(v("3.7.3"), v("3.5.0"), Some(v("3.5.30"))), Unsupported(m) if m.contains("skips a minor"))
        );
        assert!(matches!(check(v("3.5.30"), v("3.6.0"), None), Unsupported(m) if m.contains("downgrade")));
        assert!(matches!(check(v("3.6.16"), v("3.7.0"), None), Unsupported(_)));
    }
}

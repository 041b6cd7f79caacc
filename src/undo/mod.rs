//! Undo: what returning to a past point would change, and putting back just the keys that were
//! damaged, as new revisions, while the cluster runs (`etcd-warden diff`, `etcd-warden undo`).
//!
//! The past state of the keys under a prefix comes from the store, never from a restored cluster
//! ([`past`]: the full snapshot's key bucket read a page at a time, then the deltas up to the
//! point); the present from the live cluster ([`live`]) or the newest backup. Memory grows with
//! the keys under the prefix (a digest per key; values only for `undo`), not with the database.
//! [`apply`] writes the past back in transactions guarded by each key's current `mod_revision`,
//! so a concurrent writer is never overwritten silently. Revisions only move forward, so watchers
//! (kube-apiserver, informers) see ordinary events and no compaction error.

pub mod apply;
pub mod live;
pub mod past;

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One key's state at a point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: i64,
    pub size: usize,
    /// The first 16 bytes of the value's sha256: equal content is no change.
    pub digest: [u8; 16],
    /// The value itself, kept only when it may be written back (`undo`).
    pub value: Option<Vec<u8>>,
    /// Kubernetes' kind/namespace/name, for keys under /registry/.
    pub object: Option<crate::kube::object::Object>,
}

impl Entry {
    pub fn new(
        key: &[u8],
        value: &[u8],
        create_revision: i64,
        mod_revision: i64,
        lease: i64,
        keep_value: bool,
    ) -> Self {
        let full = Sha256::digest(value);
        Self {
            create_revision,
            mod_revision,
            lease,
            size: value.len(),
            digest: full[..16].try_into().expect("16 bytes"),
            value: keep_value.then(|| value.to_vec()),
            object: crate::kube::object::describe(key, value),
        }
    }
}

/// The keys under a prefix at one point: key → entry.
pub type State = BTreeMap<Vec<u8>, Entry>;

/// Which keys a read keeps: those under `prefix` (every key when it is empty).
#[derive(Debug, Clone)]
pub struct Filter {
    pub prefix: Vec<u8>,
    pub keep_values: bool,
}

impl Filter {
    pub fn wants(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix)
    }
}

/// What returning a key to the past point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Changed since: put back to its value then.
    Restore,
    /// Created since: deleted.
    Delete,
    /// Deleted since: created again with its value then.
    #[serde(rename = "re-create")]
    Recreate,
}

impl Action {
    pub fn word(self) -> &'static str {
        match self {
            Action::Restore => "restore",
            Action::Delete => "delete",
            Action::Recreate => "re-create",
        }
    }
}

/// One key that differs between the past point and now.
#[derive(Debug, Clone)]
pub struct Change {
    pub action: Action,
    pub key: Vec<u8>,
    pub past: Option<Entry>,
    pub now: Option<Entry>,
}

impl Change {
    pub fn object(&self) -> Option<&crate::kube::object::Object> {
        self.past
            .as_ref()
            .and_then(|e| e.object.as_ref())
            .or_else(|| self.now.as_ref().and_then(|e| e.object.as_ref()))
    }
}

/// The keys whose content (value or lease) or existence differs, in key order.
pub fn diff(past: &State, now: &State) -> Vec<Change> {
    let mut out = Vec::new();
    let mut p = past.iter().peekable();
    let mut n = now.iter().peekable();
    loop {
        let action = match (p.peek(), n.peek()) {
            (None, None) => break,
            (Some((pk, _)), Some((nk, _))) if pk < nk => Action::Recreate,
            (Some(_), None) => Action::Recreate,
            (Some((pk, _)), Some((nk, _))) if pk > nk => Action::Delete,
            (None, Some(_)) => Action::Delete,
            (Some(_), Some(_)) => Action::Restore,
        };
        match action {
            Action::Recreate => {
                let (k, e) = p.next().expect("peeked");
                out.push(Change {
                    action,
                    key: k.clone(),
                    past: Some(e.clone()),
                    now: None,
                });
            }
            Action::Delete => {
                let (k, e) = n.next().expect("peeked");
                out.push(Change {
                    action,
                    key: k.clone(),
                    past: None,
                    now: Some(e.clone()),
                });
            }
            Action::Restore => {
                let (k, pe) = p.next().expect("peeked");
                let (_, ne) = n.next().expect("peeked");
                if pe.digest != ne.digest || pe.lease != ne.lease {
                    out.push(Change {
                        action,
                        key: k.clone(),
                        past: Some(pe.clone()),
                        now: Some(ne.clone()),
                    });
                }
            }
        }
    }
    out
}

/// The group a key is counted in: the prefix asked for plus the next path segment (e.g.
/// `/registry/secrets/` under `/registry/`), or the key's own directory when no prefix was given.
pub fn group(prefix: &[u8], key: &[u8]) -> String {
    let rest = &key[prefix.len().min(key.len())..];
    let cut = match rest.iter().position(|b| *b == b'/') {
        // A leading slash right after the prefix belongs to the segment.
        Some(0) => rest[1..].iter().position(|b| *b == b'/').map(|i| i + 2),
        Some(i) => Some(i + 1),
        None => None,
    };
    let end = prefix.len() + cut.unwrap_or(0);
    String::from_utf8_lossy(&key[..end.min(key.len())]).into_owned()
}

/// Counts of changes per group and action.
pub fn counts(prefix: &[u8], changes: &[Change]) -> BTreeMap<String, BTreeMap<Action, usize>> {
    let mut out: BTreeMap<String, BTreeMap<Action, usize>> = BTreeMap::new();
    for c in changes {
        *out.entry(group(prefix, &c.key))
            .or_default()
            .entry(c.action)
            .or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(v: &str, rev: i64) -> Entry {
        Entry::new(b"k", v.as_bytes(), rev, rev, 0, false)
    }

    #[test]
    fn the_diff_names_what_was_created_changed_and_deleted_since_and_nothing_else() {
        let past: State = [
            (b"/a".to_vec(), e("1", 2)),
            (b"/b".to_vec(), e("1", 3)),
            (b"/c".to_vec(), e("1", 4)),
            (b"/same".to_vec(), e("x", 5)),
        ]
        .into();
        let now: State = [
            (b"/b".to_vec(), e("2", 9)),
            (b"/c".to_vec(), e("1", 4)),
            (b"/d".to_vec(), e("1", 10)),
            // Written again with the same value: nothing to undo.
            (b"/same".to_vec(), e("x", 11)),
        ]
        .into();
        let d = diff(&past, &now);
        let got: Vec<_> = d
            .iter()
            .map(|c| (c.action, String::from_utf8_lossy(&c.key).into_owned()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Action::Recreate, "/a".into()),
                (Action::Restore, "/b".into()),
                (Action::Delete, "/d".into()),
            ]
        );
    }

    #[test]
    fn changes_are_counted_by_the_segment_after_the_prefix() {
        assert_eq!(
            group(b"/registry/", b"/registry/secrets/ns/a"),
            "/registry/secrets/"
        );
        assert_eq!(
            group(b"/registry", b"/registry/secrets/ns/a"),
            "/registry/secrets/"
        );
        assert_eq!(
            group(b"/registry/secrets/ns/", b"/registry/secrets/ns/a"),
            "/registry/secrets/ns/"
        );
        assert_eq!(group(b"", b"/registry/x"), "/registry/");
    }
}

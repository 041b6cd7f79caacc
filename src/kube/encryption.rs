//! Secrets encrypted at rest: kube-apiserver writes them as `k8s:enc:<provider>:v1:<key name>:` and
//! the ciphertext (`k8s:enc:kms:v2:<name>:` for KMS v2), so a backup restores only with those keys.
//! This reads which key names the values in a full snapshot need (the newest version of every key,
//! what a restore serves) and which an `EncryptionConfiguration` holds, so `backups verify
//! --kube-encryption-config FILE` can say, per full, whether that file still decrypts it, and `run
//! --kube-encryption-config FILE` can check each full it takes ([`check_full`]). The values are
//! read from the full's own bytes (`kube::needs`); etcd is read ([`needed_at`]) only when those
//! could not say.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use etcd_client::{Client, GetOptions};
use serde::Serialize;

/// The key names an `EncryptionConfiguration` holds, as `provider:name` (`aescbc:key1`,
/// `kms:v2:vault`).
pub fn config_keys(path: &Path) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: not YAML: {e}", path.display()))?;
    if doc.get("kind").and_then(|k| k.as_str()) != Some("EncryptionConfiguration") {
        return Err(format!(
            "{}: not an EncryptionConfiguration (kind: EncryptionConfiguration, apiVersion: apiserver.config.k8s.io/v1)",
            path.display()
        ));
    }
    let mut out = BTreeSet::new();
    let resources = doc
        .get("resources")
        .and_then(|r| r.as_sequence())
        .cloned()
        .unwrap_or_default();
    for r in &resources {
        let providers = r
            .get("providers")
            .and_then(|p| p.as_sequence())
            .cloned()
            .unwrap_or_default();
        for p in &providers {
            let Some(map) = p.as_mapping() else { continue };
            for (kind, body) in map {
                let Some(kind) = kind.as_str() else { continue };
                match kind {
                    "aescbc" | "aesgcm" | "secretbox" => {
                        for k in body
                            .get("keys")
                            .and_then(|k| k.as_sequence())
                            .into_iter()
                            .flatten()
                        {
                            if let Some(name) = k.get("name").and_then(|n| n.as_str()) {
                                out.insert(format!("{kind}:{name}"));
                            }
                        }
                    }
                    "kms" => {
                        if let Some(name) = body.get("name").and_then(|n| n.as_str()) {
                            let version = body.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("v1");
                            out.insert(format!("kms:{version}:{name}"));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

/// The key a value needs: `aescbc:key1` for `k8s:enc:aescbc:v1:key1:…`, `kms:v2:name` for KMS v2.
pub fn needed_by(value: &[u8]) -> Option<String> {
    let rest = value.strip_prefix(b"k8s:enc:")?;
    let mut parts = rest.splitn(4, |b| *b == b':');
    let provider = std::str::from_utf8(parts.next()?).ok()?;
    let version = std::str::from_utf8(parts.next()?).ok()?;
    let name = std::str::from_utf8(parts.next()?).ok()?;
    parts.next()?;
    Some(if provider == "kms" {
        format!("kms:{version}:{name}")
    } else {
        format!("{provider}:{name}")
    })
}

/// Reads the protobuf fields 1 (key) and 5 (value) of an `mvccpb.KeyValue`.
pub(crate) fn key_and_value(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mut key, mut value) = (&[][..], &[][..]);
    // Field by field, holding none: a value of many tiny fields costs its bytes, no more.
    crate::format::proto::each_field(b, |(n, wire, _, bytes)| match (n, wire) {
        (1, 2) => key = bytes,
        (5, 2) => value = bytes,
        _ => {}
    })?;
    Some((key, value))
}

/// What `run --kube-encryption-config` found for the newest full snapshot (in /status as
/// `backup.kube_keys`). Missing keys are a backup-health problem, never a readiness one.
#[derive(Debug, Clone, Serialize)]
pub struct KeyCheck {
    /// The full snapshot checked.
    pub full: String,
    /// The revision read: the highest in the full's own bytes; when those could not be read, the
    /// full's revision as etcd served it, or etcd's current one when etcd had compacted the full's
    /// revision before the check read it (said in `note`).
    pub checked_revision: i64,
    /// Key name (`aescbc:key1`) → values that need it.
    pub needed: BTreeMap<String, u64>,
    /// Needed key names the configuration does not hold: a restore of this full cannot be
    /// decrypted with it.
    pub missing: Vec<String>,
    pub config: PathBuf,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub at: Option<SystemTime>,
    pub note: Option<String>,
    /// The check itself failed (the configuration unreadable, etcd unreachable).
    pub error: Option<String>,
}

impl KeyCheck {
    /// Whether the check names a problem with the backup.
    pub fn problem(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(format!(
                "kube encryption keys of {}: cannot check: {e}",
                self.full
            ));
        }
        (!self.missing.is_empty()).then(|| {
            format!(
                "kube encryption keys: full {} needs {}, not in {}: a restore of it cannot be decrypted with that file (add the key back, or take a full after kube-apiserver re-encrypted every Secret with a key the file holds)",
                self.full,
                self.missing.join(", "),
                self.config.display()
            )
        })
    }
}

/// Values per page of the range below: bounds the memory of a check to about this many values.
const PAGE: i64 = 500;

/// A part of the keyspace: keys from `lo` up to `hi` (excluded; `None`: to the end).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
}

/// What is left of `span` to read after a page whose first and last keys were `first` and `last`,
/// with `left` keys of the span after it: the spans to read next, the first first.
///
/// etcd counts every key of the range it is asked for, whatever the limit (its index visits the
/// whole range), so paging through the rest of the keyspace costs the rest at every page: at 8 GiB
/// (about two million keys) that was minutes of etcd's CPU. A large rest is therefore split at a
/// key boundary just above the page: the keys sharing the page's last key up to a byte (taken
/// some bytes above where the page's keys differ, more the more pages are left, so that the part
/// holds many pages), and the rest after them, itself halved by the values of that byte; each is
/// read, and split, on its own. Every key of the span is in exactly one of them.
fn next_spans(span: &Span, first: &[u8], last: &[u8], left: i64) -> Vec<Span> {
    let mut lo = last.to_vec();
    lo.push(0);
    if left > SPLIT_ABOVE {
        let shared = first.iter().zip(last).take_while(|(a, b)| a == b).count();
        // One byte above where the page's keys differ holds some pages; each byte more, up to
        // 16 times as many (more for bytes that take more values): as many bytes more as the
        // rest holds pages in powers of 16.
        let (mut up, mut pages) = (1, left / PAGE);
        while pages > 1 {
            pages /= 16;
            up += 1;
        }
        let below_hi = |b: &[u8]| span.hi.as_deref().is_none_or(|hi| b < hi);
        for at in shared.saturating_sub(up)..last.len() {
            if last[at] == 0xFF {
                continue;
            }
            let mut bound = last[..=at].to_vec();
            bound[at] += 1;
            // `bound` sorts after `last` and so after `lo`: the part below it is never empty of
            // range, only possibly of keys.
            if below_hi(&bound) {
                let mut spans = vec![Span {
                    lo,
                    hi: Some(bound.clone()),
                }];
                // The rest after the part: split once more in the middle of the byte values it
                // spans at that byte, so that a wide fan-out (random names) is halved, not walked.
                let top = match &span.hi {
                    Some(hi) if hi.len() > at && hi[..at] == last[..at] => hi[at],
                    _ => 0xFF,
                };
                let mut mid = bound.clone();
                mid[at] = bound[at] + top.saturating_sub(bound[at]).div_ceil(2);
                if mid > bound && below_hi(&mid) {
                    spans.push(Span {
                        lo: bound,
                        hi: Some(mid.clone()),
                    });
                    spans.push(Span {
                        lo: mid,
                        hi: span.hi.clone(),
                    });
                } else {
                    spans.push(Span {
                        lo: bound,
                        hi: span.hi.clone(),
                    });
                }
                return spans;
            }
        }
    }
    vec![Span {
        lo,
        hi: span.hi.clone(),
    }]
}

/// A rest of more keys than this is split (`next_spans`); below, it is paged through.
const SPLIT_ABOVE: i64 = 4 * PAGE;

/// The spans of the keyspace still to read, the next last: every key once, in key order.
struct Scan {
    todo: Vec<Span>,
}

impl Scan {
    fn new() -> Self {
        Self {
            todo: vec![Span {
                lo: vec![0],
                hi: None,
            }],
        }
    }

    fn next(&mut self) -> Option<Span> {
        self.todo.pop()
    }

    /// `span` was read: a page from `first` to `last` (none: no key), `count` keys in the span,
    /// `more` than the page.
    fn read(&mut self, span: &Span, page: Option<(&[u8], &[u8], usize)>, count: i64, more: bool) {
        if let Some((first, last, n)) = page.filter(|_| more) {
            let left = count - n as i64;
            self.todo
                .extend(next_spans(span, first, last, left).into_iter().rev());
        }
    }
}

/// The key names the newest values need at `revision`, read from etcd page by page (the state a
/// full snapshot taken at that revision holds). Returns the revision read: `revision`, or the
/// current one when etcd had compacted it.
pub async fn needed_at(
    client: &mut Client,
    revision: i64,
) -> Result<(i64, BTreeMap<String, u64>), etcd_client::Error> {
    let mut at = revision;
    let mut out = BTreeMap::new();
    let mut scan = Scan::new();
    while let Some(span) = scan.next() {
        let opts = GetOptions::new()
            .with_range(span.hi.clone().unwrap_or_else(|| vec![0u8]))
            .with_limit(PAGE)
            .with_revision(at)
            .with_serializable();
        let resp = match client.get(span.lo.clone(), Some(opts)).await {
            Err(etcd_client::Error::GRpcStatus(s))
                if s.message().contains("compacted") && at == revision && span.lo == [0u8] =>
            {
                // The full's revision is gone: read the current state once, consistently.
                at = 0;
                scan = Scan::new();
                continue;
            }
            r => r?,
        };
        if at == 0 {
            at = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in resp.kvs() {
            if let Some(need) = needed_by(kv.value()) {
                *out.entry(need).or_default() += 1;
            }
        }
        let kvs = resp.kvs();
        let page = kvs
            .first()
            .zip(kvs.last())
            .map(|(f, l)| (f.key(), l.key(), kvs.len()));
        scan.read(&span, page, resp.count(), resp.more());
    }
    Ok((at, out))
}

/// Checks the full snapshot `full` (taken at `revision`) against the configuration at `config`,
/// read afresh (keys rotate: the file the operator keeps current is the one that matters).
/// `from_full`: what the full's own bytes said as they streamed (`kube::needs`); when they could
/// not say, etcd is read instead, page by page.
pub async fn check_full(
    client: &mut Client,
    config: &Path,
    full: &str,
    revision: i64,
    from_full: Result<super::needs::Needs, String>,
) -> KeyCheck {
    let mut check = KeyCheck {
        full: full.to_owned(),
        checked_revision: revision,
        needed: BTreeMap::new(),
        missing: Vec::new(),
        config: config.to_owned(),
        at: Some(SystemTime::now()),
        note: None,
        error: None,
    };
    let held = match config_keys(config) {
        Ok(h) => h,
        Err(e) => {
            check.error = Some(e);
            return check;
        }
    };
    let why = match from_full {
        Ok(needs) => {
            check.checked_revision = needs.revision;
            check.missing = needs
                .needed
                .keys()
                .filter(|k| !held.contains(*k))
                .cloned()
                .collect();
            check.needed = needs.needed;
            return check;
        }
        Err(why) => why,
    };
    match needed_at(client, revision).await {
        Ok((at, needed)) => {
            check.note = Some(if at != revision {
                format!(
                    "the full could not be read as it streamed ({why}); etcd had compacted revision {revision}: read revision {at} instead"
                )
            } else {
                format!("the full could not be read as it streamed ({why}): read from etcd")
            });
            check.checked_revision = at;
            check.missing = needed.keys().filter(|k| !held.contains(*k)).cloned().collect();
            check.needed = needed;
        }
        Err(e) => check.error = Some(format!("reading etcd: {e}")),
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `keys` as etcd would through `Scan`: the keys visited in order, and what etcd's index
    /// visited (every key of each range asked for, as it counts them).
    fn scan_model(keys: &std::collections::BTreeSet<Vec<u8>>) -> (Vec<Vec<u8>>, u64) {
        let (mut seen, mut visits) = (Vec::new(), 0u64);
        let mut scan = Scan::new();
        while let Some(span) = scan.next() {
            let range: Vec<&Vec<u8>> = keys
                .range(span.lo.clone()..)
                .take_while(|k| span.hi.as_ref().is_none_or(|hi| *k < hi))
                .collect();
            visits += range.len() as u64;
            let page: Vec<&Vec<u8>> = range.iter().take(PAGE as usize).copied().collect();
            seen.extend(page.iter().map(|k| k.to_vec()));
            let first_last = page
                .first()
                .zip(page.last())
                .map(|(f, l)| (f.as_slice(), l.as_slice(), page.len()));
            scan.read(&span, first_last, range.len() as i64, range.len() > page.len());
        }
        (seen, visits)
    }

    #[test]
    fn the_scan_reads_every_key_once_in_order_and_asks_etcd_for_narrow_ranges() {
        let mut numbered: std::collections::BTreeSet<Vec<u8>> = (0..200_000)
            .map(|i| format!("/registry/configmaps/bench/cm-{i:010}").into_bytes())
            .collect();
        numbered.extend((0..5_000).map(|i| format!("/registry/secrets/ns{}/s{i}", i % 7).into_bytes()));
        // Edge bytes: a key of 0xFF bytes, keys ending in 0xFF and 0x00, one-byte keys.
        for k in [
            &b"\x00"[..],
            b"\x01",
            b"/",
            b"/\xff",
            b"/\xff\xff\x00",
            b"\xff",
            b"\xff\xff",
            b"\xfe\xff",
        ] {
            numbered.insert(k.to_vec());
        }
        let mut rng = fastrand::Rng::with_seed(7);
        let random: std::collections::BTreeSet<Vec<u8>> = (0..60_000)
            .map(|_| {
                let len = rng.usize(1..24);
                (0..len)
                    .map(|_| [0u8, 0xFF, rng.u8(..)][rng.usize(..3)])
                    .collect()
            })
            .collect();
        for (what, keys) in [("numbered", &numbered), ("random bytes", &random)] {
            let (seen, visits) = scan_model(keys);
            assert_eq!(seen.len(), keys.len(), "{what}: every key once");
            assert!(
                seen.iter().zip(keys.iter()).all(|(a, b)| a == b),
                "{what}: in key order"
            );
            let n = keys.len() as u64;
            // Paging through the rest of the keyspace visits about n * n / (2 * PAGE).
            let paged = (0..n).step_by(PAGE as usize).map(|from| n - from).sum::<u64>();
            // Splitting: about 13 and 7 visits per key here, against 205 and 54 paging alone
            // (which grows with the keyspace, splitting with its logarithm).
            assert!(
                visits < 15 * n && visits * 5 < paged,
                "{what}: etcd visited {visits} keys for {n} (paging alone: {paged})"
            );
        }
    }

    #[test]
    fn prefixes_name_the_key() {
        assert_eq!(
            needed_by(b"k8s:enc:aescbc:v1:key1:\x00\x01"),
            Some("aescbc:key1".into())
        );
        assert_eq!(
            needed_by(b"k8s:enc:secretbox:v1:k2:xyz"),
            Some("secretbox:k2".into())
        );
        assert_eq!(
            needed_by(b"k8s:enc:kms:v2:vault:..."),
            Some("kms:v2:vault".into())
        );
        assert_eq!(needed_by(b"k8s\x00\x0a\x0d"), None);
        assert_eq!(
            needed_by(b"k8s:enc:aescbc:v1:key1"),
            None,
            "no ciphertext separator"
        );
    }

    #[test]
    fn a_configuration_lists_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("enc.yaml");
        std::fs::write(
            &p,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: key2\n        secret: c2VjcmV0IGlzIHNlY3VyZSwgb3IgaXMgaXQ/Cg==\n      - name: key1\n        secret: c2VjcmV0IGlzIHNlY3VyZQ==\n  - kms:\n      apiVersion: v2\n      name: vault\n      endpoint: unix:///kms.sock\n  - identity: {}\n",
        )
        .unwrap();
        let keys = config_keys(&p).unwrap();
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            ["aescbc:key1", "aescbc:key2", "kms:v2:vault"]
        );
        std::fs::write(&p, "kind: Pod\n").unwrap();
        assert!(
            config_keys(&p)
                .unwrap_err()
                .contains("not an EncryptionConfiguration")
        );
    }
}

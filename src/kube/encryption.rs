//! Secrets encrypted at rest: kube-apiserver writes them as `k8s:enc:<provider>:v1:<key name>:` and
//! the ciphertext (`k8s:enc:kms:v2:<name>:` for KMS v2), so a backup restores only with those keys.
//! This reads which key names the values in a full snapshot need (the newest version of every key,
//! what a restore serves) and which an `EncryptionConfiguration` holds, so `backups verify
//! --kube-encryption-config FILE` can say, per full, whether that file still decrypts it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::restore::bolt::{BUCKET_LEAF, BoltFile, BucketValue};

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
fn key_and_value(mut b: &[u8]) -> Option<(&[u8], &[u8])> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    while !b.is_empty() {
        let tag = varint(&mut b)?;
        match tag & 7 {
            0 => {
                varint(&mut b)?;
            }
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                let (field, rest) = (b.get(..len)?, b.get(len..)?);
                b = rest;
                match tag >> 3 {
                    1 => key = field,
                    5 => value = field,
                    _ => {}
                }
            }
            _ => return None,
        }
    }
    Some((key, value))
}

/// For the database at `db`: each key name the newest versions of its keys need, with how many
/// values need it.
pub fn needed_in_db(db: &Path) -> Result<BTreeMap<String, u64>, String> {
    let file = BoltFile::open(db).map_err(|e| format!("{}: {e}", db.display()))?;
    let root = file.root_items().map_err(|e| e.to_string())?;
    let bucket = root
        .iter()
        .find(|(f, k, _)| f & BUCKET_LEAF != 0 && k == b"key")
        .map(|(_, _, v)| v.clone())
        .ok_or("no key bucket: not an etcd database")?;
    let items = file
        .bucket_items(&BucketValue::parse(&bucket).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    // Revisions in order: the last entry of each key is its newest version (or its deletion).
    let mut newest: BTreeMap<Vec<u8>, Option<String>> = BTreeMap::new();
    for (_, rev, kv) in &items {
        let Some((key, value)) = key_and_value(kv) else {
            continue;
        };
        let tombstone = rev.len() == 18 && rev[17] == b't';
        newest.insert(key.to_vec(), if tombstone { None } else { needed_by(value) });
    }
    let mut out = BTreeMap::new();
    for need in newest.into_values().flatten() {
        *out.entry(need).or_default() += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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

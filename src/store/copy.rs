//! Copies of a store in another store (another provider, region or account): `backups copy`
//! brings one up to date with the objects it misses.
//!
//! What is copied: the backup objects, i.e. full snapshots, deltas and rollback points (`*.ews`)
//! and etcd-backup-restore's objects, byte for byte (encrypted ones stay encrypted). What is not:
//! the writer's coordination records (`head.json`, the prefix's owner, cluster restore plans),
//! which belong to the cluster writing the primary, and unfinished uploads (`*.tmp`). Fulls and
//! rollback points go first, then deltas in revision order, so a copy read half-way is a valid,
//! older store. An object already there with the same size counts as present.

use std::collections::HashMap;

use futures_util::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use super::Store;

/// Whether `key` is a backup object (copied), not a coordination record or an unfinished upload.
pub fn is_backup_object(key: &str) -> bool {
    (key.starts_with("v1/") && key.ends_with(".ews"))
        || key.starts_with("v2/")
        || key.starts_with("v1/Backup-")
}

#[derive(Debug, Default, Serialize)]
pub struct CopyReport {
    /// Objects written to the copy.
    pub copied: Vec<String>,
    pub bytes: u64,
    /// Backup objects the copy already had.
    pub present: usize,
}

/// Every backup object of `store`, with its size: the directories backups live in, each listed
/// totally (`listing`: a key that is no path is skipped, not the end of the copy).
async fn backup_objects(store: &Store) -> Result<HashMap<String, u64>, String> {
    use super::listing::{Dir, list_dir};
    let fail = |e: super::StoreError| crate::telemetry::error_chain(&e);
    let mut out = HashMap::new();
    let mut add = |dir: Dir| {
        for m in dir.objects {
            let key = m.location.to_string();
            if is_backup_object(&key) {
                out.insert(key, m.size);
            }
        }
    };
    let mut dirs: Vec<String> = vec!["v2".into()];
    for d in list_dir(store, "v1").await.map_err(fail)?.dirs {
        match d.as_str() {
            "full" | "rollback" => dirs.push(format!("v1/{d}")),
            "delta" => {
                let chains = list_dir(store, "v1/delta").await.map_err(fail)?;
                dirs.extend(chains.dirs.iter().map(|c| format!("v1/delta/{c}")));
            }
            d if d.starts_with("Backup-") => dirs.push(format!("v1/{d}")),
            _ => {}
        }
    }
    for d in dirs {
        add(list_dir(store, &d).await.map_err(fail)?);
    }
    Ok(out)
}

/// The order objects are copied in: fulls and rollback points, then the rest by key (a delta's key
/// holds its chain and its zero-padded first revision).
fn order(key: &str) -> (u8, &str) {
    let rank = if key.contains("/full/") || key.contains("/rollback/") || key.contains("Full-") {
        0
    } else {
        1
    };
    (rank, key)
}

/// Copies what `to` misses of `from`'s backup objects (`dry_run`: only says what).
pub async fn copy_missing(from: &Store, to: &Store, dry_run: bool) -> Result<CopyReport, String> {
    let source = backup_objects(from).await?;
    let target = backup_objects(to).await?;
    let mut missing: Vec<(&String, u64)> = source
        .iter()
        .filter(|(k, size)| target.get(*k) != Some(*size))
        .map(|(k, s)| (k, *s))
        .collect();
    missing.sort_by(|a, b| order(a.0).cmp(&order(b.0)));
    let mut report = CopyReport {
        present: source.len() - missing.len(),
        ..Default::default()
    };
    for (key, size) in missing {
        if !dry_run {
            match copy_object(from, to, key).await {
                Ok(_) => {}
                // Retention removed it from the source since the listing: nothing to copy.
                Err(CopyError::Gone) => continue,
                Err(CopyError::Failed(e)) => return Err(e),
            }
        }
        report.copied.push(key.clone());
        report.bytes += size;
    }
    Ok(report)
}

/// Why one object was not copied.
#[derive(Debug)]
pub enum CopyError {
    /// The source no longer holds it (its retention deleted it).
    Gone,
    Failed(String),
}

/// Streams one object from `from` to `to` (multipart for large ones); it appears in `to` only
/// once complete, and must have the source's size. The bytes copied.
pub async fn copy_object(from: &Store, to: &Store, key: &str) -> Result<u64, CopyError> {
    let path = Path::from(key);
    let got = match from.inner.get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Err(CopyError::Gone),
        Err(e) => return Err(CopyError::Failed(format!("read {key} from {}: {e}", from.url))),
    };
    let size = got.meta.size;
    stream_to(got, &from.url.to_string(), to, key, size)
        .await
        .map_err(CopyError::Failed)
}

async fn stream_to(
    got: object_store::GetResult,
    from_url: &str,
    to: &Store,
    key: &str,
    size: u64,
) -> Result<u64, String> {
    let path = Path::from(key);
    let mut stream = got.into_stream();
    let mut out = object_store::buffered::BufWriter::with_capacity(to.inner.clone(), path.clone(), 8 << 20);
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = out.abort().await;
                return Err(format!("read {key} from {from_url}: {e}"));
            }
        };
        written += chunk.len() as u64;
        if let Err(e) = out.write_all(&chunk).await {
            let _ = out.abort().await;
            return Err(format!("write {key} to {}: {e}", to.url));
        }
    }
    if written != size {
        let _ = out.abort().await;
        return Err(format!(
            "{key}: read {written} bytes of the {size} {from_url} holds"
        ));
    }
    out.shutdown()
        .await
        .map_err(|e| format!("write {key} to {}: {e}", to.url))?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_objects_are_copied_and_coordination_records_are_not() {
        assert!(is_backup_object(
            "v1/full/full-00000000000000000042-20261129T163000123Z-zstd-plain.ews"
        ));
        assert!(is_backup_object(
            "v1/delta/00000000000000000042-20261129T162820000Z/delta-00000000000000000043-00000000000000000099-20261129T163000123Z-zstd-plain.ews"
        ));
        assert!(!is_backup_object("v1/head.json"));
        assert!(!is_backup_object(
            "v1/full/full-00000000000000000042-20261129T163000123Z-zstd-plain.tmp"
        ));
        assert!(order("v1/full/x.ews") < order("v1/delta/a/x.ews"));
    }
}

//! Rollback points' names and listing in the store: `<prefix>/v1/rollback/`, beside `v1/full/` so
//! restores of the newest backup and ordinary retention never take one for a full. Taking one is
//! `crate::upgrade::rollback`; retention here deletes the expired ones.

use crate::store::Store;
use crate::store::format::Header;
use crate::store::layout::{self, SnapshotName};

/// The directory of rollback points under the store's prefix.
pub const DIR: &str = "v1/rollback";

/// The name of a rollback point's key (layout `Rollback`, whose `key()` is under `v1/rollback/`),
/// `None` for anything else.
pub fn parse(key: &str) -> Option<SnapshotName> {
    let rest = key.strip_prefix(&format!("{DIR}/"))?;
    let mut name = SnapshotName::parse(&format!("v1/full/{rest}")).ok()?;
    name.layout = layout::Layout::Rollback;
    Some(name)
}

/// The rollback points in the store, oldest first, with each one's header and size.
pub async fn list(store: &Store) -> Result<Vec<(SnapshotName, Header, u64)>, String> {
    let metas = crate::store::listing::list_dir(store, DIR)
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?
        .objects;
    with_headers(store, metas).await
}

/// The listed rollback points with their headers, oldest first; one that is gone by the time its
/// header is read is left out.
async fn with_headers(
    store: &Store,
    metas: Vec<object_store::ObjectMeta>,
) -> Result<Vec<(SnapshotName, Header, u64)>, String> {
    let mut out = Vec::new();
    for m in metas {
        let key = m.location.to_string();
        let Some(name) = parse(&key) else { continue };
        match crate::store::gate::check(store, &name, Some(m.size)).await {
            Ok(checked) => {
                if let Some(header) = checked.header() {
                    out.push((name, header.clone(), m.size));
                }
            }
            // A bad object (or one retention expired since the listing): no rollback point; it
            // neither counts nor expires.
            Err(crate::store::gate::Refused::Bad(why)) => {
                tracing::warn!(key, reason = %why, "a rollback point does not verify: skipped");
            }
            Err(crate::store::gate::Refused::Unknown(why)) => return Err(why),
        }
    }
    out.sort_by_key(|(n, _, _)| (n.last_revision(), n.created_ms));
    Ok(out)
}

/// The rollback points older than `keep` at `now_ms`: retention deletes them.
pub fn expired(
    points: &[(SnapshotName, Header, u64)],
    now_ms: u64,
    keep: std::time::Duration,
) -> Vec<String> {
    points
        .iter()
        .filter(|(n, _, _)| now_ms.saturating_sub(n.created_ms) > keep.as_millis() as u64)
        .map(|(n, _, _)| n.key())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// `backups list` raced retention in CI: the point was listed, then expired before its header
    /// was read, and the whole listing failed. Listed with a size it no longer has, it is missing.
    #[tokio::test]
    async fn a_point_expired_between_listing_and_reading_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let url: crate::store::StoreUrl = format!("file://{}", dir.path().display()).parse().unwrap();
        let store = Store::open(&url).unwrap();
        let key = format!("{DIR}/full-00000000000000000031-20261204T004342846Z-zstd-plain.ews");
        let meta = |key: &str| object_store::ObjectMeta {
            location: object_store::path::Path::from(key),
            last_modified: chrono::Utc::now(),
            size: 12,
            e_tag: None,
            version: None,
        };
        assert!(with_headers(&store, vec![meta(&key)]).await.unwrap().is_empty());
        // An object that does not pass the gate is a bad object: no rollback point, skipped (it
        // neither counts nor expires), never the end of the listing.
        store
            .inner
            .put(
                &object_store::path::Path::from(key.as_str()),
                b"not a warden object, long enough for a frame".to_vec().into(),
            )
            .await
            .unwrap();
        let listed = vec![meta(&key), meta(&key)];
        assert!(with_headers(&store, listed).await.unwrap().is_empty());
    }
}

//! Rollback points: before a newer minor release first starts on a data dir, a full snapshot of
//! the data as the older release left it, in `<prefix>/v1/rollback/` (beside `v1/full/`, so
//! restores of the newest backup and ordinary retention never take it for a full; `backups list`
//! shows it; `crate::store::rollback` names, lists and expires it). Its header names the release that wrote the data
//! (`etcd_version`) and the one about to start (`rollback_for`).
//!
//! Two ways to take it, both with etcd stopped: through a private etcd of the older release when
//! its binary is at hand (`--previous-etcd`, single members: etcd's own snapshot, after it applied
//! what a crash left in the WAL but not in the db file), else from the data dir's db file (the
//! same bytes etcd's snapshot stream sends: the bbolt file, then its sha256). Either way
//! `etcdutl snapshot restore` and the warden's restore read it like any full snapshot.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::etcd::version::Version;
use crate::format::mvcc::MvccFile;
use crate::snapshot::full::upload_stream;
use crate::store::Store;
use crate::store::format::{Footer, Header};
use crate::store::layout::{self, Compression, Kind, SnapshotName};
use crate::store::rollback::list;

/// Whether the store already holds a rollback point at `revision` (a start that failed after
/// taking it, tried again).
async fn exists_at(store: &Store, revision: i64) -> Result<bool, String> {
    Ok(list(store)
        .await?
        .iter()
        .any(|(n, _, _)| n.last_revision() == revision))
}

/// Takes the rollback point through `client`, a private etcd of the older release on the data,
/// before `next` starts on it; `Ok(None)` when the store already holds one at its revision.
pub async fn take_through(
    client: &mut etcd_client::Client,
    store: &Store,
    next: Version,
    compression: Compression,
) -> Result<Option<(String, i64)>, String> {
    let revision = crate::etcd::private::revision(client, true)
        .await
        .map_err(|e| format!("read the private etcd's revision: {e}"))?;
    if exists_at(store, revision).await? {
        return Ok(None);
    }
    let r = crate::snapshot::full::take_full(
        client,
        store,
        compression,
        crate::snapshot::full::FullOptions {
            rollback_for: Some(next),
            ..Default::default()
        },
        &crate::telemetry::Progress::default(),
    )
    .await
    .map_err(|e| crate::telemetry::error_chain(&e))?;
    Ok(Some((r.name.key(), r.name.last_revision())))
}

/// Takes the rollback point of `data_dir` (written by `written_by`, a release or a minor) before
/// `next` starts on it; `Ok(None)` when the store already holds one at the data's revision (a
/// start that failed and is tried again).
pub async fn take(
    store: &Store,
    data_dir: &Path,
    written_by: &str,
    next: Version,
    compression: Compression,
) -> Result<Option<(String, i64)>, String> {
    let db_path = data_dir.join("member").join("snap").join("db");
    let revision = MvccFile::open(&db_path)
        .map_err(|e| format!("read {}: {e}", db_path.display()))?
        .revision();
    if exists_at(store, revision).await? {
        return Ok(None);
    }
    let name = SnapshotName {
        kind: Kind::Full {
            revision,
            is_final: false,
        },
        created_ms: layout::now_ms(),
        compression,
        encryption: store.encryption(),
        layout: layout::Layout::Rollback,
    };
    let key = name.key();
    let header = Header {
        format: 1,
        kind: "full".into(),
        revision: Some(revision),
        base: None,
        base_created: None,
        first: None,
        last: None,
        created: humantime::format_rfc3339_millis(name.created()).to_string(),
        compression,
        encryption: store.encryption(),
        is_final: false,
        cluster_id: 0,
        member_id: 0,
        raft_term: None,
        etcd_version: written_by.to_owned(),
        writer: concat!("etcd-warden ", env!("CARGO_PKG_VERSION")).into(),
        outside: None,
        rollback_for: Some(next.to_string()),
    };
    // etcd's snapshot stream: the db file, then its sha256; read 1 MiB at a time.
    let file = tokio::fs::File::open(&db_path)
        .await
        .map_err(|e| format!("open {}: {e}", db_path.display()))?;
    let chunks = futures_util::stream::unfold(Some((file, Sha256::new())), |state| async move {
        use tokio::io::AsyncReadExt;
        let (mut file, mut hasher) = state?;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf).await {
            Ok(0) => Some((Ok(hasher.finalize().to_vec()), None)),
            Ok(n) => {
                buf.truncate(n);
                hasher.update(&buf);
                Some((Ok(buf), Some((file, hasher))))
            }
            Err(e) => Some((Err(crate::snapshot::full::SnapshotError::ReadDb(e)), None)),
        }
    });
    let (raw_bytes, sha, writer) = upload_stream(store, &key, &header, compression, chunks)
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let footer = Footer {
        raw_bytes,
        etcd_sha256: Some(sha),
        revision_after: Some(revision),
        revisions: None,
        events: None,
        signature: None,
    };
    writer
        .finish(&footer)
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    Ok(Some((key, revision)))
}

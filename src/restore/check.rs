//! The proof that etcd itself accepts a restore: etcd started on the restored data (privately, on
//! loopback ports), asked for its revision and its HashKV. The restore drill and `backups verify
//! --deep` use it.

use std::path::Path;

use crate::process::pid1::Reaper;

/// Starts etcd on a restored data dir (privately, on loopback ports) and reads back what it serves:
/// it must report `revision`; returns its HashKV there. The proof that etcd itself accepts the
/// result, which the restore alone does not give when it wrote the deltas into the file.
/// `compact_to`: first compact the restored data to the live etcd's compaction revision, since
/// HashKV covers only what is newer than the compaction (plus each key's kept revision).
pub async fn open_with_etcd(
    reaper: &Reaper,
    etcd: &Path,
    data: &Path,
    name: &str,
    revision: i64,
    compact_to: Option<i64>,
) -> Result<u32, String> {
    let log = data.with_file_name("check-etcd.log");
    let private =
        crate::etcd::private::PrivateEtcd::start(reaper, etcd, data, None, name, &log, true).await?;
    let result = async {
        let mut client = private.client().await?;
        let got = crate::etcd::private::restored_revision(&mut client).await?;
        if got != revision {
            return Err(format!(
                "etcd opened the restored data at revision {got}; the restore ended at {revision}"
            ));
        }
        let mut client = private.long_client().await?;
        if let Some(c) = compact_to.filter(|c| *c > 0) {
            // "already compacted" means the restored data's own compaction is at least as new.
            if let Err(e) = client
                .compact(c, Some(etcd_client::CompactionOptions::new().with_physical()))
                .await
                && !e.to_string().contains("compacted")
            {
                return Err(format!("compact the restored data to revision {c}: {e}"));
            }
        }
        client
            .hash_kv(revision)
            .await
            .map(|h| h.hash())
            .map_err(|e| format!("HashKV of the restored data: {e}"))
    }
    .await;
    private.stop().await;
    result
}

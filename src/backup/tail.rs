//! After a graceful stop: the revisions etcd acknowledged after the backup loop's last flush.
//!
//! The loop's last flush waits for its watch to reach etcd's revision at the stop request, but a
//! client still connected can write until etcd itself stops. Once etcd is down, the data dir's
//! revision is compared with the chain's last uploaded one; when it is ahead (or etcd had to be
//! SIGKILLed, so the db may lag its WAL), a private etcd on loopback replays the WAL, the missing
//! revisions are read through a watch and uploaded as the chain's last delta, the way fencing
//! reads its final snapshot. Bounded by the caller.

use std::path::{Path, PathBuf};

use super::config::BackupConfig;
use super::leases::live_leases;
use super::stream::{read_upto, watch_after};
use crate::etcd::EtcdArgs;
use crate::etcd::private::{PrivateEtcd, revision};
use crate::format::mvcc::MvccFile;
use crate::process::pid1::Reaper;
use crate::snapshot::delta::{self, DeltaBuffer};

/// Uploads the tail; `Some((first, last))` when there was one.
pub async fn upload_tail(
    cfg: &BackupConfig,
    etcd: &EtcdArgs,
    program: &Path,
    reaper: &Reaper,
    killed: bool,
) -> Result<Option<(i64, i64)>, String> {
    if cfg.delta_period.is_zero() {
        return Ok(None);
    }
    // A cluster member never uploads a tail: what its etcd acknowledged was committed by a
    // majority, which keeps it, and the next leader's warden continues the chain from the store's
    // last revision, as the one writer. (A tail read here would be written outside the leadership
    // check, and would need a private etcd on a member's data, which would dial the peers.)
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let data = cwd.join(&etcd.data_dir);
    if cfg.cluster || crate::etcd::local::member_count(&data).is_some_and(|n| n > 1) {
        tracing::info!("cluster member: no tail upload (the next writer continues the chain)");
        return Ok(None);
    }
    let store = cfg.open_store().map_err(|e| crate::telemetry::error_chain(&e))?;
    let Some((newest, deltas)) = store
        .newest_checked_chain()
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?
    else {
        return Ok(None);
    };
    let Some(chain) = newest.chain() else {
        return Ok(None);
    };
    let after = deltas.last().map(|n| n.last_revision()).unwrap_or(chain.base);
    if let Ok(db) = MvccFile::open(&data.join("member/snap/db")) {
        // etcd stopped cleanly: its db holds every applied revision, so a look at the file decides.
        if !killed && db.revision() <= after {
            return Ok(None);
        }
        // History compacted past the chain's end (a restore's bump and compaction mark, or a
        // compaction before the first delta): no watch can read those revisions, and the next
        // start takes a full. Said at once instead of starting a private etcd to learn it.
        if db.compacted() > after {
            return Err(format!(
                "the data's history is compacted at revision {}, past the chain's last revision {after}: the next start takes a full snapshot",
                db.compacted()
            ));
        }
    }
    let private = PrivateEtcd::start(
        reaper,
        program,
        &data,
        etcd.wal_path().as_deref(),
        &etcd.name,
        &crate::etcd::dirs::beside(&data, ".tail.log"),
        false,
    )
    .await?;
    let result = async {
        let mut client = private.client().await?;
        let rev = revision(&mut client, false)
            .await
            .map_err(|e| format!("read the private etcd's revision: {e}"))?;
        if rev <= after {
            return Ok(None);
        }
        let mut buf = DeltaBuffer::new(chain, after);
        let mut watch = watch_after(&client, after)
            .await
            .map_err(|e| format!("watch the tail: {e}"))?;
        while buf.last() < rev {
            read_upto(&mut client, &mut watch, &mut buf, rev)
                .await
                .map_err(|e| format!("the tail (not in the store): {e}"))?;
        }
        // The crashed etcd's leases at its last revision: what no event of the tail shows.
        if let Some(set) = live_leases(&mut client, &mut Default::default()).await
            && set.revision == buf.last()
        {
            buf.push_lease_set(set.leases);
        }
        let Some(pending) = buf.take() else {
            return Ok(None);
        };
        let range = (pending.first, pending.last);
        delta::upload(&store, &pending, cfg.compression, delta::Writer::default())
            .await
            .map_err(|e| crate::telemetry::error_chain(&e))?;
        Ok(Some(range))
    }
    .await;
    private.stop().await;
    result
}

//! The markers the warden leaves beside a data dir about where its data came from.
//!
//! `<data-dir>.warden-restored`: the data dir holds a restore whose revision was bumped (from the
//! backed-up revision to the served one, everything below marked compacted). The backup writer
//! reads it when it would resume a chain that ends below the served revision: those revisions are
//! compacted by the bump, not lost, so a new chain starts with a full and no chain break is
//! counted. Written by every bump: a restore (start-up, `restore`, a cluster plan, a rollback)
//! and a standby's promotion. A stale one is harmless: once a chain reaches the served revision,
//! the marker no longer applies to it.

use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Restored {
    pub backed_up_revision: i64,
    pub served_revision: i64,
}

pub fn path(data_dir: &Path) -> PathBuf {
    crate::etcd::dirs::beside(data_dir, ".warden-restored")
}

/// Records a bumped restore of `data_dir` (written aside, then renamed over the old one).
pub fn write(data_dir: &Path, r: Restored) -> Result<(), String> {
    let to = path(data_dir);
    let tmp = crate::etcd::dirs::beside(data_dir, ".warden-restored.tmp");
    let text = serde_json::to_vec(&r).map_err(|e| e.to_string())?;
    crate::etcd::dirs::write_fresh(&tmp, &text)
        .and_then(|()| std::fs::rename(&tmp, &to))
        .map_err(|e| format!("write {}: {e}", to.display()))
}

/// Records a restore of `data_dir` that served `served` after backing up to `backed_up`; nothing
/// when there was no bump.
pub fn record(data_dir: &Path, backed_up: i64, served: i64) -> Result<(), String> {
    if served == backed_up {
        return Ok(());
    }
    write(
        data_dir,
        Restored {
            backed_up_revision: backed_up,
            served_revision: served,
        },
    )
}

/// The marker of `data_dir`, if any (4 KiB at most is read; anything else is no marker).
pub fn read(data_dir: &Path) -> Option<Restored> {
    let mut text = Vec::new();
    std::fs::File::open(path(data_dir))
        .ok()?
        .take(4096)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice(&text).ok()
}

/// `<data-dir>.warden-plan.json`: the cluster restore plan this member's data came from (written
/// when the member restored by it; `crate::cluster::restore`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PlanApplied {
    pub plan: String,
    pub revision: i64,
    pub at_ms: u64,
}

pub fn plan_path(data: &Path) -> PathBuf {
    crate::etcd::dirs::beside(data, ".warden-plan.json")
}

/// The plan this member's data came from, if any.
pub fn plan_applied(data: &Path) -> Option<PlanApplied> {
    serde_json::from_slice(&std::fs::read(plan_path(data)).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage_is_no_marker() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert_eq!(read(&data), None);
        let r = Restored {
            backed_up_revision: 7,
            served_revision: 1_000_000_007,
        };
        write(&data, r).unwrap();
        assert_eq!(read(&data), Some(r));
        std::fs::write(path(&data), b"\xff{not json").unwrap();
        assert_eq!(read(&data), None);
        std::fs::write(path(&data), vec![b' '; 1 << 20]).unwrap();
        assert_eq!(read(&data), None);
    }
}

//! The repair journal, beside the data dir (`<data-dir>.warden-repair.json`): what a repair has
//! done so far, so that a warden killed at any step resumes it and never leaves two member entries
//! or an orphan learner. Written with write-then-rename, synced, before each step it announces.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub format: u32,
    /// Why the repair began (the evidence).
    pub why: String,
    pub started_ms: u64,
    /// Where the broken data dir went (rule 3: kept, never deleted).
    pub moved_aside: Option<PathBuf>,
    /// The member entry the lost data belonged to; removed through a peer once `removed`.
    pub old_member_id: Option<u64>,
    pub removed: bool,
    /// A learner add was sent (its answer may have been lost with the warden).
    pub adding: bool,
    /// The learner this repair added, once etcd said its id.
    pub learner_id: Option<u64>,
}

pub fn path(data: &Path) -> PathBuf {
    crate::etcd::dirs::beside(data, ".warden-repair.json")
}

impl Journal {
    pub fn load(data: &Path) -> Result<Option<Self>, String> {
        let p = path(data);
        match std::fs::read(&p) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                format!(
                    "the repair journal {} is unreadable ({e}); move it away to start over",
                    p.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("read the repair journal {}: {e}", p.display())),
        }
    }

    pub fn save(&self, data: &Path) -> Result<(), String> {
        let p = path(data);
        let tmp = crate::etcd::dirs::beside(data, ".warden-repair.json.tmp");
        let write = || -> std::io::Result<()> {
            let mut f = crate::etcd::dirs::create_fresh(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(self).unwrap_or_default())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)?;
            if let Some(parent) = p.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| format!("write the repair journal {}: {e}", p.display()))
    }

    /// The repair is over: the journal is kept as `<data-dir>.warden-repair.done.json`.
    pub fn finish(data: &Path) {
        let done = crate::etcd::dirs::beside(data, ".warden-repair.done.json");
        if let Err(e) = std::fs::rename(path(data), &done)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, "cannot close the repair journal");
        }
    }
}

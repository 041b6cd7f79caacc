//! The head object of a cluster's prefix (`v1/head.json`): a small JSON that the writer (the
//! leader's warden) rewrites after every upload. Followers read it once per delta period, so
//! every member reports the backup state and who writes, without listing the bucket; it is a
//! summary for readers, never the source of truth for a restore (the objects are).

use serde::{Deserialize, Serialize};

use super::layout::{ChainId, VERSION_DIR};
use super::{Store, StoreError};

pub fn key() -> String {
    format!("{VERSION_DIR}/head.json")
}

/// One uploaded object, as the head records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uploaded {
    pub key: String,
    pub revision: i64,
    /// Unix milliseconds.
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Head {
    pub format: u32,
    pub cluster_id: u64,
    /// The writer: its etcd's member id and name, and the raft term it wrote in.
    pub member_id: u64,
    pub member_name: String,
    pub raft_term: u64,
    pub chain: ChainId,
    /// The newest revision in the store.
    pub last_revision: i64,
    pub last_full: Option<Uploaded>,
    pub last_delta: Option<Uploaded>,
    pub updated_ms: u64,
}

impl Store {
    pub async fn put_head(&self, head: &Head) -> Result<(), StoreError> {
        self.put_json(&key(), head, false).await.map(drop)
    }

    /// `None` when there is none yet (or it cannot be parsed: it is only a summary).
    pub async fn get_head(&self) -> Result<Option<Head>, StoreError> {
        self.get_json(&key()).await
    }
}

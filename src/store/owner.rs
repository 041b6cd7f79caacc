//! Which cluster owns a prefix (`v1/cluster.json`): the first writer of a multi-member cluster
//! claims the prefix with a create-if-absent write and keeps the member list there (names, ids,
//! peer and client URLs), so a quorum-loss restore knows the members without being told. A warden
//! of another cluster pointed at the same prefix finds a different cluster id and writes nothing.

use serde::{Deserialize, Serialize};

use super::layout::VERSION_DIR;
use super::{Store, StoreError};

pub fn key() -> String {
    format!("{VERSION_DIR}/cluster.json")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub id: u64,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub format: u32,
    pub cluster_id: u64,
    /// The member whose warden claimed the prefix, and when (Unix milliseconds).
    pub claimed_by: String,
    pub claimed_ms: u64,
    pub members: Vec<Member>,
    pub updated_ms: u64,
}

impl Store {
    pub async fn get_owner(&self) -> Result<Option<Owner>, StoreError> {
        self.get_json(&key()).await
    }

    /// Claims the prefix for `ours` unless a cluster already did; returns the owner on record.
    pub async fn claim(&self, ours: &Owner) -> Result<Owner, StoreError> {
        if let Some(owner) = self.get_owner().await? {
            return Ok(owner);
        }
        if self.put_json(&key(), ours, true).await? {
            return Ok(ours.clone());
        }
        // Another writer claimed it first: its word stands.
        Ok(self.get_owner().await?.unwrap_or_else(|| ours.clone()))
    }

    /// Rewrites the record (the owning cluster's writer, when its member list changed).
    pub async fn put_owner(&self, owner: &Owner) -> Result<(), StoreError> {
        self.put_json(&key(), owner, false).await.map(drop)
    }
}

//! The head object of a cluster's prefix (`v1/head.json`): a small JSON that the writer (the
//! leader's warden) rewrites after every upload. Followers read it once per delta period, so
//! every member reports the backup state and who writes, without listing the bucket; it is a
//! summary for readers, never the source of truth for a restore (the objects are).

use object_store::ObjectStoreExt;
use object_store::path::Path;
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
        let body = serde_json::to_vec_pretty(head).expect("a head serializes");
        self.inner
            .put(&Path::from(key()), body.into())
            .await
            .map(drop)
            .map_err(|source| StoreError::Write {
                key: key(),
                url: self.url.to_string(),
                source,
            })
    }

    /// `None` when there is none yet (or it cannot be parsed: it is only a summary).
    pub async fn get_head(&self) -> Result<Option<Head>, StoreError> {
        match self.inner.get(&Path::from(key())).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|source| StoreError::Read {
                    key: key(),
                    url: self.url.to_string(),
                    source,
                })?;
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(StoreError::Read {
                key: key(),
                url: self.url.to_string(),
                source,
            }),
        }
    }
}

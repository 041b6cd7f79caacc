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

/// What a fenced write of the head object did.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadWrite {
    Written,
    /// A writer of a later raft term of the same cluster wrote the head: this one no longer leads,
    /// whatever its own etcd still believes, and writes nothing more.
    Superseded(Head),
}

/// Whether `ours` may replace `theirs`: a head of the same cluster written in a later raft term is
/// never replaced by an earlier term's writer (another cluster's head, after a cluster restore, is).
pub fn may_replace(theirs: &Head, ours: &Head) -> bool {
    theirs.cluster_id != ours.cluster_id || theirs.raft_term <= ours.raft_term
}

impl Store {
    /// Writes the head object only if no later raft term's writer wrote it: read, compare terms,
    /// then a conditional write against the version read (S3 If-Match, GCS generation, Azure ETag;
    /// create-if-absent when there is none), so a writer that read an older head cannot overwrite a
    /// newer one written meanwhile. A store without conditional updates (a local directory) gets
    /// the term check and a plain write.
    pub async fn put_head(&self, head: &Head) -> Result<HeadWrite, StoreError> {
        let path = object_store::path::Path::from(key());
        let body = self.keys.signing.seal_record(
            &key(),
            serde_json::to_vec_pretty(head).expect("a head serializes"),
        );
        let write = |source| StoreError::Write {
            key: key(),
            url: self.url.to_string(),
            source,
        };
        for _ in 0..5 {
            let (current, version) = match object_store::ObjectStoreExt::get(self.inner.as_ref(), &path).await
            {
                Ok(got) => {
                    let version = object_store::UpdateVersion {
                        e_tag: got.meta.e_tag.clone(),
                        version: got.meta.version.clone(),
                    };
                    let bytes = super::bounded_record(&key(), got)
                        .await
                        .map_err(|source| StoreError::Read {
                            key: key(),
                            url: self.url.to_string(),
                            source,
                        })?
                        .unwrap_or_default();
                    // A head this store's key did not sign (with signing on) is no writer's word.
                    let theirs = self
                        .record_trusted(&key(), &bytes)
                        .then(|| serde_json::from_slice::<Head>(&bytes).ok());
                    (theirs.flatten(), Some(version))
                }
                Err(object_store::Error::NotFound { .. }) => (None, None),
                Err(source) => {
                    return Err(StoreError::Read {
                        key: key(),
                        url: self.url.to_string(),
                        source,
                    });
                }
            };
            if let Some(theirs) = current
                && !may_replace(&theirs, head)
            {
                return Ok(HeadWrite::Superseded(theirs));
            }
            let mode = match version {
                Some(v) => object_store::PutMode::Update(v),
                None => object_store::PutMode::Create,
            };
            let opts = object_store::PutOptions {
                mode: mode.clone(),
                ..Default::default()
            };
            match self.inner.put_opts(&path, body.clone().into(), opts).await {
                Ok(_) => return Ok(HeadWrite::Written),
                // Written by another writer between the read and this write: read again.
                Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {
                    continue;
                }
                Err(object_store::Error::NotImplemented { .. })
                    if matches!(mode, object_store::PutMode::Update(_)) =>
                {
                    self.put_json(&key(), head, false).await?;
                    return Ok(HeadWrite::Written);
                }
                Err(source) => return Err(write(source)),
            }
        }
        Err(write(object_store::Error::Generic {
            store: "head",
            source: "the head object changed under five conditional writes in a row".into(),
        }))
    }

    /// `None` when there is none yet (or it cannot be parsed: it is only a summary).
    pub async fn get_head(&self) -> Result<Option<Head>, StoreError> {
        self.get_json(&key()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(cluster_id: u64, raft_term: u64) -> Head {
        Head {
            format: 1,
            cluster_id,
            member_id: 1,
            member_name: "m".into(),
            raft_term,
            chain: ChainId {
                base: 1,
                base_created_ms: 1,
            },
            last_revision: 1,
            last_full: None,
            last_delta: None,
            updated_ms: 1,
        }
    }

    #[test]
    fn a_lower_term_never_replaces_a_higher_one_of_the_same_cluster() {
        assert!(!may_replace(&head(7, 5), &head(7, 4)));
        assert!(may_replace(&head(7, 5), &head(7, 5)));
        assert!(may_replace(&head(7, 5), &head(7, 6)));
        // A restored cluster (another id) starts its terms afresh.
        assert!(may_replace(&head(7, 5), &head(8, 2)));
    }

    #[tokio::test]
    async fn a_superseded_writer_is_told_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url: crate::store::StoreUrl = format!("file://{}", dir.path().display()).parse().unwrap();
        let store = Store::open(&url).unwrap();
        assert_eq!(store.put_head(&head(7, 5)).await.unwrap(), HeadWrite::Written);
        assert_eq!(
            store.put_head(&head(7, 4)).await.unwrap(),
            HeadWrite::Superseded(head(7, 5))
        );
        assert_eq!(store.get_head().await.unwrap(), Some(head(7, 5)));
        assert_eq!(store.put_head(&head(7, 6)).await.unwrap(), HeadWrite::Written);
        assert_eq!(store.get_head().await.unwrap(), Some(head(7, 6)));
    }
}

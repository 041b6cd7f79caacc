//! The writer's settings (`BackupConfig`): what `run` and a SIGHUP reload hand it.

use std::time::Duration;

use crate::etcd::ClientConfig;
use crate::store::layout::Compression;
use crate::store::retention::Policy;
use crate::store::{Store, StoreUrl};

/// What the backup loop is configured to do.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    pub store: StoreUrl,
    /// `--copy-to` stores: every object this writer publishes is also copied there.
    pub copies: crate::copies::Config,
    /// `--store-credentials`: re-read when its modification time changes.
    pub credentials: Option<std::path::PathBuf>,
    pub client: ClientConfig,
    pub compression: Compression,
    pub full_schedule: Option<croner::Cron>,
    /// 0 = no deltas.
    pub delta_period: Duration,
    pub delta_max_bytes: usize,
    /// Start a new chain (full snapshot) once the current one holds this many revisions, which
    /// bounds restore time (each delta revision is replayed as one transaction); 0 = never.
    pub full_after_revisions: i64,
    pub retention: Policy,
    /// `--rollback-retention`: how long a rollback point stays (`None`: forever).
    pub rollback_retention: Option<Duration>,
    /// `--defrag-schedule`: defragment etcd's backend, between snapshots, never during one.
    pub defrag_schedule: Option<croner::Cron>,
    /// `--encrypt-to` recipients and `--identity-file` identities.
    pub keys: crate::store::crypt::Keys,
    /// `--gbr-lease-ttl`: what a restore from GBR's backups gives the leases they do not describe.
    pub gbr_lease_ttl: Duration,
    /// `--space-keeper` and its thresholds.
    pub space: crate::space::Config,
    /// etcd's `--initial-cluster` names more than one member: only the warden whose etcd is the
    /// raft leader (not a learner) writes to the store.
    pub cluster: bool,
    /// etcd's data dir (absolute): where a cluster restore plan's marker sits beside it.
    pub data_dir: std::path::PathBuf,
    /// This member's `--name`, for the head object.
    pub member_name: String,
    /// `--kube-encryption-config`: after each full, the key names its encrypted values need are
    /// checked against this kube-apiserver EncryptionConfiguration (read afresh each time).
    pub kube_encryption_config: Option<std::path::PathBuf>,
}

impl BackupConfig {
    /// The store with `--store-credentials` read afresh and the age keys attached.
    pub fn open_store(&self) -> Result<Store, crate::store::StoreError> {
        Ok(Store::open_configured(&self.store, self.credentials.as_deref())?
            .with_keys(self.keys.clone())
            .with_gbr_lease_ttl(self.gbr_lease_ttl))
    }
}

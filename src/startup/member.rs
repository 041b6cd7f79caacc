//! This member's configuration as the start-up, the standby, fencing and upgrades read it: the
//! etcd it runs and how to reach it, its store, its backups. `crate::config` builds it (again on
//! SIGHUP) as part of the run command's configuration; nothing here parses or validates.

use crate::backup::BackupConfig;
use crate::etcd::supervisor::Launch;
use crate::etcd::{ClientConfig, EtcdArgs};
use crate::store::StoreUrl;

#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The etcd binary (absolute), its arguments and the environment the warden adds.
    pub launch: Launch,
    /// etcd's settings as etcd reads them (flags, `ETCD_*` variables, its config file).
    pub etcd: EtcdArgs,
    /// How the warden reaches this member's etcd.
    pub client: ClientConfig,
    pub store: StoreUrl,
    pub backup: BackupConfig,
    /// The revision bump of an automatic restore at start (0: none).
    pub restore_bump_revision: u64,
    /// `--cluster-endpoints`: other members' client URLs (clusters).
    pub cluster_endpoints: Vec<String>,
}

impl MemberConfig {
    /// A member of a cluster: `--initial-cluster` names others, or its data dir's membership does
    /// (members added at run time to what was started as one).
    pub fn is_cluster_member(&self) -> bool {
        let configured = self.etcd.initial_members();
        configured.max(crate::etcd::local::member_count(&self.backup.data_dir).unwrap_or(0)) > 1
    }
}

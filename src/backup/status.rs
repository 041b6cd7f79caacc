//! What the writer reports (`BackupStatus` and its parts): /status, metrics and the STATUS line
//! read it; readiness never does (rule 1).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

use crate::store::retention::RetentionLocked;

/// A chain that could not continue: the store held revisions up to `after`, etcd had compacted
/// up to `compacted`, so the revisions between are in no delta.
#[derive(Debug, Clone, Serialize)]
pub struct ChainBreak {
    pub after: i64,
    pub compacted: i64,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub at: Option<SystemTime>,
}

/// One uploaded snapshot, as /status shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapInfo {
    pub key: String,
    pub revision: i64,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub at: Option<SystemTime>,
    pub stored_bytes: u64,
    pub raw_bytes: u64,
    pub duration_seconds: f64,
}

/// Backup health: shown in /status, metrics and the STATUS line; never an input to readiness.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackupStatus {
    /// `None` until the first attempt; false after a failure until the next success.
    pub healthy: Option<bool>,
    pub last_full: Option<SnapInfo>,
    pub last_delta: Option<SnapInfo>,
    pub last_error: Option<String>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_error_at: Option<SystemTime>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_success_at: Option<SystemTime>,
    pub consecutive_failures: u64,
    /// The newest revision safely in the store.
    pub backed_up_revision: Option<i64>,
    pub chain_base: Option<i64>,
    /// In a multi-member cluster: `writer` while this member's etcd leads (it uploads, runs
    /// retention and defragmentation), `follower` otherwise; `None` for a single member.
    pub role: Option<String>,
    /// Who writes, as the head object says (followers): `name (member id)`.
    pub writer: Option<String>,
    /// Set while another cluster owns the store prefix: why this warden writes nothing.
    pub foreign_prefix: Option<String>,
    /// Times the chain could not continue because etcd had compacted its next revision.
    pub chain_breaks_total: u64,
    pub last_chain_break: Option<ChainBreak>,
    /// The revision at which the chain's lease set was last checked against etcd's (leases
    /// granted with no key and revocations are in deltas from there on).
    pub leases_checked_revision: Option<i64>,
    pub pending_delta_bytes: u64,
    pub pending_delta_events: u64,
    pub fulls_total: u64,
    pub deltas_total: u64,
    pub defrags_total: u64,
    pub last_defrag: Option<DefragInfo>,
    /// NOSPACE repairs this writer ran (`crate::space`), and the last one.
    pub space_repairs_total: u64,
    pub last_space_repair: Option<crate::space::Repair>,
    /// Compactions this writer ran for `--space-history`, and the revision of the last one.
    pub space_compactions_total: u64,
    pub space_compacted_revision: Option<i64>,
    /// The last retention pass left these objects in place: S3 Object Lock protects them.
    pub retention_locked: Option<RetentionLocked>,
    /// What the loop is doing right now (a full snapshot's progress).
    pub in_progress: Option<String>,
    /// Failures by kind ("full", "delta", "retention", "store") and bounded reason.
    pub failures_total: BTreeMap<String, u64>,
    /// `--kube-encryption-config`: the check of the newest full. Keys it misses keep `healthy`
    /// false until a later full passes.
    pub kube_keys: Option<crate::kube::encryption::KeyCheck>,
}

impl BackupStatus {
    /// The problem the last encryption-key check found, if any.
    pub fn kube_keys_problem(&self) -> Option<String> {
        self.kube_keys.as_ref().and_then(|k| k.problem())
    }
}

/// The last defragmentation.
#[derive(Debug, Clone, Serialize)]
pub struct DefragInfo {
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub at: Option<SystemTime>,
    pub duration_seconds: f64,
    pub db_size_before: i64,
    pub db_size_after: i64,
}

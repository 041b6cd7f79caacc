//! `etcd-warden standby`: a warm standby in another region, a delta period behind its store.
//!
//! The standby keeps a data dir restored from the store (the newest full and its deltas, no
//! revision bump) and follows the store: every poll it lists the fulls and the chains around its
//! revision and writes each new delta into the data dir's bbolt file exactly as a restore does
//! (`restore::extend`). No etcd runs on it meanwhile, so nothing but the warden can read or write
//! it, and clients see a not-ready readiness ("standby, N revisions behind").
//!
//! Promotion (`ctl promote`, SIGUSR2) applies what the store holds, raises the revision and marks
//! it compacted (the bump of every restore: no client is handed a revision the primary already
//! handed out), and hands over to the ordinary run loop: etcd starts on the data dir as a new
//! single-member cluster and the warden backs it up to its own `--store`. It refuses while the
//! store's newest object is younger than `--standby-quiet` (the primary's writer still writes)
//! unless forced.
//!
//! The data dir is only ever the standby's own: a standby refuses a data dir that holds anything
//! but its own restore (the marker `<data-dir>.standby` says which). Its history is rebuilt from
//! the newest full when no delta continues it (a chain break in the primary, e.g. a restore there)
//! and when the appended pages have grown the file past twice its restored size (the bbolt writer
//! appends and never reuses pages).

pub mod follow;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::startup::member::MemberConfig;

pub use follow::Follower;

/// `standby`'s own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyConfig {
    /// How often the store is listed for new objects.
    pub poll: Duration,
    /// Promotion refuses while the store's newest object is younger than this (unless forced).
    pub quiet: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    #[default]
    Restoring,
    Following,
    Promoting,
    Promoted,
}

/// A promotion, asked for or done.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Promotion {
    pub forced: bool,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub requested_at: Option<SystemTime>,
    /// Why the last request was refused (the standby goes on following).
    pub refused: Option<String>,
    /// The backed-up revision the promoted member holds.
    pub backed_up_revision: Option<i64>,
    /// The revision it serves: the backed-up one plus the bump.
    pub revision: Option<i64>,
    /// From the request to a ready etcd.
    pub seconds: Option<f64>,
}

/// What /status, /metrics and /readyz show of a standby.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StandbyStatus {
    pub state: State,
    pub store: String,
    /// The revision the data dir holds.
    pub revision: i64,
    /// The newest revision the store holds.
    pub store_revision: i64,
    pub lag_revisions: i64,
    /// How long ago the oldest object not applied yet was written, as of the last poll (0: it
    /// applied everything it listed).
    pub lag_seconds: f64,
    /// The store's newest object and when it was written (the primary's clock, from its name).
    pub store_head: Option<String>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub store_head_at: Option<SystemTime>,
    /// The last time the store was listed: a standby that cannot read its store cannot know how far
    /// behind it is.
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_listed_at: Option<SystemTime>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_applied_at: Option<SystemTime>,
    /// From the primary writing the last delta applied to its being in the data dir: the copy, the
    /// wait for the poll and the write. The standby is this much plus one delta period behind etcd.
    pub apply_delay_seconds: Option<f64>,
    pub deltas_applied_total: u64,
    pub revisions_applied_total: u64,
    /// Rebuilds from the newest full (the first restore not counted).
    pub rebuilds_total: u64,
    pub polls_total: u64,
    pub last_error: Option<String>,
    pub promotion: Option<Promotion>,
}

impl StandbyStatus {
    /// Why readiness is 503 while this is a standby; `None` once promoted.
    pub fn not_ready_reason(&self) -> Option<String> {
        match self.state {
            State::Restoring => Some("standby, restoring the newest backup".into()),
            State::Following => Some(format!("standby, {} revisions behind", self.lag_revisions)),
            State::Promoting => Some("standby, promoting".into()),
            State::Promoted => None,
        }
    }
}

/// `<data-dir>.standby`: this data dir is a standby's restore, which the standby may replace.
pub fn marker(data: &Path) -> PathBuf {
    crate::etcd::dirs::beside(data, ".standby")
}

/// What a standby refuses before it touches anything (exit 64).
pub fn check_usage(cfg: &MemberConfig) -> Result<(), String> {
    if cfg.is_cluster_member() {
        return Err(
            "standby: a standby is a single member (--initial-cluster names other members, or --cluster-endpoints is set); it becomes a new one-member cluster when promoted: drop the other members from the etcd flags"
                .into(),
        );
    }
    let data = std::env::current_dir()
        .unwrap_or_else(|_| "/".into())
        .join(&cfg.etcd.data_dir);
    if let Some(wal) = cfg.etcd.wal_path() {
        return Err(format!(
            "standby: --wal-dir {}: a standby rebuilds its data dir whole and keeps the WAL in it, where etcd looks without --wal-dir (drop --wal-dir)",
            wal.display()
        ));
    }
    let store = cfg.store.to_string();
    if let Ok(text) = std::fs::read_to_string(marker(&data))
        && let Some(followed) = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("etcd-warden standby of "))
        && followed.trim() != store
    {
        return Err(format!(
            "standby: the data dir {} follows {} , not --store {store}: remove {} and {} to restore from the new store (both are the standby's own), or give the old --store",
            data.display(),
            followed.trim(),
            data.display(),
            marker(&data).display()
        ));
    }
    if !crate::etcd::dirs::is_empty_dir(&data) && !marker(&data).exists() {
        return Err(format!(
            "standby: the data dir {} holds data that is not a standby's (no {}): a standby restores into its own empty data dir and replaces it while it follows the store; point --data-dir at an empty directory (nothing was changed)",
            data.display(),
            marker(&data).display()
        ));
    }
    Ok(())
}

/// What `run` refuses (exit 64): a standby's data dir, never promoted. etcd started on it as it is
/// would hand out revision numbers the primary already handed out (no bump).
pub fn check_not_a_standby(cfg: &MemberConfig) -> Result<(), String> {
    let data = std::env::current_dir()
        .unwrap_or_else(|_| "/".into())
        .join(&cfg.etcd.data_dir);
    let m = marker(&data);
    if m.exists() {
        return Err(format!(
            "the data dir {} is a standby's ({} exists) and was never promoted: run `etcd-warden standby` on it and promote it (`ctl promote`), which raises its revision above the primary's; or remove {} to start etcd on it as it is (nothing was changed)",
            data.display(),
            m.display(),
            m.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_says_how_far_behind_until_promoted() {
        let mut s = StandbyStatus {
            state: State::Following,
            lag_revisions: 7,
            ..StandbyStatus::default()
        };
        assert_eq!(
            s.not_ready_reason().as_deref(),
            Some("standby, 7 revisions behind")
        );
        s.state = State::Restoring;
        assert!(s.not_ready_reason().is_some_and(|r| r.starts_with("standby")));
        s.state = State::Promoted;
        assert_eq!(s.not_ready_reason(), None);
    }
}

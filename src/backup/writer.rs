//! The single owner: one task holds the delta buffer, the watch, every upload and deletion, so
//! uploads never overlap and retention never races an upload. Its loop waits for a healthy etcd,
//! connects, takes leadership in a cluster, opens the store, finds where the chain starts and
//! streams; the other files of this room are the parts it calls.

use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};

use super::config::BackupConfig;
use super::fencing::Leadership;
use super::handle::{BackupHandle, Control};
use super::leases::LeaseSetAt;
use super::status::BackupStatus;
use crate::backup::leadership::Identity;
use crate::etcd::Health;
use crate::etcd::supervisor::{ChildState, Phase};
use crate::store::head::{Head, Uploaded};

pub(super) enum Outcome {
    Stop(oneshot::Sender<()>),
    NeedFull,
    Reconnect,
    /// Credentials changed: open the store again at once.
    Reopen,
}

pub struct Backup {
    pub(super) cfg: BackupConfig,
    pub(super) status: std::sync::Arc<watch::Sender<BackupStatus>>,
    pub(super) child: watch::Receiver<ChildState>,
    pub(super) health: watch::Receiver<Health>,
    pub(super) full_rx: mpsc::Receiver<()>,
    pub(super) delta_rx: mpsc::Receiver<()>,
    pub(super) control_rx: mpsc::Receiver<Control>,
    pub(super) retry_delay: Duration,
    pub(super) creds_mtime: Option<SystemTime>,
    /// Raised while a defragmentation runs: the health loop holds its verdict meanwhile.
    pub(super) defragmenting: watch::Sender<bool>,
    /// Whether the current client authenticated (auth is enabled in etcd).
    pub(super) authenticated: bool,
    /// A repair found the data too large: its size in use then, and when (no new attempt until
    /// the data shrank or ten minutes passed).
    pub(super) space_refused: Option<(i64, std::time::Instant)>,
    /// The last defragmentation the space keeper started because it paid.
    pub(super) paying_defrag_at: Option<std::time::Instant>,
    /// When this warden last began streaming as the writer: a NOSPACE alarm it finds right after
    /// taking over may be one the previous writer is still clearing (`space::TAKEOVER_GRACE`).
    pub(super) writer_since: std::time::Instant,
    /// `--space-history`: the revisions the store held, to compact to once a window old.
    pub(super) history: crate::space::History,
    /// The membership and auth fingerprint recorded with the current chain's full snapshot.
    pub(super) outside_at_full: Option<String>,
    /// The configured user's token for etcd's auth status (`outside::fingerprint`).
    pub(super) auth_token: Option<String>,
    /// Granted TTLs of the leases seen (`live_leases`).
    pub(super) lease_ttls: std::collections::HashMap<i64, i64>,
    /// A lease set listed at a revision the stream has not reached yet.
    pub(super) lease_set_due: Option<LeaseSetAt>,
    /// The writer's identity, from its last leadership check.
    pub(super) identity: Identity,
    /// What the writer last put in the head object (clusters).
    pub(super) head: Option<Head>,
    /// The raft term of a later writer that wrote the head object over this one's: this warden
    /// writes nothing until its own etcd leads in at least that term.
    pub(super) superseded_in: Option<u64>,
    /// Leadership checks in a row that etcd did not answer (a writer stops at three).
    pub(super) unanswered: u32,
    /// The chain was resumed only to be closed: a full at once, the old chain's deltas carried up
    /// to it (membership or auth changed, or the newest full is older than a schedule period).
    pub(super) full_asap: bool,
    /// The member list last written to the store's cluster record (clusters).
    pub(super) recorded_members: Option<Vec<crate::store::owner::Member>>,
    /// The longest back-off after the last failure (see `STORE_RETRY_MAX`).
    pub(super) retry_cap: Duration,
    /// The running `--kube-encryption-config` check (one at a time; a newer full replaces it).
    pub(super) key_check: Option<tokio::task::JoinHandle<()>>,
    /// `--copy-to`: every object published here is handed to the copies too.
    pub(super) copies: crate::copies::Copies,
}

pub(super) fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

pub(super) const RETRY_MIN: Duration = Duration::from_secs(1);

/// How often the writer looks at the space figures the health loop took (`crate::space`).
pub(super) const SPACE_CHECK: Duration = Duration::from_secs(1);

pub(super) const RETRY_MAX: Duration = Duration::from_secs(30);

/// The cap after a failed store request that moves no snapshot (claim, listing): cheap to repeat,
/// and a writer that just took over must not idle half a minute after the store comes back.
pub(super) const STORE_RETRY_MAX: Duration = Duration::from_secs(5);

impl Backup {
    pub fn new(
        cfg: BackupConfig,
        status: watch::Sender<BackupStatus>,
        child: watch::Receiver<ChildState>,
        health: watch::Receiver<Health>,
        defragmenting: watch::Sender<bool>,
    ) -> (Self, BackupHandle) {
        let (full, full_rx) = mpsc::channel(1);
        let (delta, delta_rx) = mpsc::channel(1);
        let (control, control_rx) = mpsc::channel(4);
        (
            Self {
                cfg,
                status: std::sync::Arc::new(status),
                child,
                health,
                full_rx,
                delta_rx,
                control_rx,
                retry_delay: RETRY_MIN,
                creds_mtime: None,
                defragmenting,
                authenticated: false,
                space_refused: None,
                paying_defrag_at: None,
                writer_since: std::time::Instant::now(),
                history: crate::space::History::default(),
                identity: Identity::default(),
                head: None,
                superseded_in: None,
                unanswered: 0,
                full_asap: false,
                recorded_members: None,
                outside_at_full: None,
                auth_token: None,
                lease_ttls: Default::default(),
                lease_set_due: None,
                retry_cap: RETRY_MAX,
                key_check: None,
                copies: crate::copies::Copies::default(),
            },
            BackupHandle { full, delta, control },
        )
    }

    /// The `--copy-to` copies this writer hands each published object to.
    pub fn with_copies(mut self, copies: crate::copies::Copies) -> Self {
        self.copies = copies;
        self
    }

    /// An object is in the store and published: the copies get it too.
    pub(super) fn published(&self, uploaded: &Uploaded, revision: i64) {
        self.copies.publish(&crate::copies::Published {
            key: uploaded.key.clone(),
            revision,
            at: SystemTime::now(),
        });
    }

    pub(super) fn failed(&mut self, kind: &str, reason: &str, err: &dyn std::error::Error) {
        let msg = crate::telemetry::error_chain(err);
        tracing::error!(kind, reason, error = %msg, "backup failed");
        self.retry_cap = if kind == "store" {
            STORE_RETRY_MAX
        } else {
            RETRY_MAX
        };
        self.status.send_modify(|s| {
            s.healthy = Some(false);
            s.last_error = Some(format!("{kind}: {msg}"));
            s.last_error_at = Some(SystemTime::now());
            s.consecutive_failures += 1;
            *s.failures_total.entry(format!("{kind}:{reason}")).or_default() += 1;
        });
    }

    pub(super) fn succeeded(&mut self) {
        self.retry_delay = RETRY_MIN;
        self.status.send_modify(|s| {
            if s.healthy == Some(false) {
                tracing::info!("backups recovered");
            }
            // An encryption key the newest full needs and the configuration lacks stays a
            // problem until a later full passes.
            s.healthy = Some(s.kube_keys_problem().is_none());
            s.consecutive_failures = 0;
            s.last_success_at = Some(SystemTime::now());
        });
    }

    /// Capped exponential backoff with jitter between failed attempts.
    pub(super) async fn back_off(&mut self) -> Option<Outcome> {
        let delay = self.retry_delay.min(self.retry_cap);
        let d = delay / 2 + delay.mul_f64(fastrand::f64() / 2.0);
        self.retry_delay = (self.retry_delay * 2).min(self.retry_cap);
        tokio::select! {
            Some(c) = self.control_rx.recv() => match c {
                Control::Stop(reply) => Some(Outcome::Stop(reply)),
                Control::Reload => None,
                Control::Reconfigure(cfg) => {
                    self.cfg = *cfg;
                    None
                }
            },
            _ = tokio::time::sleep(d) => None,
        }
    }

    /// Backs off; `true` when a stop request arrived meanwhile (it has been answered).
    pub(super) async fn back_off_or_stop(&mut self) -> bool {
        match self.back_off().await {
            Some(Outcome::Stop(reply)) => {
                let _ = reply.send(());
                true
            }
            _ => false,
        }
    }

    /// Waits until the current etcd is healthy; `Some` when asked to stop meanwhile.
    pub(super) async fn wait_healthy(&mut self) -> Option<oneshot::Sender<()>> {
        loop {
            {
                let c = self.child.borrow_and_update();
                let h = self.health.borrow_and_update();
                if c.phase == Phase::Running && h.healthy && h.incarnation == c.incarnation {
                    return None;
                }
            }
            tokio::select! {
                Some(c) = self.control_rx.recv() => match c {
                    Control::Stop(reply) => return Some(reply),
                    Control::Reload => {}
                    Control::Reconfigure(cfg) => self.cfg = *cfg,
                },
                _ = self.child.changed() => {}
                _ = self.health.changed() => {}
            }
        }
    }

    pub async fn run(mut self) {
        let mut force_full = false;
        loop {
            if let Some(reply) = self.wait_healthy().await {
                let _ = reply.send(());
                return;
            }
            let mut client = match self.cfg.client.connect_auth().await {
                Ok((c, authenticated)) => {
                    self.authenticated = authenticated;
                    c
                }
                Err(err) => {
                    tracing::debug!(error = %err, "backup client not connected yet");
                    if self.back_off_or_stop().await {
                        return;
                    }
                    continue;
                }
            };
            if !self.cfg.cluster
                && crate::backup::leadership::member_count(&mut client)
                    .await
                    .is_some_and(|n| n > 1)
            {
                tracing::info!(
                    "etcd's member list has several members: cluster mode (only the leader's warden writes)"
                );
                self.cfg.cluster = true;
            }
            if self.cfg.cluster {
                match self.wait_leadership(&mut client).await {
                    Leadership::Leader => {}
                    Leadership::Stop(reply) => {
                        let _ = reply.send(());
                        return;
                    }
                    Leadership::Retry => continue,
                }
            }
            if let Some(path) = &self.cfg.credentials {
                self.creds_mtime = mtime(path);
            }
            let opened = self.cfg.open_store();
            let store = match opened {
                Ok(s) => s,
                Err(err) => {
                    self.failed("store", "configure", &err);
                    if self.back_off_or_stop().await {
                        return;
                    }
                    continue;
                }
            };
            if self.cfg.cluster {
                match self.claim_prefix(&mut client, &store).await {
                    Ok(true) => {}
                    Ok(false) | Err(()) => {
                        if self.back_off_or_stop().await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let start = match self.chain_start(&mut client, &store, force_full).await {
                Ok(s) => s,
                Err(()) => {
                    if self.back_off_or_stop().await {
                        return;
                    }
                    continue;
                }
            };
            force_full = false;
            match self.stream(&mut client, &store, start).await {
                Outcome::Stop(reply) => {
                    let _ = reply.send(());
                    return;
                }
                Outcome::NeedFull => force_full = true,
                Outcome::Reopen => {}
                Outcome::Reconnect => {
                    if self.back_off_or_stop().await {
                        return;
                    }
                }
            }
        }
    }
}

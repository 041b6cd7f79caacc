//! The backup loop: one task that owns the delta buffer, the watch and every upload and deletion,
//! so uploads never overlap and retention never races an upload.
//!
//! While etcd is healthy it resumes the newest chain in the store (watching from the chain's last
//! revision + 1) or starts a new one with a full snapshot, then streams deltas. Full snapshots come
//! from the cron schedule, SIGUSR1, a compacted or gapped watch, and an overflowed delta buffer.
//! Every outcome lands in [`BackupStatus`]; none of it touches readiness (rule 1).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, EventType as EtcdEventType, WatchOptions};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use super::delta::{self, DeltaBuffer};
use super::delta_codec::{Event, EventType, Lease, Revision};
use super::{full, outside};
use crate::cluster::leadership::{Identity, LEADERSHIP_CHECK, leads};
use crate::etcd::{ClientConfig, Health};
use crate::store::head::{Head, Uploaded};
use crate::store::layout::Compression;
use crate::store::retention::{self, Policy};
use crate::store::{ChainId, Store, StoreUrl};
use crate::supervisor::{ChildState, Phase};

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
    pub keys: super::crypt::Keys,
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

/// Requests to the backup loop.
#[derive(Debug)]
pub enum Control {
    /// Flush the pending delta, then answer and stop (graceful shutdown).
    Stop(oneshot::Sender<()>),
    /// Re-open the store (credentials re-read) after flushing.
    Reload,
    /// New settings (SIGHUP re-read the config file): flush, then carry on with these.
    Reconfigure(Box<BackupConfig>),
}

/// Handles for other tasks. Full and delta requests coalesce: one pending of each at most.
#[derive(Clone)]
pub struct BackupHandle {
    pub full: mpsc::Sender<()>,
    pub delta: mpsc::Sender<()>,
    pub control: mpsc::Sender<Control>,
}

impl BackupHandle {
    pub fn request_full(&self) -> bool {
        self.full.try_send(()).is_ok()
    }
    pub fn request_delta(&self) -> bool {
        self.delta.try_send(()).is_ok()
    }
    /// Flushes and stops the loop, waiting at most `timeout`.
    pub async fn stop(&self, timeout: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Stop(tx)).await.is_ok()
            && tokio::time::timeout(timeout, rx).await.is_err()
        {
            tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "delta flush did not finish before the stop deadline"
            );
        }
    }
}

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

/// Objects retention would have deleted that an S3 Object Lock keeps (the last pass).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RetentionLocked {
    pub objects: usize,
    /// When the first of them becomes deletable (`None`: only legal holds keep them).
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub next_deletable_at: Option<SystemTime>,
}

impl RetentionLocked {
    pub fn of(applied: &retention::Applied) -> Option<Self> {
        (!applied.locked.is_empty()).then(|| Self {
            objects: applied.locked.len(),
            next_deletable_at: applied.next_deletable(),
        })
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

enum Outcome {
    Stop(oneshot::Sender<()>),
    NeedFull,
    Reconnect,
    /// Credentials changed: open the store again at once.
    Reopen,
}

pub struct Backup {
    cfg: BackupConfig,
    status: std::sync::Arc<watch::Sender<BackupStatus>>,
    child: watch::Receiver<ChildState>,
    health: watch::Receiver<Health>,
    full_rx: mpsc::Receiver<()>,
    delta_rx: mpsc::Receiver<()>,
    control_rx: mpsc::Receiver<Control>,
    retry_delay: Duration,
    creds_mtime: Option<SystemTime>,
    /// Raised while a defragmentation runs: the health loop holds its verdict meanwhile.
    defragmenting: watch::Sender<bool>,
    /// Whether the current client authenticated (auth is enabled in etcd).
    authenticated: bool,
    /// A repair found the data too large: its size in use then, and when (no new attempt until
    /// the data shrank or ten minutes passed).
    space_refused: Option<(i64, std::time::Instant)>,
    /// The last defragmentation the space keeper started because it paid.
    paying_defrag_at: Option<std::time::Instant>,
    /// `--space-history`: the revisions the store held, to compact to once a window old.
    history: crate::space::History,
    /// The membership and auth fingerprint recorded with the current chain's full snapshot.
    outside_at_full: Option<String>,
    /// The configured user's token for etcd's auth status (`outside::fingerprint`).
    auth_token: Option<String>,
    /// Granted TTLs of the leases seen (`live_leases`).
    lease_ttls: std::collections::HashMap<i64, i64>,
    /// A lease set listed at a revision the stream has not reached yet.
    lease_set_due: Option<LeaseSetAt>,
    /// The writer's identity, from its last leadership check.
    identity: Identity,
    /// What the writer last put in the head object (clusters).
    head: Option<Head>,
    /// The raft term of a later writer that wrote the head object over this one's: this warden
    /// writes nothing until its own etcd leads in at least that term.
    superseded_in: Option<u64>,
    /// Leadership checks in a row that etcd did not answer (a writer stops at three).
    unanswered: u32,
    /// The chain was resumed only to be closed: a full at once, the old chain's deltas carried up
    /// to it (membership or auth changed, or the newest full is older than a schedule period).
    full_asap: bool,
    /// The member list last written to the store's cluster record (clusters).
    recorded_members: Option<Vec<crate::store::owner::Member>>,
    /// The longest back-off after the last failure (see `STORE_RETRY_MAX`).
    retry_cap: Duration,
    /// The running `--kube-encryption-config` check (one at a time; a newer full replaces it).
    key_check: Option<tokio::task::JoinHandle<()>>,
    /// `--copy-to`: every object published here is handed to the copies too.
    copies: crate::copies::Copies,
}

fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

const RETRY_MIN: Duration = Duration::from_secs(1);
/// How often the writer looks at the space figures the health loop took (`crate::space`).
const SPACE_CHECK: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The cap after a failed store request that moves no snapshot (claim, listing): cheap to repeat,
/// and a writer that just took over must not idle half a minute after the store comes back.
const STORE_RETRY_MAX: Duration = Duration::from_secs(5);

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
    fn published(&self, uploaded: &Uploaded, revision: i64) {
        self.copies.publish(&crate::copies::Published {
            key: uploaded.key.clone(),
            revision,
            at: SystemTime::now(),
        });
    }

    fn failed(&mut self, kind: &str, reason: &str, err: &dyn std::error::Error) {
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

    fn succeeded(&mut self) {
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
    async fn back_off(&mut self) -> Option<Outcome> {
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
    async fn back_off_or_stop(&mut self) -> bool {
        match self.back_off().await {
            Some(Outcome::Stop(reply)) => {
                let _ = reply.send(());
                true
            }
            _ => false,
        }
    }

    /// Waits until the current etcd is healthy; `Some` when asked to stop meanwhile.
    async fn wait_healthy(&mut self) -> Option<oneshot::Sender<()>> {
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
                && crate::cluster::leadership::member_count(&mut client)
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

    /// Before a cluster's writer writes: the prefix is claimed for this cluster (create-if-absent)
    /// or already is; its member list is kept current there. `Ok(false)`: another cluster owns
    /// the prefix, so nothing is written (said in /status and metrics; readiness is untouched).
    async fn claim_prefix(&mut self, client: &mut Client, store: &Store) -> Result<bool, ()> {
        let Some(members) = members_of(client).await else {
            tracing::debug!("cannot list the members before claiming the prefix");
            return Err(());
        };
        let now = crate::store::layout::now_ms();
        let ours = crate::store::owner::Owner {
            format: 1,
            cluster_id: self.identity.cluster_id,
            claimed_by: format!("{} ({:x})", self.cfg.member_name, self.identity.member_id),
            claimed_ms: now,
            members: members.clone(),
            updated_ms: now,
        };
        let owner = match store.claim(&ours).await {
            Ok(o) => o,
            Err(e) => {
                self.failed("store", "claim", &e);
                return Err(());
            }
        };
        // A cluster restored by the store's current plan takes over the record of the cluster it
        // replaces (its own marker says it restored by that plan).
        if owner.cluster_id != self.identity.cluster_id
            && let Ok(Some(plan)) = store.current_plan().await
            && plan.previous_cluster_id == owner.cluster_id
            && crate::cluster::restore::marker(&self.cfg.data_dir).is_some_and(|m| m.plan == plan.id)
        {
            tracing::warn!(plan = %plan.id, previous = format!("{:x}", owner.cluster_id), now = format!("{:x}", self.identity.cluster_id), "this cluster was restored by the store's cluster restore plan: it takes over the prefix");
            let ours = crate::store::owner::Owner {
                claimed_by: format!("{} after cluster restore plan {}", ours.claimed_by, plan.id),
                ..ours
            };
            if let Err(e) = store.put_owner(&ours).await {
                self.failed("store", "claim", &e);
                return Err(());
            }
            self.status.send_modify(|s| s.foreign_prefix = None);
            return Ok(true);
        }
        if owner.cluster_id != self.identity.cluster_id {
            let why = format!(
                "the store prefix belongs to etcd cluster {:x} (claimed by {}), this is cluster {:x}: writing nothing there (point --store at this cluster's own prefix)",
                owner.cluster_id, owner.claimed_by, self.identity.cluster_id
            );
            tracing::error!("{why}");
            self.status.send_modify(|s| {
                s.foreign_prefix = Some(why.clone());
                s.healthy = Some(false);
                s.last_error = Some(why);
            });
            return Ok(false);
        }
        self.status.send_modify(|s| s.foreign_prefix = None);
        if owner.members == members {
            self.recorded_members = Some(members);
        } else {
            self.keep_members_current(client, store).await;
        }
        Ok(true)
    }

    /// The writer's head object after an upload (clusters only): one small PUT. A failure is
    /// logged and left to the next upload; it never fails the backup.
    async fn put_head(
        &mut self,
        store: &Store,
        chain: ChainId,
        revision: i64,
        full: Option<Uploaded>,
        delta: Option<Uploaded>,
    ) {
        if !self.cfg.cluster {
            return;
        }
        let prev = self.head.take().filter(|h| h.chain == chain || full.is_some());
        let head = Head {
            format: 1,
            cluster_id: self.identity.cluster_id,
            member_id: self.identity.member_id,
            member_name: self.cfg.member_name.clone(),
            raft_term: self.identity.raft_term,
            chain,
            last_revision: revision,
            last_full: full.or_else(|| prev.as_ref().and_then(|h| h.last_full.clone())),
            last_delta: delta.or_else(|| prev.as_ref().and_then(|h| h.last_delta.clone())),
            updated_ms: crate::store::layout::now_ms(),
        };
        match store.put_head(&head).await {
            Ok(crate::store::head::HeadWrite::Written) => {}
            Ok(crate::store::head::HeadWrite::Superseded(theirs)) => {
                tracing::warn!(
                    writer = %theirs.member_name,
                    their_term = theirs.raft_term,
                    our_term = head.raft_term,
                    "a writer of a later raft term wrote the head object: this member no longer leads; writing nothing more"
                );
                self.superseded_in = Some(theirs.raft_term);
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot update the head object; the next upload tries again");
            }
        }
        self.head = Some(head);
    }

    /// Whether this writer still leads, asked of its etcd right now (clusters; a single member
    /// always writes): a timeout counts as no.
    async fn still_leads(&mut self, client: &mut Client) -> bool {
        if !self.cfg.cluster {
            return true;
        }
        match leads(client).await {
            Some(Ok(me)) if self.superseded_in.is_none_or(|t| me.raft_term > t) => {
                self.identity = me;
                self.superseded_in = None;
                true
            }
            _ => false,
        }
    }

    /// The member list in the store's cluster record follows etcd's (joins, rejoins with a new
    /// id, leaves): what `cluster restore` reads to know the members. One etcd call per check, a
    /// store write only when the list changed.
    async fn keep_members_current(&mut self, client: &mut Client, store: &Store) {
        let Some(members) = members_of(client).await else {
            return;
        };
        if self.recorded_members.as_ref() == Some(&members) {
            return;
        }
        let result = async {
            let Some(owner) = store.get_owner().await? else {
                return Ok(false);
            };
            if owner.cluster_id != self.identity.cluster_id {
                return Ok(false);
            }
            if owner.members != members {
                store
                    .put_owner(&crate::store::owner::Owner {
                        members: members.clone(),
                        updated_ms: crate::store::layout::now_ms(),
                        ..owner
                    })
                    .await?;
                tracing::info!(
                    members = ?members.iter().map(|m| format!("{} {:x}{}", m.name, m.id, if m.is_learner { " learner" } else { "" })).collect::<Vec<_>>(),
                    "membership changed: the store's member list updated"
                );
            }
            Ok::<bool, crate::store::StoreError>(true)
        }
        .await;
        match result {
            Ok(true) => self.recorded_members = Some(members),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot update the member list in the store; trying again")
            }
        }
    }

    /// A follower's view of the backups: the writer's head object, read once per delta period.
    async fn follow_head(&mut self) {
        let head = match self.cfg.open_store() {
            Ok(store) => store.get_head().await,
            Err(e) => Err(e),
        };
        match head {
            Ok(Some(h)) => {
                let at = |ms: u64| Some(std::time::UNIX_EPOCH + Duration::from_millis(ms));
                self.status.send_modify(|s| {
                    s.writer = Some(format!("{} ({:x})", h.member_name, h.member_id));
                    s.backed_up_revision = Some(h.last_revision);
                    s.chain_base = Some(h.chain.base);
                    s.last_success_at = at(h.updated_ms);
                    let info = |u: &Uploaded| SnapInfo {
                        key: u.key.clone(),
                        revision: u.revision,
                        at: at(u.at_ms),
                        stored_bytes: 0,
                        raw_bytes: 0,
                        duration_seconds: 0.0,
                    };
                    s.last_full = h.last_full.as_ref().map(info);
                    s.last_delta = h.last_delta.as_ref().map(info);
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %crate::telemetry::error_chain(&e), "cannot read the head object")
            }
        }
    }

    /// In a cluster, waits while this member's etcd does not lead (checked every second): one
    /// writer per cluster, whose chain the next leader's warden continues from the store.
    async fn wait_leadership(&mut self, client: &mut Client) -> Leadership {
        let mut said = None;
        let mut last_read = None;
        let head_every = self.cfg.delta_period.max(LEADERSHIP_CHECK);
        loop {
            match leads(client).await {
                Some(Ok(me)) if self.superseded_in.is_some_and(|t| me.raft_term <= t) => {
                    if said != Some(u64::MAX) {
                        tracing::warn!(
                            term = me.raft_term,
                            head_term = self.superseded_in,
                            "this member's etcd says it leads, in a raft term the head object's writer already passed: following"
                        );
                        said = Some(u64::MAX);
                    }
                    self.status.send_modify(|s| s.role = Some("follower".into()));
                }
                Some(Ok(me)) => {
                    self.identity = me;
                    self.superseded_in = None;
                    self.unanswered = 0;
                    self.recorded_members = None;
                    tracing::info!("this member's etcd leads: writing backups");
                    let name = format!("{} ({:x})", self.cfg.member_name, me.member_id);
                    self.status.send_modify(|s| {
                        s.role = Some("writer".into());
                        s.writer = Some(name);
                    });
                    return Leadership::Leader;
                }
                Some(Err(leader)) => {
                    if last_read.is_none_or(|t: tokio::time::Instant| t.elapsed() >= head_every) {
                        last_read = Some(tokio::time::Instant::now());
                        self.follow_head().await;
                    }
                    if said != Some(leader) {
                        tracing::info!(
                            leader = format!("{leader:x}"),
                            "another member leads: its warden writes backups; following"
                        );
                        said = Some(leader);
                    }
                    self.status.send_modify(|s| {
                        s.role = Some("follower".into());
                        s.pending_delta_bytes = 0;
                        s.pending_delta_events = 0;
                    });
                }
                None => return Leadership::Retry,
            }
            tokio::select! {
                Some(c) = self.control_rx.recv() => match c {
                    Control::Stop(reply) => return Leadership::Stop(reply),
                    Control::Reload => {}
                    Control::Reconfigure(cfg) => self.cfg = *cfg,
                },
                _ = tokio::time::sleep(LEADERSHIP_CHECK) => {}
            }
        }
    }

    /// Where the chain continues: `(chain, after)` — resume the newest chain, or take a full.
    async fn chain_start(
        &mut self,
        client: &mut Client,
        store: &Store,
        force_full: bool,
    ) -> Result<(ChainId, i64), ()> {
        if !force_full {
            match self.resume_point(client, store).await {
                Ok(Some(p)) => {
                    // The store answered: a failure before (e.g. rejected credentials) is over.
                    if self.status.borrow().healthy == Some(false) {
                        self.succeeded();
                    }
                    return Ok(p);
                }
                Ok(None) => {}
                Err(err) => {
                    self.failed("store", "list", &err);
                    return Err(());
                }
            }
        }
        self.full_asap = false;
        match self.take_full(client, store).await {
            Ok(chain) => Ok((chain, chain.base)),
            Err(()) => Err(()),
        }
    }

    async fn resume_point(
        &mut self,
        client: &mut Client,
        store: &Store,
    ) -> Result<Option<(ChainId, i64)>, crate::store::StoreError> {
        let Some((newest, chain)) = store.newest_chain().await? else {
            tracing::info!("the store has no full snapshot yet: taking one");
            return Ok(None);
        };
        let base = newest.last_revision();
        let Some(chain_id) = newest.chain() else {
            return Ok(None);
        };
        let after = chain.last().map(|(n, _)| n.last_revision()).unwrap_or(base);
        // A restore (or a promotion, a rollback) bumped etcd's data past the chain's end and
        // marked everything below compacted: those revisions never existed, so this is no chain
        // break but a new history, which starts a new chain.
        if let Some(r) = crate::restore::marker::read(&self.cfg.data_dir)
            && after < r.served_revision
        {
            tracing::info!(
                chain_last = after,
                backed_up_revision = r.backed_up_revision,
                served_revision = r.served_revision,
                "etcd's data was restored and its revision bumped: a new chain starts with a full snapshot"
            );
            return Ok(None);
        }
        // A status that fails says nothing about etcd being behind: the stream finds out.
        let current = client
            .status()
            .await
            .ok()
            .and_then(|s| s.header().map(|h| h.revision()))
            .unwrap_or(after);
        if let Some(period) = self.schedule_period() {
            let age = SystemTime::now()
                .duration_since(newest.created())
                .unwrap_or_default();
            if age > period {
                tracing::info!(
                    age_s = age.as_secs(),
                    "the newest full snapshot is older than one schedule period: taking one"
                );
                if current < after {
                    return Ok(None);
                }
                self.full_asap = true;
            }
        }
        if current < after {
            tracing::warn!(
                current,
                chain_last = after,
                "etcd is behind the store's newest chain: starting a new chain"
            );
            return Ok(None);
        }
        // Membership or auth changed since that full (while no warden watched): a new full now.
        let header =
            crate::store::format::read_header(store.inner.as_ref(), &newest.key(), &store.keys.signing)
                .await
                .ok();
        // A cluster's chain is its own: after a cluster restore (a new cluster id) the first
        // writer starts one with a full, never continuing the lost cluster's.
        if self.cfg.cluster
            && let Some(h) = &header
            && h.cluster_id != 0
            && h.cluster_id != self.identity.cluster_id
        {
            tracing::info!(
                newest_full_cluster = format!("{:x}", h.cluster_id),
                this_cluster = format!("{:x}", self.identity.cluster_id),
                "the newest full snapshot is another cluster's: taking one"
            );
            return Ok(None);
        }
        let recorded = header.and_then(|h| h.outside);
        let now = outside::fingerprint(client, &self.cfg.client, self.authenticated, &mut self.auth_token)
            .await
            .ok();
        if let (Some(then), Some(now)) = (&recorded, &now)
            && then != now
        {
            tracing::info!(
                after,
                "etcd's membership or auth changed since the newest full snapshot: taking one, the new chain's deltas from the old chain's end"
            );
            self.full_asap = true;
        }
        self.outside_at_full = recorded.or(now);
        tracing::info!(base, after, "resuming the newest backup chain");
        self.status.send_modify(|s| {
            s.chain_base = Some(base);
            s.backed_up_revision = Some(after);
        });
        Ok(Some((chain_id, after)))
    }

    fn schedule_period(&self) -> Option<Duration> {
        let cron = self.cfg.full_schedule.as_ref()?;
        let now = chrono::Utc::now();
        let next = cron.find_next_occurrence(&now, false).ok()?;
        let prev = cron.find_previous_occurrence(&now, false).ok()?;
        (next - prev).to_std().ok()
    }

    fn next_full_at(&self) -> Option<tokio::time::Instant> {
        next_at(self.cfg.full_schedule.as_ref()?)
    }

    /// Defragments etcd's backend. While it runs etcd answers nothing, so the health loop is told
    /// to hold its verdict (rule 1: a single member's readiness is not a defrag's business).
    /// `true`: this member's leadership was moved away for it (the caller hands over).
    async fn defrag(&mut self, client: &mut Client) -> bool {
        // A cluster's writer defragments the followers first, one at a time and only while every
        // member is healthy, and its own member (the leader) last, once leadership moved to a
        // follower: a blocked leader would stall every write until an election.
        let mut moved = false;
        if self.cfg.cluster {
            let Some(followers) = self.defrag_followers(client).await else {
                return false;
            };
            if let Some(target) = followers.first() {
                match crate::space::keeper::move_leader(client, *target).await {
                    Ok(()) => {
                        tracing::info!(
                            to = format!("{target:x}"),
                            "leadership moved to a defragmented follower before defragmenting this member"
                        );
                        moved = true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot move leadership away: defragmenting this member as the leader")
                    }
                }
            }
        }
        let size = |c: &mut Client| {
            let mut c = c.clone();
            async move { c.status().await.map(|s| s.db_size()).unwrap_or(0) }
        };
        let before = size(client).await;
        tracing::info!(db_size = before, "defragmenting etcd");
        let started = std::time::Instant::now();
        self.defragmenting.send_replace(true);
        // Its own connection: the answer comes only when the defrag is done, far beyond the
        // health timeout that bounds the shared client's requests.
        let mut long = self.cfg.client.clone();
        long.timeout = Duration::from_secs(1800);
        let result = match long.connect().await {
            Ok(mut c) => c.defragment().await.map(drop).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        self.defragmenting.send_replace(false);
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(_) => {
                let after = size(client).await;
                tracing::info!(
                    db_size_before = before,
                    db_size_after = after,
                    seconds = took,
                    "defragmentation done"
                );
                self.status.send_modify(|s| {
                    s.defrags_total += 1;
                    s.last_defrag = Some(DefragInfo {
                        at: Some(SystemTime::now()),
                        duration_seconds: took,
                        db_size_before: before,
                        db_size_after: after,
                    });
                });
            }
            Err(err) => {
                tracing::error!(error = %err, "defragmentation failed");
                self.status.send_modify(|s| {
                    *s.failures_total.entry("defrag:etcd".into()).or_default() += 1;
                    s.last_error = Some(format!("defrag: {err}"));
                    s.last_error_at = Some(SystemTime::now());
                });
            }
        }
        moved
    }

    /// The followers' part of a cluster's defragmentation: the voters defragmented; `None` when it
    /// did not happen (a member unhealthy or unreachable, or a defrag failed), and the leader's own
    /// is then skipped too.
    async fn defrag_followers(&mut self, client: &mut Client) -> Option<Vec<u64>> {
        let members = match client.member_list().await {
            Ok(r) => r.members().to_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the members: no defragmentation this time");
                return None;
            }
        };
        let me = self.identity.member_id;
        let mut followers = Vec::new();
        for m in members.iter().filter(|m| m.id() != me) {
            let mut cfg = self.cfg.client.clone();
            cfg.endpoints = m.client_urls().to_vec();
            let healthy = match cfg.connect().await {
                Ok(mut c) => match c.status().await {
                    // A NOSPACE alarm is no reason to hold back: the repair is what ends it.
                    Ok(s) if s.leader() != 0 && s.errors().iter().all(|e| e.contains("NOSPACE")) => Some(c),
                    _ => None,
                },
                Err(_) => None,
            };
            match healthy {
                Some(_) if cfg.endpoints.is_empty() => {}
                Some(_) => followers.push((m.name().to_owned(), cfg, m.id(), m.is_learner())),
                None => {
                    tracing::warn!(
                        member = m.name(),
                        "a member is not healthy: no defragmentation of the cluster this time"
                    );
                    return None;
                }
            }
        }
        let mut voters = Vec::new();
        for (name, mut cfg, id, learner) in followers {
            cfg.timeout = Duration::from_secs(1800);
            let started = std::time::Instant::now();
            tracing::info!(member = %name, "defragmenting a follower");
            let result = match cfg.connect().await {
                Ok(mut c) => c.defragment().await.map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => {
                    tracing::info!(member = %name, seconds = started.elapsed().as_secs_f64(), "follower defragmented");
                    if !learner {
                        voters.push(id);
                    }
                }
                Err(err) => {
                    tracing::error!(member = %name, error = %err, "defragmenting a follower failed: the rest of the cluster waits for the next schedule");
                    self.status.send_modify(|s| {
                        *s.failures_total.entry("defrag:etcd".into()).or_default() += 1;
                        s.last_error = Some(format!("defrag of {name}: {err}"));
                        s.last_error_at = Some(SystemTime::now());
                    });
                    return None;
                }
            }
        }
        Some(voters)
    }

    /// The writer's part of keeping space (`crate::space`), between snapshots: NOSPACE repaired,
    /// and a defragmentation when the free pages make it pay. `true`: leadership moved away for a
    /// defragmentation (hand over).
    async fn keep_space(&mut self, client: &mut Client, store: &Store, buf: &mut DeltaBuffer) -> bool {
        if !self.cfg.space.enabled {
            return false;
        }
        let Some(sample) = self.health.borrow().space.clone() else {
            return false;
        };
        if sample.nospace {
            if let Some((in_use, at)) = self.space_refused
                && sample.db_size_in_use >= in_use
                && at.elapsed() < Duration::from_secs(600)
            {
                return false;
            }
            return self.repair_nospace(client, store, buf, sample).await;
        }
        if let Some(why) = self.cfg.space.defrag_pays(&sample)
            && self
                .paying_defrag_at
                .is_none_or(|t| t.elapsed() > Duration::from_secs(600))
        {
            tracing::info!(
                db_size = sample.db_size,
                in_use = sample.db_size_in_use,
                seconds_to_nospace = sample.seconds_to_nospace,
                "{why}"
            );
            self.paying_defrag_at = Some(std::time::Instant::now());
            return self.defrag(client).await;
        }
        false
    }

    /// `--space-history`: compacts what is older than the window, never past the revision the
    /// store held a window ago (so never past what the delta chain holds: the watch that feeds it
    /// starts above that revision, and a compaction cannot cancel it).
    async fn compact_history(&mut self, client: &mut Client) {
        let Some(window) = self.cfg.space.history else {
            return;
        };
        let Some(backed_up) = self.status.borrow().backed_up_revision else {
            return;
        };
        let Some(target) = self.history.target(std::time::Instant::now(), backed_up, window) else {
            return;
        };
        match crate::space::keeper::compact_to(client, target, false).await {
            Ok(done) => {
                self.history.compacted(target);
                if done.is_some() {
                    tracing::debug!(revision = target, "history older than --space-history compacted");
                    self.status.send_modify(|s| {
                        s.space_compactions_total += 1;
                        s.space_compacted_revision = Some(target);
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "compaction for --space-history failed; trying again at the next look")
            }
        }
    }

    /// NOSPACE: compact to the newest revision the store holds (every write up to it is backed up,
    /// so nothing is lost), defragment member by member, disarm; or say the data is too large.
    async fn repair_nospace(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        sample: crate::space::Sample,
    ) -> bool {
        let started = std::time::Instant::now();
        tracing::warn!(
            db_size = sample.db_size,
            in_use = sample.db_size_in_use,
            quota = sample.quota,
            "etcd raised NOSPACE: repairing (compaction to the backed-up revision, defragmentation, disarm)"
        );
        // What etcd sent so far goes to the store first: the compaction stops at what it holds.
        self.flush(store, buf).await;
        let backed_up = self.status.borrow().backed_up_revision;
        let compacted_to = match backed_up {
            Some(r) => match crate::space::keeper::compact_to(client, r, true).await {
                Ok(done) => {
                    self.history.compacted(r);
                    done
                }
                Err(e) => {
                    tracing::error!(error = %e, "NOSPACE repair: compaction failed");
                    None
                }
            },
            None => {
                tracing::warn!("NOSPACE repair: no revision is backed up yet, so nothing is compacted");
                None
            }
        };
        let moved = self.defrag(client).await;
        let after = match client.status().await {
            Ok(s) => (s.db_size(), s.raft_used_db_size()),
            Err(_) => (sample.db_size, sample.db_size_in_use),
        };
        let verdict = crate::space::after_repair(after.1, sample.quota, compacted_to.or(backed_up));
        let disarmed = match &verdict {
            Ok(()) => match crate::space::keeper::disarm_nospace(client).await {
                Ok(n) => {
                    tracing::info!(alarms = n, "NOSPACE disarmed");
                    self.space_refused = None;
                    true
                }
                Err(e) => {
                    tracing::error!(error = %e, "NOSPACE repair: disarming failed");
                    false
                }
            },
            Err(problem) => {
                tracing::error!("{problem}");
                self.space_refused = Some((after.1, std::time::Instant::now()));
                false
            }
        };
        let repair = crate::space::Repair {
            at: Some(SystemTime::now()),
            compacted_to,
            db_size_before: sample.db_size,
            db_size_after: after.0,
            db_size_in_use_after: after.1,
            quota: sample.quota,
            seconds: started.elapsed().as_secs_f64(),
            disarmed,
            problem: verdict.err(),
        };
        tracing::info!(
            compacted_to,
            db_size_before = repair.db_size_before,
            db_size_after = repair.db_size_after,
            seconds = repair.seconds,
            disarmed,
            "NOSPACE repair done"
        );
        self.status.send_modify(|s| {
            s.space_repairs_total += 1;
            s.last_space_repair = Some(repair);
        });
        moved
    }

    /// One full snapshot, with status, metrics and retention. `Ok(the chain it starts)` on success.
    async fn take_full(&mut self, client: &mut Client, store: &Store) -> Result<ChainId, ()> {
        let status = self.status.clone();
        let progress = crate::telemetry::Progress::to(move |what| {
            status.send_modify(|s| s.in_progress = what);
        });
        let outside = match outside::fingerprint(
            client,
            &self.cfg.client,
            self.authenticated,
            &mut self.auth_token,
        )
        .await
        {
            Ok(fp) => Some(fp),
            Err(e) => {
                tracing::warn!(error = ?e, "cannot read etcd's membership and auth state; the full snapshot records none");
                None
            }
        };
        let result = full::take_full(
            client,
            store,
            self.cfg.compression,
            false,
            outside.clone(),
            None,
            &progress,
        )
        .await;
        progress.done();
        // Published (the head, retention) only while this writer still leads. A full that finished
        // after leadership moved stays in the store, a valid older point of the same history (the
        // next writer may already continue its chain), but never becomes the head, and a restore
        // prefers the chain the next writer extends past it (`layout::live_chain`).
        if let Ok(r) = &result
            && !self.still_leads(client).await
        {
            tracing::warn!(full = %r.name.key(), "this member lost leadership while its full snapshot uploaded: not publishing it (no head, no retention)");
            return Err(());
        }
        match result {
            Ok(r) => {
                let rev = r.name.last_revision();
                self.succeeded();
                self.status.send_modify(|s| {
                    s.last_full = Some(SnapInfo {
                        key: r.name.key(),
                        revision: rev,
                        at: Some(SystemTime::now()),
                        stored_bytes: r.stored_bytes,
                        raw_bytes: r.raw_bytes,
                        duration_seconds: r.duration.as_secs_f64(),
                    });
                    s.fulls_total += 1;
                    s.chain_base = Some(rev);
                    s.backed_up_revision = Some(s.backed_up_revision.unwrap_or(0).max(rev));
                });
                self.outside_at_full = outside;
                let chain = ChainId {
                    base: rev,
                    base_created_ms: r.name.created_ms,
                };
                let full = Uploaded {
                    key: r.name.key(),
                    revision: rev,
                    at_ms: r.name.created_ms,
                };
                self.published(&full, rev);
                self.put_head(store, chain, rev, Some(full), None).await;
                if self.superseded_in.is_none() {
                    self.apply_retention(store).await;
                }
                self.check_kube_keys(client, &r.name.key(), rev);
                Ok(chain)
            }
            Err(err) => {
                self.failed("full", err.reason(), &err);
                Err(())
            }
        }
    }

    /// `--kube-encryption-config`: in the background (it reads every value once, page by page), the
    /// key names the full's encrypted values need, against the configuration's.
    fn check_kube_keys(&mut self, client: &Client, full: &str, revision: i64) {
        let Some(config) = self.cfg.kube_encryption_config.clone() else {
            return;
        };
        if let Some(old) = self.key_check.take() {
            old.abort();
        }
        let (mut client, status, full) = (client.clone(), self.status.clone(), full.to_owned());
        self.key_check = Some(tokio::spawn(async move {
            let check = crate::kube::encryption::check_full(&mut client, &config, &full, revision).await;
            match check.problem() {
                Some(problem) => tracing::error!(full, problem, "backup cannot be decrypted"),
                None => tracing::info!(
                    full,
                    needed = ?check.needed,
                    revision = check.checked_revision,
                    "kube encryption keys: the configuration holds every key the full needs"
                ),
            }
            status.send_modify(|s| {
                if let Some(problem) = check.problem() {
                    s.healthy = Some(false);
                    s.last_error = Some(problem);
                    s.last_error_at = Some(SystemTime::now());
                } else if s.kube_keys_problem().is_some() && s.consecutive_failures == 0 {
                    s.healthy = Some(true);
                }
                s.kube_keys = Some(check);
            });
        }));
    }

    async fn apply_retention(&mut self, store: &Store) {
        let result: Result<retention::Applied, crate::store::StoreError> = async {
            // A cluster restore plan not yet applied by every member keeps its chain.
            let mut pinned: Vec<ChainId> = match store.current_plan().await? {
                Some(plan) if !store.retire_plan_if_applied(&plan).await? => {
                    plan.chain().into_iter().collect()
                }
                _ => Vec::new(),
            };
            // Objects a copy has not got yet stay until it has (a copy catching up after an outage).
            pinned.extend(self.copies.pinned_chains());
            retention::apply(store, self.cfg.retention, self.cfg.rollback_retention, &pinned).await
        }
        .await;
        match result {
            Ok(applied) => {
                if applied.deleted > 0 {
                    tracing::info!(deleted = applied.deleted, "retention removed old snapshots");
                }
                self.status
                    .send_modify(|s| s.retention_locked = RetentionLocked::of(&applied));
            }
            Err(err) => self.failed("retention", "store", &err),
        }
    }

    /// Flushes the buffer. On failure the events go back into the buffer for the next attempt.
    async fn flush(&mut self, store: &Store, buf: &mut DeltaBuffer) -> bool {
        let Some(pending) = buf.take() else { return true };
        let writer = delta::Writer {
            cluster_id: self.identity.cluster_id,
            member_id: self.identity.member_id,
            raft_term: self.identity.raft_term,
            etcd_version: self.health.borrow().version.clone().unwrap_or_default(),
        };
        match delta::upload(store, &pending, self.cfg.compression, writer).await {
            Ok(r) => {
                self.succeeded();
                self.status.send_modify(|s| {
                    s.last_delta = Some(SnapInfo {
                        key: r.name.key(),
                        revision: pending.last,
                        at: Some(SystemTime::now()),
                        stored_bytes: r.stored_bytes,
                        raw_bytes: r.raw_bytes,
                        duration_seconds: r.duration.as_secs_f64(),
                    });
                    s.deltas_total += 1;
                    s.backed_up_revision = Some(pending.last);
                    s.pending_delta_bytes = buf.len() as u64;
                    s.pending_delta_events = buf.pending_events();
                });
                let delta = Uploaded {
                    key: r.name.key(),
                    revision: pending.last,
                    at_ms: r.name.created_ms,
                };
                self.published(&delta, pending.last);
                self.put_head(store, pending.chain, pending.last, None, Some(delta))
                    .await;
                true
            }
            Err(err) => {
                self.failed("delta", err.reason(), &err);
                buf.restore(pending);
                false
            }
        }
    }

    async fn stream(
        &mut self,
        client: &mut Client,
        store: &Store,
        (chain, after): (ChainId, i64),
    ) -> Outcome {
        let mut buf = DeltaBuffer::new(chain, after);
        let deltas_on = !self.cfg.delta_period.is_zero();
        let mut watch = if deltas_on {
            let opts = WatchOptions::new()
                .with_all_keys()
                .with_start_revision(buf.last() + 1);
            let mut wc = client.watch_client().max_decoding_message_size(64 * 1024 * 1024);
            match wc.watch(vec![0u8], Some(opts)).await {
                Ok(w) => Some(w),
                Err(err) => {
                    tracing::warn!(error = %err, "failed to open the watch for deltas");
                    return Outcome::Reconnect;
                }
            }
        } else {
            None
        };
        let period = if deltas_on {
            self.cfg.delta_period
        } else {
            Duration::from_secs(3600)
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_full = self.next_full_at();
        let mut next_defrag = self.cfg.defrag_schedule.as_ref().and_then(next_at);
        let mut chain_full_not_before = tokio::time::Instant::now();
        let mut leadership = tokio::time::interval(LEADERSHIP_CHECK);
        leadership.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut space = tokio::time::interval(SPACE_CHECK);
        space.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut history = tokio::time::interval(crate::space::History::every(
            self.cfg.space.history.unwrap_or(Duration::from_secs(600)),
        ));
        history.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if std::mem::take(&mut self.full_asap)
                && let Some(o) = self.full_during_stream(client, store, &mut buf).await
            {
                return o;
            }
            if self.cfg.full_after_revisions > 0
                && buf.is_empty()
                && buf.last() - buf.base() >= self.cfg.full_after_revisions
                && tokio::time::Instant::now() >= chain_full_not_before
            {
                tracing::info!(
                    revisions = buf.last() - buf.base(),
                    limit = self.cfg.full_after_revisions,
                    "the chain reached --full-snapshot-after-revisions: starting a new one"
                );
                chain_full_not_before = tokio::time::Instant::now() + period;
                if let Some(o) = self.full_during_stream(client, store, &mut buf).await {
                    return o;
                }
            }
            let full_due = async {
                match next_full {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let defrag_due = async {
                match next_defrag {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let watch_msg = async {
                match watch.as_mut() {
                    Some(w) => w.message().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                Some(c) = self.control_rx.recv() => match c {
                    Control::Stop(reply) => {
                        self.catch_up(client, store, &mut buf, &mut watch).await;
                        self.flush(store, &mut buf).await;
                        return Outcome::Stop(reply);
                    }
                    Control::Reload => {
                        self.flush(store, &mut buf).await;
                        return Outcome::Reconnect;
                    }
                    Control::Reconfigure(cfg) => {
                        self.flush(store, &mut buf).await;
                        tracing::info!("backup settings reloaded");
                        self.cfg = *cfg;
                        return Outcome::Reopen;
                    }
                },
                Some(()) = self.delta_rx.recv() => {
                    self.flush(store, &mut buf).await;
                }
                Some(()) = self.full_rx.recv() => {
                    if let Some(o) = self.full_during_stream(client, store, &mut buf).await { return o; }
                }
                _ = defrag_due => {
                    let moved = self.defrag(client).await;
                    next_defrag = self.cfg.defrag_schedule.as_ref().and_then(next_at);
                    if moved {
                        self.flush(store, &mut buf).await;
                        self.status.send_modify(|s| s.role = Some("follower".into()));
                        return Outcome::Reconnect;
                    }
                }
                _ = history.tick(), if self.cfg.space.history.is_some() => {
                    self.compact_history(client).await;
                }
                _ = space.tick() => {
                    if self.keep_space(client, store, &mut buf).await {
                        self.flush(store, &mut buf).await;
                        self.status.send_modify(|s| s.role = Some("follower".into()));
                        return Outcome::Reconnect;
                    }
                }
                _ = full_due => {
                    next_full = self.next_full_at();
                    if let Some(o) = self.full_during_stream(client, store, &mut buf).await { return o; }
                }
                _ = leadership.tick() => {
                    if !self.cfg.cluster {
                        // Scaled up at run time (members added to a single member): one writer
                        // from now on, the leader's warden.
                        if crate::cluster::leadership::member_count(client).await.is_some_and(|n| n > 1) {
                            tracing::info!("etcd's member list now has several members: cluster mode (only the leader's warden writes)");
                            self.flush(store, &mut buf).await;
                            self.cfg.cluster = true;
                            return Outcome::Reconnect;
                        }
                        continue;
                    }
                    let now = leads(client).await;
                    if let Some(Ok(me)) = now {
                        self.identity = me;
                        self.unanswered = 0;
                        // A repaired member's learner is promoted by the writer too, so a learner
                        // whose own warden died is not left behind.
                        crate::cluster::leadership::promote_caught_up_learners(client).await;
                        self.keep_members_current(client, store).await;
                    }
                    if self.superseded_in.is_some() {
                        tracing::warn!("a later writer wrote the head object: handing over");
                        self.status.send_modify(|s| s.role = Some("follower".into()));
                        return Outcome::Reconnect;
                    }
                    if now.is_none() {
                        self.unanswered += 1;
                        if self.unanswered >= 3 {
                            // etcd does not say whether it still leads: another member may, so
                            // this one stops writing (what it buffered was committed; it goes up
                            // as the chain's last delta).
                            tracing::warn!("this member's etcd did not answer three leadership checks in a row: flushing the buffered delta and writing nothing more until it says it leads");
                            self.flush(store, &mut buf).await;
                            self.unanswered = 0;
                            self.status.send_modify(|s| s.role = Some("follower".into()));
                            return Outcome::Reconnect;
                        }
                    }
                    if let Some(Err(leader)) = now {
                        tracing::info!(leader = format!("{leader:x}"), "this member's etcd no longer leads: flushing the buffered delta and handing over");
                        self.flush(store, &mut buf).await;
                        self.status.send_modify(|s| s.role = Some("follower".into()));
                        return Outcome::Reconnect;
                    }
                }
                _ = tick.tick() => {
                    if let Some(path) = &self.cfg.credentials
                        && mtime(path) != self.creds_mtime
                    {
                        tracing::info!(path = %path.display(), "store credentials changed: re-opening the store");
                        self.flush(store, &mut buf).await;
                        return Outcome::Reopen;
                    }
                    // Leases first: a set listed at the buffer's last revision goes up in the
                    // same delta (in an empty buffer it waits for the next revision).
                    self.check_leases(client, &mut buf).await;
                    if !buf.is_empty() {
                        self.flush(store, &mut buf).await;
                    }
                    if let Some(o) = self.check_outside(client, store, &mut buf).await {
                        return o;
                    }
                }
                msg = watch_msg => {
                    if let Some(o) = self.on_watch(client, store, &mut buf, msg).await {
                        return o;
                    }
                }
            }
        }
    }

    /// One message of the delta watch into the buffer; `Some` ends the stream.
    async fn on_watch(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        msg: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    ) -> Option<Outcome> {
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                self.flush(store, buf).await;
                return Some(Outcome::Reconnect);
            }
            Err(err) => {
                tracing::warn!(error = %err, "delta watch ended");
                self.flush(store, buf).await;
                return Some(Outcome::Reconnect);
            }
        };
        if resp.canceled() {
            self.flush(store, buf).await;
            if resp.compact_revision() > 0 {
                // A chain break, never a silent gap: revisions wanted..compacted are in no delta
                // (they may have been overwritten since); the full that follows starts a new chain.
                let wanted = buf.last() + 1;
                let compacted = resp.compact_revision();
                tracing::error!(
                    compact_revision = compacted,
                    wanted,
                    "CHAIN BREAK: the chain's next revision was compacted before it was backed up: taking a full snapshot"
                );
                self.status.send_modify(|s| {
                    s.chain_breaks_total += 1;
                    s.last_chain_break = Some(ChainBreak {
                        after: wanted - 1,
                        compacted,
                        at: Some(SystemTime::now()),
                    });
                });
                return Some(Outcome::NeedFull);
            }
            tracing::warn!(reason = resp.cancel_reason(), "delta watch canceled");
            return Some(Outcome::Reconnect);
        }
        // One revision at a time: a response that holds many (a watch catching up) is uploaded as
        // the buffer reaches its bound, never held whole above it.
        let events = resp.events();
        let mut from = 0;
        while from < events.len() {
            let rev = events[from].kv().map(|kv| kv.mod_revision());
            let to = events[from..]
                .iter()
                .position(|e| e.kv().map(|kv| kv.mod_revision()) != rev)
                .map_or(events.len(), |n| from + n);
            if let Err(o) = self.append(client, buf, &events[from..to]).await {
                self.flush(store, buf).await;
                return Some(o);
            }
            from = to;
            if buf.len() >= self.cfg.delta_max_bytes {
                let ok = self.flush(store, buf).await;
                if !ok && buf.len() >= self.cfg.delta_max_bytes {
                    tracing::error!(
                        bytes = buf.len(),
                        "delta buffer full and the store is failing: dropping it; a full snapshot follows once the store is back"
                    );
                    drop(buf.take());
                    return Some(Outcome::NeedFull);
                }
            }
        }
        self.status.send_modify(|s| {
            s.pending_delta_bytes = buf.len() as u64;
            s.pending_delta_events = buf.pending_events();
        });
        None
    }

    /// Before the last flush of a graceful stop: every revision etcd has acknowledged so far must
    /// be in the buffer, so the watch is read until it reaches etcd's current revision (the caller
    /// bounds the wait). A write acknowledged just before the stop signal is then in the store.
    async fn catch_up(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        watch: &mut Option<etcd_client::WatchStream>,
    ) {
        let Some(w) = watch.as_mut() else { return };
        let target = match tokio::time::timeout(Duration::from_secs(2), client.status()).await {
            Ok(Ok(s)) => s.header().map(|h| h.revision()).unwrap_or(0),
            _ => {
                tracing::warn!("cannot read etcd's revision at the stop; flushing what the watch delivered");
                return;
            }
        };
        while buf.last() < target {
            let msg = w.message().await;
            if self.on_watch(client, store, buf, msg).await.is_some() {
                return;
            }
        }
        tracing::debug!(
            revision = target,
            "the delta watch reached etcd's revision at the stop"
        );
    }

    /// Lease grants with no key and revocations show in no watch event: the writer lists etcd's
    /// leases every period and records the set in the chain when it changed, right after the
    /// revision etcd listed them at.
    async fn check_leases(&mut self, client: &mut Client, buf: &mut DeltaBuffer) {
        let Some(set) = live_leases(client, &mut self.lease_ttls).await else {
            tracing::debug!("etcd did not list its leases; next period");
            return;
        };
        if set.revision == buf.last() {
            buf.push_lease_set(set.leases);
            self.lease_set_due = None;
            self.status
                .send_modify(|s| s.leases_checked_revision = Some(set.revision));
        } else if set.revision > buf.last() {
            self.lease_set_due = Some(set);
        }
    }

    /// Membership and auth are in full snapshots only: after a change, a full snapshot at once.
    async fn check_outside(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        let recorded = self.outside_at_full.clone()?;
        match outside::fingerprint(client, &self.cfg.client, self.authenticated, &mut self.auth_token).await {
            Ok(now) if now != recorded => {
                tracing::info!(
                    "etcd's membership or auth changed: taking a full snapshot (deltas carry key events only)"
                );
                self.full_during_stream(client, store, buf).await
            }
            Ok(_) => None,
            Err(outside::OutsideError::NeedsCredentials(e)) => {
                if self.cfg.client.user.is_none() {
                    tracing::error!(error = %e, "etcd has auth enabled: give the warden --etcd-user and --etcd-password-file (a user with the root role)");
                } else {
                    tracing::info!("etcd's auth changed: reconnecting with the configured user");
                }
                self.flush(store, buf).await;
                Some(Outcome::Reconnect)
            }
            Err(outside::OutsideError::Unavailable(e)) => {
                tracing::debug!(error = %e, "membership and auth check failed; next period");
                None
            }
        }
    }

    async fn full_during_stream(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        // Close the old chain first; whatever cannot be uploaded is inside the new full anyway.
        self.flush(store, buf).await;
        match self.take_full(client, store).await {
            Ok(chain) => {
                let seen = buf.last();
                drop(buf.take());
                *buf = DeltaBuffer::new(chain, seen);
                None
            }
            Err(()) => None,
        }
    }

    /// Groups a watch response's events by revision into the buffer; records lease TTLs.
    async fn append(
        &mut self,
        client: &mut Client,
        buf: &mut DeltaBuffer,
        events: &[etcd_client::Event],
    ) -> Result<(), Outcome> {
        let due = self.lease_set_due.as_ref().map(|s| s.revision);
        match append_events(client, buf, events, &mut self.lease_set_due).await {
            Ok(()) => {
                if let Some(at) = due.filter(|_| self.lease_set_due.is_none()) {
                    self.status.send_modify(|s| s.leases_checked_revision = Some(at));
                }
                Ok(())
            }
            Err(AppendError::Gap(gap)) => {
                self.failed("delta", "gap", &gap);
                Err(Outcome::NeedFull)
            }
            Err(AppendError::Lease) => Err(Outcome::Reconnect),
        }
    }
}

/// Parses `--full-snapshot-schedule` (5 fields, or 6 with seconds).
/// The next occurrence of `cron` as a tokio instant.
fn next_at(cron: &croner::Cron) -> Option<tokio::time::Instant> {
    let now = chrono::Utc::now();
    let next = cron.find_next_occurrence(&now, false).ok()?;
    let wait = (next - now).to_std().ok()?;
    Some(tokio::time::Instant::now() + wait)
}

pub fn parse_cron(s: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(s)
        .map_err(|e| e.to_string())
}

enum Leadership {
    Leader,
    Stop(oneshot::Sender<()>),
    /// etcd did not answer: connect again.
    Retry,
}

/// Why watch events could not go into a delta buffer.
pub(super) enum AppendError {
    /// A revision does not follow the buffer's last: the chain cannot go on.
    Gap(delta::GapError),
    /// etcd did not tell a lease's TTL (after retries).
    Lease,
}

/// Groups a watch response's events by revision into `buf`, recording each lease's granted TTL
/// before the first put that uses it, and `set` (a lease set etcd reported at a revision the
/// stream had not reached) right after its revision.
pub(super) async fn append_events(
    client: &mut Client,
    buf: &mut DeltaBuffer,
    events: &[etcd_client::Event],
    set: &mut Option<LeaseSetAt>,
) -> Result<(), AppendError> {
    let push = |buf: &mut DeltaBuffer, done: &Revision, set: &mut Option<LeaseSetAt>| {
        buf.push(done).map_err(AppendError::Gap)?;
        if let Some(s) = set.take_if(|s| s.revision <= buf.last()) {
            // Past its revision (a stream that started after it) the set is stale: the next
            // check records a fresh one.
            if s.revision == buf.last() {
                buf.push_lease_set(s.leases);
            }
        }
        Ok::<_, AppendError>(())
    };
    let mut current: Option<Revision> = None;
    for ev in events {
        let Some(kv) = ev.kv() else { continue };
        let rev = kv.mod_revision();
        let kind = match ev.event_type() {
            EtcdEventType::Put => EventType::Put,
            EtcdEventType::Delete => EventType::Delete,
        };
        if kind == EventType::Put && buf.needs_lease(kv.lease()) {
            // The lease's record goes right before the revision that first uses it, never before
            // an earlier revision still being grouped: a point-in-time restore that stops at
            // that earlier revision must not get a lease granted after it.
            if let Some(done) = current.take_if(|r| r.revision != rev) {
                push(buf, &done, set)?;
            }
            let granted_ttl = lease_granted_ttl(client, kv.lease())
                .await
                .map_err(|_| AppendError::Lease)?;
            buf.push_lease(Lease {
                id: kv.lease(),
                granted_ttl,
            });
        }
        let event = Event {
            kind,
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            lease: kv.lease(),
            create_revision: kv.create_revision(),
            version: kv.version(),
        };
        match current.as_mut() {
            Some(r) if r.revision == rev => r.events.push(event),
            _ => {
                if let Some(done) = current.take() {
                    push(buf, &done, set)?;
                }
                current = Some(Revision {
                    revision: rev,
                    events: vec![event],
                });
            }
        }
    }
    if let Some(done) = current.take() {
        push(buf, &done, set)?;
    }
    Ok(())
}

/// Every lease etcd holds, as etcd listed them at `revision`.
#[derive(Debug)]
pub(super) struct LeaseSetAt {
    pub revision: i64,
    pub leases: Vec<Lease>,
}

/// etcd's live leases with their granted TTLs, and the revision it listed them at. `ttls` keeps the
/// granted TTL of every lease seen (it never changes), so only new leases cost a lookup; leases
/// that expired between the listing and the lookup are left out. `None` when etcd did not answer.
pub(super) async fn live_leases(
    client: &mut Client,
    ttls: &mut std::collections::HashMap<i64, i64>,
) -> Option<LeaseSetAt> {
    let r = tokio::time::timeout(LEADERSHIP_CHECK, client.leases())
        .await
        .ok()?
        .ok()?;
    let revision = r.header()?.revision();
    let ids: Vec<i64> = r.leases().iter().map(|l| l.id()).collect();
    ttls.retain(|id, _| ids.contains(id));
    let mut leases = Vec::with_capacity(ids.len());
    for id in ids {
        let ttl = match ttls.get(&id) {
            Some(t) => *t,
            None => {
                let t = lease_granted_ttl(client, id).await.ok()?;
                ttls.insert(id, t);
                t
            }
        };
        if ttl > 0 {
            leases.push(Lease { id, granted_ttl: ttl });
        }
    }
    leases.sort_by_key(|l| l.id);
    Some(LeaseSetAt { revision, leases })
}

/// The TTL a lease was granted with, for the delta that first uses it. etcd answers a lease that
/// no longer exists with TTL -1 (no error): that, and only that, is recorded as gone (the restore
/// then writes the put without a lease). A failed request is retried; if etcd keeps failing, the
/// stream reconnects (complete revisions are flushed first) instead of recording a lease as gone
/// whose key would then never expire after a restore.
async fn lease_granted_ttl(client: &mut Client, id: i64) -> Result<i64, Outcome> {
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=5 {
        match client.lease_time_to_live(id, None).await {
            // Not found: TTL -1 and no granted TTL. An expired lease being revoked still has its
            // granted TTL, which the restore keeps so that the key still expires.
            Ok(r) if r.granted_ttl() <= 0 => return Ok(-1),
            Ok(r) => return Ok(r.granted_ttl()),
            Err(e) if attempt == 5 => {
                tracing::warn!(lease = format!("{id:x}"), error = %e, "cannot read a lease's TTL; reconnecting the delta stream");
            }
            Err(e) => {
                tracing::debug!(lease = format!("{id:x}"), error = %e, attempt, "lease TTL lookup failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    Err(Outcome::Reconnect)
}

/// etcd's member list as the store's cluster record keeps it; `None` when etcd does not answer.
pub(crate) async fn members_of(client: &mut Client) -> Option<Vec<crate::store::owner::Member>> {
    let list = tokio::time::timeout(LEADERSHIP_CHECK, client.member_list())
        .await
        .ok()?
        .ok()?;
    Some(
        list.members()
            .iter()
            .map(|m| crate::store::owner::Member {
                name: m.name().to_owned(),
                id: m.id(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_parsing() {
        assert!(parse_cron("0 * * * *").is_ok());
        assert!(parse_cron("*/10 * * * * *").is_ok());
        assert!(parse_cron("every hour").is_err());
    }
}

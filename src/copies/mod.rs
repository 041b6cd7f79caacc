//! Copies of the backups in other stores (`run --copy-to URL`): a region outage, a deleted bucket
//! or a compromised account costs the store, not the backups.
//!
//! The writer hands every object it publishes (full, delta) to each copy's queue and goes on: one
//! task per copy streams the objects over in publication order, so a copy read half-way is an
//! older, valid store. A copy that is slow or down never holds the writer, the store or readiness
//! back: its queue is bounded, and when it overflows the task forgets the queue and reconciles
//! instead (lists both stores, copies what is missing: `crate::store::copy::copy_missing`). The
//! first object a writer publishes starts with such a reconciliation too, which also brings over
//! what was written while no warden copied (rollback points, a final snapshot at the last stop).
//! Followers in a cluster publish nothing, so only the writer touches the copies.
//!
//! Each copy keeps its own retention (`--copy-retention`, by default the store's), run after each
//! full it receives, with the same Object Lock care as the store's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::copy::{CopyError, copy_missing, copy_object};
use crate::store::retention::{self, Policy};
use crate::store::{Store, StoreUrl};

/// `--copy-to`, `--copy-credentials`, `--copy-retention`.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub stores: Vec<StoreUrl>,
    pub credentials: Option<std::path::PathBuf>,
    pub retention: Policy,
    /// How long rollback points stay in the copies (the store's `--rollback-retention`).
    pub rollback_retention: Option<Duration>,
}

/// One object the writer published.
#[derive(Debug, Clone)]
pub struct Published {
    pub key: String,
    /// The newest revision the store holds once this object is there.
    pub revision: i64,
    pub at: SystemTime,
}

/// Objects queued per copy before it falls back to a reconciliation (one per delta period, so
/// 4096 are more than an hour at the default second).
const QUEUE_MAX: usize = 4096;
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// A copy as /status and /metrics show it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CopyStatus {
    pub store: String,
    /// `None` until the first attempt; false after a failure until the next success.
    pub healthy: Option<bool>,
    /// Every object the writer published up to this revision is in the copy.
    pub revision: Option<i64>,
    /// The newest revision the writer published.
    pub published_revision: Option<i64>,
    /// When the oldest object the copy still misses was published (`None`: it misses nothing).
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub behind_since: Option<SystemTime>,
    pub objects_copied_total: u64,
    pub bytes_copied_total: u64,
    pub failures_total: u64,
    pub reconciliations_total: u64,
    pub last_error: Option<String>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub last_copied_at: Option<SystemTime>,
    pub retention_deleted_total: u64,
    pub retention_locked: Option<crate::store::retention::RetentionLocked>,
}

impl CopyStatus {
    /// Revisions the writer published that the copy does not hold yet.
    pub fn lag_revisions(&self) -> i64 {
        match (self.published_revision, self.revision) {
            (Some(p), Some(c)) => (p - c).max(0),
            (Some(p), None) => p,
            _ => 0,
        }
    }

    /// How long the oldest object the copy misses has waited.
    pub fn lag_seconds(&self, now: SystemTime) -> f64 {
        self.behind_since
            .and_then(|t| now.duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64())
    }
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Published>,
    /// The queue overflowed (or nothing was copied yet): reconcile before the next object.
    reconcile: bool,
    /// The newest object published, which a reconciliation covers.
    newest: Option<Published>,
    /// The object being copied now.
    in_flight: Option<Published>,
}

/// One copy's queue and status.
struct Feed {
    queue: Mutex<Queue>,
    wake: Notify,
    status: watch::Sender<CopyStatus>,
}

/// The copies of one warden: the writer publishes into them, /status reads them.
#[derive(Clone, Default)]
pub struct Copies {
    feeds: Vec<Arc<Feed>>,
}

impl Copies {
    /// Starts one task per `--copy-to` store; `primary` opens the store they copy from.
    pub fn start(
        cfg: &Config,
        primary: impl Fn() -> Result<Store, crate::store::StoreError> + Send + Sync + Clone + 'static,
        cancel: CancellationToken,
    ) -> Self {
        let mut feeds = Vec::new();
        for url in &cfg.stores {
            let feed = Arc::new(Feed {
                queue: Mutex::new(Queue {
                    reconcile: true,
                    ..Default::default()
                }),
                wake: Notify::new(),
                status: watch::channel(CopyStatus {
                    store: url.to_string(),
                    ..Default::default()
                })
                .0,
            });
            let task = Task {
                feed: feed.clone(),
                url: url.clone(),
                credentials: cfg.credentials.clone(),
                retention: cfg.retention,
                rollback_retention: cfg.rollback_retention,
                primary: Box::new(primary.clone()),
                retry: RETRY_MIN,
                open: None,
            };
            tokio::spawn(task.run(cancel.child_token()));
            feeds.push(feed);
        }
        Self { feeds }
    }

    pub fn is_empty(&self) -> bool {
        self.feeds.is_empty()
    }

    /// Hands `p` to every copy; never waits.
    pub fn publish(&self, p: &Published) {
        for feed in &self.feeds {
            // The queue and the status change together (the task does the same), so a lag is
            // never cleared over an object just queued.
            let mut q = feed.queue.lock().expect("copy queue");
            if q.items.len() >= QUEUE_MAX {
                // Too far behind to remember every object: list and compare instead.
                q.items.clear();
                q.reconcile = true;
            } else if !q.reconcile {
                q.items.push_back(p.clone());
            }
            q.newest = Some(p.clone());
            feed.status.send_modify(|s| {
                s.published_revision = Some(s.published_revision.unwrap_or(0).max(p.revision));
                s.behind_since.get_or_insert(p.at);
            });
            drop(q);
            feed.wake.notify_one();
        }
    }

    /// The chains of the objects some copy still has to copy (queued or being copied): the store's
    /// retention keeps them until the copies have them. A copy whose queue overflowed pins nothing
    /// (it reconciles from what the store still holds).
    pub fn pinned_chains(&self) -> Vec<crate::store::layout::ChainId> {
        let mut out = Vec::new();
        for feed in &self.feeds {
            let q = feed.queue.lock().expect("copy queue");
            for p in q.items.iter().chain(q.in_flight.iter()) {
                if let Some(chain) = crate::store::layout::SnapshotName::parse(&p.key)
                    .ok()
                    .and_then(|n| n.chain())
                    && !out.contains(&chain)
                {
                    out.push(chain);
                }
            }
        }
        out
    }

    /// Each copy's status, for /status and /metrics.
    pub fn statuses(&self) -> Vec<CopyStatus> {
        self.feeds.iter().map(|f| f.status.borrow().clone()).collect()
    }

    /// Waits until every copy holds everything published, at most `budget` (a graceful stop:
    /// what is left is copied by the next writer's first reconciliation).
    pub async fn drain(&self, budget: Duration) {
        let deadline = tokio::time::Instant::now() + budget;
        for feed in &self.feeds {
            let mut rx = feed.status.subscribe();
            let caught_up = rx.wait_for(|s| s.behind_since.is_none() || s.healthy == Some(false));
            if tokio::time::timeout_at(deadline, caught_up).await.is_err() {
                tracing::warn!(copy = %feed.status.borrow().store, "the copy did not catch up before the stop; the next writer copies the rest");
            }
        }
    }
}

/// What the task does next.
enum Step {
    Reconcile(Option<Published>),
    Copy(Published),
    Idle,
}

struct Task {
    feed: Arc<Feed>,
    url: StoreUrl,
    credentials: Option<std::path::PathBuf>,
    retention: Policy,
    rollback_retention: Option<Duration>,
    primary: Box<dyn Fn() -> Result<Store, crate::store::StoreError> + Send + Sync>,
    retry: Duration,
    open: Option<(Store, Store)>,
}

impl Task {
    fn next(&self) -> Step {
        let mut q = self.feed.queue.lock().expect("copy queue");
        if q.newest.is_none() {
            return Step::Idle; // nothing published yet: a follower never touches the copy
        }
        if q.reconcile {
            q.reconcile = false;
            q.items.clear();
            return Step::Reconcile(q.newest.clone());
        }
        match q.items.pop_front() {
            Some(p) => {
                q.in_flight = Some(p.clone());
                Step::Copy(p)
            }
            None => Step::Idle,
        }
    }

    /// Puts a failed step back so that it is tried again first.
    fn retry_later(&self, step: Step) {
        let mut q = self.feed.queue.lock().expect("copy queue");
        q.in_flight = None;
        match step {
            Step::Reconcile(_) => q.reconcile = true,
            Step::Copy(p) if !q.reconcile => q.items.push_front(p),
            _ => {}
        }
    }

    async fn run(mut self, cancel: CancellationToken) {
        loop {
            let step = self.next();
            if let Step::Idle = step {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = self.feed.wake.notified() => continue,
                }
            }
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.attempt(&step) => r,
            };
            match outcome {
                Ok(()) => self.retry = RETRY_MIN,
                Err(e) => {
                    self.open = None;
                    tracing::warn!(copy = %self.url, error = %e, "copying to the copy store failed; retrying");
                    self.feed.status.send_modify(|s| {
                        s.healthy = Some(false);
                        s.failures_total += 1;
                        s.last_error = Some(crate::telemetry::redact(&e));
                    });
                    self.retry_later(step);
                    let delay = self.retry;
                    self.retry = (self.retry * 2).min(RETRY_MAX);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// The store and the copy, opened once and kept (one HTTP client each, and a locked bucket's
    /// Content-MD5 learnt once); opened afresh after a failure, credentials re-read.
    fn stores(&mut self) -> Result<(Store, Store), String> {
        if self.open.is_none() {
            let primary = (self.primary)().map_err(|e| crate::telemetry::error_chain(&e))?;
            let copy = Store::open_configured(&self.url, self.credentials.as_deref())
                .map_err(|e| crate::telemetry::error_chain(&e))?;
            self.open = Some((primary, copy));
        }
        Ok(self.open.clone().expect("opened above"))
    }

    async fn attempt(&mut self, step: &Step) -> Result<(), String> {
        let (primary, copy) = self.stores()?;
        match step {
            Step::Idle => Ok(()),
            Step::Reconcile(covered) => {
                let report = copy_missing(&primary, &copy, false).await?;
                if !report.copied.is_empty() {
                    tracing::info!(copy = %self.url, objects = report.copied.len(), bytes = report.bytes, "the copy store caught up");
                }
                self.copied(covered.as_ref(), report.copied.len() as u64, report.bytes, true);
                self.apply_retention(&copy).await
            }
            Step::Copy(p) => {
                let bytes = match copy_object(&primary, &copy, &p.key).await {
                    Ok(b) => b,
                    Err(CopyError::Gone) => 0, // the store's retention removed it meanwhile
                    Err(CopyError::Failed(e)) => return Err(e),
                };
                self.copied(Some(p), 1, bytes, false);
                if p.key.contains("/full/") {
                    self.apply_retention(&copy).await?;
                }
                Ok(())
            }
        }
    }

    /// The copy now holds everything published up to `upto`.
    fn copied(&self, upto: Option<&Published>, objects: u64, bytes: u64, reconciled: bool) {
        let mut q = self.feed.queue.lock().expect("copy queue");
        q.in_flight = None;
        let next = if q.reconcile {
            q.newest.as_ref().map(|p| p.at)
        } else {
            q.items.front().map(|p| p.at)
        };
        self.feed.status.send_modify(|s| {
            if let Some(p) = upto {
                s.revision = Some(s.revision.unwrap_or(0).max(p.revision));
            }
            s.behind_since = next;
            s.healthy = Some(true);
            s.objects_copied_total += objects;
            s.bytes_copied_total += bytes;
            s.reconciliations_total += u64::from(reconciled);
            s.last_copied_at = Some(SystemTime::now());
        });
    }

    async fn apply_retention(&self, copy: &Store) -> Result<(), String> {
        let applied = retention::apply(copy, self.retention, self.rollback_retention, &[])
            .await
            .map_err(|e| format!("retention in {}: {}", self.url, crate::telemetry::error_chain(&e)))?;
        if applied.deleted > 0 {
            tracing::info!(copy = %self.url, deleted = applied.deleted, "retention removed old snapshots from the copy store");
        }
        self.feed.status.send_modify(|s| {
            s.retention_deleted_total += applied.deleted as u64;
            s.retention_locked = crate::store::retention::RetentionLocked::of(&applied);
        });
        Ok(())
    }
}

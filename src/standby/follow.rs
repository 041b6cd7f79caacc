//! The standby's data dir and the store it follows: the first restore, each poll's new deltas,
//! rebuilds, and the promotion's last steps.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::{Promotion, StandbyConfig, StandbyStatus, State};
use crate::format::mvcc::MvccFile;
use crate::process::pid1::Reaper;
use crate::restore::{RestoreOptions, Target};
use crate::startup::member::MemberConfig;
use crate::store::Store;
use crate::store::layout::SnapshotName;

/// How long no delta may continue the data dir's revision while a newer full exists before the
/// data dir is rebuilt from it (the old chain's last delta may still be on its way).
const STUCK_BEFORE_REBUILD: Duration = Duration::from_secs(10);

/// Appended pages the data dir's file may hold beyond its restored size before a rebuild.
const GROWTH_SLACK: u64 = 64 << 20;

/// What one look at the store found.
struct Listing {
    /// Deltas continuing the data dir's revision, in order.
    next: Vec<SnapshotName>,
    /// The full whose chain the last of them belongs to: the chain followed from then on.
    chain_full: Option<SnapshotName>,
    /// A full newer than the data dir's revision.
    newer_full: bool,
    /// Every full and every listed delta.
    objects: Vec<SnapshotName>,
}

impl Listing {
    fn store_revision(&self) -> i64 {
        self.objects
            .iter()
            .map(SnapshotName::last_revision)
            .max()
            .unwrap_or(0)
    }

    /// The newest object written.
    fn head(&self) -> Option<SnapshotName> {
        self.objects.iter().max_by_key(|n| n.created_ms).copied()
    }

    /// When the oldest object holding revisions past `at` was written.
    fn oldest_past(&self, at: i64) -> Option<SystemTime> {
        self.objects
            .iter()
            .filter(|n| n.last_revision() > at)
            .map(|n| n.created_ms)
            .min()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
    }
}

pub struct Follower {
    cfg: MemberConfig,
    standby: StandbyConfig,
    data: PathBuf,
    status: watch::Sender<Option<StandbyStatus>>,
    revision: i64,
    /// The db file's size after the last restore.
    restored_size: u64,
    stuck_since: Option<Instant>,
    /// The full snapshot whose chain the data dir follows (its restore's, then the last applied
    /// delta's): listed at every poll with every newer full's, so a handover between writers (a
    /// late full of the old writer while the new one extends the older chain) loses nothing.
    chain: Option<SnapshotName>,
    /// Chains listed once with their older-layout directory and found to have nothing there: later
    /// polls list their own directory only (a writer of this layout never writes the older one).
    current_layout: std::collections::HashSet<crate::store::layout::ChainId>,
    /// The store, while it answers (`store()`).
    open: Option<Store>,
}

/// What `<data-dir>.standby` records: the chain followed, and a promotion under way.
#[derive(Debug, Default, PartialEq)]
struct Marker {
    chain: Option<String>,
    promoting: Option<i64>,
}

impl Marker {
    fn read(path: &std::path::Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut m = Self::default();
        for line in text.lines() {
            if let Some(k) = line.strip_prefix("chain ") {
                m.chain = Some(k.trim().to_owned());
            } else if let Some(r) = line.strip_prefix("promoting ") {
                m.promoting = r.trim().parse().ok();
            }
        }
        m
    }

    fn text(&self, store: &str) -> String {
        let mut t = format!("etcd-warden standby of {store}\n");
        if let Some(c) = &self.chain {
            t.push_str(&format!("chain {c}\n"));
        }
        if let Some(r) = self.promoting {
            t.push_str(&format!("promoting {r}\n"));
        }
        t
    }
}

impl Follower {
    pub fn new(
        cfg: MemberConfig,
        standby: StandbyConfig,
        status: watch::Sender<Option<StandbyStatus>>,
    ) -> Self {
        let data = std::env::current_dir()
            .unwrap_or_else(|_| "/".into())
            .join(&cfg.etcd.data_dir);
        status.send_replace(Some(StandbyStatus {
            store: cfg.store.to_string(),
            ..StandbyStatus::default()
        }));
        Self {
            cfg,
            standby,
            data,
            status,
            revision: 0,
            restored_size: 0,
            stuck_since: None,
            chain: None,
            current_layout: Default::default(),
            open: None,
        }
    }

    /// Writes the marker (synced: a promotion under way must survive a crash).
    fn mark(&self, promoting: Option<i64>) -> Result<(), String> {
        let path = super::marker(&self.data);
        let m = Marker {
            chain: self.chain.map(|c| c.key()),
            promoting,
        };
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&path)?;
            f.write_all(m.text(&self.cfg.store.to_string()).as_bytes())?;
            f.sync_all()
        };
        write().map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// A promotion that a crash interrupted (the marker says so): finished now, bump included
    /// when it was not committed yet. `Some((backed-up revision, served revision))`.
    pub fn interrupted_promotion(&mut self) -> Result<Option<(i64, i64)>, String> {
        let Some(backed_up) = Marker::read(&super::marker(&self.data)).promoting else {
            return Ok(None);
        };
        tracing::warn!(
            backed_up_revision = backed_up,
            "standby: a promotion was interrupted; finishing it"
        );
        let mut file =
            MvccFile::open(&self.db()).map_err(|e| format!("open {}: {e}", self.db().display()))?;
        let bump = self.cfg.restore_bump_revision;
        let served = if file.revision() > backed_up || bump == 0 {
            file.revision()
        } else {
            let to = file
                .bump_and_mark_compacted(bump)
                .map_err(|e| format!("bump the revision: {e}"))?;
            file.commit()
                .map_err(|e| format!("commit the bumped revision: {e}"))?;
            to
        };
        crate::restore::marker::record(&self.data, backed_up, served)?;
        let _ = std::fs::remove_file(super::marker(&self.data));
        self.set(|s| {
            s.state = State::Promoted;
            s.revision = served;
            s.promotion = Some(Promotion {
                requested_at: Some(SystemTime::now()),
                backed_up_revision: Some(backed_up),
                revision: Some(served),
                ..Promotion::default()
            });
        });
        Ok(Some((backed_up, served)))
    }

    pub fn poll_interval(&self) -> Duration {
        self.standby.poll
    }

    fn db(&self) -> PathBuf {
        self.data.join("member").join("snap").join("db")
    }

    fn set(&self, f: impl FnOnce(&mut StandbyStatus)) {
        self.status.send_modify(|s| {
            if let Some(s) = s.as_mut() {
                f(s)
            }
        });
    }

    /// The store, opened once and kept (one HTTP client for every poll); opened afresh, the
    /// credentials read again, after a failed step.
    fn store(&mut self) -> Result<Store, String> {
        if let Some(s) = &self.open {
            return Ok(s.clone());
        }
        let s = crate::startup::restore::open_store(&self.cfg)?;
        self.open = Some(s.clone());
        Ok(s)
    }

    /// One step: the first restore when the data dir holds none yet, else the new deltas (or a
    /// rebuild). Errors are reported in the status and retried at the next poll.
    pub async fn step(&mut self, reaper: &Reaper) {
        self.set(|s| s.polls_total += 1);
        let result = if self.revision == 0 {
            self.resume_or_restore(reaper).await
        } else {
            self.follow(reaper, true).await
        };
        match result {
            Ok(()) => self.set(|s| s.last_error = None),
            Err(e) => {
                self.open = None;
                tracing::warn!(error = %e, "standby: the store could not be followed this time; trying again");
                self.set(|s| s.last_error = Some(e));
            }
        }
    }

    async fn resume_or_restore(&mut self, reaper: &Reaper) -> Result<(), String> {
        if let Ok(file) = MvccFile::open(&self.db()) {
            self.revision = file.revision();
            self.chain = Marker::read(&super::marker(&self.data))
                .chain
                .and_then(|k| SnapshotName::parse(&k).ok());
            self.restored_size = std::fs::metadata(self.db()).map_or(0, |m| m.len());
            tracing::info!(
                revision = self.revision,
                "standby: following the store from the data dir a previous run restored"
            );
        } else {
            self.mark(None)?;
            let (revision, full, seconds) = self.restore_into(reaper, &self.data.clone()).await?;
            self.revision = revision;
            self.chain = Some(full);
            self.mark(None)?;
            self.restored_size = std::fs::metadata(self.db()).map_or(0, |m| m.len());
            tracing::info!(
                revision,
                seconds,
                "standby: the newest backup is restored; following the store"
            );
        }
        self.set(|s| {
            s.state = State::Following;
            s.revision = self.revision;
        });
        self.follow(reaper, true).await
    }

    /// Restores the store's newest chain into `into` (missing or empty), unbumped: the revision
    /// reached, the full it started from, the seconds it took.
    async fn restore_into(
        &mut self,
        reaper: &Reaper,
        into: &std::path::Path,
    ) -> Result<(i64, SnapshotName, f64), String> {
        let store = self.store()?;
        let opts = RestoreOptions {
            progress: crate::telemetry::Progress::default(),
            data_dir: into.to_owned(),
            wal_dir: None,
            etcd: self.cfg.launch.program.clone(),
            tool: None,
            name: self.cfg.etcd.name.clone(),
            initial_cluster: self.cfg.etcd.initial_cluster.clone(),
            initial_advertise_peer_urls: self.cfg.etcd.initial_advertise_peer_urls.clone(),
            initial_cluster_token: self.cfg.etcd.initial_cluster_token.clone(),
            target: Target::Latest,
            // The bump comes at promotion: until then the data dir continues the store's history.
            bump_revision: 0,
            bump_clears_store: true,
            store_wait: crate::restore::execute::STORE_WAIT,
        };
        let report = crate::restore::restore(&store, &opts, reaper)
            .await
            .map_err(|e| crate::telemetry::error_chain(&e))?;
        let full = SnapshotName::parse(&report.full).map_err(|e| e.to_string())?;
        Ok((report.backed_up_revision, full, report.seconds))
    }

    /// Lists the fulls, and the deltas of the chain the data dir's revision is in and of every
    /// newer full's chain: one listing each, however long the store's history.
    async fn list(&mut self, store: &Store) -> Result<Listing, String> {
        let err = |e: crate::store::StoreError| crate::telemetry::error_chain(&e);
        let fulls: Vec<SnapshotName> = store
            .list_fulls()
            .await
            .map_err(err)?
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.is_own())
            .collect();
        let at = self.revision;
        let (base, newer) = crate::restore::plan::chains_to_list(&fulls, self.chain, at);
        let mut deltas: Vec<(SnapshotName, SnapshotName)> = Vec::new();
        for full in base.iter().chain(newer.iter()) {
            let chain = full.chain();
            let listed = match chain {
                Some(c) if self.current_layout.contains(&c) => store.list_chain_dir(full).await,
                _ => store.list_chain(full, &fulls).await,
            }
            .map_err(err)?;
            if let Some(c) = chain
                && listed.iter().all(|(d, _)| d.chain() == Some(c))
            {
                self.current_layout.insert(c);
            }
            for (d, _) in listed {
                deltas.push((d, *full));
            }
        }
        let (next, chain_full) = crate::restore::plan::continuing(at, base, &mut deltas);
        let objects = fulls
            .iter()
            .copied()
            .chain(deltas.iter().map(|(d, _)| *d))
            .collect();
        Ok(Listing {
            next,
            chain_full,
            newer_full: fulls.iter().any(|f| f.last_revision() > at),
            objects,
        })
    }

    /// Applies the deltas that continue the data dir; rebuilds it when none can (or they fail)
    /// and a newer full exists, for a while; or, with `may_compact`, when its file has grown too
    /// large.
    async fn follow(&mut self, reaper: &Reaper, may_compact: bool) -> Result<(), String> {
        let store = self.store()?;
        let listing = self.list(&store).await?;
        self.note(&listing, self.revision);
        let mut failed = None;
        if let Some(full) = listing.chain_full {
            let n = listing.next.len() as u64;
            match crate::restore::extend(&store, &self.db(), full, listing.next.clone()).await {
                Ok((revision, applied)) => {
                    tracing::debug!(
                        from = self.revision,
                        to = revision,
                        deltas = n,
                        "standby: deltas applied"
                    );
                    self.revision = revision;
                    self.stuck_since = None;
                    if self.chain != Some(full) {
                        self.chain = Some(full);
                        self.mark(None)?;
                    }
                    let now = SystemTime::now();
                    let delay = listing
                        .next
                        .last()
                        .and_then(|d| now.duration_since(d.created()).ok())
                        .map(|d| d.as_secs_f64());
                    self.set(|s| {
                        s.revision = revision;
                        s.deltas_applied_total += n;
                        s.revisions_applied_total += applied;
                        s.last_applied_at = Some(now);
                        s.apply_delay_seconds = delay;
                    });
                    // What is left to apply, as of this listing.
                    self.note(&listing, revision);
                    return self.compact_if_grown(reaper, may_compact).await;
                }
                Err(e) => failed = Some(e),
            }
        }
        if listing.newer_full {
            let since = *self.stuck_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STUCK_BEFORE_REBUILD.max(self.standby.poll * 3) {
                tracing::warn!(
                    revision = self.revision,
                    store_revision = listing.store_revision(),
                    failed = failed.as_deref(),
                    "standby: no delta in the store continues the data dir's revision (a chain break or a restore in the primary, or a delta that cannot be applied) and a newer full exists: rebuilding from the newest full"
                );
                return self.rebuild(reaper).await;
            }
        }
        match failed {
            Some(e) => Err(e),
            None => self.compact_if_grown(reaper, may_compact).await,
        }
    }

    /// Rebuilds the data dir when the appended pages grew its file past twice its restored size.
    async fn compact_if_grown(&mut self, reaper: &Reaper, may_compact: bool) -> Result<(), String> {
        let size = std::fs::metadata(self.db()).map_or(0, |m| m.len());
        if may_compact && size > self.restored_size.saturating_mul(2) + GROWTH_SLACK {
            tracing::info!(
                size,
                restored_size = self.restored_size,
                "standby: the data dir's file has grown past twice its restored size; rebuilding it from the newest full"
            );
            return self.rebuild(reaper).await;
        }
        Ok(())
    }

    /// Lag and head from a listing, as of revision `at`.
    fn note(&self, l: &Listing, at: i64) {
        let (store_revision, head) = (l.store_revision(), l.head());
        let lag = (store_revision - at).max(0);
        let lag_seconds = match (lag, l.oldest_past(at)) {
            (0, _) | (_, None) => 0.0,
            (_, Some(t)) => SystemTime::now()
                .duration_since(t)
                .map_or(0.0, |d| d.as_secs_f64()),
        };
        self.set(|s| {
            s.store_revision = store_revision;
            s.lag_revisions = lag;
            s.lag_seconds = lag_seconds;
            s.store_head = head.map(|h| h.key());
            s.store_head_at = head.map(|h| h.created());
            s.last_listed_at = Some(SystemTime::now());
        });
    }

    /// Restores the newest chain beside the data dir, then swaps it in: the old one is removed
    /// only once the new one is in place (both are this standby's own restores).
    async fn rebuild(&mut self, reaper: &Reaper) -> Result<(), String> {
        let next = crate::etcd::dirs::beside(&self.data, ".standby-next");
        let old = crate::etcd::dirs::beside(&self.data, ".standby-old");
        let _ = std::fs::remove_dir_all(&next);
        let _ = std::fs::remove_dir_all(&old);
        let (revision, full, seconds) = self.restore_into(reaper, &next).await?;
        if revision < self.revision {
            // The newest chain could not be used whole (a corrupt or missing object): keep the
            // newer data dir rather than go back in time.
            let _ = std::fs::remove_dir_all(&next);
            return Err(format!(
                "the rebuild reached revision {revision} only, below the data dir's {}: the data dir is kept",
                self.revision
            ));
        }
        std::fs::rename(&self.data, &old).map_err(|e| format!("move {} aside: {e}", self.data.display()))?;
        std::fs::rename(&next, &self.data)
            .map_err(|e| format!("move the rebuilt data dir into place: {e}"))?;
        let _ = std::fs::remove_dir_all(&old);
        tracing::info!(
            from = self.revision,
            to = revision,
            seconds,
            "standby: data dir rebuilt from the newest full"
        );
        self.revision = revision;
        self.chain = Some(full);
        self.mark(None)?;
        self.restored_size = std::fs::metadata(self.db()).map_or(0, |m| m.len());
        self.stuck_since = None;
        self.set(|s| {
            s.revision = revision;
            s.rebuilds_total += 1;
            s.last_applied_at = Some(SystemTime::now());
        });
        Ok(())
    }

    /// The promotion's checks and last steps: the store's remaining deltas applied, the primary
    /// quiet (unless `force`), the bump and compaction mark written. On `Ok` the data dir is an
    /// ordinary member's, ready for etcd; `(backed-up revision, served revision)`.
    pub async fn promote(&mut self, reaper: &Reaper, force: bool) -> Result<(i64, i64), String> {
        let requested = SystemTime::now();
        self.set(|s| {
            s.promotion = Some(Promotion {
                forced: force,
                requested_at: Some(requested),
                ..Promotion::default()
            })
        });
        if self.revision == 0 {
            return Err("the standby has not restored a backup yet".into());
        }
        let caught_up = async {
            let store = self.store()?;
            self.follow(reaper, false).await?;
            let l = self.list(&store).await?;
            self.note(&l, self.revision);
            Ok::<Listing, String>(l)
        }
        .await;
        if caught_up.is_err() {
            self.open = None;
        }
        let listing = match caught_up {
            Ok(l) => Some(l),
            Err(e) if force => {
                tracing::warn!(error = %e, revision = self.revision, "standby: the store could not be read for the last deltas; promoting with what is applied (--force)");
                None
            }
            Err(e) => {
                return Err(format!(
                    "the store could not be read for the last deltas ({e}); promote with --force to take revision {} as it is",
                    self.revision
                ));
            }
        };
        if let Some(l) = &listing
            && !force
        {
            if let Some(head) = l.head() {
                let age = SystemTime::now()
                    .duration_since(head.created())
                    .unwrap_or_default();
                if age < self.standby.quiet {
                    return Err(format!(
                        "the primary's writer is still writing: the store's newest object {} was written {:.1}s ago, less than --standby-quiet {}; stop the primary (or wait), or promote with --force",
                        head.key(),
                        age.as_secs_f64(),
                        humantime::format_duration(self.standby.quiet)
                    ));
                }
            }
            if l.store_revision() > self.revision {
                return Err(format!(
                    "the store holds revisions {}..={} that no delta continuing the data dir has (a chain break the standby is waiting to rebuild across); promote with --force to take revision {}",
                    self.revision + 1,
                    l.store_revision(),
                    self.revision
                ));
            }
        }
        self.set(|s| s.state = State::Promoting);
        let backed_up = self.revision;
        let bump = self.cfg.restore_bump_revision;
        // A crash from here on finishes the promotion at the next start (`interrupted_promotion`).
        self.mark(Some(backed_up))?;
        let served = {
            let mut file =
                MvccFile::open(&self.db()).map_err(|e| format!("open {}: {e}", self.db().display()))?;
            let served = if bump > 0 {
                file.bump_and_mark_compacted(bump)
                    .map_err(|e| format!("bump the revision: {e}"))?
            } else {
                backed_up
            };
            file.commit()
                .map_err(|e| format!("commit the bumped revision: {e}"))?;
            served
        };
        crate::restore::marker::record(&self.data, backed_up, served)?;
        crate::failpoint::die("standby-promote-after-bump");
        let _ = std::fs::remove_file(super::marker(&self.data));
        self.set(|s| {
            s.state = State::Promoted;
            s.revision = served;
            if let Some(p) = s.promotion.as_mut() {
                p.backed_up_revision = Some(backed_up);
                p.revision = Some(served);
            }
        });
        tracing::info!(
            backed_up_revision = backed_up,
            revision = served,
            bumped_by = bump,
            forced = force,
            "standby: promoted; etcd starts on the data dir as a new single-member cluster"
        );
        Ok((backed_up, served))
    }

    /// A refused promotion: said in the status, the standby goes on following.
    pub fn refused(&self, why: String) {
        self.set(|s| {
            s.state = if self.revision == 0 {
                State::Restoring
            } else {
                State::Following
            };
            if let Some(p) = s.promotion.as_mut() {
                p.refused = Some(why);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_keeps_the_chain_and_a_promotion_under_way() {
        let m = Marker {
            chain: Some("v1/full/full-00000000000000000007-20261204T163759528Z-zstd-plain.ews".into()),
            promoting: Some(812),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.standby");
        std::fs::write(&path, m.text("s3://copy/etcd")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("etcd-warden standby of s3://copy/etcd\n"),
            "{text}"
        );
        assert_eq!(Marker::read(&path), m);
        // The first line alone (a standby of an older release): nothing under way.
        std::fs::write(&path, "etcd-warden standby of s3://copy/etcd\n").unwrap();
        assert_eq!(Marker::read(&path), Marker::default());
        assert_eq!(Marker::read(&dir.path().join("missing")), Marker::default());
    }
}

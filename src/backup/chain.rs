//! Where a chain starts: the newest chain resumed (after proving it continues etcd's history) or a
//! new one with a full.

use std::time::SystemTime;

use etcd_client::Client;

use super::writer::Backup;
use crate::snapshot::outside;
use crate::store::{ChainId, Store};

impl Backup {
    /// Where the chain continues: `(chain, after)` — resume the newest chain, or take a full.
    pub(super) async fn chain_start(
        &mut self,
        client: &mut Client,
        store: &Store,
        force_full: bool,
    ) -> Result<(ChainId, i64), ()> {
        // A single member's objects name its cluster from the first (a cluster's writer learns it
        // with its leadership).
        if !self.cfg.cluster
            && self.identity.cluster_id == 0
            && let Some(Ok(me)) = super::leadership::leads(client).await
        {
            self.identity = me;
        }
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
        match self.take_full(client, store, None).await {
            Ok(chain) => Ok((chain, chain.base)),
            Err(()) => Err(()),
        }
    }

    pub(super) async fn resume_point(
        &mut self,
        client: &mut Client,
        store: &Store,
    ) -> Result<Option<(ChainId, i64)>, crate::store::StoreError> {
        let Some((newest, chain)) = store.newest_checked_chain().await? else {
            tracing::info!("the store has no full snapshot yet: taking one");
            return Ok(None);
        };
        let base = newest.last_revision();
        let Some(chain_id) = newest.chain() else {
            return Ok(None);
        };
        let after = chain.last().map(|n| n.last_revision()).unwrap_or(base);
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
}

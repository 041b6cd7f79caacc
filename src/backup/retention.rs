//! Retention, run by the writer after an upload so it never races one.

use super::writer::Backup;
use crate::store::retention::RetentionLocked;
use crate::store::retention::{self};
use crate::store::{ChainId, Store};

impl Backup {
    pub(super) async fn apply_retention(&mut self, store: &Store) {
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
}

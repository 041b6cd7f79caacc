//! Leases in the chain: each lease's granted TTL recorded before the first put that uses it, and
//! the lease set checked against etcd's.

use std::time::Duration;

use etcd_client::Client;

use super::writer::{Backup, Outcome};
use crate::backup::leadership::LEADERSHIP_CHECK;
use crate::format::delta_codec::Lease;
use crate::snapshot::delta::DeltaBuffer;

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
pub(super) async fn lease_granted_ttl(client: &mut Client, id: i64) -> Result<i64, Outcome> {
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

impl Backup {
    /// Lease grants with no key and revocations show in no watch event: the writer lists etcd's
    /// leases every period and records the set in the chain when it changed, right after the
    /// revision etcd listed them at.
    pub(super) async fn check_leases(&mut self, client: &mut Client, buf: &mut DeltaBuffer) {
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
}

//! Full snapshots: the schedule, SIGUSR1, and a full taken while deltas stream.

use std::time::{Duration, SystemTime};

use etcd_client::Client;

use super::status::SnapInfo;
use super::stream::{Timers, read_upto, watch_after};
use super::writer::{Backup, Outcome};
use crate::snapshot::delta::{self, DeltaBuffer};
use crate::snapshot::{full, outside};
use crate::store::head::Uploaded;
use crate::store::{ChainId, Store};

/// The next occurrence of `cron` as a tokio instant.
pub(super) fn next_at(cron: &croner::Cron) -> Option<tokio::time::Instant> {
    let now = chrono::Utc::now();
    let next = cron.find_next_occurrence(&now, false).ok()?;
    let wait = (next - now).to_std().ok()?;
    Some(tokio::time::Instant::now() + wait)
}

/// Parses `--full-snapshot-schedule` (5 fields, or 6 with seconds).
pub fn parse_cron(s: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(s)
        .map_err(|e| e.to_string())
}

impl Backup {
    /// A full taken now if one was asked for at resume (`full_asap`) or the chain reached
    /// `--full-snapshot-after-revisions` (one such full per delta period at most).
    pub(super) async fn full_if_due_by_revisions(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
        t: &mut Timers,
    ) -> Option<Outcome> {
        if std::mem::take(&mut self.full_asap)
            && let Some(o) = self.full_during_stream(client, store, buf).await
        {
            return Some(o);
        }
        if self.cfg.full_after_revisions > 0
            && buf.is_empty()
            && buf.last() - buf.base() >= self.cfg.full_after_revisions
            && tokio::time::Instant::now() >= t.chain_full_not_before
        {
            tracing::info!(
                revisions = buf.last() - buf.base(),
                limit = self.cfg.full_after_revisions,
                "the chain reached --full-snapshot-after-revisions: starting a new one"
            );
            t.chain_full_not_before = tokio::time::Instant::now() + t.period;
            return self.full_during_stream(client, store, buf).await;
        }
        None
    }

    pub(super) fn schedule_period(&self) -> Option<Duration> {
        let cron = self.cfg.full_schedule.as_ref()?;
        let now = chrono::Utc::now();
        let next = cron.find_next_occurrence(&now, false).ok()?;
        let prev = cron.find_previous_occurrence(&now, false).ok()?;
        (next - prev).to_std().ok()
    }

    pub(super) fn next_full_at(&self) -> Option<tokio::time::Instant> {
        next_at(self.cfg.full_schedule.as_ref()?)
    }

    /// One full snapshot, with status, metrics and retention. `Ok(the chain it starts)` on success.
    /// Takes a full and publishes it; `close`: the chain it ends, `(chain, last revision in its
    /// deltas)`, closed at the full's revision before retention runs (`close_chain`).
    pub(super) async fn take_full(
        &mut self,
        client: &mut Client,
        store: &Store,
        close: Option<(ChainId, i64)>,
    ) -> Result<ChainId, ()> {
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
        let tap = self.key_tap();
        let result = full::take_full(
            client,
            store,
            self.cfg.compression,
            full::FullOptions {
                outside: outside.clone(),
                tap: tap
                    .as_ref()
                    .and_then(|t| t.as_ref().ok())
                    .and_then(|t| t.sender()),
                ..Default::default()
            },
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
                    if let Some(old) = close {
                        self.close_chain(client, store, old, rev).await;
                    }
                    self.apply_retention(store).await;
                }
                self.check_kube_keys(client, &r.name.key(), rev, tap);
                Ok(chain)
            }
            Err(err) => {
                self.failed("full", err.reason(), &err);
                Err(())
            }
        }
    }

    pub(super) async fn full_during_stream(
        &mut self,
        client: &mut Client,
        store: &Store,
        buf: &mut DeltaBuffer,
    ) -> Option<Outcome> {
        // Close the old chain first; whatever cannot be uploaded is inside the new full anyway.
        let flushed = self.flush(store, buf).await;
        // With deltas off there is no chain of deltas to close.
        let close = (flushed && !self.cfg.delta_period.is_zero()).then(|| (buf.chain(), buf.last()));
        crate::failpoint::pause("full-after-flush").await;
        match self.take_full(client, store, close).await {
            Ok(chain) => {
                let seen = buf.last();
                drop(buf.take());
                *buf = DeltaBuffer::new(chain, seen);
                None
            }
            Err(()) => None,
        }
    }

    /// The revisions written between the old chain's last delta and the new full's revision
    /// `upto` are in that full alone, unless the old chain gets them too: they are read from
    /// etcd's history and uploaded as the old chain's last deltas. A data dir behind the store
    /// then crosses the full by deltas (`restore::catchup` enters a chain only with its first
    /// delta, right after its full), and a point in time between the two is restored exactly.
    /// Bounded, and best effort: the new full holds those revisions either way.
    async fn close_chain(
        &mut self,
        client: &mut Client,
        store: &Store,
        (chain, after): (ChainId, i64),
        upto: i64,
    ) {
        if upto <= after {
            return;
        }
        let read = async {
            let mut client = client.clone();
            let mut buf = DeltaBuffer::new(chain, after);
            let mut watch = watch_after(&client, after)
                .await
                .map_err(|e| format!("watch: {e}"))?;
            while buf.last() < upto {
                read_upto(&mut client, &mut watch, &mut buf, upto).await?;
                if buf.len() < self.cfg.delta_max_bytes && buf.last() < upto {
                    continue;
                }
                let Some(pending) = buf.take() else { continue };
                let r = delta::upload(store, &pending, self.cfg.compression, self.delta_writer())
                    .await
                    .map_err(|e| crate::telemetry::error_chain(&e))?;
                // Recorded as each lands: a close cut short still counts what it uploaded.
                self.status.send_modify(|s| s.deltas_total += 1);
                let delta = Uploaded {
                    key: r.name.key(),
                    revision: pending.last,
                    at_ms: r.name.created_ms,
                };
                self.published(&delta, pending.last);
            }
            Ok::<_, String>(())
        };
        let why = match tokio::time::timeout(CLOSE_CHAIN_WAIT, read).await {
            Ok(Ok(())) => {
                tracing::info!(
                    chain = %chain,
                    first = after + 1,
                    last = upto,
                    "the old chain closed at the new full's revision"
                );
                return;
            }
            Ok(Err(e)) => e,
            Err(_) => format!("not read within {CLOSE_CHAIN_WAIT:?}"),
        };
        tracing::warn!(
            chain = %chain,
            reason = %why,
            "the old chain ends at revision {after} or a little after: revisions up to {upto} are in the new full alone"
        );
    }
}

/// How long closing the old chain may hold up the new one's stream.
const CLOSE_CHAIN_WAIT: Duration = Duration::from_secs(30);

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

//! What lives outside the keyspace and only a full carries: membership and auth (a change closes
//! the chain), and the encryption keys a full's values need.

use std::time::SystemTime;

use etcd_client::Client;

use super::writer::{Backup, Outcome};
use crate::kube::needs::Tap;
use crate::snapshot::delta::DeltaBuffer;
use crate::snapshot::outside;
use crate::store::Store;

impl Backup {
    /// `--kube-encryption-config`: the reader that takes a full's bytes as they stream
    /// (`kube::needs`), its unnamed temporary file in etcd's data dir (writable wherever etcd
    /// runs, unlike its parent; etcd never sees a file without a name); `None` without the option.
    pub(super) fn key_tap(&self) -> Option<Result<Tap, String>> {
        self.cfg.kube_encryption_config.as_ref()?;
        Some(Tap::start(&self.cfg.data_dir))
    }

    /// `--kube-encryption-config`: in the background, the key names the full's encrypted values
    /// need (what `tap` read of it), against the configuration's.
    pub(super) fn check_kube_keys(
        &mut self,
        client: &Client,
        full: &str,
        revision: i64,
        tap: Option<Result<Tap, String>>,
    ) {
        let Some(config) = self.cfg.kube_encryption_config.clone() else {
            return;
        };
        if let Some(old) = self.key_check.take() {
            old.abort();
        }
        let (mut client, status, full) = (client.clone(), self.status.clone(), full.to_owned());
        self.key_check = Some(tokio::spawn(async move {
            let from_full = match tap {
                Some(Ok(tap)) => tap.finish().await,
                Some(Err(e)) => Err(e),
                None => Err("no reader of its bytes".into()),
            };
            let check =
                crate::kube::encryption::check_full(&mut client, &config, &full, revision, from_full).await;
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

    /// Membership and auth are in full snapshots only: after a change, a full snapshot at once.
    pub(super) async fn check_outside(
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
}

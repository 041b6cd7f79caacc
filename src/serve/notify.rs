//! systemd's notify protocol (`Type=notify`): READY=1 once etcd is first ready, STATUS= whenever
//! the phase line changes, WATCHDOG=1 while the warden's loops are alive (when `WatchdogSec` is set),
//! STOPPING=1 on shutdown. Without NOTIFY_SOCKET every call is a no-op. etcd never sees the socket:
//! the launcher removes NOTIFY_SOCKET and WATCHDOG_* from its environment.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::serve::state::Shared;

/// The one-line status systemd shows (`systemctl status`).
pub fn status_line(shared: &Shared) -> String {
    let child = shared.child.borrow().clone();
    let etcd = match (child.pid, shared.readiness()) {
        (Some(pid), Ok(())) => format!("etcd pid {pid} ready"),
        (Some(pid), Err(reason)) => format!("etcd pid {pid} not ready: {reason}"),
        (None, Err(reason)) => reason,
        (None, Ok(())) => "etcd not running".to_owned(),
    };
    let backup = shared.backup.borrow();
    let backups = match (backup.healthy, &backup.last_error) {
        (Some(false), _) if backup.consecutive_failures == 0 && backup.kube_keys_problem().is_some() => {
            let short: String = backup
                .kube_keys_problem()
                .unwrap_or_default()
                .chars()
                .take(120)
                .collect();
            format!("; BACKUPS UNUSABLE: {short}")
        }
        (Some(false), Some(e)) => {
            let short: String = e.chars().take(120).collect();
            format!(
                "; BACKUPS FAILING ({} in a row): {short}",
                backup.consecutive_failures
            )
        }
        _ => String::new(),
    };
    let restores = shared.restores.borrow();
    let restored = match (restores.last_backed_up_revision, restores.last_target_revision) {
        (Some(got), Some(want)) if got < want => format!(
            "; RESTORED OLDER DATA: revision {got} of {want} ({} objects skipped)",
            restores.last_skipped.len()
        ),
        _ => String::new(),
    };
    format!(
        "{}; {etcd}; restarts {}; store {}{backups}{restored}",
        shared.phase(),
        child.restarts,
        shared.store
    )
}

fn send(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::debug!(error = %err, "sd_notify failed");
    }
}

/// Tells systemd the warden is stopping.
pub fn stopping(shared: &Shared) {
    let line = status_line(shared);
    send(&[NotifyState::Stopping, NotifyState::Status(&line)]);
}

/// Runs until cancelled.
pub async fn run(shared: Shared, cancel: CancellationToken) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    let tick = watchdog
        .map(|w| w / 2)
        .unwrap_or(Duration::from_secs(1))
        .min(Duration::from_secs(1));
    let mut child = shared.child.clone();
    let mut health = shared.health.clone();
    let mut backup = shared.backup.clone();
    let mut ownership = shared.ownership.clone();
    let mut fence = shared.fence.clone();
    let mut ready_sent = false;
    let mut last_line = String::new();
    loop {
        let line = status_line(&shared);
        if !ready_sent && shared.readiness().is_ok() {
            ready_sent = true;
            send(&[NotifyState::Ready, NotifyState::Status(&line)]);
            last_line = line;
        } else if line != last_line {
            send(&[NotifyState::Status(&line)]);
            last_line = line;
        }
        if watchdog.is_some() && shared.liveness().is_ok() {
            send(&[NotifyState::Watchdog]);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = child.changed() => {}
            _ = health.changed() => {}
            _ = backup.changed() => {}
            _ = ownership.changed() => {}
            _ = fence.changed() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

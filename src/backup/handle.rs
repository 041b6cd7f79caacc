//! How other tasks reach the writer: full and delta requests, reload, reconfigure and stop.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::config::BackupConfig;

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

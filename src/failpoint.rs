//! Failpoints for the tests, read from the environment: `ETCD_WARDEN_FAILPOINT=<name>` makes the
//! warden die right there, as a SIGKILL would (how the tests check that a repair resumes from its
//! journal after a crash at each step), or, for a pause point, wait
//! `ETCD_WARDEN_FAILPOINT_PAUSE` seconds (how a test puts a fault inside a window: a leadership
//! change while a full snapshot is between its upload and its publication). Unset: nothing.

use std::time::Duration;

fn armed(name: &str) -> bool {
    std::env::var("ETCD_WARDEN_FAILPOINT").is_ok_and(|v| v.split(',').any(|p| p == name))
}

/// Dies here when armed.
pub fn die(name: &str) {
    if armed(name) {
        tracing::error!(failpoint = name, "failpoint reached: dying");
        std::process::abort();
    }
}

/// Waits here when armed.
pub async fn pause(name: &str) {
    if armed(name) {
        let secs = std::env::var("ETCD_WARDEN_FAILPOINT_PAUSE")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(10);
        tracing::warn!(failpoint = name, secs, "failpoint reached: pausing");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
}

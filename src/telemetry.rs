//! Logs and liveness: tracing set-up (text or JSON on stderr, etcd's own output untouched on the
//! inherited stdout/stderr) and the heartbeats behind `/livez` and the systemd watchdog.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber. `RUST_LOG` refines the level (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// A loop's proof of life: it beats, `/livez` and the watchdog read the age of the last beat.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeat {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }
    pub fn beat(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    pub fn age(&self) -> Duration {
        let now = self.origin.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Serializes `Option<SystemTime>` as fractional Unix seconds (or null).
pub mod opt_unix_seconds {
    use std::time::{SystemTime, UNIX_EPOCH};

    use serde::Serializer;

    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_f64(to_unix(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn to_unix(t: SystemTime) -> f64 {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// Removes secrets that storage errors may carry in URLs (SAS signatures, presigned S3 parameters).
pub fn redact(s: &str) -> String {
    const SECRET_PARAMS: [&str; 5] = [
        "sig=",
        "X-Amz-Signature=",
        "X-Amz-Credential=",
        "X-Amz-Security-Token=",
        "access_token=",
    ];
    let mut out = s.to_owned();
    for p in SECRET_PARAMS {
        let mut from = 0;
        while let Some(i) = out[from..].find(p) {
            let start = from + i + p.len();
            let end = out[start..]
                .find(|c: char| c == '&' || c.is_whitespace() || c == '"' || c == '\'')
                .map(|j| start + j)
                .unwrap_or(out.len());
            out.replace_range(start..end, "REDACTED");
            from = start + "REDACTED".len();
        }
    }
    out
}

/// An error and its causes as one line: `a: b: c`, with secrets redacted.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    redact(&error_chain_raw(err))
}

fn error_chain_raw(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let m = e.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_signed_urls() {
        let e = "GET http://a/b?sv=1&sig=abc%2Fdef&se=2 failed; X-Amz-Signature=00ff X-Amz-Credential=AKIA/x";
        let r = redact(e);
        assert!(
            !r.contains("abc%2Fdef") && !r.contains("00ff") && !r.contains("AKIA"),
            "{r}"
        );
        assert!(r.contains("sig=REDACTED&se=2"), "{r}");
    }
}

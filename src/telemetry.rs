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
    let mut s = redact(&error_chain_raw(err));
    // The cloud clients refuse plain-http endpoints unless told otherwise, and say it in words
    // that name neither the setting nor the fix.
    if s.contains("URL scheme is not allowed") {
        s.push_str(
            " (the store's endpoint is plain http: set AWS_ALLOW_HTTP=true for an s3:// store, or use https)",
        );
    }
    s
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

/// Where the progress of long work goes: a status sink (`/status`, readiness reason), the terminal
/// (one-shot commands, when stderr is one), and the log for steps. Fine-grained updates (`tick`)
/// are rate-limited to one a second.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<dyn Fn(Option<String>) + Send + Sync>>,
    terminal: bool,
    last_tick: Arc<std::sync::Mutex<Option<Instant>>>,
    /// A progress line is on the terminal without its newline yet.
    open_line: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("sink", &self.sink.is_some())
            .field("terminal", &self.terminal)
            .finish()
    }
}

impl Progress {
    /// Progress into a status field.
    pub fn to(sink: impl Fn(Option<String>) + Send + Sync + 'static) -> Self {
        Self {
            sink: Some(Arc::new(sink)),
            ..Self::default()
        }
    }

    /// Progress on stderr when it is a terminal (otherwise only steps, in the log).
    pub fn terminal() -> Self {
        Self {
            terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            ..Self::default()
        }
    }

    fn show(&self, what: &str) {
        if let Some(s) = &self.sink {
            s(Some(what.to_owned()));
        }
        if self.terminal {
            use std::io::Write;
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K{what}");
            let _ = err.flush();
            self.open_line.store(true, Ordering::Relaxed);
        }
    }

    fn end_line(&self) {
        if self.open_line.swap(false, Ordering::Relaxed) {
            eprintln!();
        }
    }

    /// A step: logged (the terminal sees the log line), and shown in the status sink.
    pub fn step(&self, what: String) {
        self.end_line();
        tracing::info!(progress = %what, "progress");
        if let Some(s) = &self.sink {
            s(Some(what));
        }
    }

    /// An update shown now, whatever the rate limit (e.g. the last one of a phase).
    pub fn update(&self, what: String) {
        if self.sink.is_some() || self.terminal {
            self.show(&what);
        }
    }

    /// A fine-grained update, shown at most once a second (never logged).
    pub fn tick(&self, what: impl FnOnce() -> String) {
        if self.sink.is_none() && !self.terminal {
            return;
        }
        let mut last = self.last_tick.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        self.show(&what());
    }

    /// The work is over: clear the status field, end the terminal line.
    pub fn done(&self) {
        if let Some(s) = &self.sink {
            s(None);
        }
        self.end_line();
    }
}

/// "312.0 MiB of 1.1 GiB (28%), 95.2 MiB/s, ETA 9s" — `total` may be unknown.
pub fn rate_line(done: u64, total: Option<u64>, elapsed: Duration, unit: &str) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / secs;
    let fmt = |n: f64| {
        if unit == "B" {
            bytesize::ByteSize(n as u64).display().iec().to_string()
        } else {
            format!("{} {unit}", n as u64)
        }
    };
    match total.filter(|t| *t > 0) {
        Some(t) => {
            let pct = (done as f64 * 100.0 / t as f64).min(100.0);
            let eta = if rate > 0.0 {
                format!(
                    ", ETA {}s",
                    ((t.saturating_sub(done)) as f64 / rate).ceil() as u64
                )
            } else {
                String::new()
            };
            format!(
                "{} of {} ({pct:.0}%), {}/s{eta}",
                fmt(done as f64),
                fmt(t as f64),
                fmt(rate)
            )
        }
        None => format!("{}, {}/s", fmt(done as f64), fmt(rate)),
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn rate_lines() {
        let l = rate_line(50 << 20, Some(100 << 20), Duration::from_secs(5), "B");
        assert_eq!(l, "50.0 MiB of 100.0 MiB (50%), 10.0 MiB/s, ETA 5s");
        let l = rate_line(4500, Some(9000), Duration::from_secs(1), "revisions");
        assert_eq!(
            l,
            "4500 revisions of 9000 revisions (50%), 4500 revisions/s, ETA 1s"
        );
        assert_eq!(
            rate_line(10, None, Duration::from_secs(10), "revisions"),
            "10 revisions, 1 revisions/s"
        );
    }
}

//! `/metrics`: Prometheus text, computed at scrape time from the same state `/status` shows, plus
//! etcd's and the warden's process figures read from /proc with sysinfo.
//!
//! Metrics are a view, not a second source of truth: one collector reads the watch channels on each
//! scrape, so nothing has to remember to update a gauge.

use std::fmt::Write as _;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::state::Shared;
use crate::supervisor::Phase;
use crate::telemetry::opt_unix_seconds::to_unix;

#[derive(Debug, Default, Clone, Copy)]
struct ProcessFigures {
    rss_bytes: u64,
    cpu_seconds: f64,
    open_fds: Option<usize>,
    start_time: u64,
}

fn read_processes(pids: &[u32]) -> Vec<Option<ProcessFigures>> {
    let Ok(mut sys) = System::new() else {
        return vec![None; pids.len()];
    };
    let sys_pids: Vec<Pid> = pids.iter().map(|p| Pid::from_u32(*p)).collect();
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&sys_pids),
        true,
        ProcessRefreshKind::nothing()
            .with_memory()
            .with_cpu()
            .without_tasks(),
    );
    sys_pids
        .iter()
        .map(|pid| {
            sys.process(*pid).map(|p| ProcessFigures {
                rss_bytes: p.memory(),
                cpu_seconds: p.accumulated_cpu_time() as f64 / 1000.0,
                open_fds: p.open_files(),
                start_time: p.start_time(),
            })
        })
        .collect()
}

struct Snapshot {
    etcd_up: bool,
    etcd_healthy: bool,
    ready: bool,
    restarts: u64,
    incarnation: u64,
    orphans_reaped: u64,
    revision: Option<i64>,
    db_size: Option<i64>,
    etcd: Option<ProcessFigures>,
    warden: Option<ProcessFigures>,
    warden_start: f64,
}

#[derive(Debug)]
struct Collector {
    // Filled before encoding; the registry wants 'static + Debug.
    text: Vec<(&'static str, &'static str, Value)>,
}

#[derive(Debug, Clone, Copy)]
enum Value {
    Gauge(f64),
    Counter(f64),
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in &self.text {
            match value {
                Value::Gauge(v) => {
                    let m = ConstGauge::new(*v);
                    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
                }
                Value::Counter(v) => {
                    let m = ConstCounter::new(*v);
                    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
                }
            }
        }
        Ok(())
    }
}

fn b(v: bool) -> f64 {
    if v { 1.0 } else { 0.0 }
}

/// Renders the exposition for one scrape.
pub fn render(shared: &Shared) -> String {
    let child = shared.child.borrow().clone();
    let health = shared.health.borrow().clone();
    let etcd_pid = child.pid.filter(|_| child.phase != Phase::Stopped);
    let mut pids = vec![std::process::id()];
    pids.extend(etcd_pid);
    let figures = read_processes(&pids);
    let s = Snapshot {
        etcd_up: etcd_pid.is_some(),
        etcd_healthy: health.healthy && health.incarnation == child.incarnation && etcd_pid.is_some(),
        ready: shared.readiness().is_ok(),
        restarts: child.restarts,
        incarnation: child.incarnation,
        orphans_reaped: shared.reaper.orphans_reaped(),
        revision: health.revision,
        db_size: health.db_size,
        warden: figures.first().copied().flatten(),
        etcd: figures.get(1).copied().flatten(),
        warden_start: to_unix(shared.started_at),
    };

    let mut m: Vec<(&'static str, &'static str, Value)> = vec![
        (
            "etcd_warden_etcd_up",
            "1 while an etcd process is running under the warden.",
            Value::Gauge(b(s.etcd_up)),
        ),
        (
            "etcd_warden_etcd_healthy",
            "1 when the current etcd passed its last health check.",
            Value::Gauge(b(s.etcd_healthy)),
        ),
        (
            "etcd_warden_ready",
            "1 when /readyz answers 200.",
            Value::Gauge(b(s.ready)),
        ),
        (
            "etcd_warden_etcd_restarts",
            "Restarts of etcd after it exited unexpectedly.",
            Value::Counter(s.restarts as f64),
        ),
        (
            "etcd_warden_etcd_starts",
            "etcd processes started by the warden.",
            Value::Counter(s.incarnation as f64),
        ),
        (
            "etcd_warden_orphans_reaped",
            "Orphaned processes reaped by the warden.",
            Value::Counter(s.orphans_reaped as f64),
        ),
        (
            "etcd_warden_start_time_seconds",
            "Start time of the warden, Unix seconds.",
            Value::Gauge(s.warden_start),
        ),
    ];
    if let Some(rev) = s.revision {
        m.push((
            "etcd_warden_etcd_revision",
            "etcd's revision at the last health check.",
            Value::Gauge(rev as f64),
        ));
    }
    if let Some(size) = s.db_size {
        m.push((
            "etcd_warden_etcd_db_size_bytes",
            "etcd's backend database size at the last health check.",
            Value::Gauge(size as f64),
        ));
    }
    if let Some(p) = s.etcd {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        m.push((
            "etcd_warden_etcd_resident_memory_bytes",
            "Resident memory of the etcd process.",
            Value::Gauge(p.rss_bytes as f64),
        ));
        m.push((
            "etcd_warden_etcd_cpu_seconds",
            "CPU time used by the current etcd process.",
            Value::Counter(p.cpu_seconds),
        ));
        if let Some(fds) = p.open_fds {
            m.push((
                "etcd_warden_etcd_open_fds",
                "Open file descriptors of the etcd process.",
                Value::Gauge(fds as f64),
            ));
        }
        m.push((
            "etcd_warden_etcd_start_time_seconds",
            "Start time of the current etcd process, Unix seconds.",
            Value::Gauge(p.start_time as f64),
        ));
        m.push((
            "etcd_warden_etcd_uptime_seconds",
            "Seconds since the current etcd process started.",
            Value::Gauge(now.saturating_sub(p.start_time) as f64),
        ));
    }
    if let Some(p) = s.warden {
        m.push((
            "etcd_warden_resident_memory_bytes",
            "Resident memory of the warden itself.",
            Value::Gauge(p.rss_bytes as f64),
        ));
        m.push((
            "etcd_warden_cpu_seconds",
            "CPU time used by the warden itself.",
            Value::Counter(p.cpu_seconds),
        ));
    }

    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector { text: m }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

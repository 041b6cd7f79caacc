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

type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, f64)>,
}

#[derive(Debug)]
struct Collector {
    // Filled before encoding; the registry wants 'static + Debug.
    families: Vec<Family>,
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = if f.counter {
                ConstCounter::new(0.0).metric_type()
            } else {
                ConstGauge::new(0.0).metric_type()
            };
            let mut me = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, v) in &f.samples {
                let sample = me.encode_family(labels)?;
                if f.counter {
                    ConstCounter::new(*v).encode(sample)?;
                } else {
                    ConstGauge::new(*v).encode(sample)?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Value {
    Gauge(f64),
    Counter(f64),
}

fn kind_label(kind: &str) -> Labels {
    vec![("kind".to_owned(), kind.to_owned())]
}

/// Backup health (rule 1: shown here, never in readiness).
fn backup_families(shared: &Shared, etcd_revision: Option<i64>) -> Vec<Family> {
    let b = shared.backup.borrow().clone();
    let mut out = Vec::new();
    let gauge = |name, help, samples| Family {
        name,
        help,
        counter: false,
        samples,
    };
    let counter = |name, help, samples| Family {
        name,
        help,
        counter: true,
        samples,
    };
    out.push(gauge(
        "etcd_warden_backup_healthy",
        "1 when the last backup attempt succeeded (absent before the first attempt).",
        b.healthy
            .map(|h| vec![(Vec::new(), if h { 1.0 } else { 0.0 })])
            .unwrap_or_default(),
    ));
    if let Some(k) = &b.kube_keys {
        out.push(gauge(
            "etcd_warden_backup_kube_keys_missing",
            "--kube-encryption-config: key names the newest full snapshot's encrypted values need that the configuration lacks (a restore of it cannot be decrypted); -1 when the check failed.",
            vec![(
                Vec::new(),
                if k.error.is_some() { -1.0 } else { k.missing.len() as f64 },
            )],
        ));
    }
    // Clusters only: who writes, and whether another cluster owns the prefix.
    if let Some(role) = &b.role {
        out.push(gauge(
            "etcd_warden_backup_writer",
            "1 on the member whose warden writes the cluster's backups (its etcd leads), 0 on followers.",
            vec![(Vec::new(), if role == "writer" { 1.0 } else { 0.0 })],
        ));
        out.push(gauge(
            "etcd_warden_backup_foreign_prefix",
            "1 while another etcd cluster owns the store prefix, so this warden writes nothing there.",
            vec![(Vec::new(), if b.foreign_prefix.is_some() { 1.0 } else { 0.0 })],
        ));
    }
    out.push(counter(
        "etcd_warden_chain_breaks",
        "Times a delta chain could not continue because etcd had compacted its next revision (a full snapshot followed; the revisions between are in no delta).",
        vec![(Vec::new(), b.chain_breaks_total as f64)],
    ));
    out.push(counter(
        "etcd_warden_snapshots",
        "Snapshots uploaded, by kind.",
        vec![
            (kind_label("full"), b.fulls_total as f64),
            (kind_label("delta"), b.deltas_total as f64),
        ],
    ));
    out.push(counter(
        "etcd_warden_backup_failures",
        "Failed backup operations, by kind and a bounded reason.",
        b.failures_total
            .iter()
            .map(|(k, v)| {
                let (kind, reason) = k.split_once(':').unwrap_or((k.as_str(), "other"));
                (
                    vec![
                        ("kind".to_owned(), kind.to_owned()),
                        ("reason".to_owned(), reason.to_owned()),
                    ],
                    *v as f64,
                )
            })
            .collect(),
    ));
    let mut ages = Vec::new();
    for (kind, info) in [("full", &b.last_full), ("delta", &b.last_delta)] {
        if let Some(at) = info.as_ref().and_then(|i| i.at) {
            let age = std::time::SystemTime::now()
                .duration_since(at)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            ages.push((kind_label(kind), age));
        }
    }
    out.push(gauge(
        "etcd_warden_backup_age_seconds",
        "Seconds since the last snapshot of each kind reached the store (alert on this).",
        ages,
    ));
    let mut last_ts = Vec::new();
    let mut dur = Vec::new();
    let mut size = Vec::new();
    for (kind, info) in [("full", &b.last_full), ("delta", &b.last_delta)] {
        if let Some(i) = info {
            if let Some(at) = i.at {
                last_ts.push((kind_label(kind), to_unix(at)));
            }
            dur.push((kind_label(kind), i.duration_seconds));
            size.push((kind_label(kind), i.stored_bytes as f64));
        }
    }
    out.push(gauge(
        "etcd_warden_backup_last_success_timestamp_seconds",
        "Unix time of the last uploaded snapshot, by kind.",
        last_ts,
    ));
    out.push(gauge(
        "etcd_warden_snapshot_duration_seconds",
        "Duration of the last uploaded snapshot, by kind.",
        dur,
    ));
    out.push(gauge(
        "etcd_warden_snapshot_size_bytes",
        "Stored size of the last uploaded snapshot, by kind.",
        size,
    ));
    out.push(gauge(
        "etcd_warden_delta_pending_bytes",
        "Delta bytes buffered in memory, not yet uploaded.",
        vec![(Vec::new(), b.pending_delta_bytes as f64)],
    ));
    out.push(counter(
        "etcd_warden_defrags",
        "Defragmentations done by --defrag-schedule.",
        vec![(Vec::new(), b.defrags_total as f64)],
    ));
    if let Some(d) = &b.last_defrag {
        out.push(gauge(
            "etcd_warden_defrag_duration_seconds",
            "Duration of the last defragmentation (etcd answers nothing meanwhile).",
            vec![(Vec::new(), d.duration_seconds)],
        ));
    }
    let restores = shared.restores.borrow().clone();
    out.push(counter(
        "etcd_warden_restores",
        "Data dirs restored from the store at start (missing, broken or behind).",
        vec![(Vec::new(), restores.total as f64)],
    ));
    out.push(counter(
        "etcd_warden_restores_older_than_target",
        "Start-up restores that ended below the newest backed-up revision (corrupt or missing objects were skipped; /status .restore.startup_restores.last_skipped says which).",
        vec![(Vec::new(), restores.older_than_target_total as f64)],
    ));
    if let Some(s) = restores.last_seconds {
        out.push(gauge(
            "etcd_warden_restore_duration_seconds",
            "Duration of the last start-up restore.",
            vec![(Vec::new(), s)],
        ));
    }
    let drill = shared.drill.borrow().clone();
    if let Some(t) = drill.last_success {
        out.push(gauge(
            "etcd_warden_last_verified_restore_timestamp_seconds",
            "Unix time of the last successful restore drill (--verify-schedule).",
            vec![(Vec::new(), to_unix(t))],
        ));
    }
    if let Some(s) = drill.last_seconds {
        out.push(gauge(
            "etcd_warden_restore_drill_duration_seconds",
            "Duration of the last restore drill.",
            vec![(Vec::new(), s)],
        ));
    }
    if let Some(rev) = b.backed_up_revision {
        out.push(gauge(
            "etcd_warden_backup_revision",
            "The newest revision safely in the store.",
            vec![(Vec::new(), rev as f64)],
        ));
        if let Some(cur) = etcd_revision {
            out.push(gauge(
                "etcd_warden_delta_lag_revisions",
                "etcd's revision minus the newest revision in the store.",
                vec![(Vec::new(), (cur - rev).max(0) as f64)],
            ));
        }
    }
    out
}

/// Ownership and fencing (rule 2). Absent when no ownership check is configured.
fn ownership_families(shared: &Shared) -> Vec<Family> {
    let o = shared.ownership.borrow().clone();
    if !o.configured {
        return Vec::new();
    }
    let f = shared.fence.borrow().clone();
    let family = |name, help, counter, samples| Family {
        name,
        help,
        counter,
        samples,
    };
    let result = |r: &str| vec![("result".to_owned(), r.to_owned())];
    let state = |st: &str| (vec![("state".to_owned(), st.to_owned())], b(o.state == st));
    let mut out = vec![
        family(
            "etcd_warden_ownership_checks",
            "Ownership checks, by result (owner, not_owner, unknown = DNS error or timeout).",
            true,
            vec![
                (result("owner"), o.checks_owner_total as f64),
                (result("not_owner"), o.checks_not_owner_total as f64),
                (result("unknown"), o.checks_unknown_total as f64),
            ],
        ),
        family(
            "etcd_warden_ownership_state",
            "1 for the last check's result: owner, not-owner or unknown.",
            false,
            vec![state("owner"), state("not-owner"), state("unknown")],
        ),
        family(
            "etcd_warden_ownership_may_serve",
            "1 while this host is the confirmed owner and etcd may serve clients.",
            false,
            vec![(Vec::new(), b(o.may_serve))],
        ),
        family(
            "etcd_warden_fenced",
            "1 while etcd is fenced (killed after ownership was lost).",
            false,
            vec![(Vec::new(), b(f.fenced_since.is_some()))],
        ),
        family(
            "etcd_warden_fence_kills",
            "Times etcd was SIGKILLed because ownership was lost.",
            true,
            vec![(Vec::new(), f.kills_total as f64)],
        ),
        family(
            "etcd_warden_final_snapshots",
            "Final snapshots uploaded after a fence.",
            true,
            vec![(Vec::new(), f.final_snapshots_total as f64)],
        ),
        family(
            "etcd_warden_final_snapshot_failures",
            "Failed attempts at a final snapshot.",
            true,
            vec![(Vec::new(), f.final_snapshot_failures_total as f64)],
        ),
    ];
    if let Some(t) = o.checked_at {
        out.push(family(
            "etcd_warden_ownership_last_check_timestamp_seconds",
            "Unix time of the last ownership check.",
            false,
            vec![(Vec::new(), to_unix(t))],
        ));
    }
    if let Some(k) = f.last_kill_seconds {
        out.push(family(
            "etcd_warden_fence_kill_duration_seconds",
            "From the ownership decision to etcd reaped, at the last fence.",
            false,
            vec![(Vec::new(), k)],
        ));
    }
    out
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

    let mut families: Vec<Family> = m
        .into_iter()
        .map(|(name, help, v)| match v {
            Value::Gauge(x) => Family {
                name,
                help,
                counter: false,
                samples: vec![(Vec::new(), x)],
            },
            Value::Counter(x) => Family {
                name,
                help,
                counter: true,
                samples: vec![(Vec::new(), x)],
            },
        })
        .collect();
    families.extend(backup_families(shared, s.revision));
    families.extend(ownership_families(shared));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector { families }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

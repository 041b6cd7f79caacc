//! `/metrics`: Prometheus text, computed at scrape time from the same state `/status` shows, plus
//! etcd's and the warden's process figures read from /proc with sysinfo.
//!
//! Metrics are a view, not a second source of truth: one collector reads the watch channels on each
//! scrape, so nothing has to remember to update a gauge. Every series is described once, in
//! `catalog`.

use std::fmt::Write as _;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::etcd::supervisor::Phase;
use crate::serve::state::Shared;
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

mod catalog;

pub use catalog::{METRICS, Metric, MetricKind};

type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, f64)>,
}

impl Family {
    /// The family `name` of [`METRICS`] with these samples (a name missing there is a bug that
    /// the unit test below catches; it would be exported as a gauge without help).
    fn of(name: &'static str, samples: Vec<(Labels, f64)>) -> Family {
        let spec = METRICS.iter().find(|m| m.name == name);
        debug_assert!(spec.is_some(), "{name} is not in METRICS");
        Family {
            name,
            help: spec.map_or("", |m| m.help),
            counter: spec.is_some_and(|m| m.kind == MetricKind::Counter),
            samples,
        }
    }
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

fn kind_label(kind: &str) -> Labels {
    vec![("kind".to_owned(), kind.to_owned())]
}

/// `--copy-to` stores, labelled by URL; and what Object Lock keeps from retention, by store.
fn copy_families(shared: &Shared) -> Vec<Family> {
    let now = std::time::SystemTime::now();
    let copies = shared.copies.statuses();
    let label = |c: &crate::copies::CopyStatus| vec![("copy".to_owned(), c.store.clone())];
    let each = |f: &dyn Fn(&crate::copies::CopyStatus) -> Option<f64>| -> Vec<(Labels, f64)> {
        copies.iter().filter_map(|c| Some((label(c), f(c)?))).collect()
    };
    let mut locked: Vec<(Labels, f64)> = Vec::new();
    if let Some(l) = &shared.backup.borrow().retention_locked {
        locked.push((vec![("store".to_owned(), "primary".to_owned())], l.objects as f64));
    }
    for c in &copies {
        if let Some(l) = &c.retention_locked {
            locked.push((vec![("store".to_owned(), c.store.clone())], l.objects as f64));
        }
    }
    let family = Family::of;
    vec![
        family(
            "etcd_warden_copy_lag_revisions",
            each(&|c| Some(c.lag_revisions() as f64)),
        ),
        family(
            "etcd_warden_copy_lag_seconds",
            each(&|c| Some(c.lag_seconds(now))),
        ),
        family(
            "etcd_warden_copy_healthy",
            each(&|c| c.healthy.map(|h| if h { 1.0 } else { 0.0 })),
        ),
        family(
            "etcd_warden_copy_objects",
            each(&|c| Some(c.objects_copied_total as f64)),
        ),
        family(
            "etcd_warden_copy_bytes",
            each(&|c| Some(c.bytes_copied_total as f64)),
        ),
        family(
            "etcd_warden_copy_failures",
            each(&|c| Some(c.failures_total as f64)),
        ),
        family("etcd_warden_retention_locked_objects", locked),
    ]
}

/// A standby's lag until it is promoted, then the time the promotion took.
fn standby_families(shared: &Shared) -> Vec<Family> {
    let Some(s) = shared.standby.borrow().clone() else {
        return Vec::new();
    };
    let one = |x: f64| vec![(Vec::new(), x)];
    if s.state == crate::standby::State::Promoted {
        return s
            .promotion
            .and_then(|p| p.seconds)
            .map(|secs| vec![Family::of("etcd_warden_standby_promotion_seconds", one(secs))])
            .unwrap_or_default();
    }
    let mut out = vec![
        Family::of("etcd_warden_standby_lag_revisions", one(s.lag_revisions as f64)),
        Family::of("etcd_warden_standby_lag_seconds", one(s.lag_seconds)),
    ];
    if let Some(age) = s
        .last_listed_at
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
    {
        out.push(Family::of(
            "etcd_warden_standby_listed_age_seconds",
            one(age.as_secs_f64()),
        ));
    }
    if let Some(d) = s.apply_delay_seconds {
        out.push(Family::of("etcd_warden_standby_apply_delay_seconds", one(d)));
    }
    out
}

/// Backup health (rule 1: shown here, never in readiness).
fn backup_families(shared: &Shared, etcd_revision: Option<i64>) -> Vec<Family> {
    let b = shared.backup.borrow().clone();
    let mut out = Vec::new();
    let family = Family::of;
    out.push(family(
        "etcd_warden_backup_healthy",
        b.healthy
            .map(|h| vec![(Vec::new(), if h { 1.0 } else { 0.0 })])
            .unwrap_or_default(),
    ));
    if let Some(k) = &b.kube_keys {
        out.push(family(
            "etcd_warden_backup_kube_keys_missing",
            vec![(
                Vec::new(),
                if k.error.is_some() {
                    -1.0
                } else {
                    k.missing.len() as f64
                },
            )],
        ));
    }
    // Clusters only: who writes, and whether another cluster owns the prefix.
    if let Some(role) = &b.role {
        out.push(family(
            "etcd_warden_backup_writer",
            vec![(Vec::new(), if role == "writer" { 1.0 } else { 0.0 })],
        ));
        out.push(family(
            "etcd_warden_backup_foreign_prefix",
            vec![(Vec::new(), if b.foreign_prefix.is_some() { 1.0 } else { 0.0 })],
        ));
    }
    out.push(family(
        "etcd_warden_chain_breaks",
        vec![(Vec::new(), b.chain_breaks_total as f64)],
    ));
    out.push(family(
        "etcd_warden_snapshots",
        vec![
            (kind_label("full"), b.fulls_total as f64),
            (kind_label("delta"), b.deltas_total as f64),
        ],
    ));
    out.push(family(
        "etcd_warden_backup_failures",
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
    out.extend(snapshot_families(&b));
    out.extend(space_families(shared, &b));
    out.extend(restore_families(shared));
    if let Some(rev) = b.backed_up_revision {
        out.push(family(
            "etcd_warden_backup_revision",
            vec![(Vec::new(), rev as f64)],
        ));
        if let Some(cur) = etcd_revision {
            out.push(family(
                "etcd_warden_delta_lag_revisions",
                vec![(Vec::new(), (cur - rev).max(0) as f64)],
            ));
        }
    }
    out
}

/// The last full and delta: age, time, duration, size; and the delta not yet uploaded.
fn snapshot_families(b: &crate::backup::BackupStatus) -> Vec<Family> {
    let mut out = Vec::new();
    let family = Family::of;
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
    out.push(family("etcd_warden_backup_age_seconds", ages));
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
    out.push(family(
        "etcd_warden_backup_last_success_timestamp_seconds",
        last_ts,
    ));
    out.push(family("etcd_warden_snapshot_duration_seconds", dur));
    out.push(family("etcd_warden_snapshot_size_bytes", size));
    out.push(family(
        "etcd_warden_delta_pending_bytes",
        vec![(Vec::new(), b.pending_delta_bytes as f64)],
    ));
    out
}

/// The space keeper: its counters, etcd's space as the health loop last saw it, the last defrag.
fn space_families(shared: &Shared, b: &crate::backup::BackupStatus) -> Vec<Family> {
    let mut out = Vec::new();
    let family = Family::of;
    out.push(family(
        "etcd_warden_defrags",
        vec![(Vec::new(), b.defrags_total as f64)],
    ));
    out.push(family(
        "etcd_warden_space_repairs",
        vec![(Vec::new(), b.space_repairs_total as f64)],
    ));
    out.push(family(
        "etcd_warden_space_history_compactions",
        vec![(Vec::new(), b.space_compactions_total as f64)],
    ));
    if let Some(space) = &shared.health.borrow().space {
        out.push(family(
            "etcd_warden_space_db_size_in_use_bytes",
            vec![(Vec::new(), space.db_size_in_use as f64)],
        ));
        out.push(family(
            "etcd_warden_space_quota_bytes",
            vec![(Vec::new(), space.quota as f64)],
        ));
        out.push(family(
            "etcd_warden_space_nospace",
            vec![(Vec::new(), if space.nospace { 1.0 } else { 0.0 })],
        ));
        if let Some(secs) = space.seconds_to_nospace {
            out.push(family(
                "etcd_warden_space_seconds_to_nospace",
                vec![(Vec::new(), secs)],
            ));
        }
    }
    if let Some(d) = &b.last_defrag {
        out.push(family(
            "etcd_warden_defrag_duration_seconds",
            vec![(Vec::new(), d.duration_seconds)],
        ));
    }
    out
}

/// Restores this warden ran, and the restore drill.
fn restore_families(shared: &Shared) -> Vec<Family> {
    let mut out = Vec::new();
    let family = Family::of;
    let restores = shared.restores.borrow().clone();
    out.push(family(
        "etcd_warden_restores",
        vec![(Vec::new(), restores.total as f64)],
    ));
    out.push(family(
        "etcd_warden_restores_older_than_target",
        vec![(Vec::new(), restores.older_than_target_total as f64)],
    ));
    if let Some(s) = restores.last_seconds {
        out.push(family(
            "etcd_warden_restore_duration_seconds",
            vec![(Vec::new(), s)],
        ));
    }
    let drill = shared.drill.borrow().clone();
    if let Some(t) = drill.last_success {
        out.push(family(
            "etcd_warden_last_verified_restore_timestamp_seconds",
            vec![(Vec::new(), to_unix(t))],
        ));
    }
    if let Some(s) = drill.last_seconds {
        out.push(family(
            "etcd_warden_restore_drill_duration_seconds",
            vec![(Vec::new(), s)],
        ));
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
    let family = Family::of;
    let result = |r: &str| vec![("result".to_owned(), r.to_owned())];
    let state = |st: &str| (vec![("state".to_owned(), st.to_owned())], b(o.state == st));
    let mut out = vec![
        family(
            "etcd_warden_ownership_checks",
            vec![
                (result("owner"), o.checks_owner_total as f64),
                (result("not_owner"), o.checks_not_owner_total as f64),
                (result("unknown"), o.checks_unknown_total as f64),
            ],
        ),
        family(
            "etcd_warden_ownership_state",
            vec![state("owner"), state("not-owner"), state("unknown")],
        ),
        family(
            "etcd_warden_ownership_may_serve",
            vec![(Vec::new(), b(o.may_serve))],
        ),
        family(
            "etcd_warden_fenced",
            vec![(Vec::new(), b(f.fenced_since.is_some()))],
        ),
        family(
            "etcd_warden_fence_kills",
            vec![(Vec::new(), f.kills_total as f64)],
        ),
        family(
            "etcd_warden_final_snapshots",
            vec![(Vec::new(), f.final_snapshots_total as f64)],
        ),
        family(
            "etcd_warden_final_snapshot_failures",
            vec![(Vec::new(), f.final_snapshot_failures_total as f64)],
        ),
    ];
    if let Some(t) = o.checked_at {
        out.push(family(
            "etcd_warden_ownership_last_check_timestamp_seconds",
            vec![(Vec::new(), to_unix(t))],
        ));
    }
    if let Some(k) = f.last_kill_seconds {
        out.push(family(
            "etcd_warden_fence_kill_duration_seconds",
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

    let mut m: Vec<(&'static str, f64)> = vec![
        ("etcd_warden_etcd_up", (b(s.etcd_up))),
        ("etcd_warden_etcd_healthy", (b(s.etcd_healthy))),
        ("etcd_warden_ready", (b(s.ready))),
        ("etcd_warden_etcd_restarts", (s.restarts as f64)),
        ("etcd_warden_etcd_starts", (s.incarnation as f64)),
        ("etcd_warden_orphans_reaped", (s.orphans_reaped as f64)),
        ("etcd_warden_start_time_seconds", (s.warden_start)),
    ];
    if let Some(rev) = s.revision {
        m.push(("etcd_warden_etcd_revision", (rev as f64)));
    }
    if let Some(size) = s.db_size {
        m.push(("etcd_warden_etcd_db_size_bytes", (size as f64)));
    }
    if let Some(p) = s.etcd {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        m.push(("etcd_warden_etcd_resident_memory_bytes", (p.rss_bytes as f64)));
        m.push(("etcd_warden_etcd_cpu_seconds", (p.cpu_seconds)));
        if let Some(fds) = p.open_fds {
            m.push(("etcd_warden_etcd_open_fds", (fds as f64)));
        }
        m.push(("etcd_warden_etcd_start_time_seconds", (p.start_time as f64)));
        m.push((
            "etcd_warden_etcd_uptime_seconds",
            (now.saturating_sub(p.start_time) as f64),
        ));
    }
    if let Some(p) = s.warden {
        m.push(("etcd_warden_resident_memory_bytes", (p.rss_bytes as f64)));
        m.push(("etcd_warden_cpu_seconds", (p.cpu_seconds)));
    }

    let mut families: Vec<Family> = m
        .into_iter()
        .map(|(name, x)| Family::of(name, vec![(Vec::new(), x)]))
        .collect();
    families.extend(backup_families(shared, s.revision));
    families.extend(ownership_families(shared));
    families.extend(copy_families(shared));
    families.extend(standby_families(shared));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector { families }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::METRICS;

    /// Every family the code exports is described in METRICS, and everything METRICS describes is
    /// exported somewhere: the reference generated from it cannot drift from the exposition.
    #[test]
    fn every_exported_family_is_in_the_table_and_back() {
        let src = include_str!("mod.rs");
        let code = &src[src.find("impl Family").unwrap()..src.find("#[cfg(test)]").unwrap()];
        let used: std::collections::BTreeSet<&str> = code
            .split('"')
            .filter(|w| w.starts_with("etcd_warden_") && !w.contains(' '))
            .collect();
        let described: std::collections::BTreeSet<&str> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(used, described, "METRICS and the families the code builds differ");
        assert_eq!(described.len(), METRICS.len(), "a name appears twice in METRICS");
    }
}

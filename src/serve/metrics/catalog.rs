//! Every series the warden exports, with its kind, when it is present and its help text: the
//! exposition (`super`) takes each family's help and type from here, and docs/reference.md is
//! generated from it.

/// Whether a series counts or measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Gauge,
    Counter,
}

/// One series the warden exports: its name, kind, when it is present, and its help text.
#[derive(Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: MetricKind,
    pub present: &'static str,
    pub help: &'static str,
}

/// Every series the warden can export. The exposition takes each family's help and kind from here,
/// and docs/reference.md is generated from it.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "etcd_warden_backup_healthy",
        kind: MetricKind::Gauge,
        present: "after the first backup attempt",
        help: "1 when the last backup attempt succeeded (absent before the first attempt).",
    },
    Metric {
        name: "etcd_warden_backup_kube_keys_missing",
        kind: MetricKind::Gauge,
        present: "with --kube-encryption-config, after the first check",
        help: "--kube-encryption-config: key names the newest full snapshot's encrypted values need that the configuration lacks (a restore of it cannot be decrypted); -1 when the check failed.",
    },
    Metric {
        name: "etcd_warden_backup_writer",
        kind: MetricKind::Gauge,
        present: "clusters",
        help: "1 on the member whose warden writes the cluster's backups (its etcd leads), 0 on followers.",
    },
    Metric {
        name: "etcd_warden_backup_foreign_prefix",
        kind: MetricKind::Gauge,
        present: "clusters",
        help: "1 while another etcd cluster owns the store prefix, so this warden writes nothing there.",
    },
    Metric {
        name: "etcd_warden_chain_breaks",
        kind: MetricKind::Counter,
        present: "always",
        help: "Times a delta chain could not continue because etcd had compacted its next revision (a full snapshot followed; the revisions between are in no delta).",
    },
    Metric {
        name: "etcd_warden_snapshots",
        kind: MetricKind::Counter,
        present: "always",
        help: "Snapshots uploaded, by kind.",
    },
    Metric {
        name: "etcd_warden_backup_failures",
        kind: MetricKind::Counter,
        present: "always",
        help: "Failed backup operations, by kind and a bounded reason.",
    },
    Metric {
        name: "etcd_warden_backup_age_seconds",
        kind: MetricKind::Gauge,
        present: "per kind, after its first snapshot",
        help: "Seconds since the last snapshot of each kind reached the store (alert on this).",
    },
    Metric {
        name: "etcd_warden_backup_last_success_timestamp_seconds",
        kind: MetricKind::Gauge,
        present: "per kind, after its first snapshot",
        help: "Unix time of the last uploaded snapshot, by kind.",
    },
    Metric {
        name: "etcd_warden_snapshot_duration_seconds",
        kind: MetricKind::Gauge,
        present: "per kind, after its first snapshot",
        help: "Duration of the last uploaded snapshot, by kind.",
    },
    Metric {
        name: "etcd_warden_snapshot_size_bytes",
        kind: MetricKind::Gauge,
        present: "per kind, after its first snapshot",
        help: "Stored size of the last uploaded snapshot, by kind.",
    },
    Metric {
        name: "etcd_warden_delta_pending_bytes",
        kind: MetricKind::Gauge,
        present: "always",
        help: "Delta bytes buffered in memory, not yet uploaded.",
    },
    Metric {
        name: "etcd_warden_copy_lag_revisions",
        kind: MetricKind::Gauge,
        present: "per --copy-to store",
        help: "Revisions the writer published that the copy store does not hold yet (0 on followers and when caught up).",
    },
    Metric {
        name: "etcd_warden_copy_lag_seconds",
        kind: MetricKind::Gauge,
        present: "per --copy-to store",
        help: "How long the oldest object the copy store misses has waited since the writer published it (0 when caught up).",
    },
    Metric {
        name: "etcd_warden_copy_healthy",
        kind: MetricKind::Gauge,
        present: "per --copy-to store, after its first attempt",
        help: "1 when the last copy to this store succeeded.",
    },
    Metric {
        name: "etcd_warden_copy_objects",
        kind: MetricKind::Counter,
        present: "per --copy-to store",
        help: "Objects written to the copy store.",
    },
    Metric {
        name: "etcd_warden_copy_bytes",
        kind: MetricKind::Counter,
        present: "per --copy-to store",
        help: "Bytes written to the copy store.",
    },
    Metric {
        name: "etcd_warden_copy_failures",
        kind: MetricKind::Counter,
        present: "per --copy-to store",
        help: "Failed attempts at copying to the copy store (each is retried with backoff).",
    },
    Metric {
        name: "etcd_warden_standby_lag_revisions",
        kind: MetricKind::Gauge,
        present: "on a standby, until promoted",
        help: "Revisions the followed store holds that the standby's data dir does not yet.",
    },
    Metric {
        name: "etcd_warden_standby_lag_seconds",
        kind: MetricKind::Gauge,
        present: "on a standby, until promoted",
        help: "How long ago the oldest object the standby has not applied was written (0 when caught up).",
    },
    Metric {
        name: "etcd_warden_standby_listed_age_seconds",
        kind: MetricKind::Gauge,
        present: "on a standby, after its first listing of the store, until promoted",
        help: "Seconds since the standby last listed its store (it polls every --standby-poll): high when it cannot read the store, so its lag is unknown.",
    },
    Metric {
        name: "etcd_warden_standby_apply_delay_seconds",
        kind: MetricKind::Gauge,
        present: "on a standby, after its first applied delta, until promoted",
        help: "From the primary writing the last delta the standby applied to its being in the standby's data dir (the copy, the poll, the write).",
    },
    Metric {
        name: "etcd_warden_standby_promotion_seconds",
        kind: MetricKind::Gauge,
        present: "on a promoted standby, once etcd is ready",
        help: "From the promotion request to a ready etcd.",
    },
    Metric {
        name: "etcd_warden_retention_locked_objects",
        kind: MetricKind::Gauge,
        present: "per store, while retention leaves objects under S3 Object Lock",
        help: "Objects the last retention pass would have deleted that an S3 Object Lock keeps (store=\"primary\" or a copy's URL).",
    },
    Metric {
        name: "etcd_warden_defrags",
        kind: MetricKind::Counter,
        present: "always",
        help: "Defragmentations done by this writer (--defrag-schedule, the space keeper).",
    },
    Metric {
        name: "etcd_warden_space_repairs",
        kind: MetricKind::Counter,
        present: "always",
        help: "NOSPACE repairs this writer ran (compaction to the backed-up revision, defragmentation, disarm).",
    },
    Metric {
        name: "etcd_warden_space_history_compactions",
        kind: MetricKind::Counter,
        present: "always",
        help: "Compactions this writer ran for --space-history (never past the revision the store holds).",
    },
    Metric {
        name: "etcd_warden_space_db_size_in_use_bytes",
        kind: MetricKind::Gauge,
        present: "after etcd's first status answer",
        help: "The part of etcd's database file in use; the rest is free pages a defragmentation returns.",
    },
    Metric {
        name: "etcd_warden_space_quota_bytes",
        kind: MetricKind::Gauge,
        present: "after etcd's first status answer",
        help: "etcd's --quota-backend-bytes: the database file size at which etcd raises NOSPACE.",
    },
    Metric {
        name: "etcd_warden_space_nospace",
        kind: MetricKind::Gauge,
        present: "after etcd's first status answer",
        help: "1 while a NOSPACE alarm is raised (etcd refuses writes).",
    },
    Metric {
        name: "etcd_warden_space_seconds_to_nospace",
        kind: MetricKind::Gauge,
        present: "while the database file grows",
        help: "Seconds until the database file reaches the quota at its growth over the last 10 minutes.",
    },
    Metric {
        name: "etcd_warden_defrag_duration_seconds",
        kind: MetricKind::Gauge,
        present: "after a defragmentation",
        help: "Duration of the last defragmentation (etcd answers nothing meanwhile).",
    },
    Metric {
        name: "etcd_warden_restores",
        kind: MetricKind::Counter,
        present: "always",
        help: "Data dirs restored from the store at start (missing, broken or behind).",
    },
    Metric {
        name: "etcd_warden_restores_older_than_target",
        kind: MetricKind::Counter,
        present: "always",
        help: "Start-up restores that ended below the newest backed-up revision (corrupt or missing objects were skipped; /status .restore.startup_restores.last_skipped says which).",
    },
    Metric {
        name: "etcd_warden_restore_duration_seconds",
        kind: MetricKind::Gauge,
        present: "after a start-up restore",
        help: "Duration of the last start-up restore.",
    },
    Metric {
        name: "etcd_warden_last_verified_restore_timestamp_seconds",
        kind: MetricKind::Gauge,
        present: "after a successful restore drill",
        help: "Unix time of the last successful restore drill (--verify-schedule).",
    },
    Metric {
        name: "etcd_warden_restore_drill_duration_seconds",
        kind: MetricKind::Gauge,
        present: "after a restore drill",
        help: "Duration of the last restore drill.",
    },
    Metric {
        name: "etcd_warden_backup_revision",
        kind: MetricKind::Gauge,
        present: "once a snapshot is in the store",
        help: "The newest revision safely in the store.",
    },
    Metric {
        name: "etcd_warden_delta_lag_revisions",
        kind: MetricKind::Gauge,
        present: "once a snapshot is in the store and etcd answered",
        help: "etcd's revision minus the newest revision in the store.",
    },
    Metric {
        name: "etcd_warden_ownership_checks",
        kind: MetricKind::Counter,
        present: "with an ownership check (--owner-name)",
        help: "Ownership checks, by result (owner, not_owner, unknown = DNS error or timeout).",
    },
    Metric {
        name: "etcd_warden_ownership_state",
        kind: MetricKind::Gauge,
        present: "with an ownership check (--owner-name)",
        help: "1 for the last check's result: owner, not-owner or unknown.",
    },
    Metric {
        name: "etcd_warden_ownership_may_serve",
        kind: MetricKind::Gauge,
        present: "with an ownership check (--owner-name)",
        help: "1 while this host is the confirmed owner and etcd may serve clients.",
    },
    Metric {
        name: "etcd_warden_fenced",
        kind: MetricKind::Gauge,
        present: "with an ownership check (--owner-name)",
        help: "1 while etcd is fenced (killed after ownership was lost).",
    },
    Metric {
        name: "etcd_warden_fence_kills",
        kind: MetricKind::Counter,
        present: "with an ownership check (--owner-name)",
        help: "Times etcd was SIGKILLed because ownership was lost.",
    },
    Metric {
        name: "etcd_warden_final_snapshots",
        kind: MetricKind::Counter,
        present: "with an ownership check (--owner-name)",
        help: "Final snapshots uploaded after a fence.",
    },
    Metric {
        name: "etcd_warden_final_snapshot_failures",
        kind: MetricKind::Counter,
        present: "with an ownership check (--owner-name)",
        help: "Failed attempts at a final snapshot.",
    },
    Metric {
        name: "etcd_warden_ownership_last_check_timestamp_seconds",
        kind: MetricKind::Gauge,
        present: "with an ownership check, after the first one",
        help: "Unix time of the last ownership check.",
    },
    Metric {
        name: "etcd_warden_fence_kill_duration_seconds",
        kind: MetricKind::Gauge,
        present: "after a fence",
        help: "From the ownership decision to etcd reaped, at the last fence.",
    },
    Metric {
        name: "etcd_warden_etcd_up",
        kind: MetricKind::Gauge,
        present: "always",
        help: "1 while an etcd process is running under the warden.",
    },
    Metric {
        name: "etcd_warden_etcd_healthy",
        kind: MetricKind::Gauge,
        present: "always",
        help: "1 when the current etcd passed its last health check.",
    },
    Metric {
        name: "etcd_warden_ready",
        kind: MetricKind::Gauge,
        present: "always",
        help: "1 when /readyz answers 200.",
    },
    Metric {
        name: "etcd_warden_etcd_restarts",
        kind: MetricKind::Counter,
        present: "always",
        help: "Restarts of etcd after it exited unexpectedly.",
    },
    Metric {
        name: "etcd_warden_etcd_starts",
        kind: MetricKind::Counter,
        present: "always",
        help: "etcd processes started by the warden.",
    },
    Metric {
        name: "etcd_warden_orphans_reaped",
        kind: MetricKind::Counter,
        present: "always",
        help: "Orphaned processes reaped by the warden.",
    },
    Metric {
        name: "etcd_warden_start_time_seconds",
        kind: MetricKind::Gauge,
        present: "always",
        help: "Start time of the warden, Unix seconds.",
    },
    Metric {
        name: "etcd_warden_etcd_revision",
        kind: MetricKind::Gauge,
        present: "after etcd's first health check",
        help: "etcd's revision at the last health check.",
    },
    Metric {
        name: "etcd_warden_etcd_db_size_bytes",
        kind: MetricKind::Gauge,
        present: "after etcd's first health check",
        help: "etcd's backend database size at the last health check.",
    },
    Metric {
        name: "etcd_warden_etcd_resident_memory_bytes",
        kind: MetricKind::Gauge,
        present: "while etcd runs",
        help: "Resident memory of the etcd process.",
    },
    Metric {
        name: "etcd_warden_etcd_cpu_seconds",
        kind: MetricKind::Counter,
        present: "while etcd runs",
        help: "CPU time used by the current etcd process.",
    },
    Metric {
        name: "etcd_warden_etcd_open_fds",
        kind: MetricKind::Gauge,
        present: "while etcd runs",
        help: "Open file descriptors of the etcd process.",
    },
    Metric {
        name: "etcd_warden_etcd_start_time_seconds",
        kind: MetricKind::Gauge,
        present: "while etcd runs",
        help: "Start time of the current etcd process, Unix seconds.",
    },
    Metric {
        name: "etcd_warden_etcd_uptime_seconds",
        kind: MetricKind::Gauge,
        present: "while etcd runs",
        help: "Seconds since the current etcd process started.",
    },
    Metric {
        name: "etcd_warden_resident_memory_bytes",
        kind: MetricKind::Gauge,
        present: "always",
        help: "Resident memory of the warden itself.",
    },
    Metric {
        name: "etcd_warden_cpu_seconds",
        kind: MetricKind::Counter,
        present: "always",
        help: "CPU time used by the warden itself.",
    },
];

//! `etcd-warden restore`: etcd's data dir from the store, offline, to the newest backup, a revision,
//! a time or a rollback point.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::run::args::{DEFAULT_RESTORE_BUMP, parse_lease_ttl};
use super::shared::{ReadKeys, bump_of, keys, open_store, rollback_point, target_of};
use super::{EX_USAGE, parse_duration_arg};
use crate::store::Store;

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Where the backups are: file:///dir, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    /// The data dir to create; it must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// etcd's --wal-dir: the restored WAL goes here (it must not exist or be empty), the db into --data-dir.
    #[arg(long, value_name = "DIR")]
    pub wal_dir: Option<PathBuf>,
    /// Stop at this revision.
    #[arg(long, value_name = "N", conflicts_with = "to_time")]
    pub to_revision: Option<i64>,
    /// Stop at the newest delta written at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// The restored member's name (as etcd's --name).
    #[arg(long, default_value = "default")]
    pub name: String,
    /// As etcd's --initial-cluster [default: NAME=http://localhost:2380].
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// As etcd's --initial-advertise-peer-urls [default: http://localhost:2380].
    #[arg(long)]
    pub initial_advertise_peer_urls: Option<String>,
    /// As etcd's --initial-cluster-token.
    #[arg(long)]
    pub initial_cluster_token: Option<String>,
    /// The etcd binary (runs the private etcd that applies deltas; etcdutl/etcdctl are found beside it).
    #[arg(long, default_value = "etcd", value_name = "PATH")]
    pub etcd: String,
    /// etcdutl (3.5+) or etcdctl (3.4), when not beside etcd.
    #[arg(long, value_name = "PATH")]
    pub etcdutl: Option<PathBuf>,
    #[command(flatten)]
    pub keys: ReadKeys,
    /// Raise the restored revision by N and mark every revision up to it compacted (etcdutl's
    /// --bump-revision N --mark-compacted), as the automatic restore of `run` does: clients that
    /// saw newer revisions are never handed those numbers again, and watchers from before are told
    /// to relist. 0 restores an exact copy.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RESTORE_BUMP, value_parser = super::run::args::bump_range())]
    pub bump_revision: u64,
    /// Accepted for etcdutl's spelling: implied by a --bump-revision above 0.
    #[arg(long)]
    pub mark_compacted: bool,
    /// TTL of a lease that an etcd-backup-restore delta names: GBR records no TTL (one the full
    /// snapshot holds keeps its own)
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = parse_lease_ttl)]
    pub gbr_lease_ttl: Duration,
    /// How long to keep trying while the store does not answer (refused connections, timeouts,
    /// 5xx), with backoff, saying each time what is awaited; an error the store would repeat
    /// (no such bucket, access denied) fails at once
    #[arg(long, default_value = "2m", value_name = "DURATION", env = "ETCD_WARDEN_STORE_WAIT", value_parser = parse_duration_arg)]
    pub store_wait: Duration,
    /// Exit 0 even when corrupt or missing objects made the restore end below the newest backup
    /// (without it that is exit 2; the restored data dir is left in place either way).
    #[arg(long)]
    pub accept_older: bool,
    /// Roll back an etcd upgrade: restore the newest rollback point of data written by this etcd
    /// release (3.5, or 3.5.30 exactly), which `run` took before a newer release first started on
    /// it; --etcd names that older release's binary. Says how many revisions are lost
    #[arg(long, value_name = "VERSION", conflicts_with_all = ["to_revision", "to_time"])]
    pub etcd_version: Option<String>,
}

/// Whether a restore may write into `dir`: absent, or an empty directory.
fn restorable_into(dir: &Path) -> Result<(), &'static str> {
    match std::fs::metadata(dir) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_dir() => Err("is not a directory"),
        Ok(_) if crate::etcd::dirs::is_empty_dir(dir) => Ok(()),
        Ok(_) => Err("exists and is not empty"),
    }
}

/// `restore` restored less than the store's newest backup for the target (corrupt or missing
/// objects): the data dir holds the newest consistent point; `--accept-older` makes this exit 0.
pub const EX_OLDER: i32 = 2;

/// `etcd-warden restore`: offline restore into a new data dir. Ctrl-C stops it and leaves the target
/// untouched (the work dir beside it is removed as the restore's future is dropped).
pub async fn restore(
    args: RestoreArgs,
    reaper: crate::process::pid1::Reaper,
    mut signals: tokio::sync::mpsc::UnboundedReceiver<crate::process::signals::SignalEvent>,
) -> i32 {
    use crate::restore::{RestoreOptions, Target};
    let keys = match keys(None, None, &args.keys, None) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let store = match open_store(&args.store, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let store = store.with_gbr_lease_ttl(args.gbr_lease_ttl);
    for (flag, dir) in
        std::iter::once(("--data-dir", &args.data_dir)).chain(args.wal_dir.iter().map(|w| ("--wal-dir", w)))
    {
        if let Err(why) = restorable_into(dir) {
            eprintln!(
                "etcd-warden: {flag} {dir:?}: {why} (restore into a new or empty directory; nothing was changed)"
            );
            return EX_USAGE;
        }
    }
    let etcd = match super::shared::resolve_program_str(&args.etcd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("etcd-warden: --etcd: {e}");
            return EX_USAGE;
        }
    };
    let target = match &args.etcd_version {
        Some(v) => match rollback_point(&store, v).await {
            Ok(point) => Target::Rollback(point),
            Err(code) => return code,
        },
        None => match target_of(args.to_revision, args.to_time.as_deref()) {
            Ok(t) => t,
            Err(code) => return code,
        },
    };
    if let Err(e) = bump_of(args.bump_revision, args.mark_compacted) {
        eprintln!("etcd-warden: {e}; nothing was changed");
        return EX_USAGE;
    }
    let data_dir = if args.data_dir.is_absolute() {
        args.data_dir.clone()
    } else {
        std::env::current_dir().unwrap_or_default().join(&args.data_dir)
    };
    let opts = RestoreOptions {
        progress: crate::telemetry::Progress::terminal(),
        data_dir,
        wal_dir: args
            .wal_dir
            .as_ref()
            .map(|w| std::env::current_dir().unwrap_or_default().join(w)),
        etcd,
        tool: args.etcdutl.clone(),
        name: args.name.clone(),
        initial_cluster: args.initial_cluster.clone(),
        initial_advertise_peer_urls: args.initial_advertise_peer_urls.clone(),
        initial_cluster_token: args.initial_cluster_token.clone(),
        target,
        bump_revision: args.bump_revision,
        bump_clears_store: true,
        store_wait: args.store_wait,
    };
    let work = crate::restore::restore(&store, &opts, &reaper);
    tokio::pin!(work);
    loop {
        tokio::select! {
            r = &mut work => {
                opts.progress.done();
                return match r {
                    Ok(report) => said(&store, &opts, &report, args.accept_older).await,
                    Err(e @ crate::restore::execute::RestoreError::Tool { .. }) => {
                        eprintln!("etcd-warden: {e}; nothing was changed");
                        EX_USAGE
                    }
                    Err(e) => {
                        eprintln!("etcd-warden: restore failed: {}", crate::telemetry::error_chain(&e));
                        1
                    }
                };
            }
            Some(ev) = signals.recv() => {
                if let crate::process::signals::SignalEvent::Stop(sig) = ev {
                    eprintln!("etcd-warden: {sig}: restore interrupted; {} was not changed", opts.data_dir.display());
                    return 130;
                }
            }
        }
    }
}

/// What a rollback loses: the revisions the store holds past the point, and when they were written.
async fn print_rollback_loss(store: &Store, point: &crate::store::SnapshotName) {
    use crate::restore::{Target, plan};
    let newest = store.screened_catalog().await.ok().and_then(
        |crate::store::gate::Screened { fulls, chains, .. }| {
            let cand = plan::candidates(
                &fulls,
                &|c| chains.get(&c).cloned().unwrap_or_default(),
                Target::Latest,
            )
            .into_iter()
            .next()?;
            let last_created = cand.deltas.last().unwrap_or(&cand.full).created_ms;
            Some((cand.target_revision, last_created))
        },
    );
    match newest {
        Some((rev, at)) if rev > point.last_revision() => println!(
            "LOST by this rollback: {} revisions ({}..={rev}), written between {} and {} (the newest backup); they stay in the store",
            rev - point.last_revision(),
            point.last_revision() + 1,
            humantime::format_rfc3339_seconds(point.created()),
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at)),
        ),
        _ => println!("LOST by this rollback: nothing (the store holds no revision past the rollback point)"),
    }
}

/// Runs `restore`: it spawns etcdutl and a private etcd, so it needs the reaper and its signal
/// thread.
pub fn main(args: RestoreArgs) -> i32 {
    super::with_reaper(|reaper, signals| restore(args, reaper, signals))
}

/// What a finished restore says: where it stands against the store's newest backup, what was
/// skipped, and exit 2 when it restored less than asked for without `--accept-older`.
async fn said(
    store: &Store,
    opts: &crate::restore::RestoreOptions,
    report: &crate::restore::RestoreReport,
    accept_older: bool,
) -> i32 {
    use crate::restore::Target;
    println!(
        "restored {} at revision {} from {} (+{} deltas, {} revisions applied) in {:.1}s",
        opts.data_dir.display(),
        report.backed_up_revision,
        report.full,
        report.deltas,
        report.revisions_applied,
        report.seconds
    );
    if report.bumped_by > 0 {
        println!(
            "revision bumped by {} to {}; every revision up to it is marked compacted",
            report.bumped_by, report.revision
        );
    }
    if let Target::Rollback(point) = opts.target {
        print_rollback_loss(store, &point).await;
    }
    if opts.target != Target::Latest {
        match store.screened_catalog().await.ok().and_then(
            |crate::store::gate::Screened { fulls, chains, .. }| {
                crate::restore::plan::candidates(
                    &fulls,
                    &|c| chains.get(&c).cloned().unwrap_or_default(),
                    Target::Latest,
                )
                .first()
                .map(|c| c.target_revision)
            },
        ) {
            Some(newest) if report.revision > newest => println!(
                "NOTE: revision {} is above the store's newest backup ({newest}): `etcd-warden run` on this data dir with this store keeps it, and its next full snapshot starts a new chain.",
                report.revision
            ),
            _ => println!(
                "NOTE: this is older than the store's newest backup. Restore again without --bump-revision 0 (or with a bump above the newest backup's revision minus this one) before `etcd-warden run` with this store, or use a new --store: otherwise its start-up check would find the data dir behind and restore the newest backup over it (the dir would be kept aside, not lost)."
            ),
        }
    }
    for (key, why) in &report.skipped {
        println!("WARNING: skipped {key}: {why}");
    }
    if report.backed_up_revision < report.target_revision {
        println!(
            "WARNING: restored revision {} only; the store's newest backup for the target is revision {} (the objects above were corrupt or missing)",
            report.backed_up_revision, report.target_revision
        );
        if !accept_older {
            eprintln!(
                "etcd-warden: restored less than asked for (exit {EX_OLDER}); {} holds revision {}: pass --accept-older to take it as the result",
                opts.data_dir.display(),
                report.backed_up_revision
            );
            return EX_OLDER;
        }
    }
    0
}

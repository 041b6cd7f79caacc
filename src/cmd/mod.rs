//! The commands: each file holds one command's (or one family's) arguments and its body, and a
//! `main` that `src/main.rs` calls with the parsed arguments. This is the top of the tree: a
//! command may call any room; no room calls a command. `run` and `standby` build the run's
//! configuration once (`run::config`) and hand each part the piece it reads.

pub mod backups;
pub mod cluster;
pub mod ctl;
pub mod downgrade;
pub mod envvars;
pub mod probe;
pub mod restore;
pub mod run;
pub mod shared;
pub mod snapshot;
pub mod standby;
pub mod undo;

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::process::{pid1, signals};
use crate::telemetry;
use backups::BackupsCommand;
use cluster::ClusterCommand;
use ctl::CtlArgs;
use downgrade::DowngradeArgs;
use probe::ProbeArgs;
use restore::RestoreArgs;
use run::args::RunArgs;
use snapshot::SnapshotArgs;
use standby::StandbyArgs;
use undo::{DiffArgs, UndoArgs};

pub const SIGNALS_HELP: &str = "\
Signals to the warden:
  SIGTERM, SIGINT   graceful stop: not ready, SIGTERM to etcd, wait --stop-timeout, SIGKILL; exit with
                    etcd's status. A second one SIGKILLs etcd at once.
  SIGUSR1           full snapshot now
  SIGUSR2           flush a delta snapshot now; a standby: promote (as `ctl promote`)
  SIGHUP            re-read the config file and credentials, re-check ownership
  others            forwarded to etcd (SIGQUIT makes etcd dump its goroutines)";

/// `etcd-warden --version`: the release and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ETCD_WARDEN_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(name = "etcd-warden", version = VERSION, about = "Runs etcd: supervises, backs up, restores, fences, reports readiness.", after_help = SIGNALS_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run etcd as the warden's child: `etcd-warden run [OPTIONS] -- etcd [ETCD_ARGS...]`.
    #[command(after_help = SIGNALS_HELP)]
    Run(Box<RunArgs>),
    /// A warm standby (another region): keep the data dir restored from --store and apply each new
    /// delta as it lands, not ready and with no etcd running, until `ctl promote` (or SIGUSR2) makes
    /// it a new single-member cluster at a bumped revision that backs up to --store:
    /// `etcd-warden standby [OPTIONS] -- etcd [ETCD_ARGS...]`.
    #[command(after_help = SIGNALS_HELP)]
    Standby(Box<StandbyArgs>),
    /// Exit 0 when the warden's /readyz answers 200 (for exec probes and HEALTHCHECK).
    Probe(ProbeArgs),
    /// Take one full snapshot of a running etcd into the store, then exit.
    Snapshot(SnapshotArgs),
    /// Inspect the backups in a store.
    #[command(subcommand)]
    Backups(BackupsCommand),
    /// Restore etcd's data dir from the store (offline), to the newest backup or a point in time.
    Restore(RestoreArgs),
    /// Talk to a running warden over its admin socket (--admin-socket).
    Ctl(CtlArgs),
    /// Multi-member clusters.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Start etcd's own downgrade to the previous minor release (validate, enable, wait until every
    /// member's storage version is lowered), then say how to restart the members with it.
    Downgrade(DowngradeArgs),
    /// What returning to a past point would change: the keys it would delete (created since),
    /// restore (changed since) and re-create (deleted since), read from the store, against the
    /// live cluster or the newest backup. Nothing is changed.
    Diff(DiffArgs),
    /// Put the keys under a prefix back as they were at a past point, as new revisions, while the
    /// cluster runs: every other key keeps its changes, and watchers see ordinary events. A key
    /// changed by someone else meanwhile is reported and left alone (exit 3).
    Undo(UndoArgs),
}

/// Bad usage or configuration.
pub const EX_USAGE: i32 = 64;

/// `--timeout`-style arguments: a duration such as 2s or 500ms.
pub(crate) fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write a duration such as 2s or 500ms)"))
}

/// Runs a one-shot command on a small runtime, with warnings on stderr.
pub(crate) fn one_shot(fut: impl std::future::Future<Output = i32>) -> i32 {
    telemetry::init_logging(telemetry::LogFormat::Text);
    one_shot_quiet(fut)
}

/// Runs a one-shot command that spawns helpers: reaper, subreaper bit and signal thread first.
pub(crate) fn with_reaper<F, Fut>(f: F) -> i32
where
    F: FnOnce(pid1::Reaper, tokio::sync::mpsc::UnboundedReceiver<signals::SignalEvent>) -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    telemetry::init_logging(telemetry::LogFormat::Text);
    let reaper = pid1::Reaper::new();
    if let Err(err) = pid1::become_reaper() {
        eprintln!("etcd-warden: become the child subreaper: {err}");
        return 1;
    }
    let signals = match signals::start(reaper.clone()) {
        Ok(rx) => rx,
        Err(err) => {
            eprintln!("etcd-warden: install signal handlers: {err}");
            return 1;
        }
    };
    one_shot_quiet(f(reaper, signals))
}

/// Runs a one-shot command on a small runtime; the command says what it has to say itself.
pub(crate) fn one_shot_quiet(fut: impl std::future::Future<Output = i32>) -> i32 {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(fut);
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
        Err(err) => {
            eprintln!("etcd-warden: start runtime: {err}");
            1
        }
    }
}

//! Command line, environment and config file, validated once into an immutable [`RunConfig`].
//!
//! Every `run` option is a flag, an `ETCD_WARDEN_<OPTION>` variable and a key of the optional TOML
//! file (`--config`), in that order of precedence. Validation happens before anything is started or
//! created: a bad value stops the warden with one line that names the input and the fix (exit 64).

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use thiserror::Error;

use crate::backup::BackupConfig;
use crate::etcd::supervisor::{Launch, Policy};
use crate::etcd::{ClientConfig, EtcdArgs, TlsOverrides};
use crate::ownership::{Lookup, OwnershipConfig};
use crate::startup::member::MemberConfig;
use crate::store::StoreUrl;
use crate::store::layout::Compression;
use crate::telemetry::LogFormat;

pub const DEFAULT_LISTEN: &str = "0.0.0.0:2378";
pub const DEFAULT_PROBE_URL: &str = "http://127.0.0.1:2378/readyz";

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

/// The past point of `diff` and `undo`, and where it is read from.
/// The keys a command that reads backups trusts: the age identity that decrypts them, the public
/// keys that signed them, and the objects accepted without either.
#[derive(Debug, Clone, Default, Args)]
pub struct ReadKeys {
    /// age identity file, for backups written with --encrypt-to.
    #[arg(
        long = "identity-file",
        alias = "identity",
        env = "ETCD_WARDEN_IDENTITY_FILE",
        value_name = "FILE"
    )]
    pub identity: Option<PathBuf>,
    /// With --identity-file every backup read must be encrypted: an unencrypted object (or one of
    /// etcd-backup-restore's) is refused unless its key is named here (comma-separated)
    #[arg(
        long,
        env = "ETCD_WARDEN_ALLOW_UNENCRYPTED",
        value_name = "KEYS",
        value_delimiter = ','
    )]
    pub allow_unencrypted: Vec<String>,
    /// Ed25519 public keys (PEM, `openssl pkey -in SIGN_KEY -pubout`) the backups were signed
    /// with (`run --sign-key`): every object and record read must carry a signature by one of
    /// them (comma-separated files)
    #[arg(
        long,
        env = "ETCD_WARDEN_VERIFY_KEY",
        value_name = "FILES",
        value_delimiter = ','
    )]
    pub verify_key: Vec<PathBuf>,
    /// With --verify-key, unsigned objects (e.g. written before signing was turned on, or
    /// etcd-backup-restore's) are refused unless their keys are named here (comma-separated)
    #[arg(
        long,
        env = "ETCD_WARDEN_ALLOW_UNSIGNED",
        value_name = "KEYS",
        value_delimiter = ','
    )]
    pub allow_unsigned: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PointArgs {
    /// The store the warden backs up to (its --store); etcd-backup-restore's stores work too.
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    /// The point: this revision.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "to_time",
        required_unless_present = "to_time"
    )]
    pub to_revision: Option<i64>,
    /// The point: the newest delta written at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// Only the keys that start with this (e.g. /registry/secrets/shop/).
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub prefix: String,
    #[command(flatten)]
    pub keys: ReadKeys,
    /// Where the full snapshot is read through (a scratch file as large as the database, removed
    /// after) [default: the system's temporary directory]
    #[arg(long, value_name = "DIR")]
    pub scratch_dir: Option<PathBuf>,
    /// Print JSON for tools.
    #[arg(long)]
    pub json: bool,
}

/// How a one-shot command reaches a running etcd (`snapshot`, `diff`, `undo`, `downgrade`).
#[derive(Debug, Args)]
pub struct EtcdClientArgs {
    /// etcd client URLs, comma-separated.
    #[arg(
        long,
        env = "ETCD_WARDEN_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_name = "URLS"
    )]
    pub endpoints: String,
    /// CA certificate to verify etcd (https endpoints).
    #[arg(long = "etcd-ca", alias = "cacert", value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Client certificate, when etcd requires one.
    #[arg(long = "etcd-cert", alias = "cert", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Client key.
    #[arg(long = "etcd-key", alias = "key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// etcd user when etcd has auth enabled (`undo` writes, `snapshot` and `downgrade` need the
    /// root role); with --etcd-password-file.
    #[arg(long, env = "ETCD_WARDEN_ETCD_USER", value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// File holding that user's password (one line).
    #[arg(long, env = "ETCD_WARDEN_ETCD_PASSWORD_FILE", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub point: PointArgs,
    #[command(flatten)]
    pub live: EtcdClientArgs,
    /// Compare with the newest backup instead of the live cluster.
    #[arg(long)]
    pub against_latest: bool,
}

#[derive(Debug, Args)]
pub struct UndoArgs {
    #[command(flatten)]
    pub point: PointArgs,
    #[command(flatten)]
    pub live: EtcdClientArgs,
    /// Print what would be written (the diff of the prefix) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the keys someone changed since the diff read them, too (overwriting those changes).
    #[arg(long)]
    pub force: bool,
    /// Allow an empty --prefix: every key of the cluster goes back.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct DowngradeArgs {
    /// The release to go back to: the previous minor, e.g. 3.6 from 3.7.
    #[arg(value_name = "VERSION")]
    pub target: String,
    #[command(flatten)]
    pub client: EtcdClientArgs,
    /// Give up waiting for the storage versions after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration_arg)]
    pub timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Quorum lost: write a restore plan into the store. Every member's warden that finds it while
    /// its cluster has no quorum restores the same chain to the same revision with a new cluster
    /// token and starts a new cluster; all members come up with the same history.
    Restore(ClusterRestoreArgs),
}

#[derive(Debug, Args)]
pub struct ClusterRestoreArgs {
    /// The store the cluster's wardens back up to (their --store).
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    /// Restore to this revision.
    #[arg(long, value_name = "N", conflicts_with = "to_time")]
    pub to_revision: Option<i64>,
    /// Restore to the newest delta written at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// Raise the restored revision by N and mark every revision up to it compacted (etcdutl's
    /// --bump-revision N --mark-compacted), as the automatic restore of `run` does: clients that
    /// saw newer revisions are never handed those numbers again, and watchers from before are told
    /// to relist. 0 restores an exact copy.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RESTORE_BUMP)]
    pub bump_revision: u64,
    /// Accepted for etcdutl's spelling: implied by a --bump-revision above 0.
    #[arg(long)]
    pub mark_compacted: bool,
    /// The members, name=peer-url,... [default: the member list the store recorded]
    #[arg(long, value_name = "NAME=URL,...")]
    pub initial_cluster: Option<String>,
    /// Members apply the plan at their next start even if their cluster still has quorum.
    #[arg(long)]
    pub force: bool,
    /// Replace the pending plan (one not yet applied by every member): members that applied it
    /// restore by the new one too. Without it, a second plan while one is pending is refused.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub keys: ReadKeys,
    /// Sign the plan (and read the backups) with this Ed25519 private key, the one the members'
    /// wardens sign with (`run --sign-key`): members that verify refuse an unsigned plan.
    #[arg(long, env = "ETCD_WARDEN_SIGN_KEY", value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
    /// Roll a cluster back after an etcd upgrade: every member restores the newest rollback point of
    /// data written by this etcd release (3.5, or 3.5.30 exactly); start the members with that
    /// release's binary. With --force when the members' data is sound
    #[arg(long, value_name = "VERSION", conflicts_with_all = ["to_revision", "to_time"])]
    pub etcd_version: Option<String>,
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The running warden's --admin-socket.
    #[arg(long, env = "ETCD_WARDEN_ADMIN_SOCKET", value_name = "PATH")]
    pub admin_socket: PathBuf,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Print the warden's /status (JSON).
    Status,
    /// This member leaves its cluster for good: leadership moves away, the member is removed, etcd
    /// stops, its data dir is moved aside, and the warden exits (a restart waits, never rejoining
    /// with the removed WAL).
    Leave {
        /// Give up waiting for the warden to finish after this long.
        #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
    /// A standby becomes a new single-member cluster at a bumped revision (SIGUSR2 does the same);
    /// prints the time from the request to a ready etcd.
    Promote {
        /// Promote even while the store's newest object is younger than --standby-quiet, or when
        /// the store cannot be read.
        #[arg(long)]
        force: bool,
        /// Give up waiting for a ready etcd after this long.
        #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
    /// Ask for a snapshot now (full = SIGUSR1, delta = SIGUSR2).
    Snapshot {
        #[arg(value_enum)]
        kind: SnapshotKind,
        /// Wait until it is in the store (a delta: until everything etcd held at the request is).
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long.
        #[arg(long, default_value = "10m", value_parser = parse_duration_arg)]
        timeout: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SnapshotKind {
    Full,
    Delta,
}

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
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RESTORE_BUMP)]
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

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Where the snapshot goes: file:///dir, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    #[command(flatten)]
    pub client: EtcdClientArgs,
    #[arg(long, value_enum, default_value = "zstd")]
    pub compression: Compression,
    /// Encrypt with age to these recipients (age1…, comma-separated).
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO", value_name = "RECIPIENTS")]
    pub encrypt_to: Option<String>,
    /// Encrypt with age to the recipients in this file.
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO_FILE", value_name = "FILE")]
    pub encrypt_to_file: Option<PathBuf>,
    /// Sign the snapshot with this Ed25519 private key (PEM), as `run --sign-key` signs.
    #[arg(long, env = "ETCD_WARDEN_SIGN_KEY", value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum BackupsCommand {
    /// Bring a copy store up to date: copy the backup objects (fulls, deltas, rollback points,
    /// etcd-backup-restore's) that it misses, byte for byte, fulls first. Coordination records
    /// (head, owner, restore plans) stay with the primary.
    Copy {
        /// The store the warden writes to.
        #[arg(long, value_name = "URL")]
        from: String,
        /// The copy (another provider, region or account).
        #[arg(long, value_name = "URL")]
        to: String,
        /// Say what would be copied, copy nothing.
        #[arg(long)]
        dry_run: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List full snapshots and their delta chains, ordered by revision.
    List {
        #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
        store: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Check every object's digest and every chain's continuity; exit 1 on any problem.
    Verify {
        #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
        store: String,
        #[arg(long)]
        json: bool,
        /// Also restore the newest chain into a scratch dir and check the revision etcd reports.
        #[arg(long)]
        deep: bool,
        /// The etcd binary for --deep (etcdutl/etcdctl beside it).
        #[arg(long, default_value = "etcd", value_name = "PATH")]
        etcd: String,
        /// With --identity-file, also decrypt and check the contents of encrypted backups.
        #[command(flatten)]
        keys: ReadKeys,
        /// kube-apiserver's EncryptionConfiguration: also read every full snapshot and say which
        /// keys its encrypted values (Secrets encrypted at rest) need, and whether this file holds
        /// them all (exit 1 when not).
        #[arg(long, value_name = "FILE")]
        kube_encryption_config: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// TOML file with the same keys as the long options (e.g. `stop-timeout = "30s"`).
    #[arg(long, env = "ETCD_WARDEN_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub options: RunOptions,
    /// The etcd command line, exactly as you would run it without the warden.
    #[arg(last = true, value_name = "ETCD_BINARY [ETCD_ARGS]")]
    pub etcd: Vec<OsString>,
}

#[derive(Debug, Clone, Args)]
pub struct StandbyArgs {
    /// How often the store is listed for new deltas.
    #[arg(long, env = "ETCD_WARDEN_STANDBY_POLL", value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg)]
    pub standby_poll: Duration,
    /// Promotion refuses while the store's newest object is younger than this (the primary still
    /// writes); `ctl promote --force` skips the check.
    #[arg(long, env = "ETCD_WARDEN_STANDBY_QUIET", value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg)]
    pub standby_quiet: Duration,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Options of `run`. Also the schema of the `--config` file.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunOptions {
    /// Where backups go: file:///dir, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix
    /// [default: file://<data-dir>.backups]
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// KEY=VALUE file with store credentials (AWS_*, AZURE_*, GOOGLE_* names), re-read when it changes
    #[arg(long, env = "ETCD_WARDEN_STORE_CREDENTIALS", value_name = "FILE")]
    pub store_credentials: Option<PathBuf>,
    /// HTTP address for /readyz, /livez, /status, /metrics [default: 0.0.0.0:2378]
    #[arg(long, env = "ETCD_WARDEN_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Grace between SIGTERM and SIGKILL when stopping etcd [default: 30s]
    #[arg(long, env = "ETCD_WARDEN_STOP_TIMEOUT", value_name = "DURATION")]
    pub stop_timeout: Option<String>,
    /// First delay before restarting an etcd that died [default: 1s]
    #[arg(long, env = "ETCD_WARDEN_RESTART_BACKOFF_MIN", value_name = "DURATION")]
    pub restart_backoff_min: Option<String>,
    /// Longest delay between restarts [default: 60s]
    #[arg(long, env = "ETCD_WARDEN_RESTART_BACKOFF_MAX", value_name = "DURATION")]
    pub restart_backoff_max: Option<String>,
    /// An etcd that ran this long before dying restarts from the shortest delay [default: 5m]
    #[arg(long, env = "ETCD_WARDEN_RESTART_RESET_AFTER", value_name = "DURATION")]
    pub restart_reset_after: Option<String>,
    /// How often etcd's health is checked once it is healthy [default: 2s]
    #[arg(long, env = "ETCD_WARDEN_HEALTH_INTERVAL", value_name = "DURATION")]
    pub health_interval: Option<String>,
    /// Deadline for one health check [default: 3s]
    #[arg(long, env = "ETCD_WARDEN_HEALTH_TIMEOUT", value_name = "DURATION")]
    pub health_timeout: Option<String>,
    /// Log format on stderr [default: text]
    #[arg(long, env = "ETCD_WARDEN_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// When full snapshots are taken, cron syntax in UTC (5 fields, or 6 with seconds) [default: "0 * * * *", hourly]
    #[arg(long, env = "ETCD_WARDEN_FULL_SNAPSHOT_SCHEDULE", value_name = "CRON")]
    pub full_snapshot_schedule: Option<String>,
    /// How often buffered events are uploaded as a delta snapshot; 0 turns deltas off [default: 10s]
    #[arg(long, env = "ETCD_WARDEN_DELTA_SNAPSHOT_PERIOD", value_name = "DURATION")]
    pub delta_snapshot_period: Option<String>,
    /// Upload a delta early when this many bytes are buffered (the memory bound) [default: 32MiB]
    #[arg(long, env = "ETCD_WARDEN_DELTA_SNAPSHOT_MAX_BYTES", value_name = "SIZE")]
    pub delta_snapshot_max_bytes: Option<String>,
    /// Start a new chain with a full snapshot once the deltas hold this many revisions: bounds the
    /// replay part of a restore (about 0.3 s per 100 000 revisions on 2 cores); 0 = only on schedule [default: 200000]
    #[arg(long, env = "ETCD_WARDEN_FULL_SNAPSHOT_AFTER_REVISIONS", value_name = "N")]
    pub full_snapshot_after_revisions: Option<i64>,
    /// kube-apiserver's EncryptionConfiguration: after each full snapshot, check that it holds
    /// every key the snapshot's encrypted values (Secrets encrypted at rest) need; a missing key
    /// makes backups unhealthy (never etcd unready). Read afresh at each check [default: off]
    #[arg(long, env = "ETCD_WARDEN_KUBE_ENCRYPTION_CONFIG", value_name = "FILE")]
    pub kube_encryption_config: Option<PathBuf>,
    /// Restore drill: restore the newest chain into a scratch dir beside the data dir on this cron
    /// schedule and export the time of the last success [default: off]
    #[arg(long, env = "ETCD_WARDEN_VERIFY_SCHEDULE", value_name = "CRON")]
    pub verify_schedule: Option<String>,
    /// After an automatic restore at start, raise the revision by this much and mark everything up to
    /// it compacted, so no client is handed a revision it may have seen before the loss (as
    /// etcdutl's --bump-revision --mark-compacted); 0 turns it off [default: 1000000000]
    #[arg(long, env = "ETCD_WARDEN_RESTORE_BUMP_REVISION", value_name = "N")]
    pub restore_bump_revision: Option<u64>,
    /// Clusters: the other members' client URLs, comma-separated, for the start-up decision and a
    /// repair [default: learned from the peers' member lists over their peer URLs]
    #[arg(
        long,
        env = "ETCD_WARDEN_CLUSTER_ENDPOINTS",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub cluster_endpoints: Option<Vec<String>>,
    /// Which snapshots to keep: exponential (all of the last hour, then hourly for a day, daily for a
    /// week, weekly for four weeks) or last:N [default: exponential]
    #[arg(long, env = "ETCD_WARDEN_RETENTION", value_name = "POLICY")]
    pub retention: Option<String>,
    /// Also write every backup object to this store (another provider, region or account),
    /// asynchronously: a slow or dead copy never delays the store or readiness. Repeatable or
    /// comma-separated [default: none]
    #[arg(long, env = "ETCD_WARDEN_COPY_TO", value_name = "URL", value_delimiter = ',')]
    pub copy_to: Option<Vec<String>>,
    /// KEY=VALUE file with the copy stores' credentials (as --store-credentials), over the
    /// environment [default: the environment, as for --store]
    #[arg(long, env = "ETCD_WARDEN_COPY_CREDENTIALS", value_name = "FILE")]
    pub copy_credentials: Option<PathBuf>,
    /// Which snapshots the copy stores keep (exponential or last:N) [default: as --retention]
    #[arg(long, env = "ETCD_WARDEN_COPY_RETENTION", value_name = "POLICY")]
    pub copy_retention: Option<String>,
    /// Compression of snapshot payloads [default: zstd]
    #[arg(long, env = "ETCD_WARDEN_COMPRESSION", value_enum)]
    pub compression: Option<Compression>,
    /// CA for the warden's etcd client [default: etcd's --trusted-ca-file]
    #[arg(long, env = "ETCD_WARDEN_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for the warden's etcd client [default: etcd's --cert-file when --client-cert-auth]
    #[arg(long, env = "ETCD_WARDEN_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for the warden's etcd client [default: etcd's --key-file when --client-cert-auth]
    #[arg(long, env = "ETCD_WARDEN_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user for the warden's client when etcd has auth enabled (needs the root role: snapshots
    /// and the all-keys watch require it); with --etcd-password-file [default: none]
    #[arg(long, env = "ETCD_WARDEN_ETCD_USER", value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// File holding that user's password (one line; re-read on every reconnect) [default: none]
    #[arg(long, env = "ETCD_WARDEN_ETCD_PASSWORD_FILE", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// Encrypt new snapshots with age to these recipients (age1…, comma-separated) [default: no encryption]
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO", value_name = "RECIPIENTS")]
    pub encrypt_to: Option<String>,
    /// Encrypt new snapshots to the recipients in this file (one age1… per line, as age -R)
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO_FILE", value_name = "FILE")]
    pub encrypt_to_file: Option<PathBuf>,
    /// age identity file for restoring encrypted backups at start and in drills (not needed to write them)
    #[arg(long, env = "ETCD_WARDEN_IDENTITY_FILE", value_name = "FILE")]
    pub identity_file: Option<PathBuf>,
    /// With --identity-file every backup restored must be encrypted: an unencrypted object (or one of
    /// etcd-backup-restore's) is refused unless its key is named here (comma-separated) [default: none]
    #[arg(
        long,
        env = "ETCD_WARDEN_ALLOW_UNENCRYPTED",
        value_name = "KEYS",
        value_delimiter = ','
    )]
    pub allow_unencrypted: Option<Vec<String>>,
    /// Ed25519 private key (PEM, `openssl genpkey -algorithm ed25519`) that signs every object
    /// and record written; restores then accept only objects signed by it or --verify-key
    #[arg(long, env = "ETCD_WARDEN_SIGN_KEY", value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
    /// Ed25519 public keys (PEM, comma-separated files) whose signatures restores accept besides
    /// --sign-key's own (a key being rotated out); with either, unsigned objects are refused
    #[arg(
        long,
        env = "ETCD_WARDEN_VERIFY_KEY",
        value_name = "FILES",
        value_delimiter = ','
    )]
    pub verify_key: Option<Vec<PathBuf>>,
    /// With --sign-key or --verify-key, unsigned objects are refused unless their keys are named
    /// here (comma-separated) [default: none]
    #[arg(
        long,
        env = "ETCD_WARDEN_ALLOW_UNSIGNED",
        value_name = "KEYS",
        value_delimiter = ','
    )]
    pub allow_unsigned: Option<Vec<String>>,
    /// TTL of a lease that a restored etcd-backup-restore delta names (GBR records no TTL) [default: 1h]
    #[arg(long, env = "ETCD_WARDEN_GBR_LEASE_TTL", value_name = "DURATION")]
    pub gbr_lease_ttl: Option<String>,
    /// Defragment etcd on this cron schedule (UTC), between snapshots; readiness is held meanwhile [default: off]
    #[arg(long, env = "ETCD_WARDEN_DEFRAG_SCHEDULE", value_name = "CRON")]
    pub defrag_schedule: Option<String>,
    /// Unix socket (mode 0600) for `etcd-warden ctl`: status and snapshot requests [default: off]
    #[arg(long, env = "ETCD_WARDEN_ADMIN_SOCKET", value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// File holding the bearer token that allows POST /snapshot/* over --listen [default: refused over TCP]
    #[arg(long, env = "ETCD_WARDEN_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// DNS name whose TXT record names the host that owns the data; turns the ownership check on
    #[arg(long, env = "ETCD_WARDEN_OWNER_NAME", value_name = "NAME")]
    pub owner_name: Option<String>,
    /// This host's id: it owns the data while the TXT record at --owner-name equals this
    #[arg(long, env = "ETCD_WARDEN_OWNER_ID", value_name = "ID")]
    pub owner_id: Option<String>,
    /// How often ownership is checked; a lost owner is fenced within this [default: 2s]
    #[arg(long, env = "ETCD_WARDEN_OWNER_CHECK_INTERVAL", value_name = "DURATION")]
    pub owner_check_interval: Option<String>,
    /// DNS server to ask, IP:PORT [default: the system resolver, /etc/resolv.conf]
    #[arg(long, env = "ETCD_WARDEN_OWNER_CHECK_RESOLVER", value_name = "HOST:PORT")]
    pub owner_check_resolver: Option<String>,
    /// Deadline for one ownership check; no answer in time is "unknown", never "lost" [default: 1s]
    #[arg(long, env = "ETCD_WARDEN_OWNER_CHECK_TIMEOUT", value_name = "DURATION")]
    pub owner_check_timeout: Option<String>,
    /// Start etcd even when its release on this data dir is an upgrade or downgrade path etcd does
    /// not support (a skipped minor, 3.5 before 3.5.26 to 3.6, an older release on newer storage);
    /// logged and shown in /status. Without it such a start is refused with exit 64
    #[arg(long, env = "ETCD_WARDEN_ALLOW_UNSUPPORTED_UPGRADE")]
    pub allow_unsupported_upgrade: bool,
    /// An etcd binary of the release this data dir ran before an upgrade, kept beside the new one
    /// (as images with several releases do): a single member's rollback point is then taken
    /// through a private etcd of that release, which also applies what a crash left in the WAL
    /// but not in the db file [default: the rollback point is the db file as it is]
    #[arg(long, env = "ETCD_WARDEN_PREVIOUS_ETCD", value_name = "PATH")]
    pub previous_etcd: Option<PathBuf>,
    /// How long a rollback point stays in the store after it was taken (a duration, or `forever`);
    /// retention deletes it after that [default: 30d]
    #[arg(long, env = "ETCD_WARDEN_ROLLBACK_RETENTION", value_name = "DURATION")]
    pub rollback_retention: Option<String>,
    /// Keep etcd out of NOSPACE: when the alarm is raised, the writer compacts to the newest
    /// revision the store holds, defragments member by member (the leader last, after moving
    /// leadership away) and disarms; it also defragments when free pages pay for it [default: on]
    #[arg(long, env = "ETCD_WARDEN_SPACE_KEEPER", value_name = "on|off")]
    pub space_keeper: Option<String>,
    /// The space keeper defragments when free pages are at least this share of the db file...
    /// [default: 0.5]
    #[arg(long, env = "ETCD_WARDEN_SPACE_DEFRAG_FREE_RATIO", value_name = "RATIO")]
    pub space_defrag_free_ratio: Option<f64>,
    /// ...and at least this many bytes [default: 64MiB]
    #[arg(long, env = "ETCD_WARDEN_SPACE_DEFRAG_FREE_MIN", value_name = "SIZE")]
    pub space_defrag_free_min: Option<String>,
    /// Keep this much history: the writer compacts revisions older than this (a tenth of it
    /// apart), never past the revision the store holds, so no compaction breaks the delta chain
    /// [default: none; the warden compacts only to repair NOSPACE]
    #[arg(long, env = "ETCD_WARDEN_SPACE_HISTORY", value_name = "DURATION")]
    pub space_history: Option<String>,
    /// Report this member not ready while it defragments (by default its last verdict is held:
    /// etcd is busy, not broken)
    #[arg(long, env = "ETCD_WARDEN_SPACE_DEFRAG_NOT_READY")]
    pub space_defrag_not_ready: bool,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The warden's readiness URL.
    #[arg(long, env = "ETCD_WARDEN_PROBE_URL", default_value = DEFAULT_PROBE_URL)]
    pub url: String,
    /// Give up after this long.
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    pub timeout: Duration,
}

/// `--gbr-lease-ttl`: whole seconds, at least one (etcd's lease TTLs are seconds).
fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration_arg(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is under a second: etcd's lease TTLs are whole seconds (write e.g. 1h)"
        ));
    }
    Ok(Duration::from_secs(d.as_secs()))
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write a duration such as 2s or 500ms)"))
}

/// The default `--restore-bump-revision`: far above any backup lag (a busy cluster writes a few
/// thousand revisions a second), and still room for billions of restores in an i64.
pub const DEFAULT_RESTORE_BUMP: u64 = 1_000_000_000;

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// What the start-up, the standby, fencing and upgrades read.
    pub member: MemberConfig,
    pub listen: SocketAddr,
    pub policy: Policy,
    pub health_interval: Duration,
    pub log_format: LogFormat,
    pub config_file: Option<PathBuf>,
    pub verify_schedule: Option<croner::Cron>,
    /// `None`: no ownership check; this host always owns the data.
    pub ownership: Option<OwnershipConfig>,
    pub admin_socket: Option<PathBuf>,
    pub admin_token_file: Option<PathBuf>,
    /// `--allow-unsupported-upgrade`: an unsupported etcd release path is logged, not refused.
    pub allow_unsupported_upgrade: bool,
    /// `--previous-etcd`: the older release's binary, for the rollback point (absolute).
    pub previous_etcd: Option<PathBuf>,
    /// `etcd-warden standby`: follow the store until promoted, then run as usual.
    pub standby: Option<crate::standby::StandbyConfig>,
    /// The arguments this was built from: SIGHUP builds the configuration again from them, with
    /// the config file and credentials read afresh.
    pub source: RunArgs,
}

/// Whether `name` is a long option of `etcd-warden run` (given after `--` by mistake).
fn is_run_option(name: &str) -> bool {
    let cli = <Cli as clap::CommandFactory>::command();
    cli.find_subcommand("run").is_some_and(|run| {
        run.get_arguments()
            .any(|a| a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name)))
    })
}

/// Bad usage or configuration: exit 64.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("missing the etcd command line (write: etcd-warden run [OPTIONS] -- etcd [ETCD_ARGS...])")]
    MissingEtcd,
    #[error("--config {path:?}: {reason} (fix the file or drop --config)")]
    ConfigFile { path: PathBuf, reason: String },
    #[error("--{option} {value:?}: {reason} (write a duration such as 30s, 2m or 1h30m)")]
    Duration {
        option: &'static str,
        value: String,
        reason: String,
    },
    #[error("--{option}: {reason}")]
    Invalid { option: &'static str, reason: String },
    #[error("--store {0}")]
    Store(#[from] crate::store::StoreUrlError),
    #[error("--listen {value:?}: not an address (write HOST:PORT, e.g. 0.0.0.0:2378)")]
    Listen { value: String },
    #[error("etcd command {program:?}: {reason}")]
    EtcdBinary { program: String, reason: String },
    #[error("{0}")]
    EtcdArgs(#[from] crate::etcd::args::ArgsError),
    #[error("etcd --data-dir {path:?}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    #[error("TLS file {path:?} (from {source_name}): {reason}")]
    TlsFile {
        path: PathBuf,
        source_name: String,
        reason: String,
    },
}

impl RunOptions {
    /// Flags and env win over the file.
    fn or(self, file: RunOptions) -> RunOptions {
        RunOptions {
            store: self.store.or(file.store),
            store_credentials: self.store_credentials.or(file.store_credentials),
            listen: self.listen.or(file.listen),
            stop_timeout: self.stop_timeout.or(file.stop_timeout),
            restart_backoff_min: self.restart_backoff_min.or(file.restart_backoff_min),
            restart_backoff_max: self.restart_backoff_max.or(file.restart_backoff_max),
            restart_reset_after: self.restart_reset_after.or(file.restart_reset_after),
            health_interval: self.health_interval.or(file.health_interval),
            health_timeout: self.health_timeout.or(file.health_timeout),
            log_format: self.log_format.or(file.log_format),
            full_snapshot_schedule: self.full_snapshot_schedule.or(file.full_snapshot_schedule),
            delta_snapshot_period: self.delta_snapshot_period.or(file.delta_snapshot_period),
            delta_snapshot_max_bytes: self.delta_snapshot_max_bytes.or(file.delta_snapshot_max_bytes),
            retention: self.retention.or(file.retention),
            copy_to: self.copy_to.or(file.copy_to),
            copy_credentials: self.copy_credentials.or(file.copy_credentials),
            copy_retention: self.copy_retention.or(file.copy_retention),
            verify_schedule: self.verify_schedule.or(file.verify_schedule),
            kube_encryption_config: self.kube_encryption_config.or(file.kube_encryption_config),
            restore_bump_revision: self.restore_bump_revision.or(file.restore_bump_revision),
            cluster_endpoints: self.cluster_endpoints.or(file.cluster_endpoints),
            full_snapshot_after_revisions: self
                .full_snapshot_after_revisions
                .or(file.full_snapshot_after_revisions),
            compression: self.compression.or(file.compression),
            etcd_ca: self.etcd_ca.or(file.etcd_ca),
            etcd_cert: self.etcd_cert.or(file.etcd_cert),
            etcd_key: self.etcd_key.or(file.etcd_key),
            etcd_user: self.etcd_user.or(file.etcd_user),
            etcd_password_file: self.etcd_password_file.or(file.etcd_password_file),
            defrag_schedule: self.defrag_schedule.or(file.defrag_schedule),
            encrypt_to: self.encrypt_to.or(file.encrypt_to),
            encrypt_to_file: self.encrypt_to_file.or(file.encrypt_to_file),
            identity_file: self.identity_file.or(file.identity_file),
            allow_unencrypted: self.allow_unencrypted.or(file.allow_unencrypted),
            sign_key: self.sign_key.or(file.sign_key),
            verify_key: self.verify_key.or(file.verify_key),
            allow_unsigned: self.allow_unsigned.or(file.allow_unsigned),
            gbr_lease_ttl: self.gbr_lease_ttl.or(file.gbr_lease_ttl),
            admin_socket: self.admin_socket.or(file.admin_socket),
            allow_unsupported_upgrade: self.allow_unsupported_upgrade || file.allow_unsupported_upgrade,
            previous_etcd: self.previous_etcd.or(file.previous_etcd),
            rollback_retention: self.rollback_retention.or(file.rollback_retention),
            space_keeper: self.space_keeper.or(file.space_keeper),
            space_defrag_free_ratio: self.space_defrag_free_ratio.or(file.space_defrag_free_ratio),
            space_defrag_free_min: self.space_defrag_free_min.or(file.space_defrag_free_min),
            space_history: self.space_history.or(file.space_history),
            space_defrag_not_ready: self.space_defrag_not_ready || file.space_defrag_not_ready,
            admin_token_file: self.admin_token_file.or(file.admin_token_file),
            owner_name: self.owner_name.or(file.owner_name),
            owner_id: self.owner_id.or(file.owner_id),
            owner_check_interval: self.owner_check_interval.or(file.owner_check_interval),
            owner_check_resolver: self.owner_check_resolver.or(file.owner_check_resolver),
            owner_check_timeout: self.owner_check_timeout.or(file.owner_check_timeout),
        }
    }
}

/// `--copy-to`, `--copy-credentials`, `--copy-retention`: each copy store parsed and its client
/// built (nothing contacted), so a mistake stops the start before etcd runs.
fn copy_config(
    copy_to: &[String],
    credentials: Option<&Path>,
    copy_retention: Option<&str>,
    store: &StoreUrl,
    retention: crate::store::retention::Policy,
) -> Result<crate::copies::Config, ConfigError> {
    let invalid = |option, reason| ConfigError::Invalid { option, reason };
    let extra = match credentials {
        Some(path) => {
            crate::store::read_credentials(path).map_err(|e| invalid("copy-credentials", e.to_string()))?
        }
        None => Vec::new(),
    };
    let mut stores: Vec<StoreUrl> = Vec::new();
    for raw in copy_to.iter().filter(|u| !u.trim().is_empty()) {
        let url: StoreUrl = raw
            .trim()
            .parse()
            .map_err(|e: crate::store::StoreUrlError| invalid("copy-to", e.to_string()))?;
        if url == *store || stores.contains(&url) {
            return Err(invalid(
                "copy-to",
                format!("{raw:?} is the --store or another --copy-to already (give each copy its own store)"),
            ));
        }
        if !matches!(url, StoreUrl::File { .. }) {
            crate::store::Store::open_with(&url, &extra).map_err(|e| {
                invalid(
                    "copy-to",
                    format!("{raw:?}: {}", crate::telemetry::error_chain(&e)),
                )
            })?;
        }
        stores.push(url);
    }
    let retention = match copy_retention {
        Some(r) => r.parse().map_err(|reason| invalid("copy-retention", reason))?,
        None => retention,
    };
    if copy_retention.is_some() && stores.is_empty() {
        return Err(invalid(
            "copy-retention",
            "there is no --copy-to store to apply it to (add --copy-to URL or drop --copy-retention)"
                .to_owned(),
        ));
    }
    Ok(crate::copies::Config {
        stores,
        credentials: credentials.map(Path::to_path_buf),
        retention,
        rollback_retention: None, // set with the store's, below
    })
}

/// Reads the TOML file named by `--config`.
pub fn load_file(path: &Path) -> Result<RunOptions, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::ConfigFile {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::ConfigFile {
        path: path.to_owned(),
        reason: e.message().to_owned(),
    })
}

fn duration(option: &'static str, value: Option<&str>, default: &str) -> Result<Duration, ConfigError> {
    let v = value.unwrap_or(default);
    humantime::parse_duration(v).map_err(|e| ConfigError::Duration {
        option,
        value: v.to_owned(),
        reason: e.to_string(),
    })
}

impl RunConfig {
    /// Validates `run`'s arguments against the environment and the filesystem, touching nothing.
    pub fn from_args(args: RunArgs, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let source = args.clone();
        let file = match &args.config {
            Some(path) => load_file(path)?,
            None => RunOptions::default(),
        };
        let o = args.options.or(file);

        let (program, etcd_argv) = args.etcd.split_first().ok_or(ConfigError::MissingEtcd)?;
        let program = resolve_program(program, env.get("PATH").map(String::as_str))?;
        let etcd_argv_str: Vec<String> = etcd_argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let etcd = EtcdArgs::parse(&etcd_argv_str, env, &is_run_option)?;

        let stop_timeout = duration("stop-timeout", o.stop_timeout.as_deref(), "30s")?;
        let gbr_lease_ttl = match &o.gbr_lease_ttl {
            Some(v) => parse_lease_ttl(v).map_err(|reason| ConfigError::Invalid {
                option: "gbr-lease-ttl",
                reason,
            })?,
            None => Duration::from_secs(3600),
        };
        let backoff_min = duration("restart-backoff-min", o.restart_backoff_min.as_deref(), "1s")?;
        let backoff_max = duration("restart-backoff-max", o.restart_backoff_max.as_deref(), "60s")?;
        let reset_after = duration("restart-reset-after", o.restart_reset_after.as_deref(), "5m")?;
        let health_interval = duration("health-interval", o.health_interval.as_deref(), "2s")?;
        let health_timeout = duration("health-timeout", o.health_timeout.as_deref(), "3s")?;
        if backoff_min.is_zero() || backoff_max < backoff_min {
            return Err(ConfigError::Invalid {
                option: "restart-backoff-max",
                reason: format!(
                    "{} must be at least --restart-backoff-min {} and that above zero",
                    humantime::format_duration(backoff_max),
                    humantime::format_duration(backoff_min)
                ),
            });
        }
        if health_interval.is_zero() || health_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                option: "health-interval",
                reason: "--health-interval and --health-timeout must be above zero".to_owned(),
            });
        }

        let listen_s = o.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen_s.parse().map_err(|_| ConfigError::Listen {
            value: listen_s.to_owned(),
        })?;

        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let data_dir_abs = cwd.join(&etcd.data_dir);
        check_data_dir(&data_dir_abs)?;

        let members = etcd
            .initial_cluster
            .as_deref()
            .map(|c| c.split(',').filter(|m| !m.trim().is_empty()).count())
            .unwrap_or(1);
        if o.store.is_none() && members > 1 {
            // The default store is this member's own directory: the members would not see each
            // other's backups, the head object or a cluster restore plan.
            return Err(ConfigError::Invalid {
                option: "store",
                reason: format!(
                    "this member is one of {members} (--initial-cluster), and every member of a cluster needs the same store: give each warden the same --store (s3://bucket/prefix, gs://, az://, or a file:// directory every member sees); the default {}.backups is this member's alone",
                    data_dir_abs.display()
                ),
            });
        }
        let store = match &o.store {
            Some(s) => s.parse()?,
            None => {
                let mut p = data_dir_abs.clone().into_os_string();
                p.push(".backups");
                StoreUrl::File {
                    path: PathBuf::from(p),
                }
            }
        };

        let ownership = ownership(&o)?;
        let keys = keys(
            o.encrypt_to.as_slice(),
            o.encrypt_to_file.as_slice(),
            &ReadKeys {
                identity: o.identity_file.clone(),
                allow_unencrypted: o.allow_unencrypted.clone().unwrap_or_default(),
                verify_key: o.verify_key.clone().unwrap_or_default(),
                allow_unsigned: o.allow_unsigned.clone().unwrap_or_default(),
            },
            o.sign_key.as_deref(),
        )?;
        let defrag_schedule = match &o.defrag_schedule {
            Some(v) => Some(crate::backup::parse_cron(v).map_err(|e| ConfigError::Invalid {
                option: "defrag-schedule",
                reason: format!("{v:?}: {e} (write cron fields, e.g. \"30 4 * * *\" for 04:30 daily)"),
            })?),
            None => None,
        };
        if let Some(path) = &o.admin_token_file {
            match std::fs::read_to_string(path) {
                Ok(t) if t.trim().len() >= 16 => {}
                Ok(_) => {
                    return Err(ConfigError::Invalid {
                        option: "admin-token-file",
                        reason: format!(
                            "{}: the token must be at least 16 characters (e.g. openssl rand -hex 32 > FILE)",
                            path.display()
                        ),
                    });
                }
                Err(e) => {
                    return Err(ConfigError::Invalid {
                        option: "admin-token-file",
                        reason: format!("{}: {e} (fix the path or its permissions)", path.display()),
                    });
                }
            }
        }
        let overrides = TlsOverrides {
            ca: o.etcd_ca,
            cert: o.etcd_cert,
            key: o.etcd_key,
        };
        if overrides.cert.is_some() != overrides.key.is_some() {
            return Err(ConfigError::Invalid {
                option: "etcd-cert",
                reason: "--etcd-cert and --etcd-key go together (give both or neither)".to_owned(),
            });
        }
        let mut client = ClientConfig::from_args(&etcd, &overrides, health_timeout);
        client.user = match (o.etcd_user.clone(), o.etcd_password_file.clone()) {
            (None, None) => None,
            (Some(name), Some(password_file)) => {
                if let Err(e) = std::fs::read_to_string(&password_file) {
                    return Err(ConfigError::Invalid {
                        option: "etcd-password-file",
                        reason: format!(
                            "{}: {e} (give a readable file holding the password)",
                            password_file.display()
                        ),
                    });
                }
                Some(crate::etcd::client::UserAuth { name, password_file })
            }
            _ => {
                return Err(ConfigError::Invalid {
                    option: "etcd-user",
                    reason: "--etcd-user and --etcd-password-file go together (give both or neither)"
                        .to_owned(),
                });
            }
        };

        let schedule_s = o.full_snapshot_schedule.as_deref().unwrap_or("0 * * * *");
        let full_schedule = crate::backup::parse_cron(schedule_s).map_err(|e| ConfigError::Invalid {
            option: "full-snapshot-schedule",
            reason: format!("{schedule_s:?}: {e} (write cron fields, e.g. \"0 * * * *\" for hourly)"),
        })?;
        let delta_period = duration("delta-snapshot-period", o.delta_snapshot_period.as_deref(), "10s")?;
        let max_s = o.delta_snapshot_max_bytes.as_deref().unwrap_or("32MiB");
        let delta_max_bytes = max_s
            .parse::<bytesize::ByteSize>()
            .ok()
            .filter(|b| b.as_u64() >= 1024)
            .ok_or_else(|| ConfigError::Invalid {
                option: "delta-snapshot-max-bytes",
                reason: format!("{max_s:?}: not a size of at least 1KiB (write e.g. 32MiB)"),
            })?
            .as_u64() as usize;
        let retention_s = o.retention.as_deref().unwrap_or("exponential");
        let retention = retention_s.parse().map_err(|reason| ConfigError::Invalid {
            option: "retention",
            reason,
        })?;
        let copies = copy_config(
            o.copy_to.as_deref().unwrap_or_default(),
            o.copy_credentials.as_deref(),
            o.copy_retention.as_deref(),
            &store,
            retention,
        )?;
        if client.endpoints.is_empty() {
            return Err(ConfigError::Invalid {
                option: "listen-client-urls",
                reason: "etcd has no http(s) client URL the warden can connect to (add one, e.g. http://127.0.0.1:2379)"
                    .to_owned(),
            });
        }
        // Every TLS file etcd is told to read (client and peer, flag, variable or config file) and
        // every one the warden's client reads, whether or not the endpoints are https: one that
        // cannot be read is refused now, instead of an etcd that exits at every start.
        let mut files: Vec<(PathBuf, String)> = etcd
            .tls_files
            .iter()
            .map(|(source, path)| (path.clone(), format!("etcd's {source}")))
            .collect();
        for (path, flag) in [
            (&overrides.ca, "ca"),
            (&overrides.cert, "cert"),
            (&overrides.key, "key"),
        ] {
            if let Some(path) = path {
                files.push((path.clone(), format!("--etcd-{flag}")));
            }
        }
        for (path, source_name) in files {
            let readable = std::fs::File::open(&path).and_then(|f| {
                if f.metadata()?.is_dir() {
                    Err(std::io::Error::other("a directory, not a file"))
                } else {
                    Ok(())
                }
            });
            if let Err(e) = readable {
                return Err(ConfigError::TlsFile {
                    path,
                    source_name,
                    reason: format!("{e} (fix the path or the file's permissions)"),
                });
            }
        }

        let extra = match &o.store_credentials {
            Some(path) => crate::store::read_credentials(path).map_err(|e| ConfigError::Invalid {
                option: "store-credentials",
                reason: e.to_string(),
            })?,
            None => Vec::new(),
        };
        // A cloud store's client is built here (nothing is contacted) so that missing credentials
        // or a bad setting stop the start before etcd runs; a file store is left to be created later.
        if !matches!(store, StoreUrl::File { .. }) {
            crate::store::Store::open_with(&store, &extra).map_err(|e| ConfigError::Invalid {
                option: "store",
                reason: crate::telemetry::error_chain(&e),
            })?;
        }
        let verify_schedule = match &o.verify_schedule {
            Some(v) => Some(crate::backup::parse_cron(v).map_err(|e| ConfigError::Invalid {
                option: "verify-schedule",
                reason: format!("{v:?}: {e} (write cron fields, e.g. \"0 3 * * 0\" for Sundays at 03:00)"),
            })?),
            None => None,
        };
        let kube_encryption_config = match &o.kube_encryption_config {
            Some(path) => {
                crate::kube::encryption::config_keys(path).map_err(|reason| ConfigError::Invalid {
                    option: "kube-encryption-config",
                    reason,
                })?;
                Some(std::env::current_dir().unwrap_or_default().join(path))
            }
            None => None,
        };
        let rollback_retention = match o.rollback_retention.as_deref() {
            Some("forever") => None,
            Some(v) => Some(duration("rollback-retention", Some(v), "30d")?),
            None => Some(Duration::from_secs(30 * 86_400)),
        };
        let previous_etcd = match &o.previous_etcd {
            Some(p) => Some(
                resolve_program(&p.as_os_str().to_owned(), env.get("PATH").map(String::as_str)).map_err(|_| {
                    ConfigError::Invalid {
                        option: "previous-etcd",
                        reason: format!(
                            "{} is no executable file: give the path of the etcd binary of the release the data dir ran before",
                            p.display()
                        ),
                    }
                })?,
            ),
            None => None,
        };
        let space = {
            let enabled = match o.space_keeper.as_deref().unwrap_or("on") {
                "on" | "true" => true,
                "off" | "false" => false,
                other => {
                    return Err(ConfigError::Invalid {
                        option: "space-keeper",
                        reason: format!("{other:?}: write on or off"),
                    });
                }
            };
            let ratio = o.space_defrag_free_ratio.unwrap_or(0.5);
            if !(ratio > 0.0 && ratio < 1.0) {
                return Err(ConfigError::Invalid {
                    option: "space-defrag-free-ratio",
                    reason: format!("{ratio}: a share between 0 and 1 (write e.g. 0.5)"),
                });
            }
            let min_s = o.space_defrag_free_min.as_deref().unwrap_or("64MiB");
            let min = min_s
                .parse::<bytesize::ByteSize>()
                .map_err(|_| ConfigError::Invalid {
                    option: "space-defrag-free-min",
                    reason: format!("{min_s:?}: not a size (write e.g. 64MiB)"),
                })?
                .as_u64() as i64;
            let history = match o.space_history.as_deref() {
                None | Some("none") => None,
                Some(h) => Some(
                    humantime::parse_duration(h)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| ConfigError::Invalid {
                            option: "space-history",
                            reason: format!("{h:?}: not a duration above zero (write e.g. 1h, or none)"),
                        })?,
                ),
            };
            crate::space::Config {
                enabled,
                defrag_ratio: ratio,
                defrag_min_bytes: min,
                history,
                defrag_not_ready: o.space_defrag_not_ready,
            }
        };
        let backup = BackupConfig {
            copies: crate::copies::Config {
                rollback_retention,
                ..copies
            },
            credentials: o.store_credentials.clone(),
            store: store.clone(),
            client: client.clone(),
            compression: o.compression.unwrap_or(Compression::Zstd),
            full_schedule: Some(full_schedule),
            delta_period,
            delta_max_bytes,
            full_after_revisions: o.full_snapshot_after_revisions.unwrap_or(200_000).max(0),
            retention,
            rollback_retention,
            space,
            defrag_schedule,
            keys,
            gbr_lease_ttl,
            member_name: etcd.name.clone(),
            kube_encryption_config: kube_encryption_config.clone(),
            data_dir: std::env::current_dir().unwrap_or_default().join(&etcd.data_dir),
            cluster: etcd
                .initial_cluster
                .as_deref()
                .is_some_and(|c| c.split(',').filter(|m| !m.trim().is_empty()).count() > 1),
        };
        Ok(Self {
            member: MemberConfig {
                launch: Launch {
                    program,
                    args: etcd_argv.to_vec(),
                    env: Vec::new(),
                },
                etcd,
                client,
                store,
                backup,
                restore_bump_revision: o.restore_bump_revision.unwrap_or(DEFAULT_RESTORE_BUMP),
                cluster_endpoints: o.cluster_endpoints.clone().unwrap_or_default(),
            },
            listen,
            policy: Policy {
                backoff_min,
                backoff_max,
                reset_after,
                stop_timeout,
            },
            health_interval,
            log_format: o.log_format.unwrap_or(LogFormat::Text),
            config_file: args.config,
            verify_schedule,
            ownership,
            admin_socket: o.admin_socket,
            admin_token_file: o.admin_token_file,
            allow_unsupported_upgrade: o.allow_unsupported_upgrade,
            previous_etcd,
            standby: None,
            source,
        })
    }
}

/// The age keys from `--encrypt-to`, `--encrypt-to-file` and an identity file.
pub fn keys(
    to: &[String],
    to_files: &[PathBuf],
    read: &ReadKeys,
    sign_key: Option<&Path>,
) -> Result<crate::store::crypt::Keys, ConfigError> {
    use crate::store::crypt;
    // The reason names its source: `--encrypt-to: …`, or the file of --encrypt-to-file.
    let recipients =
        crypt::recipients(to, to_files).map_err(|reason| match reason.strip_prefix("--encrypt-to: ") {
            Some(rest) => ConfigError::Invalid {
                option: "encrypt-to",
                reason: rest.to_owned(),
            },
            None => ConfigError::Invalid {
                option: "encrypt-to-file",
                reason,
            },
        })?;
    if (!to.is_empty() || !to_files.is_empty()) && recipients.is_empty() {
        return Err(ConfigError::Invalid {
            option: "encrypt-to",
            reason: "names no recipient (write age1…, as age-keygen -y prints)".into(),
        });
    }
    let identities = match &read.identity {
        Some(p) => crypt::identities(p).map_err(|reason| ConfigError::Invalid {
            option: "identity-file",
            reason,
        })?,
        None => Vec::new(),
    };
    let signing = crate::store::sign::Signing::load(sign_key, &read.verify_key, &read.allow_unsigned)
        .map_err(|reason| ConfigError::Invalid {
            option: if sign_key.is_some_and(|k| reason.starts_with(&k.display().to_string())) {
                "sign-key"
            } else {
                "verify-key"
            },
            reason,
        })?;
    Ok(crypt::Keys {
        recipients: std::sync::Arc::new(recipients),
        identities: std::sync::Arc::new(identities),
        allow_unencrypted: std::sync::Arc::new(read.allow_unencrypted.clone()),
        signing,
    })
}

fn ownership(o: &RunOptions) -> Result<Option<OwnershipConfig>, ConfigError> {
    let (name, id) = match (&o.owner_name, &o.owner_id) {
        (None, None) => {
            for (set, option) in [
                (o.owner_check_interval.is_some(), "owner-check-interval"),
                (o.owner_check_resolver.is_some(), "owner-check-resolver"),
                (o.owner_check_timeout.is_some(), "owner-check-timeout"),
            ] {
                if set {
                    return Err(ConfigError::Invalid {
                        option,
                        reason: "needs --owner-name and --owner-id (the ownership check is off without them)"
                            .into(),
                    });
                }
            }
            return Ok(None);
        }
        (Some(name), Some(id)) => (name.trim(), id.trim()),
        (Some(_), None) => {
            return Err(ConfigError::Invalid {
                option: "owner-id",
                reason: "missing: --owner-name needs --owner-id, the value of the TXT record that means \"this host\""
                    .into(),
            });
        }
        (None, Some(_)) => {
            return Err(ConfigError::Invalid {
                option: "owner-name",
                reason: "missing: --owner-id needs --owner-name, the DNS name of the TXT record to check"
                    .into(),
            });
        }
    };
    let valid_name = !name.is_empty()
        && name.len() <= 253
        && name.trim_end_matches('.').split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid_name {
        return Err(ConfigError::Invalid {
            option: "owner-name",
            reason: format!("{name:?} is not a DNS name (write e.g. _etcd-owner.cluster.example.com)"),
        });
    }
    if id.is_empty() {
        return Err(ConfigError::Invalid {
            option: "owner-id",
            reason: "is empty (write this host's id, as the TXT record will name it)".into(),
        });
    }
    let interval = duration("owner-check-interval", o.owner_check_interval.as_deref(), "2s")?;
    let timeout = duration("owner-check-timeout", o.owner_check_timeout.as_deref(), "1s")?;
    if interval < Duration::from_millis(100) || timeout.is_zero() || timeout > interval {
        return Err(ConfigError::Invalid {
            option: "owner-check-timeout",
            reason: format!(
                "--owner-check-interval {} must be at least 100ms and --owner-check-timeout {} above zero and not longer than the interval",
                humantime::format_duration(interval),
                humantime::format_duration(timeout)
            ),
        });
    }
    let resolver = match &o.owner_check_resolver {
        None => None,
        Some(r) => Some(r.parse::<SocketAddr>().map_err(|_| ConfigError::Invalid {
            option: "owner-check-resolver",
            reason: format!("{r:?} is not IP:PORT (write e.g. 10.0.0.53:53 or [::1]:53)"),
        })?),
    };
    Ok(Some(OwnershipConfig {
        id: id.to_owned(),
        interval,
        lookup: Lookup {
            name: name.to_owned(),
            resolver,
            timeout,
        },
    }))
}

fn check_data_dir(path: &Path) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => Err(ConfigError::DataDir {
            path: path.to_owned(),
            reason: "exists and is not a directory (point --data-dir at a directory; the warden leaves this file alone)"
                .to_owned(),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ConfigError::DataDir {
            path: path.to_owned(),
            reason: format!("{e} (check the path and its permissions)"),
        }),
    }
}

/// Finds the etcd binary the way a shell would, and checks it can be executed.
pub fn resolve_program_str(program: &str) -> Result<PathBuf, ConfigError> {
    resolve_program(&OsString::from(program), std::env::var("PATH").ok().as_deref())
}

fn resolve_program(program: &OsString, path_var: Option<&str>) -> Result<PathBuf, ConfigError> {
    let name = program.to_string_lossy().into_owned();
    let is_exec = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if name.contains('/') {
        let p = PathBuf::from(program);
        return match std::fs::metadata(&p) {
            Err(e) => Err(ConfigError::EtcdBinary {
                program: name,
                reason: format!("{e} (install etcd or give the right path after --)"),
            }),
            Ok(_) if !is_exec(&p) => Err(ConfigError::EtcdBinary {
                program: name,
                reason: "not an executable file (chmod +x it or give the right path after --)".to_owned(),
            }),
            Ok(_) => Ok(p),
        };
    }
    for dir in path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin").split(':') {
        let candidate = Path::new(if dir.is_empty() { "." } else { dir }).join(&name);
        if is_exec(&candidate) {
            return Ok(candidate);
        }
    }
    Err(ConfigError::EtcdBinary {
        program: name,
        reason: "not found in PATH (install etcd or give its full path after --)".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<RunConfig, ConfigError> {
        let cli = Cli::try_parse_from(argv).expect("clap accepts");
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let env: HashMap<String, String> = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into();
        RunConfig::from_args(*args, &env)
    }

    #[test]
    fn defaults() {
        let c = parse(&["w", "run", "--", "/bin/sh", "--data-dir", "/tmp/x.etcd"]).unwrap();
        assert_eq!(c.listen, "0.0.0.0:2378".parse().unwrap());
        assert_eq!(
            c.member.store,
            StoreUrl::File {
                path: "/tmp/x.etcd.backups".into()
            }
        );
        assert_eq!(c.policy.stop_timeout, Duration::from_secs(30));
        assert_eq!(c.member.launch.program, PathBuf::from("/bin/sh"));
        assert_eq!(
            c.member.launch.args,
            vec![OsString::from("--data-dir"), OsString::from("/tmp/x.etcd")]
        );
        assert_eq!(c.member.client.endpoints, vec!["http://localhost:2379"]);
        assert_eq!(c.member.backup.gbr_lease_ttl, Duration::from_secs(3600));
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file://{}", dir.path().display());
        let c = parse(&[
            "w",
            "run",
            "--store",
            &store,
            "--gbr-lease-ttl",
            "20m",
            "--",
            "/bin/sh",
            "--data-dir",
            "/tmp/x.etcd",
        ])
        .unwrap();
        assert_eq!(
            c.member.backup.open_store().unwrap().gbr_lease_ttl,
            1200,
            "--gbr-lease-ttl reaches the store a start-up restore reads"
        );
    }

    #[test]
    fn bad_inputs_name_input_and_fix() {
        let cases: &[(&[&str], &str)] = &[
            (&["w", "run"], "missing the etcd command line"),
            (
                &["w", "run", "--stop-timeout", "10x", "--", "sh"],
                "--stop-timeout \"10x\"",
            ),
            (
                &["w", "run", "--gbr-lease-ttl", "0s", "--", "sh"],
                "--gbr-lease-ttl: \"0s\" is under a second",
            ),
            (
                &["w", "run", "--store", "s4://x", "--", "sh"],
                "unknown scheme \"s4\" (use file, s3, gs or az)",
            ),
            (
                &["w", "run", "--listen", "nope", "--", "sh"],
                "--listen \"nope\": not an address",
            ),
            (
                &["w", "run", "--", "/no/such/etcd"],
                "etcd command \"/no/such/etcd\"",
            ),
            (&["w", "run", "--", "no-such-etcd-binary"], "not found in PATH"),
            (
                &["w", "run", "--", "sh", "--data-dir", "/etc/hostname"],
                "is not a directory",
            ),
            (&["w", "run", "--etcd-cert", "/x", "--", "sh"], "go together"),
            (
                &["w", "run", "--config", "/no/such.toml", "--", "sh"],
                "--config \"/no/such.toml\"",
            ),
        ];
        for (argv, want) in cases {
            let err = parse(argv).unwrap_err().to_string();
            assert!(err.contains(want), "{argv:?}: {err:?} does not contain {want:?}");
            assert!(!err.contains('\n'), "not one line: {err:?}");
        }
    }

    #[test]
    fn config_file_keys_and_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("w.toml");
        std::fs::write(&f, "stop-timeout = \"5s\"\nlisten = \"127.0.0.1:9999\"\n").unwrap();
        let fs = f.to_str().unwrap();
        let c = parse(&["w", "run", "--config", fs, "--listen", "127.0.0.1:1", "--", "sh"]).unwrap();
        assert_eq!(c.policy.stop_timeout, Duration::from_secs(5), "file value used");
        assert_eq!(c.listen, "127.0.0.1:1".parse().unwrap(), "flag beats file");

        std::fs::write(&f, "stop-timeot = \"5s\"\n").unwrap();
        let err = parse(&["w", "run", "--config", fs, "--", "sh"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `stop-timeot`"), "{err}");
    }
}

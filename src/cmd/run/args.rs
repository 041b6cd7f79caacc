//! `run`'s options: each a flag, an `ETCD_WARDEN_<OPTION>` variable and a key of the optional TOML
//! file (`--config`), in that order of precedence. Only their shape and defaults here; what they
//! mean together is checked in `config`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::super::parse_duration_arg;
use super::super::shared::ConfigError;
use crate::store::layout::Compression;
use crate::telemetry::LogFormat;

pub const DEFAULT_LISTEN: &str = "0.0.0.0:2378";

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
    #[arg(long, env = "ETCD_WARDEN_RESTORE_BUMP_REVISION", value_name = "N", value_parser = bump_range())]
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

impl RunOptions {
    /// Flags and env win over the file.
    pub(super) fn or(self, file: RunOptions) -> RunOptions {
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

/// `--gbr-lease-ttl`: whole seconds, at least one (etcd's lease TTLs are seconds).
pub(crate) fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration_arg(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is under a second: etcd's lease TTLs are whole seconds (write e.g. 1h)"
        ));
    }
    Ok(Duration::from_secs(d.as_secs()))
}

/// The default `--restore-bump-revision`: far above any backup lag (a busy cluster writes a few
/// thousand revisions a second), and still room for billions of restores in an i64.
pub const DEFAULT_RESTORE_BUMP: u64 = 1_000_000_000;

/// `--bump-revision` and `--restore-bump-revision`: at most 2^62, the highest revision an object
/// may name (`store::gate::MAX_REVISION`), so that no bump can pass etcd's last revision.
pub(crate) fn bump_range() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(0..=crate::store::gate::MAX_REVISION as u64)
}

//! What several commands share: the arguments that read backups (`ReadKeys`) and reach a running
//! etcd (`EtcdClientArgs`), opening the store, the keys and the client from them with usage
//! errors said once (exit 64), and the few checks every restore-like command makes.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use thiserror::Error;

use super::EX_USAGE;
use crate::etcd::client::{ClientConfig, TlsFiles};
use crate::store::crypt::Keys;
use crate::store::{Store, StoreUrl};

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

/// The age keys from `--encrypt-to`, `--encrypt-to-file` and an identity file.
pub fn age_keys(
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

/// Finds the etcd binary the way a shell would, and checks it can be executed.
pub fn resolve_program_str(program: &str) -> Result<PathBuf, ConfigError> {
    resolve_program(&OsString::from(program), std::env::var("PATH").ok().as_deref())
}

pub(crate) fn resolve_program(program: &OsString, path_var: Option<&str>) -> Result<PathBuf, ConfigError> {
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

/// The store of a command that reads it (list, verify, restore, cluster restore): a local
/// directory that does not exist is an error (a typo), never created.
pub(crate) fn open_store(url: &str, keys: Keys) -> Result<Store, i32> {
    if let Ok(StoreUrl::File { path }) = url.parse::<StoreUrl>()
        && !path.is_dir()
    {
        eprintln!(
            "etcd-warden: --store {url}: {} is not a directory, so it holds no backups (check the path; nothing was created)",
            path.display()
        );
        return Err(EX_USAGE);
    }
    open_store_for_writing(url, keys)
}

/// The store of `snapshot`, which creates a local directory that does not exist yet.
pub(crate) fn open_store_for_writing(url: &str, keys: Keys) -> Result<Store, i32> {
    let parsed: StoreUrl = url.parse().map_err(|e| {
        eprintln!("etcd-warden: --store {e}");
        EX_USAGE
    })?;
    Store::open(&parsed).map(|s| s.with_keys(keys)).map_err(|e| {
        eprintln!("etcd-warden: {}", crate::telemetry::error_chain(&e));
        // A store that cannot be configured (no credentials, a bad setting) is the user's to fix.
        match e {
            crate::store::StoreError::NoCredentials { .. } | crate::store::StoreError::Configure { .. } => {
                EX_USAGE
            }
            _ => 1,
        }
    })
}

/// The keys a one-shot command was given; bad ones are usage errors.
pub(crate) fn keys(
    to: Option<&String>,
    to_file: Option<&PathBuf>,
    read: &ReadKeys,
    sign_key: Option<&Path>,
) -> Result<Keys, i32> {
    age_keys(
        to.map(std::slice::from_ref).unwrap_or_default(),
        to_file.map(std::slice::from_ref).unwrap_or_default(),
        read,
        sign_key,
    )
    .map_err(|e| {
        eprintln!("etcd-warden: {e}");
        EX_USAGE
    })
}

/// A client of `endpoints` (comma-separated URLs), with TLS files for https; the endpoints too.
pub(crate) async fn connect(args: &EtcdClientArgs) -> Result<(Vec<String>, etcd_client::Client), i32> {
    connect_to(args, &args.endpoints).await
}

/// `connect`, to `endpoints` instead of the arguments' own (one member of them).
pub(crate) async fn connect_to(
    args: &EtcdClientArgs,
    endpoints: &str,
) -> Result<(Vec<String>, etcd_client::Client), i32> {
    let (ca, cert, key) = (&args.cacert, &args.cert, &args.key);
    if cert.is_some() != key.is_some() {
        eprintln!("etcd-warden: --etcd-cert and --etcd-key go together (give both or neither)");
        return Err(EX_USAGE);
    }
    let user = match (&args.etcd_user, &args.etcd_password_file) {
        (None, None) => None,
        (Some(name), Some(password_file)) => {
            if let Err(e) = std::fs::read_to_string(password_file) {
                eprintln!(
                    "etcd-warden: --etcd-password-file {}: {e} (a file holding the password of --etcd-user)",
                    password_file.display()
                );
                return Err(EX_USAGE);
            }
            Some(crate::etcd::client::UserAuth {
                name: name.clone(),
                password_file: password_file.clone(),
            })
        }
        _ => {
            eprintln!("etcd-warden: --etcd-user and --etcd-password-file go together (give both or neither)");
            return Err(EX_USAGE);
        }
    };
    let list: Vec<String> = endpoints
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() || list.iter().any(|e| url::Url::parse(e).is_err()) {
        eprintln!(
            "etcd-warden: --endpoints {endpoints:?}: not a list of URLs (write e.g. http://127.0.0.1:2379)"
        );
        return Err(EX_USAGE);
    }
    let tls = list.iter().any(|e| e.starts_with("https://")).then(|| TlsFiles {
        ca: ca.clone(),
        identity: cert.clone().zip(key.clone()),
    });
    let cfg = ClientConfig {
        endpoints: list.clone(),
        tls,
        timeout: Duration::from_secs(10),
        user,
    };
    let unreachable = |why: String| {
        eprintln!(
            "etcd-warden: etcd at {endpoints} does not answer ({why}): check --endpoints (https needs --etcd-ca, and --etcd-cert with --etcd-key when etcd asks for a client certificate) and that etcd runs; nothing was written"
        );
        1
    };
    let mut c = cfg
        .connect()
        .await
        .map_err(|e| unreachable(concise(&crate::telemetry::error_chain(&e))))?;
    // The client connects lazily: one status asked now says whether anything answers, before
    // a command creates anything.
    match tokio::time::timeout(Duration::from_secs(10), c.status()).await {
        Ok(Ok(_)) => Ok((list, c)),
        Ok(Err(e)) => Err(unreachable(concise(&crate::telemetry::error_chain(&e)))),
        Err(_) => Err(unreachable("no answer within 10 s".into())),
    }
}

/// What a gRPC error chain says, in a few words: the causes operators meet, else the chain.
fn concise(chain: &str) -> String {
    let lower = chain.to_lowercase();
    if lower.contains("connection refused") {
        "connection refused".into()
    } else if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        format!("TLS: {chain}")
    } else if lower.contains("deadline") || lower.contains("timed out") {
        "no answer in time".into()
    } else if lower.contains("dns error") || lower.contains("failed to lookup") {
        "the host name does not resolve".into()
    } else {
        chain.to_owned()
    }
}

/// `--to-revision` / `--to-time` as a restore target; exit 64 (said on stderr) for bad input.
pub(crate) fn target_of(
    to_revision: Option<i64>,
    to_time: Option<&str>,
) -> Result<crate::restore::Target, i32> {
    use crate::restore::Target;
    match (to_revision, to_time) {
        (Some(r), _) if r < 1 => {
            eprintln!("etcd-warden: --to-revision {r}: revisions start at 1");
            Err(EX_USAGE)
        }
        (Some(r), _) => Ok(Target::Revision(r)),
        (None, Some(t)) => match crate::restore::execute::parse_time(t) {
            Ok(ms) => Ok(Target::Time(ms)),
            Err(e) => {
                eprintln!("etcd-warden: --to-time {e}");
                Err(EX_USAGE)
            }
        },
        (None, None) => Ok(Target::Latest),
    }
}

/// `--bump-revision N` (the compaction mark implied) and `--mark-compacted` as `restore` and
/// `cluster restore` take them.
pub(crate) fn bump_of(bump: u64, mark_compacted: bool) -> Result<(), String> {
    if i64::try_from(bump).is_err() {
        return Err(format!(
            "--bump-revision {bump}: too large for etcd's 64-bit revisions (write at most 9223372036854775807)"
        ));
    }
    if bump == 0 && mark_compacted {
        return Err(
            "--mark-compacted with --bump-revision 0: there is nothing to mark (drop --mark-compacted for an exact copy, or give a bump above 0)"
                .to_owned(),
        );
    }
    Ok(())
}

/// The newest rollback point of data written by etcd `version` (`3.5` or `3.5.30`); exit 64
/// naming the points there are when none matches.
pub(crate) async fn rollback_point(store: &Store, version: &str) -> Result<crate::store::SnapshotName, i32> {
    let points = crate::store::rollback::list(store).await.map_err(|e| {
        eprintln!("etcd-warden: {e}");
        1
    })?;
    let matches = |v: &str| v == version || v.starts_with(&format!("{version}."));
    match points.iter().rev().find(|(_, h, _)| matches(&h.etcd_version)) {
        Some((name, h, _)) => {
            println!(
                "rollback point {} of data written by etcd {} (taken before etcd {} started on it), revision {}",
                name.key(),
                h.etcd_version,
                h.rollback_for.as_deref().unwrap_or("?"),
                name.last_revision()
            );
            Ok(*name)
        }
        None => {
            let there: Vec<String> = points
                .iter()
                .map(|(n, h, _)| format!("{} (revision {})", h.etcd_version, n.last_revision()))
                .collect();
            eprintln!(
                "etcd-warden: --etcd-version {version}: the store holds no rollback point of data written by etcd {version} ({}); `backups list` shows them; nothing was changed",
                if there.is_empty() {
                    "it holds none".to_owned()
                } else {
                    format!("it holds: {}", there.join(", "))
                }
            );
            Err(EX_USAGE)
        }
    }
}

/// A new directory in the system's temporary directory that only this user may enter (0700),
/// under a name nobody can guess, created exclusively: a name another user created first (a
/// directory, a file or a symlink) is never used, another is drawn.
pub(crate) fn private_temp_dir(prefix: &str) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..16 {
        let dir = std::env::temp_dir().join(format!("{prefix}-{:016x}", fastrand::u64(..)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

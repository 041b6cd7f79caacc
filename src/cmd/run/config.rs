//! `run`'s command line, environment and config file (`args`), validated once into an immutable
//! [`RunConfig`]: the piece each part reads (`MemberConfig`, `BackupConfig`, `OwnershipConfig`,
//! the standby's and the copies' settings) built here and handed down; no part reads this file.
//! Validation happens before anything is started or created: a bad value stops the warden with
//! one line that names the input and the fix (exit 64).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::Cli;
use super::super::shared::{ConfigError, ReadKeys, age_keys as keys, resolve_program};
use super::args::{DEFAULT_LISTEN, DEFAULT_RESTORE_BUMP, RunArgs, RunOptions, load_file, parse_lease_ttl};
use crate::backup::BackupConfig;
use crate::etcd::supervisor::{Launch, Policy};
use crate::etcd::{ClientConfig, EtcdArgs, TlsOverrides};
use crate::ownership::{Lookup, OwnershipConfig};
use crate::startup::member::MemberConfig;
use crate::store::StoreUrl;
use crate::store::layout::Compression;
use crate::telemetry::LogFormat;

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

        let t = timings(&o)?;

        let listen_s = o.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen_s.parse().map_err(|_| ConfigError::Listen {
            value: listen_s.to_owned(),
        })?;

        let store = store_of(&o, &etcd)?;

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
            Some(v) => Some(cron("defrag-schedule", v, "\"30 4 * * *\" for 04:30 daily")?),
            None => None,
        };
        check_admin_token(o.admin_token_file.as_deref())?;
        let (client, overrides) = client_of(&o, &etcd, t.health_timeout)?;

        let schedule_s = o.full_snapshot_schedule.as_deref().unwrap_or("0 * * * *");
        let full_schedule = cron("full-snapshot-schedule", schedule_s, "\"0 * * * *\" for hourly")?;
        let delta_period = duration("delta-snapshot-period", o.delta_snapshot_period.as_deref(), "10s")?;
        let delta_max_bytes = delta_max_bytes(&o)?;
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
        check_tls_files(&client, &etcd, &overrides)?;

        check_store(&o, &store)?;
        let verify_schedule = match &o.verify_schedule {
            Some(v) => Some(cron("verify-schedule", v, "\"0 3 * * 0\" for Sundays at 03:00")?),
            None => None,
        };
        let kube_encryption_config = kube_encryption_config(&o)?;
        let rollback_retention = match o.rollback_retention.as_deref() {
            Some("forever") => None,
            Some(v) => Some(duration("rollback-retention", Some(v), "30d")?),
            None => Some(Duration::from_secs(30 * 86_400)),
        };
        let previous_etcd = previous_etcd(&o, env)?;
        let space = space_config(&o)?;
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
            gbr_lease_ttl: t.gbr_lease_ttl,
            member_name: etcd.name.clone(),
            kube_encryption_config: kube_encryption_config.clone(),
            data_dir: std::env::current_dir().unwrap_or_default().join(&etcd.data_dir),
            cluster: etcd.initial_members() > 1,
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
                backoff_min: t.backoff_min,
                backoff_max: t.backoff_max,
                reset_after: t.reset_after,
                stop_timeout: t.stop_timeout,
            },
            health_interval: t.health_interval,
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

/// A cron schedule of `option`; `example` shows the fix.
fn cron(option: &'static str, v: &str, example: &str) -> Result<croner::Cron, ConfigError> {
    crate::backup::parse_cron(v).map_err(|e| ConfigError::Invalid {
        option,
        reason: format!("{v:?}: {e} (write cron fields, e.g. {example})"),
    })
}

/// `--delta-snapshot-max-bytes`: a size of at least 1 KiB.
fn delta_max_bytes(o: &RunOptions) -> Result<usize, ConfigError> {
    let max_s = o.delta_snapshot_max_bytes.as_deref().unwrap_or("32MiB");
    Ok(max_s
        .parse::<bytesize::ByteSize>()
        .ok()
        .filter(|b| b.as_u64() >= 1024)
        .ok_or_else(|| ConfigError::Invalid {
            option: "delta-snapshot-max-bytes",
            reason: format!("{max_s:?}: not a size of at least 1KiB (write e.g. 32MiB)"),
        })?
        .as_u64() as usize)
}

/// `--kube-encryption-config`: a file whose keys can be read, made absolute.
fn kube_encryption_config(o: &RunOptions) -> Result<Option<PathBuf>, ConfigError> {
    match &o.kube_encryption_config {
        Some(path) => {
            crate::kube::encryption::config_keys(path).map_err(|reason| ConfigError::Invalid {
                option: "kube-encryption-config",
                reason,
            })?;
            Ok(Some(std::env::current_dir().unwrap_or_default().join(path)))
        }
        None => Ok(None),
    }
}

/// `run`'s timings, each checked.
struct Timings {
    stop_timeout: Duration,
    gbr_lease_ttl: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    reset_after: Duration,
    health_interval: Duration,
    health_timeout: Duration,
}

fn timings(o: &RunOptions) -> Result<Timings, ConfigError> {
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

    Ok(Timings {
        stop_timeout,
        gbr_lease_ttl,
        backoff_min,
        backoff_max,
        reset_after,
        health_interval,
        health_timeout,
    })
}

/// The store: `--store`, or a directory beside this member's data dir (a single member only).
fn store_of(o: &RunOptions, etcd: &EtcdArgs) -> Result<StoreUrl, ConfigError> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let data_dir_abs = cwd.join(&etcd.data_dir);
    check_data_dir(&data_dir_abs)?;

    let members = etcd.initial_members();
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

    Ok(store)
}

/// `--admin-token-file`: readable, and a token long enough to guess at no rate.
fn check_admin_token(path: Option<&Path>) -> Result<(), ConfigError> {
    if let Some(path) = path {
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
    Ok(())
}

/// The warden's client to etcd: etcd's own client URLs and TLS files, `--etcd-ca/-cert/-key` over
/// them, and `--etcd-user` with its password file.
fn client_of(
    o: &RunOptions,
    etcd: &EtcdArgs,
    health_timeout: Duration,
) -> Result<(ClientConfig, TlsOverrides), ConfigError> {
    let overrides = TlsOverrides {
        ca: o.etcd_ca.clone(),
        cert: o.etcd_cert.clone(),
        key: o.etcd_key.clone(),
    };
    if overrides.cert.is_some() != overrides.key.is_some() {
        return Err(ConfigError::Invalid {
            option: "etcd-cert",
            reason: "--etcd-cert and --etcd-key go together (give both or neither)".to_owned(),
        });
    }
    let mut client = ClientConfig::from_args(etcd, &overrides, health_timeout);
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
                reason: "--etcd-user and --etcd-password-file go together (give both or neither)".to_owned(),
            });
        }
    };

    Ok((client, overrides))
}

/// etcd needs a client URL the warden can reach, and every TLS file named must be readable.
fn check_tls_files(
    client: &ClientConfig,
    etcd: &EtcdArgs,
    overrides: &TlsOverrides,
) -> Result<(), ConfigError> {
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

    Ok(())
}

/// `--store-credentials` readable, and a cloud store's client buildable (nothing is contacted).
fn check_store(o: &RunOptions, store: &StoreUrl) -> Result<(), ConfigError> {
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
        crate::store::Store::open_with(store, &extra).map_err(|e| ConfigError::Invalid {
            option: "store",
            reason: crate::telemetry::error_chain(&e),
        })?;
    }
    Ok(())
}

/// `--previous-etcd`: the older release's binary, found as a shell would.
fn previous_etcd(o: &RunOptions, env: &HashMap<String, String>) -> Result<Option<PathBuf>, ConfigError> {
    Ok(match &o.previous_etcd {
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
    })
}

/// The space keeper's settings.
fn space_config(o: &RunOptions) -> Result<crate::space::Config, ConfigError> {
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
    Ok(crate::space::Config {
        enabled,
        defrag_ratio: ratio,
        defrag_min_bytes: min,
        history,
        defrag_not_ready: o.space_defrag_not_ready,
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

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser;

    use super::super::super::Command;
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

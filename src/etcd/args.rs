//! Reads the user's etcd invocation the way etcd itself reads it.
//!
//! The warden never asks the operator to repeat what the etcd command line already says: the member
//! name, the data dir, where clients connect and which TLS files they need all come from the flags
//! (`--flag value`, `--flag=value`, Go's single-dash forms) and from `ETCD_*` environment variables,
//! with flags taking precedence as in etcd. This module is pure so that every spelling is table-tested.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use thiserror::Error;
use url::Url;

use super::flags::{self, Kind};

/// What the warden needs to know about the etcd it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdArgs {
    /// `--name` (etcd's default: `default`).
    pub name: String,
    /// `--data-dir` (etcd's default: `<name>.etcd`, relative to the working directory).
    pub data_dir: PathBuf,
    /// `--wal-dir`: the WAL's own directory, when it is not `<data-dir>/member/wal`.
    pub wal_dir: Option<PathBuf>,
    /// `--listen-client-urls` (etcd's default: `http://localhost:2379`).
    pub listen_client_urls: Vec<Url>,
    /// `--listen-peer-urls` (etcd's default: `http://localhost:2380`).
    pub listen_peer_urls: Vec<Url>,
    /// `--advertise-client-urls`, if given.
    pub advertise_client_urls: Vec<Url>,
    /// `--cert-file`: the server certificate clients verify.
    pub cert_file: Option<PathBuf>,
    /// `--key-file`.
    pub key_file: Option<PathBuf>,
    /// `--trusted-ca-file`: the CA etcd uses to verify client certificates.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth`: clients must present a certificate.
    pub client_cert_auth: bool,
    /// `--auto-tls`: etcd generates a self-signed certificate.
    pub auto_tls: bool,
    /// `--initial-cluster`, kept verbatim for restore and cluster checks.
    pub initial_cluster: Option<String>,
    /// `--initial-cluster-state`.
    pub initial_cluster_state: Option<String>,
    /// `--initial-cluster-token`.
    pub initial_cluster_token: Option<String>,
    /// `--initial-advertise-peer-urls`.
    pub initial_advertise_peer_urls: Option<String>,
    /// `--quota-backend-bytes` (0 or absent: etcd's default, 2 GiB).
    pub quota_backend_bytes: Option<i64>,
    /// `--config-file` (or `ETCD_CONFIG_FILE`): etcd's YAML config, which etcd then reads instead
    /// of every other flag and `ETCD_*` variable; so does the warden.
    pub config_file: Option<PathBuf>,
    /// Every TLS file etcd is told to read (client and peer certificates, keys, CAs, CRLs), with
    /// where it was named (`flag --cert-file`, `variable ETCD_CERT_FILE`, a config file's key):
    /// one that cannot be read is refused before etcd starts, instead of etcd crash-looping.
    pub tls_files: Vec<(String, PathBuf)>,
}

/// etcd's options that name a TLS file it reads at start.
const TLS_FILE_OPTIONS: &[&str] = &[
    "cert-file",
    "key-file",
    "trusted-ca-file",
    "client-crl-file",
    "peer-cert-file",
    "peer-key-file",
    "peer-trusted-ca-file",
    "peer-crl-file",
];

/// The etcd command line cannot be understood.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("etcd flag --{flag} needs a value (write --{flag}=VALUE)")]
    MissingValue { flag: String },
    #[error("etcd {source_name} {value:?}: {reason}")]
    BadUrl {
        source_name: String,
        value: String,
        reason: String,
    },
    #[error(
        "etcd flag --{flag} is not a flag of etcd {releases} (check its spelling; if your etcd has it, write --{flag}=VALUE so that it cannot take the next word as its value)"
    )]
    UnknownFlag { flag: String, releases: String },
    #[error(
        "--{flag} after `--` goes to etcd, which has no such flag; it is an etcd-warden option: put it before `--` (etcd-warden run --{flag} … -- etcd …)"
    )]
    WardenFlag { flag: String },
    #[error("etcd flag --{flag}={value:?}: not a boolean (use true or false)")]
    BadBool { flag: String, value: String },
    #[error("etcd --config-file {path:?}: {reason}")]
    ConfigFile { path: PathBuf, reason: String },
}

impl EtcdArgs {
    /// How many members `--initial-cluster` names (1 when it is not given).
    pub fn initial_members(&self) -> usize {
        self.initial_cluster
            .as_deref()
            .map(|c| c.split(',').filter(|m| !m.trim().is_empty()).count())
            .unwrap_or(1)
    }

    /// Parses etcd's arguments (without the binary) and its environment. `is_warden_option` names
    /// the warden's own options, so one written after `--` by mistake is refused with a message
    /// that says where it goes (the caller knows the warden's options; this room does not).
    pub fn parse<S: AsRef<str>>(
        args: &[S],
        env: &HashMap<String, String>,
        is_warden_option: &dyn Fn(&str) -> bool,
    ) -> Result<Self, ArgsError> {
        let flags = collect_flags(args, is_warden_option)?;
        // etcd reads ETCD_CONFIG_FILE only when the flag is not given, and with a config file it
        // ignores every other flag and variable.
        let config_file = flags
            .get("config-file")
            .or_else(|| env.get("ETCD_CONFIG_FILE"))
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let config = match &config_file {
            Some(path) => Some(read_config_file(path)?),
            None => None,
        };
        let get = |name: &str| -> Option<(String, String)> {
            if let (Some(path), Some(config)) = (&config_file, &config) {
                return config_value(config, name)
                    .map(|v| (format!("key {name} of --config-file {}", path.display()), v));
            }
            if let Some(v) = flags.get(name) {
                return Some((format!("flag --{name}"), v.clone()));
            }
            let key = format!("ETCD_{}", name.to_uppercase().replace('-', "_"));
            env.get(&key).map(|v| (format!("variable {key}"), v.clone()))
        };
        let get_bool = |name: &str| -> Result<bool, ArgsError> {
            match get(name) {
                None => Ok(false),
                Some((_, v)) => parse_bool(&v).ok_or(ArgsError::BadBool {
                    flag: name.to_owned(),
                    value: v,
                }),
            }
        };
        let urls = |name: &str, default: Option<&str>| -> Result<Vec<Url>, ArgsError> {
            let (source_name, value) = match get(name) {
                Some(found) => found,
                None => match default {
                    Some(d) => (format!("default --{name}"), d.to_owned()),
                    None => return Ok(Vec::new()),
                },
            };
            parse_urls(&source_name, &value)
        };

        let name = get("name")
            .map(|(_, v)| v)
            .unwrap_or_else(|| "default".to_owned());
        let data_dir = get("data-dir")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| PathBuf::from(format!("{name}.etcd")));
        Ok(Self {
            wal_dir: get("wal-dir")
                .map(|(_, v)| PathBuf::from(v))
                .filter(|p| !p.as_os_str().is_empty()),
            listen_client_urls: urls("listen-client-urls", Some("http://localhost:2379"))?,
            listen_peer_urls: urls("listen-peer-urls", Some("http://localhost:2380"))?,
            advertise_client_urls: urls("advertise-client-urls", None)?,
            cert_file: get("cert-file").map(|(_, v)| PathBuf::from(v)),
            key_file: get("key-file").map(|(_, v)| PathBuf::from(v)),
            trusted_ca_file: get("trusted-ca-file").map(|(_, v)| PathBuf::from(v)),
            client_cert_auth: get_bool("client-cert-auth")?,
            auto_tls: get_bool("auto-tls")?,
            initial_cluster: get("initial-cluster").map(|(_, v)| v),
            initial_cluster_state: get("initial-cluster-state").map(|(_, v)| v),
            initial_cluster_token: get("initial-cluster-token").map(|(_, v)| v),
            initial_advertise_peer_urls: get("initial-advertise-peer-urls").map(|(_, v)| v),
            quota_backend_bytes: get("quota-backend-bytes").and_then(|(_, v)| v.trim().parse().ok()),
            tls_files: TLS_FILE_OPTIONS
                .iter()
                .filter_map(|o| get(o))
                .filter(|(_, v)| !v.is_empty())
                .map(|(source, v)| (source, PathBuf::from(v)))
                .collect(),
            config_file,
            name,
            data_dir,
        })
    }

    /// Endpoints for the warden's own client: each listen URL, with wildcard hosts made loopback
    /// (etcd listening on 0.0.0.0 answers on 127.0.0.1) and unix sockets left out.
    pub fn client_endpoints(&self) -> Vec<String> {
        let mut out = Vec::new();
        for url in &self.listen_client_urls {
            let scheme = match url.scheme() {
                "http" | "https" => url.scheme(),
                _ => continue,
            };
            let host = match url.host_str() {
                Some("0.0.0.0") | Some("") | None => "127.0.0.1".to_owned(),
                Some("[::]") => "[::1]".to_owned(),
                Some(h) => h.to_owned(),
            };
            let port = url.port().unwrap_or(2379);
            let endpoint = format!("{scheme}://{host}:{port}");
            if !out.contains(&endpoint) {
                out.push(endpoint);
            }
        }
        out
    }

    /// The data dir, absolute (against the working directory, as etcd resolves it).
    pub fn data_path(&self) -> PathBuf {
        cwd().join(&self.data_dir)
    }

    /// `--wal-dir`, absolute; `None` when the WAL lives in the data dir.
    pub fn wal_path(&self) -> Option<PathBuf> {
        self.wal_dir.as_ref().map(|w| cwd().join(w))
    }

    /// Whether the warden's client must speak TLS to etcd.
    pub fn uses_tls(&self) -> bool {
        self.listen_client_urls.iter().any(|u| u.scheme() == "https")
    }
}

/// etcd's config file as etcd reads it (sigs.k8s.io/yaml: YAML turned into JSON, so JSON too).
fn read_config_file(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>, ArgsError> {
    let failed = |reason: String| ArgsError::ConfigFile {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(format!("cannot be read: {e}")))?;
    let value: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| failed(format!("is not YAML etcd can read: {e}")))?;
    match value {
        serde_json::Value::Object(map) => Ok(map),
        serde_json::Value::Null => Ok(serde_json::Map::new()),
        _ => Err(failed(
            "is not a mapping of etcd's settings (name: ..., data-dir: ...)".to_owned(),
        )),
    }
}

/// The setting `name` in etcd's config file: the client TLS settings sit under
/// `client-transport-security`, the rest at the top; values as etcd's flags would spell them.
fn config_value(config: &serde_json::Map<String, serde_json::Value>, name: &str) -> Option<String> {
    let v = match name {
        "cert-file" | "key-file" | "trusted-ca-file" | "client-cert-auth" | "auto-tls" => {
            config.get("client-transport-security")?.get(name)?
        }
        "client-crl-file" => config.get("client-transport-security")?.get("crl-file")?,
        "peer-cert-file" | "peer-key-file" | "peer-trusted-ca-file" | "peer-crl-file" => config
            .get("peer-transport-security")?
            .get(name.trim_start_matches("peer-"))?,
        _ => config.get(name)?,
    };
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// etcd's command line and environment with these settings changed (the cluster flags a rejoin
/// or a restore plan sets), each where the operator set it: a flag stays a flag; a setting given
/// only as an `ETCD_*` variable (in `env`) is changed in the child's environment, never shadowed
/// by a flag (etcd 3.6+ exits on a flag that shadows a set variable); a new one becomes a flag.
/// With a config file, etcd would ignore both: the settings go into a copy of the file, written
/// to `copy`, and the command line points `--config-file` at that copy.
pub fn with_settings(
    args: &[std::ffi::OsString],
    env: &HashMap<String, String>,
    config_file: Option<&Path>,
    copy: &Path,
    settings: &[(String, String)],
) -> Result<Settings, ArgsError> {
    let Some(path) = config_file else {
        let text: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let given = collect_flags(&text, &|_| false)?;
        let mut out = Settings {
            args: args.to_vec(),
            env: Vec::new(),
        };
        for (k, v) in settings {
            let var = format!("ETCD_{}", k.to_uppercase().replace('-', "_"));
            if !given.contains_key(k.as_str()) && env.contains_key(&var) {
                out.env.push((var, v.clone()));
            } else {
                out.args = with_flag(&out.args, k, v);
            }
        }
        return Ok(out);
    };
    let mut config = read_config_file(path)?;
    for (k, v) in settings {
        config.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    // JSON is YAML to etcd's reader.
    let text = serde_json::to_string_pretty(&config).expect("a JSON map serializes");
    super::dirs::write_fresh(copy, text.as_bytes()).map_err(|e| ArgsError::ConfigFile {
        path: copy.to_owned(),
        reason: format!("cannot write the warden's copy with {settings:?}: {e}"),
    })?;
    Ok(Settings {
        args: with_flag(args, "config-file", &copy.display().to_string()),
        env: Vec::new(),
    })
}

/// etcd's command line and the variables to set in its environment (`with_settings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub args: Vec<std::ffi::OsString>,
    pub env: Vec<(String, String)>,
}

fn cwd() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
}

fn parse_bool(v: &str) -> Option<bool> {
    // Go's strconv.ParseBool.
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn parse_urls(source_name: &str, value: &str) -> Result<Vec<Url>, ArgsError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Url::parse(s).map_err(|e| ArgsError::BadUrl {
                source_name: source_name.to_owned(),
                value: s.to_owned(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Go's flag package: `-f`, `--f`, `-f=v`, `--f=v`, `-f v`; bools never consume the next word;
/// `--` or the first non-flag word ends the flags.
fn collect_flags<S: AsRef<str>>(
    args: &[S],
    is_warden_option: &dyn Fn(&str) -> bool,
) -> Result<HashMap<String, String>, ArgsError> {
    let mut flags = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_ref();
        i += 1;
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            break;
        }
        let body = arg.trim_start_matches('-');
        let word = body.split_once('=').map_or(body, |(n, _)| n);
        if flags::lookup(word).is_none() && is_warden_option(word) {
            return Err(ArgsError::WardenFlag {
                flag: word.to_owned(),
            });
        }
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.to_owned(), v.to_owned()),
            None => match flags::lookup(body).map(|f| f.kind) {
                Some(Kind::Bool) => (body.to_owned(), "true".to_owned()),
                Some(Kind::Value) => {
                    let Some(v) = args.get(i) else {
                        return Err(ArgsError::MissingValue {
                            flag: body.to_owned(),
                        });
                    };
                    i += 1;
                    (body.to_owned(), v.as_ref().to_owned())
                }
                // An unknown word: whether it takes the next one cannot be known, so nothing
                // after it can be trusted either (the data dir above all).
                None => {
                    return Err(ArgsError::UnknownFlag {
                        flag: body.to_owned(),
                        releases: flags::releases().join(", "),
                    });
                }
            },
        };
        // Go keeps the last occurrence of a flag.
        flags.insert(name, value);
    }
    Ok(flags)
}

/// etcd's command line with `--flag=value` in place of every form of `flag` it had (`--flag v`,
/// `--flag=v`, `-flag v`, `-flag=v`), appended at the end.
pub fn with_flag(args: &[std::ffi::OsString], flag: &str, value: &str) -> Vec<std::ffi::OsString> {
    let long = format!("--{flag}");
    let short = format!("-{flag}");
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == long || s == short {
            it.next();
            continue;
        }
        if s.starts_with(&format!("{long}=")) || s.starts_with(&format!("{short}=")) {
            continue;
        }
        out.push(a.clone());
    }
    out.push(format!("--{flag}={value}").into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_option(_: &str) -> bool {
        false
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_match_etcd() {
        let a = EtcdArgs::parse::<&str>(&[], &env(&[]), &no_option).unwrap();
        assert_eq!(a.name, "default");
        assert_eq!(a.data_dir, PathBuf::from("default.etcd"));
        assert_eq!(a.client_endpoints(), vec!["http://localhost:2379"]);
        assert!(!a.uses_tls());
    }

    #[test]
    fn flag_spellings() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["--name", "m1", "--data-dir", "/d"], "m1", "/d"),
            (&["--name=m1", "--data-dir=/d"], "m1", "/d"),
            (&["-name", "m1", "-data-dir=/d"], "m1", "/d"),
            (&["--name", "m1"], "m1", "m1.etcd"),
            (&["--name", "a", "--name", "b"], "b", "b.etcd"),
            (&["--client-cert-auth", "--name", "x"], "x", "x.etcd"),
            (
                &["--debug", "--data-dir", "/x", "--", "--name", "ignored"],
                "default",
                "/x",
            ),
        ];
        for (args, name, dir) in cases {
            let a = EtcdArgs::parse(args, &env(&[]), &no_option).unwrap();
            assert_eq!(a.name, *name, "{args:?}");
            assert_eq!(a.data_dir, PathBuf::from(dir), "{args:?}");
        }
    }

    #[test]
    fn every_boolean_of_every_release_stands_alone() {
        // Each of these once swallowed the next word (here the data dir) as its value.
        for flag in [
            "--unsafe-no-fsync",
            "--socket-reuse-address",
            "--socket-reuse-port",
            "--memory-mlock",
            "--peer-skip-client-san-verification",
            "--experimental-stop-grpc-service-on-defrag",
            "--enable-distributed-tracing",
            "-v",
        ] {
            let a = EtcdArgs::parse(&[flag, "--data-dir", "/x"], &env(&[]), &no_option).unwrap();
            assert_eq!(a.data_dir, PathBuf::from("/x"), "{flag}");
        }
        let a = EtcdArgs::parse(
            &["--unsafe-no-fsync=false", "--data-dir", "/x"],
            &env(&[]),
            &no_option,
        )
        .unwrap();
        assert_eq!(a.data_dir, PathBuf::from("/x"));
    }

    #[test]
    fn a_word_no_release_knows_is_refused_unless_it_carries_its_value() {
        let err =
            EtcdArgs::parse(&["--unsafe-no-fsnyc", "--data-dir", "/x"], &env(&[]), &no_option).unwrap_err();
        assert!(
            matches!(&err, ArgsError::UnknownFlag { flag, .. } if flag == "unsafe-no-fsnyc"),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("--unsafe-no-fsnyc is not a flag of etcd 3.4, 3.5, 3.6, 3.7"),
            "{err}"
        );
        assert!(err.to_string().contains("--unsafe-no-fsnyc=VALUE"), "{err}");
        for word in ["--store", "--delta-snapshot-period=5s"] {
            let warden = |w: &str| w == "store" || w == "delta-snapshot-period";
            let err =
                EtcdArgs::parse(&["--data-dir", "/x", word, "file:///b"], &env(&[]), &warden).unwrap_err();
            assert!(matches!(&err, ArgsError::WardenFlag { .. }), "{word}: {err}");
            assert!(err.to_string().contains("put it before `--`"), "{err}");
        }
        let a = EtcdArgs::parse(
            &["--some-future-flag=3", "--data-dir", "/x"],
            &env(&[]),
            &no_option,
        )
        .unwrap();
        assert_eq!(a.data_dir, PathBuf::from("/x"));
    }

    #[test]
    fn a_config_file_is_read_as_etcd_reads_it_and_everything_else_is_ignored() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("etcd.yaml");
        std::fs::write(
            &file,
            "name: m2\ndata-dir: /var/lib/etcd\nwal-dir: /wal\nlisten-client-urls: https://10.0.0.2:2379,http://127.0.0.1:2379\n\
             initial-cluster: m1=https://10.0.0.1:2380,m2=https://10.0.0.2:2380\ninitial-cluster-state: existing\n\
             client-transport-security:\n  cert-file: /tls/server.crt\n  key-file: /tls/server.key\n  trusted-ca-file: /tls/ca.crt\n  client-cert-auth: true\n",
        )
        .unwrap();
        let path = file.display().to_string();
        // As a flag (anywhere), or as ETCD_CONFIG_FILE: flags and ETCD_* settings are ignored.
        for (args, e) in [
            (
                vec!["--data-dir", "/ignored", "--config-file", path.as_str()],
                env(&[("ETCD_NAME", "ignored")]),
            ),
            (
                vec!["--name", "ignored"],
                env(&[("ETCD_CONFIG_FILE", path.as_str()), ("ETCD_DATA_DIR", "/ignored")]),
            ),
        ] {
            let a = EtcdArgs::parse(&args, &e, &no_option).unwrap();
            assert_eq!(a.name, "m2");
            assert_eq!(a.data_dir, PathBuf::from("/var/lib/etcd"));
            assert_eq!(a.wal_dir, Some(PathBuf::from("/wal")));
            assert_eq!(
                a.client_endpoints(),
                ["https://10.0.0.2:2379", "http://127.0.0.1:2379"]
            );
            assert_eq!(a.cert_file, Some(PathBuf::from("/tls/server.crt")));
            assert_eq!(a.trusted_ca_file, Some(PathBuf::from("/tls/ca.crt")));
            assert!(a.client_cert_auth);
            assert_eq!(a.initial_cluster_state.as_deref(), Some("existing"));
            assert_eq!(a.config_file, Some(file.clone()));
        }
        // JSON is YAML too; etcd's defaults hold for what the file leaves out.
        std::fs::write(&file, r#"{"name": "j"}"#).unwrap();
        let a = EtcdArgs::parse(&["--config-file", path.as_str()], &env(&[]), &no_option).unwrap();
        assert_eq!(
            (a.name.as_str(), a.data_dir.as_path()),
            ("j", Path::new("j.etcd"))
        );
        assert_eq!(a.client_endpoints(), ["http://localhost:2379"]);
        std::fs::write(&file, "- a\n- b\n").unwrap();
        let err = EtcdArgs::parse(&["--config-file", path.as_str()], &env(&[]), &no_option).unwrap_err();
        assert!(err.to_string().contains("not a mapping"), "{err}");

        // Settings the warden changes go into a copy the command line then names.
        std::fs::write(&file, "name: m2\ninitial-cluster-state: new\n").unwrap();
        let copy = t.path().join("copy.yaml");
        let args: Vec<std::ffi::OsString> = vec!["--config-file".into(), path.clone().into()];
        let out = with_settings(
            &args,
            &env(&[]),
            Some(&file),
            &copy,
            &[("initial-cluster-state".into(), "existing".into())],
        )
        .unwrap()
        .args;
        assert_eq!(
            out,
            vec![std::ffi::OsString::from(format!(
                "--config-file={}",
                copy.display()
            ))]
        );
        let out: Vec<String> = out.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let a = EtcdArgs::parse(&out, &env(&[]), &no_option).unwrap();
        assert_eq!(
            (a.name.as_str(), a.initial_cluster_state.as_deref()),
            ("m2", Some("existing"))
        );
    }

    #[test]
    fn a_setting_changes_where_the_operator_set_it() {
        let set = [
            ("initial-cluster-state".to_owned(), "existing".to_owned()),
            ("initial-cluster".to_owned(), "m1=http://a:2380".to_owned()),
        ];
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let nowhere = Path::new("/nonexistent/copy");
        // Variables stay variables: a flag would shadow them, and etcd 3.6 exits on that.
        let vars = env(&[
            ("ETCD_INITIAL_CLUSTER_STATE", "new"),
            ("ETCD_INITIAL_CLUSTER", "m1=http://old:2380"),
        ]);
        let out = with_settings(&os(&["--name", "m1"]), &vars, None, nowhere, &set).unwrap();
        assert_eq!(out.args, os(&["--name", "m1"]));
        assert_eq!(
            out.env,
            vec![
                ("ETCD_INITIAL_CLUSTER_STATE".to_owned(), "existing".to_owned()),
                ("ETCD_INITIAL_CLUSTER".to_owned(), "m1=http://a:2380".to_owned()),
            ]
        );
        // A flag stays a flag, whatever the environment also says; a new setting is a flag.
        let args = os(&["--initial-cluster-state=new"]);
        let out = with_settings(
            &args,
            &env(&[("ETCD_INITIAL_CLUSTER_STATE", "new")]),
            None,
            nowhere,
            &set,
        )
        .unwrap();
        assert_eq!(
            out.args,
            os(&[
                "--initial-cluster-state=existing",
                "--initial-cluster=m1=http://a:2380"
            ])
        );
        assert!(out.env.is_empty());
    }

    #[test]
    fn env_is_read_and_flags_win() {
        let e = env(&[
            ("ETCD_NAME", "from-env"),
            ("ETCD_DATA_DIR", "/env"),
            (
                "ETCD_LISTEN_CLIENT_URLS",
                "https://0.0.0.0:2379,http://127.0.0.1:4001",
            ),
            ("ETCD_CLIENT_CERT_AUTH", "true"),
            ("ETCD_TRUSTED_CA_FILE", "/ca.pem"),
        ]);
        let a = EtcdArgs::parse(&["--data-dir", "/flag"], &e, &no_option).unwrap();
        assert_eq!(a.name, "from-env");
        assert_eq!(a.data_dir, PathBuf::from("/flag"));
        assert!(a.client_cert_auth);
        assert!(a.uses_tls());
        assert_eq!(a.trusted_ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            a.client_endpoints(),
            vec!["https://127.0.0.1:2379", "http://127.0.0.1:4001"]
        );
    }

    #[test]
    fn wildcard_and_unix_listeners() {
        let a = EtcdArgs::parse(
            &[
                "--listen-client-urls",
                "http://[::]:2379,unix:///run/etcd.sock,http://10.0.0.5:2379",
            ],
            &env(&[]),
            &no_option,
        )
        .unwrap();
        assert_eq!(
            a.client_endpoints(),
            vec!["http://[::1]:2379", "http://10.0.0.5:2379"]
        );
    }

    #[test]
    fn bad_input_names_the_flag() {
        let err = EtcdArgs::parse(&["--data-dir"], &env(&[]), &no_option).unwrap_err();
        assert_eq!(
            err.to_string(),
            "etcd flag --data-dir needs a value (write --data-dir=VALUE)"
        );
        let err = EtcdArgs::parse(&["--listen-client-urls=://nope"], &env(&[]), &no_option).unwrap_err();
        assert!(err.to_string().contains("flag --listen-client-urls"), "{err}");
        let err = EtcdArgs::parse(&["--client-cert-auth=yes"], &env(&[]), &no_option).unwrap_err();
        assert!(err.to_string().contains("not a boolean"), "{err}");
        let err =
            EtcdArgs::parse(&["--config-file", "/nonexistent/etcd.yml"], &env(&[]), &no_option).unwrap_err();
        assert!(matches!(err, ArgsError::ConfigFile { .. }));
        assert!(err.to_string().contains("/nonexistent/etcd.yml"), "{err}");
    }

    #[test]
    fn with_flag_replaces_every_form() {
        let args: Vec<std::ffi::OsString> = [
            "--name",
            "m1",
            "--initial-cluster-state",
            "new",
            "-initial-cluster=a=x",
            "--initial-cluster",
            "b=y",
            "--data-dir=/d",
        ]
        .iter()
        .map(Into::into)
        .collect();
        let once = with_flag(&args, "initial-cluster-state", "existing");
        let twice = with_flag(&once, "initial-cluster", "m1=http://1");
        let twice: Vec<String> = twice.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            twice,
            [
                "--name",
                "m1",
                "--data-dir=/d",
                "--initial-cluster-state=existing",
                "--initial-cluster=m1=http://1"
            ]
        );
    }
}

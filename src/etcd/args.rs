//! Reads the user's etcd invocation the way etcd itself reads it.
//!
//! The warden never asks the operator to repeat what the etcd command line already says: the member
//! name, the data dir, where clients connect and which TLS files they need all come from the flags
//! (`--flag value`, `--flag=value`, Go's single-dash forms) and from `ETCD_*` environment variables,
//! with flags taking precedence as in etcd. This module is pure so that every spelling is table-tested.

use std::collections::HashMap;
use std::path::PathBuf;

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
    /// `--listen-client-urls` (etcd's default: `http://localhost:2379`).
    pub listen_client_urls: Vec<Url>,
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
    /// `--config-file`: the warden does not read etcd's YAML config yet.
    pub config_file: Option<PathBuf>,
}

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
    #[error("etcd flag --{flag}={value:?}: not a boolean (use true or false)")]
    BadBool { flag: String, value: String },
    #[error(
        "etcd flag --config-file {path:?}: the warden cannot read etcd's YAML config yet (pass the settings as flags or ETCD_* variables)"
    )]
    ConfigFile { path: PathBuf },
}

impl EtcdArgs {
    /// Parses etcd's arguments (without the binary) and its environment.
    pub fn parse<S: AsRef<str>>(args: &[S], env: &HashMap<String, String>) -> Result<Self, ArgsError> {
        let flags = collect_flags(args)?;
        let get = |name: &str| -> Option<(String, String)> {
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
        let config_file = get("config-file").map(|(_, v)| PathBuf::from(v));
        if let Some(path) = config_file {
            return Err(ArgsError::ConfigFile { path });
        }
        Ok(Self {
            listen_client_urls: urls("listen-client-urls", Some("http://localhost:2379"))?,
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
            config_file: None,
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

    /// Whether the warden's client must speak TLS to etcd.
    pub fn uses_tls(&self) -> bool {
        self.listen_client_urls.iter().any(|u| u.scheme() == "https")
    }
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
fn collect_flags<S: AsRef<str>>(args: &[S]) -> Result<HashMap<String, String>, ArgsError> {
    let mut flags = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_ref();
        i += 1;
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            break;
        }
        let body = arg.trim_start_matches('-');
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

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_match_etcd() {
        let a = EtcdArgs::parse::<&str>(&[], &env(&[])).unwrap();
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
            let a = EtcdArgs::parse(args, &env(&[])).unwrap();
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
            let a = EtcdArgs::parse(&[flag, "--data-dir", "/x"], &env(&[])).unwrap();
            assert_eq!(a.data_dir, PathBuf::from("/x"), "{flag}");
        }
        let a = EtcdArgs::parse(&["--unsafe-no-fsync=false", "--data-dir", "/x"], &env(&[])).unwrap();
        assert_eq!(a.data_dir, PathBuf::from("/x"));
    }

    #[test]
    fn a_word_no_release_knows_is_refused_unless_it_carries_its_value() {
        let err = EtcdArgs::parse(&["--unsafe-no-fsnyc", "--data-dir", "/x"], &env(&[])).unwrap_err();
        assert!(matches!(&err, ArgsError::UnknownFlag { flag, .. } if flag == "unsafe-no-fsnyc"), "{err}");
        assert!(err.to_string().contains("--unsafe-no-fsnyc is not a flag of etcd 3.4, 3.5, 3.6, 3.7"), "{err}");
        assert!(err.to_string().contains("--unsafe-no-fsnyc=VALUE"), "{err}");
        let a = EtcdArgs::parse(&["--some-future-flag=3", "--data-dir", "/x"], &env(&[])).unwrap();
        assert_eq!(a.data_dir, PathBuf::from("/x"));
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
        let a = EtcdArgs::parse(&["--data-dir", "/flag"], &e).unwrap();
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
        )
        .unwrap();
        assert_eq!(
            a.client_endpoints(),
            vec!["http://[::1]:2379", "http://10.0.0.5:2379"]
        );
    }

    #[test]
    fn bad_input_names_the_flag() {
        let err = EtcdArgs::parse(&["--data-dir"], &env(&[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "etcd flag --data-dir needs a value (write --data-dir=VALUE)"
        );
        let err = EtcdArgs::parse(&["--listen-client-urls=://nope"], &env(&[])).unwrap_err();
        assert!(err.to_string().contains("flag --listen-client-urls"), "{err}");
        let err = EtcdArgs::parse(&["--client-cert-auth=yes"], &env(&[])).unwrap_err();
        assert!(err.to_string().contains("not a boolean"), "{err}");
        let err = EtcdArgs::parse(&["--config-file", "/etc/etcd.yml"], &env(&[])).unwrap_err();
        assert!(matches!(err, ArgsError::ConfigFile { .. }));
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

//! The warden's own etcd client, connecting the way any other client of this etcd would: the listen
//! URLs it was given, TLS with its CA, and a client certificate when `--client-cert-auth` asks for one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use thiserror::Error;

use super::args::EtcdArgs;

/// TLS files for the warden's client; `None` fields fall back to what etcd's own flags name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOverrides {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// etcd's username/password auth for the warden's client (`--etcd-user`, `--etcd-password-file`).
/// The user needs the root role: snapshots and the all-keys watch require it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAuth {
    pub name: String,
    /// Read at every connect, so a rotated password is picked up on reconnect.
    pub password_file: PathBuf,
}

/// How long a request whose answer takes a pass over the whole database may take: a
/// defragmentation, a HashKV, a physical compaction. At etcd's largest size (8 GiB) they take tens
/// of seconds to minutes, far beyond the health timeout that bounds every other request, and
/// etcd gives no answer before the end.
pub const WHOLE_DATABASE: Duration = Duration::from_secs(1800);

/// The longest a connection (and each keep-alive ping on it) may take, whatever a request's
/// timeout: a frozen member is given up on within seconds, not at the end of a long request's.
const CONNECT_AT_MOST: Duration = Duration::from_secs(30);

/// Where and how to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    pub endpoints: Vec<String>,
    pub tls: Option<TlsFiles>,
    pub timeout: Duration,
    pub user: Option<UserAuth>,
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("read TLS or password file {path}")]
    ReadTls {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd at {endpoints}: {message}")]
    Status { endpoints: String, message: String },
    #[error("connect to etcd at {endpoints}")]
    Connect {
        endpoints: String,
        #[source]
        source: etcd_client::Error,
    },
}

impl ClientConfig {
    /// The client an operator would configure by reading etcd's command line.
    pub fn from_args(args: &EtcdArgs, overrides: &TlsOverrides, timeout: Duration) -> Self {
        let tls = args.uses_tls().then(|| {
            // etcd checks client certificates against --trusted-ca-file, which is usually also the
            // CA that signed its server certificate.
            let ca = overrides.ca.clone().or_else(|| args.trusted_ca_file.clone());
            let identity = match (&overrides.cert, &overrides.key) {
                (Some(c), Some(k)) => Some((c.clone(), k.clone())),
                _ if args.client_cert_auth => args.cert_file.clone().zip(args.key_file.clone()),
                _ => None,
            };
            TlsFiles { ca, identity }
        });
        Self {
            endpoints: args.client_endpoints(),
            tls,
            timeout,
            user: None,
        }
    }

    /// Connects, reading the TLS files afresh (rotated certificates are picked up on reconnect).
    pub async fn connect(&self) -> Result<Client, ClientError> {
        Ok(self.connect_auth().await?.0)
    }

    /// `connect`, and whether the client authenticated. With `user`, it authenticates when etcd has
    /// auth enabled, and connects without credentials while it has not (etcd refuses to
    /// authenticate then), so `auth enable` needs only a reconnect.
    pub async fn connect_auth(&self) -> Result<(Client, bool), ClientError> {
        let options = self.options()?;
        if let Some(u) = &self.user {
            let password = self.password(u)?;
            let with_user = options
                .clone()
                .with_user(u.name.clone(), password)
                .with_auto_token_refresh(true);
            match Client::connect(&self.endpoints, Some(with_user)).await {
                Ok(c) => return Ok((c, true)),
                Err(e) if e.to_string().contains("authentication is not enabled") => {}
                Err(source) => {
                    return Err(ClientError::Connect {
                        endpoints: self.endpoints.join(","),
                        source,
                    });
                }
            }
        }
        Client::connect(&self.endpoints, Some(options))
            .await
            .map(|c| (c, false))
            .map_err(|source| ClientError::Connect {
                endpoints: self.endpoints.join(","),
                source,
            })
    }

    fn password(&self, u: &UserAuth) -> Result<String, ClientError> {
        let password = std::fs::read_to_string(&u.password_file).map_err(|source| ClientError::ReadTls {
            path: u.password_file.clone(),
            source,
        })?;
        Ok(password.trim_end_matches(['\n', '\r']).to_owned())
    }

    /// `timeout` bounds each request; the connection and its keep-alive answer within it too, but
    /// never more than `CONNECT_AT_MOST`: a member that stops answering is given up on in seconds
    /// even under a `WHOLE_DATABASE` request.
    fn options(&self) -> Result<ConnectOptions, ClientError> {
        let connect = self.timeout.min(CONNECT_AT_MOST);
        let mut options = ConnectOptions::new()
            .with_connect_timeout(connect)
            .with_timeout(self.timeout)
            .with_keep_alive(Duration::from_secs(10), connect);
        if let Some(t) = self.tls_config()? {
            options = options.with_tls(t);
        }
        Ok(options)
    }
}

/// etcd's `AuthStatus`: whether auth is enabled and the auth store's revision, which moves on every
/// user, role, permission or password change and on `auth enable`/`disable` (etcd 3.5+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthStatus {
    pub enabled: bool,
    pub revision: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AuthStatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
struct AuthStatusResponse {
    #[prost(bool, tag = "2")]
    enabled: bool,
    #[prost(uint64, tag = "3")]
    auth_revision: u64,
}

impl ClientConfig {
    /// A token for the configured user (`None` without one), from `client`'s connection.
    pub async fn token(&self, client: &Client) -> Result<Option<String>, ClientError> {
        let Some(u) = &self.user else {
            return Ok(None);
        };
        let password = self.password(u)?;
        let r = client
            .auth_client()
            .authenticate(u.name.clone(), password)
            .await
            .map_err(|source| ClientError::Connect {
                endpoints: self.endpoints.join(","),
                source,
            })?;
        Ok(Some(r.token().to_owned()))
    }

    /// Asks the first endpoint that answers for etcd's auth status; `Ok(None)` when etcd has no
    /// such call (3.4). `token` is needed while auth is on and the client certificate's name is
    /// no user (etcd 3.6 refuses the request then).
    pub async fn auth_status(&self, token: Option<&str>) -> Result<Option<AuthStatus>, ClientError> {
        let options = self.tls_config()?;
        let mut last = None;
        for url in &self.endpoints {
            match self.auth_status_at(url, options.clone(), token).await {
                Ok(s) => return Ok(Some(s)),
                Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
                Err(s) => last = Some(s),
            }
        }
        Err(ClientError::Status {
            endpoints: self.endpoints.join(","),
            message: last.map_or_else(|| "no endpoint".into(), |s| s.message().to_owned()),
        })
    }

    async fn auth_status_at(
        &self,
        url: &str,
        tls: Option<tonic::transport::ClientTlsConfig>,
        token: Option<&str>,
    ) -> Result<AuthStatus, tonic::Status> {
        let unavailable = |e: tonic::transport::Error| tonic::Status::unavailable(e.to_string());
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(unavailable)?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(unavailable)?;
        }
        let channel = endpoint.connect().await.map_err(unavailable)?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<AuthStatusRequest, AuthStatusResponse>::default();
        let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Auth/AuthStatus");
        let mut request = tonic::Request::new(AuthStatusRequest {});
        if let Some(t) = token {
            let t = t
                .parse()
                .map_err(|_| tonic::Status::unauthenticated("a token etcd cannot have sent"))?;
            request.metadata_mut().insert("token", t);
        }
        let r = grpc.unary(request, path, codec).await?.into_inner();
        Ok(AuthStatus {
            enabled: r.enabled,
            revision: r.auth_revision,
        })
    }

    fn tls_config(&self) -> Result<Option<TlsOptions>, ClientError> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let mut t = TlsOptions::new();
        if let Some(ca) = &tls.ca {
            t = t.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let Some((cert, key)) = &tls.identity {
            t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(t))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|source| ClientError::ReadTls {
        path: path.to_owned(),
        source,
    })
}

/// Whether an etcd error means "this request needs (other) credentials": auth was enabled under a
/// client that connected without them, or its token is no longer valid.
pub fn is_auth_error(e: &etcd_client::Error) -> bool {
    is_auth_message(&e.to_string())
}

pub fn is_auth_message(text: &str) -> bool {
    [
        "user name is empty",
        // With client-certificate auth, etcd takes the certificate's common name as the user
        // while the client has no token: a name that is no user (the server certificate's).
        "user name not found",
        "invalid auth token",
        "permission denied",
        "authentication failed",
    ]
    .iter()
    .any(|m| text.contains(m))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn tls_follows_etcds_flags() {
        let args = EtcdArgs::parse(
            &[
                "--listen-client-urls=https://0.0.0.0:2379",
                "--cert-file=/s.crt",
                "--key-file=/s.key",
                "--trusted-ca-file=/ca.crt",
                "--client-cert-auth",
            ],
            &HashMap::new(),
            &|_| false,
        )
        .unwrap();
        let c = ClientConfig::from_args(&args, &TlsOverrides::default(), Duration::from_secs(1));
        assert_eq!(c.endpoints, vec!["https://127.0.0.1:2379"]);
        let tls = c.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/ca.crt")));
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("/s.crt"), PathBuf::from("/s.key")))
        );

        let o = TlsOverrides {
            ca: Some("/o-ca".into()),
            cert: Some("/o.crt".into()),
            key: Some("/o.key".into()),
        };
        let tls = ClientConfig::from_args(&args, &o, Duration::from_secs(1))
            .tls
            .unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/o-ca")));
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("/o.crt"), PathBuf::from("/o.key")))
        );
    }

    #[test]
    fn plain_http_has_no_tls() {
        let args = EtcdArgs::parse(
            &["--listen-client-urls=http://127.0.0.1:2379"],
            &HashMap::new(),
            &|_| false,
        )
        .unwrap();
        let c = ClientConfig::from_args(&args, &TlsOverrides::default(), Duration::from_secs(1));
        assert!(c.tls.is_none());
    }
}

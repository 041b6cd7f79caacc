//! Where backups live: the `--store` URL (`url`), the key layout (`layout`, with GBR's names in
//! `gbr`), the self-verifying object format (`format`), its signature (`sign`) and encryption
//! (`crypt`), retention (`retention`, `rollback`), and opening the object_store client with retries
//! short enough that an outage shows in /status within one delta period. It calls only the floor
//! (`telemetry`); what moves snapshot bytes in and out is `crate::snapshot`, one floor up.

pub mod copy;
pub mod credentials;
pub mod crypt;
pub mod format;
pub mod gate;
pub mod gbr;
pub mod head;
pub mod layout;
pub mod listing;
pub mod lock;
pub mod owner;
pub mod plan;
pub mod retention;
pub mod rollback;
pub mod sign;
pub mod url;

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectMeta, ObjectStore, ObjectStoreExt, RetryConfig};
use thiserror::Error;

pub use credentials::read_credentials;
pub use layout::{ChainId, Compression, Kind, SnapshotName};
pub use url::{StoreUrl, StoreUrlError};

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("create the store directory {path}")]
    CreateDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("configure the {scheme} store {url}")]
    Configure {
        scheme: &'static str,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("read store credentials {path}: {reason} (write KEY=VALUE lines, e.g. AWS_ACCESS_KEY_ID=…)")]
    Credentials {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(
        "the store {url} names no credentials, and etcd-warden asks a cloud metadata service only when told to: {hint}"
    )]
    NoCredentials { url: String, hint: &'static str },
    #[error("list {prefix} in {url}")]
    List {
        prefix: String,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("write {key} to {url}")]
    Write {
        key: String,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("read {key} from {url}")]
    Read {
        key: String,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("delete {key} from {url}")]
    Delete {
        key: String,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("check the objects of {url}: {reason}")]
    Check { url: String, reason: String },
    #[error(
        "read the Object Lock of {key} in {url}: {reason} (the warden deletes no object whose lock it cannot read; give its role s3:GetObjectRetention and s3:GetObjectLegalHold)"
    )]
    Lock {
        key: String,
        url: String,
        reason: String,
    },
}

impl StoreError {
    /// The store did not answer (a refused connection, a timeout, a 5xx once object_store's own
    /// retries are spent): worth asking again. An answer it would repeat (no such bucket or key,
    /// access denied, a bad request) is not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::List { source, .. }
            | Self::Write { source, .. }
            | Self::Read { source, .. }
            | Self::Delete { source, .. } => matches!(
                source,
                object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
            ),
            // A check of objects the listing named met a store that did not answer.
            Self::Check { .. } => true,
            _ => false,
        }
    }
}

/// An open backup store.
#[derive(Clone, Debug)]
pub struct Store {
    pub url: StoreUrl,
    pub inner: Arc<dyn ObjectStore>,
    /// age keys: recipients to encrypt new snapshots to, identities to read encrypted ones.
    pub keys: crate::store::crypt::Keys,
    /// The TTL (seconds) a restore gives a lease that a GBR delta names but does not describe
    /// (`--gbr-lease-ttl`; `crate::snapshot::gbr`).
    pub gbr_lease_ttl: i64,
    /// S3 stores: reads an object's Object Lock before retention deletes it.
    pub locks: lock::Locks,
    /// Cloud stores: their paged listing, which `listing` makes total over odd keys.
    pub pager: Option<listing::Pager>,
}

/// `--gbr-lease-ttl`'s default: Kubernetes' `--event-ttl`, what nearly every leased key in a
/// Kubernetes etcd is.
pub const GBR_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Retries: a few quick ones inside object_store; the backup loop retries on its own schedule and
/// reports every failure, so a dead store is visible in seconds rather than minutes.
fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
        ..RetryConfig::default()
    }
}

/// Timeouts, set key by key so that what the environment configured (AWS_ALLOW_HTTP, proxies …)
/// stays in force; a variable in the environment still wins over these defaults.
const CLIENT_DEFAULTS: [(ClientConfigKey, &str, &str); 2] = [
    (ClientConfigKey::ConnectTimeout, "5s", "CONNECT_TIMEOUT"),
    (ClientConfigKey::Timeout, "60s", "TIMEOUT"),
];

fn client_default(env_prefix: &str, suffix: &str) -> bool {
    std::env::var_os(format!("{env_prefix}_{suffix}")).is_none()
}

/// Applies the client defaults (unless the environment sets them) and the credentials-file
/// settings to one of object_store's cloud builders; `$key` is that builder's config-key type.
macro_rules! configure {
    ($builder:expr, $key:path, $env:literal, $extra:expr) => {{
        let mut b = $builder.with_retry(retry());
        for (key, value, suffix) in CLIENT_DEFAULTS {
            if client_default($env, suffix) {
                b = b.with_config(<$key>::Client(key), value);
            }
        }
        for (k, v) in $extra {
            if let Ok(key) = k.to_ascii_lowercase().parse::<$key>() {
                b = b.with_config(key, v);
            }
        }
        b
    }};
}

impl Store {
    pub fn with_keys(mut self, keys: crate::store::crypt::Keys) -> Self {
        self.keys = keys;
        self
    }

    pub fn with_gbr_lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        // Validated where it is read (`config::parse_lease_ttl`): whole seconds, at least one.
        self.gbr_lease_ttl = ttl.as_secs().min(i64::MAX as u64) as i64;
        self
    }

    /// How new snapshots are encrypted with these keys.
    pub fn encryption(&self) -> layout::Encryption {
        if self.keys.encrypts() {
            layout::Encryption::Age
        } else {
            layout::Encryption::Plain
        }
    }

    /// Builds the client from the URL and the environment the clouds' own tools read
    /// (AWS_*, GOOGLE_*, AZURE_*). Creates a file store's directory.
    pub fn open(url: &StoreUrl) -> Result<Self, StoreError> {
        Self::open_with(url, &[])
    }

    /// Opens the store with `--store-credentials` (if any) read afresh over the environment.
    pub fn open_configured(
        url: &StoreUrl,
        credentials: Option<&std::path::Path>,
    ) -> Result<Self, StoreError> {
        let extra = match credentials {
            Some(p) => read_credentials(p)?,
            None => Vec::new(),
        };
        Self::open_with(url, &extra)
    }

    /// Like [`Store::open`], with extra settings (from a credentials file) over the environment.
    pub fn open_with(url: &StoreUrl, extra: &[(String, String)]) -> Result<Self, StoreError> {
        let cfg = |scheme| {
            move |source| StoreError::Configure {
                scheme,
                url: url.to_string(),
                source,
            }
        };
        let no_credentials = |hint| StoreError::NoCredentials {
            url: url.to_string(),
            hint,
        };
        let mut locks = None;
        let mut pager: Option<Arc<dyn object_store::list::PaginatedListStore>> = None;
        let (inner, prefix): (Arc<dyn ObjectStore>, &str) = match url {
            StoreUrl::File { path } => {
                std::fs::create_dir_all(path).map_err(|source| StoreError::CreateDir {
                    path: path.clone(),
                    source,
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(path).map_err(cfg("file"))?;
                (Arc::new(fs), "")
            }
            StoreUrl::S3 { bucket, prefix } => {
                let mut s3 = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                // Bodies go unsigned unless AWS_UNSIGNED_PAYLOAD says otherwise: every object
                // carries its own sha256, checked on every read, and TLS guards it on the way;
                // signing would hash each uploaded byte once more (11 % of the warden's CPU in a
                // full snapshot).
                if std::env::var_os("AWS_UNSIGNED_PAYLOAD").is_none() {
                    s3 = s3.with_unsigned_payload(true);
                }
                let b = configure!(s3, object_store::aws::AmazonS3ConfigKey, "AWS", extra);
                let b = credentials::s3_metadata_endpoint(b).with_http_connector(lock::Md5WhenLocked);
                if !credentials::s3_named(&b) {
                    return Err(no_credentials(credentials::S3_HINT));
                }
                let s3 = Arc::new(b.clone().build().map_err(cfg("s3"))?);
                locks = Some(Arc::new(
                    lock::S3Locks::new(&b, &s3, bucket, prefix).map_err(cfg("s3"))?,
                ));
                pager = Some(s3.clone());
                (s3, prefix)
            }
            StoreUrl::Gcs { bucket, prefix } => {
                let b = configure!(
                    object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket),
                    object_store::gcp::GoogleConfigKey,
                    "GOOGLE",
                    extra
                );
                if !credentials::gcs_named(&b) {
                    return Err(no_credentials(credentials::GCS_HINT));
                }
                let gcs = Arc::new(b.build().map_err(cfg("gs"))?);
                pager = Some(gcs.clone());
                (gcs, prefix)
            }
            StoreUrl::Azure { container, prefix } => {
                let b = configure!(
                    object_store::azure::MicrosoftAzureBuilder::from_env().with_container_name(container),
                    object_store::azure::AzureConfigKey,
                    "AZURE",
                    extra
                );
                if !credentials::azure_named(&b) {
                    return Err(no_credentials(credentials::AZURE_HINT));
                }
                let az = Arc::new(b.build().map_err(cfg("az"))?);
                pager = Some(az.clone());
                (az, prefix)
            }
        };
        let inner: Arc<dyn ObjectStore> = if prefix.is_empty() {
            inner
        } else {
            Arc::new(PrefixStore::new(inner, prefix.to_owned()))
        };
        Ok(Self {
            url: url.clone(),
            inner,
            keys: Default::default(),
            gbr_lease_ttl: GBR_LEASE_TTL.as_secs() as i64,
            locks,
            pager: pager.map(|store| listing::Pager {
                store,
                prefix: prefix.to_owned(),
            }),
        })
    }

    /// The snapshots directly in `dir`: the listing is total (`listing`), and a key that is no
    /// snapshot's name is left out.
    async fn list_dir(&self, dir: &str) -> Result<Vec<(SnapshotName, ObjectMeta)>, StoreError> {
        let mut out = Vec::new();
        for m in listing::list_dir(self, dir).await?.objects {
            match SnapshotName::parse(m.location.as_ref()) {
                Ok(n) => out.push((n, m)),
                Err(err) => tracing::debug!(error = %err, "ignoring a foreign object in the store"),
            }
        }
        Ok(out)
    }

    /// All full snapshots, oldest first (by revision, then creation time).
    pub async fn list_fulls(&self) -> Result<Vec<(SnapshotName, ObjectMeta)>, StoreError> {
        let mut v = self.list_dir(&layout::full_dir()).await?;
        v.sort_by_key(|(n, _)| (n.last_revision(), n.created_ms));
        Ok(v)
    }

    /// The deltas of the chain that `full` starts, by first revision: its own directory, and the
    /// older-layout directory named by its revision alone, whose deltas it owns when it is the
    /// newest of `fulls` at that revision created before them (`layout::legacy_owner`).
    pub async fn list_chain(
        &self,
        full: &SnapshotName,
        fulls: &[SnapshotName],
    ) -> Result<Vec<(SnapshotName, ObjectMeta)>, StoreError> {
        let Some(chain) = full.chain().filter(|_| full.is_full()) else {
            return Ok(Vec::new());
        };
        let mut v = self.list_chain_dir(full).await?;
        let legacy = self.list_dir(&layout::delta_dir(chain.base, None)).await?;
        v.extend(
            legacy
                .into_iter()
                .filter(|(n, _)| layout::legacy_owner(n, fulls) == Some(chain)),
        );
        sort_chain(&mut v);
        Ok(v)
    }

    /// The deltas in the directory of the chain that `full` starts (the current layout only, not the
    /// older-layout directory `list_chain` reads too): one listing. By first revision.
    pub async fn list_chain_dir(
        &self,
        full: &SnapshotName,
    ) -> Result<Vec<(SnapshotName, ObjectMeta)>, StoreError> {
        let Some(chain) = full.chain().filter(|_| full.is_full()) else {
            return Ok(Vec::new());
        };
        let mut v = self
            .list_dir(&layout::delta_dir(chain.base, Some(chain.base_created_ms)))
            .await?;
        v.retain(|(n, _)| n.chain() == Some(chain));
        sort_chain(&mut v);
        Ok(v)
    }

    /// The newest chain through the gate: the newest full of the warden's own that passes, and its
    /// chain's deltas up to the newest one that passes, by first revision. What the writer resumes
    /// and the tail continues: a planted name neither ends the chain nor starts another.
    pub async fn newest_checked_chain(
        &self,
    ) -> Result<Option<(SnapshotName, Vec<SnapshotName>)>, StoreError> {
        let unanswered = |reason| StoreError::Check {
            url: self.url.to_string(),
            reason,
        };
        let fulls = self.list_fulls().await?;
        let listed: Vec<_> = fulls.iter().rev().map(|(n, m)| (*n, Some(m.size))).collect();
        let mut rejected = gate::Rejected::default();
        let mut newest = None;
        // Newest first, a window at a time: the first that passes ends the search.
        for window in listed.chunks(gate::CONCURRENCY) {
            for ((n, _), r) in window
                .iter()
                .zip(gate::check_all(self, window).await.map_err(unanswered)?)
            {
                match r {
                    Ok(_) => {
                        newest = Some(*n);
                        break;
                    }
                    Err(why) => rejected.add(n.key(), why),
                }
            }
            if newest.is_some() {
                break;
            }
        }
        let Some(newest) = newest else {
            return Ok(None);
        };
        let names: Vec<SnapshotName> = fulls.iter().map(|(n, _)| *n).collect();
        let chain = self.list_chain(&newest, &names).await?;
        // From the newest delta down to the first that passes: where the chain continues is what
        // the writer and the tail read of it, and a resumed writer must not read its whole chain
        // back (it resumes after every watch restart). The deltas below are kept unchecked; a
        // restore reads each whole.
        let mut by_last: Vec<&(SnapshotName, ObjectMeta)> = chain.iter().collect();
        by_last.sort_by_key(|(n, _)| std::cmp::Reverse((n.last_revision(), n.created_ms)));
        let mut top = None;
        for (n, m) in by_last {
            match gate::check(self, n, Some(m.size)).await {
                Ok(_) => {
                    top = Some((n.last_revision(), n.created_ms));
                    break;
                }
                Err(gate::Refused::Bad(why)) => rejected.add(n.key(), why),
                Err(gate::Refused::Unknown(why)) => return Err(unanswered(why)),
            }
        }
        let kept: Vec<SnapshotName> = chain
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| top.is_some_and(|t| (n.last_revision(), n.created_ms) <= t))
            .collect();
        if let Some(s) = rejected.summary() {
            tracing::warn!(skipped = rejected.count, "{s}");
        }
        Ok(Some((newest, kept)))
    }

    /// Every delta chain directory: its base revision and, in the current layout, its full's
    /// creation time (one listing with a delimiter).
    pub async fn list_chain_dirs(&self) -> Result<Vec<(i64, Option<u64>)>, StoreError> {
        let listed = listing::list_dir(self, &format!("{}/delta", layout::VERSION_DIR)).await?;
        let mut dirs: Vec<(i64, Option<u64>)> = listed
            .dirs
            .iter()
            .filter_map(|d| layout::parse_chain_dir(d))
            .collect();
        dirs.sort_unstable();
        Ok(dirs)
    }

    /// Every full snapshot a restore can read, the warden's own and GBR's (`crate::store::gbr`), and every
    /// chain's deltas keyed by the chain (one listing per chain directory). Deltas whose full is
    /// gone sit under their base with creation time 0, a chain no full starts.
    pub async fn catalog(&self) -> Result<(Vec<SnapshotName>, Catalog), StoreError> {
        Ok(strip_meta(self.catalog_with_meta().await?))
    }

    /// [`Store::catalog`] screened by the gate (`gate::screen`): what a restore, a catch-up and the
    /// start-up's "behind" decide from. Names that did not pass are left out and counted.
    pub async fn screened_catalog(&self) -> Result<gate::Screened, StoreError> {
        let (fulls, chains) = self.catalog_with_meta().await?;
        let sizes: std::collections::HashMap<String, u64> = fulls
            .iter()
            .chain(chains.values().flatten())
            .map(|(n, m)| (n.key(), m.size))
            .collect();
        let (fulls, chains) = strip_meta((fulls, chains));
        gate::screen(self, &fulls, &chains, &sizes)
            .await
            .map_err(|reason| StoreError::Check {
                url: self.url.to_string(),
                reason,
            })
    }

    /// The warden's own objects only: what retention may delete.
    pub async fn own_catalog(&self) -> Result<(Vec<SnapshotName>, Catalog), StoreError> {
        Ok(strip_meta(self.own_catalog_with_meta().await?))
    }

    /// [`Store::catalog`] with each object's metadata (size, time).
    pub async fn catalog_with_meta(&self) -> Result<MetaCatalog, StoreError> {
        let (mut fulls, mut chains) = self.own_catalog_with_meta().await?;
        let (gbr_fulls, gbr_chains) = self.gbr_catalog_with_meta().await?;
        fulls.extend(gbr_fulls);
        fulls.sort_by_key(|(n, _)| (n.last_revision(), n.created_ms));
        for (chain, deltas) in gbr_chains {
            chains.entry(chain).or_default().extend(deltas);
        }
        Ok((fulls, chains))
    }

    /// GBR's snapshots under this prefix: `v2/` listed whole, and each of the older layout's
    /// `v1/Backup-<s>/` directories (found with one delimited listing of `v1/`). Each delta in the
    /// chain of the full it extends (`gbr::names::chains`).
    pub async fn gbr_catalog_with_meta(&self) -> Result<MetaCatalog, StoreError> {
        let mut all = self.list_dir("v2").await?;
        for dir in listing::list_dir(self, layout::VERSION_DIR).await?.dirs {
            if dir.starts_with("Backup-") {
                all.extend(self.list_dir(&format!("{}/{dir}", layout::VERSION_DIR)).await?);
            }
        }
        all.retain(|(n, _)| !n.is_own());
        let (mut fulls, deltas): (Vec<_>, Vec<_>) = all.into_iter().partition(|(n, _)| n.is_full());
        fulls.sort_by_key(|(n, _)| (n.last_revision(), n.created_ms));
        let full_names: Vec<SnapshotName> = fulls.iter().map(|(n, _)| *n).collect();
        let delta_names: Vec<SnapshotName> = deltas.iter().map(|(n, _)| *n).collect();
        let meta: std::collections::HashMap<String, ObjectMeta> =
            deltas.into_iter().map(|(n, m)| (n.key(), m)).collect();
        let mut chains = std::collections::BTreeMap::<ChainId, Vec<_>>::new();
        for (chain, members) in crate::store::gbr::names::chains(&full_names, &delta_names) {
            let entry = chains.entry(chain).or_default();
            for d in members {
                if let Some(m) = meta.get(&d.key()) {
                    entry.push((d, m.clone()));
                }
            }
        }
        for deltas in chains.values_mut() {
            sort_chain(deltas);
        }
        Ok((fulls, chains))
    }

    /// [`Store::own_catalog`] with each object's metadata.
    pub async fn own_catalog_with_meta(&self) -> Result<MetaCatalog, StoreError> {
        let fulls = self.list_fulls().await?;
        let names: Vec<SnapshotName> = fulls.iter().map(|(n, _)| *n).collect();
        let mut chains = std::collections::BTreeMap::<ChainId, Vec<_>>::new();
        for (base, created) in self.list_chain_dirs().await? {
            for (n, m) in self.list_dir(&layout::delta_dir(base, created)).await? {
                let chain = match created {
                    Some(_) => n.chain(),
                    None => layout::legacy_owner(&n, &names),
                }
                .unwrap_or(ChainId {
                    base,
                    base_created_ms: 0,
                });
                chains.entry(chain).or_default().push((n, m));
            }
        }
        for deltas in chains.values_mut() {
            sort_chain(deltas);
        }
        Ok((fulls, chains))
    }

    /// Whether a small JSON record read from `key` may be believed: with signing on, only one
    /// signed by a trusted key (`store::sign`); a refused one is logged and read as absent.
    pub(crate) fn record_trusted(&self, key: &str, bytes: &[u8]) -> bool {
        match self.keys.signing.open_record(key, bytes) {
            Ok(()) => true,
            Err(reason) => {
                tracing::warn!(key, %reason, "a record in the store is not trusted: ignored");
                false
            }
        }
    }

    /// A small JSON object (the head, the owner record, a restore plan): `None` when absent,
    /// unparsable, or (with signing on) not signed by a trusted key.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let read = |source| StoreError::Read {
            key: key.to_owned(),
            url: self.url.to_string(),
            source,
        };
        match self.inner.get(&Path::from(key)).await {
            Ok(got) => {
                let Some(bytes) = bounded_record(key, got).await.map_err(read)? else {
                    return Ok(None);
                };
                if !self.record_trusted(key, &bytes) {
                    return Ok(None);
                }
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(read(source)),
        }
    }

    /// Writes a small JSON object: overwritten, or only if absent (`create`: `Ok(false)` when it
    /// already existed).
    pub(crate) async fn put_json<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        create: bool,
    ) -> Result<bool, StoreError> {
        let body = self.keys.signing.seal_record(
            key,
            serde_json::to_vec_pretty(value).expect("a record serializes"),
        );
        let opts = object_store::PutOptions {
            mode: if create {
                object_store::PutMode::Create
            } else {
                object_store::PutMode::Overwrite
            },
            ..Default::default()
        };
        match self.inner.put_opts(&Path::from(key), body.into(), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) if create => Ok(false),
            Err(source) => Err(StoreError::Write {
                key: key.to_owned(),
                url: self.url.to_string(),
                source,
            }),
        }
    }

    /// What protects `key` from deletion (S3 Object Lock); `None` for unlocked objects and for
    /// stores without locks.
    pub async fn lock(&self, key: &str) -> Result<Option<lock::Lock>, StoreError> {
        match &self.locks {
            Some(l) => l.lock(key).await.map_err(|reason| StoreError::Lock {
                key: key.to_owned(),
                url: self.url.to_string(),
                reason,
            }),
            None => Ok(None),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(StoreError::Delete {
                key: key.to_owned(),
                url: self.url.to_string(),
                source,
            }),
        }
    }
}

/// The most a JSON record (the head, the owner record, a restore plan) may be: a few KiB in every
/// store this release writes. A longer one is not read (it is no writer's record).
pub const MAX_RECORD: u64 = 1 << 20;

/// A record's bytes, `None` when the store says it is longer than [`MAX_RECORD`]; the read stops
/// there also when the store's answer grows past what it said.
pub(crate) async fn bounded_record(
    key: &str,
    got: object_store::GetResult,
) -> Result<Option<bytes::Bytes>, object_store::Error> {
    use futures_util::StreamExt;
    let too_long = |size: u64| {
        tracing::warn!(
            key,
            size,
            max = MAX_RECORD,
            "a record in the store is longer than any record: ignored"
        );
        None
    };
    if got.meta.size > MAX_RECORD {
        return Ok(too_long(got.meta.size));
    }
    let mut stream = got.into_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
        if out.len() as u64 > MAX_RECORD {
            return Ok(too_long(out.len() as u64));
        }
    }
    Ok(Some(out.into()))
}

/// Every chain's deltas, keyed by the full snapshot that starts it.
pub type Catalog = std::collections::BTreeMap<ChainId, Vec<SnapshotName>>;

/// Full snapshots and chains, with each object's metadata (size, time).
pub type MetaCatalog = (
    Vec<(SnapshotName, ObjectMeta)>,
    std::collections::BTreeMap<ChainId, Vec<(SnapshotName, ObjectMeta)>>,
);

fn strip_meta((fulls, chains): MetaCatalog) -> (Vec<SnapshotName>, Catalog) {
    let chains = chains
        .into_iter()
        .map(|(c, v)| (c, v.into_iter().map(|(n, _)| n).collect()))
        .collect();
    (fulls.into_iter().map(|(n, _)| n).collect(), chains)
}

/// Deltas by first revision, then last, then creation time.
fn chain_order(n: &SnapshotName) -> (i64, i64, u64) {
    match n.kind {
        Kind::Delta { first, last, .. } => (first, last, n.created_ms),
        Kind::Full { revision, .. } => (revision, revision, n.created_ms),
    }
}

fn sort_chain(v: &mut [(SnapshotName, ObjectMeta)]) {
    v.sort_by_key(|(n, _)| chain_order(n));
}

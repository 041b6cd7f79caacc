//! Immutable backups: S3 Object Lock. Objects are locked by the bucket's default retention (set
//! once by whoever creates the bucket, governance or compliance mode), or by anything else that
//! sets a retention date or a legal hold on them; the warden reads each object's lock before its
//! retention deletes it, and leaves a locked one alone until its date has passed.
//!
//! Why read, not only write: on a versioned bucket (Object Lock needs versioning) a plain DELETE of
//! a locked object "succeeds" by adding a delete marker, which hides the object from every listing,
//! restores included, while its locked version stays and is billed. So the check must come before
//! the delete. `object_store` shows no object's lock, so this signs a HEAD with the store's own
//! credentials and reads S3's `x-amz-object-lock-*` headers.

use std::sync::Arc;
use std::time::SystemTime;

use object_store::aws::{AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpRequestBody, HttpResponse, HttpService,
    ReqwestConnector,
};

/// What protects an object from deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The retention date (governance or compliance mode), if one is set.
    pub until: Option<SystemTime>,
    pub mode: Option<String>,
    /// A legal hold protects the object until someone removes it.
    pub legal_hold: bool,
}

impl Lock {
    /// Whether the object may not be deleted at `now`.
    pub fn holds(&self, now: SystemTime) -> bool {
        self.legal_hold || self.until.is_some_and(|u| u > now)
    }
}

/// Reads S3 objects' Object Lock state.
#[derive(Clone)]
pub struct S3Locks {
    client: HttpClient,
    credentials: AwsCredentialProvider,
    region: String,
    /// `https://host[/bucket]`: the object's URL is this, `/`, the prefix and the key.
    base: String,
    prefix: String,
}

impl std::fmt::Debug for S3Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Locks").field("base", &self.base).finish()
    }
}

impl S3Locks {
    /// From the builder the store's client was built with (its endpoint, region and addressing
    /// style) and that client's credentials.
    pub fn new(
        builder: &object_store::aws::AmazonS3Builder,
        s3: &object_store::aws::AmazonS3,
        bucket: &str,
        prefix: &str,
    ) -> Result<Self, object_store::Error> {
        use object_store::aws::AmazonS3ConfigKey as K;
        let get = |k: K| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let region = get(K::Region).unwrap_or_else(|| "us-east-1".to_owned());
        let virtual_hosted = get(K::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
        let base = match get(K::S3Endpoint).or_else(|| get(K::Endpoint)) {
            Some(e) if virtual_hosted => e.trim_end_matches('/').to_owned(),
            Some(e) => format!("{}/{bucket}", e.trim_end_matches('/')),
            None => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let allow_http = base.starts_with("http://");
        let client = ReqwestConnector::default()
            .connect(&object_store::ClientOptions::new().with_allow_http(allow_http))?;
        Ok(Self {
            client,
            credentials: s3.credentials().clone(),
            region,
            base,
            prefix: prefix.trim_matches('/').to_owned(),
        })
    }

    /// The object's lock; `None` when nothing protects it (no retention, no legal hold, a bucket
    /// without Object Lock, or no object at all). S3 answers a HEAD with the object's lock
    /// headers when the caller may read them (s3:GetObjectRetention, s3:GetObjectLegalHold).
    pub async fn lock(&self, key: &str) -> Result<Option<Lock>, String> {
        let full = if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        };
        let path: String = full
            .split('/')
            .map(|seg| url::form_urlencoded::byte_serialize(seg.as_bytes()).collect::<String>())
            .collect::<Vec<_>>()
            .join("/");
        let uri = format!("{}/{path}", self.base);
        let mut req = http::Request::builder()
            .method(http::Method::HEAD)
            .uri(&uri)
            .body(HttpRequestBody::empty())
            .map_err(|e| format!("HEAD {uri}: {e}"))?;
        let cred = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| format!("credentials for {uri}: {e}"))?;
        AwsAuthorizer::new(&cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| format!("sign HEAD {uri}: {e}"))?;
        let resp = self
            .client
            .execute(req)
            .await
            .map_err(|e| format!("HEAD {uri}: {e}"))?;
        match resp.status().as_u16() {
            200 => Ok(from_headers(resp.headers())),
            404 => Ok(None),
            code => Err(format!("HEAD {uri}: HTTP {code}")),
        }
    }
}

/// The lock S3's `x-amz-object-lock-*` response headers describe.
fn from_headers(h: &http::HeaderMap) -> Option<Lock> {
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let until = text("x-amz-object-lock-retain-until-date")
        .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
        .map(SystemTime::from);
    let legal_hold = text("x-amz-object-lock-legal-hold").is_some_and(|s| s.eq_ignore_ascii_case("ON"));
    (until.is_some() || legal_hold).then(|| Lock {
        until,
        mode: text("x-amz-object-lock-mode").map(str::to_owned),
        legal_hold,
    })
}

/// The HTTP connector of S3 stores: a bucket with Object Lock refuses uploads that carry no
/// Content-MD5 or checksum header ("Content-MD5 OR x-amz-checksum- HTTP header is required for
/// Put Object requests with Object Lock parameters"). Hashing every uploaded byte costs CPU that
/// unlocked buckets do not need, so the first PUT such a bucket refuses is sent again with
/// Content-MD5, and every later PUT of that store carries one from the start. Content-MD5 is no
/// `x-amz-*` header, so adding it after signing is allowed.
#[derive(Debug, Default)]
pub struct Md5WhenLocked;

impl HttpConnector for Md5WhenLocked {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Md5Service {
            inner: ReqwestConnector::default().connect(options)?,
            needed: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct Md5Service {
    inner: HttpClient,
    /// This store's bucket asked for Content-MD5 once: every PUT carries it.
    needed: std::sync::atomic::AtomicBool,
}

impl Md5Service {
    async fn with_md5(req: HttpRequest) -> Result<HttpRequest, HttpError> {
        use http_body_util::BodyExt;
        use md5::Digest;
        let (mut parts, body) = req.into_parts();
        let bytes = body.clone().collect().await?.to_bytes();
        let digest = md5::Md5::digest(&bytes);
        use base64::Engine;
        let value = base64::engine::general_purpose::STANDARD.encode(digest);
        parts.headers.insert(
            http::header::HeaderName::from_static("content-md5"),
            http::HeaderValue::from_str(&value).expect("base64 is a header value"),
        );
        Ok(http::Request::from_parts(parts, body))
    }
}

#[async_trait::async_trait]
impl HttpService for Md5Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        use std::sync::atomic::Ordering;
        if req.method() != http::Method::PUT {
            return self.inner.execute(req).await;
        }
        if self.needed.load(Ordering::Relaxed) {
            return self.inner.execute(Self::with_md5(req).await?).await;
        }
        let (parts, body) = req.into_parts();
        let again = http::Request::from_parts(parts.clone(), body.clone());
        let resp = self.inner.execute(http::Request::from_parts(parts, body)).await?;
        if resp.status() != http::StatusCode::BAD_REQUEST {
            return Ok(resp);
        }
        let (rparts, rbody) = resp.into_parts();
        let text = rbody.bytes().await?;
        if !String::from_utf8_lossy(&text).contains("Content-MD5") {
            return Ok(HttpResponse::from_parts(rparts, text.into()));
        }
        tracing::info!(
            uri = %again.uri(),
            "the bucket has Object Lock: uploads to it carry Content-MD5 from now on"
        );
        self.needed.store(true, Ordering::Relaxed);
        self.inner.execute(Self::with_md5(again).await?).await
    }
}

/// Shared so every clone of a [`super::Store`] reads locks through one HTTP client.
pub type Locks = Option<Arc<S3Locks>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3s_lock_headers_are_read() {
        let mut h = http::HeaderMap::new();
        assert_eq!(from_headers(&h), None);
        h.insert("x-amz-object-lock-mode", "GOVERNANCE".parse().unwrap());
        h.insert(
            "x-amz-object-lock-retain-until-date",
            "2026-12-05T10:00:00.123Z".parse().unwrap(),
        );
        let lock = from_headers(&h).unwrap();
        assert_eq!(lock.mode.as_deref(), Some("GOVERNANCE"));
        assert!(!lock.legal_hold);
        let at = |s: &str| SystemTime::from(chrono::DateTime::parse_from_rfc3339(s).unwrap());
        assert!(lock.holds(at("2026-12-05T10:00:00Z")));
        assert!(!lock.holds(at("2026-12-05T10:00:01Z")));
        h.clear();
        h.insert("x-amz-object-lock-legal-hold", "ON".parse().unwrap());
        let held = from_headers(&h).unwrap();
        assert!(held.legal_hold && held.until.is_none());
        assert!(held.holds(at("2099-01-01T00:00:00Z")));
    }
}

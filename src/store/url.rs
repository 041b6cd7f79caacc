//! `--store URL`: which object store the backups go to. Pure parsing, so every mistake an operator
//! can make gets a message that names the URL and the fix before anything starts.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

/// A parsed `--store` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `file:///absolute/dir`
    File { path: PathBuf },
    /// `s3://bucket/prefix`
    S3 { bucket: String, prefix: String },
    /// `gs://bucket/prefix`
    Gcs { bucket: String, prefix: String },
    /// `az://container/prefix`
    Azure { container: String, prefix: String },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StoreUrlError {
    #[error(
        "{url:?}: not a URL (write file:///dir, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix)"
    )]
    NotAUrl { url: String },
    #[error("{url:?}: unknown scheme {scheme:?} (use file, s3, gs or az)")]
    UnknownScheme { url: String, scheme: String },
    #[error("{url:?}: missing the {what} name (write {scheme}://{what}/prefix)")]
    MissingBucket {
        url: String,
        scheme: &'static str,
        what: &'static str,
    },
    #[error("{url:?}: a file store needs an absolute path (write file:///var/lib/etcd-backups)")]
    RelativePath { url: String },
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let url = url::Url::parse(s).map_err(|_| StoreUrlError::NotAUrl { url: s.to_owned() })?;
        let bucket = |scheme: &'static str, what: &'static str| -> Result<(String, String), StoreUrlError> {
            let bucket = url
                .host_str()
                .filter(|h| !h.is_empty())
                .ok_or(StoreUrlError::MissingBucket {
                    url: s.to_owned(),
                    scheme,
                    what,
                })?;
            let prefix = url.path().trim_matches('/').to_owned();
            Ok((bucket.to_owned(), prefix))
        };
        match url.scheme() {
            "file" => {
                if url.host_str().is_some_and(|h| !h.is_empty() && h != "localhost") {
                    return Err(StoreUrlError::RelativePath { url: s.to_owned() });
                }
                let path = url
                    .to_file_path()
                    .map_err(|_| StoreUrlError::RelativePath { url: s.to_owned() })?;
                Ok(Self::File { path })
            }
            "s3" => bucket("s3", "bucket").map(|(bucket, prefix)| Self::S3 { bucket, prefix }),
            "gs" => bucket("gs", "bucket").map(|(bucket, prefix)| Self::Gcs { bucket, prefix }),
            "az" | "azure" => {
                bucket("az", "container").map(|(container, prefix)| Self::Azure { container, prefix })
            }
            other => Err(StoreUrlError::UnknownScheme {
                url: s.to_owned(),
                scheme: other.to_owned(),
            }),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { path } => write!(f, "file://{}", path.display()),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            Self::Gcs { bucket, prefix } => write!(f, "gs://{bucket}/{prefix}"),
            Self::Azure { container, prefix } => write!(f, "az://{container}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_urls() {
        let cases = [
            (
                "file:///var/backups",
                StoreUrl::File {
                    path: "/var/backups".into(),
                },
            ),
            (
                "s3://b/etcd/main",
                StoreUrl::S3 {
                    bucket: "b".into(),
                    prefix: "etcd/main".into(),
                },
            ),
            (
                "s3://b",
                StoreUrl::S3 {
                    bucket: "b".into(),
                    prefix: "".into(),
                },
            ),
            (
                "gs://b/p/",
                StoreUrl::Gcs {
                    bucket: "b".into(),
                    prefix: "p".into(),
                },
            ),
            (
                "az://c/p",
                StoreUrl::Azure {
                    container: "c".into(),
                    prefix: "p".into(),
                },
            ),
        ];
        for (s, want) in cases {
            let got: StoreUrl = s.parse().unwrap();
            assert_eq!(got, want, "{s}");
            assert_eq!(
                got.to_string().parse::<StoreUrl>().unwrap(),
                want,
                "round trip of {s}"
            );
        }
    }

    #[test]
    fn bad_urls_name_the_fix() {
        let err = "s4://x".parse::<StoreUrl>().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""s4://x": unknown scheme "s4" (use file, s3, gs or az)"#
        );
        assert!(matches!(
            "/tmp/x".parse::<StoreUrl>(),
            Err(StoreUrlError::NotAUrl { .. })
        ));
        assert!(matches!(
            "s3:///prefix".parse::<StoreUrl>(),
            Err(StoreUrlError::MissingBucket { .. })
        ));
        assert!(matches!(
            "file://relative/x".parse::<StoreUrl>(),
            Err(StoreUrlError::RelativePath { .. })
        ));
    }
}

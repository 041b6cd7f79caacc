//! One directory of the store listed, total over whatever the store holds there.
//!
//! object_store turns every listed key into a `Path` and ends the listing at the first it cannot:
//! an S3 key with an empty, `.` or `..` segment fails the whole page it is in (and with it every
//! key after), a file name that is not UTF-8 or a symlink loop ends a local listing. Any writer of
//! the bucket can make such a key, so here a key that cannot be a name is skipped and counted, and
//! the listing goes on. Every layout the warden reads keeps its objects as direct children of a
//! directory, so a directory is listed with the delimiter (its subdirectories are named, never
//! entered).
//! Local stores are read with `read_dir`; cloud stores page by hand (`PaginatedListStore`): a page
//! that fails on a key is asked again with fewer keys until the keys before the bad one are in,
//! then the listing resumes after it.

use std::sync::Arc;

use object_store::ObjectMeta;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path;

use super::{Store, StoreError, StoreUrl};

/// A cloud store's paged listing, with the prefix the store's `PrefixStore` adds.
#[derive(Clone)]
pub struct Pager {
    pub store: Arc<dyn PaginatedListStore>,
    pub prefix: String,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager").field("prefix", &self.prefix).finish()
    }
}

/// Keys asked for per page.
const PAGE: usize = 1000;

/// What a directory holds: its objects and the names of its subdirectories.
#[derive(Debug, Default)]
pub(crate) struct Dir {
    pub objects: Vec<ObjectMeta>,
    pub dirs: Vec<String>,
    /// Keys that cannot be names, as the store spelled them.
    skipped: Vec<String>,
}

/// What is directly in `dir` (relative to the store's prefix); keys there that cannot be names are
/// skipped, counted and the first said in the log.
pub(crate) async fn list_dir(store: &Store, dir: &str) -> Result<Dir, StoreError> {
    let failed = |source| StoreError::List {
        prefix: dir.to_owned(),
        url: store.url.to_string(),
        source,
    };
    let listed = match (&store.url, &store.pager) {
        (StoreUrl::File { path }, _) => {
            let at = path.join(dir);
            let dir = dir.to_owned();
            tokio::task::spawn_blocking(move || local(&at, &dir))
                .await
                .map_err(|e| failed(object_store::Error::JoinError { source: e }))?
                .map_err(failed)?
        }
        (_, Some(pager)) => paged(pager, dir).await.map_err(failed)?,
        (_, None) => {
            let r = store
                .inner
                .list_with_delimiter(Some(&Path::from(dir)))
                .await
                .map_err(failed)?;
            Dir {
                objects: r.objects,
                dirs: r
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(str::to_owned))
                    .collect(),
                skipped: Vec::new(),
            }
        }
    };
    if let Some(first) = listed.skipped.first() {
        tracing::warn!(
            dir,
            skipped = listed.skipped.len(),
            first = %first,
            "keys in the store that cannot be object names: skipped"
        );
    }
    Ok(listed)
}

/// A local store's directory: its regular files (symlinks followed) whose names are valid keys.
fn local(at: &std::path::Path, dir: &str) -> Result<Dir, object_store::Error> {
    let entries = match std::fs::read_dir(at) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Dir::default()),
        Err(e) => {
            return Err(object_store::Error::Generic {
                store: "LocalFileSystem",
                source: format!("read {}: {e}", at.display()).into(),
            });
        }
    };
    let mut out = Dir::default();
    let skipped = &mut out.skipped;
    for entry in entries {
        let Ok(entry) = entry else {
            skipped.push(format!("an entry of {}", at.display()));
            continue;
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            skipped.push(format!("{}/{}", at.display(), name.to_string_lossy()));
            continue;
        };
        // object_store's own partial uploads (`<name>#<n>`) are no objects.
        if name.contains('#') {
            continue;
        }
        let key = format!("{dir}/{name}");
        let Ok(location) = Path::parse(&key) else {
            skipped.push(key);
            continue;
        };
        // Follows a symlink: a loop, or one that points nowhere, is no object.
        match std::fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() => out.dirs.push(name.to_owned()),
            Ok(m) if m.is_file() => out.objects.push(ObjectMeta {
                location,
                last_modified: m
                    .modified()
                    .map(chrono::DateTime::<chrono::Utc>::from)
                    .unwrap_or_default(),
                size: m.len(),
                e_tag: None,
                version: None,
            }),
            Ok(_) => {}
            Err(_) => skipped.push(key),
        }
    }
    Ok(out)
}

/// The raw key a listing failed on, when object_store said which.
fn bad_key(e: &object_store::Error) -> Option<String> {
    use object_store::path::Error as P;
    match e {
        object_store::Error::InvalidPath {
            source: P::EmptySegment { path } | P::BadSegment { path, .. } | P::NonUnicode { path, .. },
        } => Some(path.clone()),
        _ => None,
    }
}

/// The first key after every key that starts with `key`, when `key` is a directory (ends in
/// `/`): `a/` becomes `a0` (`0` follows `/`), so a listing that starts after it skips the whole
/// directory; any other key stays as it is.
fn past(key: &str) -> String {
    match key.strip_suffix('/') {
        Some(dir) => format!("{dir}0"),
        None => key.to_owned(),
    }
}

async fn paged(pager: &Pager, dir: &str) -> Result<Dir, object_store::Error> {
    let prefix = match pager.prefix.trim_matches('/') {
        "" => format!("{dir}/"),
        p => format!("{p}/{dir}/"),
    };
    let strip = match pager.prefix.trim_matches('/') {
        "" => String::new(),
        p => format!("{p}/"),
    };
    let ask = |token: Option<String>, after: Option<String>, max: usize| {
        let prefix = prefix.clone();
        async move {
            let opts = PaginatedListOptions {
                offset: after,
                delimiter: Some("/".into()),
                max_keys: Some(max),
                page_token: token,
                ..Default::default()
            };
            pager.store.list_paginated(Some(&prefix), opts).await
        }
    };
    let mut out = Dir::default();
    let (mut token, mut after) = (None, None);
    loop {
        let page = match ask(token.clone(), after.clone(), PAGE).await {
            Ok(page) => page,
            Err(e) => {
                let Some(bad) = bad_key(&e) else { return Err(e) };
                // The keys before the bad one: the most a page can hold without it.
                let (mut lo, mut hi) = (0usize, PAGE - 1);
                let mut good = None;
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    match ask(token.clone(), after.clone(), mid).await {
                        Ok(p) => {
                            good = Some(p);
                            lo = mid;
                        }
                        Err(e) if bad_key(&e).is_some() => hi = mid - 1,
                        Err(e) => return Err(e),
                    }
                }
                if let Some(p) = good {
                    take(&mut out, p.result, &strip);
                }
                if out.skipped.len() > 10_000 || after.as_deref() == Some(past(&bad).as_str()) {
                    // Either the store holds nothing but bad keys here, or it ignores the offset.
                    return Err(e);
                }
                out.skipped.push(bad.clone());
                token = None;
                after = Some(past(&bad));
                continue;
            }
        };
        take(&mut out, page.result, &strip);
        match page.page_token {
            Some(t) => {
                token = Some(t);
                after = None;
            }
            None => return Ok(out),
        }
    }
}

/// The page's objects, keyed relative to the store's prefix (as the `PrefixStore` hands them out),
/// and its subdirectories' names.
fn take(into: &mut Dir, page: object_store::ListResult, strip: &str) {
    for mut m in page.objects {
        if let Some(rel) = m.location.as_ref().strip_prefix(strip)
            && let Ok(p) = Path::parse(rel)
        {
            m.location = p;
            into.objects.push(m);
        }
    }
    into.dirs.extend(
        page.common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_skipped_whole() {
        assert_eq!(past("v1/full/./"), "v1/full/.0");
        assert!(past("v1/full/./").as_str() > "v1/full/./y.ews");
        assert!(past("v1/full/./").as_str() < "v1/full/0");
        assert_eq!(past("v1/full/a//b.ews"), "v1/full/a//b.ews");
    }

    #[test]
    fn local_listing_skips_what_cannot_be_a_name() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v1/full");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("full-1.ews"), b"x").unwrap();
        std::fs::write(dir.join(std::ffi::OsStr::from_bytes(b"bad-\xff.ews")), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("loop"), dir.join("loop")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/inner.ews"), b"x").unwrap();
        let listed = local(&dir, "v1/full").unwrap();
        let names: Vec<String> = listed.objects.iter().map(|m| m.location.to_string()).collect();
        assert_eq!(names, ["v1/full/full-1.ews"]);
        assert_eq!(listed.dirs, ["sub"]);
        assert_eq!(listed.skipped.len(), 2, "{:?}", listed.skipped);
    }
}

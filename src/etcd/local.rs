//! Is a member's data dir sound, without starting etcd on it? (A cluster member's etcd cannot be
//! started privately the way a single member's is: it would wait for its peers.) The checks etcd's
//! own start would fail on first: a WAL directory with segments, and a db whose bbolt meta pages
//! are valid and whose file holds every page up to the high-water mark (a truncated db fails).

use std::path::Path;

use crate::etcd::MemberDirs;
use crate::format::bolt::BoltFile;

#[derive(Debug, Clone, PartialEq)]
pub enum LocalData {
    /// No data dir, or an empty one: nothing to keep.
    Missing,
    Sound,
    /// There is data, and etcd cannot start on it: why.
    Broken(String),
}

pub fn check(dirs: &MemberDirs) -> LocalData {
    let data = &dirs.data;
    if dirs.is_empty() {
        return LocalData::Missing;
    }
    let member = data.join("member");
    if !member.is_dir() {
        return LocalData::Broken(format!("{} has no member directory", data.display()));
    }
    let wal = dirs.wal_dir();
    let segments = std::fs::read_dir(&wal)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".wal"))
                .filter(|e| e.metadata().is_ok_and(|m| m.len() > 0))
                .count()
        })
        .unwrap_or(0);
    if segments == 0 {
        return LocalData::Broken(format!("{} holds no WAL segment", wal.display()));
    }
    let db = member.join("snap").join("db");
    match BoltFile::open(&db).and_then(|f| f.root_items().map(drop)) {
        Ok(()) => LocalData::Sound,
        Err(e) => LocalData::Broken(format!("{}: {e}", db.display())),
    }
}

/// How many members the data dir's own membership names (etcd's `members` bucket), read without
/// starting etcd; `None` when there is no readable db.
pub fn member_count(data: &Path) -> Option<usize> {
    let db = BoltFile::open(&data.join("member").join("snap").join("db")).ok()?;
    let root = db.root_items().ok()?;
    let (_, _, v) = root.iter().find(|(_, k, _)| k.as_slice() == b"members")?;
    let bucket = crate::format::bolt::BucketValue::parse(v).ok()?;
    Some(db.bucket_items(&bucket).ok()?.len())
}

//! Where a member keeps its data: the data dir and, with etcd's `--wal-dir`, the WAL's own
//! directory (often on another disk). Everything the warden does to a member's data (judge it,
//! move it aside, restore it, put it back) does it to both, or a restored db would start on the
//! old WAL's history, and a sound member would be judged broken for the WAL it keeps elsewhere.

use std::path::{Path, PathBuf};

use super::EtcdArgs;

/// Creates `path` afresh for writing (0600): whatever had that name is unlinked first (a symlink
/// itself, never what it points to), and the open creates a new file or fails, so it follows no
/// link (`O_CREAT | O_EXCL`, and `O_NOFOLLOW`). Every file the warden writes beside the data dir
/// goes through here: whoever can write the data dir's parent cannot make the warden write
/// through a link they planted.
pub fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}

/// Writes `bytes` into a fresh file at `path` ([`create_fresh`]).
pub fn write_fresh(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    create_fresh(path)?.write_all(bytes)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDirs {
    /// `--data-dir`, absolute.
    pub data: PathBuf,
    /// `--wal-dir`, absolute, when given.
    pub wal: Option<PathBuf>,
}

impl MemberDirs {
    pub fn of(etcd: &EtcdArgs) -> Self {
        Self {
            data: etcd.data_path(),
            wal: etcd.wal_path(),
        }
    }

    /// A data dir without `--wal-dir`.
    pub fn data_only(data: &Path) -> Self {
        Self {
            data: data.to_owned(),
            wal: None,
        }
    }

    /// Where etcd keeps its WAL segments.
    pub fn wal_dir(&self) -> PathBuf {
        self.wal
            .clone()
            .unwrap_or_else(|| self.data.join("member").join("wal"))
    }

    /// The WAL dir when it is not inside the data dir (inside, it moves with the data dir).
    pub fn separate_wal(&self) -> Option<&Path> {
        self.wal.as_deref().filter(|w| !w.starts_with(&self.data))
    }

    /// Nothing to keep: no data dir (or an empty one) and no WAL elsewhere.
    pub fn is_empty(&self) -> bool {
        is_empty_dir(&self.data) && self.separate_wal().is_none_or(is_empty_dir)
    }

    /// Moves the data dir to `<data-dir><suffix>` and a separate WAL dir to `<wal-dir><suffix>`
    /// (beside itself, so on its own filesystem); returns where the data dir went.
    pub fn move_aside(&self, suffix: &str) -> Result<PathBuf, String> {
        let to = beside(&self.data, suffix);
        if self.data.exists() {
            std::fs::rename(&self.data, &to)
                .map_err(|e| format!("move {} aside to {}: {e}", self.data.display(), to.display()))?;
        }
        if let Some(wal) = self.separate_wal().filter(|w| w.exists()) {
            let wal_to = beside(wal, suffix);
            if let Err(e) = std::fs::rename(wal, &wal_to) {
                // Both or neither: the data dir goes back beside its WAL.
                let _ = std::fs::rename(&to, &self.data);
                return Err(format!(
                    "move the WAL dir {} aside to {}: {e}",
                    wal.display(),
                    wal_to.display()
                ));
            }
            tracing::warn!(from = %wal.display(), to = %wal_to.display(), "WAL dir moved aside with its data dir (kept, not deleted)");
        }
        Ok(to)
    }

    /// Puts back what `move_aside(suffix)` moved. Whatever is in place now (a failed or older
    /// restore) first goes to `<dir><instead>`; an empty dir is removed.
    pub fn put_back(&self, suffix: &str, instead: &str) -> Result<(), String> {
        let mut pairs = vec![(self.data.clone(), beside(&self.data, suffix))];
        if let Some(wal) = self.separate_wal() {
            pairs.push((wal.to_owned(), beside(wal, suffix)));
        }
        for (dir, from) in pairs {
            if !from.exists() {
                continue;
            }
            if is_empty_dir(&dir) {
                let _ = std::fs::remove_dir(&dir);
            } else {
                let to = beside(&dir, instead);
                std::fs::rename(&dir, &to)
                    .map_err(|e| format!("move {} aside to {}: {e}", dir.display(), to.display()))?;
            }
            std::fs::rename(&from, &dir)
                .map_err(|e| format!("put {} back from {}: {e}", dir.display(), from.display()))?;
        }
        Ok(())
    }
}

/// Whether a path is absent or an empty directory.
pub fn is_empty_dir(path: &Path) -> bool {
    match std::fs::read_dir(path) {
        Ok(mut it) => it.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// `<path><suffix>`, in the same parent.
pub fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_beside_the_data_dir_is_replaced_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("root-owned");
        std::fs::write(&target, b"keep").unwrap();
        let log = t.path().join("data.validate.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        write_fresh(&log, b"etcd's log").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&log).unwrap(), b"etcd's log");
        assert!(!std::fs::symlink_metadata(&log).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_separate_wal_moves_aside_and_back_with_its_data_dir() {
        let t = tempfile::tempdir().unwrap();
        let dirs = MemberDirs {
            data: t.path().join("data"),
            wal: Some(t.path().join("disk2/wal")),
        };
        std::fs::create_dir_all(dirs.data.join("member/snap")).unwrap();
        std::fs::create_dir_all(dirs.wal_dir()).unwrap();
        std::fs::write(dirs.wal_dir().join("0.wal"), b"x").unwrap();
        assert!(!dirs.is_empty());
        let to = dirs.move_aside(".broken-1").unwrap();
        assert_eq!(to, t.path().join("data.broken-1"));
        assert!(t.path().join("disk2/wal.broken-1/0.wal").exists());
        assert!(dirs.is_empty());
        // A restore that failed half-way left a data dir: it goes aside, the original comes back.
        std::fs::create_dir_all(dirs.data.join("member")).unwrap();
        dirs.put_back(".broken-1", ".failed-1").unwrap();
        assert!(dirs.data.join("member/snap").is_dir());
        assert!(dirs.wal_dir().join("0.wal").exists());
        assert!(t.path().join("data.failed-1/member").is_dir());
    }

    #[test]
    fn a_wal_dir_inside_the_data_dir_moves_with_it() {
        let dirs = MemberDirs {
            data: "/d".into(),
            wal: Some("/d/wal".into()),
        };
        assert_eq!(dirs.separate_wal(), None);
        assert_eq!(
            MemberDirs::data_only(Path::new("/d")).wal_dir(),
            PathBuf::from("/d/member/wal")
        );
    }
}

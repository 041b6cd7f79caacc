//! Which etcd release is being run, and what its operators should know about it.
//!
//! The warden reads the version twice: from `etcd --version` before the first start (so the log says
//! it even when etcd never comes up), and from the server's own status answer once it serves. A
//! release with a known data-loss or membership bug is reported in the log and in `/status`
//! (`etcd.version`, `etcd.known_issues`); the warden never refuses to run it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::process::pid1::{ExitStatus, Reaper, run_bounded};

/// An etcd release number, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }

    /// `3.5.16`, `v3.5.16`, `3.5.16-rc.0` (the pre-release part is ignored).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_start_matches('v');
        let core = s.split(['-', '+', ' ']).next()?;
        let mut it = core.split('.').map(str::parse::<u32>);
        let v = Self::new(it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?);
        it.next().is_none().then_some(v)
    }

    /// The version in `etcd --version`'s output ("etcd Version: 3.5.16").
    pub fn from_version_output(out: &str) -> Option<Self> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix("etcd Version:"))
            .and_then(Self::parse)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A bug of an etcd release that the warden's users should know about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnownIssue {
    /// etcd's issue, `etcd-io/etcd#13766`.
    pub issue: &'static str,
    /// The first release that has the fix.
    pub fixed_in: String,
    pub summary: &'static str,
}

struct Entry {
    /// Affected: `from <= v < fixed`.
    from: Version,
    fixed: Version,
    issue: &'static str,
    summary: &'static str,
}

const KNOWN: &[Entry] = &[
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 3),
        issue: "etcd-io/etcd#13766",
        summary: "acknowledged writes can be lost when etcd crashes or is killed (data loss); upgrade to 3.5.3 or later",
    },
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 20),
        issue: "etcd-io/etcd#19557",
        summary: "a membership bug with learners, which members that rejoin or scale up use; upgrade to 3.5.20 or later before adding members",
    },
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 26),
        issue: "etcd-io/etcd#20967",
        summary: "members removed or added under this release can come back after an upgrade to 3.6; upgrade to 3.5.26 or later before any member remove/add or 3.6 upgrade",
    },
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 23),
        issue: "etcd-io/etcd#20650",
        summary: "a member that receives a raft snapshot while it defragments can corrupt its db (data loss); upgrade to 3.5.23 or later",
    },
    Entry {
        from: Version::new(3, 6, 0),
        fixed: Version::new(3, 6, 5),
        issue: "etcd-io/etcd#20650",
        summary: "a member that receives a raft snapshot while it defragments can corrupt its db (data loss); upgrade to 3.6.5 or later",
    },
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 28),
        issue: "etcd-io/etcd#21417",
        summary: "a member paused (a stopped VM, a long GC) can serve stale linearizable reads after it resumes; upgrade to 3.5.28 or later",
    },
    Entry {
        from: Version::new(3, 6, 0),
        fixed: Version::new(3, 6, 9),
        issue: "etcd-io/etcd#21417",
        summary: "stale linearizable reads after a process pause or a leader change racing ReadIndex (etcd-io/etcd#21378); upgrade to 3.6.9 or later",
    },
    Entry {
        from: Version::new(3, 6, 0),
        fixed: Version::new(3, 6, 11),
        issue: "etcd-io/etcd#21667",
        summary: "adding a member fails while another member is down, even with quorum: a member that rejoins through its peers waits until every other member is up; upgrade to 3.6.11 or later",
    },
    Entry {
        from: Version::new(3, 5, 0),
        fixed: Version::new(3, 5, 31),
        issue: "etcd-io/etcd#21694",
        summary: "a peer-URL update (MemberUpdate) of a learner promotes it to a voter; the warden never updates a learner, and neither should you before 3.5.31",
    },
    Entry {
        from: Version::new(3, 6, 0),
        fixed: Version::new(3, 6, 12),
        issue: "etcd-io/etcd#21694",
        summary: "a peer-URL update (MemberUpdate) of a learner promotes it to a voter; the warden never updates a learner, and neither should you before 3.6.12",
    },
    Entry {
        from: Version::new(3, 6, 0),
        fixed: Version::new(3, 7, 0),
        issue: "etcd-io/etcd#21432",
        summary: "a transaction that reads a range at an explicit revision can make members disagree (not fixed in 3.6); avoid such transactions or run 3.7",
    },
];

/// The known issues of release `v`, most severe first.
pub fn known_issues(v: Version) -> Vec<KnownIssue> {
    KNOWN
        .iter()
        .filter(|e| e.from <= v && v < e.fixed)
        .map(|e| KnownIssue {
            issue: e.issue,
            fixed_in: e.fixed.to_string(),
            summary: e.summary,
        })
        .collect()
}

/// `etcd --version` of `program`, through the reaper. `None` (logged) when it does not answer
/// within 5 s (a wrapper script may not know `--version`).
pub async fn of_binary(reaper: &Reaper, program: &Path) -> Option<Version> {
    let limit = Some(std::time::Duration::from_secs(5));
    match run_bounded(reaper, Command::new(program).arg("--version"), limit).await {
        Ok((ExitStatus::Code(0), out, _)) => {
            let v = Version::from_version_output(&out);
            if v.is_none() {
                tracing::warn!(etcd = %program.display(), output = %out.trim(), "cannot read a version in `etcd --version`");
            }
            v
        }
        Ok((status, _, err)) => {
            tracing::warn!(etcd = %program.display(), %status, stderr = %err.trim(), "`etcd --version` failed");
            None
        }
        Err(e) => {
            tracing::warn!(etcd = %program.display(), error = %e, "cannot run `etcd --version`");
            None
        }
    }
}

/// Logs the known issues of `v`, once per version seen.
pub fn warn_known_issues(v: Version, source: &str) {
    for i in known_issues(v) {
        tracing::warn!(version = %v, source, issue = i.issue, fixed_in = %i.fixed_in, "etcd {v} has a known bug: {}", i.summary);
    }
}

/// Where the warden records the release that last served a data dir.
pub fn release_record(data_dir: &Path) -> PathBuf {
    super::dirs::beside(data_dir, ".warden-etcd-release")
}

/// The release that last served `data_dir` under the warden, if it recorded one.
pub fn last_release(data_dir: &Path) -> Option<Version> {
    Version::parse(std::fs::read_to_string(release_record(data_dir)).ok()?.trim())
}

/// Records `release` as the last one that served `data_dir`.
pub fn record_release(data_dir: &Path, release: Version) -> std::io::Result<()> {
    let path = release_record(data_dir);
    let tmp = path.with_extension("tmp");
    super::dirs::write_fresh(&tmp, format!("{release}\n").as_bytes())?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_etcd_prints() {
        let out = "etcd Version: 3.5.16\nGit SHA: Not provided\nGo Version: go1.24.0\n";
        assert_eq!(Version::from_version_output(out), Some(Version::new(3, 5, 16)));
        assert_eq!(Version::parse("v3.4.23"), Some(Version::new(3, 4, 23)));
        assert_eq!(Version::parse("3.6.0-rc.1"), Some(Version::new(3, 6, 0)));
        assert_eq!(Version::parse("3.5"), None);
        assert_eq!(Version::parse("3.5.x"), None);
        assert_eq!(Version::from_version_output("etcdctl version: 3.5.1"), None);
    }

    #[test]
    fn known_issues_by_release() {
        let ids = |v| known_issues(v).into_iter().map(|i| i.issue).collect::<Vec<_>>();
        assert_eq!(
            ids(Version::new(3, 5, 1))[..3],
            ["etcd-io/etcd#13766", "etcd-io/etcd#19557", "etcd-io/etcd#20967"]
        );
        assert_eq!(
            ids(Version::new(3, 5, 16)),
            [
                "etcd-io/etcd#19557",
                "etcd-io/etcd#20967",
                "etcd-io/etcd#20650",
                "etcd-io/etcd#21417",
                "etcd-io/etcd#21694"
            ]
        );
        assert_eq!(
            ids(Version::new(3, 5, 25)),
            ["etcd-io/etcd#20967", "etcd-io/etcd#21417", "etcd-io/etcd#21694"]
        );
        assert_eq!(ids(Version::new(3, 5, 30)), ["etcd-io/etcd#21694"]);
        assert!(ids(Version::new(3, 5, 31)).is_empty());
        assert!(ids(Version::new(3, 4, 23)).is_empty());
        assert_eq!(
            ids(Version::new(3, 6, 0)),
            [
                "etcd-io/etcd#20650",
                "etcd-io/etcd#21417",
                "etcd-io/etcd#21667",
                "etcd-io/etcd#21694",
                "etcd-io/etcd#21432"
            ]
        );
        assert_eq!(ids(Version::new(3, 6, 16)), ["etcd-io/etcd#21432"]);
        assert!(ids(Version::new(3, 7, 3)).is_empty());
        assert_eq!(known_issues(Version::new(3, 5, 2))[0].fixed_in, "3.5.3");
    }
}

//! The downloaded full snapshot made the restored member's data dir, with etcd's own tool.
//!
//! etcd's tool (`etcdutl snapshot restore`, 3.5+) copies the whole database into the new data
//! dir, then changes a few small buckets (the members, the consistent index and term) and writes
//! the member's WAL and raft snapshot. At 8 GiB the copy is most of a restore: a second 8 GiB
//! written and synced beside the one the warden already wrote. So the tool restores a *seed*
//! instead: a bbolt file with every bucket of the full, the keys and leases left out (empty). Its
//! WAL and raft snapshot depend on the flags alone, not on the database. What the tool changed in
//! the seed's buckets is then written into the full itself, copy-on-write with the warden's bbolt
//! writer, and the full takes the seed's place. The result is the tool's own, bucket by bucket
//! (tests/oracle.rs compares it with etcdutl's restore of the same data, WAL and snap files byte
//! for byte).
//!
//! The tool is run on the full itself, as before, where the seed cannot stand for it: etcdctl 3.4
//! (its restore opens etcd's mvcc store, which reads every key), a bucket the seed cannot hold
//! (nested, or over `SEED_BYTES`), or a tool that wrote into a bucket the seed left out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::execute::{Failure, RestoreOptions, restore_tool};
use super::plan::Candidate;
use crate::format::bolt::{BUCKET_LEAF, BoltError, BoltFile, BucketValue, LeafItem};
use crate::process::pid1::{ExitStatus, Reaper, run_bounded};

/// The buckets the seed holds empty: etcd's restore tools do not touch them, and they are the
/// database's bulk.
const LEFT_OUT: &[&[u8]] = &[b"key", b"lease"];

/// What the seed may hold of the other buckets (members, auth, meta, alarms): kilobytes in any
/// cluster; more is no etcd's, and goes the tool's own way, bounded in memory there.
const SEED_BYTES: usize = 64 << 20;

/// The most heap etcd's restore tool may take (`RLIMIT_DATA`). etcdutl maps the database shared
/// (not counted) and changes a few pages of it: tens of MiB at any size.
const TOOL_MEMORY: u64 = 2 << 30;

/// How long etcd's restore tool may run on a database of `size` bytes: two minutes, and a minute
/// more per 600 MiB (it copies the file and syncs it: 10 MiB/s is a disk well below any etcd's).
fn tool_time(size: u64) -> Duration {
    Duration::from_secs(120 + size / (10 << 20))
}

/// Makes `data` (missing) a restored member from the full snapshot downloaded to `db` (etcd's
/// stream: the database and its sha256, verified), which is used up.
pub(super) async fn restore_full(
    opts: &RestoreOptions,
    reaper: &Reaper,
    cand: &Candidate,
    db: &Path,
    data: &Path,
) -> Result<(), Failure> {
    let tool = restore_tool(opts).ok_or_else(|| {
        Failure::Local(format!(
            "neither etcdutl nor etcdctl beside {}",
            opts.etcd.display()
        ))
    })?;
    if tool.file_name().is_some_and(|n| n != "etcdctl") {
        let t = Instant::now();
        match seeded(opts, reaper, &tool, db, data).await {
            Ok(()) => {
                tracing::info!(
                    secs = t.elapsed().as_secs_f64(),
                    "full snapshot restored in place (the tool restored its small buckets)"
                );
                return Ok(());
            }
            Err(Seeded::Unsupported(why)) => {
                tracing::info!(reason = %why, "the full snapshot goes through the tool whole");
                if data.exists() {
                    std::fs::remove_dir_all(data)
                        .map_err(|e| Failure::Local(format!("remove {}: {e}", data.display())))?;
                }
            }
            Err(Seeded::Corrupt(why)) => {
                return Err(Failure::BadFull(format!("{}: {why}", cand.full.key())));
            }
            Err(Seeded::Failed(f)) => return Err(f),
        }
    }
    whole(opts, reaper, cand, &tool, db, data).await
}

/// Why the seeded restore did not happen.
enum Seeded {
    /// The seed cannot stand for this database (or this tool): the tool takes it whole.
    Unsupported(String),
    /// The full's own bbolt tree is unsound.
    Corrupt(String),
    Failed(Failure),
}

impl From<BoltError> for Seeded {
    fn from(e: BoltError) -> Self {
        match e {
            BoltError::Unsupported(m) => Self::Unsupported(m),
            e @ BoltError::Corrupt(_) => Self::Corrupt(e.to_string()),
            BoltError::Io(e) => {
                Self::Failed(Failure::Local(format!("restore the full snapshot in place: {e}")))
            }
        }
    }
}

async fn seeded(
    opts: &RestoreOptions,
    reaper: &Reaper,
    tool: &Path,
    db: &Path,
    data: &Path,
) -> Result<(), Seeded> {
    let seed = db.with_file_name("seed.db");
    let restored = data.join("member").join("snap").join("db");
    let (db, paths) = (db.to_owned(), (seed.clone(), restored.clone()));
    // The file work (up to syncing the whole database) runs off the async workers.
    let mut full = blocking({
        let (db, seed) = (db.clone(), seed.clone());
        move || {
            // etcd's sha256 (checked on the way in) is cut off, as the tool does: 32 bytes past a
            // whole number of 512-byte blocks.
            let len = std::fs::metadata(&db).map_err(|e| local("stat", &db, e))?.len();
            if len % 512 == 32 {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&db)
                    .map_err(|e| local("open", &db, e))?;
                f.set_len(len - 32).map_err(|e| local("truncate", &db, e))?;
            }
            let full = BoltFile::open(&db)?;
            write_seed(&full, &seed)?;
            Ok(full)
        }
    })
    .await?;
    let mut cmd = tool_command(opts, tool, data);
    cmd.arg(&seed);
    match run_tool(reaper, tool, &mut cmd, 0).await {
        Ok(()) => {}
        Err(Ok(why)) => {
            return Err(Seeded::Unsupported(format!(
                "{} failed on the seed ({why})",
                tool.display()
            )));
        }
        Err(Err(f)) => return Err(Seeded::Failed(f)),
    }
    blocking(move || {
        let (seed, restored) = paths;
        let root = carry(&mut full, &seed, &restored)?;
        let _ = std::fs::remove_file(&seed);
        full.commit(root)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| local("chmod", &db, e))?;
        }
        std::fs::rename(&db, &restored).map_err(|e| local("rename the full snapshot to", &restored, e))
    })
    .await
}

fn local(what: &str, p: &Path, e: std::io::Error) -> Seeded {
    Seeded::Failed(Failure::Local(format!("{what} {}: {e}", p.display())))
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Seeded> + Send + 'static,
) -> Result<T, Seeded> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(Seeded::Failed(Failure::Local(format!(
            "the restore's file work: {e}"
        ))))
    })
}

/// Writes the seed: every top-level bucket of `full` with its items and sequence, those
/// `LEFT_OUT` empty.
fn write_seed(full: &BoltFile, path: &Path) -> Result<(), BoltError> {
    let _ = std::fs::remove_file(path);
    let mut seed = BoltFile::create(path, full.page_size())?;
    let mut root = Vec::new();
    let mut budget = SEED_BYTES;
    for (flags, name, value) in full.root_items()? {
        let bucket = String::from_utf8_lossy(&name).into_owned();
        if flags & BUCKET_LEAF == 0 {
            return Err(BoltError::Unsupported(format!(
                "top-level key {bucket} is not a bucket"
            )));
        }
        let b = BucketValue::parse(&value)?;
        let items = match LEFT_OUT.contains(&name.as_slice()) {
            true => Vec::new(),
            false => full.bucket_items_within(&b, &mut budget)?,
        };
        if items.iter().any(|(f, _, _)| f & BUCKET_LEAF != 0) {
            return Err(BoltError::Unsupported(format!("bucket {bucket} holds a bucket")));
        }
        let at = seed.write_tree(items)?;
        root.push((BUCKET_LEAF, name, BucketValue::encode(at, b.sequence)));
    }
    seed.commit(root)
}

/// Every top-level bucket of a small bbolt file: name → (sequence, items).
type Buckets = Vec<(Vec<u8>, u64, Vec<LeafItem>)>;

/// Not the full's: a file the warden or the tool wrote, whose flaws say nothing of the backup, so
/// they send the full to the tool whole instead of to an older chain.
fn buckets(path: &Path) -> Result<Buckets, BoltError> {
    read_buckets(path).map_err(|e| match e {
        BoltError::Corrupt(m) => BoltError::Unsupported(format!("{}: {m}", path.display())),
        e => e,
    })
}

fn read_buckets(path: &Path) -> Result<Buckets, BoltError> {
    let file = BoltFile::open(path)?;
    let mut budget = 2 * SEED_BYTES;
    let mut out = Vec::new();
    for (flags, name, value) in file.root_items()? {
        if flags & BUCKET_LEAF == 0 {
            return Err(BoltError::Unsupported(format!(
                "top-level key {} is not a bucket",
                String::from_utf8_lossy(&name)
            )));
        }
        let b = BucketValue::parse(&value)?;
        let items = file.bucket_items_within(&b, &mut budget)?;
        if items.iter().any(|(f, _, _)| f & BUCKET_LEAF != 0) {
            return Err(BoltError::Unsupported(format!(
                "bucket {} holds a bucket",
                String::from_utf8_lossy(&name)
            )));
        }
        out.push((name, b.sequence, items));
    }
    Ok(out)
}

/// Writes into `full` each bucket the tool changed between the `seed` and what it `restored`,
/// and returns the full's new root (committed by the caller).
fn carry(full: &mut BoltFile, seed: &Path, restored: &Path) -> Result<Vec<LeafItem>, BoltError> {
    let before = buckets(seed)?;
    let after = buckets(restored)?;
    let mut root = full.root_items()?;
    for (name, _, _) in &before {
        if !after.iter().any(|(n, _, _)| n == name) {
            return Err(BoltError::Unsupported(format!(
                "the tool removed bucket {}",
                String::from_utf8_lossy(name)
            )));
        }
    }
    for (name, sequence, items) in after {
        let unchanged = before
            .iter()
            .any(|(n, s, i)| *n == name && *s == sequence && *i == items);
        if unchanged {
            continue;
        }
        if LEFT_OUT.contains(&name.as_slice()) {
            return Err(BoltError::Unsupported(format!(
                "the tool wrote into bucket {}, which the seed leaves out",
                String::from_utf8_lossy(&name)
            )));
        }
        let at = full.write_tree(items)?;
        let value = BucketValue::encode(at, sequence);
        match root.binary_search_by(|(_, n, _)| n.as_slice().cmp(&name)) {
            Ok(i) => root[i].2 = value,
            Err(i) => root.insert(i, (BUCKET_LEAF, name, value)),
        }
    }
    Ok(root)
}

/// etcd's restore tool into `data`, with the member's flags; the snapshot's path goes last.
fn tool_command(opts: &RestoreOptions, tool: &Path, data: &Path) -> Command {
    let mut cmd = Command::new(tool);
    if tool.file_name().is_some_and(|n| n == "etcdctl") {
        cmd.env("ETCDCTL_API", "3");
    }
    cmd.arg("snapshot")
        .arg("restore")
        .arg("--data-dir")
        .arg(data)
        .arg("--name")
        .arg(&opts.name)
        // etcd's sha256 of the full was checked on the way in (read_full_to_file), with the
        // object's digest; the tool still cuts the trailer off, it only skips hashing the
        // database a second time (a third of its run on a 1 GiB database).
        .arg("--skip-hash-check");
    // etcdutl's own default names the member "default"; derive it from --name instead, as documented.
    let cluster = opts.initial_cluster.clone().unwrap_or_else(|| {
        let peer = opts
            .initial_advertise_peer_urls
            .as_deref()
            .unwrap_or("http://localhost:2380");
        format!("{}={peer}", opts.name)
    });
    cmd.arg("--initial-cluster").arg(cluster);
    if let Some(p) = &opts.initial_advertise_peer_urls {
        cmd.arg("--initial-advertise-peer-urls").arg(p);
    }
    if let Some(tok) = &opts.initial_cluster_token {
        cmd.arg("--initial-cluster-token").arg(tok);
    }
    cmd
}

/// Runs the tool, bounded in memory and time: whoever can write to the bucket can also give a
/// crafted database a matching sha256, and etcd's tool trusts the file's page claims. `Err(Ok)`
/// is the tool's own failure, said; `Err(Err)` that it could not be run.
async fn run_tool(
    reaper: &Reaper,
    tool: &Path,
    cmd: &mut Command,
    size: u64,
) -> Result<(), Result<String, Failure>> {
    crate::etcd::supervisor::limit_data(cmd, TOOL_MEMORY);
    match run_bounded(reaper, cmd, Some(tool_time(size))).await {
        Ok((ExitStatus::Code(0), _, _)) => Ok(()),
        Ok((status, _, err)) => Err(Ok(format!("{status}: {}", err.trim()))),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Ok(e.to_string())),
        Err(e) => Err(Err(Failure::Local(format!("run {}: {e}", tool.display())))),
    }
}

/// The tool restores the whole full snapshot (etcdctl 3.4, or a database the seed cannot stand
/// for).
async fn whole(
    opts: &RestoreOptions,
    reaper: &Reaper,
    cand: &Candidate,
    tool: &Path,
    db: &Path,
    data: &Path,
) -> Result<(), Failure> {
    // The tool gets the downloaded file by descriptor and the file loses its name now: once the tool
    // has copied it and both have closed it, the kernel drops the pages not yet written back
    // instead of writing a deleted 1 GiB to disk beside the tool's own fsync (which that writeback
    // slowed by seconds). The tools (etcdctl 3.4, etcdutl 3.5) open the snapshot path once. Without
    // /proc (the path does not resolve here) the file keeps its name and the tool gets that.
    let snapshot =
        std::fs::File::open(db).map_err(|e| Failure::Local(format!("open {}: {e}", db.display())))?;
    let mut cmd = tool_command(opts, tool, data);
    let passed: PathBuf = match crate::etcd::supervisor::pass_file(&mut cmd, &snapshot) {
        Some(passed) if std::fs::metadata(&passed).is_ok() => {
            let _ = std::fs::remove_file(db);
            passed
        }
        _ => db.to_owned(),
    };
    cmd.arg(&passed);
    opts.progress
        .step(format!("restoring the full snapshot with {}", tool.display()));
    let size = snapshot.metadata().map(|m| m.len()).unwrap_or(0);
    let failed = match run_tool(reaper, tool, &mut cmd, size).await {
        Ok(()) => None,
        Err(Ok(why)) => Some(why),
        Err(Err(f)) => return Err(f),
    };
    // The snapshot passed its digest and etcd's own sha256: a tool that cannot restore it fails
    // for reasons of this machine (disk, permissions, version), unless the warden's own reader
    // finds the database unsound: then the object is bad, and an older chain is the way on.
    let failed = failed.map(|why| {
        let why = format!("{} snapshot restore failed ({why})", tool.display());
        match BoltFile::open(&passed).and_then(|f| f.check()) {
            Ok(()) | Err(BoltError::Io(_)) => Failure::Local(why),
            Err(e) => Failure::BadFull(format!("{}: {e}; {why}", cand.full.key())),
        }
    });
    drop(snapshot);
    let _ = std::fs::remove_file(db);
    match failed {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(k: &str, v: &str) -> LeafItem {
        (0, k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    /// A bbolt file with these buckets (name, items), as a full snapshot's database.
    fn db(path: &Path, buckets: Vec<(&str, Vec<LeafItem>)>) {
        let mut f = BoltFile::create(path, 4096).expect("create");
        let mut root = Vec::new();
        for (name, items) in buckets {
            let at = f.write_tree(items).expect("tree");
            root.push((BUCKET_LEAF, name.as_bytes().to_vec(), BucketValue::encode(at, 7)));
        }
        f.commit(root).expect("commit");
    }

    fn read(path: &Path) -> Vec<(String, u64, Vec<LeafItem>)> {
        buckets(path)
            .expect("buckets")
            .into_iter()
            .map(|(n, s, i)| (String::from_utf8(n).expect("utf-8"), s, i))
            .collect()
    }

    fn keys(n: usize) -> Vec<LeafItem> {
        (0..n)
            .map(|i| item(&format!("{i:08}"), &"v".repeat(300)))
            .collect()
    }

    #[test]
    fn the_tools_changes_to_the_seed_reach_the_full_and_its_keys_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (full_path, seed, restored) = (
            dir.path().join("full"),
            dir.path().join("seed"),
            dir.path().join("restored"),
        );
        db(
            &full_path,
            vec![
                ("key", keys(5000)),
                ("lease", vec![item("l1", "lease")]),
                ("members", vec![item("m-old", "old member")]),
                (
                    "meta",
                    vec![item("consistent_index", "77"), item("storageVersion", "3.6")],
                ),
            ],
        );
        let mut full = BoltFile::open(&full_path).expect("open");
        write_seed(&full, &seed).expect("seed");
        let s = read(&seed);
        assert_eq!(s[0], ("key".into(), 7, vec![]), "the seed leaves the keys out");
        assert_eq!(
            s[1],
            ("lease".into(), 7, vec![]),
            "the seed leaves the leases out"
        );
        assert_eq!(s[2].2, vec![item("m-old", "old member")]);
        assert!(std::fs::metadata(&seed).expect("seed").len() < 64 << 10);

        // The tool: the members replaced, the index set, a bucket added.
        std::fs::copy(&seed, &restored).expect("copy");
        let mut tool = BoltFile::open(&restored).expect("open");
        let mut root = tool.root_items().expect("root");
        let members = tool.write_tree(vec![item("m-new", "new member")]).expect("tree");
        root[2].2 = BucketValue::encode(members, 7);
        let meta = tool
            .write_tree(vec![
                item("consistent_index", "1"),
                item("storageVersion", "3.6"),
                item("term", "1"),
            ])
            .expect("tree");
        root[3].2 = BucketValue::encode(meta, 8);
        let alarm = tool.write_tree(vec![]).expect("tree");
        root.insert(0, (BUCKET_LEAF, b"alarm".to_vec(), BucketValue::encode(alarm, 0)));
        tool.commit(root).expect("commit");

        let root = carry(&mut full, &seed, &restored).expect("carry");
        full.commit(root).expect("commit");
        let got = read(&full_path);
        let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["alarm", "key", "lease", "members", "meta"]);
        assert_eq!(got[1].2, keys(5000), "the full's keys are its own");
        assert_eq!(
            got[2].2,
            vec![item("l1", "lease")],
            "the full's leases are its own"
        );
        assert_eq!(got[3].2, vec![item("m-new", "new member")], "the tool's members");
        assert_eq!(
            (got[4].1, got[4].2.clone()),
            (
                8,
                vec![
                    item("consistent_index", "1"),
                    item("storageVersion", "3.6"),
                    item("term", "1")
                ]
            ),
            "the tool's meta, with its sequence"
        );
    }

    #[test]
    fn a_tool_that_writes_into_a_bucket_the_seed_leaves_out_is_not_carried() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (full_path, seed, restored) = (
            dir.path().join("full"),
            dir.path().join("seed"),
            dir.path().join("restored"),
        );
        db(&full_path, vec![("key", keys(10)), ("meta", vec![])]);
        let mut full = BoltFile::open(&full_path).expect("open");
        write_seed(&full, &seed).expect("seed");
        std::fs::copy(&seed, &restored).expect("copy");
        let mut tool = BoltFile::open(&restored).expect("open");
        let mut root = tool.root_items().expect("root");
        let key = tool.write_tree(vec![item("tombstone", "")]).expect("tree");
        root[0].2 = BucketValue::encode(key, 7);
        tool.commit(root).expect("commit");
        assert!(
            matches!(carry(&mut full, &seed, &restored), Err(BoltError::Unsupported(m)) if m.contains("bucket key"))
        );
    }

    #[test]
    fn a_database_the_seed_cannot_hold_goes_to_the_tool_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A nested bucket (no etcd's).
        let nested = dir.path().join("nested");
        db(
            &nested,
            vec![(
                "auth",
                vec![(BUCKET_LEAF, b"inner".to_vec(), BucketValue::encode(2, 0))],
            )],
        );
        let full = BoltFile::open(&nested).expect("open");
        let err = write_seed(&full, &dir.path().join("seed1")).expect_err("nested");
        assert!(
            matches!(&err, BoltError::Unsupported(m) if m.contains("holds a bucket")),
            "{err}"
        );
        // Small buckets larger than the seed may hold.
        let big = dir.path().join("big");
        let value = "x".repeat(60 << 10);
        let items = (0..(SEED_BYTES / (60 << 10)) + 2)
            .map(|i| item(&format!("{i:06}"), &value))
            .collect();
        db(&big, vec![("authUsers", items)]);
        let full = BoltFile::open(&big).expect("open");
        let err = write_seed(&full, &dir.path().join("seed2")).expect_err("too big");
        assert!(
            matches!(&err, BoltError::Unsupported(m) if m.contains("larger")),
            "{err}"
        );
    }
}

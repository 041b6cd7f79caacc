//! Every reader of store data is total (issue 41): mutated real inputs (bit flips, extreme
//! integers where lengths and counts live, truncations, splices) go through each parser, which
//! must return an answer (any answer) without panicking, within a time bound, and allocating at
//! most a bound fixed by the input's size. Each target is its own test, so nextest gives it its
//! own process and the counting allocator below measures that target alone.
//!
//! `FUZZ_ITERATIONS` (default 1500) sets the inputs per target; `FUZZ_SEED` replays a run.
//! `bench/fuzz.sh` runs millions. A failing input is written to `target/fuzz-failures/`.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_warden::format::delta_codec::{self, Decoder, Event, EventType, Lease, Revision};
use etcd_warden::snapshot::delta::{PendingDelta, Writer, upload};
use etcd_warden::store::Store;
use etcd_warden::store::layout::{ChainId, Compression, SnapshotName};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// What one input may cost: 64 MiB and 64 bytes per input byte (decompression, page buffers).
fn memory_bound(len: usize) -> usize {
    (64 << 20) + 64 * len
}
const TIME_BOUND: Duration = Duration::from_secs(5);

fn iterations() -> usize {
    std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

/// One mutation of `seed`: what corrupts real objects (a flipped bit, a length or count made
/// extreme, a cut, a repeated or foreign slice).
fn mutate(rng: &mut fastrand::Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.usize(1..4) {
        if b.is_empty() {
            b.push(rng.u8(..));
            continue;
        }
        let at = rng.usize(..b.len());
        match rng.u8(0..7) {
            0 => b[at] ^= 1 << rng.u8(0..8),
            1 => b[at] = [0x00, 0xff, 0x7f, 0x80][rng.usize(..4)],
            2 => {
                let v: [u8; 8] = match rng.u8(0..4) {
                    0 => u64::MAX.to_le_bytes(),
                    1 => (u32::MAX as u64).to_le_bytes(),
                    2 => (i64::MAX as u64).to_be_bytes(),
                    _ => (u32::MAX as u64).to_be_bytes(),
                };
                let n = rng.usize(1..=8).min(b.len() - at);
                b[at..at + n].copy_from_slice(&v[..n]);
            }
            3 => b.truncate(at),
            4 => {
                let end = rng.usize(at..=b.len());
                let piece = b[at..end].to_vec();
                let to = rng.usize(..=b.len());
                b.splice(to..to, piece);
            }
            5 => {
                let n = rng.usize(1..64);
                let junk: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
                b.splice(at..at, junk);
            }
            _ => {
                let end = rng.usize(at..=b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

/// Feeds `iterations()` mutations of `seeds` to `parse`; fails on a panic, an input over the time
/// or memory bound, and prints the figures.
fn fuzz(target: &str, seeds: &[Vec<u8>], mut parse: impl FnMut(&[u8])) {
    assert!(!seeds.is_empty(), "{target}: no seeds");
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = iterations();
    let started = Instant::now();
    let mut worst = 0usize;
    for i in 0..n {
        let input = if i < seeds.len() {
            seeds[i].clone()
        } else {
            let pick = rng.usize(..seeds.len());
            mutate(&mut rng, &seeds[pick])
        };
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let t = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input)));
        let took = t.elapsed();
        let used = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        worst = worst.max(used);
        let problem = if outcome.is_err() {
            Some("panicked".to_owned())
        } else if took > TIME_BOUND {
            Some(format!("took {took:?}"))
        } else if used > memory_bound(input.len()) {
            Some(format!("allocated {used} bytes for {} input bytes", input.len()))
        } else {
            None
        };
        if let Some(p) = problem {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{target}-{seed}-{i}"));
            std::fs::write(&file, &input).unwrap();
            panic!(
                "{target}: input {i} {p} (FUZZ_SEED={seed}; the input is {})",
                file.display()
            );
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs in {:.1} s, no failure, peak {:.1} MiB per input (FUZZ_SEED={seed})",
        started.elapsed().as_secs_f64(),
        worst as f64 / (1 << 20) as f64
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Real delta payloads, in the writer's encoding: puts, deletes, leases, lease sets.
fn payloads() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for n in [1i64, 3, 20] {
        let mut b = Vec::new();
        delta_codec::encode_lease(
            &Lease {
                id: 7,
                granted_ttl: 60,
            },
            &mut b,
        );
        for r in 10..10 + n {
            let events = (0..(r % 3) + 1)
                .map(|i| Event {
                    kind: if i == 2 { EventType::Delete } else { EventType::Put },
                    key: format!("/registry/pods/ns/p{r}-{i}").into_bytes(),
                    value: vec![b'v'; (r * 13 % 200) as usize],
                    lease: if i == 1 { 7 } else { 0 },
                    create_revision: r,
                    version: 1,
                })
                .collect();
            delta_codec::encode_revision(&Revision { revision: r, events }, &mut b);
        }
        delta_codec::encode_lease_set(
            &[Lease {
                id: 7,
                granted_ttl: 60,
            }],
            &mut b,
        );
        out.push(b);
    }
    out
}

#[test]
fn fuzz_delta_codec() {
    fuzz("delta-codec", &payloads(), |input| {
        let mut d = Decoder::new();
        // In pieces, as a download arrives.
        for chunk in input.chunks(97) {
            if d.push(chunk).is_err() {
                return;
            }
        }
        let _ = d.finish();
    });
}

#[test]
fn fuzz_object_names() {
    let names: Vec<Vec<u8>> = [
        "v1/full/full-00000000000000000099-20261204T215500000Z-zstd-plain.ews",
        "v1/full/full-00000000000001000099-20261204T215500123Z-gzip-age.ews",
        "v1/delta/00000000000000000099-1796150501000/delta-00000000000000000100-00000000000000000150-20261204T215501000Z-zstd-plain.ews",
        "v1/rollback/3.6.16/full-00000000000000000099-20261204T215500000Z-zstd-plain.ews",
        "v2/Full-00000000-00000042-1796150507.gz",
        "v2/Incr-00000043-00000048-1796150508.Z",
        "v1/Backup-1796150500/Full-00000000-00000007-1796150501",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    fuzz("object-names", &names, |input| {
        let s = String::from_utf8_lossy(input);
        if let Ok(n) = SnapshotName::parse(&s) {
            // A parsed name renders a key that parses back to itself.
            let again = SnapshotName::parse(&n.key()).expect("a rendered key parses");
            assert_eq!(again.key(), n.key());
        }
        let _ = etcd_warden::store::gbr::names::parse(&s);
    });
}

/// Real objects of a store (`dir`, keys relative to it) as seeds, and a reader that puts each
/// mutation under its seed's key in a scratch file store and reads it end to end.
fn objects_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let key = e.path().strip_prefix(dir).unwrap().display().to_string();
                out.push((key, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn fuzz_objects(target: &str, objects: Vec<(String, Vec<u8>)>) {
    let rt = rt();
    let scratch = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", scratch.path().display()).parse().unwrap()).unwrap();
    let named: Vec<(SnapshotName, String, Vec<u8>)> = objects
        .into_iter()
        .filter_map(|(key, bytes)| {
            let name = SnapshotName::parse(&key)
                .ok()
                .or_else(|| etcd_warden::store::gbr::names::parse(&key))?;
            Some((name, key, bytes))
        })
        .collect();
    assert!(!named.is_empty(), "{target}: no object named as a snapshot");
    // Each mutation replaces one object (the seeds are tried in turn); the seed index travels in
    // the first bytes only for choosing, never in what the reader sees.
    let seeds: Vec<Vec<u8>> = named
        .iter()
        .enumerate()
        .map(|(i, (_, _, b))| [&(i as u32).to_le_bytes()[..], b].concat())
        .collect();
    fuzz(target, &seeds, |input| {
        let Some((i, body)) = input.split_first_chunk::<4>() else {
            return;
        };
        let (name, key, _) = &named[u32::from_le_bytes(*i) as usize % named.len()];
        let path = scratch.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, body).unwrap();
        rt.block_on(async {
            let read = etcd_warden::snapshot::verify::read_verified(&store, name, |_| Ok(()));
            let _ = tokio::time::timeout(TIME_BOUND, read).await;
        });
        std::fs::remove_file(&path).unwrap();
    });
}

#[test]
fn fuzz_warden_delta_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display()).parse().unwrap()).unwrap();
    let chain = ChainId {
        base: 9,
        base_created_ms: 1_796_150_500_000,
    };
    rt().block_on(async {
        for (i, raw) in payloads().into_iter().enumerate() {
            let mut d = Decoder::new();
            let records = d.push(&raw).unwrap();
            let revs: Vec<i64> = records
                .iter()
                .filter_map(|r| match r {
                    delta_codec::Record::Revision(r) => Some(r.revision),
                    _ => None,
                })
                .collect();
            let p = PendingDelta {
                chain,
                base: 9,
                first: revs[0],
                last: *revs.last().unwrap(),
                raw,
                revisions: revs.len() as u64,
                events: 0,
            };
            let compression = [Compression::Zstd, Compression::Gzip, Compression::None][i % 3];
            upload(&store, &p, compression, Writer::default()).await.unwrap();
        }
    });
    fuzz_objects("warden-delta-objects", objects_under(dir.path()));
}

#[test]
fn fuzz_gbr_objects() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gbr/store");
    let mut objects = Vec::new();
    for layout in ["gzip", "lzw", "zlib"] {
        objects.extend(objects_under(&fixtures.join(layout)));
    }
    // The small ones: a mutated 1 MiB full costs as much as a thousand deltas.
    objects.retain(|(_, b)| b.len() < 64 << 10);
    fuzz_objects("gbr-objects", objects);
}

#[test]
fn fuzz_bbolt_files() {
    use etcd_warden::format::bolt::{BoltFile, BucketValue};
    // etcd's own databases: the GBR fixtures' full snapshots, decompressed.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gbr/store/gzip/v2");
    let mut seeds = Vec::new();
    for e in std::fs::read_dir(&fixtures).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("Full-") {
            let mut db = Vec::new();
            let mut gz = flate2::read::GzDecoder::new(std::fs::File::open(e.path()).unwrap());
            std::io::Read::read_to_end(&mut gz, &mut db).unwrap();
            // etcd's snapshot stream ends with the db's sha256.
            db.truncate(db.len() - 32);
            seeds.push(db);
        }
    }
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("db");
    // The key check's reading front to back (`kube::needs`) takes etcd's own files as they are.
    for seed in &seeds {
        std::fs::write(&path, seed).unwrap();
        etcd_warden::kube::needs::needed_in_file(&path).unwrap();
    }
    fuzz("bbolt-files", &seeds, |input| {
        std::fs::write(&path, input).unwrap();
        let Ok(db) = BoltFile::open(&path) else { return };
        let Ok(items) = db.root_items() else { return };
        for (_, _, value) in items {
            if let Ok(b) = BucketValue::parse(&value) {
                let _ = db.visit_bucket(&b, |_, _| {});
                let _ = db.visit_bucket_from(&b, &[0, 0, 0, 0, 0, 0, 0, 2], |_, _| {});
            }
        }
        drop(db);
        // A catch-up's reading of a data dir's newest revisions (`restore::catchup`).
        let _ = etcd_warden::format::mvcc::revisions_after(&path, 1, |_| {});
        let _ = etcd_warden::kube::needs::needed_in_file(&path);
    });
}

/// A member's WAL as the catch-up and the 3.7 upgrade check read it (`format::wal`): files of the
/// data dir, so hostile too. Seeds built frame by frame as etcd's `storage/wal` writes them.
#[test]
fn fuzz_wal_files() {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn field(out: &mut Vec<u8>, n: u64, bytes: &[u8]) {
        varint(out, n << 3 | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    fn frame(out: &mut Vec<u8>, kind: u64, data: &[u8]) {
        let mut rec = Vec::new();
        varint(&mut rec, 1 << 3);
        varint(&mut rec, kind);
        field(&mut rec, 3, data);
        let pad = (8 - rec.len() % 8) % 8;
        let len = rec.len() as u64 | if pad > 0 { (0x80 | pad as u64) << 56 } else { 0 };
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&rec);
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    let entry = |index: u64, payload: &[u8]| {
        let mut e = Vec::new();
        varint(&mut e, 2 << 3);
        varint(&mut e, 2);
        varint(&mut e, 3 << 3);
        varint(&mut e, index);
        field(&mut e, 4, payload);
        e
    };
    let mut wal = Vec::new();
    let mut snap = Vec::new();
    varint(&mut snap, 1 << 3);
    varint(&mut snap, 3);
    frame(&mut wal, 5, &snap);
    for i in 1..6 {
        frame(&mut wal, 2, &entry(i, b"\x08\x05\xa2\x06\x02\x08\x01"));
    }
    frame(&mut wal, 2, &entry(4, b"\x08\x07"));
    let seed = etcd_warden::format::wal::replay;
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("0000000000000000-0000000000000000.wal");
    std::fs::write(&file, &wal).unwrap();
    let read = seed(scratch.path()).expect("the seed reads");
    assert_eq!(
        (read.snapshot_index, read.last_index, read.entries),
        (3, 4, 1),
        "a snapshot at 3, entries 1..5, then 4 again replacing 4 and 5"
    );
    fuzz("wal-files", &[wal], |input| {
        std::fs::write(&file, input).unwrap();
        let _ = seed(scratch.path());
    });
}

//! The gate by construction (issue 54): generated hostile listings around a genuine chain, on a
//! real file store, decided by what the start-up and every restore decide from
//! (`Store::screened_catalog`, then `restore::plan`). The invariants, for every case:
//!
//! - a genuine object is never refused (a healthy chain is never "bad");
//! - the newest candidate reaches at least the genuine newest revision (a restore never falls
//!   short of the newest verified chain), and in a signed store exactly it (nothing planted
//!   passes, so nothing planted can make a data dir "behind");
//! - the newest revision a bump must clear is at most the verified newest (signed) and never near
//!   i64::MAX (any store);
//! - time stays bounded whatever the case plants.
//!
//! `GATE_PROPERTY_CASES` sets the number of cases (CI: the default; bench/gate.sh: many).
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use etcd_warden::restore::plan::{self, Target};
use etcd_warden::store::format::{Footer, Header, ObjectWriter};
use etcd_warden::store::gate::MAX_REVISION;
use etcd_warden::store::layout::{Compression, Encryption, Kind, Layout, SnapshotName};
use etcd_warden::store::sign::Signing;
use etcd_warden::store::{Store, StoreUrl};

/// splitmix64: a seeded generator, so a failing case is replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn revision(&mut self, near: i64) -> i64 {
        match self.below(5) {
            0 => i64::MAX - self.below(2_000_000_000) as i64,
            1 => MAX_REVISION - 2 + self.below(4) as i64,
            2 => self.below(i64::MAX as u64) as i64,
            _ => near + 1 + self.below(1000) as i64,
        }
    }
}

const T0: u64 = 1_765_000_000_000;

fn full(revision: i64, created_ms: u64) -> SnapshotName {
    SnapshotName {
        kind: Kind::Full {
            revision,
            is_final: false,
        },
        created_ms,
        compression: Compression::None,
        encryption: Encryption::Plain,
        layout: Layout::Warden,
    }
}

fn delta(base: &SnapshotName, first: i64, last: i64, created_ms: u64) -> SnapshotName {
    SnapshotName {
        kind: Kind::Delta {
            base: base.last_revision(),
            base_created_ms: Some(base.created_ms),
            first,
            last,
        },
        created_ms,
        ..*base
    }
}

fn header_for(n: &SnapshotName) -> Header {
    let created =
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(n.created_ms))
            .to_string();
    let (kind, revision, base, base_created, first, last) = match n.kind {
        Kind::Full { revision, .. } => ("full", Some(revision), None, None, None, None),
        Kind::Delta {
            base,
            base_created_ms,
            first,
            last,
        } => (
            "delta",
            None,
            Some(base),
            base_created_ms.map(|ms| {
                humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms))
                    .to_string()
            }),
            Some(first),
            Some(last),
        ),
    };
    Header {
        format: 1,
        kind: kind.into(),
        revision,
        base,
        base_created,
        first,
        last,
        created,
        compression: n.compression,
        encryption: n.encryption,
        is_final: false,
        cluster_id: 1,
        member_id: 1,
        raft_term: None,
        etcd_version: "3.6.16".into(),
        writer: "property".into(),
        outside: None,
        rollback_for: None,
    }
}

/// Writes `n` through the warden's own writer with `signing`: a genuine object (its payload is no
/// database: the gate reads heads, and the full read's checks have tests of their own).
async fn write(store: &Store, n: &SnapshotName, signing: &Signing, payload: &[u8]) {
    let mut w = ObjectWriter::begin(store.inner.clone(), &n.key(), &header_for(n), signing)
        .await
        .unwrap();
    w.payload(payload).await.unwrap();
    let (revisions, events) = match n.kind {
        Kind::Delta { first, last, .. } => (Some((last - first + 1) as u64), Some(1)),
        Kind::Full { .. } => (None, None),
    };
    w.finish(&Footer {
        raw_bytes: payload.len() as u64,
        revisions,
        events,
        ..Default::default()
    })
    .await
    .unwrap();
}

fn put(root: &std::path::Path, key: &str, bytes: &[u8]) {
    let p = root.join(key);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

/// One case: a genuine chain, then what `rng` plants around it; the invariants checked.
async fn case(seed: u64, signed: bool, keys: &(Signing, Signing)) {
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&StoreUrl::File { path: root.clone() }).unwrap();
    let (mine, foreign) = keys;
    let signing = if signed { mine.clone() } else { Signing::default() };
    let store = store.with_keys(etcd_warden::store::crypt::Keys {
        signing: signing.clone(),
        ..Default::default()
    });
    // The genuine chain: a full at `base`, deltas of 1-5 revisions each after it.
    let base = 2 + rng.below(1000) as i64;
    let f = full(base, T0);
    write(&store, &f, &signing, b"genuine full").await;
    let mut genuine = vec![f];
    let mut next = base + 1;
    for i in 0..rng.below(8) {
        let last = next + rng.below(5) as i64;
        let d = delta(&f, next, last, T0 + 1000 * (i + 1));
        write(&store, &d, &signing, b"genuine delta").await;
        genuine.push(d);
        next = last + 1;
    }
    let newest = next - 1;
    // What is planted: junk, framed claims, renamed and truncated copies, another key's objects,
    // names that are no snapshot, and many empty newer fulls.
    let source = root.join(genuine.last().unwrap().key());
    let genuine_bytes = std::fs::read(&source).unwrap();
    let mut planted = 0u64;
    for i in 0..rng.below(12) {
        let created = T0 + 10_000_000 + i * 7;
        let rev = rng.revision(newest);
        let name = match rng.below(3) {
            0 => full(rev, created),
            _ => delta(&f, newest + 1, rev.max(newest + 1), created),
        };
        planted += 1;
        match rng.below(6) {
            0 => {
                let len = rng.below(300) as usize;
                let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                put(&root, &name.key(), &junk);
            }
            1 => {
                let header = serde_json::to_value(header_for(&name)).unwrap();
                let claim = rng.next() >> rng.below(64);
                let bytes = common::objects::framed(
                    &header,
                    b"x",
                    &serde_json::json!({"raw_bytes": claim, "revisions": 1, "events": 1}),
                );
                put(&root, &name.key(), &bytes);
            }
            2 => put(&root, &name.key(), &genuine_bytes),
            3 => {
                let cut = rng.below(genuine_bytes.len() as u64) as usize;
                put(&root, &name.key(), &genuine_bytes[..cut]);
            }
            4 => {
                // Well formed and signed, by a key this store does not trust.
                let other = store.clone().with_keys(etcd_warden::store::crypt::Keys {
                    signing: foreign.clone(),
                    ..Default::default()
                });
                if name.last_revision() <= MAX_REVISION {
                    write(&other, &name, foreign, b"foreign").await;
                } else {
                    put(&root, &name.key(), b"");
                }
            }
            _ => {
                planted -= 1;
                let key = format!("v1/full/full-{}-odd.ews", rng.next());
                put(&root, &key, b"");
            }
        }
    }
    let empties = if rng.below(4) == 0 { 2000 } else { 0 };
    for i in 0..empties {
        put(&root, &full(newest + 1 + i, T0 + 20_000_000).key(), b"");
    }

    let started = Instant::now();
    let screened = store.screened_catalog().await.unwrap();
    let took = started.elapsed();
    let why = format!("seed {seed:#x} signed={signed}: {:?}", screened.rejected);
    for g in &genuine {
        let kept = match g.kind {
            Kind::Full { .. } => screened.fulls.contains(g),
            Kind::Delta { .. } => screened.chains.values().flatten().any(|d| d == g),
        };
        assert!(kept, "the genuine {} was refused: {why}", g.key());
    }
    let cands = plan::candidates(
        &screened.fulls,
        &|c| screened.chains.get(&c).cloned().unwrap_or_default(),
        Target::Latest,
    );
    let reach = cands.first().map(|c| c.target_revision).unwrap_or(0);
    let named = plan::newest_named(&screened.fulls, &screened.chains);
    assert!(
        reach >= newest,
        "the newest candidate reaches {reach}, short of {newest}: {why}"
    );
    assert!(named <= MAX_REVISION, "a bump would clear {named}: {why}");
    if signed {
        assert_eq!(reach, newest, "a planted object passed: {why}");
        assert_eq!(named, newest, "a planted object moves the bump: {why}");
        assert!(screened.rejected.count >= planted + empties as u64, "{why}");
    }
    assert!(took < Duration::from_secs(30), "screening took {took:?}: {why}");
}

#[test]
fn no_planted_listing_moves_a_decision_past_what_verified() {
    let cases: u64 = std::env::var("GATE_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed0: u64 = std::env::var("GATE_PROPERTY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let dir = tempfile::tempdir().unwrap();
    let (mine, _) = common::objects::ed25519(dir.path(), "mine");
    let (theirs, _) = common::objects::ed25519(dir.path(), "theirs");
    let load = |p: &str| Signing::load(Some(std::path::Path::new(p)), &[], &[]).unwrap();
    let keys = (load(&mine), load(&theirs));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    for i in 0..cases {
        let seed = seed0.wrapping_add(i.wrapping_mul(0x9e37_79b9));
        rt.block_on(case(seed, i % 2 == 0, &keys));
    }
    eprintln!("{cases} cases in {:.1}s", started.elapsed().as_secs_f64());
}

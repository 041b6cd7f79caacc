//! The snapshot object format on real stores (local files and moto's S3): a stream without etcd's
//! trailer, or one that fails midway, never becomes a visible object; a good one does and verifies.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;

use common::stores::*;
use common::unique_ip;
use etcd_warden::snapshot::full::{SnapshotError, upload_stream};
use etcd_warden::snapshot::verify::verify_object;
use etcd_warden::store::format::{Footer, Header};
use etcd_warden::store::layout::{Compression, Encryption, Kind, SnapshotName};
use etcd_warden::store::{Store, StoreUrl};
use futures_util::stream;
use object_store::ObjectStoreExt as _;
use sha2::{Digest, Sha256};

fn header(rev: i64) -> Header {
    Header {
        format: 1,
        kind: "full".into(),
        revision: Some(rev),
        base: None,
        base_created: None,
        first: None,
        last: None,
        // What the object's name says, as every reader checks.
        created: humantime::format_rfc3339_millis(name(rev).created()).to_string(),
        compression: Compression::Zstd,
        encryption: Encryption::Plain,
        is_final: false,
        cluster_id: 1,
        member_id: 2,
        etcd_version: "3.5.1".into(),
        writer: "test".into(),
        outside: None,
        rollback_for: None,
        raft_term: None,
    }
}

fn name(rev: i64) -> SnapshotName {
    SnapshotName {
        kind: Kind::Full {
            revision: rev,
            is_final: false,
        },
        created_ms: 1_795_900_000_000 + rev as u64,
        compression: Compression::Zstd,
        encryption: Encryption::Plain,
        layout: etcd_warden::store::layout::Layout::Warden,
    }
}

/// 20 MiB of JSON-ish data that compresses about 2×, as etcd's stream would send it.
fn db() -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut v = Vec::with_capacity(20 << 20);
    while v.len() < 20 << 20 {
        v.extend_from_slice(b"{\"metadata\":{\"name\":\"pod-");
        for _ in 0..24 {
            v.push(b'a' + rng.u8(..26));
        }
        v.extend_from_slice(b"\",\"labels\":{\"app\":\"web\"}},\"spec\":{}}");
    }
    v
}

fn chunks(data: &[u8]) -> Vec<Result<Vec<u8>, SnapshotError>> {
    data.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect()
}

fn exercise(store: &Store, rt: &tokio::runtime::Runtime) {
    let data = db();
    let mut good = data.clone();
    good.extend_from_slice(&Sha256::digest(&data));

    // No trailer: etcd died or the connection broke before the checksum message.
    let r = rt.block_on(upload_stream(
        store,
        &name(1).key(),
        &header(1),
        Compression::Zstd,
        stream::iter(chunks(&data)),
    ));
    assert!(
        matches!(r, Err(SnapshotError::Checksum { .. })),
        "truncated stream accepted: {:?}",
        r.err()
    );

    // A stream that fails midway.
    let mut failing = chunks(&good[..good.len() / 2]);
    failing.push(Err(SnapshotError::Compress(std::io::Error::other(
        "injected failure",
    ))));
    let r = rt.block_on(upload_stream(
        store,
        &name(2).key(),
        &header(2),
        Compression::Zstd,
        stream::iter(failing),
    ));
    assert!(r.is_err(), "failed stream accepted");

    // Corrupted in flight: one flipped byte.
    let mut bad = good.clone();
    bad[1000] ^= 1;
    let r = rt.block_on(upload_stream(
        store,
        &name(3).key(),
        &header(3),
        Compression::Zstd,
        stream::iter(chunks(&bad)),
    ));
    assert!(
        matches!(r, Err(SnapshotError::Checksum { .. })),
        "corrupted stream accepted"
    );

    let fulls = rt.block_on(store.list_fulls()).unwrap();
    assert!(fulls.is_empty(), "a broken upload became visible: {fulls:?}");

    // A good stream appears only after finish, and verifies.
    let (raw, sha, writer) = rt
        .block_on(upload_stream(
            store,
            &name(4).key(),
            &header(4),
            Compression::Zstd,
            stream::iter(chunks(&good)),
        ))
        .unwrap();
    assert_eq!(raw, good.len() as u64);
    assert!(
        rt.block_on(store.list_fulls()).unwrap().is_empty(),
        "visible before the upload completed"
    );
    let etcd_sha = hex::encode(Sha256::digest(&data));
    assert_eq!(
        sha, etcd_sha,
        "the stream's digest is not etcd's sha256 of the database"
    );
    let footer = Footer {
        raw_bytes: raw,
        etcd_sha256: Some(sha),
        ..Footer::default()
    };
    let size = rt.block_on(writer.finish(&footer)).unwrap();
    assert!(
        size < raw * 3 / 4,
        "zstd did not compress JSON-like data: {size} of {raw}"
    );
    let fulls = rt.block_on(store.list_fulls()).unwrap();
    assert_eq!(fulls.len(), 1);
    let v = rt.block_on(verify_object(store, &fulls[0].0)).unwrap();
    assert_eq!(v.footer.raw_bytes, raw);
    assert_eq!(v.footer.etcd_sha256.as_deref(), Some(etcd_sha.as_str()));

    // The object's bytes, read as docs/FORMAT.md defines them, without the product's parser.
    let bytes = rt
        .block_on(async { store.inner.get(&fulls[0].1.location).await.unwrap().bytes().await })
        .unwrap();
    assert_eq!(bytes.len() as u64, size, "stored size");
    assert_eq!(&bytes[..8], b"EWARDEN1", "magic");
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let header_len = u32_at(8);
    let header: serde_json::Value = serde_json::from_slice(&bytes[12..12 + header_len]).unwrap();
    assert_eq!(header["kind"], "full");
    assert_eq!(header["revision"], 4);
    let end = bytes.len();
    assert_eq!(&bytes[end - 8..], b"EWEND001", "end marker");
    let footer_len = u32_at(end - 52);
    let payload_len = u64::from_le_bytes(bytes[end - 48..end - 40].try_into().unwrap()) as usize;
    let payload_end = end - 52 - footer_len;
    assert_eq!(
        payload_len,
        payload_end - 12 - header_len,
        "payload length vs its position"
    );
    let payload = &bytes[12 + header_len..payload_end];
    assert_eq!(
        &bytes[end - 40..end - 8],
        Sha256::digest(payload).as_slice(),
        "trailer digest is not sha256 of the stored payload"
    );
    let stored_footer: serde_json::Value =
        serde_json::from_slice(&bytes[payload_end..payload_end + footer_len]).unwrap();
    assert_eq!(stored_footer["etcd_sha256"], etcd_sha.as_str());
    assert_eq!(stored_footer["raw_bytes"], good.len() as u64);
    assert_eq!(
        zstd::decode_all(payload).unwrap(),
        good,
        "the payload does not decompress to etcd's stream"
    );
}

fn no_stray_files(dir: &Path) {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    assert_eq!(files.len(), 1, "staging files left behind: {files:?}");
}

#[test]
fn file_store_never_shows_a_partial_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Store::open(&StoreUrl::File {
        path: dir.path().to_owned(),
    })
    .unwrap();
    exercise(&store, &rt);
    no_stray_files(dir.path());
}

#[test]
fn s3_store_never_shows_a_partial_snapshot() {
    let ip = unique_ip();
    let moto = moto(&ip, 5000);
    create_bucket(&moto.addr, "format-test");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("format-test")
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap();
    let store = std::sync::Arc::new(store);
    let store = Store {
        url: StoreUrl::S3 {
            bucket: "format-test".into(),
            prefix: String::new(),
        },
        inner: store.clone(),
        keys: Default::default(),
        gbr_lease_ttl: 3600,
        locks: None,
        pager: Some(etcd_warden::store::listing::Pager {
            store,
            prefix: String::new(),
        }),
    };
    exercise(&store, &rt);
}

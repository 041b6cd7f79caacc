//! The snapshot object format: self-verifying, streamable both ways.
//!
//!     "EWARDEN1" | u32 header_len | header JSON | payload (compressed) | footer JSON | trailer
//!     trailer (52 bytes) = u32 footer_len | u64 payload_len | sha256(payload) | "EWEND001"
//!
//! The header is known before the first payload byte; the digest and what is only known at the end
//! (sizes, etcd's own checksum, event counts) go in the footer and trailer. All integers are little
//! endian. An object is written through a multipart upload that is completed only after the trailer,
//! so it is never visible under its name half-written. docs/FORMAT.md is the reference.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::io::AsyncWriteExt;

use super::layout::{Compression, Encryption, Kind, Layout, SnapshotName};
use super::sign::Signing;

pub const MAGIC: &[u8; 8] = b"EWARDEN1";
pub const END_MAGIC: &[u8; 8] = b"EWEND001";
pub const TRAILER_LEN: usize = 52;
/// Upload part size: the most a snapshot upload buffers (times the concurrency).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
pub const UPLOAD_CONCURRENCY: usize = 2;
/// The most a header or a footer may be: every object this release writes has a few hundred bytes
/// of each; a longer claim (a trailer that says its footer is 4 GiB) is refused before it is read.
pub const MAX_META: u64 = 1 << 20;

/// Written before the payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    /// "full" or "delta".
    pub kind: String,
    /// Full: a proven lower bound of the revision the snapshot holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Delta: the chain's full snapshot revision, and the revisions covered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<i64>,
    /// Delta: the creation time (RFC 3339) of the chain's full snapshot, which with `base` names
    /// the exact full the delta extends (absent in objects written before the chain identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<i64>,
    pub created: String,
    pub compression: Compression,
    pub encryption: Encryption,
    #[serde(default)]
    pub is_final: bool,
    #[serde(default)]
    pub cluster_id: u64,
    #[serde(default)]
    pub member_id: u64,
    /// The raft term the writer wrote in (clusters; absent in older objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_term: Option<u64>,
    #[serde(default)]
    pub etcd_version: String,
    pub writer: String,
    /// Full: sha256 (hex) of etcd's membership and auth state when the snapshot began
    /// (`snapshot::outside`); a later difference makes the backup loop take a full soon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside: Option<String>,
    /// Rollback points (`v1/rollback/`): the etcd release that was about to start on the data when
    /// this snapshot of it was taken; `etcd_version` names the release that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_for: Option<String>,
}

/// Written after the payload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    /// Uncompressed payload bytes.
    pub raw_bytes: u64,
    /// Full: etcd's own sha256 of the database (the last 32 bytes of its snapshot stream), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_sha256: Option<String>,
    /// Full: the revision read after the stream ended (an upper bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_after: Option<i64>,
    /// Delta: number of revisions and events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// `ed25519:<key id>:<hex>` over the object (`store::sign`), always the last member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

#[derive(Debug, Error)]
pub enum FormatError {
    #[error("write {key}")]
    Write {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("read {key}")]
    Read {
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{key}: {reason}")]
    Corrupt { key: String, reason: String },
}

/// Streams one object into the store; nothing is visible until [`ObjectWriter::finish`].
pub struct ObjectWriter {
    key: String,
    out: BufWriter,
    hasher: Sha256,
    payload_len: u64,
    /// Magic, header length and header JSON.
    head_len: u64,
    header: Vec<u8>,
    signing: Signing,
}

impl ObjectWriter {
    /// `signing` signs the object when it holds a sign key (`store::sign`).
    pub async fn begin(
        store: Arc<dyn ObjectStore>,
        key: &str,
        header: &Header,
        signing: &Signing,
    ) -> Result<Self, FormatError> {
        let out = BufWriter::with_capacity(store, Path::from(key), PART_SIZE)
            .with_max_concurrency(UPLOAD_CONCURRENCY);
        let mut w = Self {
            key: key.to_owned(),
            out,
            hasher: Sha256::new(),
            payload_len: 0,
            head_len: 0,
            header: Vec::new(),
            signing: signing.clone(),
        };
        let json = serde_json::to_vec(header).expect("header serializes");
        let mut head = Vec::with_capacity(12 + json.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(json.len() as u32).to_le_bytes());
        head.extend_from_slice(&json);
        w.raw(&head).await?;
        w.head_len = head.len() as u64;
        w.header = json;
        Ok(w)
    }

    async fn raw(&mut self, b: &[u8]) -> Result<(), FormatError> {
        self.out.write_all(b).await.map_err(|source| FormatError::Write {
            key: self.key.clone(),
            source,
        })
    }

    /// Appends payload bytes (already compressed).
    pub async fn payload(&mut self, b: &[u8]) -> Result<(), FormatError> {
        if b.is_empty() {
            return Ok(());
        }
        self.hasher.update(b);
        self.payload_len += b.len() as u64;
        self.raw(b).await
    }

    /// Writes footer and trailer and completes the upload: only now does the object appear.
    /// Returns the object's total size.
    pub async fn finish(mut self, footer: &Footer) -> Result<u64, FormatError> {
        let unsigned = Footer {
            signature: None,
            ..footer.clone()
        };
        let json = serde_json::to_vec(&unsigned).expect("footer serializes");
        let digest: [u8; 32] = std::mem::take(&mut self.hasher).finalize().into();
        let json = self
            .signing
            .seal_object(&self.key, &self.header, self.payload_len, &digest, json);
        let mut tail = Vec::with_capacity(json.len() + TRAILER_LEN);
        tail.extend_from_slice(&json);
        tail.extend_from_slice(&(json.len() as u32).to_le_bytes());
        tail.extend_from_slice(&self.payload_len.to_le_bytes());
        tail.extend_from_slice(&digest);
        tail.extend_from_slice(END_MAGIC);
        self.raw(&tail).await?;
        self.out.shutdown().await.map_err(|source| FormatError::Write {
            key: self.key.clone(),
            source,
        })?;
        Ok(self.head_len + self.payload_len + json.len() as u64 + TRAILER_LEN as u64)
    }

    /// Abandons the upload: nothing becomes visible (multipart parts are discarded).
    pub async fn abort(mut self) {
        if let Err(err) = self.out.abort().await {
            tracing::debug!(key = %self.key, error = %err, "abort of an unfinished upload failed");
        }
    }
}

/// What reading an object end to end proved.
#[derive(Debug, Clone)]
pub struct Verified {
    pub header: Header,
    pub footer: Footer,
    pub size: u64,
    pub payload_len: u64,
}

/// The end of an object: its size, where the payload ends, the payload's length and digest, and
/// the footer. Two small reads.
struct Tail {
    size: u64,
    payload_end: u64,
    payload_len: u64,
    digest: [u8; 32],
    footer: Footer,
    footer_bytes: Bytes,
}

async fn read_tail(store: &dyn ObjectStore, key: &str) -> Result<Tail, FormatError> {
    let corrupt = |reason: String| FormatError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let read_err = |source| FormatError::Read {
        key: key.to_owned(),
        source,
    };
    let path = Path::from(key);
    let meta = store.head(&path).await.map_err(read_err)?;
    let size = meta.size;
    if size < (12 + TRAILER_LEN) as u64 {
        return Err(corrupt(format!("only {size} bytes")));
    }
    let trailer = store
        .get_range(&path, size - TRAILER_LEN as u64..size)
        .await
        .map_err(read_err)?;
    if &trailer[44..52] != END_MAGIC {
        return Err(corrupt("no end marker (incomplete object)".into()));
    }
    let footer_len = u32::from_le_bytes(trailer[0..4].try_into().expect("4 bytes")) as u64;
    let payload_len = u64::from_le_bytes(trailer[4..12].try_into().expect("8 bytes"));
    let digest: [u8; 32] = trailer[12..44].try_into().expect("32 bytes");
    if footer_len > MAX_META {
        return Err(corrupt(format!(
            "its trailer claims a footer of {footer_len} bytes (at most {MAX_META})"
        )));
    }
    let payload_end = size
        .checked_sub(TRAILER_LEN as u64 + footer_len)
        .ok_or_else(|| corrupt("footer longer than the object".into()))?;
    let footer_bytes = store
        .get_range(&path, payload_end..size - TRAILER_LEN as u64)
        .await
        .map_err(read_err)?;
    let footer: Footer = serde_json::from_slice(&footer_bytes)
        .map_err(|e| corrupt(format!("footer is not valid JSON: {e}")))?;

    Ok(Tail {
        size,
        payload_end,
        payload_len,
        digest,
        footer,
        footer_bytes,
    })
}

/// Whether `header` says what the object's key says: kind, revisions, chain, creation time,
/// compression, encryption and the final mark. The payload is decoded by the header, and readers
/// order and chain objects by their keys: a header that disagrees with its key (an object copied
/// to another name, a name edited to claim another encoding) makes the object corrupt. Keys of
/// other layouts, and keys that do not parse, are not this format's to check.
pub fn header_agrees(header: &Header, key: &str) -> Result<(), String> {
    let Ok(name) = SnapshotName::parse(key) else {
        return Ok(());
    };
    if matches!(name.layout, Layout::Gbr(_)) {
        return Ok(());
    }
    let ms = |t: &str| -> Option<u64> {
        let at = humantime::parse_rfc3339(t).ok()?;
        u64::try_from(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis()).ok()
    };
    let mut wrong = Vec::new();
    let (kind, revisions) = match name.kind {
        Kind::Full { revision, is_final } => {
            if header.is_final != is_final {
                wrong.push("the final mark");
            }
            ("full", header.revision == Some(revision))
        }
        Kind::Delta {
            base,
            base_created_ms,
            first,
            last,
        } => {
            let chain = match (base_created_ms, header.base_created.as_deref()) {
                (Some(want), Some(got)) => ms(got) == Some(want),
                // The older layout's key names no creation time; its header may.
                (None, _) => true,
                (Some(_), None) => false,
            };
            if !chain {
                wrong.push("the chain");
            }
            (
                "delta",
                header.base == Some(base) && header.first == Some(first) && header.last == Some(last),
            )
        }
    };
    if header.kind != kind {
        wrong.push("the kind");
    }
    if !revisions {
        wrong.push("the revisions");
    }
    if ms(&header.created) != Some(name.created_ms) {
        wrong.push("the creation time");
    }
    if header.compression != name.compression {
        wrong.push("the compression");
    }
    if header.encryption != name.encryption {
        wrong.push("the encryption");
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "its header disagrees with its name on {} (an object copied or renamed)",
            wrong.join(", ")
        ))
    }
}

/// Reads only an object's header: two small range reads (four more, for the footer and trailer,
/// when `signing` requires signatures: the signature covers the payload's digest, so it is
/// checked without the payload, which a full read then checks against that digest).
pub async fn read_header(
    store: &dyn ObjectStore,
    key: &str,
    signing: &Signing,
) -> Result<Header, FormatError> {
    let corrupt = |reason: String| FormatError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let read_err = |source| FormatError::Read {
        key: key.to_owned(),
        source,
    };
    let path = Path::from(key);
    let head = store.get_range(&path, 0..12).await.map_err(read_err)?;
    if &head[0..8] != MAGIC {
        return Err(corrupt("no magic (not an etcd-warden object)".into()));
    }
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as u64;
    if len > MAX_META {
        return Err(corrupt(format!(
            "it claims a header of {len} bytes (at most {MAX_META})"
        )));
    }
    let bytes = store.get_range(&path, 12..12 + len).await.map_err(read_err)?;
    let header: Header =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("header is not valid JSON: {e}")))?;
    header_agrees(&header, key).map_err(corrupt)?;
    if signing.verifies() {
        let tail = read_tail(store, key).await?;
        signing
            .open_object(key, &bytes, tail.payload_len, &tail.digest, &tail.footer_bytes)
            .map_err(corrupt)?;
    }
    Ok(header)
}

/// Reads an object from start to end, handing each payload chunk to `sink`, and checks framing
/// and digest. `sink` sees every payload byte exactly once, in order, before the digest is checked:
/// callers must not trust what they got until this returns `Ok`.
/// Bytes read from a local file per step: object_store's own stream of a file reads 8 KiB per
/// blocking task, and for a 100 MiB object the 12 800 hand-offs between threads cost more than
/// the reading.
const FILE_CHUNK: usize = 1 << 20;

/// An object's bytes as a stream. A local file (the `file://` store) is read in `FILE_CHUNK`
/// pieces on one blocking thread, a few pieces ahead of the reader; other stores' streams pass
/// through.
pub(crate) fn byte_stream(
    result: object_store::GetResult,
) -> futures_util::stream::BoxStream<'static, object_store::Result<Bytes>> {
    let object_store::GetResultPayload::File(mut file, path) = result.payload else {
        return result.into_stream();
    };
    let range = result.range;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Seek};
        let fail = |e: std::io::Error| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: format!("read {}: {e}", path.display()).into(),
        };
        if let Err(e) = file.seek(std::io::SeekFrom::Start(range.start)) {
            let _ = tx.blocking_send(Err(fail(e)));
            return;
        }
        let mut left = range.end - range.start;
        while left > 0 {
            let mut buf = vec![0; left.min(FILE_CHUNK as u64) as usize];
            let piece = file
                .read_exact(&mut buf)
                .map(|()| Bytes::from(buf))
                .map_err(&fail);
            let failed = piece.is_err();
            left -= piece.as_ref().map_or(0, |b| b.len() as u64);
            // A send fails when the reader stopped (a check failed): nothing more to read.
            if tx.blocking_send(piece).is_err() || failed {
                return;
            }
        }
    });
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|piece| (piece, rx)) },
    )
    .boxed()
}

/// `signing` checks the object's signature (`store::sign`) before the first payload byte reaches
/// `sink`, which also gets the footer: its claims bound what the payload may decode to, and are
/// believed no further than that until this returns `Ok`.
pub async fn read_object<F>(
    store: &dyn ObjectStore,
    key: &str,
    signing: &Signing,
    mut sink: F,
) -> Result<Verified, FormatError>
where
    F: FnMut(&Header, &Footer, &[u8]) -> Result<(), String>,
{
    let corrupt = |reason: String| FormatError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let read_err = |source| FormatError::Read {
        key: key.to_owned(),
        source,
    };
    let path = Path::from(key);
    let Tail {
        size,
        payload_end,
        payload_len,
        digest,
        footer,
        footer_bytes,
    } = read_tail(store, key).await?;
    let result = store
        .get_opts(
            &path,
            object_store::GetOptions {
                range: Some((0..payload_end).into()),
                ..Default::default()
            },
        )
        .await
        .map_err(read_err)?;
    let mut stream = byte_stream(result);
    let mut prefix: Vec<u8> = Vec::new();
    let mut header: Option<(Header, u64)> = None; // header and payload start offset
    let mut pos: u64 = 0;
    let mut hasher = Sha256::new();
    while let Some(chunk) = stream.next().await {
        let chunk: Bytes = chunk.map_err(read_err)?;
        let mut data: &[u8] = &chunk;
        if header.is_none() {
            prefix.extend_from_slice(data);
            if prefix.len() < 12 {
                pos += data.len() as u64;
                continue;
            }
            if &prefix[0..8] != MAGIC {
                return Err(corrupt("not an etcd-warden snapshot (bad magic)".into()));
            }
            let hlen = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes")) as usize;
            if hlen as u64 > MAX_META {
                return Err(corrupt(format!(
                    "it claims a header of {hlen} bytes (at most {MAX_META})"
                )));
            }
            if prefix.len() < 12 + hlen {
                pos += data.len() as u64;
                continue;
            }
            let h: Header = serde_json::from_slice(&prefix[12..12 + hlen])
                .map_err(|e| corrupt(format!("header is not valid JSON: {e}")))?;
            header_agrees(&h, key).map_err(corrupt)?;
            signing
                .open_object(key, &prefix[12..12 + hlen], payload_len, &digest, &footer_bytes)
                .map_err(corrupt)?;
            let start = (12 + hlen) as u64;
            let consumed_before = pos;
            pos += data.len() as u64;
            let skip = (start - consumed_before) as usize;
            data = &data[skip.min(data.len())..];
            header = Some((h, start));
            prefix = Vec::new();
            if data.is_empty() {
                continue;
            }
            hasher.update(data);
            let (h, _) = header.as_ref().expect("set above");
            sink(h, &footer, data).map_err(corrupt)?;
            continue;
        }
        pos += data.len() as u64;
        hasher.update(data);
        let (h, _) = header.as_ref().expect("set above");
        sink(h, &footer, data).map_err(corrupt)?;
    }
    let (header, start) = header.ok_or_else(|| corrupt("object ends inside its header".into()))?;
    if pos != payload_end {
        return Err(corrupt(format!("read {pos} bytes, expected {payload_end}")));
    }
    if payload_end - start != payload_len {
        return Err(corrupt(format!(
            "payload is {} bytes, trailer says {payload_len}",
            payload_end - start
        )));
    }
    if hasher.finalize().as_slice() != digest {
        return Err(corrupt("payload digest mismatch".into()));
    }
    Ok(Verified {
        header,
        footer,
        size,
        payload_len,
    })
}

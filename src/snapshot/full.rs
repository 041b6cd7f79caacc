//! Full snapshots: etcd's Maintenance.Snapshot stream → etcd's own sha256 check → compression →
//! multipart upload, all streaming. Memory holds one etcd message, the codec's window and at most
//! `UPLOAD_CONCURRENCY` upload parts, whatever the database size; no temp file.
//!
//! The upload is completed only when etcd's trailer checks out; otherwise it is aborted and nothing
//! becomes visible. The revision in the name is read *before* the stream starts: etcd commits its
//! pending batch before it opens the snapshot's read transaction, so the snapshot holds at least that
//! revision (a proven lower bound, never a claim of more than it holds). The delta chain starts right
//! after it and may overlap the snapshot; restore skips events the snapshot already holds.

use std::time::{Duration, Instant};

use etcd_client::Client;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::compress::Packer;
use crate::store::Store;
use crate::store::format::{Footer, FormatError, Header, ObjectWriter};
use crate::store::layout::{self, Compression, Kind, SnapshotName};

#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("{what} from etcd")]
    Etcd {
        what: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    #[error(
        "etcd's snapshot stream failed its checksum after {bytes} bytes (truncated or corrupt); upload aborted"
    )]
    Checksum { bytes: u64 },
    #[error("compress the snapshot")]
    Compress(#[source] std::io::Error),
    #[error("read the data dir's db")]
    ReadDb(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] FormatError),
}

impl SnapshotError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Etcd { .. } => "etcd",
            Self::Checksum { .. } => "checksum",
            Self::Compress(_) => "compress",
            Self::ReadDb(_) => "local",
            Self::Store(FormatError::Write { .. }) | Self::Store(FormatError::Read { .. }) => "store",
            Self::Store(FormatError::Corrupt { .. }) => "corrupt",
        }
    }
}

#[derive(Debug, Clone)]
pub struct FullResult {
    pub name: SnapshotName,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub duration: Duration,
    pub revision_after: i64,
}

/// Checks etcd's trailer: the last 32 bytes of the stream are the sha256 of everything before.
#[derive(Default)]
pub struct TrailerCheck {
    hasher: Sha256,
    tail: Vec<u8>,
    total: u64,
}

impl TrailerCheck {
    pub fn update(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if data.len() >= 32 {
            self.hasher.update(&self.tail);
            self.hasher.update(&data[..data.len() - 32]);
            self.tail.clear();
            self.tail.extend_from_slice(&data[data.len() - 32..]);
        } else {
            self.tail.extend_from_slice(data);
            if self.tail.len() > 32 {
                let extra = self.tail.len() - 32;
                self.hasher.update(&self.tail[..extra]);
                self.tail.drain(..extra);
            }
        }
    }

    /// The database's sha256 (hex) if the trailer matches.
    pub fn verify(self) -> Option<String> {
        if self.tail.len() != 32 {
            return None;
        }
        let digest = self.hasher.finalize();
        (digest.as_slice() == self.tail.as_slice()).then(|| hex::encode(digest))
    }
}

fn etcd(what: &'static str) -> impl FnOnce(etcd_client::Error) -> SnapshotError {
    move |source| SnapshotError::Etcd { what, source }
}

/// What a full is beyond a plain one.
#[derive(Debug, Default)]
pub struct FullOptions {
    /// The final full, taken after etcd was killed (`crate::ownership::fence`).
    pub is_final: bool,
    /// etcd's membership and auth state, as `outside::fingerprint` read it.
    pub outside: Option<String>,
    /// It is the rollback point before that release starts (`crate::upgrade::rollback`), under
    /// `v1/rollback/` (`crate::store::rollback`).
    pub rollback_for: Option<crate::etcd::version::Version>,
    /// Gets every byte of etcd's stream as it passes, trailer included (the key check's
    /// `kube::needs::Tap`); dropped when its reader stops taking them.
    pub tap: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
}

/// How long the stream waits for a tap to take a message: long enough for a write of its
/// temporary file held up by the disk's writeback (the store may be on the same disk), short
/// beside a full.
const TAP_WAIT: Duration = Duration::from_secs(5);

/// Takes one full snapshot of the etcd behind `client` into `store`.
pub async fn take_full(
    client: &mut Client,
    store: &Store,
    compression: Compression,
    opts: FullOptions,
    progress: &crate::telemetry::Progress,
) -> Result<FullResult, SnapshotError> {
    let FullOptions {
        is_final,
        outside,
        rollback_for,
        mut tap,
    } = opts;
    let started = Instant::now();
    let status = client.status().await.map_err(etcd("read the revision"))?;
    let hdr = status.header().cloned();
    let revision = hdr.as_ref().map(|h| h.revision()).unwrap_or(0);
    let name = SnapshotName {
        kind: Kind::Full { revision, is_final },
        created_ms: layout::now_ms(),
        compression,
        encryption: store.encryption(),
        layout: match rollback_for {
            Some(_) => layout::Layout::Rollback,
            None => layout::Layout::Warden,
        },
    };
    let header = Header {
        format: 1,
        kind: "full".into(),
        revision: Some(revision),
        base: None,
        base_created: None,
        first: None,
        last: None,
        created: humantime::format_rfc3339_millis(name.created()).to_string(),
        compression,
        encryption: store.encryption(),
        is_final,
        cluster_id: hdr.as_ref().map(|h| h.cluster_id()).unwrap_or(0),
        member_id: hdr.as_ref().map(|h| h.member_id()).unwrap_or(0),
        raft_term: hdr.as_ref().map(|h| h.raft_term()),
        etcd_version: status.version().to_owned(),
        writer: concat!("etcd-warden ", env!("CARGO_PKG_VERSION")).into(),
        outside,
        rollback_for: rollback_for.map(|v| v.to_string()),
    };
    let key = name.key();
    // Open etcd's stream first: if it cannot start, no upload is created at all.
    let mut stream = client
        .snapshot()
        .await
        .map_err(etcd("start the snapshot stream"))?;
    // Read etcd's stream on its own task so network reads overlap compression and upload; the
    // bounded channel keeps at most READ_AHEAD messages (etcd sends 32 KiB each) in memory.
    const READ_AHEAD: usize = 32;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, SnapshotError>>(READ_AHEAD);
    let reader = tokio::spawn(async move {
        let chunks = async_stream_of(&mut stream);
        let mut chunks = std::pin::pin!(chunks);
        while let Some(c) = futures_util::StreamExt::next(&mut chunks).await {
            // A tap that does not take a message within TAP_WAIT is let go (its check then reads
            // etcd): it never holds the full, nor etcd's read transaction, longer than that.
            if let (Some(t), Ok(b)) = (&tap, &c)
                && !matches!(
                    tokio::time::timeout(TAP_WAIT, t.send(b.clone())).await,
                    Ok(Ok(()))
                )
            {
                tap = None;
            }
            let failed = c.is_err();
            if tx.send(c).await.is_err() || failed {
                return;
            }
        }
    });
    // etcd streams its db file and then the 32-byte sha256 of it.
    let expected = status.db_size().max(0) as u64 + 32;
    let mut streamed = 0u64;
    let chunks = futures_util::StreamExt::inspect(
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)),
        move |c| {
            if let Ok(b) = c {
                streamed += b.len() as u64;
                progress.tick(|| {
                    format!(
                        "full snapshot at revision {revision}: {}",
                        crate::telemetry::rate_line(streamed, Some(expected), started.elapsed(), "B")
                    )
                });
            }
        },
    );
    let result = upload_stream(store, &key, &header, compression, chunks).await;
    if let Ok((raw, ..)) = &result {
        progress.update(format!(
            "full snapshot at revision {revision}: {}",
            crate::telemetry::rate_line(*raw, Some(expected), started.elapsed(), "B")
        ));
    }
    reader.abort();
    let (raw_bytes, sha, writer) = result?;
    let revision_after = client
        .status()
        .await
        .ok()
        .and_then(|s| s.header().map(|h| h.revision()))
        .unwrap_or(revision);
    let footer = Footer {
        raw_bytes,
        etcd_sha256: Some(sha),
        revision_after: Some(revision_after),
        revisions: None,
        events: None,
        signature: None,
    };
    crate::failpoint::pause("full-before-complete").await;
    let stored_bytes = writer.finish(&footer).await?;
    let duration = started.elapsed();
    tracing::info!(
        key = %key,
        revision,
        raw_bytes,
        stored_bytes,
        duration_ms = duration.as_millis() as u64,
        "full snapshot uploaded"
    );
    Ok(FullResult {
        name,
        raw_bytes,
        stored_bytes,
        duration,
        revision_after,
    })
}

/// Adapts etcd's snapshot stream to a stream of byte chunks.
fn async_stream_of(
    stream: &mut etcd_client::SnapshotStreaming,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, SnapshotError>> + '_ {
    futures_util::stream::unfold(stream, |s| async move {
        match s.message().await {
            Ok(Some(msg)) => Some((Ok(bytes::Bytes::from(msg.blob().to_vec())), s)),
            Ok(None) => None,
            Err(source) => Some((
                Err(SnapshotError::Etcd {
                    what: "read the snapshot stream",
                    source,
                }),
                s,
            )),
        }
    })
}

/// Streams an etcd snapshot (database bytes followed by their sha256) into a new object at `key`.
/// Returns the raw size, etcd's digest and the still-open writer: the caller adds the footer and
/// completes it. On any error, or when the trailer does not check out, the upload is aborted and
/// nothing becomes visible.
pub async fn upload_stream<S, B>(
    store: &Store,
    key: &str,
    header: &Header,
    compression: Compression,
    chunks: S,
) -> Result<(u64, String, ObjectWriter), SnapshotError>
where
    S: futures_util::Stream<Item = Result<B, SnapshotError>>,
    B: AsRef<[u8]>,
{
    use futures_util::StreamExt;
    let mut writer = ObjectWriter::begin(store.inner.clone(), key, header, &store.keys.signing).await?;
    let body = async {
        let mut comp = Packer::new(compression, &store.keys).map_err(SnapshotError::Compress)?;
        let mut check = TrailerCheck::default();
        let mut chunks = std::pin::pin!(chunks);
        while let Some(blob) = chunks.next().await {
            let blob = blob?;
            let blob = blob.as_ref();
            check.update(blob);
            comp.write(blob).map_err(SnapshotError::Compress)?;
            let out = comp.take();
            writer.payload(&out).await?;
        }
        let raw = check.total;
        let sha = check.verify().ok_or(SnapshotError::Checksum { bytes: raw })?;
        let out = comp.finish().map_err(SnapshotError::Compress)?;
        writer.payload(&out).await?;
        Ok::<_, SnapshotError>((raw, sha))
    }
    .await;
    match body {
        Ok((raw, sha)) => Ok((raw, sha, writer)),
        Err(err) => {
            writer.abort().await;
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_check_any_chunking() {
        let db: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut stream = db.clone();
        stream.extend_from_slice(&Sha256::digest(&db));
        for chunk in [1, 5, 31, 32, 33, 4096, stream.len()] {
            let mut c = TrailerCheck::default();
            for part in stream.chunks(chunk) {
                c.update(part);
            }
            assert_eq!(
                c.verify(),
                Some(hex::encode(Sha256::digest(&db))),
                "chunk {chunk}"
            );
        }
        let mut c = TrailerCheck::default();
        c.update(&stream[..stream.len() - 1]);
        assert_eq!(c.verify(), None, "truncated stream accepted");
        let mut c = TrailerCheck::default();
        c.update(&db);
        assert_eq!(c.verify(), None, "stream without trailer accepted");
    }
}

//! Delta snapshots: every event after the chain's full snapshot, grouped by revision, buffered up to
//! a size bound and uploaded as one self-verifying object per flush.
//!
//! The buffer enforces contiguity: each revision must be exactly the previous one + 1 (every etcd
//! revision is a write, so a watch over all keys sees each one). Anything else is a gap, and a gap
//! ends the chain: the caller takes a full snapshot instead of writing a delta that lies.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::compress::Packer;
use super::full::SnapshotError;
use crate::format::delta_codec::{self, Lease, Revision};
use crate::store::Store;
use crate::store::format::{Footer, Header, ObjectWriter};
use crate::store::layout::{self, ChainId, Compression, Kind, SnapshotName};

#[derive(Debug, Error, PartialEq, Eq)]
#[error("revision {got} does not follow {last} (a gap in the watch)")]
pub struct GapError {
    pub last: i64,
    pub got: i64,
}

/// How much a delta buffer grows by at most at once.
const GROWTH: usize = 4 << 20;

/// Events waiting to be uploaded.
#[derive(Debug)]
pub struct DeltaBuffer {
    chain: ChainId,
    base: i64,
    /// The last revision appended (or the revision the buffer starts after).
    last: i64,
    first: Option<i64>,
    bytes: Vec<u8>,
    revisions: u64,
    events: u64,
    leases: HashSet<i64>,
    /// The lease set this chain last recorded (`None`: none yet since the buffer was made).
    lease_set: Option<Vec<Lease>>,
}

/// A flushed buffer, ready to upload.
#[derive(Debug)]
pub struct PendingDelta {
    pub chain: ChainId,
    pub base: i64,
    pub first: i64,
    pub last: i64,
    pub raw: Vec<u8>,
    pub revisions: u64,
    pub events: u64,
}

impl DeltaBuffer {
    /// A buffer for `chain` whose next revision is `after + 1`.
    pub fn new(chain: ChainId, after: i64) -> Self {
        let base = chain.base;
        Self {
            chain,
            base,
            last: after.max(base),
            first: None,
            bytes: Vec::new(),
            revisions: 0,
            events: 0,
            leases: HashSet::new(),
            lease_set: None,
        }
    }

    pub fn base(&self) -> i64 {
        self.base
    }
    pub fn chain(&self) -> ChainId {
        self.chain
    }
    /// The last revision seen (buffered or already uploaded).
    pub fn last(&self) -> i64 {
        self.last
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }
    pub fn pending_events(&self) -> u64 {
        self.events
    }

    /// Whether the delta still has to record this lease's TTL.
    pub fn needs_lease(&self, id: i64) -> bool {
        id != 0 && !self.leases.contains(&id)
    }

    pub fn push_lease(&mut self, lease: Lease) {
        if self.leases.insert(lease.id) {
            delta_codec::encode_lease(&lease, &mut self.bytes);
            // A restore adds this lease: the next listing is recorded even if it equals the last
            // set, or a revocation before it (a set without the lease) would never reach the store.
            self.lease_set = None;
        }
    }

    /// Records `set` (sorted by ID: every lease etcd holds right after the last revision appended)
    /// unless it is the set the chain last recorded. Whether it was recorded.
    pub fn push_lease_set(&mut self, set: Vec<Lease>) -> bool {
        if self.lease_set.as_ref() == Some(&set) {
            return false;
        }
        delta_codec::encode_lease_set(&set, &mut self.bytes);
        self.lease_set = Some(set);
        true
    }

    /// Appends one revision. Revisions at or below the chain's base are already in the full snapshot
    /// and are skipped (returns `Ok(false)`).
    pub fn push(&mut self, rev: &Revision) -> Result<bool, GapError> {
        if rev.revision <= self.base || rev.revision <= self.last {
            if rev.revision <= self.base {
                return Ok(false);
            }
            return Err(GapError {
                last: self.last,
                got: rev.revision,
            });
        }
        if rev.revision != self.last + 1 {
            return Err(GapError {
                last: self.last,
                got: rev.revision,
            });
        }
        // Grown by at most GROWTH at a time (a large buffer's realloc moves pages, not bytes):
        // doubling would leave a buffer at its 32 MiB bound with 64 MiB reserved.
        let need = delta_codec::revision_len(rev);
        if self.bytes.capacity() - self.bytes.len() < need {
            let step = self.bytes.len().clamp(4096, GROWTH);
            self.bytes.reserve_exact(need.max(step));
        }
        delta_codec::encode_revision(rev, &mut self.bytes);
        self.first.get_or_insert(rev.revision);
        self.last = rev.revision;
        self.revisions += 1;
        self.events += rev.events.len() as u64;
        Ok(true)
    }

    /// Takes what is buffered, leaving an empty buffer that continues after the same revision.
    pub fn take(&mut self) -> Option<PendingDelta> {
        let first = self.first.take()?;
        let pending = PendingDelta {
            chain: self.chain,
            base: self.base,
            first,
            last: self.last,
            raw: std::mem::take(&mut self.bytes),
            revisions: std::mem::take(&mut self.revisions),
            events: std::mem::take(&mut self.events),
        };
        self.leases.clear();
        Some(pending)
    }

    /// Puts a failed upload back in front of what arrived since.
    pub fn restore(&mut self, p: PendingDelta) {
        let mut bytes = p.raw;
        bytes.reserve_exact(self.bytes.len());
        bytes.extend_from_slice(&self.bytes);
        self.bytes = bytes;
        self.first = Some(p.first);
        self.revisions += p.revisions;
        self.events += p.events;
    }
}

/// Who wrote a delta: the cluster, member and raft term it recorded the header with (0: unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writer {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
    /// The etcd release that served the revisions (empty when unknown).
    pub etcd_version: String,
}

#[derive(Debug, Clone)]
pub struct DeltaResult {
    pub name: SnapshotName,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub revisions: u64,
    pub events: u64,
    pub duration: Duration,
}

/// What a delta is compressed and written by.
const PIECE: usize = 1 << 20;

/// Compresses and uploads one delta.
pub async fn upload(
    store: &Store,
    p: &PendingDelta,
    compression: Compression,
    writer: Writer,
) -> Result<DeltaResult, SnapshotError> {
    let started = Instant::now();
    let name = SnapshotName {
        kind: Kind::Delta {
            base: p.base,
            base_created_ms: Some(p.chain.base_created_ms),
            first: p.first,
            last: p.last,
        },
        created_ms: layout::now_ms(),
        compression,
        encryption: store.encryption(),
        layout: layout::Layout::Warden,
    };
    let header = Header {
        format: 1,
        kind: "delta".into(),
        revision: None,
        base: Some(p.base),
        base_created: Some(
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + Duration::from_millis(p.chain.base_created_ms),
            )
            .to_string(),
        ),
        first: Some(p.first),
        last: Some(p.last),
        created: humantime::format_rfc3339_millis(name.created()).to_string(),
        compression,
        encryption: store.encryption(),
        is_final: false,
        cluster_id: writer.cluster_id,
        member_id: writer.member_id,
        raft_term: (writer.raft_term > 0).then_some(writer.raft_term),
        etcd_version: writer.etcd_version,
        writer: concat!("etcd-warden ", env!("CARGO_PKG_VERSION")).into(),
        outside: None,
        rollback_for: None,
    };
    let mut comp = Packer::new(compression, &store.keys).map_err(SnapshotError::Compress)?;
    let key = name.key();
    let mut w = ObjectWriter::begin(store.inner.clone(), &key, &header, &store.keys.signing).await?;
    // Compressed and written a piece at a time: the compressed delta is never held whole beside
    // the raw one (a buffer at its bound of 32 MiB would otherwise take another 10-30 MiB).
    let body = async {
        for piece in p.raw.chunks(PIECE) {
            comp.write(piece).map_err(SnapshotError::Compress)?;
            w.payload(&comp.take()).await?;
        }
        let rest = comp.finish().map_err(SnapshotError::Compress)?;
        w.payload(&rest).await?;
        Ok::<_, SnapshotError>(())
    }
    .await;
    if let Err(e) = body {
        w.abort().await;
        return Err(e);
    }
    let footer = Footer {
        raw_bytes: p.raw.len() as u64,
        etcd_sha256: None,
        revision_after: None,
        revisions: Some(p.revisions),
        events: Some(p.events),
        signature: None,
    };
    let stored_bytes = w.finish(&footer).await?;
    let duration = started.elapsed();
    tracing::info!(key = %key, first = p.first, last = p.last, events = p.events, stored_bytes, "delta snapshot uploaded");
    Ok(DeltaResult {
        name,
        raw_bytes: p.raw.len() as u64,
        stored_bytes,
        revisions: p.revisions,
        events: p.events,
        duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::delta_codec::{Event, EventType};

    fn rev(r: i64) -> Revision {
        Revision {
            revision: r,
            events: vec![Event {
                kind: EventType::Put,
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                lease: 0,
                create_revision: 2,
                version: r - 1,
            }],
        }
    }

    #[test]
    fn a_lease_record_makes_the_next_set_recorded_even_if_unchanged() {
        let mut b = DeltaBuffer::new(chain(1), 1);
        assert!(b.push_lease_set(vec![]));
        assert!(
            !b.push_lease_set(vec![]),
            "an unchanged set is not recorded twice"
        );
        b.push_lease(Lease {
            id: 7,
            granted_ttl: 60,
        });
        // Lease 7 was granted, used and revoked between two listings that both saw no lease.
        assert!(
            b.push_lease_set(vec![]),
            "the set after a lease record is recorded"
        );
    }

    fn chain(base: i64) -> ChainId {
        ChainId {
            base,
            base_created_ms: 1_795_969_800_123,
        }
    }

    #[test]
    fn contiguity_and_overlap_with_the_full() {
        let mut b = DeltaBuffer::new(chain(10), 8); // the watch started at 9, the full holds up to 10
        assert_eq!(b.push(&rev(9)), Ok(false), "in the full: skipped");
        assert_eq!(b.push(&rev(10)), Ok(false));
        assert_eq!(b.push(&rev(11)), Ok(true), "the first revision after the full");
        assert_eq!(
            b.push(&rev(11)),
            Err(GapError { last: 11, got: 11 }),
            "a repeat is an error"
        );
    }

    #[test]
    fn gap_is_an_error_and_take_resets() {
        let mut b = DeltaBuffer::new(chain(10), 10);
        assert_eq!(b.push(&rev(11)), Ok(true));
        assert_eq!(b.push(&rev(12)), Ok(true));
        assert_eq!(b.push(&rev(14)), Err(GapError { last: 12, got: 14 }));
        let p = b.take().unwrap();
        assert_eq!((p.base, p.first, p.last, p.revisions), (10, 11, 12, 2));
        assert!(b.is_empty());
        assert_eq!(b.push(&rev(13)), Ok(true));
        b.restore(p);
        let p = b.take().unwrap();
        assert_eq!((p.first, p.last, p.revisions), (11, 13, 3));
    }
}

//! The delta payload: every event of a contiguous revision range, grouped by revision, plus the
//! leases that the puts refer to. Pure encode/decode, so restore and verify read exactly what the
//! watcher wrote. Little-endian binary records (before compression):
//!
//!     revision record: 0x01 | i64 revision | u32 n | n × event
//!     event:           u8 type (0 put, 1 delete) | u32 key_len | key | u32 value_len | value
//!                      | i64 lease | i64 create_revision | i64 version
//!     lease record:    0x02 | i64 lease_id | i64 granted_ttl_seconds (-1: already gone when seen)
//!     lease set:       0x03 | u32 n | n × (i64 lease_id | i64 granted_ttl_seconds)
//!
//! A lease record precedes the first revision in the delta whose puts use that lease. A lease set
//! is every lease etcd held right after the revision it follows (the delta's first revision − 1
//! when it leads): grants with no key yet, and revocations, which no watch event shows. The writer
//! records one whenever the set it last recorded in the chain changed (`--delta-snapshot-period`).

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventType,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub lease: i64,
    pub create_revision: i64,
    pub version: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub revision: i64,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub granted_ttl: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Revision(Revision),
    Lease(Lease),
    /// Every live lease, by ID.
    LeaseSet(Vec<Lease>),
}

const TAG_REVISION: u8 = 1;
const TAG_LEASE: u8 = 2;
const TAG_LEASE_SET: u8 = 3;

/// A digest of one revision's events as the delta format encodes them: two deltas that overlap
/// (a handover between writers, a retried upload) must agree on it for every shared revision.
pub fn revision_digest(r: &Revision) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut buf = Vec::new();
    encode_revision(r, &mut buf);
    Sha256::digest(&buf).into()
}

/// How many bytes [`encode_revision`] writes for `r`.
pub fn revision_len(r: &Revision) -> usize {
    13 + r
        .events
        .iter()
        .map(|e| 1 + 4 + e.key.len() + 4 + e.value.len() + 24)
        .sum::<usize>()
}

pub fn encode_revision(r: &Revision, out: &mut Vec<u8>) {
    out.push(TAG_REVISION);
    out.extend_from_slice(&r.revision.to_le_bytes());
    out.extend_from_slice(&(r.events.len() as u32).to_le_bytes());
    for e in &r.events {
        out.push(match e.kind {
            EventType::Put => 0,
            EventType::Delete => 1,
        });
        out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.key);
        out.extend_from_slice(&(e.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.value);
        out.extend_from_slice(&e.lease.to_le_bytes());
        out.extend_from_slice(&e.create_revision.to_le_bytes());
        out.extend_from_slice(&e.version.to_le_bytes());
    }
}

pub fn encode_lease(l: &Lease, out: &mut Vec<u8>) {
    out.push(TAG_LEASE);
    out.extend_from_slice(&l.id.to_le_bytes());
    out.extend_from_slice(&l.granted_ttl.to_le_bytes());
}

pub fn encode_lease_set(leases: &[Lease], out: &mut Vec<u8>) {
    out.push(TAG_LEASE_SET);
    out.extend_from_slice(&(leases.len() as u32).to_le_bytes());
    for l in leases {
        out.extend_from_slice(&l.id.to_le_bytes());
        out.extend_from_slice(&l.granted_ttl.to_le_bytes());
    }
}

/// The encoded size of a revision record (for the size bound).
pub fn revision_size(r: &Revision) -> usize {
    13 + r
        .events
        .iter()
        .map(|e| 1 + 8 + e.key.len() + e.value.len() + 24)
        .sum::<usize>()
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("unknown record tag {tag:#x} at byte {offset}")]
    Tag { tag: u8, offset: u64 },
    #[error("unknown event type {kind} at byte {offset}")]
    EventType { kind: u8, offset: u64 },
    #[error(
        "a record at byte {offset} claims {claimed} bytes, over the {MAX_RECORD}-byte bound no revision of etcd's reaches"
    )]
    TooLarge { offset: u64, claimed: u64 },
    #[error("payload ends inside a record ({pending} bytes left over)")]
    Truncated { pending: usize },
}

/// The largest record a delta may hold: one revision's events, bounded before anything of it is
/// allocated or buffered. etcd refuses requests over its `--max-request-bytes` (1.5 MiB by
/// default; the warden's own replay allows 64 MiB), and a range delete's events carry keys only;
/// a claim past this is a damaged or forged delta, never a revision.
pub const MAX_RECORD: u64 = 256 << 20;

/// Push-style decoder: feed bytes in any chunking, take whole records out.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
    consumed: u64,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| u32::from_le_bytes(s.try_into().expect("4")))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8).map(|s| i64::from_le_bytes(s.try_into().expect("8")))
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes and returns every record completed by them.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Record>, DecodeError> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        let mut start = 0;
        loop {
            let mut c = Cursor {
                b: &self.buf[start..],
                pos: 0,
            };
            match parse_one(&mut c, self.consumed + start as u64)? {
                Some(r) => {
                    out.push(r);
                    start += c.pos;
                }
                None => break,
            }
        }
        self.buf.drain(..start);
        self.consumed += start as u64;
        Ok(out)
    }

    /// Checks that no partial record is left.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Truncated {
                pending: self.buf.len(),
            })
        }
    }
}

fn parse_one(c: &mut Cursor<'_>, offset: u64) -> Result<Option<Record>, DecodeError> {
    let Some(tag) = c.u8() else { return Ok(None) };
    match tag {
        TAG_LEASE => {
            let (Some(id), Some(granted_ttl)) = (c.i64(), c.i64()) else {
                return Ok(None);
            };
            Ok(Some(Record::Lease(Lease { id, granted_ttl })))
        }
        TAG_LEASE_SET => {
            let Some(n) = c.u32() else { return Ok(None) };
            let claimed = u64::from(n) * 16;
            if claimed > MAX_RECORD {
                return Err(DecodeError::TooLarge { offset, claimed });
            }
            if c.b.len() - c.pos < n as usize * 16 {
                return Ok(None);
            }
            let mut leases = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let (Some(id), Some(granted_ttl)) = (c.i64(), c.i64()) else {
                    return Ok(None);
                };
                leases.push(Lease { id, granted_ttl });
            }
            Ok(Some(Record::LeaseSet(leases)))
        }
        TAG_REVISION => {
            let (Some(revision), Some(n)) = (c.i64(), c.u32()) else {
                return Ok(None);
            };
            // Each event takes at least 33 bytes.
            let too_large = |claimed: u64| DecodeError::TooLarge { offset, claimed };
            if u64::from(n) * 33 > MAX_RECORD {
                return Err(too_large(u64::from(n) * 33));
            }
            let mut events = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                let Some(kind) = c.u8() else { return Ok(None) };
                let kind = match kind {
                    0 => EventType::Put,
                    1 => EventType::Delete,
                    k => return Err(DecodeError::EventType { kind: k, offset }),
                };
                let Some(klen) = c.u32() else { return Ok(None) };
                if c.pos as u64 + u64::from(klen) > MAX_RECORD {
                    return Err(too_large(c.pos as u64 + u64::from(klen)));
                }
                let Some(key) = c.take(klen as usize).map(<[u8]>::to_vec) else {
                    return Ok(None);
                };
                let Some(vlen) = c.u32() else { return Ok(None) };
                if c.pos as u64 + u64::from(vlen) > MAX_RECORD {
                    return Err(too_large(c.pos as u64 + u64::from(vlen)));
                }
                let Some(value) = c.take(vlen as usize).map(<[u8]>::to_vec) else {
                    return Ok(None);
                };
                let (Some(lease), Some(create_revision), Some(version)) = (c.i64(), c.i64(), c.i64()) else {
                    return Ok(None);
                };
                events.push(Event {
                    kind,
                    key,
                    value,
                    lease,
                    create_revision,
                    version,
                });
            }
            Ok(Some(Record::Revision(Revision { revision, events })))
        }
        tag => Err(DecodeError::Tag { tag, offset }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_past_the_bound_is_refused_before_its_bytes_arrive() {
        // One event claiming a 4 GiB value, in a 30-byte prefix: refused at once, nothing
        // buffered waiting for the rest.
        let mut b = vec![TAG_REVISION];
        b.extend_from_slice(&5i64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut d = Decoder::new();
        assert!(matches!(d.push(&b), Err(DecodeError::TooLarge { .. })));
        // A count of events no record could hold.
        let mut b = vec![TAG_REVISION];
        b.extend_from_slice(&5i64.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Decoder::new().push(&b),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_revisions_length_is_what_its_encoding_takes() {
        for r in sample() {
            if let Record::Revision(r) = r {
                let mut out = Vec::new();
                encode_revision(&r, &mut out);
                assert_eq!(revision_len(&r), out.len(), "revision {}", r.revision);
            }
        }
    }

    fn sample() -> Vec<Record> {
        let mut v = vec![Record::Lease(Lease {
            id: 7,
            granted_ttl: 30,
        })];
        for r in 10..60i64 {
            let events = (0..(r % 4))
                .map(|i| Event {
                    kind: if (r + i) % 5 == 0 {
                        EventType::Delete
                    } else {
                        EventType::Put
                    },
                    key: format!("/registry/pods/ns/p{r}-{i}").into_bytes(),
                    value: vec![b'x'; (r * 7 % 300) as usize],
                    lease: if i == 1 { 7 } else { 0 },
                    create_revision: r - i,
                    version: i + 1,
                })
                .collect();
            v.push(Record::Revision(Revision { revision: r, events }));
            if r % 20 == 0 {
                let set = (0..r % 3)
                    .map(|i| Lease {
                        id: 7 + i,
                        granted_ttl: 60,
                    })
                    .collect();
                v.push(Record::LeaseSet(set));
            }
        }
        v
    }

    #[test]
    fn round_trip_any_chunking() {
        let records = sample();
        let mut bytes = Vec::new();
        for r in &records {
            match r {
                Record::Revision(rev) => {
                    let before = bytes.len();
                    encode_revision(rev, &mut bytes);
                    assert_eq!(bytes.len() - before, revision_size(rev));
                }
                Record::Lease(l) => encode_lease(l, &mut bytes),
                Record::LeaseSet(set) => encode_lease_set(set, &mut bytes),
            }
        }
        for chunk in [1, 3, 17, 4096, bytes.len()] {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for c in bytes.chunks(chunk) {
                got.extend(d.push(c).unwrap());
            }
            d.finish().unwrap();
            assert_eq!(got, records, "chunk size {chunk}");
        }
    }

    #[test]
    fn truncation_and_garbage_are_errors() {
        let mut bytes = Vec::new();
        if let Record::Revision(r) = &sample()[3] {
            encode_revision(r, &mut bytes);
        }
        let mut d = Decoder::new();
        assert!(d.push(&bytes[..bytes.len() - 1]).unwrap().is_empty());
        assert!(matches!(d.finish(), Err(DecodeError::Truncated { .. })));
        let mut d = Decoder::new();
        assert!(matches!(d.push(&[9, 0, 0]), Err(DecodeError::Tag { tag: 9, .. })));
        // A lease set claiming more leases than any record may hold: refused before it is read.
        let mut d = Decoder::new();
        let claim = [&[TAG_LEASE_SET][..], &u32::MAX.to_le_bytes()].concat();
        assert!(matches!(d.push(&claim), Err(DecodeError::TooLarge { .. })));
    }
}

//! Reads a member's WAL (read only) for what etcd will replay at start: the index of its last
//! entry (a catch-up writes into the db only when etcd applied every entry,
//! `crate::restore::catchup`), and for the one thing an upgrade to 3.7 needs to know: whether
//! the entries etcd will replay (those after the WAL's last raft snapshot) include requests in
//! etcd 3.5's v2 format. etcd 3.6 still converts those (`v2ToV3Request`); 3.7 dropped
//! that path and panics on them ("unmarshal should never fail"). A cluster started on 3.5 writes
//! some (its first cluster version and member attributes), and they stay replayable until a raft
//! snapshot is taken after them (every `--snapshot-count` entries).
//!
//! The format, as etcd's `storage/wal` writes it: files `<seq>-<index>.wal` in name order, each a
//! sequence of frames: an 8-byte little-endian length (the low 56 bits; a set top bit puts the
//! padding size in bits 56..59), a `walpb.Record` {type 1, crc 2, data 3}, padding. A zero length
//! ends a file (preallocated space). Entry records (type 2) carry a `raftpb.Entry` {type 1,
//! term 2, index 3, data 4}; snapshot records (type 5) a `walpb.Snapshot` {index 1, term 2}.

use std::io::Read;
use std::path::Path;

use crate::format::proto::fields;

/// The largest record read (a sparse file's claim is refused before it is allocated).
const MAX_RECORD: u64 = 256 << 20;

const ENTRY: u64 = 2;
const SNAPSHOT: u64 = 5;

/// The fields of one protobuf message: (field number, wire type, varint value or bytes).
/// Whether an entry's data is one etcd 3.7 cannot parse as an `InternalRaftRequest` (a bare v2
/// `Request`, as 3.5 proposed some): every field of the internal request is a message but its ID
/// (1, a varint) and the removed v2 field (2, skipped by 3.7). A v2 request's Path (3) and Val (4)
/// are strings that do not parse as messages, and its booleans are varints.
fn is_v2_request(data: &[u8]) -> bool {
    let Some(f) = fields(data) else {
        return true;
    };
    !f.iter().all(|(num, wire, _, bytes)| match (num, wire) {
        (1, 0) => true,
        (1, _) => false,
        (2, _) => true,
        (_, 2) => fields(bytes).is_some(),
        _ => false,
    })
}

/// What the WAL holds after its last raft snapshot.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// The index of the newest snapshot record (0: none).
    pub snapshot_index: u64,
    /// Entries after it.
    pub entries: usize,
    /// Of those, requests in the v2 format.
    pub v2_requests: usize,
    /// The index of the last entry (the snapshot's when no entry follows it): etcd replays every
    /// entry above the db's consistent index at start.
    pub last_index: u64,
}

/// Scans `wal_dir`; `None` when it cannot be read (no WAL, or a format this reader does not
/// follow: then nothing is claimed). One record in memory at a time, and the entries after the
/// newest snapshot record (at most etcd's `--snapshot-count` of them).
pub fn replay(wal_dir: &Path) -> Option<Replay> {
    let mut files: Vec<_> = std::fs::read_dir(wal_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    files.sort();
    if files.is_empty() {
        return None;
    }
    let mut snapshot_index = 0;
    // (index, a v2 request), in index order; a new record of an index replaces it and every later
    // one (a new leader's entries replace uncommitted ones).
    let mut entries: Vec<(u64, bool)> = Vec::new();
    for file in files {
        let f = std::fs::File::open(&file).ok()?;
        let size = f.metadata().ok()?.len();
        let mut r = std::io::BufReader::new(f);
        let mut at = 0u64;
        let mut rec = Vec::new();
        while at + 8 <= size {
            let mut len = [0u8; 8];
            r.read_exact(&mut len).ok()?;
            let len_field = u64::from_le_bytes(len);
            let rec_len = len_field & !(0xffu64 << 56);
            let pad = if len_field >> 63 == 1 {
                (len_field >> 56) & 7
            } else {
                0
            };
            if rec_len == 0 {
                break;
            }
            // Bounded before it is allocated: no record is larger than etcd's largest request
            // (`--max-request-bytes` tops out far below this), nor than what the file holds (a torn
            // last record, which etcd drops too).
            if rec_len > MAX_RECORD {
                return None;
            }
            if rec_len > size - at - 8 {
                break;
            }
            rec.resize(rec_len as usize, 0);
            r.read_exact(&mut rec).ok()?;
            at += 8 + rec_len + pad;
            if pad > 0 && std::io::copy(&mut (&mut r).take(pad), &mut std::io::sink()).ok()? < pad {
                break;
            }
            let record = fields(&rec)?;
            let kind = record.iter().find(|f| f.0 == 1).map(|f| f.2).unwrap_or(0);
            let data = record.iter().find(|f| f.0 == 3).map(|f| f.3).unwrap_or(&[]);
            match kind {
                ENTRY => {
                    let e = fields(data)?;
                    let index = e.iter().find(|f| f.0 == 3).map(|f| f.2).unwrap_or(0);
                    let normal = e.iter().find(|f| f.0 == 1).map(|f| f.2).unwrap_or(0) == 0;
                    let payload = e.iter().find(|f| f.0 == 4).map(|f| f.3).unwrap_or(&[]);
                    let keep = entries.partition_point(|(i, _)| *i < index);
                    entries.truncate(keep);
                    entries.push((index, normal && !payload.is_empty() && is_v2_request(payload)));
                }
                SNAPSHOT => {
                    let s = fields(data)?;
                    let index = s.iter().find(|f| f.0 == 1).map(|f| f.2).unwrap_or(0);
                    snapshot_index = snapshot_index.max(index);
                    let applied = entries.partition_point(|(i, _)| *i <= snapshot_index);
                    entries.drain(..applied);
                }
                _ => {}
            }
        }
    }
    let after: Vec<bool> = entries
        .iter()
        .filter(|(i, _)| *i > snapshot_index)
        .map(|(_, v2)| *v2)
        .collect();
    Some(Replay {
        snapshot_index,
        entries: after.len(),
        v2_requests: after.iter().filter(|v2| **v2).count(),
        last_index: entries
            .last()
            .map_or(snapshot_index, |(i, _)| (*i).max(snapshot_index)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_requests_and_internal_requests_are_told_apart() {
        // v2 Request {ID 1, Method "PUT", Path "/0/version", Val "3.5.0"}.
        let mut v2 = vec![0x08, 0x01, 0x12, 0x03];
        v2.extend(b"PUT");
        v2.extend([0x1a, 0x0a]);
        v2.extend(b"/0/version");
        v2.extend([0x22, 0x05]);
        v2.extend(b"3.5.0");
        assert!(is_v2_request(&v2));
        // InternalRaftRequest {ID 5, header (100) {ID 1}, put (4) {key "k"}}.
        let internal = [
            0x08, 0x05, 0xa2, 0x06, 0x02, 0x08, 0x01, 0x22, 0x03, 0x0a, 0x01, b'k',
        ];
        assert!(!is_v2_request(&internal));
        // One that wraps a v2 request in the removed field 2: 3.7 skips it.
        let mut wrapped = vec![0x08, 0x07, 0x12, v2.len() as u8];
        wrapped.extend(&v2);
        assert!(!is_v2_request(&wrapped));
    }
}

//! The one gate between the store's bytes and the decisions made from them.
//!
//! A listing's names are candidates: they say where to look and in which order, and nothing else.
//! What an object claims (the revision its name gives, its header, its footer's sizes and counts)
//! is believed only once [`check`] has handed out a [`Checked`] for it, which nothing outside this
//! file can make: its framing adds up to the object's size, its header and footer are bounded and
//! parse, its header says what its name says, its claims fit its size (no payload decodes to more
//! than its compression allows), no revision it names is near the end of etcd's revision space,
//! and with signing on its signature verifies. What cannot be seen without reading the payload (its
//! digest, what it decodes to) the full read checks (`format::read_object`), which stops at these
//! claims.
//!
//! A refusal is one of the failure kinds (docs/design.md, "Failures"): a [`Refused::Bad`] object is
//! skipped, counted and said, and whatever used it falls back to the next candidate; a
//! [`Refused::Unknown`] (the store did not answer) decides nothing.

use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::Store;
use super::format::{END_MAGIC, Footer, Header, MAGIC, MAX_META, TRAILER_LEN, header_agrees};
use super::layout::{Compression, Kind, Layout, SnapshotName};

/// The highest revision an object may name. etcd's revisions are i64s, and a restore raises the
/// revision it reaches by a bump (10^9 by default): a name near i64::MAX (a planted one) would
/// make that bump overflow, or hand etcd a revision it can never write past. No cluster comes near
/// 2^62 (a million writes a second for 146 000 years).
pub const MAX_REVISION: i64 = 1 << 62;

/// How much one stored byte may decode to: zstd's best case is a 4-byte RLE block standing for
/// 128 KiB (32 768:1), deflate's 258 bytes per 2 bits (1 032:1); age only adds bytes. Twice that,
/// and 64 KiB for any frame.
fn most_raw(compression: Compression, stored: u64) -> u64 {
    let ratio = match compression {
        Compression::Zstd => 1 << 16,
        Compression::Gzip => 2 << 10,
        Compression::None => 1,
    };
    stored.saturating_mul(ratio).saturating_add(64 << 10)
}

/// What one read from each end of an object takes in: an object's header and footer are a few
/// hundred bytes, so two reads see both.
const WINDOW: u64 = 64 << 10;

/// An object that passed the gate.
#[derive(Debug, Clone)]
pub struct Checked {
    name: SnapshotName,
    size: u64,
    /// `None` for an etcd-backup-restore object: its format has no header or footer to check
    /// (with signing on it never gets here: etcd-backup-restore signs nothing).
    head: Option<(Header, Footer)>,
}

impl Checked {
    pub fn name(&self) -> &SnapshotName {
        &self.name
    }

    /// The object's size in the store.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its footer (the warden's own objects only).
    pub fn footer(&self) -> Option<&Footer> {
        self.head.as_ref().map(|(_, f)| f)
    }

    /// Its header (the warden's own objects only).
    pub fn header(&self) -> Option<&Header> {
        self.head.as_ref().map(|(h, _)| h)
    }

    /// The newest revision it holds as far as its (checked) name says: a full's lower bound, a
    /// delta's last.
    pub fn revision(&self) -> i64 {
        self.name.last_revision()
    }
}

/// Why an object did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The object itself: missing, malformed, claiming more than it can hold, not signed.
    Bad(String),
    /// The store did not answer: nothing is learnt about the object.
    Unknown(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bad(e) => f.write_str(e),
            Self::Unknown(e) => write!(f, "the store did not answer: {e}"),
        }
    }
}

/// Checks one object's framing, header, footer, claims and signature (a few small reads: two
/// ranges, and a HEAD when the listing gave no size). `listed`: its size as the listing gave it.
pub async fn check(store: &Store, name: &SnapshotName, listed: Option<u64>) -> Result<Checked, Refused> {
    let key = name.key();
    let bad = |why: String| Refused::Bad(format!("{key}: {why}"));
    let revisions = match name.kind {
        Kind::Full { revision, .. } => [revision, revision],
        Kind::Delta { first, last, .. } => [first, last],
    };
    if revisions.iter().any(|r| !(0..=MAX_REVISION).contains(r)) {
        return Err(bad(format!("its name claims a revision past {MAX_REVISION}")));
    }
    let path = Path::from(key.as_str());
    let unknown = |e: object_store::Error| match e {
        object_store::Error::NotFound { .. } => Refused::Bad(format!("{key}: missing")),
        e => Refused::Unknown(format!("read {key}: {}", crate::telemetry::error_chain(&e))),
    };
    let size = match listed {
        Some(s) => s,
        None => store.inner.head(&path).await.map_err(unknown)?.size,
    };
    if let Layout::Gbr(_) = name.layout {
        store
            .keys
            .signing
            .unsigned(&key, "is etcd-backup-restore's (never signed)")
            .map_err(Refused::Bad)?;
        if size == 0 {
            return Err(bad("empty".into()));
        }
        return Ok(Checked {
            name: *name,
            size,
            head: None,
        });
    }
    if size < (12 + TRAILER_LEN) as u64 {
        return Err(bad(format!("only {size} bytes")));
    }
    let front = store
        .inner
        .get_range(&path, 0..size.min(WINDOW))
        .await
        .map_err(unknown)?;
    let back = store
        .inner
        .get_range(&path, size.saturating_sub(WINDOW)..size)
        .await
        .map_err(unknown)?;
    let (header, footer, payload_len, digest) = frame(&front, &back, size).map_err(bad)?;
    let header_bytes = fetch(store, &path, 12, header, &front, 0)
        .await
        .map_err(unknown)?;
    let footer_start = size - TRAILER_LEN as u64 - footer;
    let footer_bytes = fetch(
        store,
        &path,
        footer_start,
        footer,
        &back,
        size.saturating_sub(WINDOW),
    )
    .await
    .map_err(unknown)?;
    let h: Header = serde_json::from_slice(&header_bytes)
        .map_err(|e| bad(format!("its header is not valid JSON: {e}")))?;
    header_agrees(&h, &key).map_err(bad)?;
    let f: Footer = serde_json::from_slice(&footer_bytes)
        .map_err(|e| bad(format!("its footer is not valid JSON: {e}")))?;
    store
        .keys
        .signing
        .open_object(&key, &header_bytes, payload_len, &digest, &footer_bytes)
        .map_err(bad)?;
    claims_fit(name, &h, &f, payload_len).map_err(bad)?;
    Ok(Checked {
        name: *name,
        size,
        head: Some((h, f)),
    })
}

/// The framing seen from both ends: the header's and the footer's lengths, the payload's length
/// and digest; they must add up to the object's size exactly.
fn frame(front: &[u8], back: &[u8], size: u64) -> Result<(u64, u64, u64, [u8; 32]), String> {
    // Every field read with `get`: a short or hostile window is an error, never a panic.
    let trailer = back
        .len()
        .checked_sub(TRAILER_LEN)
        .and_then(|at| back.get(at..))
        .ok_or("no end marker (incomplete object)")?;
    if front.get(0..8) != Some(&MAGIC[..]) {
        return Err("no magic (not an etcd-warden object)".into());
    }
    if trailer.get(44..52) != Some(&END_MAGIC[..]) {
        return Err("no end marker (incomplete object)".into());
    }
    let word = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    let (Some(header), Some(footer)) = (word(front.get(8..12)), word(trailer.get(0..4))) else {
        return Err("no magic (not an etcd-warden object)".into());
    };
    let (header, footer) = (u64::from(header), u64::from(footer));
    let payload = trailer
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or("no end marker (incomplete object)")?;
    let mut digest = [0u8; 32];
    digest.copy_from_slice(trailer.get(12..44).ok_or("no end marker (incomplete object)")?);
    if header > MAX_META || footer > MAX_META {
        return Err(format!(
            "it claims a header of {header} and a footer of {footer} bytes (at most {MAX_META} each)"
        ));
    }
    let framed = (12 + TRAILER_LEN as u64 + header + footer).checked_add(payload);
    if framed != Some(size) {
        return Err(format!(
            "its framing (a {header}-byte header, {payload} payload bytes, a {footer}-byte footer) does not add up to its {size} bytes"
        ));
    }
    Ok((header, footer, payload, digest))
}

/// `len` bytes at `at`: from `window` (read from `window_at`) when they lie in it, else read.
async fn fetch(
    store: &Store,
    path: &Path,
    at: u64,
    len: u64,
    window: &Bytes,
    window_at: u64,
) -> Result<Bytes, object_store::Error> {
    let end = at + len;
    if at >= window_at && end <= window_at + window.len() as u64 {
        return Ok(window.slice((at - window_at) as usize..(end - window_at) as usize));
    }
    store.inner.get_range(path, at..end).await
}

/// What the footer claims, against what the object can hold.
fn claims_fit(name: &SnapshotName, h: &Header, f: &Footer, payload_len: u64) -> Result<(), String> {
    let most = most_raw(h.compression, payload_len);
    if f.raw_bytes > most {
        return Err(format!(
            "its footer claims {} bytes from a {payload_len}-byte {} payload (at most {most})",
            f.raw_bytes,
            h.compression.as_str()
        ));
    }
    if let Some(after) = f.revision_after
        && !(0..=MAX_REVISION).contains(&after)
    {
        return Err(format!("its footer claims revision {after}"));
    }
    if let Kind::Delta { first, last, .. } = name.kind {
        let want = (last - first + 1) as u64;
        if f.revisions.is_some_and(|r| r != want) {
            return Err(format!(
                "its footer claims {} revisions where its name says {want}",
                f.revisions.unwrap_or_default()
            ));
        }
        if f.events.is_some_and(|e| e > f.raw_bytes) {
            return Err("its footer claims more events than it has bytes".into());
        }
    }
    Ok(())
}

/// At most this many objects are checked at once.
pub const CONCURRENCY: usize = 16;

/// What a screening refused: the count, and the first few with why (an operator's log and
/// `/status` stay small whatever a bucket holds).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    pub count: u64,
    pub first: Vec<(String, String)>,
}

/// How many refused objects are named one by one.
const NAMED: usize = 5;

impl Rejected {
    pub fn add(&mut self, key: String, why: String) {
        self.count += 1;
        if self.first.len() < NAMED {
            tracing::warn!(reason = %why, "an object in the store does not verify: skipped");
            self.first.push((key, why));
        } else if self.count == NAMED as u64 + 1 {
            tracing::warn!("more objects in the store do not verify: counted, not named");
        }
    }

    /// One line: `N objects skipped (k: why; …)`.
    pub fn summary(&self) -> Option<String> {
        (self.count > 0).then(|| {
            // Each reason names its key.
            let named: Vec<&str> = self.first.iter().map(|(_, w)| w.as_str()).collect();
            let more = self.count.saturating_sub(self.first.len() as u64);
            let more = if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            };
            format!(
                "{} object(s) that do not verify were skipped ({}{more})",
                self.count,
                named.join("; ")
            )
        })
    }
}

/// Checks `names` (with their listed sizes), [`CONCURRENCY`] at a time, in order: each passed or
/// refused. An unknown stops the whole check: nothing may be decided from a partial view.
pub async fn check_all(
    store: &Store,
    names: &[(SnapshotName, Option<u64>)],
) -> Result<Vec<Result<Checked, String>>, String> {
    use futures_util::StreamExt;
    let mut out = Vec::with_capacity(names.len());
    // A queue filled by hand, not a stream over an iterator: a closure's future inside an async
    // fn that a task spawns trips rustc's proof that it is Send (rust-lang/rust#102211).
    let mut running = futures_util::stream::FuturesOrdered::new();
    let mut next = names.iter();
    loop {
        while running.len() < CONCURRENCY {
            let Some(&(n, size)) = next.next() else { break };
            running.push_back(Box::pin(check_owned(store.clone(), n, size)));
        }
        let Some(r) = running.next().await else { break };
        match r {
            Ok(c) => out.push(Ok(c)),
            Err(Refused::Bad(why)) => out.push(Err(why)),
            Err(Refused::Unknown(why)) => return Err(why),
        }
    }
    Ok(out)
}

/// [`check`] with everything it needs owned.
async fn check_owned(store: Store, name: SnapshotName, size: Option<u64>) -> Result<Checked, Refused> {
    check(&store, &name, size).await
}

/// A listing with what did not pass the gate taken out, and what was.
#[derive(Debug, Clone, Default)]
pub struct Screened {
    pub fulls: Vec<SnapshotName>,
    pub chains: super::Catalog,
    pub rejected: Rejected,
}

/// How many of the newest fulls that pass have every delta of their chain checked: the chains a
/// restore takes first (the newest of the warden's and of etcd-backup-restore's, the live one).
const CHECKED_CHAINS: usize = 2;

/// Screens a listing (`sizes`: each key's listed size, when known): every full is checked; the
/// chains of the [`CHECKED_CHAINS`] newest fulls that pass have every delta checked; every other
/// chain keeps its deltas up to the newest one that passes, checked from the newest down (a
/// fallback to it reads each delta whole, which checks the rest). So the newest candidate a plan
/// finds in the result, and the newest revision it names, are what passed the gate; a planted name
/// moves neither. `Err`: the store did not answer (nothing is decided from a partial view).
pub async fn screen(
    store: &Store,
    fulls: &[SnapshotName],
    chains: &super::Catalog,
    sizes: &std::collections::HashMap<String, u64>,
) -> Result<Screened, String> {
    let sized = |n: &SnapshotName| (*n, sizes.get(&n.key()).copied());
    let mut out = Screened::default();
    let listed: Vec<_> = fulls.iter().map(sized).collect();
    for (n, r) in fulls.iter().zip(check_all(store, &listed).await?) {
        match r {
            Ok(_) => out.fulls.push(*n),
            Err(why) => out.rejected.add(n.key(), why),
        }
    }
    let mut newest: Vec<SnapshotName> = out.fulls.clone();
    newest.sort_by_key(|f| std::cmp::Reverse((f.last_revision(), f.created_ms)));
    let whole: Vec<_> = newest
        .iter()
        .take(CHECKED_CHAINS)
        .filter_map(|f| f.chain())
        .collect();
    for (chain, deltas) in chains {
        let kept = if whole.contains(chain) {
            let listed: Vec<_> = deltas.iter().map(sized).collect();
            let mut kept = Vec::with_capacity(deltas.len());
            for (n, r) in deltas.iter().zip(check_all(store, &listed).await?) {
                match r {
                    Ok(_) => kept.push(*n),
                    Err(why) => out.rejected.add(n.key(), why),
                }
            }
            kept
        } else {
            let mut by_last: Vec<SnapshotName> = deltas.clone();
            by_last.sort_by_key(|d| std::cmp::Reverse((d.last_revision(), d.created_ms)));
            let mut top = None;
            for d in &by_last {
                match check(store, d, sizes.get(&d.key()).copied()).await {
                    Ok(_) => {
                        top = Some((d.last_revision(), d.created_ms));
                        break;
                    }
                    Err(Refused::Bad(why)) => out.rejected.add(d.key(), why),
                    Err(Refused::Unknown(why)) => return Err(why),
                }
            }
            match top {
                Some(top) => deltas
                    .iter()
                    .filter(|d| (d.last_revision(), d.created_ms) <= top)
                    .copied()
                    .collect(),
                None => Vec::new(),
            }
        };
        if !kept.is_empty() {
            out.chains.insert(*chain, kept);
        }
    }
    if let Some(s) = out.rejected.summary() {
        tracing::warn!(skipped = out.rejected.count, "{s}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(header: &[u8], payload: &[u8], footer: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(header);
        out.extend_from_slice(payload);
        out.extend_from_slice(footer);
        out.extend_from_slice(&(footer.len() as u32).to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&[0; 32]);
        out.extend_from_slice(END_MAGIC);
        out
    }

    #[test]
    fn the_framing_must_add_up_to_the_object() {
        let ok = framed(b"{}", b"payload", b"{}");
        let size = ok.len() as u64;
        assert_eq!(frame(&ok, &ok, size).map(|f| (f.0, f.1, f.2)), Ok((2, 2, 7)));
        for (what, bytes, size) in [
            ("one byte more", ok.clone(), size + 1),
            ("garbage", b"garbage".to_vec(), 7),
            ("no end marker", ok[..ok.len() - 1].to_vec(), size - 1),
        ] {
            assert!(frame(&bytes, &bytes, size).is_err(), "{what} passed");
        }
        // A trailer that claims a 4 GiB footer, or a payload past u64.
        let mut huge = ok.clone();
        let at = huge.len() - TRAILER_LEN;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(frame(&huge, &huge, size).unwrap_err().contains("at most"));
        let mut wrap = ok.clone();
        wrap[at + 4..at + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(frame(&wrap, &wrap, size).is_err());
    }

    #[test]
    fn no_payload_decodes_to_more_than_its_compression_allows() {
        assert_eq!(most_raw(Compression::None, 300), 300 + (64 << 10));
        assert!(most_raw(Compression::Zstd, 300) < 1 << 25);
        assert_eq!(most_raw(Compression::Zstd, u64::MAX), u64::MAX);
        // zstd's best: 1 GiB of zeros at the highest level, inside the bound.
        let zeros = zstd::encode_all(std::io::Read::take(std::io::repeat(0), 64 << 20), 19).unwrap();
        assert!(
            most_raw(Compression::Zstd, zeros.len() as u64) >= 64 << 20,
            "64 MiB of zeros in {} bytes is past the bound",
            zeros.len()
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::copy(&mut std::io::Read::take(std::io::repeat(0), 16 << 20), &mut gz).unwrap();
        let gz = gz.finish().unwrap();
        assert!(most_raw(Compression::Gzip, gz.len() as u64) >= 16 << 20);
    }

    #[test]
    fn rejections_name_the_first_few_and_count_the_rest() {
        let mut r = Rejected::default();
        for i in 0..100_000 {
            r.add(format!("k{i}"), "empty".into());
        }
        assert_eq!(r.count, 100_000);
        assert_eq!(r.first.len(), NAMED);
        let s = r.summary().unwrap();
        assert!(s.len() < 300 && s.contains("and 99995 more"), "{s}");
    }
}

//! The key names the newest values of a full snapshot need, read from the full's own bytes: as
//! they stream from etcd to the store (`run --kube-encryption-config`, [`Tap`]) or from a
//! downloaded file (`backups verify`, [`needed_in_file`]). Reading them from etcd once more per
//! full cost as much as the full itself.
//!
//! The bytes come in file order, not tree order, and etcd keeps no freelist, so which pages are
//! live is known only at the end. Each page that could be a leaf of etcd's `key` bucket leaves a
//! compact record per value (its key's 128-bit keyed hash, revision, tombstone and the key name
//! its value needs) in an unnamed temporary file; each branch page its children; each `key`
//! bucket entry its header. At the end, the tree is walked from the meta's root (a bitmap of
//! pages), and the records of the key bucket's live leaves are sorted by key in parts of bounded
//! size: the last revision of each key is its newest value. Memory: the page being read and a
//! part of at most 4 MiB of records (about 5 MiB sorted), at any size; the temporary file takes
//! about 34 bytes per value, and a file whose records outgrow twice its bytes is refused.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::format::bolt_stream::{self, BRANCH, Bitmap, LEAF, META, PageStream, Slot};

use super::encryption::{key_and_value, needed_by};

/// What the newest values of a full need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// The highest revision in the full's key bucket.
    pub revision: i64,
    /// Key name (`aescbc:key1`) → newest values that need it.
    pub needed: BTreeMap<String, u64>,
}

/// A page longer than this (a value of more than 16 MiB) is not read: the check says so.
const PAGE_CAP: usize = 16 << 20;
/// More distinct key names than this in one full is no encryption configuration.
const MAX_NAMES: usize = 4096;
/// The longest key name kept (kube-apiserver's are a few bytes); a longer one is not etcd's shape.
const MAX_NAME: usize = 256;
/// The most an inline bucket can hold: bbolt inlines a bucket smaller than a quarter page.
const MAX_INLINE: usize = 64 << 10 >> 2;
/// Records sorted in memory at once: about this many bytes of them.
const SORT_BYTES: u64 = 4 << 20;
/// Parts sorted one after the other (each an open file meanwhile): 1 GiB of records, about 30
/// million values, far more than etcd's largest database holds.
const MAX_PARTS: u64 = 256;
/// A record: hash (16), main revision (8), sub revision (8), need (2; the top bit: tombstone).
const RECORD: usize = 34;
const TOMBSTONE: u16 = 0x8000;
/// The need of a value naming a key past the first [`MAX_NAMES`].
const TOO_MANY: u16 = 0x7FFF;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Record {
    hash: [u64; 2],
    main: u64,
    sub: u64,
    need: u16,
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash[0].to_le_bytes());
        out.extend_from_slice(&self.hash[1].to_le_bytes());
        out.extend_from_slice(&self.main.to_le_bytes());
        out.extend_from_slice(&self.sub.to_le_bytes());
        out.extend_from_slice(&self.need.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Self {
        let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Self {
            hash: [u(0), u(8)],
            main: u(16),
            sub: u(24),
            need: u16::from_le_bytes([b[32], b[33]]),
        }
    }
}

/// Reads a full's bytes in file order; [`NeedsReader::finish`] says what its newest values need.
pub struct NeedsReader {
    pages: PageStream,
    sink: Sink,
}

struct Sink {
    /// Where the temporary files go.
    dir: std::path::PathBuf,
    /// Per branch page: id, child count, children.
    branches: BufWriter<File>,
    /// Per leaf page shaped like the key bucket's: id, record count, records.
    leaves: BufWriter<File>,
    /// Per leaf page holding a `key` bucket entry: id, length, the bucket's header (16 bytes, and
    /// its inline page when it has one).
    key_buckets: BufWriter<File>,
    /// Bytes fed and bytes written to the temporary files: real pages leave fewer records than
    /// they hold, so records outgrowing the bytes are a crafted file's.
    fed: u64,
    spilled: u64,
    branch: Bitmap,
    leaf: Bitmap,
    oversized: Bitmap,
    metas: [Option<(u64, u64)>; 2],
    names: HashMap<String, u16>,
    hashers: [std::hash::RandomState; 2],
    scratch: Vec<u8>,
    failed: Option<String>,
}

impl NeedsReader {
    /// The temporary file goes into `dir` (unnamed: nothing is left there, however the read ends).
    pub fn new(dir: &Path) -> Result<Self, String> {
        let temp = || {
            tempfile::tempfile_in(dir)
                .map(|f| BufWriter::with_capacity(256 << 10, f))
                .map_err(|e| format!("create a temporary file in {}: {e}", dir.display()))
        };
        Ok(Self {
            pages: PageStream::new(PAGE_CAP),
            sink: Sink {
                dir: dir.to_owned(),
                branches: temp()?,
                leaves: temp()?,
                key_buckets: temp()?,
                fed: 0,
                spilled: 0,
                branch: Bitmap::default(),
                leaf: Bitmap::default(),
                oversized: Bitmap::default(),
                metas: [None, None],
                names: HashMap::new(),
                hashers: [Default::default(), Default::default()],
                scratch: Vec::new(),
                failed: None,
            },
        })
    }

    /// The next bytes of the file (etcd's trailing sha256, shorter than a page, is ignored).
    pub fn feed(&mut self, data: &[u8]) {
        if self.sink.failed.is_some() {
            return;
        }
        let sink = &mut self.sink;
        sink.fed += data.len() as u64;
        if let Err(e) = self.pages.feed(data, |slot| sink.slot(slot)) {
            sink.failed.get_or_insert(e.to_string());
        }
        if sink.spilled > 2 * sink.fed + (1 << 20) {
            sink.failed
                .get_or_insert("the records outgrow the bytes read: not etcd's pages".into());
        }
    }

    pub fn finish(self) -> Result<Needs, String> {
        let Self { pages, sink } = self;
        let Sink {
            dir,
            branches,
            leaves,
            key_buckets,
            branch,
            leaf,
            oversized,
            metas,
            mut names,
            hashers,
            failed,
            ..
        } = sink;
        if let Some(e) = failed {
            return Err(e);
        }
        let slots = pages.slots();
        if pages.page_size().is_none() {
            return Err("not a bbolt file: shorter than its first page".into());
        }
        let mut branches = finish_spill(branches)?;
        let mut leaves = finish_spill(leaves)?;
        let (root, _) = metas
            .iter()
            .flatten()
            .max_by_key(|m| m.1)
            .copied()
            .ok_or("neither meta page is valid")?;
        let top = walk(&mut branches, root, slots)?;
        let mut found = Vec::new();
        let mut key_buckets = finish_spill(key_buckets)?;
        while let Some(head) = read_exact_or_end::<12>(&mut key_buckets)? {
            let page = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            let mut header = vec![0u8; u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize];
            key_buckets
                .read_exact(&mut header)
                .map_err(|e| format!("read the temporary file: {e}"))?;
            if top.get(page) {
                found.push(header);
            }
        }
        let [header] = &found[..] else {
            return Err("not one key bucket: not an etcd database".into());
        };
        let key_root = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let mut needs = Newest::default();
        if key_root == 0 {
            // An inline bucket: its one leaf follows the header.
            let records = records_of(&header[16..], &mut names, &hashers)
                .filter(|r| r.iter().all(|r| r.need != TOO_MANY))
                .ok_or("the key bucket's inline page is not shaped like etcd's")?;
            needs.sort_and_count(records);
        } else {
            let live = walk(&mut branches, key_root, slots)?;
            for page in live.iter() {
                if !branch.get(page) && !leaf.get(page) {
                    return Err(if oversized.get(page) {
                        format!("page {page} of the key bucket is longer than {PAGE_CAP} bytes")
                    } else {
                        format!("page {page} of the key bucket is not shaped like etcd's")
                    });
                }
            }
            needs.read(&mut leaves, &live, &dir)?;
        }
        let mut by_id = vec![String::new(); names.len() + 1];
        for (name, id) in names {
            by_id[id as usize] = name;
        }
        Ok(Needs {
            revision: i64::try_from(needs.revision).unwrap_or(i64::MAX),
            needed: needs
                .counts
                .into_iter()
                .map(|(id, n)| (by_id[id as usize].clone(), n))
                .collect(),
        })
    }
}

fn finish_spill(w: BufWriter<File>) -> Result<BufReader<File>, String> {
    let mut f = w
        .into_inner()
        .map_err(|e| format!("write the temporary file: {e}"))?;
    f.seek(SeekFrom::Start(0))
        .map_err(|e| format!("read the temporary file: {e}"))?;
    Ok(BufReader::with_capacity(256 << 10, f))
}

/// The pages reached from `root` through the branch pages read (one pass over them per level).
fn walk(branches: &mut BufReader<File>, root: u64, slots: u64) -> Result<Bitmap, String> {
    let outside = |p: u64| p < 2 || p >= slots;
    if outside(root) {
        return Err(format!(
            "a tree's root page {root} lies outside the file ({slots} pages)"
        ));
    }
    let mut reach = Bitmap::default();
    reach.set(root);
    for _ in 0..64 {
        let mut grew = false;
        branches
            .seek(SeekFrom::Start(0))
            .map_err(|e| format!("read the temporary file: {e}"))?;
        while let Some(head) = read_exact_or_end::<12>(branches)? {
            let id = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            let n = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
            let on = reach.get(id);
            for _ in 0..n {
                let child = u64::from_le_bytes(
                    read_exact_or_end::<8>(branches)?.ok_or("the temporary file ends early")?,
                );
                if on && !reach.get(child) {
                    if outside(child) {
                        return Err(format!(
                            "branch page {id} points outside the file, to page {child}"
                        ));
                    }
                    reach.set(child);
                    grew = true;
                }
            }
        }
        if !grew {
            return Ok(reach);
        }
    }
    Err("a tree deeper than 64 levels".into())
}

fn read_exact_or_end<const N: usize>(r: &mut impl Read) -> Result<Option<[u8; N]>, String> {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err("the temporary file ends early".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read the temporary file: {e}")),
        }
    }
    Ok(Some(b))
}

impl Sink {
    fn slot(&mut self, slot: Slot<'_>) {
        let r = match slot {
            Slot::Oversized { id } => {
                self.oversized.set(id);
                Ok(())
            }
            Slot::Page { id, flags, bytes } => self.page(id, flags, bytes),
        };
        if let Err(e) = r {
            self.failed.get_or_insert(e);
        }
    }

    fn page(&mut self, id: u64, flags: u16, bytes: &[u8]) -> Result<(), String> {
        let io = |e: std::io::Error| format!("write the temporary file: {e}");
        match flags {
            META if id < 2 => {
                self.metas[id as usize] =
                    crate::format::bolt::meta_of(bytes).map(|(_, root, _, txid)| (root, txid));
            }
            BRANCH => {
                let children: Option<Vec<u64>> = bolt_stream::branch_children(bytes).collect();
                if let Some(children) = children {
                    self.branch.set(id);
                    self.scratch.clear();
                    self.scratch.extend_from_slice(&id.to_le_bytes());
                    self.scratch
                        .extend_from_slice(&(children.len() as u32).to_le_bytes());
                    for c in children {
                        self.scratch.extend_from_slice(&c.to_le_bytes());
                    }
                    self.branches.write_all(&self.scratch).map_err(io)?;
                    self.spilled += self.scratch.len() as u64;
                }
            }
            LEAF => {
                let bucket = bolt_stream::leaf_items(bytes)
                    .flatten()
                    .find(|(flags, key, value)| {
                        flags & crate::format::bolt::BUCKET_LEAF != 0 && *key == b"key" && value.len() >= 16
                    });
                if let Some((_, _, value)) = bucket {
                    // The header, and the inline page only when the bucket is inline.
                    let inline = value[..8] == [0; 8] && value.len() <= 16 + MAX_INLINE;
                    let kept = if inline { value } else { &value[..16] };
                    self.key_buckets.write_all(&id.to_le_bytes()).map_err(io)?;
                    self.key_buckets
                        .write_all(&(kept.len() as u32).to_le_bytes())
                        .map_err(io)?;
                    self.key_buckets.write_all(kept).map_err(io)?;
                    self.spilled += 12 + kept.len() as u64;
                }
                if let Some(records) = self.records(bytes) {
                    if records.iter().any(|r| r.need == TOO_MANY) {
                        return Err(format!("values name more than {MAX_NAMES} encryption keys"));
                    }
                    self.leaf.set(id);
                    let mut out = std::mem::take(&mut self.scratch);
                    out.clear();
                    out.extend_from_slice(&id.to_le_bytes());
                    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
                    for r in &records {
                        r.encode(&mut out);
                    }
                    let written = self.leaves.write_all(&out).map_err(io);
                    self.spilled += out.len() as u64;
                    self.scratch = out;
                    written?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn records(&mut self, page: &[u8]) -> Option<Vec<Record>> {
        records_of(page, &mut self.names, &self.hashers)
    }
}

/// The records of a leaf shaped like one of etcd's key bucket (every key a revision, every value
/// an `mvccpb.KeyValue`); `None` for any other page. `names`: the key names met so far, by id.
fn records_of(
    page: &[u8],
    names: &mut HashMap<String, u16>,
    hashers: &[std::hash::RandomState; 2],
) -> Option<Vec<Record>> {
    {
        let mut out = Vec::new();
        // Each element's key and value after the one before, as bbolt writes them: no byte is
        // read twice, however the elements point.
        let mut after = 0usize;
        for item in bolt_stream::leaf_items(page) {
            let (flags, rev, kv) = item?;
            let at = rev.as_ptr() as usize - page.as_ptr() as usize;
            if at < after {
                return None;
            }
            after = at + rev.len() + kv.len();
            let tombstone = match rev.len() {
                17 => false,
                18 if rev[17] == b't' => true,
                _ => return None,
            };
            if flags != 0 || rev[8] != b'_' {
                return None;
            }
            let (key, value) = key_and_value(kv)?;
            let mut need = 0;
            if tombstone {
                need = TOMBSTONE;
            } else if let Some(name) = needed_by(value) {
                if name.len() > MAX_NAME {
                    return None;
                }
                need = match names.get(&name) {
                    Some(id) => *id,
                    None if names.len() >= MAX_NAMES => TOO_MANY,
                    None => {
                        let id = names.len() as u16 + 1;
                        names.insert(name, id);
                        id
                    }
                };
            }
            let h = |i: usize| hashers[i].hash_one(key);
            out.push(Record {
                hash: [h(0), h(1)],
                main: u64::from_be_bytes(rev[..8].try_into().expect("8 bytes")),
                sub: u64::from_be_bytes(rev[9..17].try_into().expect("8 bytes")),
                need,
            });
        }
        Some(out)
    }
}

/// The newest record of each key, counted by the key name it needs.
#[derive(Default)]
struct Newest {
    revision: u64,
    counts: BTreeMap<u16, u64>,
}

impl Newest {
    fn sort_and_count(&mut self, mut records: Vec<Record>) {
        records.sort_unstable();
        for (i, r) in records.iter().enumerate() {
            self.revision = self.revision.max(r.main);
            let last_of_key = records.get(i + 1).is_none_or(|next| next.hash != r.hash);
            if last_of_key && r.need != 0 && r.need & TOMBSTONE == 0 {
                *self.counts.entry(r.need).or_default() += 1;
            }
        }
    }

    /// The records of the pages in `live`, sorted in parts (by hash) no larger than SORT_BYTES.
    fn read(&mut self, leaves: &mut BufReader<File>, live: &Bitmap, dir: &Path) -> Result<(), String> {
        let io = |e: std::io::Error| format!("the temporary file: {e}");
        let mut total = 0u64;
        each_block(leaves, |page, n, _| {
            if live.get(page) {
                total += n as u64 * RECORD as u64;
            }
            Ok(())
        })?;
        let parts = total.div_ceil(SORT_BYTES).max(1);
        if parts > MAX_PARTS {
            return Err(format!("{total} bytes of records: more than this check sorts"));
        }
        if parts == 1 {
            let mut all = Vec::new();
            each_block(leaves, |page, _, records| {
                if live.get(page) {
                    all.extend(records.chunks_exact(RECORD).map(Record::decode));
                }
                Ok(())
            })?;
            self.sort_and_count(all);
            return Ok(());
        }
        let mut files = Vec::new();
        for _ in 0..parts {
            let f = tempfile::tempfile_in(dir).map_err(io)?;
            files.push(BufWriter::with_capacity(16 << 10, f));
        }
        each_block(leaves, |page, _, records| {
            if live.get(page) {
                for r in records.chunks_exact(RECORD) {
                    let part = (Record::decode(r).hash[0] % parts) as usize;
                    files[part].write_all(r).map_err(io)?;
                }
            }
            Ok(())
        })?;
        for f in files {
            let mut f = finish_spill(f)?;
            let mut bytes = Vec::new();
            // A part more than four times its share cannot come from a keyed hash.
            (&mut f)
                .take(4 * SORT_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(io)?;
            if bytes.len() as u64 > 4 * SORT_BYTES {
                return Err("records unevenly spread by their keyed hash".into());
            }
            self.sort_and_count(bytes.chunks_exact(RECORD).map(Record::decode).collect());
        }
        Ok(())
    }
}

/// Calls `f(page, count, records)` for each block of the leaf records.
fn each_block(
    leaves: &mut BufReader<File>,
    mut f: impl FnMut(u64, u32, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    leaves
        .seek(SeekFrom::Start(0))
        .map_err(|e| format!("read the temporary file: {e}"))?;
    let mut records = Vec::new();
    while let Some(head) = read_exact_or_end::<12>(leaves)? {
        let page = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let n = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
        records.resize(n as usize * RECORD, 0);
        leaves
            .read_exact(&mut records)
            .map_err(|e| format!("read the temporary file: {e}"))?;
        f(page, n, &records)?;
    }
    Ok(())
}

/// What the newest values of the bbolt file at `path` need, read front to back; the temporary
/// file goes beside it.
pub fn needed_in_file(path: &Path) -> Result<Needs, String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut reader = NeedsReader::new(dir)?;
    let mut file = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reader.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        }
    }
    reader.finish()
}

/// A [`NeedsReader`] on its own thread, fed by a full as it streams (`FullOptions::tap`). Dropped
/// without [`Tap::finish`] (the full failed), its thread stops at the end of the bytes sent
/// without reading them further.
pub struct Tap {
    tx: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    reader: Option<std::thread::JoinHandle<Result<Needs, String>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Tap {
    /// Its temporary file goes into `dir`.
    pub fn start(dir: &Path) -> Result<Self, String> {
        let mut needs = NeedsReader::new(dir)?;
        // A few etcd messages of 32 KiB: the reader keeps pace with compression easily.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = dropped.clone();
        let reader = std::thread::Builder::new()
            .name("key-check".into())
            .spawn(move || {
                while let Some(b) = rx.blocking_recv() {
                    needs.feed(&b);
                }
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err("the full was not taken".into());
                }
                needs.finish()
            })
            .map_err(|e| format!("start the key check's thread: {e}"))?;
        Ok(Self {
            tx: Some(tx),
            reader: Some(reader),
            dropped,
        })
    }

    pub fn sender(&self) -> Option<tokio::sync::mpsc::Sender<bytes::Bytes>> {
        self.tx.clone()
    }

    /// What the bytes sent said, once every sender is gone.
    pub async fn finish(mut self) -> Result<Needs, String> {
        drop(self.tx.take());
        let reader = self.reader.take().ok_or("the key check's thread is gone")?;
        tokio::task::spawn_blocking(move || reader.join())
            .await
            .map_err(|e| format!("the key check's thread: {e}"))?
            .map_err(|_| "the key check's thread panicked".to_owned())?
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if self.reader.is_some() {
            self.dropped.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bolt::{BUCKET_LEAF, BoltFile, BucketValue, LeafItem};

    fn kv(key: &[u8], rev: u64, value: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let bytes = |out: &mut Vec<u8>, n: u8, b: &[u8]| {
            out.push(n << 3 | 2);
            let mut len = b.len();
            while len >= 0x80 {
                out.push(len as u8 | 0x80);
                len >>= 7;
            }
            out.push(len as u8);
            out.extend_from_slice(b);
        };
        bytes(&mut out, 1, key);
        if let Some(v) = value {
            out.extend_from_slice(&[3 << 3, (rev % 100) as u8 + 1]);
            bytes(&mut out, 5, v);
        }
        out
    }

    fn rev_key(main: u64, sub: u64, tombstone: bool) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&sub.to_be_bytes());
        if tombstone {
            k.push(b't');
        }
        k
    }

    /// etcd-shaped history: `keys` keys written in turn with key1, some rewritten with key2,
    /// some plain, some deleted; `pad` bytes of ciphertext per value. The key bucket's items and
    /// what their newest values need.
    fn history(keys: usize, writes: usize, pad: usize, seed: u64) -> (Vec<LeafItem>, BTreeMap<String, u64>) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut newest: BTreeMap<Vec<u8>, Option<String>> = BTreeMap::new();
        let mut items = Vec::new();
        for (i, main) in (2..2 + writes as u64).enumerate() {
            let key = format!("/registry/secrets/ns{}/s{}", i % 7, rng.usize(..keys)).into_bytes();
            let (value, need, tombstone) = match rng.u8(..10) {
                0 => (None, None, true),
                1..=2 => (Some(b"k8s\x00plain".to_vec()), None, false),
                3..=5 => (
                    Some(b"k8s:enc:aescbc:v1:key2:".to_vec()),
                    Some("aescbc:key2"),
                    false,
                ),
                _ => (
                    Some(b"k8s:enc:aescbc:v1:key1:".to_vec()),
                    Some("aescbc:key1"),
                    false,
                ),
            };
            let value = value.map(|mut v| {
                v.extend((0..pad).map(|_| rng.u8(..)));
                v
            });
            items.push((0, rev_key(main, 0, tombstone), kv(&key, main, value.as_deref())));
            newest.insert(key, need.map(str::to_owned));
        }
        let mut needed = BTreeMap::new();
        for n in newest.into_values().flatten() {
            *needed.entry(n).or_default() += 1;
        }
        (items, needed)
    }

    /// A bbolt file whose key bucket holds `items`; with `stale`, an earlier tree of other items
    /// stays in the file unreached, as free pages do in etcd's.
    fn db(dir: &Path, items: Vec<LeafItem>, stale: Option<Vec<LeafItem>>) -> std::path::PathBuf {
        let path = dir.join("db");
        let mut f = BoltFile::create(&path, 4096).unwrap();
        if let Some(old) = stale {
            f.write_tree(old).unwrap();
        }
        let key = f.write_tree(items).unwrap();
        let meta = f
            .write_tree(vec![(
                0,
                b"consistent_index".to_vec(),
                9u64.to_be_bytes().to_vec(),
            )])
            .unwrap();
        f.commit(vec![
            (BUCKET_LEAF, b"key".to_vec(), BucketValue::encode(key, 0)),
            (BUCKET_LEAF, b"meta".to_vec(), BucketValue::encode(meta, 0)),
        ])
        .unwrap();
        path
    }

    fn read_in_pieces(path: &Path, seed: u64) -> Result<Needs, String> {
        let bytes = std::fs::read(path).unwrap();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut r = NeedsReader::new(path.parent().unwrap())?;
        let mut at = 0;
        while at < bytes.len() {
            let n = rng.usize(1..70_000).min(bytes.len() - at);
            r.feed(&bytes[at..at + n]);
            at += n;
        }
        // etcd's trailer.
        r.feed(&[0xAB; 32]);
        r.finish()
    }

    #[test]
    fn the_newest_value_of_each_key_counts_and_stale_pages_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (items, needed) = history(3000, 12_000, 40, 1);
        // A stale tree in which every key needs a third key name, as a compacted history leaves.
        let stale: Vec<LeafItem> = (2..3000u64)
            .map(|m| {
                let key = format!("/registry/secrets/old/s{m}").into_bytes();
                (
                    0,
                    rev_key(m, 0, false),
                    kv(&key, m, Some(b"k8s:enc:aescbc:v1:gone:x")),
                )
            })
            .collect();
        let path = db(dir.path(), items, Some(stale));
        assert!(needed.contains_key("aescbc:key1") && needed.contains_key("aescbc:key2"));
        for seed in 0..4 {
            let got = read_in_pieces(&path, seed).unwrap();
            assert_eq!(got.needed, needed, "pieces {seed}");
            assert_eq!(got.revision, 12_001);
        }
        assert_eq!(needed_in_file(&path).unwrap().needed, needed);
    }

    #[test]
    fn many_values_are_sorted_in_parts_and_values_across_overflow_pages_are_read() {
        let dir = tempfile::tempdir().unwrap();
        // More records than one part holds (SORT_BYTES), from many keys.
        let (items, needed) = history(150_000, 300_000, 8, 2);
        assert!(300_000 * RECORD as u64 > 2 * SORT_BYTES);
        let path = db(dir.path(), items, None);
        assert_eq!(needed_in_file(&path).unwrap().needed, needed);
        // Values of 6 000 bytes: each leaf spans overflow pages.
        let sub = tempfile::tempdir().unwrap();
        let (items, needed) = history(50, 400, 6000, 3);
        let path = db(sub.path(), items, None);
        assert_eq!(read_in_pieces(&path, 9).unwrap().needed, needed);
    }

    #[test]
    fn an_inline_key_bucket_and_an_empty_one_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let f = BoltFile::create(&path, 4096).unwrap();
        // An inline bucket: root 0, then a leaf page of one item.
        let (rev, value) = (
            rev_key(5, 0, false),
            kv(b"/a", 5, Some(b"k8s:enc:kms:v2:vault:x")),
        );
        let mut v = BucketValue::encode(0, 0);
        let mut page = vec![0u8; 16];
        page[8..10].copy_from_slice(&LEAF.to_le_bytes());
        page[10..12].copy_from_slice(&1u16.to_le_bytes());
        page.extend_from_slice(&0u32.to_le_bytes());
        page.extend_from_slice(&16u32.to_le_bytes());
        page.extend_from_slice(&(rev.len() as u32).to_le_bytes());
        page.extend_from_slice(&(value.len() as u32).to_le_bytes());
        page.extend_from_slice(&rev);
        page.extend_from_slice(&value);
        v.extend_from_slice(&page);
        f.commit(vec![(BUCKET_LEAF, b"key".to_vec(), v)]).unwrap();
        let got = needed_in_file(&path).unwrap();
        assert_eq!(got.needed, BTreeMap::from([("kms:v2:vault".to_owned(), 1)]));
        assert_eq!(got.revision, 5);
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let path = db(&empty, Vec::new(), None);
        assert_eq!(needed_in_file(&path).unwrap().needed, BTreeMap::new());
    }

    #[test]
    fn stale_copies_of_the_root_leaf_do_not_count() {
        // etcd rewrites the root leaf at nearly every commit; the old copies stay as free pages.
        let dir = tempfile::tempdir().unwrap();
        let (items, needed) = history(200, 600, 10, 4);
        let path = dir.path().join("db");
        let mut f = BoltFile::create(&path, 4096).unwrap();
        for _ in 0..1500 {
            f.write_tree(vec![(BUCKET_LEAF, b"key".to_vec(), BucketValue::encode(2, 0))])
                .unwrap();
        }
        let key = f.write_tree(items).unwrap();
        f.commit(vec![(BUCKET_LEAF, b"key".to_vec(), BucketValue::encode(key, 0))])
            .unwrap();
        assert_eq!(needed_in_file(&path).unwrap().needed, needed);
    }

    #[test]
    fn elements_that_point_at_the_same_bytes_are_no_key_leaf() {
        let (rev, value) = (rev_key(5, 0, false), kv(b"/a", 5, Some(b"k8s:enc:aescbc:v1:k:x")));
        let page = |second_at: u32| {
            let mut p = vec![0u8; 16];
            p[8..10].copy_from_slice(&LEAF.to_le_bytes());
            p[10..12].copy_from_slice(&2u16.to_le_bytes());
            let data = 16 + 2 * 16;
            for (i, pos) in [data as u32, second_at].into_iter().enumerate() {
                let e = 16 + i * 16;
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&(pos - e as u32).to_le_bytes());
                p.extend_from_slice(&(rev.len() as u32).to_le_bytes());
                p.extend_from_slice(&(value.len() as u32).to_le_bytes());
            }
            p.extend_from_slice(&rev);
            p.extend_from_slice(&value);
            p.extend_from_slice(&rev);
            p.extend_from_slice(&value);
            p
        };
        let (mut names, hashers) = (HashMap::new(), Default::default());
        let after = (16 + 2 * 16 + rev.len() + value.len()) as u32;
        assert_eq!(
            records_of(&page(after), &mut names, &hashers).map(|r| r.len()),
            Some(2)
        );
        assert!(records_of(&page(16 + 2 * 16), &mut names, &hashers).is_none());
    }

    #[test]
    fn a_file_without_one_key_bucket_or_with_a_page_past_the_cap_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let f = BoltFile::create(&path, 4096).unwrap();
        f.commit(Vec::new()).unwrap();
        assert!(needed_in_file(&path).unwrap_err().contains("not one key bucket"));
        // One value of 20 MiB.
        let sub = tempfile::tempdir().unwrap();
        let items = vec![(
            0,
            rev_key(2, 0, false),
            kv(b"/big", 2, Some(&vec![7u8; 20 << 20])),
        )];
        let path = db(sub.path(), items, None);
        assert!(needed_in_file(&path).unwrap_err().contains("longer than"));
    }
}

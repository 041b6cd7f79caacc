//! Just enough of bbolt's file format (go.etcd.io/bbolt 1.3, used by etcd 3.4 and 3.5) to append
//! sorted keys to a bucket and rewrite small buckets, copy-on-write like bbolt itself: new pages
//! go after the high-water mark, then one new meta page (txid + 1) makes them live in a single
//! write. Pages that are no longer referenced become free when bbolt next opens the file (etcd
//! opens it with NoFreelistSync, and the new meta says "no synced freelist", so bbolt rebuilds the
//! freelist by walking the reachable pages). Until the meta is written the file reads exactly as
//! before.
//!
//! On-disk layout (little-endian, native to bbolt on every platform etcd ships for):
//!
//!     page header: u64 id | u16 flags | u16 count | u32 overflow        (16 bytes)
//!     leaf element:   u32 flags | u32 pos | u32 ksize | u32 vsize       (pos from the element)
//!     branch element: u32 pos | u32 ksize | u64 pgid
//!     meta (at byte 16 of pages 0 and 1): u32 magic | u32 version | u32 page_size | u32 flags
//!          | u64 root | u64 sequence | u64 freelist | u64 pgid (high water) | u64 txid
//!          | u64 checksum (FNV-1a 64 of the 56 bytes before it)
//!     bucket value: u64 root | u64 sequence [| inline leaf page when root is 0]

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use thiserror::Error;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const META_CHECKSUMMED: usize = 56;
/// The freelist pgid that says "not synced: rebuild it by walking the tree".
const NO_FREELIST: u64 = u64::MAX;
/// A leaf element's flag for a nested bucket.
pub const BUCKET_LEAF: u32 = 0x01;
/// What one leaf item costs in memory beside its key and value (the tuple, two vectors).
pub const ITEM_COST: usize = 64;

#[derive(Debug, Error)]
pub enum BoltError {
    /// The file is a bbolt file, but shaped in a way this writer does not handle; nothing was
    /// written, and the caller can take another way.
    #[error("unsupported bbolt layout: {0}")]
    Unsupported(String),
    #[error("corrupt bbolt file: {0}")]
    Corrupt(String),
    #[error("bbolt file i/o: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    page_size: u32,
    flags: u32,
    root: u64,
    sequence: u64,
    pgid: u64,
    txid: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A page's meta as `(page size, root page, high-water mark, txid)`, when it is a valid bbolt v2
/// meta (magic, version, checksum); `page` starts at the page header.
pub(crate) fn meta_of(page: &[u8]) -> Option<(usize, u64, u64, u64)> {
    Meta::parse(page).map(|m| (m.page_size as usize, m.root, m.pgid, m.txid))
}

impl Meta {
    fn parse(page: &[u8]) -> Option<Self> {
        let m = page.get(PAGE_HEADER..PAGE_HEADER + META_CHECKSUMMED + 8)?;
        if u32_at(m, 0) != MAGIC
            || u32_at(m, 4) != VERSION
            || u64_at(m, META_CHECKSUMMED) != fnv1a64(&m[..META_CHECKSUMMED])
        {
            return None;
        }
        Some(Self {
            page_size: u32_at(m, 8),
            flags: u32_at(m, 12),
            root: u64_at(m, 16),
            sequence: u64_at(m, 24),
            pgid: u64_at(m, 40),
            txid: u64_at(m, 48),
        })
    }

    fn page(&self, page_size: usize) -> Vec<u8> {
        let mut p = vec![0u8; page_size];
        p[0..8].copy_from_slice(&(self.txid % 2).to_le_bytes());
        p[8..10].copy_from_slice(&META.to_le_bytes());
        let m = &mut p[PAGE_HEADER..];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        m[12..16].copy_from_slice(&self.flags.to_le_bytes());
        m[16..24].copy_from_slice(&self.root.to_le_bytes());
        m[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        m[32..40].copy_from_slice(&NO_FREELIST.to_le_bytes());
        m[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        m[48..56].copy_from_slice(&self.txid.to_le_bytes());
        let sum = fnv1a64(&m[..META_CHECKSUMMED]);
        m[56..64].copy_from_slice(&sum.to_le_bytes());
        p
    }
}

/// One element of a leaf page: flags (0, or [`BUCKET_LEAF`]), key, value.
pub type LeafItem = (u32, Vec<u8>, Vec<u8>);
/// One element of a branch page: the first key of the child, and the child's page.
type BranchItem = (Vec<u8>, u64);

enum Node {
    Leaf(Vec<LeafItem>),
    Branch(Vec<BranchItem>),
}

fn parse_node(b: &[u8], what: &str) -> Result<Node, BoltError> {
    let corrupt = |m: &str| BoltError::Corrupt(format!("{what}: {m}"));
    if b.len() < PAGE_HEADER {
        return Err(corrupt("short page"));
    }
    let (flags, count) = (u16_at(b, 8), u16_at(b, 10) as usize);
    let slice = |at: usize, len: usize| {
        b.get(at..at + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| corrupt("element points past the page"))
    };
    if flags & LEAF != 0 {
        let mut items = Vec::with_capacity(count);
        for i in 0..count {
            let e = PAGE_HEADER + i * ELEMENT;
            let head = b.get(e..e + ELEMENT).ok_or_else(|| corrupt("short element"))?;
            let (f, pos, ks, vs) = (
                u32_at(head, 0),
                u32_at(head, 4) as usize,
                u32_at(head, 8) as usize,
                u32_at(head, 12) as usize,
            );
            items.push((f, slice(e + pos, ks)?, slice(e + pos + ks, vs)?));
        }
        Ok(Node::Leaf(items))
    } else if flags & BRANCH != 0 {
        let mut items = Vec::with_capacity(count);
        for i in 0..count {
            let e = PAGE_HEADER + i * ELEMENT;
            let head = b.get(e..e + ELEMENT).ok_or_else(|| corrupt("short element"))?;
            let (pos, ks, pgid) = (
                u32_at(head, 0) as usize,
                u32_at(head, 4) as usize,
                u64_at(head, 8),
            );
            items.push((slice(e + pos, ks)?, pgid));
        }
        Ok(Node::Branch(items))
    } else {
        Err(corrupt(&format!(
            "page flags {flags:#x} are neither leaf nor branch"
        )))
    }
}

/// Takes what `items` hold in memory from `budget`: their bytes and [`ITEM_COST`] each.
fn charge(budget: &mut usize, items: &[LeafItem]) -> Result<(), BoltError> {
    let bytes: usize = items.iter().map(|(_, k, v)| k.len() + v.len() + ITEM_COST).sum();
    *budget = budget
        .checked_sub(bytes)
        .ok_or_else(|| BoltError::Unsupported("a bucket larger than the bytes allowed for it".into()))?;
    Ok(())
}

/// A bucket's header as stored in its parent: its root page, or an inline leaf when that is 0.
#[derive(Debug, Clone)]
pub struct BucketValue {
    pub root: u64,
    pub sequence: u64,
    inline: Vec<u8>,
}

impl BucketValue {
    pub fn parse(v: &[u8]) -> Result<Self, BoltError> {
        if v.len() < 16 {
            return Err(BoltError::Corrupt("bucket value shorter than its header".into()));
        }
        Ok(Self {
            root: u64_at(v, 0),
            sequence: u64_at(v, 8),
            inline: v[16..].to_vec(),
        })
    }

    /// The value for a bucket whose tree starts at page `root`.
    pub fn encode(root: u64, sequence: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&root.to_le_bytes());
        v.extend_from_slice(&sequence.to_le_bytes());
        v
    }
}

/// An open bbolt file being extended. Nothing changes for readers until [`BoltFile::commit`].
pub struct BoltFile {
    file: File,
    /// bbolt's exclusive flock, held until the file is committed or dropped.
    _lock: nix::fcntl::Flock<File>,
    out: BufWriter<File>,
    page_size: usize,
    meta: Meta,
    /// The next page to allocate (the high-water mark so far).
    next: u64,
}

impl BoltFile {
    pub fn open(path: &Path) -> Result<Self, BoltError> {
        let file = File::options().read(true).write(true).open(path)?;
        // As bbolt does: nobody else may have the file open meanwhile (a dup shares the lock).
        let lock = nix::fcntl::Flock::lock(file.try_clone()?, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| {
                BoltError::Unsupported(format!("{} is locked by another process", path.display()))
            })?;
        let mut first = vec![0u8; 4096];
        file.read_exact_at(&mut first, 0)?;
        let m0 = Meta::parse(&first)
            .ok_or_else(|| BoltError::Unsupported("meta page 0 is not a valid bbolt v2 meta".into()))?;
        let page_size = m0.page_size as usize;
        if !(1024..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(BoltError::Unsupported(format!("page size {page_size}")));
        }
        let mut second = vec![0u8; page_size];
        file.read_exact_at(&mut second, page_size as u64)?;
        // bbolt reads the meta with the higher txid; an invalid one is skipped.
        let meta = match Meta::parse(&second) {
            Some(m1) if m1.txid > m0.txid => m1,
            _ => m0,
        };
        let len = file.metadata()?.len();
        if meta.pgid.saturating_mul(page_size as u64) > len {
            return Err(BoltError::Corrupt(format!(
                "high-water mark page {} lies past the end of the file ({len} bytes)",
                meta.pgid
            )));
        }
        let mut out = BufWriter::with_capacity(1 << 20, file.try_clone()?);
        out.seek(SeekFrom::Start(meta.pgid * page_size as u64))?;
        Ok(Self {
            file,
            _lock: lock,
            out,
            page_size,
            meta,
            next: meta.pgid,
        })
    }

    /// A new bbolt file holding no bucket, as bbolt itself would begin one (metas with txids 0 and
    /// 1, an empty root leaf; no synced freelist), synced and opened.
    pub fn create(path: &Path, page_size: usize) -> Result<Self, BoltError> {
        // `open` reads the first 4 KiB: a smaller page would leave the new file shorter.
        if !(4096..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(BoltError::Unsupported(format!("page size {page_size}")));
        }
        let meta = Meta {
            page_size: page_size as u32,
            flags: 0,
            root: 2,
            sequence: 0,
            pgid: 3,
            txid: 1,
        };
        let mut raw = vec![0u8; 3 * page_size];
        raw[..page_size].copy_from_slice(&Meta { txid: 0, ..meta }.page(page_size));
        raw[page_size..2 * page_size].copy_from_slice(&meta.page(page_size));
        let root = &mut raw[2 * page_size..];
        root[0..8].copy_from_slice(&2u64.to_le_bytes());
        root[8..10].copy_from_slice(&LEAF.to_le_bytes());
        let mut file = File::options().write(true).create_new(true).open(path)?;
        file.write_all(&raw)?;
        file.sync_all()?;
        drop(file);
        Self::open(path)
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    fn read_page(&self, id: u64) -> Result<Vec<u8>, BoltError> {
        self.read_page_within(id, usize::MAX)
    }

    /// A page, refused as `Unsupported` when it (with its overflow pages) is larger than `max`
    /// bytes, before those are read.
    fn read_page_within(&self, id: u64, max: usize) -> Result<Vec<u8>, BoltError> {
        if id < 2 || id >= self.meta.pgid {
            return Err(BoltError::Corrupt(format!(
                "page {id} is outside the file's pages 2..{}",
                self.meta.pgid
            )));
        }
        let mut b = vec![0u8; self.page_size];
        self.file.read_exact_at(&mut b, id * self.page_size as u64)?;
        if u64_at(&b, 0) != id {
            return Err(BoltError::Corrupt(format!(
                "page {id} says it is page {}",
                u64_at(&b, 0)
            )));
        }
        let overflow = u32_at(&b, 12) as usize;
        if overflow > 0 {
            // Bounded before it is allocated: the pages must lie inside the file's own pages.
            if id.saturating_add(overflow as u64) >= self.meta.pgid {
                return Err(BoltError::Corrupt(format!(
                    "page {id} claims {overflow} overflow pages, past the file's pages 2..{}",
                    self.meta.pgid
                )));
            }
            if (overflow + 1).saturating_mul(self.page_size) > max {
                return Err(BoltError::Unsupported(format!(
                    "page {id} with its {overflow} overflow pages is larger than allowed here"
                )));
            }
            b.resize((overflow + 1) * self.page_size, 0);
            self.file
                .read_exact_at(&mut b[self.page_size..], (id + 1) * self.page_size as u64)?;
        }
        Ok(b)
    }

    fn node(&self, id: u64) -> Result<Node, BoltError> {
        parse_node(&self.read_page(id)?, &format!("page {id}"))
    }

    /// The top-level buckets (name → header), which must sit in one leaf page.
    pub fn root_items(&self) -> Result<Vec<LeafItem>, BoltError> {
        match self.node(self.meta.root)? {
            Node::Leaf(items) => Ok(items),
            Node::Branch(_) => Err(BoltError::Unsupported(
                "the root bucket spans several pages".into(),
            )),
        }
    }

    /// Every key/value of a bucket, in order.
    pub fn bucket_items(&self, b: &BucketValue) -> Result<Vec<LeafItem>, BoltError> {
        let mut unbounded = usize::MAX;
        self.bucket_items_within(b, &mut unbounded)
    }

    /// Every key/value of a bucket, in order, taking what they hold in memory from `budget`
    /// (their bytes and [`ITEM_COST`] each; a page read is bounded by what is left): a bucket
    /// larger than that is refused as `Unsupported` when it gets there, not held whole first.
    pub fn bucket_items_within(
        &self,
        b: &BucketValue,
        budget: &mut usize,
    ) -> Result<Vec<LeafItem>, BoltError> {
        if b.root == 0 {
            return match parse_node(&b.inline, "inline bucket")? {
                Node::Leaf(items) => {
                    charge(budget, &items)?;
                    Ok(items)
                }
                Node::Branch(_) => Err(BoltError::Corrupt("inline bucket page is a branch".into())),
            };
        }
        let mut out = Vec::new();
        let mut stack = vec![b.root];
        let mut visited = 0u64;
        while let Some(id) = stack.pop() {
            self.bound(&mut visited)?;
            let page = self.read_page_within(id, *budget)?;
            match parse_node(&page, &format!("page {id}"))? {
                Node::Leaf(items) => {
                    charge(budget, &items)?;
                    out.extend(items)
                }
                Node::Branch(items) => stack.extend(items.iter().rev().map(|(_, c)| *c)),
            }
        }
        Ok(out)
    }

    /// Every key/value of a bucket, in order, handed to `f` one leaf page at a time: memory stays
    /// at a page (and the path to it), however large the bucket.
    pub fn visit_bucket(&self, b: &BucketValue, mut f: impl FnMut(&[u8], &[u8])) -> Result<(), BoltError> {
        if b.root == 0 {
            for (_, k, v) in self.bucket_items(b)? {
                f(&k, &v);
            }
            return Ok(());
        }
        let mut stack = vec![b.root];
        let mut visited = 0u64;
        while let Some(id) = stack.pop() {
            self.bound(&mut visited)?;
            match self.node(id)? {
                Node::Leaf(items) => items.iter().for_each(|(_, k, v)| f(k, v)),
                Node::Branch(items) => stack.extend(items.iter().rev().map(|(_, c)| *c)),
            }
        }
        Ok(())
    }

    /// The key/values of a bucket from the first key at or after `start`, in order, handed to `f`
    /// one leaf page at a time: only the pages on the way to `start` and after it are read, so
    /// the tail of a large bucket costs the tail's pages. Bounded: a tree that visits more pages
    /// than the file holds (a cycle) is corrupt.
    pub fn visit_bucket_from(
        &self,
        b: &BucketValue,
        start: &[u8],
        mut f: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), BoltError> {
        if b.root == 0 {
            for (_, k, v) in self.bucket_items(b)? {
                if k.as_slice() >= start {
                    f(&k, &v);
                }
            }
            return Ok(());
        }
        let mut visited = 0u64;
        let mut stack = vec![b.root];
        while let Some(id) = stack.pop() {
            self.bound(&mut visited)?;
            match self.node(id)? {
                Node::Leaf(items) => items
                    .iter()
                    .filter(|(_, k, _)| k.as_slice() >= start)
                    .for_each(|(_, k, v)| f(k, v)),
                Node::Branch(items) => {
                    // A child holds the keys from its own up to the next child's: those wholly
                    // below `start` are skipped.
                    let first = items
                        .partition_point(|(k, _)| k.as_slice() <= start)
                        .saturating_sub(1);
                    stack.extend(items[first..].iter().rev().map(|(_, c)| *c));
                }
            }
        }
        Ok(())
    }

    /// Counts one more page of a walk through a tree: more pages than the file holds is a cycle,
    /// refused before it loops.
    fn bound(&self, visited: &mut u64) -> Result<(), BoltError> {
        *visited += 1;
        if *visited > self.meta.pgid {
            return Err(BoltError::Corrupt(
                "a bucket visits more pages than the file holds (a cycle)".into(),
            ));
        }
        Ok(())
    }

    /// Reads every page of every top-level bucket (nested buckets are not etcd's): whether the
    /// file is a sound bbolt tree, for a database that etcd's own tool failed on. Bounded: a tree
    /// that visits more pages than the file holds (a cycle) is corrupt.
    pub fn check(&self) -> Result<(), BoltError> {
        let mut visited = 0u64;
        for (flags, name, value) in self.root_items()? {
            if flags & BUCKET_LEAF == 0 {
                continue;
            }
            let b = BucketValue::parse(&value)
                .map_err(|e| BoltError::Corrupt(format!("bucket {}: {e}", String::from_utf8_lossy(&name))))?;
            if b.root == 0 {
                self.bucket_items(&b)?;
                continue;
            }
            let mut stack = vec![b.root];
            while let Some(id) = stack.pop() {
                visited += 1;
                if visited > self.meta.pgid {
                    return Err(BoltError::Corrupt(format!(
                        "bucket {} visits more pages than the file holds (a cycle)",
                        String::from_utf8_lossy(&name)
                    )));
                }
                if let Node::Branch(items) = self.node(id)? {
                    stack.extend(items.iter().map(|(_, c)| *c));
                }
            }
        }
        Ok(())
    }

    /// Starts appending to a bucket: keeps its tree except the right edge, which is rebuilt with
    /// the appended keys. Keys must come strictly after the bucket's last key.
    pub fn appender(&self, b: &BucketValue) -> Result<Appender, BoltError> {
        if b.root == 0 {
            return match parse_node(&b.inline, "inline bucket")? {
                Node::Leaf(items) => Ok(Appender::new(Vec::new(), items)),
                Node::Branch(_) => Err(BoltError::Corrupt("inline bucket page is a branch".into())),
            };
        }
        // Walk the right edge: at each branch level keep all children but the last.
        let mut kept = Vec::new();
        let mut id = b.root;
        loop {
            match self.node(id)? {
                Node::Branch(mut items) => {
                    let (_, last) = items
                        .pop()
                        .ok_or_else(|| BoltError::Corrupt(format!("branch page {id} is empty")))?;
                    kept.push(items);
                    id = last;
                    if kept.len() > 64 {
                        return Err(BoltError::Corrupt("tree deeper than 64 levels".into()));
                    }
                }
                Node::Leaf(items) => {
                    kept.reverse(); // lowest branch level first
                    return Ok(Appender::new(kept, items));
                }
            }
        }
    }

    /// A fresh tree holding `items` (sorted, unique); returns its root page.
    pub fn write_tree(&mut self, items: Vec<LeafItem>) -> Result<u64, BoltError> {
        let mut a = Appender::new(Vec::new(), Vec::new());
        for (f, k, v) in items {
            a.push(self, f, k, v)?;
        }
        a.finish(self)
    }

    /// Writes a one-page (plus overflow) node and returns its page id.
    fn write_node(&mut self, node: &Node) -> Result<u64, BoltError> {
        let (flags, count, data): (u16, usize, usize) = match node {
            Node::Leaf(items) => (
                LEAF,
                items.len(),
                items.iter().map(|(_, k, v)| k.len() + v.len()).sum(),
            ),
            Node::Branch(items) => (BRANCH, items.len(), items.iter().map(|(k, _)| k.len()).sum()),
        };
        let size = PAGE_HEADER + count * ELEMENT + data;
        let pages = size.div_ceil(self.page_size).max(1);
        let id = self.next;
        self.next += pages as u64;
        let mut b = vec![0u8; pages * self.page_size];
        b[0..8].copy_from_slice(&id.to_le_bytes());
        b[8..10].copy_from_slice(&flags.to_le_bytes());
        b[10..12].copy_from_slice(&(count as u16).to_le_bytes());
        b[12..16].copy_from_slice(&((pages - 1) as u32).to_le_bytes());
        let mut at = PAGE_HEADER + count * ELEMENT;
        match node {
            Node::Leaf(items) => {
                for (i, (f, k, v)) in items.iter().enumerate() {
                    let e = PAGE_HEADER + i * ELEMENT;
                    b[e..e + 4].copy_from_slice(&f.to_le_bytes());
                    b[e + 4..e + 8].copy_from_slice(&((at - e) as u32).to_le_bytes());
                    b[e + 8..e + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
                    b[e + 12..e + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
                    b[at..at + k.len()].copy_from_slice(k);
                    at += k.len();
                    b[at..at + v.len()].copy_from_slice(v);
                    at += v.len();
                }
            }
            Node::Branch(items) => {
                for (i, (k, child)) in items.iter().enumerate() {
                    let e = PAGE_HEADER + i * ELEMENT;
                    b[e..e + 4].copy_from_slice(&((at - e) as u32).to_le_bytes());
                    b[e + 4..e + 8].copy_from_slice(&(k.len() as u32).to_le_bytes());
                    b[e + 8..e + 16].copy_from_slice(&child.to_le_bytes());
                    b[at..at + k.len()].copy_from_slice(k);
                    at += k.len();
                }
            }
        }
        self.out.write_all(&b)?;
        Ok(id)
    }

    /// Packs children into branch pages; returns the level above.
    fn write_branches(&mut self, children: Vec<BranchItem>) -> Result<Vec<BranchItem>, BoltError> {
        let mut level = Vec::new();
        for page in group_branches(children, self.page_size) {
            let first = page[0].0.clone();
            level.push((first, self.write_node(&Node::Branch(page))?));
        }
        Ok(level)
    }

    /// Writes a new root leaf holding the top-level buckets, and a meta page pointing at it:
    /// everything written so far becomes the file's content at once. Data pages are synced before
    /// the meta, and the meta after.
    pub fn commit(mut self, root_items: Vec<LeafItem>) -> Result<(), BoltError> {
        let root = self.write_node(&Node::Leaf(root_items))?;
        self.out.flush()?;
        self.file.sync_all()?;
        let meta = Meta {
            root,
            pgid: self.next,
            txid: self.meta.txid + 1,
            ..self.meta
        };
        let at = (meta.txid % 2) * self.page_size as u64;
        self.file.write_all_at(&meta.page(self.page_size), at)?;
        self.file.sync_all()?;
        Ok(())
    }
}

/// Splits one branch level into pages, filled in order. bbolt never makes a branch page with fewer
/// than two children except a root (its rebalance asserts "parent must have at least 2 children"
/// when a lone child shrinks), so a last page left with one child takes one from the page before,
/// or joins it (a branch page may overflow, as in bbolt).
fn group_branches(children: Vec<BranchItem>, page_size: usize) -> Vec<Vec<BranchItem>> {
    let mut pages: Vec<Vec<BranchItem>> = Vec::new();
    let mut page: Vec<BranchItem> = Vec::new();
    let mut size = PAGE_HEADER;
    for (k, c) in children {
        if !page.is_empty() && size + ELEMENT + k.len() > page_size {
            pages.push(std::mem::take(&mut page));
            size = PAGE_HEADER;
        }
        size += ELEMENT + k.len();
        page.push((k, c));
    }
    if !page.is_empty() {
        pages.push(page);
    }
    if pages.len() >= 2 && pages[pages.len() - 1].len() < 2 {
        let mut last = pages.pop().expect("two pages");
        let prev = pages.last_mut().expect("two pages");
        if prev.len() >= 3 {
            last.insert(0, prev.pop().expect("three items"));
            pages.push(last);
        } else {
            prev.extend(last);
        }
    }
    pages
}

/// Appends sorted keys to a bucket's tree: fills leaf pages in order, then rebuilds the branch
/// levels on the right edge (the untouched left part of each level is kept as it was).
pub struct Appender {
    /// Per branch level, lowest first: the old children left of the right edge.
    kept: Vec<Vec<BranchItem>>,
    leaf: Vec<LeafItem>,
    leaf_size: usize,
    /// New leaf pages written so far.
    leaves: Vec<BranchItem>,
    last: Option<Vec<u8>>,
}

impl Appender {
    fn new(kept: Vec<Vec<BranchItem>>, leaf: Vec<LeafItem>) -> Self {
        let leaf_size = PAGE_HEADER
            + leaf
                .iter()
                .map(|(_, k, v)| ELEMENT + k.len() + v.len())
                .sum::<usize>();
        let last = leaf.last().map(|(_, k, _)| k.clone());
        Self {
            kept,
            leaf,
            leaf_size,
            leaves: Vec::new(),
            last,
        }
    }

    /// The bucket's last key so far.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.last.as_deref()
    }

    pub fn push(
        &mut self,
        file: &mut BoltFile,
        flags: u32,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<(), BoltError> {
        if self.last.as_deref().is_some_and(|l| l >= key.as_slice()) {
            return Err(BoltError::Corrupt(format!(
                "appended key {} does not sort after the bucket's last key {}",
                hex::encode(&key),
                hex::encode(self.last.as_deref().unwrap_or_default())
            )));
        }
        let add = ELEMENT + key.len() + value.len();
        // A page that would overflow is written first; a single oversized element gets overflow
        // pages of its own, as bbolt does.
        if !self.leaf.is_empty() && self.leaf_size + add > file.page_size {
            self.flush(file)?;
        }
        self.last = Some(key.clone());
        self.leaf_size += add;
        self.leaf.push((flags, key, value));
        Ok(())
    }

    fn flush(&mut self, file: &mut BoltFile) -> Result<(), BoltError> {
        let leaf = std::mem::take(&mut self.leaf);
        let first = leaf.first().map(|(_, k, _)| k.clone()).unwrap_or_default();
        let id = file.write_node(&Node::Leaf(leaf))?;
        self.leaves.push((first, id));
        self.leaf_size = PAGE_HEADER;
        Ok(())
    }

    /// Writes what is pending and the new right edge; returns the bucket's new root page.
    pub fn finish(mut self, file: &mut BoltFile) -> Result<u64, BoltError> {
        if !self.leaf.is_empty() || self.leaves.is_empty() {
            self.flush(file)?; // an empty bucket is one empty leaf
        }
        let mut children = std::mem::take(&mut self.leaves);
        for mut kept in std::mem::take(&mut self.kept) {
            kept.extend(children);
            children = file.write_branches(kept)?;
        }
        while children.len() > 1 {
            children = file.write_branches(children)?;
        }
        Ok(children[0].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn meta_round_trips_and_rejects_a_flipped_byte() {
        let m = Meta {
            page_size: 4096,
            flags: 0,
            root: 3,
            sequence: 0,
            pgid: 5,
            txid: 7,
        };
        let mut p = m.page(4096);
        let back = Meta::parse(&p).expect("valid");
        assert_eq!((back.root, back.pgid, back.txid, back.page_size), (3, 5, 7, 4096));
        assert_eq!(u64_at(&p, 0), 1, "txid 7 goes to meta page 1");
        p[PAGE_HEADER + 20] ^= 1;
        assert!(Meta::parse(&p).is_none());
    }

    /// A 4 KiB-page file: metas in pages 0 (txid 0) and 1 (txid 1), root at page 2, high water 3.
    fn three_pages() -> (usize, Meta, Vec<u8>) {
        let ps = 4096usize;
        let meta = Meta {
            page_size: ps as u32,
            flags: 0,
            root: 2,
            sequence: 0,
            pgid: 3,
            txid: 1,
        };
        let mut raw = vec![0u8; 3 * ps];
        raw[..ps].copy_from_slice(&Meta { txid: 0, ..meta }.page(ps));
        raw[ps..2 * ps].copy_from_slice(&meta.page(ps));
        (ps, meta, raw)
    }

    #[test]
    fn a_page_claiming_overflow_pages_past_the_file_is_refused_before_allocating() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let (ps, _, mut raw) = three_pages();
        // Page 2 (the root) says it is page 2 and runs on for 0xFFFFFFFF pages: 16 TiB at 4 KiB.
        raw[2 * ps..2 * ps + 8].copy_from_slice(&2u64.to_le_bytes());
        raw[2 * ps + 12..2 * ps + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &raw).expect("write");
        let db = BoltFile::open(&path).expect("the metas are sound");
        assert!(matches!(db.root_items(), Err(BoltError::Corrupt(m)) if m.contains("overflow")));
    }

    #[test]
    fn a_bounded_read_charges_every_item_and_refuses_a_page_past_what_is_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let mut f = BoltFile::create(&path, 4096).expect("create");
        // Empty keys and values cost no bytes of their own, and still their place in memory.
        let empty: Vec<LeafItem> = (0..100u32)
            .map(|i| (0, i.to_be_bytes().to_vec(), Vec::new()))
            .collect();
        let small = f.write_tree(empty).expect("tree");
        let big = f
            .write_tree(vec![(0, b"k".to_vec(), vec![7u8; 100_000])])
            .expect("tree");
        f.commit(vec![
            (BUCKET_LEAF, b"big".to_vec(), BucketValue::encode(big, 0)),
            (BUCKET_LEAF, b"small".to_vec(), BucketValue::encode(small, 0)),
        ])
        .expect("commit");
        let db = BoltFile::open(&path).expect("open");
        let root = db.root_items().expect("root");
        let (big, small) = (
            BucketValue::parse(&root[0].2).expect("big"),
            BucketValue::parse(&root[1].2).expect("small"),
        );
        let mut budget = 100 * (4 + 64);
        assert_eq!(
            db.bucket_items_within(&small, &mut budget).expect("fits").len(),
            100
        );
        assert_eq!(budget, 0);
        let mut budget = 100 * (4 + 64) - 1;
        assert!(matches!(
            db.bucket_items_within(&small, &mut budget),
            Err(BoltError::Unsupported(_))
        ));
        // The 100 kB value's page runs on over 24 overflow pages: refused before they are read.
        let mut budget = 50_000;
        assert!(matches!(
            db.bucket_items_within(&big, &mut budget),
            Err(BoltError::Unsupported(m)) if m.contains("overflow")
        ));
    }

    #[test]
    fn a_file_another_process_holds_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let (_, _, raw) = three_pages();
        std::fs::write(&path, &raw).expect("write");
        let held = nix::fcntl::Flock::lock(
            File::open(&path).expect("open"),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        )
        .expect("lock");
        assert!(matches!(BoltFile::open(&path), Err(BoltError::Unsupported(m)) if m.contains("locked")));
        drop(held);
        assert!(BoltFile::open(&path).is_ok());
    }

    #[test]
    fn no_branch_page_but_a_lone_root_has_a_single_child() {
        let item = |i: u32| (i.to_be_bytes().to_vec(), i as u64);
        // 4-byte keys: (4096 - 16) / 20 = 204 children per page.
        for n in [1usize, 2, 204, 205, 206, 408, 409, 410, 1000] {
            let pages = group_branches((0..n as u32).map(item).collect(), 4096);
            let flat: Vec<u32> = pages.iter().flatten().map(|(_, c)| *c as u32).collect();
            assert_eq!(
                flat,
                (0..n as u32).collect::<Vec<_>>(),
                "{n}: order or count changed"
            );
            if pages.len() > 1 {
                assert!(pages.iter().all(|p| p.len() >= 2), "{n}: a page with one child");
            }
        }
        // Keys so large that two fill a page: the lone last child joins the page before.
        let big = |i: u8| (vec![i; 1500], i as u64);
        let pages = group_branches((0..5).map(big).collect(), 4096);
        assert!(
            pages.iter().all(|p| p.len() >= 2),
            "{:?}",
            pages.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }

    /// What bbolt's tx.Check and rebalance rely on: keys in order within each page and within
    /// the bounds the parent gives (its key for the child ≤ every key < the next sibling's key),
    /// at least two children in every branch page but the root, and every leaf at the same depth (a
    /// B+tree's balance, which bbolt's node splitting and merging assume). Returns the page's first
    /// key and how many levels lie below it.
    fn check_tree(
        db: &BoltFile,
        id: u64,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        is_root: bool,
    ) -> (Vec<u8>, usize) {
        let (keys, below): (Vec<Vec<u8>>, usize) = match db.node(id).expect("page") {
            Node::Leaf(items) => (items.into_iter().map(|(_, k, _)| k).collect(), 0),
            Node::Branch(items) => {
                assert!(
                    is_root || items.len() >= 2,
                    "branch page {id} has {} child",
                    items.len()
                );
                let mut depth = None;
                for (i, (k, child)) in items.iter().enumerate() {
                    let next = items.get(i + 1).map(|(k, _)| k.as_slice()).or(high);
                    let (first, d) = check_tree(db, *child, Some(k), next, false);
                    assert!(k <= &first, "page {id}: key above its child's first key");
                    assert!(
                        *depth.get_or_insert(d) == d,
                        "page {id}: child {child} has leaves {d} levels down, a sibling {depth:?}"
                    );
                }
                (
                    items.into_iter().map(|(k, _)| k).collect(),
                    depth.unwrap_or(0) + 1,
                )
            }
        };
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "page {id}: keys out of order"
        );
        if let (Some(l), Some(first)) = (low, keys.first()) {
            assert!(l <= first.as_slice(), "page {id}: below its parent's key");
        }
        if let (Some(h), Some(last)) = (high, keys.last()) {
            assert!(last.as_slice() < h, "page {id}: reaches its next sibling's key");
        }
        (keys.first().cloned().unwrap_or_default(), below)
    }

    /// A writer on a new file of two metas and no pages yet, positioned at page 2: for building
    /// trees by hand, below the appender.
    fn raw_writer(path: &Path) -> (BoltFile, usize) {
        let (ps, meta, raw) = three_pages();
        std::fs::write(path, &raw).expect("write");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open");
        let mut out = BufWriter::new(f.try_clone().expect("clone"));
        out.seek(SeekFrom::Start(2 * ps as u64)).expect("seek");
        let lock = nix::fcntl::Flock::lock(
            f.try_clone().expect("clone"),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        )
        .expect("lock");
        let db = BoltFile {
            _lock: lock,
            file: f,
            out,
            page_size: ps,
            meta,
            next: 2,
        };
        (db, ps)
    }

    /// The balance check itself fires: a root whose children have leaves at different depths.
    #[test]
    #[should_panic(expected = "levels down")]
    fn check_tree_refuses_leaves_at_different_depths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut db, _) = raw_writer(&dir.path().join("db"));
        let leaf = |k: u8| Node::Leaf(vec![(0, vec![k], vec![k])]);
        let l1 = db.write_node(&leaf(1)).expect("leaf");
        let l5 = db.write_node(&leaf(5)).expect("leaf");
        let l6 = db.write_node(&leaf(6)).expect("leaf");
        let b = db
            .write_node(&Node::Branch(vec![(vec![5], l5), (vec![6], l6)]))
            .expect("branch");
        let root = db
            .write_node(&Node::Branch(vec![(vec![1], l1), (vec![5], b)]))
            .expect("root");
        db.out.flush().expect("flush");
        db.meta.pgid = db.next;
        check_tree(&db, root, None, None, true);
    }

    /// A file with two metas, a root leaf with one bucket, built by this writer; then a large
    /// append, read back in order through the tree.
    #[test]
    fn appending_many_keys_reads_back_in_order_across_levels() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        // Root leaf with bucket "b" inline-empty, written below into page 2.
        let mut inline = BucketValue::encode(0, 0);
        inline.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        {
            let (mut page, _) = raw_writer(&path);
            let id = page
                .write_node(&Node::Leaf(vec![(BUCKET_LEAF, b"b".to_vec(), inline.clone())]))
                .expect("root leaf");
            assert_eq!(id, 2);
            page.out.flush().expect("flush");
        }
        let n = 20_000u32;
        for round in 0..2 {
            let mut db = BoltFile::open(&path).expect("open");
            let root = db.root_items().expect("root");
            let b = BucketValue::parse(&root[0].2).expect("bucket");
            let mut a = db.appender(&b).expect("appender");
            for i in round * n..(round + 1) * n {
                let v = vec![b'x'; (i % 300) as usize + if i % 997 == 0 { 9000 } else { 0 }];
                a.push(&mut db, 0, i.to_be_bytes().to_vec(), v).expect("push");
            }
            let new_root = a.finish(&mut db).expect("finish");
            db.commit(vec![(
                BUCKET_LEAF,
                b"b".to_vec(),
                BucketValue::encode(new_root, 0),
            )])
            .expect("commit");
        }
        let db = BoltFile::open(&path).expect("reopen");
        let root = db.root_items().expect("root");
        let b = BucketValue::parse(&root[0].2).expect("bucket");
        let (_, levels) = check_tree(&db, b.root, None, None, true);
        assert!(
            levels >= 2,
            "40 000 keys in 4 KiB pages make branch levels: {levels}"
        );
        let items = db.bucket_items(&b).expect("items");
        assert_eq!(items.len(), 2 * n as usize);
        for (i, (f, k, v)) in items.iter().enumerate() {
            let i = i as u32;
            assert_eq!((*f, k.as_slice()), (0, i.to_be_bytes().as_slice()), "key {i}");
            assert_eq!(
                v.len(),
                (i % 300) as usize + if i.is_multiple_of(997) { 9000 } else { 0 }
            );
        }
        assert!(db.appender(&b).expect("appender").last_key() == Some(&(2 * n - 1).to_be_bytes()[..]));
        // A seek reads the keys from its start on, whatever page and level that start falls in,
        // and a start between keys begins at the next one.
        for start in [0u32, 1, 203, 204, 5_000, 19_999, 20_000, 39_999, 40_000] {
            let mut got = Vec::new();
            db.visit_bucket_from(&b, &start.to_be_bytes(), |k, _| got.push(k.to_vec()))
                .expect("seek");
            let want: Vec<Vec<u8>> = (start..2 * n).map(|i| i.to_be_bytes().to_vec()).collect();
            assert_eq!(got, want, "from {start}");
        }
        let mut between = Vec::new();
        db.visit_bucket_from(&b, &[0, 0, 0x13, 0x88, 0], |k, _| between.push(k.to_vec()))
            .expect("seek");
        assert_eq!(
            between.first().map(Vec::as_slice),
            Some(&5_001u32.to_be_bytes()[..])
        );
    }
}

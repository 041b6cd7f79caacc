//! A bbolt file read front to back as it streams past (etcd's snapshot stream, a downloaded full),
//! never seeking: every page slot whose header could start a page is handed out whole, with its
//! overflow pages. Which of them are live is known only at the end: a free page keeps what it
//! held, and etcd syncs no freelist (`NoFreelistSync`), so a reader keeps what it needs of each
//! slot and decides afterwards by walking the tree from the meta's root ([`Bitmap`] of the pages
//! reached). A slot inside a live page's overflow may look like a page too (a value can hold any
//! bytes); it is handed out like the others and, never reached, never counts.
//!
//! Memory: the bytes of the longest page still being gathered, bounded by the caller's cap (a
//! longer one is reported as [`Slot::Oversized`], never buffered).

use super::bolt::{BoltError, meta_of};

const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
pub const BRANCH: u16 = 0x01;
pub const LEAF: u16 = 0x02;
pub const META: u16 = 0x04;

/// One page slot that could start a page.
pub enum Slot<'a> {
    /// The page `id` (its header names that id), whole: header, elements and overflow.
    Page { id: u64, flags: u16, bytes: &'a [u8] },
    /// The page `id` claims more bytes than the cap; not read.
    Oversized { id: u64 },
}

/// Reads pages out of a bbolt file's bytes fed in order, in pieces of any size.
pub struct PageStream {
    cap: usize,
    /// 0 until page 0's meta was read.
    page_size: u64,
    /// Bytes from `window_at` on that a page being gathered, or the next slot's header, needs.
    window: Vec<u8>,
    window_at: u64,
    fed: u64,
    next_slot: u64,
    /// Pages whose bytes are not all here yet: (id, the offset they end at), by id.
    pending: Vec<(u64, u64)>,
}

impl PageStream {
    /// `cap`: the most bytes one page (with its overflow) may take to be read.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            page_size: 0,
            window: Vec::new(),
            window_at: 0,
            fed: 0,
            next_slot: 0,
            pending: Vec::new(),
        }
    }

    /// The page size, once page 0 was read.
    pub fn page_size(&self) -> Option<usize> {
        (self.page_size > 0).then_some(self.page_size as usize)
    }

    /// How many whole page slots the bytes fed so far hold.
    pub fn slots(&self) -> u64 {
        self.fed.checked_div(self.page_size).unwrap_or(0)
    }

    /// Takes the next bytes of the file; `f` gets each page as soon as its last byte is here, in
    /// the order they complete.
    pub fn feed(&mut self, data: &[u8], mut f: impl FnMut(Slot<'_>)) -> Result<(), BoltError> {
        self.window.extend_from_slice(data);
        self.fed += data.len() as u64;
        if self.page_size == 0 {
            if self.window.len() < PAGE_HEADER + 64 {
                return Ok(());
            }
            let (ps, ..) = meta_of(&self.window)
                .ok_or_else(|| BoltError::Corrupt("page 0 is not a valid bbolt meta page".into()))?;
            if !(1024..=65536).contains(&ps) || !ps.is_power_of_two() {
                return Err(BoltError::Unsupported(format!("page size {ps}")));
            }
            self.page_size = ps as u64;
        }
        let ps = self.page_size;
        while self.next_slot * ps + PAGE_HEADER as u64 <= self.fed {
            let at = (self.next_slot * ps - self.window_at) as usize;
            let h = &self.window[at..at + PAGE_HEADER];
            let id = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
            let flags = u16::from_le_bytes([h[8], h[9]]);
            let overflow = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
            if id == self.next_slot && matches!(flags, BRANCH | LEAF | META) {
                let span = (u64::from(overflow) + 1) * ps;
                if span <= self.cap as u64 {
                    self.pending.push((id, id * ps + span));
                } else {
                    f(Slot::Oversized { id });
                }
            }
            self.next_slot += 1;
        }
        let (fed, window_at) = (self.fed, self.window_at);
        let window = &self.window;
        self.pending.retain(|&(id, end)| {
            if end > fed {
                return true;
            }
            let from = (id * ps - window_at) as usize;
            let bytes = &window[from..(end - window_at) as usize];
            f(Slot::Page {
                id,
                flags: u16::from_le_bytes([bytes[8], bytes[9]]),
                bytes,
            });
            false
        });
        let keep = self
            .pending
            .iter()
            .map(|p| p.0 * ps)
            .chain([self.next_slot * ps])
            .min()
            .unwrap_or(self.fed)
            .min(self.fed);
        let drop = (keep - self.window_at) as usize;
        self.window.drain(..drop);
        self.window_at = keep;
        Ok(())
    }
}

/// A page's elements: each one's offset in the page and its 16 bytes; `None` for one past the page.
fn elements(page: &[u8]) -> impl Iterator<Item = Option<(usize, &[u8])>> {
    let count = page
        .get(10..12)
        .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]) as usize);
    (0..count).map(move |i| {
        let e = PAGE_HEADER + i * ELEMENT;
        Some((e, page.get(e..e + ELEMENT)?))
    })
}

/// The elements of a leaf page as (flags, key, value); `None` for one that points outside it.
pub fn leaf_items(page: &[u8]) -> impl Iterator<Item = Option<(u32, &[u8], &[u8])>> {
    elements(page).map(move |el| {
        let (e, h) = el?;
        let word = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes")) as usize;
        let (flags, pos, ks, vs) = (word(0) as u32, word(4), word(8), word(12));
        let k = e.checked_add(pos)?;
        let v = k.checked_add(ks)?;
        Some((flags, page.get(k..v)?, page.get(v..v.checked_add(vs)?)?))
    })
}

/// The child pages of a branch page; `None` for an element outside it.
pub fn branch_children(page: &[u8]) -> impl Iterator<Item = Option<u64>> {
    elements(page).map(|el| {
        let (_, h) = el?;
        Some(u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")))
    })
}

/// One bit per page.
#[derive(Debug, Clone, Default)]
pub struct Bitmap(Vec<u64>);

impl Bitmap {
    pub fn set(&mut self, page: u64) {
        let (word, bit) = ((page / 64) as usize, page % 64);
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << bit;
    }

    pub fn get(&self, page: u64) -> bool {
        self.0
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// The pages set, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..64u64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u64 * 64 + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bolt::{BoltFile, LeafItem};

    /// A file of the warden's own writer with `n` keys in one bucket, its bytes.
    fn file(n: usize, value: usize) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut f = BoltFile::create(&path, 4096).unwrap();
        let items: Vec<LeafItem> = (0..n)
            .map(|i| (0, format!("k{i:06}").into_bytes(), vec![i as u8; value]))
            .collect();
        let root = f.write_tree(items).unwrap();
        f.commit(vec![(
            crate::format::bolt::BUCKET_LEAF,
            b"b".to_vec(),
            crate::format::bolt::BucketValue::encode(root, 0),
        )])
        .unwrap();
        std::fs::read(&path).unwrap()
    }

    fn read(bytes: &[u8], chunk: usize, cap: usize) -> (Vec<(u64, u16, usize)>, Vec<u64>) {
        let (mut pages, mut over) = (Vec::new(), Vec::new());
        let mut s = PageStream::new(cap);
        for part in bytes.chunks(chunk) {
            s.feed(part, |slot| match slot {
                Slot::Page { id, flags, bytes } => pages.push((id, flags, bytes.len())),
                Slot::Oversized { id } => over.push(id),
            })
            .unwrap();
        }
        pages.sort();
        (pages, over)
    }

    #[test]
    fn every_page_comes_out_whole_however_the_bytes_are_cut() {
        // Values of 10 000 bytes: every leaf spans overflow pages.
        let bytes = file(300, 10_000);
        let (whole, _) = read(&bytes, bytes.len(), 1 << 20);
        assert!(whole.iter().any(|p| p.2 > 4096), "overflow pages: {whole:?}");
        assert!(whole.iter().any(|p| p.1 == BRANCH), "a branch page: {whole:?}");
        for chunk in [1, 7, 4096, 5000, 65536] {
            assert_eq!(read(&bytes, chunk, 1 << 20).0, whole, "chunk {chunk}");
        }
        // Under a cap of two pages, the long pages are named, never read.
        let (short, over) = read(&bytes, 5000, 8192);
        assert!(!over.is_empty() && short.iter().all(|p| p.2 <= 8192));
        assert_eq!(short.len() + over.len(), whole.len());
    }

    #[test]
    fn a_stream_that_is_no_bbolt_file_is_refused() {
        let mut s = PageStream::new(1 << 20);
        assert!(s.feed(&[7u8; 8192], |_| {}).is_err());
    }
}

//! The symmetric heap's allocator.
//!
//! Every PE runs the same deterministic allocator over its own heap, so the same sequence of
//! collective `malloc`/`free` calls yields the same offsets everywhere; the runtime checks that it
//! did (see `Pe::malloc`). The memory itself is a CUDA VMM allocation per PE (GPU) or a host buffer
//! (CPU emulation).

use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Alignment of every allocation: enough for 16-byte vector copies and cache-line separation.
pub const ALIGN: u64 = 256;

/// A first-fit allocator over `[start, end)` with coalescing free lists.
#[derive(Clone, Debug)]
pub struct SymmetricAllocator {
    pe: u32,
    start: u64,
    end: u64,
    /// Free blocks: offset -> length.
    free: BTreeMap<u64, u64>,
    /// Live allocations: offset -> length (rounded).
    live: BTreeMap<u64, u64>,
}

impl SymmetricAllocator {
    /// An allocator for PE `pe` handing out offsets in `[start, end)`.
    pub fn new(pe: u32, start: u64, end: u64) -> Self {
        let start = start.next_multiple_of(ALIGN);
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        SymmetricAllocator {
            pe,
            start,
            end,
            free,
            live: BTreeMap::new(),
        }
    }

    /// The first offset it hands out (what the runtime keeps below it is not the user's).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Reserves `bytes` (rounded up to [`ALIGN`]; 0 is treated as [`ALIGN`]) and returns the offset.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64> {
        let want = bytes.max(1).checked_next_multiple_of(ALIGN).unwrap_or(u64::MAX);
        let found = self.free.iter().find(|&(_, &len)| len >= want).map(|(&o, &l)| (o, l));
        let Some((off, len)) = found else {
            return Err(Error::HeapExhausted {
                pe: self.pe,
                requested: bytes,
                largest_free: self.free.values().copied().max().unwrap_or(0),
                heap_size: self.end - self.start,
            });
        };
        self.free.remove(&off);
        if len > want {
            self.free.insert(off + want, len - want);
        }
        self.live.insert(off, want);
        Ok(off)
    }

    /// Size (rounded) of the live allocation at `off`.
    pub fn size_of(&self, off: u64) -> Option<u64> {
        self.live.get(&off).copied()
    }

    /// The live allocation `(start, length)` that contains offset `off`.
    pub fn containing(&self, off: u64) -> Option<(u64, u64)> {
        let (&start, &len) = self.live.range(..=off).next_back()?;
        (off < start + len).then_some((start, len))
    }

    /// Returns the allocation at `off` to the free list, merging neighbours.
    pub fn free(&mut self, off: u64) -> Result<()> {
        let Some(size) = self.live.remove(&off) else {
            return Err(Error::ForeignFree {
                pe: self.pe,
                offset: off,
            });
        };
        let (mut start, mut len) = (off, size);
        if let Some((&prev, &prev_len)) = self.free.range(..off).next_back() {
            if prev + prev_len == off {
                self.free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(off + size)) {
            len += next_len;
        }
        self.free.insert(start, len);
        Ok(())
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_disjoint_and_deterministic() {
        let mut a = SymmetricAllocator::new(0, 4096, 1 << 20);
        let mut b = SymmetricAllocator::new(1, 4096, 1 << 20);
        let sizes = [1u64, 255, 256, 257, 10_000, 4096, 3];
        let mut offs = Vec::new();
        for &s in &sizes {
            let o = a.alloc(s).unwrap();
            assert_eq!(o, b.alloc(s).unwrap(), "two PEs must agree");
            assert_eq!(o % ALIGN, 0);
            assert!(o >= 4096);
            offs.push((o, s));
        }
        offs.sort();
        for w in offs.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
    }

    #[test]
    fn exhaustion_reports_the_largest_free_block() {
        let mut a = SymmetricAllocator::new(3, 0, 4096);
        a.alloc(1024).unwrap();
        let e = a.alloc(4096).unwrap_err();
        match e {
            Error::HeapExhausted {
                pe,
                requested,
                largest_free,
                heap_size,
            } => {
                assert_eq!((pe, requested, largest_free, heap_size), (3, 4096, 3072, 4096));
            }
            other => panic!("{other}"),
        }
        assert_eq!(a.free_bytes(), 3072, "a failed alloc changes nothing");
    }

    #[test]
    fn foreign_and_double_free_are_rejected_without_damage() {
        let mut a = SymmetricAllocator::new(0, 0, 1 << 16);
        let x = a.alloc(512).unwrap();
        assert!(matches!(a.free(x + 256), Err(Error::ForeignFree { offset, .. }) if offset == x + 256));
        a.free(x).unwrap();
        assert!(matches!(a.free(x), Err(Error::ForeignFree { .. })));
        assert_eq!(a.free_bytes(), 1 << 16);
    }

    #[test]
    fn freeing_coalesces_so_the_whole_heap_is_reusable() {
        let mut a = SymmetricAllocator::new(0, 0, 1 << 16);
        let xs: Vec<u64> = (0..8).map(|_| a.alloc(8192).unwrap()).collect();
        assert!(a.alloc(1).is_err());
        for &i in &[1usize, 3, 5, 7, 0, 2, 6, 4] {
            a.free(xs[i]).unwrap();
        }
        assert_eq!(a.alloc(1 << 16).unwrap(), 0);
    }
}

//! Handles on symmetric allocations.

use crate::error::{Error, Result};
use std::marker::PhantomData;

/// A collective allocation of `len` elements of `T`, at the same heap offset on every PE.
///
/// It is only a handle (offset and length): turn it into an address for a given PE with
/// `Pe::ptr` (GPU or CPU emulation); using it with another PE's heap, or after `free`, is an error,
/// and pass that to kernels. Kernels use
/// their own PE's address as the symmetric address for every peer.
#[derive(Debug)]
pub struct SymmetricBuffer<T> {
    /// Identity of the PE's heap that allocated it.
    pub(crate) heap: u64,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for SymmetricBuffer<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SymmetricBuffer<T> {}

impl<T> SymmetricBuffer<T> {
    pub(crate) fn new(heap: u64, offset: u64, len: usize) -> Self {
        SymmetricBuffer {
            heap,
            offset,
            len,
            _t: PhantomData,
        }
    }

    /// Offset from the heap base (equal on every PE).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    /// Checks that elements `[start, start+len)` lie inside the buffer (host reads and writes).
    pub(crate) fn check_range(&self, call: &'static str, pe: u32, start: usize, len: usize) -> Result<()> {
        if start.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfBounds {
                call,
                pe,
                offset: start as u64,
                len: len as u64,
                size: self.len as u64,
            });
        }
        Ok(())
    }

    /// A view of elements `[start, start+len)` (panics if out of range).
    pub fn slice(&self, start: usize, len: usize) -> SymmetricBuffer<T> {
        assert!(
            start + len <= self.len,
            "slice [{start}, +{len}) of a {}-element buffer",
            self.len
        );
        SymmetricBuffer::new(self.heap, self.offset + (start * std::mem::size_of::<T>()) as u64, len)
    }
}

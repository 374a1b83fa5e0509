//! Host memory that the emulated device and the (CPU-emulated) GPU threads share: queues, doorbell
//! records, UAR pages, CQ buffers and context tables.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// A zeroed, aligned host allocation with a stable address, freed on drop.
pub struct HostRegion {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the region is plain memory; every concurrent access to it goes through raw pointers with
// atomics or under the emulated hardware's publish protocol, never through Rust references.
unsafe impl Send for HostRegion {}
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// `bytes` zeroed bytes aligned to `align` (a power of two).
    pub fn zeroed(bytes: usize, align: usize) -> HostRegion {
        let layout = Layout::from_size_align(bytes.max(1), align).expect("host region layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostRegion { ptr, layout }
    }

    /// `bytes` bytes filled with `byte`.
    pub fn filled(bytes: usize, align: usize, byte: u8) -> HostRegion {
        let r = Self::zeroed(bytes, align);
        // SAFETY: freshly allocated, `bytes` long, not shared yet.
        unsafe { std::ptr::write_bytes(r.ptr, byte, bytes) };
        r
    }

    /// A region holding one `T`, zeroed.
    pub fn for_value<T>() -> HostRegion {
        Self::zeroed(std::mem::size_of::<T>(), std::mem::align_of::<T>().max(64))
    }

    /// The first byte.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The region as a `*mut T`.
    pub fn as_ptr<T>(&self) -> *mut T {
        self.ptr as *mut T
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether the region is empty (never: regions have at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

//! Cooperative copies and the atomic word types, on top of [`crate::arch`].

use crate::arch;

/// Copies `bytes` from `src` to `dst`, shared among `nthreads` threads of which this is `rank`.
///
/// 16-byte vector accesses when both pointers are 16-byte aligned (the common case for heap
/// buffers), unrolled so each thread has four loads in flight before it stores; narrower words
/// otherwise. The tail is copied byte by byte.
///
/// # Safety
/// `src..src+bytes` is readable and `dst..dst+bytes` writable global memory, not overlapping.
#[inline(always)]
pub(crate) unsafe fn copy_cooperative(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    let rank = rank as usize;
    let stride = nthreads as usize;
    let align = (dst as usize) | (src as usize);
    let done = if align & 15 == 0 {
        let n = bytes / 16;
        let d = dst as *mut [u32; 4];
        let s = src as *const [u32; 4];
        let mut i = rank;
        while i + 3 * stride < n {
            let a = arch::load_v4(s.add(i));
            let b = arch::load_v4(s.add(i + stride));
            let c = arch::load_v4(s.add(i + 2 * stride));
            let e = arch::load_v4(s.add(i + 3 * stride));
            arch::store_v4(d.add(i), a);
            arch::store_v4(d.add(i + stride), b);
            arch::store_v4(d.add(i + 2 * stride), c);
            arch::store_v4(d.add(i + 3 * stride), e);
            i += 4 * stride;
        }
        while i < n {
            arch::store_v4(d.add(i), arch::load_v4(s.add(i)));
            i += stride;
        }
        n * 16
    } else if align & 7 == 0 {
        copy_words::<u64>(dst, src, bytes, rank, stride)
    } else if align & 3 == 0 {
        copy_words::<u32>(dst, src, bytes, rank, stride)
    } else {
        0
    };
    let mut i = done + rank;
    while i < bytes {
        dst.add(i).write_volatile(src.add(i).read_volatile());
        i += stride;
    }
}

#[inline(always)]
unsafe fn copy_words<W: Copy>(dst: *mut u8, src: *const u8, bytes: usize, rank: usize, stride: usize) -> usize {
    let w = core::mem::size_of::<W>();
    let n = bytes / w;
    let d = dst as *mut W;
    let s = src as *const W;
    let mut i = rank;
    while i < n {
        d.add(i).write_volatile(s.add(i).read_volatile());
        i += stride;
    }
    n * w
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// The word types the device atomics operate on: `u32`, `u64`, `i32`, `i64` (NVSHMEM's standard
/// AMO types, and what an mlx5 NIC can do natively).
///
/// Every operation is a system-scope atomic (another GPU, the CPU or a NIC may touch the word),
/// with relaxed ordering, as in OpenSHMEM: order them with [`crate::Shmem::fence`] or
/// [`crate::Shmem::quiet`].
pub trait AtomicWord: Copy + sealed::Sealed {
    /// Width in bytes (the required alignment).
    const BYTES: usize;
    /// # Safety
    /// `p` is a valid, aligned, system-visible address.
    unsafe fn fetch_add(p: *mut Self, v: Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn compare_swap(p: *mut Self, expected: Self, new: Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn swap(p: *mut Self, v: Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn load(p: *const Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn store(p: *mut Self, v: Self);
    /// The value's bits, zero-extended to 64 (what an IBGDA atomic WQE carries).
    fn to_bits(self) -> u64;
    /// The value from the low `BYTES` bytes of `bits`.
    fn from_bits(bits: u64) -> Self;
}

macro_rules! atomic_word {
    ($t:ty, $u:ty, $add:ident, $cas:ident, $swap:ident, $load:ident, $store:ident) => {
        impl AtomicWord for $t {
            const BYTES: usize = core::mem::size_of::<$t>();
            #[inline(always)]
            unsafe fn fetch_add(p: *mut Self, v: Self) -> Self {
                arch::$add(p as *mut $u, v as $u) as $t
            }
            #[inline(always)]
            unsafe fn compare_swap(p: *mut Self, expected: Self, new: Self) -> Self {
                arch::$cas(p as *mut $u, expected as $u, new as $u) as $t
            }
            #[inline(always)]
            unsafe fn swap(p: *mut Self, v: Self) -> Self {
                arch::$swap(p as *mut $u, v as $u) as $t
            }
            #[inline(always)]
            unsafe fn load(p: *const Self) -> Self {
                arch::$load(p as *const $u) as $t
            }
            #[inline(always)]
            unsafe fn store(p: *mut Self, v: Self) {
                arch::$store(p as *mut $u, v as $u)
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                bits as $u as $t
            }
        }
    };
}

atomic_word!(
    u32,
    u32,
    atomic_add_relaxed_sys_u32,
    atomic_cas_relaxed_sys_u32,
    atomic_swap_relaxed_sys_u32,
    load_relaxed_sys_u32,
    store_relaxed_sys_u32
);
atomic_word!(
    i32,
    u32,
    atomic_add_relaxed_sys_u32,
    atomic_cas_relaxed_sys_u32,
    atomic_swap_relaxed_sys_u32,
    load_relaxed_sys_u32,
    store_relaxed_sys_u32
);
atomic_word!(
    u64,
    u64,
    atomic_add_relaxed_sys_u64,
    atomic_cas_relaxed_sys_u64,
    atomic_swap_relaxed_sys_u64,
    load_relaxed_sys_u64,
    store_relaxed_sys_u64
);
atomic_word!(
    i64,
    u64,
    atomic_add_relaxed_sys_u64,
    atomic_cas_relaxed_sys_u64,
    atomic_swap_relaxed_sys_u64,
    load_relaxed_sys_u64,
    store_relaxed_sys_u64
);

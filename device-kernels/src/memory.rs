//! Cooperative copies and the atomic word types, on top of [`crate::arch`].

use crate::arch;

/// Copies `bytes` from `src` to `dst`, shared among `nthreads` threads of which this is `rank`.
///
/// 16-byte vector accesses whenever `src` and `dst` are equally misaligned (the common case: the
/// same offset into two heap buffers), after a short head that brings them to a 16-byte boundary;
/// unrolled so each thread has four loads in flight before it stores. Narrower words when the
/// pointers' misalignments differ. The tail is copied byte by byte.
///
/// # Safety
/// `src..src+bytes` is readable and `dst..dst+bytes` writable global memory, not overlapping.
#[inline(always)]
pub unsafe fn copy_cooperative(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    let rank = rank as usize;
    let stride = nthreads as usize;
    let (mut dst, mut src, mut bytes) = (dst, src, bytes);
    if ((dst as usize) ^ (src as usize)) & 15 == 0 && dst as usize & 15 != 0 {
        let head = (16 - (dst as usize & 15)).min(bytes);
        let mut i = rank;
        while i < head {
            dst.add(i).write_volatile(src.add(i).read_volatile());
            i += stride;
        }
        dst = dst.add(head);
        src = src.add(head);
        bytes -= head;
    }
    let align = (dst as usize) | (src as usize);
    let done = if align & 15 == 0 {
        let n = bytes / 16;
        let d = dst as *mut [u32; 4];
        let s = src as *const [u32; 4];
        let mut i = rank;
        while i + 3 * stride < n {
            let v0 = arch::load_v4(s.add(i));
            let v1 = arch::load_v4(s.add(i + stride));
            let v2 = arch::load_v4(s.add(i + 2 * stride));
            let v3 = arch::load_v4(s.add(i + 3 * stride));
            arch::store_v4(d.add(i), v0);
            arch::store_v4(d.add(i + stride), v1);
            arch::store_v4(d.add(i + 2 * stride), v2);
            arch::store_v4(d.add(i + 3 * stride), v3);
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
    pub trait Word {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// The values [`crate::Shmem::p`] and [`crate::Shmem::g`] move as one word: NVSHMEM's
/// `p`/`g` types. Every bit pattern of their size is a valid value and they have no padding, so
/// building one from the bytes a NIC or proxy delivered is sound (which `bool`, `char`, enums or
/// padded structs would not be). Sealed.
///
/// ```compile_fail
/// # fn f(sh: &ibgda_device::Shmem, flag: *const bool) -> bool {
/// sh.g(flag, 0) // `bool` is not a `Word`: a byte other than 0 or 1 is no `bool`
/// # }
/// ```
pub trait Word: Copy + sealed::Word {}

macro_rules! word {
    ($($t:ty),*) => {
        $(
            impl sealed::Word for $t {}
            impl Word for $t {}
        )*
    };
}
word!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, usize, isize);

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

#[cfg(test)]
mod tests {
    extern crate std;
    use super::copy_cooperative;
    use std::vec::Vec;

    #[test]
    fn cooperative_copy_is_exact_at_every_alignment_and_thread_count() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for (s_off, d_off) in [(0, 0), (3, 3), (15, 15), (1, 0), (8, 0), (4, 12), (5, 9)] {
            for len in [0usize, 1, 15, 16, 17, 255, 1000, 3000] {
                for threads in [1u32, 3, 32] {
                    let mut dst = std::vec![0u8; 4096 + 64];
                    // Each "thread" copies its share; together they must copy everything once.
                    for rank in 0..threads {
                        // SAFETY: both ranges are inside their buffers and do not overlap.
                        unsafe {
                            copy_cooperative(
                                dst.as_mut_ptr().add(d_off + 16),
                                src.as_ptr().add(s_off),
                                len,
                                rank,
                                threads,
                            )
                        };
                    }
                    assert_eq!(
                        &dst[d_off + 16..d_off + 16 + len],
                        &src[s_off..s_off + len],
                        "{s_off} {d_off} {len} {threads}"
                    );
                    assert!(
                        dst[..d_off + 16].iter().all(|&b| b == 0) && dst[d_off + 16 + len..].iter().all(|&b| b == 0)
                    );
                }
            }
        }
    }
}

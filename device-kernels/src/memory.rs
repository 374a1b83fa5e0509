//! Cooperative copies and the atomic word types, on top of [`crate::arch`].

use crate::arch;

/// Copies `bytes` from `src` to `dst`, shared among `nthreads` threads of which this is `rank`.
///
/// 16-byte vector accesses whenever `src` and `dst` are equally misaligned (the common case: the
/// same offset into two heap buffers), with the unaligned head and tail bytes copied beside them;
/// each thread issues all its loads of a round (head and tail bytes and four vectors) before it
/// stores, so a small copy costs one memory round trip, not one per part. Narrower words when the
/// pointers' misalignments differ.
///
/// # Safety
/// `src..src+bytes` is readable and `dst..dst+bytes` writable global memory, not overlapping.
#[inline(always)]
pub unsafe fn copy_cooperative(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { copy_cooperative_unrolled::<4>(dst, src, bytes, rank, nthreads) }
}

/// [`copy_cooperative`] with `UNROLL` 16-byte loads in flight per thread in its main loop.
///
/// # Safety
/// As [`copy_cooperative`].
#[inline(always)]
pub unsafe fn copy_cooperative_unrolled<const UNROLL: usize>(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    rank: u32,
    nthreads: u32,
) {
    // SAFETY: this function's `# Safety` contract.
    unsafe { copy_vectors::<UNROLL, false>(dst, src, bytes, rank, nthreads) }
}

/// [`copy_cooperative_unrolled`] for a source read once ([`arch::load_v4_stream`]: not kept in
/// L1, 256-byte L2 fills): rows a kernel moves and never reads again.
///
/// # Safety
/// As [`copy_cooperative`].
#[inline(always)]
pub unsafe fn copy_cooperative_streaming<const UNROLL: usize>(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    rank: u32,
    nthreads: u32,
) {
    // SAFETY: this function's `# Safety` contract.
    unsafe { copy_vectors::<UNROLL, true>(dst, src, bytes, rank, nthreads) }
}

/// One thread's copy of at most 16 bytes whose addresses and length are multiples of 8 (or 4):
/// every word loaded before the first store, so the copy costs one load's round trip and a store
/// per word, not a dependent load and a store per byte (an 8-byte signal's or counter's WRITE).
/// Returns `false`, copying nothing, for any other shape.
///
/// # Safety
/// As [`copy_cooperative`].
#[inline(always)]
unsafe fn copy_small_words(dst: *mut u8, src: *const u8, bytes: usize) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let align = dst as usize | src as usize | bytes;
        if align & 7 == 0 {
            let (d, s) = (dst as *mut u64, src as *const u64);
            let w0 = s.read();
            let w1 = if bytes > 8 { s.add(1).read() } else { 0 };
            d.write(w0);
            if bytes > 8 {
                d.add(1).write(w1);
            }
            true
        } else if align & 3 == 0 {
            // Written out word by word: an array indexed by a loop counter would live in local
            // memory.
            let (d, s) = (dst as *mut u32, src as *const u32);
            let n = bytes / 4;
            let w0 = s.read();
            let w1 = if n > 1 { s.add(1).read() } else { 0 };
            let w2 = if n > 2 { s.add(2).read() } else { 0 };
            let w3 = if n > 3 { s.add(3).read() } else { 0 };
            d.write(w0);
            if n > 1 {
                d.add(1).write(w1);
            }
            if n > 2 {
                d.add(2).write(w2);
            }
            if n > 3 {
                d.add(3).write(w3);
            }
            true
        } else {
            false
        }
    }
}

/// The copies above: `STREAM` picks the streaming vector load.
///
/// # Safety
/// As [`copy_cooperative`].
#[inline(always)]
unsafe fn copy_vectors<const UNROLL: usize, const STREAM: bool>(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    rank: u32,
    nthreads: u32,
) {
    let load = |p: *const [u32; 4]| {
        // SAFETY: the callers pass in-range, 16-byte aligned vectors of `src`.
        unsafe {
            if STREAM {
                arch::load_v4_stream(p)
            } else {
                arch::load_v4(p)
            }
        }
    };
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let rank = rank as usize;
        let stride = nthreads as usize;
        if stride == 1 && bytes != 0 && bytes <= 16 && copy_small_words(dst, src, bytes) {
            return;
        }
        if ((dst as usize) ^ (src as usize)) & 15 != 0 {
            copy_mismatched(dst, src, bytes, rank, stride);
            return;
        }
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        let n = (bytes - head) / 16;
        let tail_start = head + n * 16;
        let tail = bytes - tail_start;
        // The head's and tail's bytes (fewer than 16 each) are loaded before the first vectors.
        let head_byte = (rank < head).then(|| src.add(rank).read());
        let tail_byte = (rank < tail).then(|| src.add(tail_start + rank).read());
        let d = dst.add(head) as *mut [u32; 4];
        let s = src.add(head) as *const [u32; 4];
        let mut i = rank;
        while i + (UNROLL - 1) * stride < n {
            let mut v = [[0u32; 4]; UNROLL];
            for (k, slot) in v.iter_mut().enumerate() {
                *slot = load(s.add(i + k * stride));
            }
            for (k, slot) in v.iter().enumerate() {
                arch::store_v4(d.add(i + k * stride), *slot);
            }
            i += UNROLL * stride;
        }
        // The last, partial round (fewer than `UNROLL` vectors left for this thread): its loads
        // all issued before its stores too, so a copy of `r` rounds' vectors costs `r` round trips,
        // not one per leftover vector.
        if i < n {
            let mut v = [[0u32; 4]; UNROLL];
            for (k, slot) in v.iter_mut().enumerate() {
                if i + k * stride < n {
                    *slot = load(s.add(i + k * stride));
                }
            }
            for (k, slot) in v.iter().enumerate() {
                if i + k * stride < n {
                    arch::store_v4(d.add(i + k * stride), *slot);
                }
            }
        }
        if let Some(b) = head_byte {
            dst.add(rank).write(b);
        }
        if let Some(b) = tail_byte {
            dst.add(tail_start + rank).write(b);
        }
        // Fewer than 16 threads: the rest of the head and tail.
        let mut i = rank + stride;
        while i < head.max(tail) {
            if i < head {
                dst.add(i).write(src.add(i).read());
            }
            if i < tail {
                dst.add(tail_start + i).write(src.add(tail_start + i).read());
            }
            i += stride;
        }
    }
}

/// The copy when `src` and `dst` differ in their misalignment: the widest word both allow, then
/// bytes.
#[inline(always)]
unsafe fn copy_mismatched(dst: *mut u8, src: *const u8, bytes: usize, rank: usize, stride: usize) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let align = (dst as usize) | (src as usize);
        let done = if align & 7 == 0 {
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
}

/// A copy by one thread through Hopper's bulk-copy unit (TMA): the thread streams `src` through
/// shared-memory stages into `dst` (which may be a peer GPU's memory) and returns once every write
/// has completed. The SM's load/store pipeline stays free: one thread moves what a block of SM
/// copies would (measured on 2× H200 NVLink: the same bandwidth from 2 MiB per block up,
/// docs/benchmarks.md), while the block's other threads compute. The kernel reserves 32 KiB of
/// static shared memory for the stages.
///
/// Bytes outside the 16-byte aligned middle are copied by the thread itself; when `src` and `dst`
/// differ in their 16-byte misalignment the whole copy is ordinary loads and stores.
/// `Err(elapsed_ns)` when a stage's load did not land within `timeout_ns` (a device fault).
///
/// # Safety
/// As [`copy_cooperative`]; the caller has made other threads' writes to `src` visible to this
/// thread (a block barrier, or a fence and a flag).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn copy_bulk(dst: *mut u8, src: *const u8, bytes: usize, timeout_ns: u64) -> Result<(), u64> {
    // SAFETY: this function's `# Safety` contract (readable `src`, writable `dst`, both `bytes`
    // long) covers every copy below, each inside those ranges.
    unsafe {
        if ((dst as usize) ^ (src as usize)) & 15 != 0 {
            copy_cooperative(dst, src, bytes, 0, 1);
            return Ok(());
        }
        let head = ((16 - (dst as usize & 15)) & 15).min(bytes);
        let mid = (bytes - head) & !15;
        let tail_start = head + mid;
        copy_cooperative(dst, src, head, 0, 1);
        copy_cooperative(dst.add(tail_start), src.add(tail_start), bytes - tail_start, 0, 1);
        bulk_stream(dst.add(head), src.add(head), mid, timeout_ns)
    }
}

/// [`copy_bulk`]'s aligned middle: `bytes` (a multiple of 16, both pointers 16-byte
/// aligned) in `BULK_CHUNK_BYTES` chunks through `BULK_STAGES` stages, loads running ahead of
/// stores. Out of line: one thread's loop, kept out of the callers' register budget.
#[cfg(target_arch = "nvptx64")]
#[inline(never)]
unsafe fn bulk_stream(dst: *mut u8, src: *const u8, bytes: usize, timeout_ns: u64) -> Result<(), u64> {
    // SAFETY: the caller passes 16-byte aligned ranges of `bytes` (a multiple of 16) that
    // `copy_bulk`'s contract makes readable and writable; the stages and their mbarriers are this
    // thread's staging area (`bulk_staging`), initialised here and invalidated before returning.
    unsafe {
        use arch::{BULK_CHUNK_BYTES as CHUNK, BULK_STAGES as STAGES};
        if bytes == 0 {
            return Ok(());
        }
        let base = arch::bulk_staging();
        let bar = |s: u32| base + 8 * s as u64;
        let stage = |s: u32| base + 128 + (s * CHUNK) as u64;
        let chunks = bytes.div_ceil(CHUNK as usize) as u32;
        let len = |i: u32| (bytes - i as usize * CHUNK as usize).min(CHUNK as usize) as u32;
        let load = |i: u32| {
            let s = i % STAGES;
            arch::mbarrier_arrive_expect_tx(bar(s), len(i));
            arch::bulk_load_to_shared(stage(s), src.add(i as usize * CHUNK as usize), len(i), bar(s));
        };
        for s in 0..STAGES {
            arch::mbarrier_init(bar(s), 1);
        }
        arch::fence_mbarrier_init();
        // The block's generic writes to `src` (ordered before us by the barrier) before the bulk reads.
        arch::fence_proxy_async();
        // One stage stays free, so the store that last used a stage may still be reading it.
        let ahead = (STAGES - 1).min(chunks);
        for i in 0..ahead {
            load(i);
        }
        let mut result = Ok(());
        'chunks: for i in 0..chunks {
            let s = i % STAGES;
            let mut deadline = crate::deadline::Spin::new(timeout_ns);
            while !arch::mbarrier_try_wait_parity(bar(s), (i / STAGES) & 1) {
                if let Some(elapsed) = deadline.tick() {
                    result = Err(elapsed);
                    break 'chunks;
                }
            }
            arch::bulk_store_from_shared(dst.add(i as usize * CHUNK as usize), stage(s), len(i));
            arch::bulk_commit_group();
            let next = i + ahead;
            if next < chunks && next >= STAGES {
                // Stage `next % STAGES` was last read by store `next - STAGES`; every store but the
                // newest has finished reading, which covers it.
                arch::bulk_wait_read_but_one();
            }
            if next < chunks {
                load(next);
            }
        }
        arch::bulk_wait_all();
        // The bulk writes before this thread's later generic accesses (a quiet's fence, a signal).
        arch::fence_proxy_async();
        for s in 0..STAGES {
            arch::mbarrier_inval(bar(s));
        }
        result
    }
}

#[inline(always)]
unsafe fn copy_words<W: Copy>(dst: *mut u8, src: *const u8, bytes: usize, rank: usize, stride: usize) -> usize {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
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

/// `value`'s bytes in the low bytes of a `u64` (little-endian, the rest zero): how a `p`'s value
/// travels in a proxy descriptor or an inline WQE.
#[inline(always)]
pub(crate) fn word_bits<T: Word>(value: T) -> u64 {
    const { assert!(core::mem::size_of::<T>() <= 8, "a word is at most 8 bytes") };
    let mut bits = 0u64;
    // SAFETY: `size_of::<T>()` <= 8 bytes (checked at compile time) of a live value into a u64.
    unsafe {
        core::ptr::copy_nonoverlapping(
            &value as *const T as *const u8,
            &mut bits as *mut u64 as *mut u8,
            core::mem::size_of::<T>(),
        )
    };
    bits
}

/// Stores `v` at `p` as one relaxed, system-scope, single-copy-atomic access (`p`'s direct path:
/// another thread may `g`, `p` or wait on the same word). On the GPU a volatile store of the
/// word's width is that (PTX treats `st.volatile` on global memory as `st.relaxed.sys`); on the
/// host it is a `Relaxed` atomic store of the same width.
///
/// # Safety
/// `p` is valid for writes and aligned to `size_of::<T>()` (1, 2, 4 or 8 bytes), and every
/// concurrent access to it is atomic.
#[inline(always)]
pub(crate) unsafe fn store_word_relaxed<T: Word>(p: *mut T, v: T) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: this function's contract.
    unsafe {
        p.write_volatile(v)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: this function's contract; `T` has no padding and is as wide as the atomic type, so
    // its bits are the atomic's value.
    unsafe {
        use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
        match core::mem::size_of::<T>() {
            1 => AtomicU8::from_ptr(p as *mut u8).store(core::mem::transmute_copy(&v), Relaxed),
            2 => AtomicU16::from_ptr(p as *mut u16).store(core::mem::transmute_copy(&v), Relaxed),
            4 => AtomicU32::from_ptr(p as *mut u32).store(core::mem::transmute_copy(&v), Relaxed),
            _ => AtomicU64::from_ptr(p as *mut u64).store(core::mem::transmute_copy(&v), Relaxed),
        }
    }
}

/// Loads the word at `p` as one relaxed, system-scope, single-copy-atomic access (the pair of
/// [`store_word_relaxed`]).
///
/// # Safety
/// As [`store_word_relaxed`], for reads.
#[inline(always)]
pub(crate) unsafe fn load_word_relaxed<T: Word>(p: *const T) -> T {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: this function's contract.
    unsafe {
        p.read_volatile()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: this function's contract; every bit pattern of the width is a valid `T` (`Word`).
    unsafe {
        use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
        match core::mem::size_of::<T>() {
            1 => core::mem::transmute_copy(&AtomicU8::from_ptr(p as *mut u8).load(Relaxed)),
            2 => core::mem::transmute_copy(&AtomicU16::from_ptr(p as *mut u16).load(Relaxed)),
            4 => core::mem::transmute_copy(&AtomicU32::from_ptr(p as *mut u32).load(Relaxed)),
            _ => core::mem::transmute_copy(&AtomicU64::from_ptr(p as *mut u64).load(Relaxed)),
        }
    }
}

/// The word types the device atomics operate on: `u32`, `u64`, `i32`, `i64` (NVSHMEM's standard
/// AMO types, and what an mlx5 NIC can do natively).
///
/// Every operation is a system-scope atomic (another GPU, the CPU or a NIC may touch the word),
/// with relaxed ordering, as in OpenSHMEM: order them with [`crate::Shmem::fence`] or
/// [`crate::Shmem::quiet`]. Use one width per word: 4- and 8-byte atomics racing on the same
/// address are well defined on a GPU and a NIC but not in the host's (Rust's) memory model, which
/// the CPU emulation runs under.
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
    /// Bitwise and; returns the old value.
    ///
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn fetch_and(p: *mut Self, v: Self) -> Self;
    /// Bitwise or; returns the old value.
    ///
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn fetch_or(p: *mut Self, v: Self) -> Self;
    /// Bitwise exclusive or; returns the old value.
    ///
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn fetch_xor(p: *mut Self, v: Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn load(p: *const Self) -> Self;
    /// An acquire load (system scope).
    ///
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn load_acquire(p: *const Self) -> Self;
    /// # Safety
    /// As [`AtomicWord::fetch_add`].
    unsafe fn store(p: *mut Self, v: Self);
    /// The value's bits, zero-extended to 64 (what an IBGDA atomic WQE carries).
    fn to_bits(self) -> u64;
    /// The value from the low `BYTES` bytes of `bits`.
    fn from_bits(bits: u64) -> Self;
    /// Whether the type is signed (comparisons order it as signed).
    const SIGNED: bool;
    /// A `u64` that orders as the value does (signed values sign-extended with the sign bit
    /// flipped), so one unsigned comparison serves every word type.
    #[inline(always)]
    fn order_key(self) -> u64 {
        let bits = self.to_bits();
        if Self::SIGNED {
            let shift = 64 - 8 * Self::BYTES as u32;
            (((bits << shift) as i64 >> shift) as u64) ^ (1 << 63)
        } else {
            bits
        }
    }
}

macro_rules! atomic_word {
    ($t:ty, $u:ty, $signed:literal, $add:ident, $cas:ident, $swap:ident, $load:ident, $acquire:ident, $store:ident,
     $and:ident, $or:ident, $xor:ident) => {
        impl AtomicWord for $t {
            const BYTES: usize = core::mem::size_of::<$t>();
            const SIGNED: bool = $signed;
            #[inline(always)]
            unsafe fn fetch_add(p: *mut Self, v: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$add(p as *mut $u, v as $u) as $t }
            }
            #[inline(always)]
            unsafe fn compare_swap(p: *mut Self, expected: Self, new: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$cas(p as *mut $u, expected as $u, new as $u) as $t }
            }
            #[inline(always)]
            unsafe fn swap(p: *mut Self, v: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$swap(p as *mut $u, v as $u) as $t }
            }
            #[inline(always)]
            unsafe fn fetch_and(p: *mut Self, v: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$and(p as *mut $u, v as $u) as $t }
            }
            #[inline(always)]
            unsafe fn fetch_or(p: *mut Self, v: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$or(p as *mut $u, v as $u) as $t }
            }
            #[inline(always)]
            unsafe fn fetch_xor(p: *mut Self, v: Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$xor(p as *mut $u, v as $u) as $t }
            }
            #[inline(always)]
            unsafe fn load(p: *const Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$load(p as *const $u) as $t }
            }
            #[inline(always)]
            unsafe fn load_acquire(p: *const Self) -> Self {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$acquire(p as *const $u) as $t }
            }
            #[inline(always)]
            unsafe fn store(p: *mut Self, v: Self) {
                // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
                unsafe { arch::$store(p as *mut $u, v as $u) }
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
    false,
    atomic_add_relaxed_sys_u32,
    atomic_cas_relaxed_sys_u32,
    atomic_swap_relaxed_sys_u32,
    load_relaxed_sys_u32,
    load_acquire_sys_u32,
    store_relaxed_sys_u32,
    atomic_and_relaxed_sys_u32,
    atomic_or_relaxed_sys_u32,
    atomic_xor_relaxed_sys_u32
);
atomic_word!(
    i32,
    u32,
    true,
    atomic_add_relaxed_sys_u32,
    atomic_cas_relaxed_sys_u32,
    atomic_swap_relaxed_sys_u32,
    load_relaxed_sys_u32,
    load_acquire_sys_u32,
    store_relaxed_sys_u32,
    atomic_and_relaxed_sys_u32,
    atomic_or_relaxed_sys_u32,
    atomic_xor_relaxed_sys_u32
);
atomic_word!(
    u64,
    u64,
    false,
    atomic_add_relaxed_sys_u64,
    atomic_cas_relaxed_sys_u64,
    atomic_swap_relaxed_sys_u64,
    load_relaxed_sys_u64,
    load_acquire_sys_u64,
    store_relaxed_sys_u64,
    atomic_and_relaxed_sys_u64,
    atomic_or_relaxed_sys_u64,
    atomic_xor_relaxed_sys_u64
);
atomic_word!(
    i64,
    u64,
    true,
    atomic_add_relaxed_sys_u64,
    atomic_cas_relaxed_sys_u64,
    atomic_swap_relaxed_sys_u64,
    load_relaxed_sys_u64,
    load_acquire_sys_u64,
    store_relaxed_sys_u64,
    atomic_and_relaxed_sys_u64,
    atomic_or_relaxed_sys_u64,
    atomic_xor_relaxed_sys_u64
);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::{copy_cooperative, AtomicWord};

    #[test]
    fn order_keys_order_as_the_values_do() {
        let i: [i64; 6] = [i64::MIN, -5, -1, 0, 1, i64::MAX];
        let j: [i32; 6] = [i32::MIN, -5, -1, 0, 1, i32::MAX];
        let u: [u32; 4] = [0, 1, 0x8000_0000, u32::MAX];
        for w in i.windows(2) {
            assert!(w[0].order_key() < w[1].order_key(), "{w:?}");
        }
        for w in j.windows(2) {
            assert!(w[0].order_key() < w[1].order_key(), "{w:?}");
        }
        for w in u.windows(2) {
            assert!(w[0].order_key() < w[1].order_key(), "{w:?}");
        }
        assert_eq!((-1i32).order_key(), (-1i64).order_key());
    }
    use std::vec::Vec;

    #[test]
    fn cooperative_copy_is_exact_at_every_alignment_and_thread_count() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        // Offsets and lengths of whole 4- and 8-byte words too (one thread copies those word by
        // word).
        for (s_off, d_off) in [
            (0, 0),
            (3, 3),
            (15, 15),
            (1, 0),
            (8, 0),
            (4, 12),
            (5, 9),
            (8, 8),
            (4, 4),
            (12, 4),
        ] {
            for len in [0usize, 1, 4, 8, 12, 15, 16, 17, 255, 1000, 3000] {
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

//! put / get (thread, warp, block; blocking and `_nbi`) and p / g.

use super::{scoped_entry_points, Route, Scope, Shmem};
use crate::arch;
use crate::ibgda::{Rdma, Ring};
use crate::memory::{copy_cooperative, Word};
use ibgda_abi::ibgda::LANDING_SLOT_BYTES;
use ibgda_abi::mlx5::MAX_INLINE_BYTES;
use ibgda_abi::proxy::{op as proxy_op, ProxyDescriptor, NO_LANDING};
use ibgda_abi::Op;

impl Shmem {
    // ---------------------------------------------------------------- RMA

    /// A put's or get's copy over loads and stores (P2P, or this PE), shared by the scope's
    /// threads. (Hopper's bulk-copy unit was measured here too: no faster for a block at any size
    /// on H200 NVLink, slower below 2 MiB per block; it backs [`Shmem::put_bulk`] instead.)
    ///
    /// # Safety
    /// `src..src+bytes` readable, `dst..dst+bytes` writable, not overlapping; every thread of the
    /// scope calls it with the same arguments.
    #[inline(always)]
    unsafe fn copy_direct(&self, scope: Scope, dst: *mut u8, src: *const u8, bytes: usize) {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            let (rank, size) = scope.rank_and_size();
            copy_cooperative(dst, src, bytes, rank, size)
        }
    }

    /// Copies `count` elements from local `src` to symmetric `dst` on `pe` **from one thread**,
    /// leaving the SM's load/store pipeline to the rest of the block: over P2P the copy runs on
    /// Hopper's bulk-copy unit (TMA) through 32 KiB of static shared memory that the calling
    /// kernel reserves; over a NIC or the proxy it is [`Shmem::put`] (the NIC already copies).
    /// Returns when `src` may be reused and, over P2P, when the data is written; delivery to other
    /// observers is guaranteed by [`Shmem::quiet`] as for every put. On the CPU emulation it is
    /// `put`.
    ///
    /// # Safety
    /// As [`Shmem::put`].
    #[inline(always)]
    pub unsafe fn put_bulk<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        let sh = &self.at(Op::PutBulk);
        let bytes = count * core::mem::size_of::<T>();
        #[cfg(target_arch = "nvptx64")]
        if let Some(remote) = sh.direct(dst as u64, bytes as u64, pe) {
            // SAFETY: `remote` is inside `pe`'s heap (checked); `src` is the caller's buffer.
            if let Err(elapsed) =
                unsafe { crate::memory::copy_bulk(remote as *mut u8, src as *const u8, bytes, sh.timeout_ns) }
            {
                sh.bulk_timeout(src as u64, bytes as u64, pe, elapsed);
            }
            return;
        }
        let _ = bytes;
        // SAFETY: the caller's contract is `put`'s.
        unsafe { sh.put(dst, src, count, pe) }
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn bulk_timeout(&self, src: u64, bytes: u64, pe: u32, elapsed: u64) -> ! {
        let (error, my_pe, op) = self.blame();
        bulk_timeout(error, my_pe, op, src, bytes, pe, elapsed)
    }

    /// # Safety
    /// As [`Shmem::put_nbi`] (and [`Shmem::put`] when `blocking`).
    #[inline(always)]
    pub(super) unsafe fn put_scoped<T: Copy>(
        &self,
        scope: Scope,
        dst: *mut T,
        src: *const T,
        count: usize,
        pe: u32,
        blocking: bool,
    ) {
        let bytes = count * core::mem::size_of::<T>();
        // SAFETY: this function's contract is `rma_scoped`'s for a WRITE from `src`.
        unsafe { self.rma_scoped(scope, Rdma::Write, src as u64, dst as u64, bytes, pe, blocking, false) }
    }

    /// The data of a `put_signal` (non-blocking): as [`Shmem::put_scoped`], but over a NIC the
    /// WRITE leaves the doorbell to the signal that the same thread posts next, so both go out
    /// with one ring (and the NIC sees them in one batch).
    ///
    /// # Safety
    /// As [`Shmem::put_nbi`]; the scope's rank 0 posts the signal right after.
    #[inline(always)]
    pub(super) unsafe fn put_scoped_before_signal<T: Copy>(
        &self,
        scope: Scope,
        dst: *mut T,
        src: *const T,
        count: usize,
        pe: u32,
    ) {
        let bytes = count * core::mem::size_of::<T>();
        // SAFETY: this function's contract is `rma_scoped`'s for a WRITE from `src`.
        unsafe { self.rma_scoped(scope, Rdma::Write, src as u64, dst as u64, bytes, pe, false, true) }
    }

    /// # Safety
    /// As [`Shmem::get_nbi`] (and [`Shmem::get`] when `blocking`).
    #[inline(always)]
    pub(super) unsafe fn get_scoped<T: Copy>(
        &self,
        scope: Scope,
        dst: *mut T,
        src: *const T,
        count: usize,
        pe: u32,
        blocking: bool,
    ) {
        let bytes = count * core::mem::size_of::<T>();
        // SAFETY: this function's contract is `rma_scoped`'s for a READ into `dst`.
        unsafe { self.rma_scoped(scope, Rdma::Read, dst as u64, src as u64, bytes, pe, blocking, false) }
    }

    /// One put (`dir` = WRITE: local `local` to symmetric `symmetric` on `pe`) or get (READ: the
    /// other way) of `bytes`, by the threads of `scope`, over whichever transport reaches `pe`.
    ///
    /// # Safety
    /// `local..local+bytes` is this GPU's memory, readable (WRITE) or writable and accessed by
    /// nobody else (READ), for the call, and until the next `quiet` unless `blocking`. With
    /// `before_signal`, the scope's rank 0 posts a signal to the same QP right after.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rma_scoped(
        &self,
        scope: Scope,
        dir: Rdma,
        local: u64,
        symmetric: u64,
        bytes: usize,
        pe: u32,
        blocking: bool,
        before_signal: bool,
    ) {
        let (rank, _) = scope.rank_and_size();
        let write = dir == Rdma::Write;
        match self.route(symmetric, bytes as u64, pe) {
            Route::Direct(remote) => {
                let (dst, src) = if write { (remote, local) } else { (local, remote) };
                // SAFETY: `remote` is inside `pe`'s heap (checked); `local` is the caller's buffer.
                unsafe { self.copy_direct(scope, dst as *mut u8, src as *const u8, bytes) }
            }
            Route::Nic(qp, raddr) => {
                let lkey = self.registered(&qp, local, bytes as u64, pe);
                scope.sync();
                if rank == 0 && bytes > 0 {
                    // The NIC reads `local`, which the scope's other threads may have just
                    // written. No fence is needed for it: the barrier above orders their writes
                    // before this thread's post, and the post publishes its range with a release
                    // at the QP's scope (the ready mark), which PTX makes cumulative, so a NIC
                    // that acquires the doorbell sees them (as NVSHMEM's block puts do: a barrier,
                    // then the post's own fence).
                    let ring = match (blocking, before_signal) {
                        (true, _) => Ring::Now,
                        (false, true) => Ring::Defer,
                        (false, false) => Ring::Auto,
                    };
                    // SAFETY: `local` is the caller's, left alone until this returns (blocking) or
                    // until `quiet` (`_nbi`): this function's contract.
                    let end = unsafe { self.nic_rdma(&qp, dir, local, lkey, raddr, bytes as u64, ring) };
                    if blocking {
                        qp.wait(end);
                    }
                }
            }
            Route::Proxy(ch, off) => {
                scope.sync();
                if rank == 0 && bytes > 0 {
                    if write && scope != Scope::Thread {
                        // The NIC reads `local`: make the other threads' writes to it visible.
                        arch::fence_sc_sys();
                    }
                    let op = if write { proxy_op::PUT } else { proxy_op::GET };
                    let end = self.proxy_rma(&ch, op, local, bytes as u64, pe, off);
                    if blocking {
                        ch.wait(end, pe);
                    }
                }
            }
        }
    }

    scoped_entry_points! {
        put_scoped(dst: *mut T, src: *const T, count: usize, pe: u32);
        safety: "`src..src+count` is readable device memory of this GPU for the duration of the call (the \
                 device API checks `dst` and `pe`, never a local buffer).";
        nbi_safety: "And `src` is neither written nor freed until this thread's next [`Shmem::quiet`]: a NIC or \
                     the proxy may still read it.";
        /// Copies `count` elements from local `src` to symmetric `dst` on `pe`; returns once `src`
        /// may be reused. Delivery is guaranteed by [`Shmem::quiet`].
        put = Put;
        /// Non-blocking [`Shmem::put`]: `src` may be reused only after [`Shmem::quiet`]. (Over P2P
        /// the stores are issued before the call returns, so it behaves like `put`.)
        put_nbi = PutNbi;
        put_warp = PutWarp, put_nbi_warp = PutNbiWarp,
        put_block = PutBlock, put_nbi_block = PutNbiBlock;
    }

    scoped_entry_points! {
        get_scoped(dst: *mut T, src: *const T, count: usize, pe: u32);
        safety: "`dst..dst+count` is writable device memory of this GPU that nothing else accesses during the \
                 call (the device API checks `src` and `pe`, never a local buffer).";
        nbi_safety: "And `dst` is neither read nor written by anyone else until this thread's next \
                     [`Shmem::quiet`]: a NIC or the proxy may still write it.";
        /// Copies `count` elements from symmetric `src` on `pe` to local `dst`; returns when `dst`
        /// holds them.
        get = Get;
        /// Non-blocking [`Shmem::get`]: `dst` is valid after [`Shmem::quiet`]. (Over P2P the loads
        /// have completed when the call returns.)
        get_nbi = GetNbi;
        get_warp = GetWarp, get_nbi_warp = GetNbiWarp,
        get_block = GetBlock, get_nbi_block = GetNbiBlock;
    }

    /// Stores one value to symmetric `dst` on `pe` (NVSHMEM's `p`). Over IBGDA the lanes of a
    /// warp that call it together for consecutive elements (lane `l + 1` the element after lane
    /// `l`'s, the usual `dst + thread` pattern) share WQEs, as NVSHMEM combines them: 32 `u64`s
    /// take 11 WQEs instead of 32, 32 `u32`s 5 (see [`Qp::post_inline_value`]); each value lands
    /// as it would alone.
    ///
    /// [`Qp::post_inline_value`]: crate::ibgda::Qp::post_inline_value
    #[inline(always)]
    pub fn p<T: Word>(&self, dst: *mut T, value: T, pe: u32) {
        let sh = &self.at(Op::P);
        const {
            assert!(
                core::mem::size_of::<T>() as u32 <= MAX_INLINE_BYTES && core::mem::size_of::<T>() <= 8,
                "p: values are at most 8 bytes"
            )
        };
        // A word is accessed whole: its address must be aligned to its size on every route.
        sh.check_aligned(dst as u64, core::mem::size_of::<T>(), pe);
        match sh.route(dst as u64, core::mem::size_of::<T>() as u64, pe) {
            // SAFETY: inside `pe`'s heap (checked) and aligned (checked); every device-API access
            // to a word is atomic.
            Route::Direct(remote) => unsafe { crate::memory::store_word_relaxed(remote as *mut T, value) },
            // A warp's lanes writing consecutive words share WQEs (see `post_inline_value`).
            Route::Nic(qp, raddr) => qp.post_inline_value(raddr, qp.heap_rkey(), value),
            Route::Proxy(ch, off) => {
                ch.post(
                    pe,
                    proxy_op::P,
                    core::mem::size_of::<T>() as u8,
                    NO_LANDING,
                    ProxyDescriptor::target_word(pe, off),
                    crate::memory::word_bits(value),
                    0,
                );
            }
        }
    }

    /// Strided put (NVSHMEM's `iput`): `src[i * src_stride]` goes to `dst[i * dst_stride]` on
    /// `pe`, for `i < count` (strides in elements). Element by element, as [`Shmem::p`]s (over
    /// IBGDA a warp's lanes putting consecutive words share WQEs), so it suits scattered words,
    /// not bulk data. Returns once `src` may be reused; the values are delivered at
    /// [`Shmem::quiet`], like a put's. The PE and the whole of `dst`'s span (first to last
    /// element) are checked, against the heap and for alignment, before any element moves; a
    /// `count` of 0 does nothing. Strides are unsigned (NVSHMEM's are `ptrdiff_t`): a negative
    /// stride cast to `usize` spans past any heap and is refused.
    ///
    /// # Safety
    /// `src[i * src_stride]` is readable for every `i < count` (local memory, any device memory).
    #[inline(always)]
    pub unsafe fn iput<T: Word>(
        &self,
        dst: *mut T,
        src: *const T,
        dst_stride: usize,
        src_stride: usize,
        count: usize,
        pe: u32,
    ) {
        let sh = &self.at(Op::Iput);
        if count == 0 {
            return;
        }
        sh.check_strided(dst as u64, dst_stride, count, core::mem::size_of::<T>(), pe);
        for i in 0..count {
            // SAFETY: this function's contract.
            let v = unsafe { src.wrapping_add(i * src_stride).read() };
            sh.p(dst.wrapping_add(i * dst_stride), v, pe);
        }
    }

    /// Strided get (NVSHMEM's `iget`): `src[i * src_stride]` on `pe` comes to
    /// `dst[i * dst_stride]` here, for `i < count`. Element by element, as [`Shmem::g`]s (each a
    /// round trip over a NIC or the proxy); complete when it returns. `src`'s whole span is
    /// checked against `pe`'s heap and its alignment before any element moves.
    ///
    /// # Safety
    /// `dst[i * dst_stride]` is writable for every `i < count` (local memory, any device memory).
    #[inline(always)]
    pub unsafe fn iget<T: Word>(
        &self,
        dst: *mut T,
        src: *const T,
        dst_stride: usize,
        src_stride: usize,
        count: usize,
        pe: u32,
    ) {
        let sh = &self.at(Op::Iget);
        if count == 0 {
            return;
        }
        sh.check_strided(src as u64, src_stride, count, core::mem::size_of::<T>(), pe);
        for i in 0..count {
            let v = sh.g(src.wrapping_add(i * src_stride), pe);
            // SAFETY: this function's contract.
            unsafe { dst.wrapping_add(i * dst_stride).write(v) };
        }
    }

    /// Checks `pe`, then a strided array's span (its first to its last element) against `pe`'s
    /// heap and its alignment, before a strided call moves anything (a span that overflows is
    /// outside any heap).
    #[inline(always)]
    fn check_strided(&self, addr: u64, stride: usize, count: usize, size: usize, pe: u32) {
        let _ = self.peer(pe);
        let span = ((count as u64 - 1).saturating_mul(stride as u64).saturating_add(1)).saturating_mul(size as u64);
        self.check_aligned(addr, size, pe);
        self.heap_offset(addr, span, pe);
    }

    /// Loads one value from symmetric `src` on `pe` (NVSHMEM's `g`).
    #[inline(always)]
    pub fn g<T: Word>(&self, src: *const T, pe: u32) -> T {
        let sh = &self.at(Op::G);
        const {
            assert!(
                core::mem::size_of::<T>() as u64 <= LANDING_SLOT_BYTES,
                "g: value larger than 8 bytes"
            )
        };
        let bytes = core::mem::size_of::<T>() as u64;
        sh.check_aligned(src as u64, bytes as usize, pe);
        match sh.route(src as u64, bytes, pe) {
            // SAFETY: inside `pe`'s heap (checked) and aligned (checked); every device-API access
            // to a word is atomic.
            Route::Direct(remote) => unsafe { crate::memory::load_word_relaxed(remote as *const T) },
            Route::Nic(qp, raddr) => {
                let ticket = qp.take_landing_slot();
                let slot = qp.landing_addr(ticket.ticket);
                // SAFETY: our landing slot (its ticket), read only after the wait below.
                let end = unsafe {
                    qp.post_rdma(
                        Rdma::Read,
                        slot,
                        qp.landing_lkey(),
                        raddr,
                        qp.heap_rkey(),
                        bytes as u32,
                        true,
                    )
                };
                qp.wait(end);
                // SAFETY: our landing slot, filled by the READ we waited for.
                let v = unsafe { (slot as *const T).read_volatile() };
                qp.release_landing_slot(ticket);
                v
            }
            Route::Proxy(ch, off) => {
                let v = ch.fetch(
                    pe,
                    proxy_op::G,
                    bytes as u8,
                    ProxyDescriptor::target_word(pe, off),
                    0,
                    0,
                    8,
                );
                // SAFETY: `T` is at most 8 bytes (checked at compile time) and a `Word`, valid for
                // any bits; the landing slot held the value's bytes, little-endian, in the low
                // bytes of the word.
                unsafe { core::mem::transmute_copy::<u64, T>(&v) }
            }
        }
    }
}

/// Reports a bulk copy that did not finish in time (scalars only, as every cold report path).
#[cfg(target_arch = "nvptx64")]
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn bulk_timeout(error: u64, my_pe: u32, op: u32, src: u64, bytes: u64, pe: u32, elapsed: u64) -> ! {
    let mut f = crate::fail::Failure::new(ibgda_abi::ErrorKind::Timeout);
    f.detail = ibgda_abi::WaitKind::BulkCopy as u32;
    f.peer = pe;
    f.address = src;
    f.size = bytes;
    f.elapsed_ns = elapsed;
    f.op = op;
    crate::fail::report(error, my_pe, f)
}

//! [`Shmem`]: a kernel's handle on its PE's device state, and the device API on top of it.

use crate::arch;
use crate::fail::{report, Failure};
use crate::ibgda::{AtomicOp, Qp, Rdma, Reporter};
use crate::memory::{copy_cooperative, AtomicWord};
use ibgda_abi::ibgda::{QpDescriptor, LANDING_SLOT_BYTES};
use ibgda_abi::mlx5::{MAX_INLINE_BYTES, MAX_MESSAGE_BYTES};
use ibgda_abi::{
    Cmp, DeviceState, ErrorKind, HeapHeader, PeerInfo, SignalOp, TransportKind, WaitKind, ABI_MAGIC, ABI_VERSION,
};

/// Which threads cooperate in one call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Thread,
    Warp,
    Block,
}

impl Scope {
    /// (this thread's rank, number of threads) within the scope.
    #[inline(always)]
    fn rank_and_size(self) -> (u32, u32) {
        match self {
            Scope::Thread => (0, 1),
            Scope::Warp => (arch::lane_id(), arch::WARP_SIZE),
            Scope::Block => (arch::thread_rank_in_block(), arch::block_size()),
        }
    }

    #[inline(always)]
    fn sync(self) {
        match self {
            Scope::Thread => {}
            Scope::Warp => arch::sync_warp(),
            Scope::Block => arch::sync_threads(),
        }
    }
}

/// A kernel's view of its PE: identity, heap geometry and the peer table, loaded once from the
/// [`DeviceState`] the host prepared.
///
/// Pointers passed to its methods are *symmetric addresses*: addresses inside this PE's own heap
/// (as returned to the host by `malloc`), which name the same offset in every PE's heap. Local
/// source or destination buffers (`src` of a put, `dst` of a get) may be any device memory.
///
/// Warp-scope methods must be called by all 32 lanes of a warp with the same arguments; block-scope
/// methods by all threads of the block with the same arguments.
#[derive(Clone, Copy)]
pub struct Shmem {
    my_pe: u32,
    n_pes: u32,
    heap_base: u64,
    heap_size: u64,
    peers: *const PeerInfo,
    error: u64,
    timeout_ns: u64,
    qps: *const QpDescriptor,
    qps_per_peer: u32,
}

/// How one access reaches its peer.
#[derive(Clone, Copy)]
enum Route {
    /// Loads and stores at this address (P2P, or this PE itself).
    Direct(u64),
    /// WQEs on this QP, at this remote address.
    Nic(Qp, u64),
}

impl Shmem {
    /// Attaches to the state the host runtime prepared for this PE, checking that it was built for
    /// this version of the ABI (an attributed `AbiMismatch` error and a trap if not).
    ///
    /// # Safety
    /// `state` is the device-state pointer the `ibgda` host runtime passed to this kernel (or
    /// produced for a CPU-emulated PE), alive for as long as the returned handle is used.
    #[inline(always)]
    pub unsafe fn attach(state: *const DeviceState) -> Shmem {
        let s = &*state;
        if s.magic != ABI_MAGIC {
            // Not a device state at all: no field can be trusted, not even the error pointer.
            arch::trap();
        }
        if s.version != ABI_VERSION || s.size != DeviceState::SIZE {
            // `magic`, `version`, `size`, `my_pe` and `error` keep their offsets in every version.
            let mut f = Failure::new(ErrorKind::AbiMismatch);
            f.expected = ((ABI_VERSION as u64) << 32) | DeviceState::SIZE as u64;
            f.observed = ((s.version as u64) << 32) | s.size as u64;
            report(s.error, s.my_pe, f);
        }
        Shmem {
            my_pe: s.my_pe,
            n_pes: s.n_pes,
            heap_base: s.heap_base,
            heap_size: s.heap_size,
            peers: s.peers as *const PeerInfo,
            error: s.error,
            timeout_ns: s.timeout_ns,
            qps: s.qps as *const QpDescriptor,
            qps_per_peer: s.qps_per_peer,
        }
    }

    /// This PE's index.
    #[inline(always)]
    pub fn my_pe(&self) -> u32 {
        self.my_pe
    }

    /// Number of PEs.
    #[inline(always)]
    pub fn n_pes(&self) -> u32 {
        self.n_pes
    }

    /// Base of this PE's symmetric heap.
    #[inline(always)]
    pub fn heap_base(&self) -> *mut u8 {
        self.heap_base as *mut u8
    }

    /// The timeout every wait uses, in nanoseconds.
    #[inline(always)]
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    #[inline(always)]
    fn fail(&self, f: Failure) -> ! {
        report(self.error, self.my_pe, f)
    }

    #[inline(always)]
    fn peer(&self, pe: u32) -> PeerInfo {
        if pe >= self.n_pes {
            let mut f = Failure::new(ErrorKind::InvalidPe);
            f.peer = pe;
            f.observed = pe as u64;
            f.expected = self.n_pes as u64;
            self.fail(f);
        }
        // SAFETY: `peers` has `n_pes` entries (host contract) and `pe < n_pes`.
        unsafe { *self.peers.add(pe as usize) }
    }

    /// Offset of `[addr, addr+bytes)` in the heap, or an `OutsideHeap` error naming `pe`.
    #[inline(always)]
    fn heap_offset(&self, addr: u64, bytes: u64, pe: u32) -> u64 {
        let off = addr.wrapping_sub(self.heap_base);
        if off >= self.heap_size || bytes > self.heap_size - off {
            let mut f = Failure::new(ErrorKind::OutsideHeap);
            f.peer = pe;
            f.address = addr;
            f.size = bytes;
            f.expected = self.heap_size;
            f.observed = off;
            self.fail(f);
        }
        off
    }

    /// How symmetric `[addr, addr+bytes)` on `pe` is reached. Checks the PE, the bounds and the
    /// transport; writes nothing on failure.
    #[inline(always)]
    fn route(&self, addr: u64, bytes: u64, pe: u32) -> Route {
        let peer = self.peer(pe);
        let off = self.heap_offset(addr, bytes, pe);
        if peer.transport == TransportKind::P2p as u32 && peer.heap_base != 0 {
            Route::Direct(peer.heap_base + off)
        } else if peer.transport == TransportKind::Ibgda as u32 {
            let qp = self.qp(pe);
            Route::Nic(qp, qp.remote_addr(off))
        } else {
            self.unavailable(pe, peer.transport, addr, bytes)
        }
    }

    #[cold]
    #[inline(never)]
    fn unavailable(&self, pe: u32, transport: u32, addr: u64, bytes: u64) -> ! {
        let mut f = Failure::new(ErrorKind::TransportUnavailable);
        f.peer = pe;
        f.detail = transport;
        f.address = addr;
        f.size = bytes;
        self.fail(f)
    }

    /// The QP this thread uses to reach `pe`: one of the peer's QPs, chosen by block so that a
    /// block's operations to one peer stay ordered on one QP.
    #[inline(always)]
    fn qp(&self, pe: u32) -> Qp {
        let k = self.qps_per_peer;
        if self.qps.is_null() || k == 0 {
            self.unavailable(pe, TransportKind::Ibgda as u32, 0, 0);
        }
        // SAFETY: the table has n_pes * qps_per_peer entries (host contract) and pe < n_pes.
        let desc = unsafe { self.qps.add((pe * k + arch::block_idx_x() % k) as usize) };
        // SAFETY: as above; a zero QPN marks an entry the host did not fill.
        if unsafe { (*desc).qpn } == 0 {
            self.unavailable(pe, TransportKind::Ibgda as u32, 0, 0);
        }
        // SAFETY: a filled descriptor names live queues (host contract).
        unsafe { Qp::with_reporter(desc, self.reporter()) }
    }

    #[inline(always)]
    fn check_aligned(&self, addr: u64, width: usize, pe: u32) {
        if addr & (width as u64 - 1) != 0 {
            let mut f = Failure::new(ErrorKind::MisalignedAtomic);
            f.peer = pe;
            f.address = addr;
            f.size = width as u64;
            self.fail(f);
        }
    }

    #[inline(always)]
    fn reporter(&self) -> Reporter {
        Reporter {
            error: self.error,
            my_pe: self.my_pe,
            timeout_ns: self.timeout_ns,
        }
    }

    /// Checks that a local buffer of an IBGDA operation lies in this PE's heap (the registered
    /// memory region) and returns its lkey.
    #[inline(always)]
    fn registered(&self, qp: &Qp, addr: u64, bytes: u64, pe: u32) -> u32 {
        let off = addr.wrapping_sub(self.heap_base);
        if off >= self.heap_size || bytes > self.heap_size - off {
            let mut f = Failure::new(ErrorKind::UnregisteredBuffer);
            f.peer = pe;
            f.qp = qp.qpn();
            f.address = addr;
            f.size = bytes;
            f.expected = self.heap_size;
            f.observed = off;
            self.fail(f);
        }
        qp.heap_lkey()
    }

    /// Posts an RDMA WRITE or READ of `bytes` (split at the NIC's message limit). Returns the
    /// WQEBB index past the last WQE.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn nic_rdma(&self, qp: &Qp, op: Rdma, laddr: u64, lkey: u32, raddr: u64, bytes: u64, ring: bool) -> u64 {
        let mut off = 0;
        let mut end = 0;
        while off < bytes {
            let n = if bytes - off > MAX_MESSAGE_BYTES {
                MAX_MESSAGE_BYTES
            } else {
                bytes - off
            };
            end = qp.post_rdma(op, laddr + off, lkey, raddr + off, qp.heap_rkey(), n as u32, ring);
            off += n;
        }
        end
    }

    /// Posts an atomic; when `fetch`, waits for it and returns the previous value.
    #[inline(always)]
    fn nic_atomic(&self, qp: &Qp, raddr: u64, op: AtomicOp, fetch: bool) -> u64 {
        if !fetch {
            qp.post_atomic(op, qp.dummy_landing(), qp.landing_lkey(), raddr, qp.heap_rkey(), false);
            return 0;
        }
        let ticket = qp.take_landing_slot();
        let slot = qp.landing_addr(ticket);
        let end = qp.post_atomic(op, slot, qp.landing_lkey(), raddr, qp.heap_rkey(), true);
        qp.wait(end);
        // SAFETY: our landing slot, written by the NIC before the completion we waited for.
        let v = unsafe {
            if op.width() == 8 {
                core::ptr::read_volatile(slot as *const u64)
            } else {
                core::ptr::read_volatile(slot as *const u32) as u64
            }
        };
        qp.release_landing_slot(ticket);
        v
    }

    /// A pointer through which this thread can load and store `pe`'s copy of symmetric `addr`
    /// directly (NVSHMEM's `nvshmem_ptr`), or null when `pe` is not load/store reachable.
    #[inline(always)]
    pub fn ptr<T>(&self, addr: *const T, pe: u32) -> *mut T {
        let peer = self.peer(pe);
        let off = self.heap_offset(addr as u64, core::mem::size_of::<T>() as u64, pe);
        if peer.transport == TransportKind::P2p as u32 && peer.heap_base != 0 {
            (peer.heap_base + off) as *mut T
        } else {
            core::ptr::null_mut()
        }
    }

    // ---------------------------------------------------------------- RMA

    #[inline(always)]
    fn put_scoped<T: Copy>(&self, scope: Scope, dst: *mut T, src: *const T, count: usize, pe: u32, blocking: bool) {
        let bytes = count * core::mem::size_of::<T>();
        let (rank, size) = scope.rank_and_size();
        match self.route(dst as u64, bytes as u64, pe) {
            // SAFETY: `remote` is inside `pe`'s heap (checked); `src` is the caller's readable buffer.
            Route::Direct(remote) => unsafe {
                copy_cooperative(remote as *mut u8, src as *const u8, bytes, rank, size)
            },
            Route::Nic(qp, raddr) => {
                let lkey = self.registered(&qp, src as u64, bytes as u64, pe);
                scope.sync();
                if rank == 0 && bytes > 0 {
                    if scope != Scope::Thread {
                        // The NIC reads `src`: make the other threads' writes to it visible.
                        arch::fence_sc_sys();
                    }
                    let end = self.nic_rdma(&qp, Rdma::Write, src as u64, lkey, raddr, bytes as u64, blocking);
                    if blocking {
                        qp.wait(end);
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn get_scoped<T: Copy>(&self, scope: Scope, dst: *mut T, src: *const T, count: usize, pe: u32, blocking: bool) {
        let bytes = count * core::mem::size_of::<T>();
        let (rank, size) = scope.rank_and_size();
        match self.route(src as u64, bytes as u64, pe) {
            // SAFETY: `remote` is inside `pe`'s heap (checked); `dst` is the caller's writable buffer.
            Route::Direct(remote) => unsafe {
                copy_cooperative(dst as *mut u8, remote as *const u8, bytes, rank, size)
            },
            Route::Nic(qp, raddr) => {
                let lkey = self.registered(&qp, dst as u64, bytes as u64, pe);
                scope.sync();
                if rank == 0 && bytes > 0 {
                    let end = self.nic_rdma(&qp, Rdma::Read, dst as u64, lkey, raddr, bytes as u64, blocking);
                    if blocking {
                        qp.wait(end);
                    }
                }
            }
        }
    }

    /// Copies `count` elements from local `src` to symmetric `dst` on `pe`; returns once `src` may
    /// be reused. Delivery is guaranteed by [`Shmem::quiet`].
    #[inline(always)]
    pub fn put<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Thread, dst, src, count, pe, true)
    }
    /// Non-blocking [`Shmem::put`]: `src` may be reused only after [`Shmem::quiet`]. (Over P2P the
    /// stores are issued before the call returns, so it behaves like `put`.)
    #[inline(always)]
    pub fn put_nbi<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Thread, dst, src, count, pe, false)
    }
    /// [`Shmem::put`] by a whole warp, which shares the copy.
    #[inline(always)]
    pub fn put_warp<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Warp, dst, src, count, pe, true);
        Scope::Warp.sync();
    }
    /// [`Shmem::put_nbi`] by a whole warp.
    #[inline(always)]
    pub fn put_nbi_warp<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Warp, dst, src, count, pe, false)
    }
    /// [`Shmem::put`] by a whole block, which shares the copy.
    #[inline(always)]
    pub fn put_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Block, dst, src, count, pe, true);
        Scope::Block.sync();
    }
    /// [`Shmem::put_nbi`] by a whole block.
    #[inline(always)]
    pub fn put_nbi_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.put_scoped(Scope::Block, dst, src, count, pe, false)
    }

    /// Copies `count` elements from symmetric `src` on `pe` to local `dst`; returns when `dst`
    /// holds them.
    #[inline(always)]
    pub fn get<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Thread, dst, src, count, pe, true)
    }
    /// Non-blocking [`Shmem::get`]: `dst` is valid after [`Shmem::quiet`]. (Over P2P the loads have
    /// completed when the call returns.)
    #[inline(always)]
    pub fn get_nbi<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Thread, dst, src, count, pe, false)
    }
    /// [`Shmem::get`] by a whole warp.
    #[inline(always)]
    pub fn get_warp<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Warp, dst, src, count, pe, true);
        Scope::Warp.sync();
    }
    /// [`Shmem::get_nbi`] by a whole warp.
    #[inline(always)]
    pub fn get_nbi_warp<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Warp, dst, src, count, pe, false)
    }
    /// [`Shmem::get`] by a whole block.
    #[inline(always)]
    pub fn get_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Block, dst, src, count, pe, true);
        Scope::Block.sync();
    }
    /// [`Shmem::get_nbi`] by a whole block.
    #[inline(always)]
    pub fn get_nbi_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, pe: u32) {
        self.get_scoped(Scope::Block, dst, src, count, pe, false)
    }

    /// Stores one value to symmetric `dst` on `pe` (NVSHMEM's `p`).
    #[inline(always)]
    pub fn p<T: Copy>(&self, dst: *mut T, value: T, pe: u32) {
        const {
            assert!(
                core::mem::size_of::<T>() as u32 <= MAX_INLINE_BYTES,
                "p: value too large to inline"
            )
        };
        match self.route(dst as u64, core::mem::size_of::<T>() as u64, pe) {
            // SAFETY: inside `pe`'s heap (checked).
            Route::Direct(remote) => unsafe { (remote as *mut T).write_volatile(value) },
            Route::Nic(qp, raddr) => {
                // SAFETY: the bytes of a live local value.
                let bytes =
                    unsafe { core::slice::from_raw_parts(&value as *const T as *const u8, core::mem::size_of::<T>()) };
                qp.post_inline_write(raddr, qp.heap_rkey(), bytes, false);
            }
        }
    }

    /// Loads one value from symmetric `src` on `pe` (NVSHMEM's `g`).
    #[inline(always)]
    pub fn g<T: Copy>(&self, src: *const T, pe: u32) -> T {
        const {
            assert!(
                core::mem::size_of::<T>() as u64 <= LANDING_SLOT_BYTES,
                "g: value larger than 8 bytes"
            )
        };
        let bytes = core::mem::size_of::<T>() as u64;
        match self.route(src as u64, bytes, pe) {
            // SAFETY: inside `pe`'s heap (checked).
            Route::Direct(remote) => unsafe { (remote as *const T).read_volatile() },
            Route::Nic(qp, raddr) => {
                let ticket = qp.take_landing_slot();
                let slot = qp.landing_addr(ticket);
                let end = qp.post_rdma(
                    Rdma::Read,
                    slot,
                    qp.landing_lkey(),
                    raddr,
                    qp.heap_rkey(),
                    bytes as u32,
                    true,
                );
                qp.wait(end);
                // SAFETY: our landing slot, filled by the READ we waited for.
                let v = unsafe { (slot as *const T).read_volatile() };
                qp.release_landing_slot(ticket);
                v
            }
        }
    }

    // ---------------------------------------------------------------- atomics

    #[inline(always)]
    fn atomic_route<T: AtomicWord>(&self, dst: *const T, pe: u32) -> Route {
        self.check_aligned(dst as u64, T::BYTES, pe);
        self.route(dst as u64, T::BYTES as u64, pe)
    }

    /// A local word of this PE's heap (signals are waited on locally).
    #[inline(always)]
    fn local_word<T: AtomicWord>(&self, p: *const T) -> *mut T {
        self.check_aligned(p as u64, T::BYTES, self.my_pe);
        (self.heap_base + self.heap_offset(p as u64, T::BYTES as u64, self.my_pe)) as *mut T
    }

    /// Atomically adds `value` to symmetric `dst` on `pe`; returns the previous value.
    #[inline(always)]
    pub fn atomic_fetch_add<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) -> T {
        match self.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::fetch_add(t as *mut T, value) },
            Route::Nic(qp, r) => {
                T::from_bits(self.nic_atomic(&qp, r, AtomicOp::add(T::BYTES as u32, value.to_bits()), true))
            }
        }
    }
    /// Atomically adds `value` to symmetric `dst` on `pe` (complete after [`Shmem::quiet`]).
    #[inline(always)]
    pub fn atomic_add<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) {
        match self.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe {
                T::fetch_add(t as *mut T, value);
            },
            Route::Nic(qp, r) => {
                self.nic_atomic(&qp, r, AtomicOp::add(T::BYTES as u32, value.to_bits()), false);
            }
        }
    }
    /// Atomically replaces `dst` on `pe` with `value` if it equals `cond`; returns the previous value.
    #[inline(always)]
    pub fn atomic_compare_swap<T: AtomicWord>(&self, dst: *mut T, cond: T, value: T, pe: u32) -> T {
        match self.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::compare_swap(t as *mut T, cond, value) },
            Route::Nic(qp, r) => {
                let op = AtomicOp::compare_swap(T::BYTES as u32, cond.to_bits(), value.to_bits());
                T::from_bits(self.nic_atomic(&qp, r, op, true))
            }
        }
    }
    /// Atomically replaces `dst` on `pe` with `value`; returns the previous value.
    #[inline(always)]
    pub fn atomic_swap<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) -> T {
        match self.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::swap(t as *mut T, value) },
            Route::Nic(qp, r) => {
                T::from_bits(self.nic_atomic(&qp, r, AtomicOp::swap(T::BYTES as u32, value.to_bits()), true))
            }
        }
    }
    /// Atomically loads `src` on `pe`.
    #[inline(always)]
    pub fn atomic_fetch<T: AtomicWord>(&self, src: *const T, pe: u32) -> T {
        match self.atomic_route(src, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::load(t as *const T) },
            Route::Nic(qp, r) => T::from_bits(self.nic_atomic(&qp, r, AtomicOp::fetch(T::BYTES as u32), true)),
        }
    }
    /// Atomically stores `value` to `dst` on `pe` (complete after [`Shmem::quiet`]).
    #[inline(always)]
    pub fn atomic_set<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) {
        match self.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::store(t as *mut T, value) },
            Route::Nic(qp, r) => {
                self.nic_atomic(&qp, r, AtomicOp::swap(T::BYTES as u32, value.to_bits()), false);
            }
        }
    }

    // ---------------------------------------------------------------- signals

    /// Applies `op` with `value` to the signal word `sig` on `pe`, ordered after every write this
    /// thread issued to `pe` before (release semantics; over IBGDA, the same QP).
    #[inline(always)]
    pub fn signal_op(&self, sig: *mut u64, value: u64, op: SignalOp, pe: u32) {
        match self.atomic_route(sig, pe) {
            Route::Direct(t) => signal_direct(t, value, op),
            Route::Nic(qp, r) => {
                signal_nic(&qp, r, value, op);
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn put_signal_scoped<T: Copy>(
        &self,
        scope: Scope,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
        blocking: bool,
    ) {
        // Check the signal before moving any data, so a bad signal address writes nothing.
        self.atomic_route(sig, pe);
        self.put_scoped(scope, dst, src, count, pe, false);
        scope.sync();
        let (rank, _) = scope.rank_and_size();
        if rank == 0 {
            if scope != Scope::Thread {
                // Make the other threads' stores (ordered before ours by the barrier) visible to
                // the system before the signal.
                arch::fence_sc_sys();
            }
            // Re-derived rather than kept across the put: a route held that long ends up in local
            // memory on nvptx.
            match self.atomic_route(sig, pe) {
                Route::Direct(t) => signal_direct(t, value, op),
                Route::Nic(qp, r) => {
                    let end = signal_nic(&qp, r, value, op);
                    if blocking {
                        // RC completes in order: the signal's completion covers the data's.
                        qp.wait(end);
                    }
                }
            }
        }
    }

    /// Puts `count` elements to `dst` on `pe`, then updates the signal word `sig` on `pe` with
    /// `op`/`value`; the signal is never visible before the data.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<T: Copy>(
        &self,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
    ) {
        self.put_signal_scoped(Scope::Thread, dst, src, count, sig, value, op, pe, true)
    }
    /// Non-blocking [`Shmem::put_signal`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_nbi<T: Copy>(
        &self,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
    ) {
        self.put_signal_scoped(Scope::Thread, dst, src, count, sig, value, op, pe, false)
    }
    /// [`Shmem::put_signal`] by a whole warp (one signal update).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_warp<T: Copy>(
        &self,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
    ) {
        self.put_signal_scoped(Scope::Warp, dst, src, count, sig, value, op, pe, true)
    }
    /// [`Shmem::put_signal`] by a whole block (one signal update).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_block<T: Copy>(
        &self,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
    ) {
        self.put_signal_scoped(Scope::Block, dst, src, count, sig, value, op, pe, true)
    }
    /// Non-blocking [`Shmem::put_signal_block`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_nbi_block<T: Copy>(
        &self,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
    ) {
        self.put_signal_scoped(Scope::Block, dst, src, count, sig, value, op, pe, false)
    }

    /// Reads the local signal word `sig` (acquire).
    #[inline(always)]
    pub fn signal_fetch(&self, sig: *const u64) -> u64 {
        let t = self.local_word(sig);
        // SAFETY: checked in-heap and aligned.
        unsafe { arch::load_acquire_sys_u64(t) }
    }

    /// Waits until the local signal word `sig` satisfies `cmp` against `value`; returns the value
    /// that satisfied it. Past the timeout: a `Timeout` error naming this PE, the signal's address,
    /// the comparison target and the last value seen.
    #[inline(always)]
    pub fn signal_wait_until(&self, sig: *const u64, cmp: Cmp, value: u64) -> u64 {
        let t = self.local_word(sig);
        let start = arch::global_timer_ns();
        let mut spins: u32 = 0;
        loop {
            // SAFETY: checked in-heap and aligned.
            let v = unsafe { arch::load_acquire_sys_u64(t) };
            if cmp.holds(v, value) {
                return v;
            }
            spins = spins.wrapping_add(1);
            if spins & 0xff == 0 {
                let elapsed = arch::global_timer_ns().wrapping_sub(start);
                if elapsed > self.timeout_ns {
                    let mut f = Failure::new(ErrorKind::Timeout);
                    f.detail = WaitKind::Signal as u32 | ((cmp as u32) << 8);
                    f.address = sig as u64;
                    f.expected = value;
                    f.observed = v;
                    f.elapsed_ns = elapsed;
                    self.fail(f);
                }
                arch::nanosleep(32);
            }
        }
    }

    // ---------------------------------------------------------------- ordering

    /// Completes every put, atomic and signal this thread issued: afterwards they are visible to
    /// every PE. P2P: a system-scope fence. IBGDA: rings and waits for completion on this block's QP
    /// to every IBGDA peer (cost grows with the number of such peers, as in NVSHMEM).
    #[inline(always)]
    pub fn quiet(&self) {
        arch::fence_sc_sys();
        if !self.qps.is_null() {
            for pe in 0..self.n_pes {
                // SAFETY: `peers` has `n_pes` entries (host contract).
                if unsafe { (*self.peers.add(pe as usize)).transport } == TransportKind::Ibgda as u32 {
                    self.qp(pe).quiet();
                }
            }
        }
    }

    /// Orders this thread's puts, atomics and signals to each PE: those issued before are delivered
    /// before those issued after. With IBGDA peers this is a [`Shmem::quiet`] (one QP per block and
    /// peer already orders them on the wire; the quiet also orders them against P2P stores).
    #[inline(always)]
    pub fn fence(&self) {
        if self.qps.is_null() {
            arch::fence_acq_rel_sys();
        } else {
            self.quiet();
        }
    }

    /// A barrier across all PEs, called by exactly one thread per PE; completes this thread's
    /// outstanding operations first (as `quiet`). In a kernel of several threads use
    /// [`Shmem::barrier_all_block`] from one block, after that block has synchronised with the rest.
    #[inline(always)]
    pub fn barrier_all(&self) {
        self.quiet();
        let hdr = self.heap_base as *mut HeapHeader;
        // SAFETY: the heap header is the runtime's, at offset 0 of every heap; only this PE's
        // barrier thread touches its epoch.
        let epoch = unsafe {
            let e = core::ptr::addr_of_mut!((*hdr).barrier_epoch);
            let next = arch::load_relaxed_sys_u64(e) + 1;
            arch::store_relaxed_sys_u64(e, next);
            next
        };
        let arrivals = unsafe { core::ptr::addr_of_mut!((*hdr).barrier_arrivals) };
        for pe in 0..self.n_pes {
            match self.route(arrivals as u64, 8, pe) {
                // SAFETY: the peer's heap header, in its heap (checked).
                Route::Direct(t) => unsafe {
                    arch::atomic_add_release_sys_u64(t as *mut u64, 1);
                },
                Route::Nic(qp, r) => {
                    qp.post_atomic(
                        AtomicOp::add(8, 1),
                        qp.dummy_landing(),
                        qp.landing_lkey(),
                        r,
                        qp.heap_rkey(),
                        true,
                    );
                }
            }
        }
        let need = epoch * self.n_pes as u64;
        let start = arch::global_timer_ns();
        loop {
            // SAFETY: our own heap header.
            let seen = unsafe { arch::load_acquire_sys_u64(arrivals) };
            if seen >= need {
                return;
            }
            let elapsed = arch::global_timer_ns().wrapping_sub(start);
            if elapsed > self.timeout_ns {
                let mut f = Failure::new(ErrorKind::Timeout);
                f.detail = WaitKind::Barrier as u32;
                f.address = arrivals as u64;
                f.expected = need;
                f.observed = seen;
                f.elapsed_ns = elapsed;
                self.fail(f);
            }
            arch::nanosleep(64);
        }
    }

    /// [`Shmem::barrier_all`] for a whole block: every thread of the block calls it; thread 0 takes
    /// part in the cross-PE barrier, and the block leaves together.
    #[inline(always)]
    pub fn barrier_all_block(&self) {
        arch::sync_threads();
        if arch::thread_rank_in_block() == 0 {
            self.barrier_all();
        }
        arch::sync_threads();
    }
}

#[inline(always)]
fn signal_direct(t: u64, value: u64, op: SignalOp) {
    // SAFETY: callers pass a checked, aligned in-heap signal word.
    unsafe {
        match op {
            SignalOp::Set => arch::store_release_sys_u64(t as *mut u64, value),
            SignalOp::Add => {
                arch::atomic_add_release_sys_u64(t as *mut u64, value);
            }
        }
    }
}

/// Posts the signal update as an atomic WQE (after the data, on the same QP); returns its end index.
#[inline(always)]
fn signal_nic(qp: &Qp, raddr: u64, value: u64, op: SignalOp) -> u64 {
    let amo = match op {
        SignalOp::Set => AtomicOp::swap(8, value),
        SignalOp::Add => AtomicOp::add(8, value),
    };
    qp.post_atomic(amo, qp.dummy_landing(), qp.landing_lkey(), raddr, qp.heap_rkey(), false)
}

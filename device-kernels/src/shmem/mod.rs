//! [`Shmem`]: a kernel's handle on its PE's device state, and the device API on top of it.
//!
//! This file holds the handle, attach, and routing (which transport reaches a peer, and the IBGDA
//! helpers every operation shares); the operations live in [`rma`], [`atomics`], [`signals`],
//! [`ordering`], [`collectives`], [`reductions`], [`teams`] and [`waits`].

mod atomics;
mod collectives;
mod ordering;
mod reductions;
pub use reductions::{BitwiseElement, ReduceElement};
mod rma;
mod signals;
mod teams;
mod waits;

use crate::arch;
use crate::fail::{report, Failure};
use crate::ibgda::{AtomicOp, Qp, Rdma, Reporter, Ring};
use crate::proxy::Channel;
use ibgda_abi::ibgda::QpDescriptor;
use ibgda_abi::mlx5::MAX_MESSAGE_BYTES;
use ibgda_abi::proxy::{amo, op as proxy_op, ProxyChannel, ProxyDescriptor, NO_LANDING};
use ibgda_abi::{DeviceState, ErrorKind, Op, PeerInfo, TransportKind, ABI_MAGIC, ABI_VERSION};

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
            Scope::Warp => (arch::lane_id(), arch::warp_size()),
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

/// The six NVSHMEM-named entry points of one scoped operation (thread, `_nbi`, `_warp`,
/// `_nbi_warp`, `_block`, `_nbi_block`), generated from its `*_scoped` implementation: the blocking
/// warp and block forms end with the scope's barrier, so every thread leaves together.
macro_rules! scoped_entry_points {
    (
        $scoped:ident($($arg:ident: $ty:ty),*);
        safety: $safety:literal;
        nbi_safety: $nbi_safety:literal;
        $(#[$thread_doc:meta])* $thread:ident = $thread_op:ident;
        $(#[$nbi_doc:meta])* $nbi:ident = $nbi_op:ident;
        $warp:ident = $warp_op:ident, $nbi_warp:ident = $nbi_warp_op:ident,
        $block:ident = $block_op:ident, $nbi_block:ident = $nbi_block_op:ident;
    ) => {
        $(#[$thread_doc])*
        ///
        /// # Safety
        #[doc = $safety]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $thread<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: the caller upholds this function's contract, which is the implementation's.
            unsafe { self.at(Op::$thread_op).$scoped(Scope::Thread, $($arg),*, true) }
        }
        $(#[$nbi_doc])*
        ///
        /// # Safety
        #[doc = $safety]
        #[doc = ""]
        #[doc = $nbi_safety]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nbi<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { self.at(Op::$nbi_op).$scoped(Scope::Thread, $($arg),*, false) }
        }
        #[doc = concat!("[`Shmem::", stringify!($thread), "`] by a whole warp (all 32 lanes, same arguments), which shares the work.")]
        ///
        /// # Safety
        #[doc = concat!("As [`Shmem::", stringify!($thread), "`].")]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $warp<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { self.at(Op::$warp_op).$scoped(Scope::Warp, $($arg),*, true) };
            Scope::Warp.sync();
        }
        #[doc = concat!("[`Shmem::", stringify!($nbi), "`] by a whole warp.")]
        ///
        /// # Safety
        #[doc = concat!("As [`Shmem::", stringify!($nbi), "`]. One lane of the warp issues the operation, so a \
                         [`Shmem::quiet`] by any other lane covers it only after a warp barrier that \
                         follows this call.")]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nbi_warp<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { self.at(Op::$nbi_warp_op).$scoped(Scope::Warp, $($arg),*, false) }
        }
        #[doc = concat!("[`Shmem::", stringify!($thread), "`] by a whole block (every thread, same arguments), which shares the work.")]
        ///
        /// # Safety
        #[doc = concat!("As [`Shmem::", stringify!($thread), "`].")]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $block<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { self.at(Op::$block_op).$scoped(Scope::Block, $($arg),*, true) };
            Scope::Block.sync();
        }
        #[doc = concat!("[`Shmem::", stringify!($nbi), "`] by a whole block.")]
        ///
        /// # Safety
        #[doc = concat!("As [`Shmem::", stringify!($nbi), "`]. One thread of the block issues the operation, so a \
                         [`Shmem::quiet`] by any other thread covers it only after a block barrier that \
                         follows this call.")]
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nbi_block<T: Copy>(&self, $($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { self.at(Op::$nbi_block_op).$scoped(Scope::Block, $($arg),*, false) }
        }
    };
}
use scoped_entry_points;

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
    proxy: *const ProxyChannel,
    proxy_channels: u32,
    /// The reductions' scratch in this PE's heap (the same offset on every PE), and its bytes.
    scratch: u64,
    scratch_bytes: u64,
    /// The call being made (an [`Op`] as `u32`), named by any error it reports: each entry point
    /// works on a copy of the handle with its own call set ([`Shmem::at`]).
    op: u32,
    /// What picks the QP and proxy channel: [`BY_BLOCK`] (the block index) or a key given to
    /// [`Shmem::keyed`].
    key: u32,
}

/// [`Shmem::key`]'s value when the block picks the queues.
const BY_BLOCK: u32 = u32::MAX;

/// How one access reaches its peer.
#[derive(Clone, Copy)]
enum Route {
    /// Loads and stores at this address (P2P, or this PE itself).
    Direct(u64),
    /// WQEs on this QP, at this remote address.
    Nic(Qp, u64),
    /// Descriptors on this proxy channel, at this heap offset.
    Proxy(Channel, u64),
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
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
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
                f.op = Op::Attach as u32;
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
                proxy: s.proxy as *const ProxyChannel,
                proxy_channels: s.proxy_channels,
                scratch: s.scratch,
                scratch_bytes: s.scratch_bytes,
                op: 0,
                key: BY_BLOCK,
            }
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

    /// This handle with its NIC and proxy operations on the queues that `key` picks instead of
    /// the block's: QP `key % k` of each peer (of its `k`), proxy channel `key % channels`.
    ///
    /// Operations issued to one PE through handles of the same key, from any block, are delivered
    /// in the order they were issued, as a block's are: once one is issued (the call returned) and
    /// another thread learns so (a barrier, or release and acquire), what that thread issues next
    /// with the same key lands after it. So a signal or atomic sent after data from other blocks
    /// lands after that data with no `quiet` between, the pattern of an MoE dispatch that sends an
    /// expert's rows from many blocks and its count from the last. [`Shmem::quiet`] on a keyed
    /// handle completes the keyed queues; [`Shmem::quiet_all_block`] completes every queue.
    /// Peers reached with loads and stores (P2P) are not affected. Keys are taken modulo 2^31.
    #[inline(always)]
    pub fn keyed(&self, key: u32) -> Shmem {
        Shmem {
            key: key & !(1 << 31),
            ..*self
        }
    }

    /// The index that picks this thread's QP and proxy channel: the key of a [`Shmem::keyed`]
    /// handle, else the block's.
    #[inline(always)]
    fn queue_selector(&self) -> u32 {
        if self.key == BY_BLOCK {
            arch::block_idx_x()
        } else {
            self.key
        }
    }

    /// How many QPs per peer (or proxy channels) [`Shmem::keyed`] keys choose among: keys that
    /// are equal modulo this number share their queues.
    #[inline(always)]
    pub fn queue_keys(&self) -> u32 {
        let k = if self.qps.is_null() { 0 } else { self.qps_per_peer };
        let c = if self.proxy.is_null() { 0 } else { self.proxy_channels };
        k.max(c).max(1)
    }

    /// This handle for the call `op` (what its errors name), unless it is already inside a call:
    /// an error in the `quiet` of a `barrier_all` names `barrier_all`, the call the kernel made.
    #[inline(always)]
    pub(crate) fn at(&self, op: Op) -> Shmem {
        let op = if self.op == 0 { op as u32 } else { self.op };
        Shmem { op, ..*self }
    }

    /// What a cold report path needs of this handle: the error record, this PE, the call.
    #[inline(always)]
    fn blame(&self) -> (u64, u32, u32) {
        (self.error, self.my_pe, self.op)
    }

    #[inline(always)]
    fn fail(&self, mut f: Failure) -> ! {
        f.op = self.op;
        report(self.error, self.my_pe, f)
    }

    #[inline(always)]
    fn peer(&self, pe: u32) -> PeerInfo {
        const {
            assert!(
                core::mem::offset_of!(PeerInfo, transport) == 8
                    && core::mem::offset_of!(PeerInfo, device) == 12
                    && core::mem::size_of::<PeerInfo>() == 16
            )
        };
        if pe >= self.n_pes {
            let mut f = Failure::new(ErrorKind::InvalidPe);
            f.peer = pe;
            f.observed = pe as u64;
            f.expected = self.n_pes as u64;
            self.fail(f);
        }
        // SAFETY: `peers` has `n_pes` 16-byte entries, written by the host before any kernel runs
        // and never while one does (host contract), and `pe < n_pes`. The read-only path keeps the
        // entry cached across the kernel's stores: a put loop pays an L1 hit per call, not an L2
        // round trip.
        let [heap_base, kind_and_device] =
            unsafe { arch::load_readonly_v2_u64(self.peers.add(pe as usize) as *const [u64; 2]) };
        PeerInfo {
            heap_base,
            transport: kind_and_device as u32,
            device: (kind_and_device >> 32) as u32,
        }
    }

    /// Offset of `[addr, addr+bytes)` in the heap, or an `OutsideHeap` error naming `pe`.
    #[inline(always)]
    fn heap_offset(&self, addr: u64, bytes: u64, pe: u32) -> u64 {
        self.offset_in_heap(addr, bytes, pe, ErrorKind::OutsideHeap, ibgda_abi::NONE, 0)
    }

    /// Offset of `[addr, addr+bytes)` in this PE's heap, or a `kind` error naming `pe`, `queue` and
    /// `detail` (the heap's size expected, the offset observed).
    #[inline(always)]
    fn offset_in_heap(&self, addr: u64, bytes: u64, pe: u32, kind: ErrorKind, queue: u32, detail: u32) -> u64 {
        let off = addr.wrapping_sub(self.heap_base);
        if off >= self.heap_size || bytes > self.heap_size - off {
            let mut f = Failure::new(kind);
            f.peer = pe;
            f.qp = queue;
            f.detail = detail;
            f.address = addr;
            f.size = bytes;
            f.expected = self.heap_size;
            f.observed = off;
            self.fail(f);
        }
        off
    }

    /// The address of heap offset `off` on a peer reached with loads and stores (P2P, or this PE).
    #[inline(always)]
    fn load_store_address(peer: &PeerInfo, off: u64) -> Option<u64> {
        (peer.transport == TransportKind::P2p as u32 && peer.heap_base != 0).then_some(peer.heap_base + off)
    }

    /// The load/store address of symmetric `[addr, addr+bytes)` on `pe` when `pe` is reached with
    /// loads and stores, after the PE and bounds checks; `None` when a NIC or the proxy reaches it.
    #[inline(always)]
    fn direct(&self, addr: u64, bytes: u64, pe: u32) -> Option<u64> {
        let peer = self.peer(pe);
        Self::load_store_address(&peer, self.heap_offset(addr, bytes, pe))
    }

    /// How symmetric `[addr, addr+bytes)` on `pe` is reached. Checks the PE, the bounds and the
    /// transport; writes nothing on failure.
    #[inline(always)]
    fn route(&self, addr: u64, bytes: u64, pe: u32) -> Route {
        let peer = self.peer(pe);
        let off = self.heap_offset(addr, bytes, pe);
        if let Some(remote) = Self::load_store_address(&peer, off) {
            Route::Direct(remote)
        } else if peer.transport == TransportKind::Ibgda as u32 {
            let qp = self.qp(pe);
            Route::Nic(qp, qp.remote_addr(off))
        } else if peer.transport == TransportKind::Proxy as u32 {
            Route::Proxy(self.channel(pe), off)
        } else {
            self.unavailable(pe, peer.transport, addr, bytes)
        }
    }

    /// Bytes of every PE's symmetric heap.
    #[inline(always)]
    pub fn heap_size(&self) -> u64 {
        self.heap_size
    }

    /// The IBGDA queue pair this thread uses to reach `pe` (chosen by block or by the handle's
    /// key, as the device API does), for posting WQEs directly. Fails with `TransportUnavailable` when `pe` is not
    /// reached over IBGDA, and with `InvalidPe` when it does not exist.
    #[inline(always)]
    pub fn ibgda_qp(&self, pe: u32) -> Qp {
        let sh = &self.at(Op::IbgdaQp);
        let peer = sh.peer(pe);
        if peer.transport != TransportKind::Ibgda as u32 {
            sh.unavailable(pe, peer.transport, 0, 0);
        }
        sh.qp(pe)
    }

    #[inline(always)]
    fn unavailable(&self, pe: u32, transport: u32, addr: u64, bytes: u64) -> ! {
        unavailable(self.error, self.my_pe, self.op, pe, transport, addr, bytes)
    }

    /// The QP this thread uses to reach `pe`: one of the peer's QPs, chosen by block (or by the
    /// handle's key) so that a block's (a key's) operations to one peer stay ordered on one QP.
    #[inline(always)]
    fn qp(&self, pe: u32) -> Qp {
        let k = self.qps_per_peer;
        if self.qps.is_null() || k == 0 {
            self.unavailable(pe, TransportKind::Ibgda as u32, 0, 0);
        }
        // SAFETY: the table has n_pes * qps_per_peer entries (host contract) and pe < n_pes.
        let desc = unsafe { self.qps.add((pe * k + self.queue_selector() % k) as usize) };
        // SAFETY: the entry is live and host-written (as above); the handle loads the fields a
        // post needs together, the QPN among them, which is checked from that copy.
        let qp = unsafe { Qp::with_reporter(desc, self.reporter()) };
        // A zero QPN marks an entry the host did not fill: its queues are not used.
        if qp.qpn() == 0 {
            self.unavailable(pe, TransportKind::Ibgda as u32, 0, 0);
        }
        qp
    }

    /// The proxy channel this thread's block (or the handle's key) uses: every operation of a
    /// block goes through one channel, so a block's operations to one peer stay ordered, as on one
    /// QP.
    #[inline(always)]
    fn channel(&self, pe: u32) -> Channel {
        if self.proxy.is_null() || self.proxy_channels == 0 {
            self.unavailable(pe, TransportKind::Proxy as u32, 0, 0);
        }
        // SAFETY: the table has `proxy_channels` entries (host contract).
        unsafe {
            Channel::new(
                self.proxy.add((self.queue_selector() % self.proxy_channels) as usize),
                self.reporter(),
            )
        }
    }

    /// Completes every operation this block queued on its proxy channel.
    #[inline(always)]
    fn proxy_quiet(&self) {
        if !self.proxy.is_null() && self.proxy_channels != 0 {
            self.channel(self.my_pe).quiet();
        }
    }

    /// Queues a PUT or GET of `bytes` between local `laddr` (which must lie in this PE's heap, the
    /// registered region) and heap offset `off` on `pe`. Returns the ticket count covering it.
    #[inline(always)]
    fn proxy_rma(&self, ch: &Channel, op: u8, laddr: u64, bytes: u64, pe: u32, off: u64) -> u64 {
        let loff = self.registered_offset(laddr, bytes, pe, ch.index(), true);
        ch.post(
            pe,
            op,
            0,
            NO_LANDING,
            ProxyDescriptor::target_word(pe, off),
            loff,
            bytes,
        )
    }

    /// Queues an atomic of `kind` (an [`amo`] kind) on heap offset `off` of `pe`; when `fetch`,
    /// waits for it and returns the previous value.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn proxy_atomic(
        &self,
        ch: &Channel,
        pe: u32,
        off: u64,
        kind: u8,
        width: usize,
        a: u64,
        b: u64,
        fetch: bool,
    ) -> u64 {
        let aux = kind | if width == 8 { amo::WIDE } else { 0 };
        let target = ProxyDescriptor::target_word(pe, off);
        if !fetch {
            ch.post(pe, proxy_op::AMO, aux, NO_LANDING, target, a, b);
            return 0;
        }
        ch.fetch(pe, proxy_op::AMO, aux | amo::FETCHES, target, a, b, width as u32)
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
            op: self.op,
        }
    }

    /// Checks that a local buffer of an IBGDA operation lies in this PE's heap (the registered
    /// memory region) and returns its lkey.
    #[inline(always)]
    fn registered(&self, qp: &Qp, addr: u64, bytes: u64, pe: u32) -> u32 {
        self.registered_offset(addr, bytes, pe, qp.qpn(), false);
        qp.heap_lkey()
    }

    /// Heap offset of a local buffer of a NIC operation (IBGDA, or the proxy when `via_proxy`),
    /// which must lie in this PE's heap, the registered region; an `UnregisteredBuffer` error
    /// naming `queue` (QPN or proxy channel; `detail` 1 for the proxy) if not.
    #[inline(always)]
    fn registered_offset(&self, addr: u64, bytes: u64, pe: u32, queue: u32, via_proxy: bool) -> u64 {
        self.offset_in_heap(addr, bytes, pe, ErrorKind::UnregisteredBuffer, queue, via_proxy as u32)
    }

    /// Posts an RDMA WRITE or READ of `bytes` (split at the NIC's message limit). Returns the
    /// WQEBB index past the last WQE.
    ///
    /// # Safety
    /// As [`Qp::post_rdma`] for `laddr..laddr+bytes`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn nic_rdma(&self, qp: &Qp, op: Rdma, laddr: u64, lkey: u32, raddr: u64, bytes: u64, ring: Ring) -> u64 {
        let mut off = 0;
        let mut end = 0;
        while off < bytes {
            let n = if bytes - off > MAX_MESSAGE_BYTES {
                MAX_MESSAGE_BYTES
            } else {
                bytes - off
            };
            // Only the last message may defer its ring (the earlier ones ring as they go).
            let ring = if off + n < bytes && ring == Ring::Defer {
                Ring::Auto
            } else {
                ring
            };
            // SAFETY: a part of the caller's range (this function's contract).
            end = unsafe { qp.post_rdma_ring(op, laddr + off, lkey, raddr + off, qp.heap_rkey(), n as u32, ring) };
            off += n;
        }
        end
    }

    /// Posts an atomic; when `fetch`, waits for it and returns the previous value.
    #[inline(always)]
    fn nic_atomic(&self, qp: &Qp, raddr: u64, op: AtomicOp, fetch: bool) -> u64 {
        if !fetch {
            // SAFETY: the result lands in the QP's dummy landing slot, which no thread reads.
            unsafe {
                qp.post_atomic(
                    op,
                    qp.dummy_landing(raddr),
                    qp.landing_lkey(),
                    raddr,
                    qp.heap_rkey(),
                    false,
                )
            };
            return 0;
        }
        let ticket = qp.take_landing_slot();
        let slot = qp.landing_addr(ticket.ticket);
        // SAFETY: our landing slot (its ticket), read only after the wait below.
        let end = unsafe { qp.post_atomic(op, slot, qp.landing_lkey(), raddr, qp.heap_rkey(), true) };
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
        let sh = &self.at(Op::Ptr);
        sh.direct(addr as u64, core::mem::size_of::<T>() as u64, pe)
            .map_or(core::ptr::null_mut(), |a| a as *mut T)
    }
}

/// Reports `TransportUnavailable` (scalars only: a `&Shmem` argument would keep every kernel's
/// handle in local memory).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn unavailable(error: u64, my_pe: u32, op: u32, pe: u32, transport: u32, addr: u64, bytes: u64) -> ! {
    let mut f = Failure::new(ErrorKind::TransportUnavailable);
    f.peer = pe;
    f.detail = transport;
    f.address = addr;
    f.size = bytes;
    f.op = op;
    report(error, my_pe, f)
}

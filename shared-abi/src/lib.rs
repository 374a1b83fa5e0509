//! `ibgda-abi`: every structure that crosses between ibgda's host runtime and its device code.
//!
//! The host fills these `#[repr(C)]` structures in GPU (or host-mapped) memory; kernels built with
//! `ibgda-device` read them. Both sides compile this one crate, so a layout change is a compile-time
//! change on both sides, and the device still checks [`DeviceState::magic`], [`DeviceState::version`]
//! and [`DeviceState::size`] at attach time so that a kernel built against another version of this
//! crate refuses to run instead of misreading the state (the lesson of NVSHMEM 3.5.19 breaking
//! DeepEP's private copy of its device-state layout).
//!
//! Users never read these fields directly: the device API (`ibgda-device`) and the host runtime
//! (`ibgda`) are the interface. Every type here has a size and offset test.
#![no_std]

/// A fieldless enum the ABI stores as a `u32` (never as a Rust enum in shared memory: a value
/// read from memory that names no variant must be an error, not undefined behaviour), with its
/// decoder and the list of its variants, generated from the one definition.
macro_rules! u32_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $variant:ident = $value:literal,)* }) => {
        $(#[$m])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant = $value,)*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// Decodes the `u32` the ABI stores; `None` for a value that names no variant.
            pub const fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $($value => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

pub mod emu;
pub mod ibgda;
pub mod kernel;
pub mod mlx5;
pub mod proxy;
pub mod team;
pub use team::{Team, TeamWords, MAX_TEAMS};

/// `"IBGD"`, little-endian: the first word of every [`DeviceState`].
pub const ABI_MAGIC: u32 = 0x4447_4249;
/// Bumped on every incompatible change to any structure in this crate.
pub const ABI_VERSION: u32 = 9;

u32_enum! {
    /// How a PE reaches one peer. Stored as a `u32` in [`PeerInfo::transport`] (never as a Rust enum in
    /// shared memory: an out-of-range value read from memory must be an error, not undefined behaviour).
    pub enum TransportKind {
        /// The peer cannot be reached (no transport was set up).
        Unreachable = 0,
        /// Loads and stores into the peer's heap, mapped into this GPU's address space (NVLink/PCIe).
        P2p = 1,
        /// GPU-initiated RDMA through an mlx5 work queue (real ConnectX or the emulated device).
        Ibgda = 2,
        /// A CPU proxy posts the work on the GPU's behalf.
        Proxy = 3,
    }
}

/// One entry of the per-PE peer table ([`DeviceState::peers`]).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerInfo {
    /// Base of the peer's symmetric heap as mapped into *this* PE's address space; 0 when the peer is
    /// not load/store reachable.
    pub heap_base: u64,
    /// A [`TransportKind`] as `u32`.
    pub transport: u32,
    /// CUDA device ordinal of the peer (diagnostics only).
    pub device: u32,
}

/// The state every kernel receives (by pointer) to use the device API.
///
/// Lives in device memory, written once by the host per PE before kernels run.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceState {
    /// [`ABI_MAGIC`].
    pub magic: u32,
    /// [`ABI_VERSION`].
    pub version: u32,
    /// `size_of::<DeviceState>()` as the host saw it.
    pub size: u32,
    /// This PE's index, `0..n_pes`.
    pub my_pe: u32,
    /// Number of PEs in the job.
    pub n_pes: u32,
    /// Reserved flag bits; 0 today.
    pub flags: u32,
    /// Base of this PE's symmetric heap (device address).
    pub heap_base: u64,
    /// Size of every PE's symmetric heap in bytes (the heap is symmetric, so one size serves all).
    pub heap_size: u64,
    /// Bytes at the start of the heap that the runtime keeps for itself ([`HeapHeader`], then the
    /// collective scratch); user allocations start at or after this offset.
    pub heap_reserved: u64,
    /// Device pointer to `n_pes` [`PeerInfo`] entries.
    pub peers: u64,
    /// Pointer (device-visible, host-mapped) to this PE's [`ErrorRecord`].
    pub error: u64,
    /// Bound on every device-side wait, in nanoseconds of `%globaltimer`.
    pub timeout_ns: u64,
    /// Device pointer to `n_pes * qps_per_peer` [`ibgda::QpDescriptor`]s (PE-major), or 0 when no
    /// peer uses IBGDA.
    pub qps: u64,
    /// RC QPs per IBGDA peer.
    pub qps_per_peer: u32,
    /// Padding.
    pub _pad: u32,
    /// Device pointer to `proxy_channels` [`proxy::ProxyChannel`]s, or 0 when no peer is reached
    /// through the CPU proxy.
    pub proxy: u64,
    /// Number of proxy channels (block `b` uses channel `b % proxy_channels`).
    pub proxy_channels: u32,
    /// Padding.
    pub _pad2: u32,
    /// This PE's collective scratch: a device address in its heap, right after the
    /// [`HeapHeader`], at the same offset on every PE; the reductions stage other PEs' shares in
    /// it. 0 when the host set none up.
    pub scratch: u64,
    /// Bytes of [`DeviceState::scratch`] (the same on every PE).
    pub scratch_bytes: u64,
    /// Room for later fields.
    pub reserved: [u64; 1],
}

impl DeviceState {
    /// `size_of::<DeviceState>()` as a `u32`, the value stored in [`DeviceState::size`].
    pub const SIZE: u32 = core::mem::size_of::<DeviceState>() as u32;

    /// The state of PE `my_pe` of `n_pes`: its heap, peer table, error record and wait bound,
    /// stamped with this ABI's magic, version and size, and no NIC (set `qps`/`qps_per_peer` or
    /// `proxy`/`proxy_channels` for peers behind one).
    pub const fn new(my_pe: u32, n_pes: u32, heap: (u64, u64), peers: u64, error: u64, timeout_ns: u64) -> DeviceState {
        DeviceState {
            magic: ABI_MAGIC,
            version: ABI_VERSION,
            size: Self::SIZE,
            my_pe,
            n_pes,
            flags: 0,
            heap_base: heap.0,
            heap_size: heap.1,
            heap_reserved: HEAP_RESERVED_BYTES,
            peers,
            error,
            timeout_ns,
            qps: 0,
            qps_per_peer: 0,
            _pad: 0,
            proxy: 0,
            proxy_channels: 0,
            _pad2: 0,
            scratch: 0,
            scratch_bytes: 0,
            reserved: [0; 1],
        }
    }
}

impl DeviceState {
    /// This state with `bytes` of collective scratch right after the [`HeapHeader`] (see
    /// [`collective_scratch_bytes`]): the runtime then keeps `HEAP_RESERVED_BYTES + bytes` at the
    /// start of the heap.
    pub const fn with_scratch(self, bytes: u64) -> DeviceState {
        DeviceState {
            scratch: if bytes > 0 {
                self.heap_base + HEAP_RESERVED_BYTES
            } else {
                0
            },
            scratch_bytes: bytes,
            heap_reserved: HEAP_RESERVED_BYTES + bytes,
            ..self
        }
    }
}

/// The collective scratch a heap of `heap_size` bytes gets when `wanted` bytes are asked for: at
/// most a 64th of the heap, in whole 256-byte lines, so a small heap keeps nearly all of itself
/// for the user. The same on every PE (the heap size is).
pub const fn collective_scratch_bytes(heap_size: u64, wanted: u64) -> u64 {
    let cap = heap_size / 64;
    let b = if wanted < cap { wanted } else { cap };
    b / 256 * 256
}

/// The runtime's own words at offset 0 of every PE's symmetric heap.
///
/// Kept symmetric like everything else in the heap, so a PE finds a peer's copy at the same offset.
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapHeader {
    /// Barrier arrivals at this PE: every PE adds 1 here (with a release atomic) per barrier.
    pub barrier_arrivals: u64,
    _pad0: [u64; 7],
    /// How many barriers this PE has entered; touched only by this PE's barrier thread.
    pub barrier_epoch: u64,
    _pad1: [u64; 7],
    /// The claim word of this PE's [`ErrorRecord`] (see [`ErrorRecord::claim`]): 0 until a
    /// reporting thread swaps in 1.
    pub error_claim: u32,
    _pad2: [u32; 31],
    /// Where this PE's next `wait_until_any` or `test_any` starts polling: each call takes the next index, so
    /// a word that stays satisfied does not hide the others from a series of calls (OpenSHMEM
    /// 1.5's rule). Touched by this PE's threads only.
    pub wait_any_start: u64,
    _pad3: [u64; 15],
    /// The teams' words, by slot ([`team::TeamWords`]; slot 0, the world, uses the fields above).
    pub teams: [team::TeamWords; team::MAX_TEAMS],
}

/// Bytes reserved at the start of each heap for [`HeapHeader`] (rounded so user data stays aligned
/// to the allocator's largest alignment).
pub const HEAP_RESERVED_BYTES: u64 = 4096;

/// Value of [`ErrorRecord::peer`] / [`ErrorRecord::qp`] when the error concerns no peer / QP.
pub const NONE: u32 = u32::MAX;

u32_enum! {
    /// What went wrong on the device. Stored as `u32` in [`ErrorRecord::kind`].
    pub enum ErrorKind {
        /// The kernel's `ibgda-abi` does not match the host's (`expected` = host version or magic,
        /// `observed` = what the kernel found).
        AbiMismatch = 1,
        /// A PE index outside `0..n_pes` (`observed` = the index, `expected` = `n_pes`); for a
        /// team's PE, `expected` = the team's size and `size` = the team's handle bits.
        InvalidPe = 2,
        /// An address range outside the symmetric heap (`address`, `size`; `expected` = heap size).
        OutsideHeap = 3,
        /// An atomic on an address not aligned to its width (`address`, `size` = width).
        MisalignedAtomic = 4,
        /// A wait that did not complete within the timeout (`detail` = [`WaitKind`]).
        Timeout = 5,
        /// The peer's transport cannot perform this operation (`detail` = the [`TransportKind`]).
        TransportUnavailable = 6,
        /// The NIC completed a WQE with an error CQE (`qp` = QPN, `detail` = syndrome, `expected` =
        /// the failed WQE's 16-bit index, `observed` = the WQE opcode, `address` = the CQ).
        CompletionError = 7,
        /// A local buffer of an IBGDA operation is not registered with the NIC (`address`, `size`).
        UnregisteredBuffer = 8,
        /// The CPU proxy thread serving a channel died (`qp` = the channel, `detail` = the proxy
        /// thread); the host reports why.
        ProxyFailed = 9,
        /// A wait on a send-queue index no post has reserved (`qp` = QPN, `observed` = the index,
        /// `expected` = the reservation head).
        UnreservedIndex = 10,
        /// A reduction's collective scratch ([`DeviceState::scratch`], `size` bytes) cannot hold one
        /// element from every PE (`expected` = the bytes that would).
        ScratchTooSmall = 11,
        /// A team handle the runtime does not hold on this PE: never made here, destroyed, or not
        /// a team at all (`observed` = the handle's bits, `expected` = what its slot holds, 0 for a
        /// free slot).
        InvalidTeam = 12,
        /// A team call from a PE that is not a member (`observed` = the handle's bits, `expected` =
        /// this PE).
        NotInTeam = 13,
    }
}

u32_enum! {
    /// What a timed-out wait was waiting for. Stored in [`ErrorRecord::detail`].
    pub enum WaitKind {
        /// `signal_wait_until` on a local signal word (`address` = its heap offset).
        Signal = 1,
        /// `barrier_all`, `sync_all` or a team's barrier or sync: arrivals at this PE (`expected` =
        /// needed, `observed` = seen; `size` = the team's handle bits, 0 for the world).
        Barrier = 2,
        /// `quiet` (or a blocking operation) on an IBGDA QP: `qp` = QPN, `address` = the CQ,
        /// `expected` = the WQEBB index `cons_idx` had to reach, `observed` = `cons_idx`.
        Quiet = 3,
        /// A free send-queue slot: `expected` = the `cons_idx` needed, `observed` = `cons_idx`.
        SendQueueSlot = 4,
        /// The in-order ready chain: `expected` = the `ready_head` this post waited for, `observed`.
        ReadyChain = 5,
        /// Retired: the per-QP doorbell lock of ABI versions before 6 (nothing waits for a lock
        /// since; the value stays reserved so records keep their meaning).
        DoorbellLock = 6,
        /// A free landing slot: `expected` = the `landing_tail` needed, `observed`.
        LandingSlot = 7,
        /// A free slot in a proxy channel's ring: `qp` = the channel, `expected` = the `completed`
        /// count needed, `observed` = `completed`.
        ProxyRingSlot = 8,
        /// `quiet` (or a blocking operation) through the CPU proxy: `qp` = the channel, `expected` =
        /// the ticket count `completed` had to reach, `observed` = `completed`.
        ProxyCompletion = 9,
        /// A bulk (TMA) copy (`put_bulk`)'s stage load: `address` = the source of the chunk waited
        /// for, `size` = the whole copy's bytes, `observed` = the bytes already stored.
        BulkCopy = 10,
        /// `wait_until` on a local symmetric word (`address`; `detail` bits 8..16 the comparison).
        WaitUntil = 11,
    }
}

impl WaitKind {
    /// The counter the wait watched, for diagnostics.
    pub const fn counter(self) -> &'static str {
        match self {
            WaitKind::Signal => "signal word",
            WaitKind::Barrier => "barrier arrivals",
            WaitKind::Quiet | WaitKind::SendQueueSlot => "cons_idx",
            WaitKind::ReadyChain => "ready_head",
            WaitKind::DoorbellLock => "post_lock",
            WaitKind::LandingSlot => "landing_tail",
            WaitKind::ProxyRingSlot | WaitKind::ProxyCompletion => "proxy completed",
            WaitKind::BulkCopy => "bulk-copy stage",
            WaitKind::WaitUntil => "word",
        }
    }
}

/// `ErrorRecord::state` values.
pub mod error_state {
    /// No error has been reported.
    pub const EMPTY: u32 = 0;
    /// A thread has claimed the record and is filling it.
    pub const CLAIMED: u32 = 1;
    /// The record is complete and may be read.
    pub const WRITTEN: u32 = 2;
}

/// A device-side diagnostic, written to host-mapped memory by the first thread that fails, just
/// before it traps. The host turns it into an error naming every field.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// One of [`error_state`]: `CLAIMED` once a reporter won [`ErrorRecord::claim`], `WRITTEN`
    /// (released) once every field is in place. Only the first error is kept.
    pub state: u32,
    /// An [`ErrorKind`] as `u32`.
    pub kind: u32,
    /// The PE that reported.
    pub pe: u32,
    /// The peer PE involved, or [`NONE`].
    pub peer: u32,
    /// The QP involved, or [`NONE`].
    pub qp: u32,
    /// Kind-specific detail: [`WaitKind`] for timeouts, the syndrome for completion errors.
    pub detail: u32,
    /// The offending address (a device address in the reporting PE's space).
    pub address: u64,
    /// Size of the access in bytes, where one applies.
    pub size: u64,
    /// What the check or wait expected.
    pub expected: u64,
    /// What it observed.
    pub observed: u64,
    /// Nanoseconds spent waiting, for timeouts.
    pub elapsed_ns: u64,
    /// `blockIdx.x` of the reporting thread.
    pub block: u32,
    /// `threadIdx.x` of the reporting thread.
    pub thread: u32,
    /// Device address of a `u32` in device memory (the PE's [`HeapHeader::error_claim`]) that a
    /// reporting thread compare-and-swaps from 0 to 1 to become the one that writes this record.
    /// The claim cannot be on the record itself: the record is host memory, and a GPU's atomics
    /// on host memory are not atomic over PCIe. Set by the host; 0 means "cannot be claimed" and
    /// a reporter only traps.
    pub claim: u64,
    /// The device-API call that failed, an [`Op`] as `u32` (0: not known).
    pub op: u32,
    /// Padding.
    pub _pad: u32,
}

/// Defines [`Op`] with each call's name.
macro_rules! device_ops {
    ($($(#[$m:meta])* $v:ident = $n:literal => $name:literal,)*) => {
        /// A device-API call, as [`ErrorRecord::op`] names it: the call a device error happened in.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Op {
            $($(#[$m])* #[doc = concat!("`", $name, "`")] $v = $n,)*
        }

        impl Op {
            /// Every call.
            pub const ALL: &'static [Op] = &[$(Op::$v),*];

            /// The call's name in the device API.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Op::$v => $name,)*
                }
            }

            /// The call with this code.
            pub const fn from_u32(v: u32) -> Option<Op> {
                match v {
                    $($n => Some(Op::$v),)*
                    _ => None,
                }
            }
        }
    };
}

device_ops! {
    Put = 1 => "put",
    PutNbi = 2 => "put_nbi",
    PutWarp = 3 => "put_warp",
    PutNbiWarp = 4 => "put_nbi_warp",
    PutBlock = 5 => "put_block",
    PutNbiBlock = 6 => "put_nbi_block",
    Get = 7 => "get",
    GetNbi = 8 => "get_nbi",
    GetWarp = 9 => "get_warp",
    GetNbiWarp = 10 => "get_nbi_warp",
    GetBlock = 11 => "get_block",
    GetNbiBlock = 12 => "get_nbi_block",
    PutSignal = 13 => "put_signal",
    PutSignalNbi = 14 => "put_signal_nbi",
    PutSignalWarp = 15 => "put_signal_warp",
    PutSignalNbiWarp = 16 => "put_signal_nbi_warp",
    PutSignalBlock = 17 => "put_signal_block",
    PutSignalNbiBlock = 18 => "put_signal_nbi_block",
    PutBulk = 19 => "put_bulk",
    P = 20 => "p",
    G = 21 => "g",
    AtomicFetchAdd = 22 => "atomic_fetch_add",
    AtomicAdd = 23 => "atomic_add",
    AtomicCompareSwap = 24 => "atomic_compare_swap",
    AtomicSwap = 25 => "atomic_swap",
    AtomicFetch = 26 => "atomic_fetch",
    AtomicSet = 27 => "atomic_set",
    SignalOp = 28 => "signal_op",
    SignalFetch = 29 => "signal_fetch",
    SignalWaitUntil = 30 => "signal_wait_until",
    WaitUntil = 31 => "wait_until",
    Quiet = 32 => "quiet",
    Fence = 33 => "fence",
    BarrierAll = 34 => "barrier_all",
    BarrierAllBlock = 35 => "barrier_all_block",
    Ptr = 36 => "ptr",
    IbgdaQp = 37 => "ibgda_qp",
    Attach = 38 => "Shmem::attach",
    AlltoallBlock = 39 => "alltoall_block",
    BroadcastBlock = 40 => "broadcast_block",
    FcollectBlock = 41 => "fcollect_block",
    SumReduceBlock = 42 => "sum_reduce_block",
    ProdReduceBlock = 43 => "prod_reduce_block",
    MinReduceBlock = 44 => "min_reduce_block",
    MaxReduceBlock = 45 => "max_reduce_block",
    AndReduceBlock = 46 => "and_reduce_block",
    OrReduceBlock = 47 => "or_reduce_block",
    XorReduceBlock = 48 => "xor_reduce_block",
    Test = 49 => "test",
    WaitUntilAll = 50 => "wait_until_all",
    WaitUntilAny = 51 => "wait_until_any",
    WaitUntilSome = 52 => "wait_until_some",
    AtomicFetchAnd = 53 => "atomic_fetch_and",
    AtomicAnd = 54 => "atomic_and",
    AtomicFetchOr = 55 => "atomic_fetch_or",
    AtomicOr = 56 => "atomic_or",
    AtomicFetchXor = 57 => "atomic_fetch_xor",
    AtomicXor = 58 => "atomic_xor",
    TestAll = 59 => "test_all",
    TestAny = 60 => "test_any",
    TestSome = 61 => "test_some",
    TeamSync = 62 => "team_sync",
    TeamSyncBlock = 63 => "team_sync_block",
    TeamBarrier = 64 => "team_barrier",
    TeamBarrierBlock = 65 => "team_barrier_block",
    TeamAlltoallBlock = 66 => "team_alltoall_block",
    TeamBroadcastBlock = 67 => "team_broadcast_block",
    TeamFcollectBlock = 68 => "team_fcollect_block",
    TeamSumReduceBlock = 69 => "team_sum_reduce_block",
    TeamProdReduceBlock = 70 => "team_prod_reduce_block",
    TeamMinReduceBlock = 71 => "team_min_reduce_block",
    TeamMaxReduceBlock = 72 => "team_max_reduce_block",
    TeamAndReduceBlock = 73 => "team_and_reduce_block",
    TeamOrReduceBlock = 74 => "team_or_reduce_block",
    TeamXorReduceBlock = 75 => "team_xor_reduce_block",
    SyncAll = 76 => "sync_all",
    SyncAllBlock = 77 => "sync_all_block",
    TeamWorldPe = 78 => "team_world_pe",
    Iput = 79 => "iput",
    Iget = 80 => "iget",
    AtomicFetchInc = 81 => "atomic_fetch_inc",
    AtomicInc = 82 => "atomic_inc",
    WaitUntilAllVector = 83 => "wait_until_all_vector",
    WaitUntilAnyVector = 84 => "wait_until_any_vector",
    WaitUntilSomeVector = 85 => "wait_until_some_vector",
    TestAllVector = 86 => "test_all_vector",
    TestAnyVector = 87 => "test_any_vector",
    TestSomeVector = 88 => "test_some_vector",
}

/// Comparison for `signal_wait_until`. Passed to the device API as this enum; stable `u32` values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `value == target`
    Eq = 0,
    /// `value != target`
    Ne = 1,
    /// `value > target`
    Gt = 2,
    /// `value >= target`
    Ge = 3,
    /// `value < target`
    Lt = 4,
    /// `value <= target`
    Le = 5,
}

impl Cmp {
    /// Whether `value` satisfies the comparison against `target`.
    #[inline(always)]
    pub const fn holds(self, value: u64, target: u64) -> bool {
        match self {
            Cmp::Eq => value == target,
            Cmp::Ne => value != target,
            Cmp::Gt => value > target,
            Cmp::Ge => value >= target,
            Cmp::Lt => value < target,
            Cmp::Le => value <= target,
        }
    }
}

/// How `put_signal` updates the signal word.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Atomically add the value.
    Add = 1,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn device_state_layout() {
        assert_eq!(size_of::<DeviceState>(), 128);
        assert_eq!(align_of::<DeviceState>(), 64);
        assert_eq!(DeviceState::SIZE, 128);
        assert_eq!(offset_of!(DeviceState, magic), 0);
        assert_eq!(offset_of!(DeviceState, version), 4);
        assert_eq!(offset_of!(DeviceState, size), 8);
        assert_eq!(offset_of!(DeviceState, my_pe), 12);
        assert_eq!(offset_of!(DeviceState, n_pes), 16);
        assert_eq!(offset_of!(DeviceState, flags), 20);
        assert_eq!(offset_of!(DeviceState, heap_base), 24);
        assert_eq!(offset_of!(DeviceState, heap_size), 32);
        assert_eq!(offset_of!(DeviceState, heap_reserved), 40);
        assert_eq!(offset_of!(DeviceState, peers), 48);
        assert_eq!(offset_of!(DeviceState, error), 56);
        assert_eq!(offset_of!(DeviceState, timeout_ns), 64);
        assert_eq!(offset_of!(DeviceState, qps), 72);
        assert_eq!(offset_of!(DeviceState, qps_per_peer), 80);
        assert_eq!(offset_of!(DeviceState, proxy), 88);
        assert_eq!(offset_of!(DeviceState, proxy_channels), 96);
        assert_eq!(offset_of!(DeviceState, scratch), 104);
        assert_eq!(offset_of!(DeviceState, scratch_bytes), 112);
        assert_eq!(offset_of!(DeviceState, reserved), 120);
    }

    #[test]
    fn u32_enums_decode_exactly_their_variants() {
        macro_rules! check {
            ($e:ty) => {
                for v in 0..64u32 {
                    let want = <$e>::ALL.iter().copied().find(|x| *x as u32 == v);
                    assert_eq!(<$e>::from_u32(v), want, "{} {v}", stringify!($e));
                }
                assert!(<$e>::from_u32(u32::MAX).is_none());
            };
        }
        check!(TransportKind);
        check!(ErrorKind);
        check!(WaitKind);
        check!(crate::emu::QpState);
        assert_eq!(WaitKind::ALL.len(), 11);
    }

    #[test]
    fn peer_info_layout() {
        assert_eq!(size_of::<PeerInfo>(), 16);
        assert_eq!(align_of::<PeerInfo>(), 16);
        assert_eq!(offset_of!(PeerInfo, heap_base), 0);
        assert_eq!(offset_of!(PeerInfo, transport), 8);
        assert_eq!(offset_of!(PeerInfo, device), 12);
    }

    #[test]
    fn heap_header_layout() {
        assert_eq!(size_of::<HeapHeader>(), 384 + 64 * team::MAX_TEAMS);
        // Arrivals (written by peers) and the epoch (written locally) sit on separate 64-byte lines.
        assert_eq!(offset_of!(HeapHeader, barrier_arrivals), 0);
        assert_eq!(offset_of!(HeapHeader, barrier_epoch), 64);
        assert_eq!(offset_of!(HeapHeader, error_claim), 128);
        assert_eq!(offset_of!(HeapHeader, wait_any_start), 256);
        assert_eq!(offset_of!(HeapHeader, teams), 384);
        assert!(size_of::<HeapHeader>() as u64 <= HEAP_RESERVED_BYTES);
    }

    #[test]
    fn error_record_layout() {
        assert_eq!(size_of::<ErrorRecord>(), 128);
        assert_eq!(offset_of!(ErrorRecord, state), 0);
        assert_eq!(offset_of!(ErrorRecord, kind), 4);
        assert_eq!(offset_of!(ErrorRecord, pe), 8);
        assert_eq!(offset_of!(ErrorRecord, peer), 12);
        assert_eq!(offset_of!(ErrorRecord, qp), 16);
        assert_eq!(offset_of!(ErrorRecord, detail), 20);
        assert_eq!(offset_of!(ErrorRecord, address), 24);
        assert_eq!(offset_of!(ErrorRecord, size), 32);
        assert_eq!(offset_of!(ErrorRecord, expected), 40);
        assert_eq!(offset_of!(ErrorRecord, observed), 48);
        assert_eq!(offset_of!(ErrorRecord, op), 80);
        assert_eq!(offset_of!(ErrorRecord, elapsed_ns), 56);
        assert_eq!(offset_of!(ErrorRecord, block), 64);
        assert_eq!(offset_of!(ErrorRecord, thread), 68);
        assert_eq!(offset_of!(ErrorRecord, claim), 72);
    }

    #[test]
    fn enums_round_trip() {
        for k in [
            TransportKind::Unreachable,
            TransportKind::P2p,
            TransportKind::Ibgda,
            TransportKind::Proxy,
        ] {
            assert_eq!(TransportKind::from_u32(k as u32), Some(k));
        }
        assert_eq!(TransportKind::from_u32(4), None);
        for v in 1..=13 {
            assert_eq!(ErrorKind::from_u32(v).map(|k| k as u32), Some(v));
        }
        assert_eq!(ErrorKind::from_u32(0), None);
        assert_eq!(ErrorKind::from_u32(14), None);
        for v in 1..=9 {
            assert_eq!(WaitKind::from_u32(v).map(|k| k as u32), Some(v));
        }
    }

    #[test]
    fn cmp_semantics() {
        assert!(Cmp::Eq.holds(3, 3) && !Cmp::Eq.holds(3, 4));
        assert!(Cmp::Ne.holds(3, 4) && !Cmp::Ne.holds(4, 4));
        assert!(Cmp::Gt.holds(5, 4) && !Cmp::Gt.holds(4, 4));
        assert!(Cmp::Ge.holds(4, 4) && !Cmp::Ge.holds(3, 4));
        assert!(Cmp::Lt.holds(3, 4) && !Cmp::Lt.holds(4, 4));
        assert!(Cmp::Le.holds(4, 4) && !Cmp::Le.holds(5, 4));
    }
}

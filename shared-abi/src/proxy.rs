//! The CPU-proxy transport's shared structures: descriptor rings the GPU writes and proxy threads
//! drain, and the counters each side publishes to the other.
//!
//! One [`ProxyChannel`] per group of GPU blocks (block `b` uses channel `b % n_channels`, as a
//! block uses one QP per peer over IBGDA). Its ring lives in host-mapped memory: GPU threads
//! reserve a ticket with one atomic on [`ProxyChannelCounters::head`] (GPU memory), wait until the
//! ticket's slot is free (flow control against [`ProxyChannelStatus::completed`]), write the
//! [`ProxyDescriptor`]'s last three words, then its first word with a release store: the stamp in
//! it tells the proxy the slot is complete for this lap. A proxy thread takes descriptors in
//! ticket order, turns them into WQEs on its own host-memory QP to the peer, rings once per batch,
//! polls completions and publishes how many tickets have completed; `quiet` waits for that count.

/// [`ProxyDescriptor::op`] values.
pub mod op {
    /// RDMA WRITE of `b` bytes from local heap offset `a` to the target.
    pub const PUT: u8 = 1;
    /// RDMA READ of `b` bytes from the target into local heap offset `a`.
    pub const GET: u8 = 2;
    /// Inline WRITE of `aux` bytes (1..=8) of the value in `a`.
    pub const P: u8 = 3;
    /// READ of `aux` bytes (1..=8) into landing slot `landing` (NVSHMEM's `g`).
    pub const G: u8 = 4;
    /// An atomic: `aux` = [`amo`] kind | width flag; operand in `a`, compare value in `b`; the
    /// previous value lands in slot `landing` when the kind fetches.
    pub const AMO: u8 = 5;
}

/// [`ProxyDescriptor::aux`] for [`op::AMO`]: the kind in the low 4 bits, [`amo::WIDE`] for 8 bytes.
pub mod amo {
    /// Add `a`.
    pub const ADD: u8 = 1;
    /// Compare with `b`, swap in `a`.
    pub const COMPARE_SWAP: u8 = 2;
    /// Swap in `a` (set).
    pub const SWAP: u8 = 3;
    /// Bitwise and with `a`.
    pub const AND: u8 = 4;
    /// Bitwise or with `a`.
    pub const OR: u8 = 5;
    /// Bitwise xor with `a`.
    pub const XOR: u8 = 6;
    /// Load.
    pub const FETCH: u8 = 7;
    /// Mask of the kind bits.
    pub const KIND_MASK: u8 = 0x0f;
    /// Set for 8-byte operands (4 otherwise).
    pub const WIDE: u8 = 0x10;
    /// Set when the previous value must land in the descriptor's landing slot.
    pub const FETCHES: u8 = 0x20;
}

/// [`ProxyDescriptor::landing`] when the operation returns nothing.
pub const NO_LANDING: u16 = u16::MAX;

/// Bits of [`ProxyDescriptor::target`] that hold the heap offset; the PE sits above them.
pub const TARGET_OFFSET_BITS: u32 = 48;

/// One request from the GPU to the proxy: 32 bytes, written as four 8-byte words, the first last.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyDescriptor {
    /// `ticket as u32 + 1`: tells the proxy the slot holds this lap's descriptor (0 never matches
    /// a ticket the proxy is waiting for within the first 2^32 tickets; the ring is far smaller).
    pub stamp: u32,
    /// One of [`op`].
    pub op: u8,
    /// Operation-specific: value width for `P`/`G`, [`amo`] bits for `AMO`.
    pub aux: u8,
    /// Landing slot of a fetching operation, or [`NO_LANDING`].
    pub landing: u16,
    /// Target: heap offset on the peer (low [`TARGET_OFFSET_BITS`]) | peer PE << 48.
    pub target: u64,
    /// Local heap offset (PUT/GET), value (P), operand (AMO).
    pub a: u64,
    /// Bytes (PUT/GET), compare value (AMO compare-swap).
    pub b: u64,
}

impl ProxyDescriptor {
    /// Bytes of one descriptor.
    pub const BYTES: u64 = 32;

    /// The stamp of `ticket`.
    #[inline(always)]
    pub const fn stamp_of(ticket: u64) -> u32 {
        (ticket as u32).wrapping_add(1)
    }

    /// The first word (stamp, op, aux, landing) as the GPU publishes it.
    #[inline(always)]
    pub const fn header_word(stamp: u32, op: u8, aux: u8, landing: u16) -> u64 {
        stamp as u64 | (op as u64) << 32 | (aux as u64) << 40 | (landing as u64) << 48
    }

    /// `(peer PE, heap offset)` packed into [`ProxyDescriptor::target`].
    #[inline(always)]
    pub const fn target_word(pe: u32, offset: u64) -> u64 {
        (offset & ((1u64 << TARGET_OFFSET_BITS) - 1)) | (pe as u64) << TARGET_OFFSET_BITS
    }

    /// The peer PE of the target.
    #[inline(always)]
    pub const fn peer(&self) -> u32 {
        (self.target >> TARGET_OFFSET_BITS) as u32
    }

    /// The heap offset of the target.
    #[inline(always)]
    pub const fn offset(&self) -> u64 {
        self.target & ((1u64 << TARGET_OFFSET_BITS) - 1)
    }
}

/// The GPU side's counters of one channel, in GPU memory (only GPU threads touch them).
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyChannelCounters {
    /// Next ticket to hand out (atomic add).
    pub head: u64,
    /// The largest [`ProxyChannelStatus::completed`] a GPU thread has seen (atomic max): what
    /// flow control and waits read, so only the poll-lock holder reads host memory over PCIe.
    pub completed_seen: u64,
    /// Next landing slot to hand out (atomic add).
    pub landing_head: u64,
    /// Every landing slot below this has been released (in-order CAS chain).
    pub landing_tail: u64,
    /// Held (1) by the one thread reading the host-mapped status over PCIe for everyone; the
    /// others wait on `completed_seen` in GPU memory (thousands of threads polling host memory
    /// would starve the NIC's own PCIe reads).
    pub poll_lock: u32,
    /// Copy of [`ProxyChannelStatus::failed`] made by the poll-lock holder.
    pub failed_seen: u32,
    /// Padding to 128 bytes.
    pub _pad: [u64; 11],
}

/// What the proxy publishes about one channel, in host-mapped memory (the proxy writes, GPU
/// threads read over PCIe).
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyChannelStatus {
    /// Every ticket below this has been executed and completed by the NIC (release store).
    pub completed: u64,
    /// Every ticket below this has been taken from the ring (diagnostics).
    pub consumed: u64,
    /// Nonzero once the proxy thread serving this channel has died: waits fail at once with
    /// `ProxyFailed` instead of running into their timeout. Holds the proxy thread's index + 1.
    pub failed: u32,
    /// Padding.
    pub _pad0: u32,
    /// Padding to 128 bytes.
    pub _pad: [u64; 13],
}

/// One channel as a kernel sees it; written by the host before kernels run.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyChannel {
    /// The descriptor ring (host-mapped): `1 << log_slots` [`ProxyDescriptor`]s.
    pub ring: u64,
    /// This channel's [`ProxyChannelCounters`] (GPU memory).
    pub counters: u64,
    /// This channel's [`ProxyChannelStatus`] (host-mapped).
    pub status: u64,
    /// Landing buffer of fetching operations: `1 << log_landing_slots` 8-byte slots, registered
    /// with the NIC (the proxy points READ and atomic results there).
    pub landing: u64,
    /// log2 of the ring's slot count.
    pub log_slots: u32,
    /// log2 of the landing slot count.
    pub log_landing_slots: u32,
    /// The channel's index.
    pub index: u32,
    /// The proxy thread that serves it.
    pub proxy_thread: u32,
    /// Room for later fields.
    pub reserved: [u64; 2],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn descriptor_layout_and_packing() {
        assert_eq!((size_of::<ProxyDescriptor>(), align_of::<ProxyDescriptor>()), (32, 32));
        assert_eq!(ProxyDescriptor::BYTES, 32);
        assert_eq!(offset_of!(ProxyDescriptor, stamp), 0);
        assert_eq!(offset_of!(ProxyDescriptor, op), 4);
        assert_eq!(offset_of!(ProxyDescriptor, aux), 5);
        assert_eq!(offset_of!(ProxyDescriptor, landing), 6);
        assert_eq!(offset_of!(ProxyDescriptor, target), 8);
        assert_eq!(offset_of!(ProxyDescriptor, a), 16);
        assert_eq!(offset_of!(ProxyDescriptor, b), 24);
        // The header word, stored little-endian, reads back as the four fields.
        let w = ProxyDescriptor::header_word(0xdead_beef, op::AMO, amo::ADD | amo::WIDE, 7);
        let mut d = ProxyDescriptor::default();
        // SAFETY: the first 8 bytes of a repr(C) struct whose first fields total 8 bytes.
        unsafe { core::ptr::write(&mut d as *mut ProxyDescriptor as *mut u64, w) };
        assert_eq!((d.stamp, d.op, d.aux, d.landing), (0xdead_beef, 5, 0x11, 7));
        d.target = ProxyDescriptor::target_word(513, 0x1234_5678_9abc);
        assert_eq!((d.peer(), d.offset()), (513, 0x1234_5678_9abc));
        assert_eq!(ProxyDescriptor::stamp_of(0), 1);
        assert_eq!(ProxyDescriptor::stamp_of(u32::MAX as u64), 0);
        assert_eq!(ProxyDescriptor::stamp_of((1 << 32) + 5), 6);
    }

    #[test]
    fn channel_layouts() {
        assert_eq!(
            (size_of::<ProxyChannelCounters>(), align_of::<ProxyChannelCounters>()),
            (128, 128)
        );
        assert_eq!(offset_of!(ProxyChannelCounters, head), 0);
        assert_eq!(offset_of!(ProxyChannelCounters, completed_seen), 8);
        assert_eq!(offset_of!(ProxyChannelCounters, landing_head), 16);
        assert_eq!(offset_of!(ProxyChannelCounters, landing_tail), 24);
        assert_eq!(offset_of!(ProxyChannelCounters, poll_lock), 32);
        assert_eq!(offset_of!(ProxyChannelCounters, failed_seen), 36);
        assert_eq!(
            (size_of::<ProxyChannelStatus>(), align_of::<ProxyChannelStatus>()),
            (128, 128)
        );
        assert_eq!(offset_of!(ProxyChannelStatus, completed), 0);
        assert_eq!(offset_of!(ProxyChannelStatus, consumed), 8);
        assert_eq!(offset_of!(ProxyChannelStatus, failed), 16);
        assert_eq!((size_of::<ProxyChannel>(), align_of::<ProxyChannel>()), (64, 64));
        assert_eq!(offset_of!(ProxyChannel, ring), 0);
        assert_eq!(offset_of!(ProxyChannel, counters), 8);
        assert_eq!(offset_of!(ProxyChannel, status), 16);
        assert_eq!(offset_of!(ProxyChannel, landing), 24);
        assert_eq!(offset_of!(ProxyChannel, log_slots), 32);
        assert_eq!(offset_of!(ProxyChannel, log_landing_slots), 36);
        assert_eq!(offset_of!(ProxyChannel, index), 40);
        assert_eq!(offset_of!(ProxyChannel, proxy_thread), 44);
    }
}

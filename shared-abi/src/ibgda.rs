//! What a kernel needs to post to one RC queue pair itself: the QP descriptor the host fills and
//! the per-QP counters the posting threads share.
//!
//! The descriptor table is [`DeviceState::qps`](crate::DeviceState::qps): `n_pes ×
//! qps_per_peer` entries, PE-major (`qps[pe * qps_per_peer + i]`). Entries for peers reached by
//! another transport (and for this PE itself) are all zero (`qpn == 0`).

/// The posting counters of one QP, in device memory and shared by every thread that posts to it.
///
/// All counters are 64-bit and only grow; units are WQEBBs. Only their low 16 bits reach the
/// NIC (WQE index, DBR, doorbell), which is sound because at most [`MAX_SQ_DEPTH`] WQEBBs are
/// ever outstanding.
///
/// [`MAX_SQ_DEPTH`]: crate::mlx5::MAX_SQ_DEPTH
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Next free WQEBB: posters reserve `[resv_head, resv_head + n)` with one atomic add.
    pub resv_head: u64,
    /// Every WQEBB below this is fully written; advanced in reservation order by a CAS chain.
    pub ready_head: u64,
    /// The producer index published for ringing, times two, plus [`RINGING`] while a poster is
    /// writing the DBR and doorbell ([`QpCounters::prod_idx`] reads the index). One word, so a
    /// poster publishes its index and takes the ringing role in one compare-and-swap, and the
    /// ringer hands the role back in one only if nothing was published meanwhile.
    pub ring_state: u64,
    /// Every WQEBB below this has completed (advanced from CQEs with an atomic max).
    pub cons_idx: u64,
    /// Padding.
    pub _pad0: u64,
    /// Next landing slot to hand out (atomic add).
    pub landing_head: u64,
    /// Every landing slot below this has been released (in-order CAS chain).
    pub landing_tail: u64,
    /// Padding to 128 bytes.
    pub _pad1: [u64; 9],
}

/// The bit of [`QpCounters::ring_state`] that says a poster is ringing.
pub const RINGING: u64 = 1;

impl QpCounters {
    /// The producer index published for ringing (every WQEBB below it is written and will be
    /// rung, or was).
    pub const fn prod_idx(&self) -> u64 {
        self.ring_state >> 1
    }

    /// Whether a poster is writing the DBR and doorbell.
    pub const fn ringing(&self) -> bool {
        self.ring_state & RINGING != 0
    }
}

/// One QP as a kernel sees it. Written by the host before kernels run; read-only on the device.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpDescriptor {
    /// The QP number (24 bits); 0 marks an unused table entry.
    pub qpn: u32,
    /// log2 of the send-queue depth in WQEBBs.
    pub log_depth: u32,
    /// The peer PE this QP is connected to.
    pub peer: u32,
    /// Index of this QP among the peer's QPs.
    pub index: u32,
    /// The send queue: `depth` WQEBBs of 64 bytes.
    pub sq: u64,
    /// The QP doorbell record (8 bytes; the send counter is at +4).
    pub dbr: u64,
    /// The doorbell register: UAR page + 0x800 (8-byte stores). With
    /// [`qp_flags::CPU_DOORBELL`], instead a 64-bit producer-index slot in host-mapped memory that
    /// the GPU raises (a release store under the QP's post lock) and a CPU thread turns into DBR and doorbell writes.
    pub doorbell: u64,
    /// The collapsed CQ: one 64-byte CQE that the NIC overwrites.
    pub cq: u64,
    /// This QP's [`QpCounters`].
    pub counters: u64,
    /// lkey of this PE's symmetric heap.
    pub lkey: u32,
    /// rkey of the peer's symmetric heap.
    pub rkey: u32,
    /// Virtual address of the peer's heap as the peer registered it (raddr = this + offset).
    pub peer_heap_base: u64,
    /// Landing buffer for `g` and fetching atomics: `1 << log_landing_slots` 8-byte slots; slot 0
    /// is the dummy target of non-fetching atomics.
    pub landing: u64,
    /// lkey of the landing buffer.
    pub landing_lkey: u32,
    /// log2 of the landing slot count.
    pub log_landing_slots: u32,
    /// [`qp_flags`] bits.
    pub flags: u32,
    /// Padding.
    pub _pad: u32,
    /// Room for later fields.
    pub reserved: [u64; 4],
}

/// [`QpDescriptor::flags`] bits.
pub mod qp_flags {
    /// Ring the doorbell from the GPU (the default).
    pub const GPU_DOORBELL: u32 = 1;
    /// CPU-assisted doorbell: the GPU publishes its producer index to the slot at
    /// [`QpDescriptor::doorbell`](super::QpDescriptor::doorbell); a CPU writes DBR and doorbell.
    pub const CPU_DOORBELL: u32 = 2;
    /// A CPU proxy posts to this QP (its queues are in host memory); kernels never do.
    pub const PROXY: u32 = 4;
}

/// Bytes of one landing slot.
pub const LANDING_SLOT_BYTES: u64 = 8;

/// Slots after a landing buffer's real ones where the results of non-fetching atomics (signals,
/// `atomic_add`, barrier arrivals) land, one picked by the target word
/// ([`dummy_landing_slot`]): atomics on different words then have different result addresses,
/// so a NIC may execute a warp's worth of them at once, and atomics on one word, which a NIC
/// executes in order anyway, share one.
pub const DUMMY_LANDING_SLOTS: u64 = 32;

/// The dummy slot (an index past the `slots` real ones) for a non-fetching atomic on the word at
/// `target`.
#[inline(always)]
pub const fn dummy_landing_slot(slots: u64, target: u64) -> u64 {
    slots + ((target >> 3) & (DUMMY_LANDING_SLOTS - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn qp_counters_layout() {
        assert_eq!((size_of::<QpCounters>(), align_of::<QpCounters>()), (128, 128));
        assert_eq!(offset_of!(QpCounters, resv_head), 0);
        assert_eq!(offset_of!(QpCounters, ready_head), 8);
        assert_eq!(offset_of!(QpCounters, ring_state), 16);
        assert_eq!(offset_of!(QpCounters, cons_idx), 24);
        assert_eq!(offset_of!(QpCounters, landing_head), 40);
        assert_eq!(offset_of!(QpCounters, landing_tail), 48);
    }

    #[test]
    fn qp_descriptor_layout() {
        assert_eq!((size_of::<QpDescriptor>(), align_of::<QpDescriptor>()), (128, 64));
        assert_eq!(offset_of!(QpDescriptor, qpn), 0);
        assert_eq!(offset_of!(QpDescriptor, log_depth), 4);
        assert_eq!(offset_of!(QpDescriptor, peer), 8);
        assert_eq!(offset_of!(QpDescriptor, index), 12);
        assert_eq!(offset_of!(QpDescriptor, sq), 16);
        assert_eq!(offset_of!(QpDescriptor, dbr), 24);
        assert_eq!(offset_of!(QpDescriptor, doorbell), 32);
        assert_eq!(offset_of!(QpDescriptor, cq), 40);
        assert_eq!(offset_of!(QpDescriptor, counters), 48);
        assert_eq!(offset_of!(QpDescriptor, lkey), 56);
        assert_eq!(offset_of!(QpDescriptor, rkey), 60);
        assert_eq!(offset_of!(QpDescriptor, peer_heap_base), 64);
        assert_eq!(offset_of!(QpDescriptor, landing), 72);
        assert_eq!(offset_of!(QpDescriptor, landing_lkey), 80);
        assert_eq!(offset_of!(QpDescriptor, log_landing_slots), 84);
        assert_eq!(offset_of!(QpDescriptor, flags), 88);
        assert_eq!(offset_of!(QpDescriptor, reserved), 96);
    }
}

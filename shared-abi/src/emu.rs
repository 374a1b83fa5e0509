//! The tables of ibgda's emulated mlx5 device: what its control plane (host crate, `ibgda::emu`)
//! writes and its engine (`ibgda_nic_emu`, on a CPU thread or, later, a GPU kernel) reads.
//!
//! They play the part of a ConnectX's on-chip context memory: memory-region (mkey) entries, CQ
//! contexts and QP contexts. Fields the engine changes while running are written with atomics.

/// Memory-region access rights (`IBV_ACCESS_*` values).
pub mod access {
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the region as a local buffer (READ and atomic
    /// results land there).
    pub const LOCAL_WRITE: u32 = 1;
    /// `IBV_ACCESS_REMOTE_WRITE`
    pub const REMOTE_WRITE: u32 = 2;
    /// `IBV_ACCESS_REMOTE_READ`
    pub const REMOTE_READ: u32 = 4;
    /// `IBV_ACCESS_REMOTE_ATOMIC`
    pub const REMOTE_ATOMIC: u32 = 8;
    /// Everything.
    pub const ALL: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
}

/// One memory region (mkey). `key` is both the lkey and the rkey.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrEntry {
    /// lkey/rkey; the low 8 bits are a variant tag, so a stale key from a freed entry misses.
    pub key: u32,
    /// Protection domain number.
    pub pd: u32,
    /// [`access`] bits.
    pub access: u32,
    /// 1 when the entry is live (written last, with release).
    pub valid: u32,
    /// First byte of the region.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

u32_enum! {
    /// RC QP states, as `u32` in [`QpContext::state`].
    pub enum QpState {
        /// Just created; the send queue is not processed.
        Reset = 0,
        /// Initialised; posting is allowed but nothing is executed.
        Init = 1,
        /// Ready to receive: the QP answers a peer's requests.
        Rtr = 2,
        /// Ready to send: posted WQEs are executed.
        Rts = 3,
        /// Error: every WQE completes with `WR_FLUSH_ERR`.
        Err = 4,
    }
}

/// How a CQ places CQEs, as `u32` in [`CqContext::mode`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqMode {
    /// `cc = 1, oi = 1`: every CQE overwrites entry 0; pollers read `wqe_counter` (IBGDA's mode).
    Collapsed = 0,
    /// The classic ring: CQE `n` goes to entry `n % size` with owner bit `(n / size) & 1`; the
    /// consumer reports progress through the CQ doorbell record.
    OwnerBit = 1,
}

/// One completion queue.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqContext {
    /// CQE buffer (64-byte CQEs), initialised to 0xff.
    pub buf: u64,
    /// CQ doorbell record (`[0]` = consumer index, big-endian).
    pub dbr: u64,
    /// log2 of the number of CQEs.
    pub log_size: u32,
    /// A [`CqMode`] as `u32`.
    pub mode: u32,
    /// CQ number.
    pub cqn: u32,
    /// Set (to 1) by the engine when an owner-bit CQ overflowed; CQEs are then dropped.
    pub overrun: u32,
    /// CQEs written so far (engine-owned).
    pub produced: u64,
    /// Padding.
    pub _pad: [u64; 3],
}

/// One RC QP's context.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpContext {
    /// QP number (24 bits, never 0).
    pub qpn: u32,
    /// A [`QpState`] as `u32`; written by the control plane and (to `Err`) by the engine.
    pub state: u32,
    /// Protection domain number.
    pub pd: u32,
    /// log2 of the send-queue depth in WQEBBs.
    pub log_sq_depth: u32,
    /// Send-queue buffer.
    pub sq: u64,
    /// QP doorbell record (send counter at +4).
    pub dbr: u64,
    /// UAR page (doorbell register at +0x800).
    pub uar: u64,
    /// This QP's send [`CqContext`].
    pub cq: u64,
    /// The owning [`DeviceContext`].
    pub device: u64,
    /// The connected remote [`QpContext`] (set at RTR).
    pub remote: u64,
    /// WQEBBs consumed by the engine (engine-owned, 64-bit).
    pub consumed: u64,
    /// Producer index the engine has learnt from doorbells or the DBR (engine-owned, 64-bit).
    pub posted: u64,
    /// Raw value of the doorbell register when last read.
    pub last_doorbell: u64,
    /// `%globaltimer` of the last DBR recovery check.
    pub last_dbr_check_ns: u64,
    /// Fault injection: ignore this many upcoming doorbells (decremented by the engine).
    pub drop_doorbells: u32,
    /// Syndrome of the error that moved the QP to `Err`, 0 if none.
    pub error_syndrome: u32,
    /// WQEs executed successfully.
    pub wqes_executed: u64,
    /// Doorbells the engine acted on.
    pub doorbells_seen: u64,
    /// Doorbells dropped by fault injection.
    pub doorbells_dropped: u64,
    /// Producer-index advances learnt from the DBR instead of a doorbell.
    pub doorbells_recovered: u64,
    /// WQEs executed in batches (several at once, one per engine lane); included in
    /// `wqes_executed`.
    pub wqes_batched: u64,
    /// Rate model: 1 when the NIC this QP stands for would fetch its WQEs over PCIe while the
    /// engine reads them locally (so the model charges `model_fetch_ns`); 0 when the engine's own
    /// read already crosses PCIe (a GPU engine reading a queue in host memory), so that cost is
    /// not counted twice.
    pub model_fetch: u32,
    /// Bumped by the control plane whenever it changes the QP (a state transition, a connection,
    /// a reset): an engine that caches the QP's context between passes reloads it then.
    pub generation: u32,
    /// Service passes that found WQEs waiting, and the WQEBBs waiting summed over them: their
    /// ratio is the backlog the engine finds, near zero when posters (not the NIC) are the limit.
    pub busy_passes: u64,
    /// See `busy_passes`.
    pub backlog_sum: u64,
    /// Where the GPU engine's batches spend their time, in SM cycles summed over batches (lane
    /// 0's `%clock64`): loading, decoding, checking and admitting the batch's WQEs; copying their
    /// data; completing them (the fence, CQEs, indices). The batch count is `wqes_batched` over
    /// the batch sizes; `ibgda::emu::QpStats` reports these.
    pub cycles_plan: u64,
    /// See `cycles_plan`.
    pub cycles_copy: u64,
    /// See `cycles_plan`.
    pub cycles_complete: u64,
    /// Batches executed by a warp (the GPU engine's lane path; the CPU engine's serial lanes too).
    pub batches: u64,
    /// Retirements on the batch path: each is one system-scope fence, the latest requested CQE
    /// and one consumer-index store for one or more consecutive batches (`cycles_complete` sums
    /// their cost).
    pub retirements: u64,
    /// `%globaltimer` (ns) of each pass that learned new WQEs from a doorbell, at the moment it
    /// learned them, summed; and the same passes' end (their CQEs written), summed. Against the
    /// posters' own clock readings (same GPU) they split a WQE's latency into the doorbell being
    /// noticed and the NIC's work (`diag_latency_breakdown`); `doorbells_seen` counts the passes.
    pub learned_ns_sum: u64,
    /// See `learned_ns_sum`.
    pub finished_ns_sum: u64,
    /// For the same passes, `%globaltimer` summed when the warp is ready to run its first batch
    /// (the view shared, the producer index acquired by every lane), and when its last WQE is
    /// retired (before the pass's statistics): learned, ready, retired, finished.
    pub ready_ns_sum: u64,
    /// See `ready_ns_sum`.
    pub retired_ns_sum: u64,
    /// Rate model: a doorbell-register value the engine saw change while it waited for a batch
    /// of this QP to land, and `%globaltimer` when it first saw it (0: none waiting). The pass that
    /// learns that value counts its WQEs fetched from then, not from when the wait ended: a
    /// ConnectX fetches a QP's next WQEs while the previous ones are on the wire, so a put and its
    /// signal posted a moment apart land a moment apart, not a latency apart. Engine-owned.
    pub watched_doorbell: u64,
    /// See `watched_doorbell`.
    pub watched_doorbell_ns: u64,
    /// Rate model: the READs and atomics a service pass left outstanding, and when the last of
    /// their responses is back (engine ns), for the next pass: a fenced WQE there waits for them,
    /// and they count towards `max_rd_atomic`, also when that pass's WQEs count as fetched before
    /// this one ended (see `watched_doorbell`). Engine-owned.
    pub rd_outstanding: u64,
    /// See `rd_outstanding`.
    pub rd_due_ns: u64,
}

/// One emulated HCA: its memory-region table and device-wide controls.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceContext {
    /// `max_mrs` [`MrEntry`]s.
    pub mrs: u64,
    /// Entries in `mrs`.
    pub max_mrs: u32,
    /// Device number (the emulated LID), for diagnostics.
    pub device_id: u32,
    /// Fault injection: while 1 the engine executes nothing.
    pub paused: u32,
    /// Rate model: 1 when on (the fields below pace the engine as a ConnectX's port would).
    pub model_on: u32,
    /// Fault injection: hold every CQE this long after its WQE executed.
    pub completion_delay_ns: u64,
    /// How long a QP must be idle before the engine reads its DBR to recover a lost doorbell.
    pub dbr_recovery_ns: u64,
    /// Rate model: link time per payload byte, in femtoseconds (20 000 at 400 Gb/s).
    pub model_fs_per_byte: u64,
    /// Rate model: the message-rate ceiling as the port time one message takes, in femtoseconds
    /// (about 3 030 000 at 330 M messages/s).
    pub model_fs_per_msg: u64,
    /// Rate model: one-way latency of NIC and wire, in ns (a READ or atomic pays it twice).
    pub model_latency_ns: u64,
    /// Rate model: the PCIe round trip of a NIC fetching WQEs by DMA, in ns, charged to QPs whose
    /// `model_fetch` is set (see [`QpContext::model_fetch`]).
    pub model_fetch_ns: u64,
    /// Rate model: when the port's transmitter is next free, in picoseconds of the engine's clock
    /// (the global timer); raised to a booking's ready time (`atom.max`, the jump summed in
    /// `port_idle_ps`), then advanced by its length (`atom.add`) by every engine thread using the
    /// port.
    pub port_free_ps: u64,
    /// Rate model: WQEs the model paced, and the nanoseconds engine threads waited on it.
    pub model_wqes: u64,
    /// See `model_wqes`.
    pub model_wait_ns: u64,
    /// Rate model: the engine clock (ns) the port clock counts from, set by the first engine
    /// thread that uses the port (0 until then): picoseconds of a GPU's global timer, which
    /// counts from 1970, would not fit in 64 bits.
    pub model_epoch_ns: u64,
    /// Rate model: when the port's receiver is next free (picoseconds of this device's engine
    /// clock, as `port_free_ps`): READ responses and atomic results arriving for this device's
    /// requests. Booked only by this device's engine, so no other GPU's clock is ever compared
    /// with this one.
    pub port_rx_free_ps: u64,
    /// Rate model: most RDMA READs and atomics a QP has outstanding at once (a QP's
    /// `max_rd_atomic`); 0 for no limit.
    pub model_max_rd_atomic: u64,
    /// How long (ns of the engine's clock) a GPU engine warp may keep using the region entries
    /// and the responder's readiness it checked, before it checks them again (see
    /// [`DEFAULT_KEY_LEASE_NS`]); 0 checks them in every pass.
    pub key_lease_ns: u64,
    /// Rate model: picoseconds of idle time the transmitter's clock jumped over (summed), each
    /// when a booking raised an idle clock to its ready time. Over a call, the clock's advance
    /// minus this is the port time booked; a booking whose WQEs were fetched earlier than a jump
    /// it queues behind could have used part of the gap (the clock only moves forward).
    pub port_idle_ps: u64,
}

/// The default [`DeviceContext::key_lease_ns`]: 100 us. A warp of the GPU engine keeps the memory
/// region entries and the responder QP's readiness it checked (the responder's are in the other
/// GPU's memory, an NVLink round trip of about 2 us that was a sixth of a `put_signal` round
/// trip) for one lease, as a ConnectX keeps mkey and QP contexts in its caches. In exchange the
/// control plane, after it withdraws a key or takes a QP out of RTR, RTS or ERR, waits a lease
/// before it returns, so that no WQE posted after it returned can run on the old entry. (When the
/// engine itself moves a responder to ERR, a requester that checked it ready may still complete
/// WRITEs to it for the rest of its lease, as a real requester learns of it only from the
/// responder's NAKs.)
pub const DEFAULT_KEY_LEASE_NS: u64 = 100_000;

/// The GPU engine's control block, in host-mapped memory: the host asks it to stop and learns
/// that every warp started (before any user kernel runs) and stopped. The GPU only stores to it
/// (no read-modify-write: atomics on host memory are not atomic over PCIe without native host
/// atomics); the warps count themselves in an [`EngineTally`] in GPU memory, and the warp that
/// completes a count publishes it here.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineControl {
    /// Set to 1 by the host to stop the engine.
    pub stop: u32,
    /// Every warp of the launch once all entered the service loop, else 0 (the host clears it
    /// before a launch).
    pub warps_started: u32,
    /// Every warp of the launch once all left it, else 0 (the host clears it before a launch).
    pub warps_stopped: u32,
    /// Padding.
    pub _pad: u32,
    /// WQEs processed, summed over launches (published by the last warp to stop).
    pub wqes: u64,
    /// Service passes over the warps' QPs, summed over warps and launches (likewise).
    pub passes: u64,
    /// Padding.
    pub _pad1: [u64; 4],
}

/// One copy of a shared batch: `len` bytes from `src` to `dst`, its chunks numbered from
/// `first_chunk` within the batch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyEntry {
    /// Destination.
    pub dst: u64,
    /// Source.
    pub src: u64,
    /// Bytes.
    pub len: u64,
    /// The batch's chunk number of this copy's first chunk.
    pub first_chunk: u32,
    /// Padding.
    pub _pad: u32,
}

/// Most copies in one shared batch (one per lane of the owning warp).
pub const COPY_JOB_ENTRIES: usize = 32;

/// One warp's large copies (up to one per lane), shared with idle engine warps (the engine's job
/// board follows its [`EngineTally`] in the same allocation, one job per warp: see
/// [`engine_scratch_bytes`]). The owner publishes the copies with `ticket` (generation, chunks,
/// next chunk), every warp claims a chunk with one fetch-and-add on it (the old value says which
/// generation and chunk it took; an add past the last chunk takes nothing), and counts the chunks
/// it finished in `done`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyJob {
    /// Bits 48..64: generation; 24..48: chunks; 0..24: the next chunk to claim.
    pub ticket: u64,
    /// Chunks finished by other warps.
    pub done: u32,
    /// Entries in `entry`.
    pub entries: u32,
    /// Padding.
    pub _pad: [u64; 6],
    /// The copies.
    pub entry: [CopyEntry; COPY_JOB_ENTRIES],
}

impl Default for CopyJob {
    fn default() -> Self {
        CopyJob {
            ticket: 0,
            done: 0,
            entries: 0,
            _pad: [0; 6],
            entry: [CopyEntry::default(); COPY_JOB_ENTRIES],
        }
    }
}

/// Bytes of the GPU engine's scratch allocation for `warps` warps: its [`EngineTally`], then one
/// [`CopyJob`] per warp.
pub const fn engine_scratch_bytes(warps: u32) -> usize {
    core::mem::size_of::<EngineTally>().next_multiple_of(64) + warps as usize * core::mem::size_of::<CopyJob>()
}

/// The GPU engine's own counters, in GPU memory, zeroed by the host before each launch: the warps
/// count themselves in with atomics here, and the last one publishes to [`EngineControl`].
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineTally {
    /// Warps that entered the service loop.
    pub started: u32,
    /// Warps that left it.
    pub stopped: u32,
    /// WQEs processed in this launch.
    pub wqes: u64,
    /// Service passes in this launch.
    pub passes: u64,
    /// Padding.
    pub _pad: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts() {
        assert_eq!(size_of::<MrEntry>(), 32);
        assert_eq!(offset_of!(MrEntry, addr), 16);
        assert_eq!(size_of::<CqContext>(), 64);
        assert_eq!(offset_of!(CqContext, produced), 32);
        assert_eq!(size_of::<QpContext>(), 320);
        assert_eq!(offset_of!(QpContext, remote), 56);
        assert_eq!(offset_of!(QpContext, consumed), 64);
        assert_eq!(offset_of!(QpContext, drop_doorbells), 96);
        assert_eq!(offset_of!(QpContext, doorbells_recovered), 128);
        assert_eq!(offset_of!(QpContext, watched_doorbell_ns), 248);
        assert_eq!(offset_of!(QpContext, rd_due_ns), 264);
        assert_eq!(size_of::<DeviceContext>(), 192);
        assert_eq!(offset_of!(DeviceContext, port_idle_ps), 128);
        assert_eq!(offset_of!(DeviceContext, port_free_ps), 72);
        assert_eq!(offset_of!(DeviceContext, port_rx_free_ps), 104);
        assert_eq!(offset_of!(DeviceContext, model_max_rd_atomic), 112);
        assert_eq!(size_of::<EngineControl>(), 64);
        assert_eq!(offset_of!(EngineControl, wqes), 16);
        assert_eq!(size_of::<EngineTally>(), 32);
        assert_eq!(size_of::<CopyEntry>(), 32);
        assert_eq!(size_of::<CopyJob>(), 64 + 32 * 32);
        assert_eq!(engine_scratch_bytes(2), 64 + 2 * 1088);
        assert_eq!(offset_of!(EngineTally, wqes), 8);
        for s in 0..5 {
            assert_eq!(QpState::from_u32(s).map(|q| q as u32), Some(s));
        }
        assert_eq!(QpState::from_u32(5), None);
    }
}

//! One pass of the emulated device over one QP: learn the producer index (doorbell, or DBR when a
//! doorbell was lost), then fetch, validate, execute and complete WQEs in order.

use super::cqe::write_cqe;
use super::model::{Demand, Model};
use super::parse::{parse, wqebbs_of, Rejected, Sge, Wqe, WqeOp, MAX_SGES, MAX_WQE_BYTES};
use ibgda_abi::emu::{access, CqContext, CqMode, DeviceContext, MrEntry, QpContext, QpState};
use ibgda_abi::mlx5::{syndrome, Be32, SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};
use ibgda_device::arch;
use ibgda_device::ibgda::AtomicOp;

/// What one [`service_qp`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Serviced {
    /// WQEs consumed (executed, failed or flushed).
    pub wqes: u32,
    /// Whether the producer index advanced.
    pub learned: bool,
}

/// A WQE [`take`]n from a send queue: validated and, except for its bulk data copy, executed.
/// The caller copies `copy_len` bytes from `copy_src` to `copy_dst` (possibly with a whole warp),
/// makes them visible system-wide, then calls [`complete`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// Destination of the data copy the caller performs (when `copy_len > 0`).
    pub copy_dst: u64,
    /// Source of that copy.
    pub copy_src: u64,
    /// Bytes to copy; 0 when the WQE needs no copy by the caller.
    pub copy_len: u32,
    wqebbs: u32,
    byte_cnt: u32,
    wqe_index: u16,
    opcode: u8,
    /// 1: executed, write a success CQE; 2: executed, unsignaled; 0: failed or flushed (the
    /// error CQE is already written).
    outcome: u8,
}

macro_rules! field {
    ($p:expr, $f:ident) => {
        core::ptr::addr_of_mut!((*$p).$f)
    };
}

/// What a service pass knows about one QP: its static context, read once per pass (a ConnectX
/// caches its QP and mkey contexts too), and the engine-owned indices, kept here and written back
/// as they move. Loading these per WQE made each WQE a chain of a dozen dependent memory round
/// trips on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub(super) qp: *mut QpContext,
    pub(super) sq: u64,
    pub(super) depth: u64,
    pub(super) qpn: u32,
    pub(super) pd: u32,
    pub(super) cq: *mut CqContext,
    pub(super) cq_buf: u64,
    pub(super) cq_log: u32,
    pub(super) cq_collapsed: bool,
    /// The send queue is in memory this engine reads over a bus (host memory read by the GPU
    /// engine): the warp then loads a batch's WQEBBs in as few transactions as it can.
    pub(super) sq_remote: bool,
    /// The rate model charges this QP's WQE fetches (see [`QpContext::model_fetch`]).
    pub(super) charge_fetch: bool,
    pub(super) mrs: Mrs,
    pub(super) delay_ns: u64,
    /// The device (its port, for the rate model).
    pub(super) dev: *mut DeviceContext,
    /// The rate model, as the device set it for this pass.
    pub(super) model: Model,
    /// The connected QP (the responder), or null.
    pub(super) remote: *mut QpContext,
    /// The responder is RTR or RTS (read once per pass).
    pub(super) remote_ready: bool,
    pub(super) remote_pd: u32,
    pub(super) remote_mrs: Mrs,
    pub(super) in_error: bool,
    pub(super) consumed: u64,
    pub(super) posted: u64,
    /// The doorbell register's address, and its value when last read (engine-owned).
    pub(super) doorbell: u64,
    pub(super) last_doorbell: u64,
    /// `%globaltimer` of the last DBR recovery check (engine-owned).
    pub(super) last_dbr_check_ns: u64,
    pub(super) executed: u64,
    pub(super) batched: u64,
    /// WQEBBs waiting when the pass started (posted, not consumed).
    pub(super) backlog: u64,
    /// When the rate model has this pass's WQEs fetched (engine ns; 0 with the model off).
    pub(super) fetched_ns: u64,
    /// Rate model: READs and atomics sent since `fetched_ns` was last moved past their
    /// responses, and when the latest of those responses is back (engine ns).
    pub(super) rd_outstanding: u64,
    pub(super) rd_due_ns: u64,
    /// The local and the remote region this lane checked last in this pass.
    pub(super) local_mr: MrCache,
    /// See `local_mr`.
    pub(super) remote_mr: MrCache,
    /// Whether a doorbell (or the DBR) exposed new WQEs in this pass.
    pub learned: bool,
}

/// A device's memory-region table.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mrs {
    pub(super) table: *const MrEntry,
    pub(super) len: u32,
}

impl Mrs {
    unsafe fn of(dev: *const DeviceContext) -> Mrs {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            if dev.is_null() {
                return Mrs {
                    table: core::ptr::null(),
                    len: 0,
                };
            }
            Mrs {
                table: (*dev).mrs as *const MrEntry,
                len: (*dev).max_mrs,
            }
        }
    }
}

/// Services `qp` on the calling thread: reads its doorbell (and, when idle for the device's
/// recovery interval, its DBR), then processes WQEs until `budget` WQEBBs are consumed, copying
/// data itself.
///
/// # Safety
/// `qp` is a live [`QpContext`] created by the emulated device's control plane, with live queue,
/// DBR, UAR, CQ and device tables; only one engine thread services a given QP at a time; the
/// memory its memory regions name is live.
pub unsafe fn service_qp(qp: *mut QpContext, budget: u32) -> Serviced {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let mut out = Serviced::default();
        let Some(mut v) = learn(qp) else { return out };
        out.learned = v.learned;
        let mut wqebbs = 0;
        while wqebbs < budget {
            let (k, wqes) = super::batch::batch_with_serial_lanes(&mut v, budget - wqebbs);
            if k > 0 {
                wqebbs += k;
                out.wqes += wqes as u32;
                continue;
            }
            let Some(t) = take(&mut v) else { break };
            if t.copy_len > 0 {
                copy_bytes(t.copy_dst as *mut u8, t.copy_src as *const u8, t.copy_len as usize);
            }
            complete(&mut v, &t);
            out.wqes += 1;
            wqebbs += t.wqebbs.max(1);
        }
        finish(&v);
        out
    }
}

/// Starts a service pass: `None` when the device is paused or the QP is not processing (RESET,
/// INIT, RTR); otherwise the pass's [`View`], after following the doorbell (or the DBR).
///
/// # Safety
/// As [`service_qp`].
pub unsafe fn learn(qp: *mut QpContext) -> Option<View> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let mut v = learn_static(qp);
        let reg = arch::load_acquire_sys_u64(((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64);
        learn_dynamic(&mut v, reg).then_some(v)
    }
}

/// What a GPU engine warp keeps of the one QP it services from one pass to the next (a ConnectX
/// caches its QP contexts too): the QP's static context and the engine-owned indices, valid while
/// the control plane has not touched the QP (its `generation` is unchanged). With it an idle pass
/// is one look at the doorbell register instead of a dozen dependent loads, and a busy pass loads
/// only what may change (pause, QP and responder state, injected delays).
#[derive(Clone, Copy, Debug)]
pub struct QpCache {
    generation: u32,
    view: Option<View>,
}

// SAFETY: the cache holds addresses of a QP's device memory and copies of its fields, nothing
// borrowed; the `# Safety` contract of `learn_cached` lets one servicing warp use it at a time,
// and a CPU stand-in of that warp may run on any thread.
unsafe impl Send for QpCache {}

impl QpCache {
    /// An empty cache (the first pass fills it).
    pub const fn new() -> QpCache {
        QpCache {
            generation: 0,
            view: None,
        }
    }

    /// Keeps `v` (the pass's view, after it ran) for the next pass.
    pub fn keep(&mut self, v: &View) {
        if self.view.is_some_and(|c| c.qp == v.qp) {
            self.view = Some(*v);
        }
    }
}

impl Default for QpCache {
    fn default() -> Self {
        QpCache::new()
    }
}

/// [`learn`] through `cache`: the static context is loaded only when the control plane changed the
/// QP since the cache was filled; an idle QP (doorbell unchanged, nothing pending, no DBR check
/// due) returns at once with a view that has no work. The caller hands the pass's view back with
/// [`QpCache::keep`] when the pass ends.
///
/// # Safety
/// As [`service_qp`]; `cache` is used with this QP only by the warp that services it.
pub unsafe fn learn_cached(qp: *mut QpContext, cache: &mut QpCache) -> Option<View> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        // Both loads issued before either is used.
        let generation = arch::load_acquire_sys_u32(field!(qp, generation));
        let cached = match cache.view {
            Some(c) if c.qp == qp && generation == cache.generation => Some(c),
            _ => None,
        };
        let Some(mut v) = cached else {
            let mut v = learn_static(qp);
            let reg = arch::load_acquire_sys_u64(((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64);
            let processing = learn_dynamic(&mut v, reg);
            *cache = QpCache {
                generation,
                view: processing.then_some(v),
            };
            return processing.then_some(v);
        };
        let reg = arch::load_acquire_sys_u64(v.doorbell as *const u64);
        if reg == v.last_doorbell && v.posted == v.consumed {
            let now = arch::global_timer_ns();
            let due = arch::load_relaxed_sys_u64(field!(v.dev, dbr_recovery_ns));
            if now.wrapping_sub(v.last_dbr_check_ns) < due {
                // Idle: nothing new, and no DBR recovery check due.
                v.backlog = 0;
                v.learned = false;
                return Some(v);
            }
        }
        if !learn_dynamic(&mut v, reg) {
            cache.view = None;
            return None;
        }
        Some(v)
    }
}

/// The part of a pass's view that only the control plane changes (queue, CQ, keys' tables, the
/// responder), and the engine-owned indices, as loaded from the QP's context.
///
/// # Safety
/// As [`service_qp`].
unsafe fn learn_static(qp: *mut QpContext) -> View {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let dev = (*qp).device as *const DeviceContext;
        let remote = arch::load_relaxed_sys_u64(field!(qp, remote)) as *mut QpContext;
        let cq = (*qp).cq as *mut CqContext;
        let (remote_pd, rdev) = if remote.is_null() {
            (0, core::ptr::null())
        } else {
            ((*remote).pd, (*remote).device as *const DeviceContext)
        };
        View {
            qp,
            sq: (*qp).sq,
            depth: 1u64 << (*qp).log_sq_depth,
            qpn: (*qp).qpn,
            pd: (*qp).pd,
            cq,
            cq_buf: (*cq).buf,
            cq_log: (*cq).log_size,
            cq_collapsed: (*cq).mode == CqMode::Collapsed as u32,
            // `model_fetch` is 0 exactly when this engine's own reads of the queue cross PCIe.
            sq_remote: (*qp).model_fetch == 0,
            charge_fetch: (*qp).model_fetch != 0,
            mrs: Mrs::of(dev),
            delay_ns: 0,
            dev: dev as *mut DeviceContext,
            model: Model::default(),
            remote,
            remote_ready: false,
            remote_pd,
            remote_mrs: Mrs::of(rdev),
            in_error: false,
            consumed: arch::load_relaxed_sys_u64(field!(qp, consumed)),
            posted: arch::load_relaxed_sys_u64(field!(qp, posted)),
            doorbell: (*qp).uar + UAR_DOORBELL_OFFSET as u64,
            last_doorbell: arch::load_relaxed_sys_u64(field!(qp, last_doorbell)),
            last_dbr_check_ns: arch::load_relaxed_sys_u64(field!(qp, last_dbr_check_ns)),
            executed: 0,
            batched: 0,
            backlog: 0,
            fetched_ns: 0,
            rd_outstanding: 0,
            rd_due_ns: 0,
            local_mr: MrCache::default(),
            remote_mr: MrCache::default(),
            learned: false,
        }
    }
}

/// The part of a pass's view that changes while the QP runs (pause, QP and responder state,
/// injected delay), then the producer index from the doorbell register's value `reg` (or the DBR,
/// when a doorbell was lost): `false` when the device is paused or the QP is not processing
/// (RESET, INIT and RTR queues are not processed; a doorbell stays latched in the register).
///
/// # Safety
/// As [`service_qp`], with `v` from [`learn_static`] of a live QP.
unsafe fn learn_dynamic(v: &mut View, reg: u64) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (qp, dev) = (v.qp, v.dev);
        let paused = arch::load_relaxed_sys_u32(field!(dev, paused));
        let state = arch::load_acquire_sys_u32(field!(qp, state));
        let delay_ns = arch::load_relaxed_sys_u64(field!(dev, completion_delay_ns));
        let remote_state = if v.remote.is_null() {
            QpState::Reset as u32
        } else {
            arch::load_relaxed_sys_u32(field!(v.remote, state))
        };
        if paused != 0 || (state != QpState::Rts as u32 && state != QpState::Err as u32) {
            return false;
        }
        v.remote_ready = remote_state == QpState::Rtr as u32 || remote_state == QpState::Rts as u32;
        v.in_error = state == QpState::Err as u32;
        v.delay_ns = delay_ns;
        (v.executed, v.batched, v.backlog, v.fetched_ns) = (0, 0, 0, 0);
        (v.rd_outstanding, v.rd_due_ns) = (0, 0);
        (v.local_mr, v.remote_mr) = (MrCache::default(), MrCache::default());
        v.model = Model::default();
        v.learned = learn_doorbell(v, reg);
        if !v.learned && v.consumed == v.posted {
            let now = arch::global_timer_ns();
            if now.wrapping_sub(v.last_dbr_check_ns) >= (*dev).dbr_recovery_ns {
                v.last_dbr_check_ns = now;
                arch::store_relaxed_sys_u64(field!(qp, last_dbr_check_ns), now);
                let raw = arch::load_acquire_sys_u32(((*qp).dbr + SND_DBR_OFFSET as u64) as *const u32);
                if advance_posted(v, Be32::from_raw(raw).get() as u16) {
                    arch::red_add_relaxed_sys_u64(field!(qp, doorbells_recovered), 1);
                    v.learned = true;
                }
            }
        }
        v.backlog = v.posted - v.consumed;
        if v.backlog > 0 {
            v.model = Model::of(dev, v.charge_fetch);
            v.fetched_ns = super::model::fetched_ns(&v.model);
        }
        true
    }
}

/// Takes the next posted WQE, if any: validates it and executes everything but its bulk copy
/// (see [`Taken`]). A failing WQE moves the QP to ERR and has its error CQE written here.
///
/// # Safety
/// As [`service_qp`], with a `v` from [`learn`] in the same pass.
pub unsafe fn take(v: &mut View) -> Option<Taken> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if v.consumed >= v.posted {
            return None;
        }
        Some(process_one(v))
    }
}

/// Finishes a [`take`]n WQE after its copy: one system-scope fence orders everything the WQE
/// wrote (and, by cumulativity, what the caller's other threads wrote before synchronising with
/// this one) before its CQE and before any later WQE of the QP (RC order); then the CQE (if
/// signalled) is published and the WQEBBs retired.
///
/// # Safety
/// As [`take`]; `t` is the last WQE taken with `v`.
pub unsafe fn complete(v: &mut View, t: &Taken) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if t.outcome != 0 {
            v.executed += 1;
            if t.outcome == 1 {
                delay_completion(v.delay_ns);
                write_cqe(v, t.wqe_index, Ok(t.byte_cnt), t.opcode);
            } else {
                arch::fence_acq_rel_sys();
            }
        }
        v.consumed += t.wqebbs as u64;
        arch::store_relaxed_sys_u64(field!(v.qp, consumed), v.consumed);
    }
}

/// Ends a service pass: publishes the pass's statistics.
///
/// # Safety
/// As [`take`].
pub unsafe fn finish(v: &View) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if v.executed > 0 {
            arch::red_add_relaxed_sys_u64(field!(v.qp, wqes_executed), v.executed);
        }
        if v.batched > 0 {
            arch::red_add_relaxed_sys_u64(field!(v.qp, wqes_batched), v.batched);
        }
        if v.backlog > 0 {
            // Reductions: nobody waits for their round trips (a load then a store each cost a
            // dependent round trip on every busy pass).
            arch::red_add_relaxed_sys_u64(field!(v.qp, busy_passes), 1);
            arch::red_add_relaxed_sys_u64(field!(v.qp, backlog_sum), v.backlog);
        }
    }
}

/// Follows the doorbell register's value `reg` (acquired by the caller: the poster's WQE and DBR
/// stores happen before its doorbell store); returns whether it exposed new WQEs.
unsafe fn learn_doorbell(v: &mut View, reg: u64) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let qp = v.qp;
        let raw = reg;
        if raw == v.last_doorbell {
            return false;
        }
        v.last_doorbell = raw;
        arch::store_relaxed_sys_u64(field!(qp, last_doorbell), raw);
        let bytes = raw.to_le_bytes();
        let pi = u16::from_be_bytes([bytes[1], bytes[2]]);
        let qpn = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) >> 8;
        if qpn != v.qpn {
            return false;
        }
        let drops = field!(qp, drop_doorbells);
        let pending = arch::load_relaxed_sys_u32(drops);
        if pending > 0 && arch::atomic_cas_acq_rel_sys_u32(drops, pending, pending - 1) == pending {
            arch::red_add_relaxed_sys_u64(field!(qp, doorbells_dropped), 1);
            return false;
        }
        let learned = advance_posted(v, pi);
        if learned {
            arch::red_add_relaxed_sys_u64(field!(qp, doorbells_seen), 1);
        }
        learned
    }
}

/// Moves `posted` forward to the 16-bit producer index `pi`; values that do not move it forward
/// by at most the queue depth (stale or bogus) are ignored.
unsafe fn advance_posted(v: &mut View, pi: u16) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let delta = pi.wrapping_sub(v.posted as u16) as u64;
        if delta == 0 || v.posted + delta - v.consumed > v.depth {
            return false;
        }
        v.posted += delta;
        arch::store_relaxed_sys_u64(field!(v.qp, posted), v.posted);
        true
    }
}

/// Fetches, validates and executes (all but the bulk copy of) the WQE at `v.consumed`.
unsafe fn process_one(v: &mut View) -> Taken {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (index, available) = (v.consumed, v.posted - v.consumed);
        let (sq, mask) = (v.sq, v.depth - 1);
        let slot = |i: u64| sq + ((i & mask) << 6);
        // Gather the WQEBBs (they may wrap around the ring) with 8-byte loads, all issued at once.
        let first = slot(index) as *const u64;
        let w0 = first.read_volatile();
        let ds = (w0 >> 56) as u8;
        let op_byte = (w0 >> 24) as u8;
        let wqebbs = (wqebbs_of(ds) as u64).min(available) as u32;
        let mut t = Taken {
            wqebbs,
            ..Taken::default()
        };
        if v.in_error {
            // Hardware flushes every outstanding WQE with a CQE, signalled or not.
            complete_error(v, index as u16, op_byte, syndrome::WR_FLUSH_ERR);
            return t;
        }
        if wqebbs_of(ds) as u64 > available {
            // The WQE claims WQEBBs the producer index does not cover.
            fail(v, index as u16, op_byte, syndrome::LOCAL_QP_OP_ERR);
            return t;
        }
        let mut words = [0u64; MAX_WQE_BYTES / 8];
        words[0] = w0;
        let mut b = 0;
        while b < wqebbs.min(4) as usize {
            let src = slot(index + b as u64) as *const u64;
            let mut k = if b == 0 { 1 } else { 0 };
            while k < 8 {
                words[b * 8 + k] = src.add(k).read_volatile();
                k += 1;
            }
            b += 1;
        }
        // SAFETY: same size; u8 has no alignment requirement; the words hold the bytes in memory
        // order (little-endian loads stored back little-endian).
        let bytes = &*(words.as_ptr() as *const [u8; MAX_WQE_BYTES]);
        match parse(bytes, v.qpn, index as u16) {
            Err(Rejected { syndrome, opcode }) => fail(v, index as u16, opcode, syndrome),
            Ok(wqe) => {
                if v.model.on {
                    // The port carries it before it lands (and before the checks the responder
                    // makes, as on the wire).
                    let d = demand_of(&v.model, &wqe);
                    let fenced = bytes[11] & ibgda_abi::mlx5::fm_ce_se::FENCE_MODE_MASK != 0;
                    super::retire::pace_counted(v, &d, fenced, d.round_trip as u64);
                }
                match execute(v, &wqe, bytes, &mut t) {
                    Ok(byte_cnt) => {
                        t.byte_cnt = byte_cnt;
                        t.wqe_index = wqe.wqe_index;
                        t.opcode = wqe.opcode;
                        t.outcome = if wqe.signaled { 1 } else { 2 };
                    }
                    Err(s) => {
                        t.copy_len = 0;
                        fail(v, wqe.wqe_index, wqe.opcode, s)
                    }
                }
            }
        }
        t
    }
}

/// What one WQE asks of the rate model.
fn demand_of(m: &Model, wqe: &Wqe) -> Demand {
    match wqe.op {
        WqeOp::Nop => Demand::of(m, 0, false, false),
        WqeOp::Write { sges, n_sges, .. } => Demand::of(m, total(&sges, n_sges), false, false),
        WqeOp::WriteInline { len, .. } => Demand::of(m, len as u64, false, false),
        WqeOp::Read { sges, n_sges, .. } => Demand::of(m, total(&sges, n_sges), true, false),
        WqeOp::Atomic { op, .. } => Demand::of(m, op.width() as u64, false, true),
    }
}

unsafe fn delay_completion(delay: u64) {
    if delay > 0 {
        let start = arch::global_timer_ns();
        while arch::global_timer_ns().wrapping_sub(start) < delay {
            arch::nanosleep(1000);
        }
    }
}

/// Moves the QP to ERR (remembering the first syndrome) and writes the error CQE.
unsafe fn fail(v: &mut View, wqe_index: u16, op: u8, syndrome: u8) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        arch::atomic_cas_acq_rel_sys_u32(field!(v.qp, error_syndrome), 0, syndrome as u32);
        arch::store_release_sys_u32(field!(v.qp, state), QpState::Err as u32);
        v.in_error = true;
        complete_error(v, wqe_index, op, syndrome);
    }
}

/// Moves the responder QP `remote` to ERR, remembering `syndrome` as its first error unless it
/// already had one: its own later WQEs are flushed, and requests to it are no longer answered.
unsafe fn responder_error(remote: *mut QpContext, syndrome: u8) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        arch::atomic_cas_acq_rel_sys_u32(field!(remote, error_syndrome), 0, syndrome as u32);
        arch::store_release_sys_u32(field!(remote, state), QpState::Err as u32);
    }
}

unsafe fn complete_error(v: &mut View, wqe_index: u16, op: u8, syndrome: u8) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        write_cqe(v, wqe_index, Err(syndrome), op);
    }
}

/// One memory region's entry as a lane last read it in this pass (a ConnectX caches its mkey
/// contexts too): the lanes of a batch check the same few keys over and over, and each read of
/// the table is a round trip to memory. Filled within one service pass only, so a region
/// deregistered before a pass starts is never used from it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MrCache {
    entry: MrEntry,
}

/// [`check_mr`] through `cache`: the table is read only when the key differs from the cached one.
///
/// # Safety
/// As [`check_mr`].
pub(super) unsafe fn check_mr_cached(
    cache: &mut MrCache,
    mrs: Mrs,
    key: u32,
    pd: u32,
    addr: u64,
    len: u64,
    need: u32,
) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let index = (key >> 8) as u64;
        if cache.entry.valid != 1 || cache.entry.key != key {
            if index >= mrs.len as u64 {
                return false;
            }
            cache.entry = core::ptr::read_volatile(mrs.table.add(index as usize));
        }
        allows(&cache.entry, key, pd, addr, len, need)
    }
}

/// Whether `e` is the live region `key` in `pd`, with `need` rights over `[addr, addr + len)`.
#[inline(always)]
fn allows(e: &MrEntry, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> bool {
    e.valid == 1
        && e.key == key
        && e.pd == pd
        && e.access & need == need
        && addr >= e.addr
        && len <= e.len
        && addr - e.addr <= e.len - len
}

/// Finds the live MR with `key` in `dev`'s table and checks PD, bounds and access. One snapshot
/// read of the entry: the control plane writes an entry long before it sets `valid`, and clears
/// `valid` to deregister.
pub(super) unsafe fn check_mr(mrs: Mrs, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let index = (key >> 8) as u64;
        if index >= mrs.len as u64 {
            return false;
        }
        allows(
            &core::ptr::read_volatile(mrs.table.add(index as usize)),
            key,
            pd,
            addr,
            len,
            need,
        )
    }
}

/// Validates everything, then performs the operation. Nothing is written unless every check
/// passed. Returns the byte count for the CQE or a syndrome.
unsafe fn execute(v: &View, wqe: &Wqe, bytes: &[u8; MAX_WQE_BYTES], defer: &mut Taken) -> Result<u32, u8> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (mrs, pd) = (v.mrs, v.pd);
        let (raddr, rkey, rlen, raccess) = match wqe.op {
            WqeOp::Nop => return Ok(0),
            WqeOp::Write {
                raddr,
                rkey,
                sges,
                n_sges,
            } => {
                check_sges(mrs, pd, &sges, n_sges, 0)?;
                (raddr, rkey, total(&sges, n_sges), access::REMOTE_WRITE)
            }
            WqeOp::WriteInline { raddr, rkey, len, .. } => (raddr, rkey, len as u64, access::REMOTE_WRITE),
            WqeOp::Read {
                raddr,
                rkey,
                sges,
                n_sges,
            } => {
                check_sges(mrs, pd, &sges, n_sges, access::LOCAL_WRITE)?;
                (raddr, rkey, total(&sges, n_sges), access::REMOTE_READ)
            }
            WqeOp::Atomic {
                op,
                raddr,
                rkey,
                result,
            } => {
                check_sges(mrs, pd, &[result; MAX_SGES], 1, access::LOCAL_WRITE)?;
                (raddr, rkey, op.width() as u64, access::REMOTE_ATOMIC)
            }
        };
        if !v.remote_ready {
            // No responder, or one that is not ready: it never answers and the retries run out.
            return Err(syndrome::TRANSPORT_RETRY_EXC_ERR);
        }
        if !check_mr(v.remote_mrs, rkey, v.remote_pd, raddr, rlen, raccess) {
            // The responder NAKs the request and, as an RC responder does after a remote access
            // violation, moves its own QP to ERR (on hardware: IBV_EVENT_QP_ACCESS_ERR on its side).
            responder_error(v.remote, syndrome::REMOTE_ACCESS_ERR);
            return Err(syndrome::REMOTE_ACCESS_ERR);
        }
        match wqe.op {
            WqeOp::Nop => Ok(0),
            WqeOp::Write { sges, n_sges: 1, .. } => {
                defer.copy_dst = raddr;
                defer.copy_src = sges[0].addr;
                defer.copy_len = sges[0].len;
                Ok(sges[0].len)
            }
            WqeOp::Read { sges, n_sges: 1, .. } => {
                defer.copy_dst = sges[0].addr;
                defer.copy_src = raddr;
                defer.copy_len = sges[0].len;
                Ok(sges[0].len)
            }
            WqeOp::Write { sges, n_sges, .. } => {
                let mut off = 0u64;
                for s in &sges[..n_sges as usize] {
                    copy_bytes((raddr + off) as *mut u8, s.addr as *const u8, s.len as usize);
                    off += s.len as u64;
                }
                Ok(off as u32)
            }
            WqeOp::WriteInline { offset, len, .. } => {
                let dst = raddr as *mut u8;
                let mut k = 0;
                while k < len as usize {
                    dst.add(k).write_volatile(bytes[offset as usize + k]);
                    k += 1;
                }
                Ok(len)
            }
            WqeOp::Read { sges, n_sges, .. } => {
                let mut off = 0u64;
                for s in &sges[..n_sges as usize] {
                    copy_bytes(s.addr as *mut u8, (raddr + off) as *const u8, s.len as usize);
                    off += s.len as u64;
                }
                Ok(off as u32)
            }
            WqeOp::Atomic { op, result, .. } => {
                if raddr & (op.width() as u64 - 1) != 0 {
                    return Err(syndrome::REMOTE_INVAL_REQ_ERR);
                }
                let old = atomic(&op, raddr);
                if op.width() == 8 {
                    (result.addr as *mut u64).write_unaligned(old);
                } else {
                    (result.addr as *mut u32).write_unaligned(old as u32);
                }
                Ok(op.width())
            }
        }
    }
}

fn total(sges: &[Sge; MAX_SGES], n: u8) -> u64 {
    sges[..n as usize].iter().map(|s| s.len as u64).sum()
}

unsafe fn check_sges(mrs: Mrs, pd: u32, sges: &[Sge; MAX_SGES], n: u8, need: u32) -> Result<(), u8> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        for s in &sges[..n as usize] {
            if !check_mr(mrs, s.lkey, pd, s.addr, s.len as u64, need) {
                return Err(syndrome::LOCAL_PROT_ERR);
            }
        }
        Ok(())
    }
}

/// Performs `op` atomically at `addr` (aligned to its width); returns the previous value.
pub(super) unsafe fn atomic(op: &AtomicOp, addr: u64) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        match *op {
            AtomicOp::FetchAdd64 { add } => arch::atomic_add_acq_rel_sys_u64(addr as *mut u64, add),
            AtomicOp::CompareSwap64 { compare, swap } => {
                arch::atomic_cas_acq_rel_sys_u64(addr as *mut u64, compare, swap)
            }
            _ if op.width() == 8 => {
                let p = addr as *mut u64;
                let mut old = arch::load_relaxed_sys_u64(p);
                loop {
                    let new = super::parse::apply_atomic(op, old);
                    let seen = arch::atomic_cas_acq_rel_sys_u64(p, old, new);
                    if seen == old {
                        return old;
                    }
                    old = seen;
                }
            }
            _ => {
                let p = addr as *mut u32;
                let mut old = arch::load_relaxed_sys_u32(p);
                loop {
                    let new = super::parse::apply_atomic(op, old as u64) as u32;
                    let seen = arch::atomic_cas_acq_rel_sys_u32(p, old, new);
                    if seen == old {
                        return old as u64;
                    }
                    old = seen;
                }
            }
        }
    }
}

/// Byte copy that tolerates overlap (a loopback QP may copy within one region).
pub(super) unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { core::ptr::copy(src, dst, len) }
}

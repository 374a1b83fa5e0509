//! One pass of the emulated device over one QP: learn the producer index (doorbell, or DBR when a
//! doorbell was lost), then fetch, validate, execute and complete WQEs in order.

use super::cqe::write_cqe;
use super::learn::learn;
use super::model::{Demand, Model};
use super::parse::{parse, wqebbs_of, Rejected, Sge, Wqe, WqeOp, MAX_SGES, MAX_WQE_BYTES};
use ibgda_abi::emu::{access, CqContext, DeviceContext, MrEntry, QpContext, QpState};
use ibgda_abi::mlx5::syndrome;
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
    /// The responder is RTR or RTS: on the batch path read once per pass and lane, when planning
    /// first needs it (`None` until then; see [`load_responder_state`]); the one-at-a-time path
    /// reads it for each WQE it executes.
    pub(super) remote_ready: Option<bool>,
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
    /// Rate model: when the latest batch paced so far is due (completed: after the round trip of
    /// its READs and atomics); a CQE waits for it (engine ns).
    pub(super) cqe_due_ns: u64,
    /// The local and the remote region this lane checked last: in this pass, or on the batch
    /// path of a GPU engine warp within the key lease (see `worker::LaneKeys`).
    pub(super) local_mr: MrCache,
    /// See `local_mr`.
    pub(super) remote_mr: MrCache,
    /// The device's key lease ([`DeviceContext::key_lease_ns`]), read with the pass's switches.
    pub(super) key_lease_ns: u64,
    /// Whether a doorbell (or the DBR) exposed new WQEs in this pass.
    pub learned: bool,
    /// Whether the DBR (not a doorbell) exposed them (a lost doorbell recovered).
    pub(super) from_dbr: bool,
    /// `%globaltimer` when a doorbell exposed this pass's WQEs (0 when none did).
    pub doorbell_ns: u64,
}

/// A device's memory-region table.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mrs {
    pub(super) table: *const MrEntry,
    pub(super) len: u32,
}

impl Mrs {
    pub(super) unsafe fn of(dev: *const DeviceContext) -> Mrs {
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
        // What this pass's bookings taught it of the port's clocks (see `PortFloor`).
        let mut floor = super::model::PortFloor::default();
        while wqebbs < budget {
            let (k, wqes) = super::batch::batch_with_serial_lanes(&mut v, budget - wqebbs, &mut floor);
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
                super::retire::await_cqe_due(v);
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
        if v.model.on {
            // For the next pass (see `QpContext::rd_outstanding`).
            arch::store_relaxed_sys_u64(field!(v.qp, rd_outstanding), v.rd_outstanding);
            arch::store_relaxed_sys_u64(field!(v.qp, rd_due_ns), v.rd_due_ns);
        }
        if v.doorbell_ns != 0 {
            arch::red_add_relaxed_sys_u64(field!(v.qp, learned_ns_sum), v.doorbell_ns);
            arch::red_add_relaxed_sys_u64(field!(v.qp, finished_ns_sum), arch::global_timer_ns());
        }
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
                    let fenced = super::decode::fence_requested(bytes[11]);
                    // One WQE on its own: nothing known of the port (it is raised as needed).
                    let mut floor = super::model::PortFloor::default();
                    super::retire::pace_counted(v, &d, fenced, d.round_trip as u64, &mut floor);
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

/// One memory region's entry as a lane last read it (a ConnectX caches its mkey contexts too):
/// the lanes of a batch check the same few keys over and over, and each read of the table is a
/// round trip to memory (over NVLink for the responder's). The one-at-a-time path fills it within
/// one service pass only; a GPU engine warp's batch path keeps it for the device's key lease
/// ([`DeviceContext::key_lease_ns`]), which the control plane waits out after it deregisters a
/// region, so a region deregistered before a WQE was posted is never used for it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MrCache {
    entry: MrEntry,
}

impl MrCache {
    /// Holds no entry (the first check loads one).
    pub(super) const EMPTY: MrCache = MrCache {
        entry: MrEntry {
            key: 0,
            pd: 0,
            access: 0,
            valid: 0,
            addr: 0,
            len: 0,
        },
    };
}

/// The responder QP `remote`'s state word (RESET when null), for [`ready_state`]. On two GPUs its
/// context is the other GPU's memory, so the planner issues this load, then the responder's key
/// entry, and looks at neither until both are on their way.
///
/// # Safety
/// `remote` is null or a live QP context.
#[inline(always)]
pub(super) unsafe fn load_responder_state(remote: *mut QpContext) -> u32 {
    if remote.is_null() {
        return QpState::Reset as u32;
    }
    // SAFETY: this function's `# Safety` contract; the state is read atomically.
    unsafe { arch::load_relaxed_sys_u32(field!(remote, state)) }
}

/// Whether a responder in `state` answers requests (RTR or RTS).
#[inline(always)]
pub(super) fn ready_state(state: u32) -> bool {
    state == QpState::Rtr as u32 || state == QpState::Rts as u32
}

/// Makes `cache` hold the table's entry for `key`, loading it only when the cached one is for
/// another key; whether `key` names an entry of the table at all. Nothing waits for the load here:
/// a caller that refreshes two caches before checking either has both loads in flight at once.
///
/// # Safety
/// As [`check_mr`].
#[inline(always)]
pub(super) unsafe fn refresh_mr_cache(cache: &mut MrCache, mrs: Mrs, key: u32) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let index = (key >> 8) as u64;
        if index >= mrs.len as u64 {
            return false;
        }
        if cache.entry.valid != 1 || cache.entry.key != key {
            cache.entry = load_mr_entry(mrs.table.add(index as usize));
        }
        true
    }
}

/// Whether `cache` (refreshed for `key` by [`refresh_mr_cache`]) allows `need` over
/// `[addr, addr + len)` in `pd`.
#[inline(always)]
pub(super) fn cached_mr_allows(cache: &MrCache, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> bool {
    allows(&cache.entry, key, pd, addr, len, need)
}

/// A snapshot of memory-region entry `e` in two 16-byte loads, both in flight at once (a
/// field-by-field volatile read is six).
///
/// # Safety
/// `e` is a live entry of a memory-region table (32-byte aligned).
#[inline(always)]
unsafe fn load_mr_entry(e: *const MrEntry) -> MrEntry {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let p = e as *const [u64; 2];
        let (a, b) = (arch::load_volatile_v2_u64(p), arch::load_volatile_v2_u64(p.add(1)));
        // The `#[repr(C)]` layout: key, pd, access, valid (u32 each, little-endian), addr, len.
        MrEntry {
            key: a[0] as u32,
            pd: (a[0] >> 32) as u32,
            access: a[1] as u32,
            valid: (a[1] >> 32) as u32,
            addr: b[0],
            len: b[1],
        }
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
        allows(&load_mr_entry(mrs.table.add(index as usize)), key, pd, addr, len, need)
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
        if !v
            .remote_ready
            .unwrap_or_else(|| ready_state(load_responder_state(v.remote)))
        {
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
                let old = atomic::<false>(&op, raddr);
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

/// Performs `op` atomically at `addr` (aligned to its width); returns the previous value. With
/// `FENCED` the caller ran a system-scope fence after everything this atomic must follow (the
/// warp path: data, then one fence, then the batch's atomics), which with a relaxed
/// read-modify-write forms the release pattern; otherwise the read-modify-write itself is
/// acquire-release (the one-at-a-time path, whose data comes just before it in the same thread).
pub(super) unsafe fn atomic<const FENCED: bool>(op: &AtomicOp, addr: u64) -> u64 {
    // One system-scope read-modify-write at this call's ordering.
    macro_rules! rmw {
        ($relaxed:ident, $acq_rel:ident ($($a:expr),*)) => {
            if FENCED {
                arch::$relaxed($($a),*)
            } else {
                arch::$acq_rel($($a),*)
            }
        };
    }
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        match *op {
            AtomicOp::FetchAdd64 { add } => {
                rmw!(
                    atomic_add_relaxed_sys_u64,
                    atomic_add_acq_rel_sys_u64(addr as *mut u64, add)
                )
            }
            AtomicOp::CompareSwap64 { compare, swap } => {
                rmw!(
                    atomic_cas_relaxed_sys_u64,
                    atomic_cas_acq_rel_sys_u64(addr as *mut u64, compare, swap)
                )
            }
            // The masked forms that are one plain read-modify-write (a signal's set is a masked
            // compare-and-swap comparing nothing and writing every bit; a 4-byte add a masked add
            // with no field boundary): one atomic instead of a load and a compare-and-swap loop,
            // which cost two round trips to the responder's memory.
            AtomicOp::MaskedCompareSwap64 {
                swap,
                compare_mask: 0,
                swap_mask: u64::MAX,
                ..
            } => rmw!(
                atomic_swap_relaxed_sys_u64,
                atomic_swap_acq_rel_sys_u64(addr as *mut u64, swap)
            ),
            AtomicOp::MaskedCompareSwap32 {
                swap,
                compare_mask: 0,
                swap_mask: u32::MAX,
                ..
            } => rmw!(
                atomic_swap_relaxed_sys_u32,
                atomic_swap_acq_rel_sys_u32(addr as *mut u32, swap)
            ) as u64,
            AtomicOp::MaskedFetchAdd64 { add, boundary: 0 } => {
                rmw!(
                    atomic_add_relaxed_sys_u64,
                    atomic_add_acq_rel_sys_u64(addr as *mut u64, add)
                )
            }
            AtomicOp::MaskedFetchAdd32 { add, boundary: 0 } => rmw!(
                atomic_add_relaxed_sys_u32,
                atomic_add_acq_rel_sys_u32(addr as *mut u32, add)
            ) as u64,
            _ if op.width() == 8 => {
                let p = addr as *mut u64;
                let mut old = arch::load_relaxed_sys_u64(p);
                loop {
                    let new = super::parse::apply_atomic(op, old);
                    let seen = rmw!(atomic_cas_relaxed_sys_u64, atomic_cas_acq_rel_sys_u64(p, old, new));
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
                    let seen = rmw!(atomic_cas_relaxed_sys_u32, atomic_cas_acq_rel_sys_u32(p, old, new));
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

#[cfg(test)]
mod tests {
    use super::load_mr_entry;
    use ibgda_abi::emu::MrEntry;

    #[test]
    fn a_memory_region_entry_loads_whole_in_two_halves() {
        let e = MrEntry {
            key: 0x1234_5601,
            pd: 7,
            access: 0b1011,
            valid: 1,
            addr: 0x7f00_0000_1000,
            len: 1 << 33,
        };
        // SAFETY: a live, aligned entry.
        assert_eq!(unsafe { load_mr_entry(&e) }, e);
    }
}

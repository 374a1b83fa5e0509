//! One pass of the emulated device over one QP: learn the producer index (doorbell, or DBR when a
//! doorbell was lost), then fetch, validate, execute and complete WQEs in order.

use super::parse::{parse, wqebbs_of, Rejected, Sge, Wqe, WqeOp, MAX_SGES, MAX_WQE_BYTES};
use crate::arch;
use crate::ibgda::AtomicOp;
use ibgda_abi::emu::{access, CqContext, CqMode, DeviceContext, MrEntry, QpContext, QpState};
use ibgda_abi::mlx5::{cqe_opcode, syndrome, Be32, CqeTail, CQE_BYTES, SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};

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

/// Services `qp` on the calling thread: reads its doorbell (and, when idle for the device's
/// recovery interval, its DBR), then processes at most `budget` WQEs, copying data itself.
///
/// # Safety
/// `qp` is a live [`QpContext`] created by the emulated device's control plane, with live queue,
/// DBR, UAR, CQ and device tables; only one engine thread services a given QP at a time; the
/// memory its memory regions name is live.
pub unsafe fn service_qp(qp: *mut QpContext, budget: u32) -> Serviced {
    let mut out = Serviced::default();
    match learn(qp) {
        None => return out,
        Some(l) => out.learned = l,
    }
    while out.wqes < budget {
        let Some(t) = take(qp) else { break };
        if t.copy_len > 0 {
            copy_bytes(t.copy_dst as *mut u8, t.copy_src as *const u8, t.copy_len as usize);
            arch::fence_acq_rel_sys();
        }
        complete(qp, &t);
        out.wqes += 1;
    }
    out
}

/// First half of a service pass: `None` when the device is paused or the QP is not processing
/// (RESET, INIT, RTR); otherwise whether a doorbell (or the DBR) exposed new WQEs.
///
/// # Safety
/// As [`service_qp`].
pub unsafe fn learn(qp: *mut QpContext) -> Option<bool> {
    let dev = (*qp).device as *const DeviceContext;
    if arch::load_acquire_sys_u32(field!(dev as *mut DeviceContext, paused)) != 0 {
        return None;
    }
    let state = arch::load_acquire_sys_u32(field!(qp, state));
    if state != QpState::Rts as u32 && state != QpState::Err as u32 {
        // RESET, INIT and RTR queues are not processed; a doorbell stays latched in the register.
        return None;
    }
    let depth = 1u64 << (*qp).log_sq_depth;
    let mut learned = learn_doorbell(qp, depth);
    let consumed = arch::load_relaxed_sys_u64(field!(qp, consumed));
    let posted = arch::load_relaxed_sys_u64(field!(qp, posted));
    if !learned && consumed == posted {
        let now = arch::global_timer_ns();
        let last = arch::load_relaxed_sys_u64(field!(qp, last_dbr_check_ns));
        if now.wrapping_sub(last) >= (*dev).dbr_recovery_ns {
            arch::store_relaxed_sys_u64(field!(qp, last_dbr_check_ns), now);
            let raw = arch::load_acquire_sys_u32(((*qp).dbr + SND_DBR_OFFSET as u64) as *const u32);
            if advance_posted(qp, Be32::from_raw(raw).get() as u16, depth) {
                arch::atomic_add_relaxed_sys_u64(field!(qp, doorbells_recovered), 1);
                learned = true;
            }
        }
    }
    Some(learned)
}

/// Takes the next posted WQE, if any: validates it and executes everything but its bulk copy
/// (see [`Taken`]). A failing WQE moves the QP to ERR and has its error CQE written here.
///
/// # Safety
/// As [`service_qp`], after [`learn`] returned `Some`.
pub unsafe fn take(qp: *mut QpContext) -> Option<Taken> {
    let consumed = arch::load_relaxed_sys_u64(field!(qp, consumed));
    let posted = arch::load_relaxed_sys_u64(field!(qp, posted));
    if consumed >= posted {
        return None;
    }
    let dev = (*qp).device as *const DeviceContext;
    let depth = 1u64 << (*qp).log_sq_depth;
    Some(process_one(qp, dev, consumed, posted - consumed, depth))
}

/// Finishes a [`take`]n WQE once its copy is visible: writes its CQE (if signalled) and retires
/// its WQEBBs.
///
/// # Safety
/// As [`take`]; `t` is the last WQE taken from `qp`.
pub unsafe fn complete(qp: *mut QpContext, t: &Taken) {
    if t.outcome != 0 {
        arch::atomic_add_relaxed_sys_u64(field!(qp, wqes_executed), 1);
        if t.outcome == 1 {
            delay_completion((*qp).device as *const DeviceContext);
            write_cqe(qp, t.wqe_index, Ok(t.byte_cnt), t.opcode);
        }
    }
    let consumed = arch::load_relaxed_sys_u64(field!(qp, consumed));
    arch::store_relaxed_sys_u64(field!(qp, consumed), consumed + t.wqebbs as u64);
}

/// Reads the doorbell register; returns whether it exposed new WQEs.
unsafe fn learn_doorbell(qp: *mut QpContext, depth: u64) -> bool {
    let reg = ((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64;
    // Acquire: the poster's WQE and DBR stores happen before its doorbell store.
    let raw = arch::load_acquire_sys_u64(reg);
    if raw == arch::load_relaxed_sys_u64(field!(qp, last_doorbell)) {
        return false;
    }
    arch::store_relaxed_sys_u64(field!(qp, last_doorbell), raw);
    let bytes = raw.to_le_bytes();
    let pi = u16::from_be_bytes([bytes[1], bytes[2]]);
    let qpn = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) >> 8;
    if qpn != (*qp).qpn {
        return false;
    }
    let drops = field!(qp, drop_doorbells);
    let pending = arch::load_relaxed_sys_u32(drops);
    if pending > 0 && arch::atomic_cas_acq_rel_sys_u32(drops, pending, pending - 1) == pending {
        arch::atomic_add_relaxed_sys_u64(field!(qp, doorbells_dropped), 1);
        return false;
    }
    let learned = advance_posted(qp, pi, depth);
    if learned {
        arch::atomic_add_relaxed_sys_u64(field!(qp, doorbells_seen), 1);
    }
    learned
}

/// Moves `posted` forward to the 16-bit producer index `pi`; values that do not move it forward
/// by at most the queue depth (stale or bogus) are ignored.
unsafe fn advance_posted(qp: *mut QpContext, pi: u16, depth: u64) -> bool {
    let posted = arch::load_relaxed_sys_u64(field!(qp, posted));
    let consumed = arch::load_relaxed_sys_u64(field!(qp, consumed));
    let delta = pi.wrapping_sub(posted as u16) as u64;
    if delta == 0 || posted + delta - consumed > depth {
        return false;
    }
    arch::store_relaxed_sys_u64(field!(qp, posted), posted + delta);
    true
}

/// Fetches, validates and executes (all but the bulk copy of) the WQE at `index`.
unsafe fn process_one(qp: *mut QpContext, dev: *const DeviceContext, index: u64, available: u64, depth: u64) -> Taken {
    let sq = (*qp).sq;
    let slot = |i: u64| sq + ((i & (depth - 1)) << 6);
    let ctrl = slot(index) as *const u8;
    let ds = ctrl.add(7).read_volatile();
    let op_byte = ctrl.add(3).read_volatile();
    let wqebbs = (wqebbs_of(ds) as u64).min(available) as u32;
    let mut t = Taken {
        wqebbs,
        ..Taken::default()
    };
    let qpn = (*qp).qpn;
    if arch::load_acquire_sys_u32(field!(qp, state)) == QpState::Err as u32 {
        // Hardware flushes every outstanding WQE with a CQE, signalled or not.
        complete_error(qp, index as u16, op_byte, syndrome::WR_FLUSH_ERR);
        return t;
    }
    if wqebbs_of(ds) as u64 > available {
        // The WQE claims WQEBBs the producer index does not cover.
        fail(qp, index as u16, op_byte, syndrome::LOCAL_QP_OP_ERR);
        return t;
    }
    // Gather the WQEBBs (they may wrap around the ring) with 8-byte loads.
    let mut words = [0u64; MAX_WQE_BYTES / 8];
    let mut b = 0;
    while b < wqebbs.min(4) as usize {
        let src = slot(index + b as u64) as *const u64;
        let mut k = 0;
        while k < 8 {
            words[b * 8 + k] = src.add(k).read_volatile();
            k += 1;
        }
        b += 1;
    }
    // SAFETY: same size; u8 has no alignment requirement; the words hold the bytes in memory
    // order (little-endian loads stored back little-endian).
    let bytes = &*(words.as_ptr() as *const [u8; MAX_WQE_BYTES]);
    match parse(bytes, qpn, index as u16) {
        Err(Rejected { syndrome, opcode }) => fail(qp, index as u16, opcode, syndrome),
        Ok(wqe) => match execute(qp, dev, &wqe, bytes, &mut t) {
            Ok(byte_cnt) => {
                t.byte_cnt = byte_cnt;
                t.wqe_index = wqe.wqe_index;
                t.opcode = wqe.opcode;
                t.outcome = if wqe.signaled { 1 } else { 2 };
            }
            Err(s) => {
                t.copy_len = 0;
                fail(qp, wqe.wqe_index, wqe.opcode, s)
            }
        },
    }
    t
}

unsafe fn delay_completion(dev: *const DeviceContext) {
    let delay = arch::load_relaxed_sys_u64(field!(dev as *mut DeviceContext, completion_delay_ns));
    if delay > 0 {
        let start = arch::global_timer_ns();
        while arch::global_timer_ns().wrapping_sub(start) < delay {
            arch::nanosleep(1000);
        }
    }
}

/// Moves the QP to ERR (remembering the first syndrome) and writes the error CQE.
unsafe fn fail(qp: *mut QpContext, wqe_index: u16, op: u8, syndrome: u8) {
    arch::atomic_cas_acq_rel_sys_u32(field!(qp, error_syndrome), 0, syndrome as u32);
    arch::store_release_sys_u32(field!(qp, state), QpState::Err as u32);
    complete_error(qp, wqe_index, op, syndrome);
}

unsafe fn complete_error(qp: *mut QpContext, wqe_index: u16, op: u8, syndrome: u8) {
    write_cqe(qp, wqe_index, Err(syndrome), op);
}

/// Finds the live MR with `key` in `dev`'s table and checks PD, bounds and access.
unsafe fn check_mr(dev: *const DeviceContext, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> bool {
    let index = (key >> 8) as u64;
    if index >= (*dev).max_mrs as u64 {
        return false;
    }
    let mr = ((*dev).mrs as *mut MrEntry).add(index as usize);
    if arch::load_acquire_sys_u32(field!(mr, valid)) != 1 {
        return false;
    }
    let e = core::ptr::read_volatile(mr);
    e.key == key
        && e.pd == pd
        && e.access & need == need
        && addr >= e.addr
        && len <= e.len
        && addr - e.addr <= e.len - len
}

/// Validates everything, then performs the operation. Nothing is written unless every check
/// passed. Returns the byte count for the CQE or a syndrome.
unsafe fn execute(
    qp: *mut QpContext,
    dev: *const DeviceContext,
    wqe: &Wqe,
    bytes: &[u8; MAX_WQE_BYTES],
    defer: &mut Taken,
) -> Result<u32, u8> {
    let pd = (*qp).pd;
    let (raddr, rkey, rlen, raccess) = match wqe.op {
        WqeOp::Nop => return Ok(0),
        WqeOp::Write {
            raddr,
            rkey,
            sges,
            n_sges,
        } => {
            check_sges(dev, pd, &sges, n_sges, 0)?;
            (raddr, rkey, total(&sges, n_sges), access::REMOTE_WRITE)
        }
        WqeOp::WriteInline { raddr, rkey, len, .. } => (raddr, rkey, len as u64, access::REMOTE_WRITE),
        WqeOp::Read {
            raddr,
            rkey,
            sges,
            n_sges,
        } => {
            check_sges(dev, pd, &sges, n_sges, access::LOCAL_WRITE)?;
            (raddr, rkey, total(&sges, n_sges), access::REMOTE_READ)
        }
        WqeOp::Atomic {
            op,
            raddr,
            rkey,
            result,
        } => {
            check_sges(dev, pd, &[result; MAX_SGES], 1, access::LOCAL_WRITE)?;
            (raddr, rkey, op.width() as u64, access::REMOTE_ATOMIC)
        }
    };
    let remote = (*qp).remote as *mut QpContext;
    if remote.is_null() {
        return Err(syndrome::TRANSPORT_RETRY_EXC_ERR);
    }
    let rstate = arch::load_acquire_sys_u32(field!(remote, state));
    if rstate != QpState::Rtr as u32 && rstate != QpState::Rts as u32 {
        // A responder that is not ready never answers: the requester's retries run out.
        return Err(syndrome::TRANSPORT_RETRY_EXC_ERR);
    }
    let rdev = (*remote).device as *const DeviceContext;
    if !check_mr(rdev, rkey, (*remote).pd, raddr, rlen, raccess) {
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
            arch::fence_acq_rel_sys();
            Ok(off as u32)
        }
        WqeOp::WriteInline { offset, len, .. } => {
            let dst = raddr as *mut u8;
            let mut k = 0;
            while k < len as usize {
                dst.add(k).write_volatile(bytes[offset as usize + k]);
                k += 1;
            }
            arch::fence_acq_rel_sys();
            Ok(len)
        }
        WqeOp::Read { sges, n_sges, .. } => {
            let mut off = 0u64;
            for s in &sges[..n_sges as usize] {
                copy_bytes(s.addr as *mut u8, (raddr + off) as *const u8, s.len as usize);
                off += s.len as u64;
            }
            arch::fence_acq_rel_sys();
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
            arch::fence_acq_rel_sys();
            Ok(op.width())
        }
    }
}

fn total(sges: &[Sge; MAX_SGES], n: u8) -> u64 {
    sges[..n as usize].iter().map(|s| s.len as u64).sum()
}

unsafe fn check_sges(dev: *const DeviceContext, pd: u32, sges: &[Sge; MAX_SGES], n: u8, need: u32) -> Result<(), u8> {
    for s in &sges[..n as usize] {
        if !check_mr(dev, s.lkey, pd, s.addr, s.len as u64, need) {
            return Err(syndrome::LOCAL_PROT_ERR);
        }
    }
    Ok(())
}

/// Performs `op` atomically at `addr` (aligned to its width); returns the previous value.
unsafe fn atomic(op: &AtomicOp, addr: u64) -> u64 {
    match *op {
        AtomicOp::FetchAdd64 { add } => arch::atomic_add_acq_rel_sys_u64(addr as *mut u64, add),
        AtomicOp::CompareSwap64 { compare, swap } => arch::atomic_cas_acq_rel_sys_u64(addr as *mut u64, compare, swap),
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

/// Byte copy that tolerates overlap (a loopback QP may copy within one region).
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    core::ptr::copy(src, dst, len)
}

/// Writes one CQE: the body with relaxed stores, then the last 8 bytes (QPN, `wqe_counter`,
/// `op_own`) with one release store, so a poller that sees the new tail sees the whole CQE.
unsafe fn write_cqe(qp: *mut QpContext, wqe_index: u16, result: Result<u32, u8>, wqe_opcode: u8) {
    let cq = (*qp).cq as *mut CqContext;
    let log = (*cq).log_size;
    let produced = arch::load_relaxed_sys_u64(field!(cq, produced));
    let (entry, owner) = if (*cq).mode == CqMode::Collapsed as u32 {
        (0u64, 0u8)
    } else {
        let ci = Be32::from_raw(arch::load_acquire_sys_u32((*cq).dbr as *const u32)).get() & 0xff_ffff;
        let outstanding = (produced as u32).wrapping_sub(ci) & 0xff_ffff;
        if outstanding as u64 >= 1u64 << log {
            arch::store_release_sys_u32(field!(cq, overrun), 1);
            return;
        }
        (produced & ((1u64 << log) - 1), ((produced >> log) & 1) as u8)
    };
    let cqe = ((*cq).buf + entry * CQE_BYTES as u64) as *mut u64;
    let qpn = (*qp).qpn;
    let (word6, tail) = match result {
        Ok(byte_cnt) => {
            // byte_cnt at 44 (upper half of word 5), timestamp at 48 (word 6).
            let w5 = (Be32::new(byte_cnt).to_raw() as u64) << 32;
            arch::store_relaxed_sys_u64(cqe.add(5), w5);
            (
                arch::global_timer_ns().to_be(),
                CqeTail {
                    sop_drop_qpn: qpn,
                    wqe_counter: wqe_index,
                    op_own: (cqe_opcode::REQ << 4) | owner,
                },
            )
        }
        Err(s) => {
            arch::store_relaxed_sys_u64(cqe.add(5), 0);
            // vendor_err_synd at 54 (0), syndrome at 55.
            (
                (s as u64) << 56,
                CqeTail {
                    sop_drop_qpn: ((wqe_opcode as u32) << 24) | qpn,
                    wqe_counter: wqe_index,
                    op_own: (cqe_opcode::REQ_ERR << 4) | owner,
                },
            )
        }
    };
    let mut w = 0;
    while w < 5 {
        arch::store_relaxed_sys_u64(cqe.add(w), 0);
        w += 1;
    }
    arch::store_relaxed_sys_u64(cqe.add(6), word6);
    arch::store_release_sys_u64(cqe.add(7), tail.to_raw());
    arch::store_relaxed_sys_u64(field!(cq, produced), produced + 1);
}

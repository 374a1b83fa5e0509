//! Completion-queue writes: one CQE per completion, in the CQ's owner-bit ring or (collapsed)
//! its single slot, with the overrun a ConnectX raises when the consumer falls behind.

use super::engine::View;
use ibgda_abi::emu::QpState;
use ibgda_abi::mlx5::{cqe_opcode, Be32, CqeTail, CQE_BYTES};
use ibgda_device::arch;

/// The last three words of a CQE (the body before them is zero): word 5 (`byte_cnt`), word 6
/// (timestamp, or the syndrome) and the tail (QPN, `wqe_counter`, `op_own`), as little-endian
/// memory words.
#[inline(always)]
pub(super) fn cqe_words(qpn: u32, wqe_index: u16, result: Result<u32, u8>, wqe_opcode: u8, owner: u8) -> [u64; 3] {
    match result {
        Ok(byte_cnt) => [
            // byte_cnt at 44 (upper half of word 5), timestamp at 48 (word 6).
            (Be32::new(byte_cnt).to_raw() as u64) << 32,
            arch::global_timer_ns().to_be(),
            CqeTail {
                sop_drop_qpn: qpn,
                wqe_counter: wqe_index,
                op_own: (cqe_opcode::REQ << 4) | owner,
            }
            .to_raw(),
        ],
        // vendor_err_synd at 54 (0), syndrome at 55.
        Err(s) => [
            0,
            (s as u64) << 56,
            CqeTail {
                sop_drop_qpn: ((wqe_opcode as u32) << 24) | qpn,
                wqe_counter: wqe_index,
                op_own: (cqe_opcode::REQ_ERR << 4) | owner,
            }
            .to_raw(),
        ],
    }
}

/// Writes a CQE's body (words 0 to 6) at `entry` of the CQ buffer; the tail follows after a fence.
///
/// # Safety
/// `cq_buf` is a live CQE buffer with more than `entry` entries.
#[inline(always)]
pub(super) unsafe fn write_cqe_body(cq_buf: u64, entry: u64, words: &[u64; 3]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let cqe = (cq_buf + entry * CQE_BYTES as u64) as *mut u64;
        let mut w = 0;
        while w < 5 {
            arch::store_relaxed_sys_u64(cqe.add(w), 0);
            w += 1;
        }
        arch::store_relaxed_sys_u64(cqe.add(5), words[0]);
        arch::store_relaxed_sys_u64(cqe.add(6), words[1]);
    }
}

/// Publishes a CQE's tail (its last 8 bytes, with the owner bit) after its body and the data it
/// reports were ordered before it by a system-scope fence.
///
/// # Safety
/// As [`write_cqe_body`].
#[inline(always)]
pub(super) unsafe fn write_cqe_tail(cq_buf: u64, entry: u64, words: &[u64; 3]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { arch::store_relaxed_sys_u64((cq_buf + entry * CQE_BYTES as u64 + 56) as *mut u64, words[2]) }
}

/// Room for CQEs in `v`'s owner-bit CQ (produced minus the consumer index the poller published),
/// and the producer count; a collapsed CQ always has room.
///
/// # Safety
/// `v` is a live pass's view (lane 0's).
pub(super) unsafe fn cq_room(v: &View) -> (u64, u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if v.cq_collapsed {
            return (u64::MAX, 0);
        }
        let cq = v.cq;
        let produced = arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*cq).produced));
        let ci = Be32::from_raw(arch::load_acquire_sys_u32((*cq).dbr as *const u32)).get() & 0xff_ffff;
        let outstanding = (produced as u32).wrapping_sub(ci) & 0xff_ffff;
        ((1u64 << v.cq_log).saturating_sub(outstanding as u64), produced)
    }
}

/// Writes one CQE: the body with relaxed stores, then the last 8 bytes (QPN, `wqe_counter`,
/// `op_own`) after one fence, so a poller that sees the new tail sees the whole CQE.
pub(super) unsafe fn write_cqe(v: &View, wqe_index: u16, result: Result<u32, u8>, wqe_opcode: u8) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let cq = v.cq;
        let log = v.cq_log;
        let (room, produced) = cq_room(v);
        if room == 0 {
            // As on hardware: the CQ is in error (the host reads it as an async event) and the QP
            // whose completion was lost is fatal, so nothing more completes unseen.
            arch::store_release_sys_u32(core::ptr::addr_of_mut!((*cq).overrun), 1);
            arch::store_release_sys_u32(core::ptr::addr_of_mut!((*v.qp).state), QpState::Err as u32);
            return;
        }
        let (entry, owner) = if v.cq_collapsed {
            (0u64, 0u8)
        } else {
            (produced & ((1u64 << log) - 1), ((produced >> log) & 1) as u8)
        };
        let words = cqe_words(v.qpn, wqe_index, result, wqe_opcode, owner);
        write_cqe_body(v.cq_buf, entry, &words);
        // One fence then a plain store of the tail: the fence orders the WQE's data and the CQE body
        // before the tail (a release store would be a second fence).
        arch::fence_acq_rel_sys();
        write_cqe_tail(v.cq_buf, entry, &words);
        if !v.cq_collapsed {
            arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*cq).produced), produced + 1);
        }
    }
}

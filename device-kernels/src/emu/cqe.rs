//! Completion-queue writes: one CQE per completion, in the CQ's owner-bit ring or (collapsed)
//! its single slot, with the overrun a ConnectX raises when the consumer falls behind.

use super::engine::View;
use crate::arch;
use ibgda_abi::emu::QpState;
use ibgda_abi::mlx5::{cqe_opcode, Be32, CqeTail, CQE_BYTES};

/// Writes one CQE: the body with relaxed stores, then the last 8 bytes (QPN, `wqe_counter`,
/// `op_own`) with one release store, so a poller that sees the new tail sees the whole CQE.
pub(super) unsafe fn write_cqe(v: &View, wqe_index: u16, result: Result<u32, u8>, wqe_opcode: u8) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let cq = v.cq;
        let log = v.cq_log;
        let (entry, owner) = if v.cq_collapsed {
            (0u64, 0u8)
        } else {
            let produced = arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*cq).produced));
            let ci = Be32::from_raw(arch::load_acquire_sys_u32((*cq).dbr as *const u32)).get() & 0xff_ffff;
            let outstanding = (produced as u32).wrapping_sub(ci) & 0xff_ffff;
            if outstanding as u64 >= 1u64 << log {
                // As on hardware: the CQ is in error (the host reads it as an async event) and the QP
                // whose completion was lost is fatal, so nothing more completes unseen.
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*cq).overrun), 1);
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*v.qp).state), QpState::Err as u32);
                return;
            }
            (produced & ((1u64 << log) - 1), ((produced >> log) & 1) as u8)
        };
        let cqe = (v.cq_buf + entry * CQE_BYTES as u64) as *mut u64;
        let qpn = v.qpn;
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
        // One fence then a plain store of the tail: the fence orders the WQE's data and the CQE body
        // before the tail (a release store would be a second fence).
        arch::fence_acq_rel_sys();
        arch::store_relaxed_sys_u64(cqe.add(7), tail.to_raw());
        if !v.cq_collapsed {
            let produced = arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*cq).produced));
            arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*cq).produced), produced + 1);
        }
    }
}

//! Executing a planned batch's WQEs in their lanes: inline WRITEs from the WQE's words, and
//! atomics, atomics on one word one after another in WQE order.

use super::batch::LanePlan;
use ibgda_device::arch;
use ibgda_device::ibgda::AtomicOp;

/// Copies a planned inline WRITE's payload from its WQEBB words: one 8- or 4-byte store when the
/// payload is that long and its destination aligned (a `p` of a word, the usual case), else byte
/// by byte. Every index into the words is a constant, so they stay in registers on a GPU (a
/// computed index would put them in local memory).
///
/// # Safety
/// `plan` came from [`plan_lane`] or [`plan_words`] with `words`, is an inline write, and its destination was
/// validated.
pub unsafe fn execute_inline(plan: &LanePlan, words: &[u64; 8]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        // The payload starts 4 bytes into word 4 (byte 36: `decode_lane` accepts no other).
        debug_assert_eq!(plan.inline_offset, 36);
        let payload = [
            words[4] >> 32 | words[5] << 32,
            words[5] >> 32 | words[6] << 32,
            words[6] >> 32 | words[7] << 32,
            words[7] >> 32,
        ];
        let dst = plan.dst as *mut u8;
        if plan.len == 8 && plan.dst.is_multiple_of(8) {
            (dst as *mut u64).write_volatile(payload[0]);
            return;
        }
        if plan.len == 4 && plan.dst.is_multiple_of(4) {
            (dst as *mut u32).write_volatile(payload[0] as u32);
            return;
        }
        let mut word = 0;
        while word < payload.len() {
            let mut b = 0;
            while b < 8 {
                let k = word * 8 + b;
                if k < plan.len as usize {
                    dst.add(k).write_volatile((payload[word] >> (8 * b)) as u8);
                }
                b += 1;
            }
            word += 1;
        }
    }
}

/// Executes a planned atomic: updates its target and lands the previous value where its result
/// goes (at the operand's width).
///
/// With `FENCED` the caller ran a system-scope fence after everything the atomic must follow, and
/// the read-modify-write is relaxed; otherwise it is acquire-release.
///
/// # Safety
/// `plan` is a planned, validated atomic of this batch; `op` its operation.
pub unsafe fn execute_atomic<const FENCED: bool>(op: &AtomicOp, plan: &LanePlan) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let old = super::engine::atomic::<FENCED>(op, plan.src);
        if op.width() == 8 {
            (plan.dst as *mut u64).write_unaligned(old);
        } else {
            (plan.dst as *mut u32).write_unaligned(old as u32);
        }
    }
}

/// Executes the atomics of a warp batch (lane `l` holds WQE `l`; `mine` when it is this lane's to
/// run): atomics on different words at once, atomics on one word (8-byte granule) one after
/// another in WQE order, a warp barrier between rounds (the barrier orders a round's
/// read-modify-writes before the next round's). Every lane must call it.
///
/// The caller has run a system-scope fence after the data they follow (a warp barrier, then the
/// fence), so each read-modify-write is relaxed: fence then write is the release pattern.
///
/// # Safety
/// As [`execute_atomic`] for every lane's own plan, and the fence above.
pub unsafe fn execute_atomics_lanes(plan: &LanePlan, lane: u32, mine: bool) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        // Lanes without an atomic match nothing: their keys are distinct and above any granule.
        let key = if mine { plan.src >> 3 } else { u64::MAX - lane as u64 };
        let same = arch::match_any_u64(u32::MAX, key);
        let rank = if arch::mutant(arch::Mutant::UnorderedAtomics) {
            0
        } else {
            (same & arch::lanemask_lt()).count_ones()
        };
        let mut round = 0;
        loop {
            if mine && rank == round {
                if let Some(op) = plan.atomic {
                    execute_atomic::<true>(&op, plan);
                }
            }
            round += 1;
            if arch::ballot(mine && rank >= round) == 0 {
                break;
            }
            arch::sync_warp();
        }
    }
}

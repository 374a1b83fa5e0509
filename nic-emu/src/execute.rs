//! Executing a planned batch's WQEs in their lanes: inline WRITEs from the WQE's words, and
//! atomics, atomics on one word one after another in WQE order.

use super::batch::LanePlan;
use ibgda_device::arch;
use ibgda_device::ibgda::AtomicOp;

/// Copies a planned inline WRITE's payload from its WQEBB words: one 8- or 4-byte store when the
/// payload is that long and its destination aligned (a `p` of a word, the usual case); else in
/// the widest aligned accesses that divide its length and destination (a warp's combined `p`s:
/// each value stored whole, as a PCIe write of the payload would land it), else byte by byte.
/// Every index into the words is a constant, so they stay in registers on a GPU (a computed index
/// would put them in local memory).
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
        let (len, at) = (plan.len as usize, plan.dst);
        if len.is_multiple_of(8) && at.is_multiple_of(8) {
            return store_in::<8>(dst, &payload, len);
        }
        if len.is_multiple_of(4) && at.is_multiple_of(4) {
            return store_in::<4>(dst, &payload, len);
        }
        if len.is_multiple_of(2) && at.is_multiple_of(2) {
            return store_in::<2>(dst, &payload, len);
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

/// Stores the first `len` bytes of `payload` at `dst` in `W`-byte accesses (8, 4 or 2); `W`
/// divides `len` and `dst`'s alignment. The loop's bound and every index are constants, so it
/// unrolls and the words stay in registers.
///
/// # Safety
/// `dst..dst+len` is writable and aligned to `W`.
#[inline(always)]
unsafe fn store_in<const W: usize>(dst: *mut u8, payload: &[u64; 4], len: usize) {
    let mut k = 0;
    while k < 32 / W {
        if W * k < len {
            let v = payload[W * k / 8] >> (8 * (W * k % 8));
            // SAFETY: this function's contract: `W * k < len`, aligned to `W`.
            unsafe {
                match W {
                    8 => (dst as *mut u64).add(k).write_volatile(v),
                    4 => (dst as *mut u32).add(k).write_volatile(v as u32),
                    _ => (dst as *mut u16).add(k).write_volatile(v as u16),
                }
            }
        }
        k += 1;
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

#[cfg(test)]
mod tests {
    use super::execute_inline;
    use crate::batch::LanePlan;

    /// A WQEBB whose inline payload (from byte 36) is `payload`, as the lanes load it.
    fn wqebb_with(payload: &[u8]) -> [u64; 8] {
        let mut bytes = [0u8; 64];
        bytes[36..36 + payload.len()].copy_from_slice(payload);
        core::array::from_fn(|i| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()))
    }

    #[test]
    fn inline_payloads_land_exactly_at_every_length_and_alignment() {
        let payload: [u8; 28] = core::array::from_fn(|b| (b as u8).wrapping_mul(37) ^ 0xa5);
        let words = wqebb_with(&payload);
        for len in 1..=28usize {
            for shift in 0..8usize {
                let mut buf = [0u64; 6];
                let base = buf.as_mut_ptr() as *mut u8;
                let plan = LanePlan {
                    dst: base as u64 + shift as u64,
                    len: len as u32,
                    inline_offset: 36,
                    ..LanePlan::default()
                };
                // SAFETY: the destination is inside `buf` (at most 7 + 28 of its 48 bytes).
                unsafe { execute_inline(&plan, &words) };
                // SAFETY: `buf`'s 48 bytes, read after the stores.
                let got = unsafe { core::slice::from_raw_parts(base, 48) };
                let mut want = [0u8; 48];
                want[shift..shift + len].copy_from_slice(&payload[..len]);
                assert_eq!(got, &want[..], "{len} bytes at offset {shift}");
            }
        }
    }
}

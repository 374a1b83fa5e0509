//! DeepEP's `get_dispatch_layout` on the device.

use crate::valid_expert;
use ibgda_device::arch;

ibgda_device::kernel! {
    /// DeepEP's `get_dispatch_layout`: from `topk_idx [tokens, topk]` (`-1` = no expert) count
    /// tokens per rank and per expert, and mark `in_rank [tokens, ranks]` (every entry written).
    /// The counts must be zero on entry (the host zeroes them). An index outside `-1..experts` is
    /// skipped and a token that has one, plus 1, is stored in `bad` (unless it is null).
    pub fn ep_layout(topk_idx: *const i64, tokens: u32, topk: u32, experts: u32, ranks: u32, tokens_per_rank: *mut u32, tokens_per_expert: *mut u32, in_rank: *mut u8, bad: *mut u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let local = experts / ranks;
            let mut t = arch::global_thread_id();
            while t < tokens as u64 {
                let mut mask: u64 = 0;
                let mut k = 0;
                while k < topk {
                    let e = *topk_idx.add((t * topk as u64 + k as u64) as usize);
                    if valid_expert(e, experts) {
                        arch::atomic_add_relaxed_sys_u32(tokens_per_expert.add(e as usize), 1);
                        mask |= 1u64 << (e as u32 / local);
                    } else if e != -1 && !bad.is_null() {
                        arch::store_relaxed_sys_u32(bad, t as u32 + 1);
                    }
                    k += 1;
                }
                let mut r = 0;
                while r < ranks {
                    let hit = (mask >> r) & 1;
                    *in_rank.add((t * ranks as u64 + r as u64) as usize) = hit as u8;
                    if hit != 0 {
                        arch::atomic_add_relaxed_sys_u32(tokens_per_rank.add(r as usize), 1);
                    }
                    r += 1;
                }
                t += arch::global_thread_count();
            }
        }
    }
}

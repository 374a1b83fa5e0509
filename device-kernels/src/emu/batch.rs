//! The engine's batch path: the lanes of a warp take the next WQEs of one QP at once. Each lane
//! plans one WQE ([`plan_lane`]: parse and every check, writing nothing); lane 0 keeps the longest
//! prefix that may run concurrently ([`batch_len`]); the lanes copy; one fence, the requested
//! CQEs and one consumer-index store retire them ([`complete_batch`]). Everything else goes
//! through the one-at-a-time path in [`super::engine`], which also produces every error CQE.
//! The GPU runs it with real lanes ([`super::worker`]); the CPU engine with the lanes one after
//! another ([`batch_with_serial_lanes`]).

use super::cqe::write_cqe;
use super::engine::{check_mr, copy_bytes, View};
use super::parse::{parse, wqebbs_of, WqeOp, MAX_WQE_BYTES};
use crate::arch;
use ibgda_abi::emu::{access, MrEntry, QpContext};

/// Most WQEs one warp executes at once: one per lane.
pub const BATCH_LANES: usize = 32;

/// One WQE as a warp lane would execute it in a batch (see [`plan_lane`] and [`batch_len`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LanePlan {
    /// A single-WQEBB WRITE (one gather entry, or inline data) that parsed and passed every check:
    /// executing it is a copy of `len` bytes to `dst` and nothing else.
    pub batchable: bool,
    /// Destination (the responder's memory).
    pub dst: u64,
    /// Source (the requester's memory); 0 for inline data, which comes from the WQE itself.
    pub src: u64,
    /// Bytes.
    pub len: u32,
    /// Inline payload's offset in the WQE (inline writes only).
    pub inline_offset: u8,
    /// A CQE is requested.
    pub signaled: bool,
    /// The WQE's 16-bit index and opcode (for its CQE).
    pub wqe_index: u16,
    /// mlx5 opcode.
    pub opcode: u8,
}

/// How many of `plans[..n]` (consecutive WQEs from the consumer index, one per lane) a warp may
/// execute at once: the longest prefix of batchable WQEs whose destinations overlap neither each
/// other nor an earlier one's source. Executing such a prefix concurrently is indistinguishable
/// from executing it in order (every later WQE reads and writes bytes no earlier one writes), so
/// RC ordering holds; anything else (a multi-WQEBB WQE, a READ, an atomic, a failing check, an
/// overlap) ends the batch and goes through the one-at-a-time path, which also produces the exact
/// error CQE.
pub fn batch_len(plans: &[LanePlan], n: usize) -> usize {
    let n = n.min(plans.len());
    let overlaps = |a: u64, alen: u32, b: u64, blen: u32| a < b + blen as u64 && b < a + alen as u64;
    let mut k = 0;
    while k < n {
        let p = &plans[k];
        if !p.batchable {
            break;
        }
        let mut j = 0;
        while j < k {
            let q = &plans[j];
            if overlaps(p.dst, p.len, q.dst, q.len)
                || (p.src != 0 && overlaps(p.src, p.len, q.dst, q.len))
                || (q.src != 0 && overlaps(p.dst, p.len, q.src, q.len))
            {
                return k;
            }
            j += 1;
        }
        k += 1;
    }
    k
}

impl View {
    /// The consumer index (WQEBBs retired).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }
    /// The producer index learned so far.
    pub fn posted(&self) -> u64 {
        self.posted
    }
}

/// Whether a pass over `v` may execute WQEs in batches: the QP is not in error, completions are
/// not artificially delayed, and the responder is ready (otherwise every WQE fails, one at a time).
pub fn batching_allowed(v: &View) -> bool {
    !v.in_error && v.delay_ns == 0 && v.remote_ready
}

/// The `i`-th WQE after the consumer index, planned for a batch (lane `i` of the warp calls it
/// with a copy of lane 0's view): loads its first WQEBB, parses and validates it without writing
/// anything. Returns the plan and the WQEBB's words (inline payloads are copied from them).
///
/// # Safety
/// As [`take`]; `i < v.posted - v.consumed`.
pub unsafe fn plan_lane(v: &View, i: u64) -> (LanePlan, [u64; 8]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let index = v.consumed + i;
        let slot = (v.sq + ((index & (v.depth - 1)) << 6)) as *const u64;
        let mut words = [0u64; 8];
        let mut k = 0;
        while k < 8 {
            words[k] = slot.add(k).read_volatile();
            k += 1;
        }
        let mut plan = LanePlan::default();
        if wqebbs_of((words[0] >> 56) as u8) != 1 {
            return (plan, words);
        }
        let mut bytes = [0u8; MAX_WQE_BYTES];
        let mut b = 0;
        while b < 64 {
            bytes[b] = (words[b / 8] >> (8 * (b % 8))) as u8;
            b += 1;
        }
        let Ok(wqe) = parse(&bytes, v.qpn, index as u16) else {
            return (plan, words);
        };
        let (dst, rkey, src, len, inline_offset) = match wqe.op {
            WqeOp::Write {
                raddr,
                rkey,
                sges,
                n_sges: 1,
            } => {
                if !check_mr(v.mrs, sges[0].lkey, v.pd, sges[0].addr, sges[0].len as u64, 0) {
                    return (plan, words);
                }
                (raddr, rkey, sges[0].addr, sges[0].len, 0)
            }
            WqeOp::WriteInline {
                raddr,
                rkey,
                offset,
                len,
            } => (raddr, rkey, 0, len, offset),
            _ => return (plan, words),
        };
        if !v.remote_ready || !check_mr(v.remote_mrs, rkey, v.remote_pd, dst, len as u64, access::REMOTE_WRITE) {
            return (plan, words);
        }
        plan = LanePlan {
            batchable: len > 0 && (src != 0 || inline_offset != 0),
            dst,
            src,
            len,
            inline_offset,
            signaled: wqe.signaled,
            wqe_index: wqe.wqe_index,
            opcode: wqe.opcode,
        };
        (plan, words)
    }
}

/// Lane 0's view (passed as `Some` in lane 0), as every lane of the warp needs it to plan its
/// own WQE: the queue, the keys' tables and the consumer index, shuffled from lane 0. The
/// completion side (CQ, counters) stays lane 0's. Every lane must call it.
pub fn lane_view(v: Option<&View>) -> View {
    let u64_of = |f: fn(&View) -> u64| arch::shfl_idx_u64(v.map_or(0, f), 0);
    let u32_of = |f: fn(&View) -> u32| arch::shfl_idx_u32(v.map_or(0, f), 0);
    View {
        qp: u64_of(|v| v.qp as u64) as *mut QpContext,
        sq: u64_of(|v| v.sq),
        depth: u64_of(|v| v.depth),
        qpn: u32_of(|v| v.qpn),
        pd: u32_of(|v| v.pd),
        cq: core::ptr::null_mut(),
        cq_buf: 0,
        cq_log: 0,
        cq_collapsed: false,
        mrs: super::engine::Mrs {
            table: u64_of(|v| v.mrs.table as u64) as *const MrEntry,
            len: u32_of(|v| v.mrs.len),
        },
        delay_ns: 0,
        remote: core::ptr::null_mut(),
        remote_ready: u32_of(|v| v.remote_ready as u32) != 0,
        remote_pd: u32_of(|v| v.remote_pd),
        remote_mrs: super::engine::Mrs {
            table: u64_of(|v| v.remote_mrs.table as u64) as *const MrEntry,
            len: u32_of(|v| v.remote_mrs.len),
        },
        in_error: u32_of(|v| v.in_error as u32) != 0,
        consumed: u64_of(|v| v.consumed),
        posted: u64_of(|v| v.posted),
        executed: 0,
        batched: 0,
        learned: false,
    }
}

/// Copies a planned inline WRITE's payload from its WQEBB words.
///
/// # Safety
/// `plan` came from [`plan_lane`] with `words`, is an inline write, and its destination was
/// validated.
pub unsafe fn execute_inline(plan: &LanePlan, words: &[u64; 8]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let dst = plan.dst as *mut u8;
        let mut k = 0;
        while k < plan.len as usize {
            let at = plan.inline_offset as usize + k;
            dst.add(k).write_volatile((words[at / 8] >> (8 * (at % 8))) as u8);
            k += 1;
        }
    }
}

/// Retires a batch of `plans[..k]` after every lane's copy (ordered before this call by the
/// caller's warp barrier): one system-scope fence for all of them (cumulative over the lanes'
/// stores), the CQEs the WQEs requested (only the last one on a collapsed CQ, which keeps only the
/// latest), then the consumer index once.
///
/// # Safety
/// As [`complete`]; `plans[..k]` are the next `k` WQEs of `v`, executed.
pub unsafe fn complete_batch(v: &mut View, plans: &[LanePlan], k: usize) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        arch::fence_acq_rel_sys();
        let mut j = 0;
        while j < k {
            let p = &plans[j];
            let last_signaled = !(j + 1..k).any(|l| plans[l].signaled);
            if p.signaled && (!v.cq_collapsed || last_signaled) {
                write_cqe(v, p.wqe_index, Ok(p.len), p.opcode);
            }
            j += 1;
        }
        v.executed += k as u64;
        v.batched += k as u64;
        v.consumed += k as u64;
        arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.qp).consumed), v.consumed);
    }
}

/// The GPU engine's batch path ([`plan_lane`], [`batch_len`], [`complete_batch`]) with the warp's
/// 32 lanes run one after another by this thread: what the CPU engine executes, so every CPU test
/// of the device (exact syndromes, random traffic against a model) runs the batch rules too.
/// Returns the WQEs executed (0: take the next one alone).
///
/// # Safety
/// As [`service_qp`], with `v` from [`learn`].
pub(super) unsafe fn batch_with_serial_lanes(v: &mut View, limit: u32) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if !batching_allowed(v) || v.posted - v.consumed < 2 {
            return 0;
        }
        let avail = (v.posted - v.consumed).min(BATCH_LANES as u64).min(limit as u64) as usize;
        let mut plans = [LanePlan::default(); BATCH_LANES];
        let mut words = [[0u64; 8]; BATCH_LANES];
        let mut j = 0;
        while j < avail {
            (plans[j], words[j]) = plan_lane(v, j as u64);
            j += 1;
        }
        let k = batch_len(&plans, avail);
        if k < 2 {
            return 0;
        }
        for (p, w) in plans[..k].iter().zip(&words[..k]) {
            if p.src == 0 {
                execute_inline(p, w);
            } else {
                copy_bytes(p.dst as *mut u8, p.src as *const u8, p.len as usize);
            }
        }
        complete_batch(v, &plans, k);
        k as u32
    }
}

#[cfg(test)]
mod batch_rules {
    use super::{batch_len, LanePlan};

    fn write(dst: u64, src: u64, len: u32) -> LanePlan {
        LanePlan {
            batchable: true,
            dst,
            src,
            len,
            inline_offset: if src == 0 { 36 } else { 0 },
            ..LanePlan::default()
        }
    }

    #[test]
    fn a_batch_is_the_prefix_of_disjoint_batchable_writes() {
        let plans = [
            write(0, 1000, 8),
            write(8, 1008, 8),
            write(16, 0, 4),
            write(100, 2000, 64),
        ];
        assert_eq!(batch_len(&plans, 4), 4);
        assert_eq!(batch_len(&plans, 2), 2, "never beyond n");
        let mut stop = plans;
        stop[2].batchable = false;
        assert_eq!(
            batch_len(&stop, 4),
            2,
            "a READ, atomic, failing or multi-WQEBB WQE ends it"
        );
    }

    #[test]
    fn overlaps_end_the_batch_so_order_is_kept() {
        // The same word written twice: the second must land after the first.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(0, 1008, 8)], 2), 1);
        // Partial overlap of destinations.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(4, 1008, 8)], 2), 1);
        // A later WRITE reading what an earlier one writes (a loopback QP).
        assert_eq!(batch_len(&[write(0, 1000, 8), write(64, 4, 8)], 2), 1);
        // An earlier WRITE reading what a later one overwrites.
        assert_eq!(batch_len(&[write(0, 64, 8), write(60, 0, 8)], 2), 1);
        // Adjacent ranges do not overlap.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(8, 1008, 8)], 2), 2);
    }
}

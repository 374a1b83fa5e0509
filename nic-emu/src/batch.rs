//! The engine's batch path: the lanes of a warp take the next WQEs of one QP at once. Each lane
//! plans one WQE ([`plan_lane`], or [`load_batch_words`] then [`plan_words`]: decode and every
//! check, writing nothing); the lanes keep the longest prefix that may run concurrently
//! ([`batch_len`], [`batch_len_lanes`]); the lanes copy; one fence, the requested CQEs and one
//! consumer-index store retire them ([`complete_batch`], [`complete_batch_lanes`], which on a
//! collapsed CQ retires several consecutive batches at once). Everything else goes through the
//! one-at-a-time path in [`super::engine`], which also produces every error CQE. The GPU runs it
//! with real lanes ([`super::worker`]); the CPU engine with the lanes one after another
//! ([`batch_with_serial_lanes`]).

use super::cqe::cq_room;
use super::decode::{decode_lane, LaneWqe};
use super::engine::{check_mr_cached, copy_bytes, MrCache, View};
use super::model::{Demand, Model};
use super::retire::{complete_batch, demand_of_plan};
use ibgda_abi::emu::{access, MrEntry, QpContext};
use ibgda_device::arch;
use ibgda_device::ibgda::AtomicOp;

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
    /// The WQE asks for a fence: it may only start a batch (everything before it has then been
    /// executed, and the batch begins with a system-scope fence).
    pub fenced: bool,
    /// An atomic: `src` is its target (the responder's word), `dst` where its result lands, `len`
    /// the width. The lanes execute a batch's atomics after its data, and atomics on one word one
    /// after another in WQE order.
    pub atomic: Option<AtomicOp>,
    /// The WQE spans this lane's WQEBB and the next lane's (the 8-byte masked compare-and-swap).
    pub wide: bool,
    /// This lane's WQEBB is the second of the previous lane's WQE: nothing to execute or complete.
    pub continuation: bool,
}

/// The second WQEBB of a two-WQEBB WQE, as its lane's plan.
pub const CONTINUATION: LanePlan = LanePlan {
    batchable: true,
    dst: 0,
    src: 0,
    len: 0,
    inline_offset: 0,
    signaled: false,
    wqe_index: 0,
    opcode: 0,
    fenced: false,
    atomic: None,
    wide: false,
    continuation: true,
};

/// Where WQEs start among `avail` consecutive WQEBBs (bit `l`: lane `l`'s WQEBB is a WQE's first),
/// given the lanes whose WQEBB, read as a first one, claims two (`two`): the first WQEBB starts a
/// WQE, and each WQE's WQEBBs follow it. Every lane computes the same mask from the same ballot.
#[inline(always)]
pub fn wqe_starts(two: u32, avail: u32) -> u32 {
    let mut starts = 0u32;
    let mut l = 0;
    while l < avail && l < 32 {
        starts |= 1 << l;
        l += if two >> l & 1 != 0 { 2 } else { 1 };
    }
    starts
}

impl LanePlan {
    /// An RDMA READ or an atomic: its response comes back (what `max_rd_atomic` bounds).
    #[inline(always)]
    pub fn round_trip(&self) -> bool {
        !self.continuation && (self.atomic.is_some() || self.opcode == ibgda_abi::mlx5::opcode::RDMA_READ)
    }

    /// RDMA WRITE or READ data (not an atomic, not a NOP).
    #[inline(always)]
    pub fn moves_data(&self) -> bool {
        self.atomic.is_none() && self.len > 0
    }
}

/// How many of `plans[..n]` (consecutive WQEs from the consumer index, one per lane) a warp may
/// execute at once: the longest prefix of batchable WQEs (one-WQEBB WRITEs, READs, atomics and
/// NOPs, every check passed) such that
/// - a WQE with a fence mode comes first or not at all (the batch ends before it, so everything
///   before it has executed when it starts: the fence bit waits for the QP's earlier READs and
///   atomics, and the batch that it starts begins with a system-scope fence);
/// - no WRITE or READ follows an atomic (the lanes execute a batch's data first, then its atomics,
///   so an atomic is never overtaken by a later WRITE and always follows the data posted before
///   it: a signal after its data);
/// - no destination overlaps another WQE's destination or an earlier one's source (an atomic's
///   destination is where its result lands, its source the word it updates). Atomics on the same
///   word are allowed: the lanes execute them one after another in WQE order.
///
/// Executing such a prefix concurrently leaves memory exactly as executing it in order would. What
/// a concurrent observer may see is weaker than strict order: the WRITEs and READs of one batch
/// take effect in no particular order among themselves, which is what NVSHMEM promises for puts
/// and gets until a `fence` or `quiet` (both wait for completions on this transport). Anything else
/// (a multi-WQEBB WQE, a failing check) ends the batch and goes through the one-at-a-time path,
/// which also produces the exact error CQE.
pub fn batch_len(plans: &[LanePlan], n: usize) -> usize {
    let n = n.min(plans.len());
    let overlaps = |a: u64, alen: u32, b: u64, blen: u32| a < b + blen as u64 && b < a + alen as u64;
    let mut k = 0;
    let mut atomic_before = false;
    while k < n {
        let p = &plans[k];
        if !p.batchable || (k > 0 && p.fenced) || (atomic_before && p.moves_data()) {
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
        atomic_before |= p.atomic.is_some();
        k += 1;
    }
    // Never between a two-WQEBB WQE's halves.
    if k > 0 && plans[k - 1].wide {
        k -= 1;
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
    /// The QP context this view is of.
    pub fn qp(&self) -> *mut QpContext {
        self.qp
    }
    /// Moves a lane's copy of the view to lane 0's consumer index.
    pub fn set_consumed(&mut self, consumed: u64) {
        self.consumed = consumed;
    }
}

/// Whether a pass over `v` may execute WQEs in batches: the QP is not in error, completions are
/// not artificially delayed, and the responder is ready (otherwise every WQE fails, one at a time).
pub fn batching_allowed(v: &View) -> bool {
    !v.in_error && v.delay_ns == 0 && v.remote_ready
}

/// The `i`-th WQEBB after the consumer index, read as a WQE's first and planned for a batch
/// (lane `i` of the warp calls it with its copy of lane 0's view): loads it (and the next one's
/// first 16 bytes), decodes ([`decode_lane`]) and validates it without writing anything. Returns
/// the plan and the WQEBB's words (inline payloads are copied from them).
///
/// # Safety
/// As [`take`](super::engine::take); `i < v.posted - v.consumed`.
pub unsafe fn plan_lane(v: &mut View, i: u64) -> (LanePlan, [u64; 8]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let words = load_wqebb(v, i);
        let next = load_wqebb(v, i + 1);
        (plan_words(v, i, &words, [next[0], next[1]]), words)
    }
}

/// The first WQEBB of the `i`-th WQE after the consumer index, with four 16-byte loads.
///
/// # Safety
/// As [`plan_lane`].
#[inline(always)]
unsafe fn load_wqebb(v: &View, i: u64) -> [u64; 8] {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let index = v.consumed + i;
        let slot = (v.sq + ((index & (v.depth - 1)) << 6)) as *const [u64; 2];
        let mut words = [0u64; 8];
        let mut k = 0;
        while k < 4 {
            let pair = arch::load_volatile_v2_u64(slot.add(k));
            words[2 * k] = pair[0];
            words[2 * k + 1] = pair[1];
            k += 1;
        }
        words
    }
}

/// The `i`-th WQEBB after the consumer index, read as a WQE's first and planned from its `words`
/// (loaded by [`plan_lane`] or [`load_batch_words`]; `next`, the next WQEBB's first 16 bytes, are
/// read only by a two-WQEBB WQE): decoded ([`decode_lane`]) and validated without writing
/// anything.
///
/// # Safety
/// As [`plan_lane`].
pub unsafe fn plan_words(v: &mut View, i: u64, words: &[u64; 8], next: [u64; 2]) -> LanePlan {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        match decode_lane(words, next, v.qpn, (v.consumed + i) as u16) {
            Some(w) => plan_of(v, &w),
            None => LanePlan::default(),
        }
    }
}

/// The first WQEBB of each of the next `avail` WQEs after the consumer index, loaded by the warp
/// together: lane `l` gets WQEBB `l` (zeros at or beyond `avail`). For a send queue the engine
/// reads over PCIe (`sq_remote`), each load instruction of the warp reads 512 consecutive bytes
/// (eight WQEBBs, sixteen bytes a lane), a quarter of the transactions of per-lane loads of whole
/// WQEBBs, and shuffles then give every lane its own (measured on an H100: proxy queues' batches
/// planned in half the time); for a queue in the engine's own memory the shuffles cost more than
/// they save, and each lane loads its own WQEBB. Every lane must call it.
///
/// # Safety
/// As [`plan_lane`], for every `i < avail`.
pub unsafe fn load_batch_words(v: &View, lane: u32, avail: u32) -> [u64; 8] {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if !v.sq_remote {
            return if lane < avail {
                load_wqebb(v, lane as u64)
            } else {
                [0u64; 8]
            };
        }
        // Load `k` of lane `l`: sixteen-byte piece `l % 4` of WQEBB `8k + l / 4`.
        let mut got = [[0u64; 2]; 4];
        let mut k = 0;
        while k < 4 {
            let w = 8 * k as u32 + lane / 4;
            if w < avail {
                let index = v.consumed + w as u64;
                let at = v.sq + ((index & (v.depth - 1)) << 6) + 16 * (lane % 4) as u64;
                got[k] = arch::load_volatile_v2_u64(at as *const [u64; 2]);
            }
            k += 1;
        }
        // Lane `l`'s piece `j` is load `l / 8` of lane `4 (l % 8) + j`.
        let mut words = [0u64; 8];
        let mut j = 0;
        while j < 4 {
            let src = 4 * (lane % 8) + j as u32;
            let mut k = 0;
            while k < 4 {
                let lo = arch::shfl_idx_u64(got[k][0], src);
                let hi = arch::shfl_idx_u64(got[k][1], src);
                if lane / 8 == k as u32 {
                    words[2 * j] = lo;
                    words[2 * j + 1] = hi;
                }
                k += 1;
            }
            j += 1;
        }
        words
    }
}

/// Checks a decoded WQE's keys, bounds and rights on both sides; a plan that is `batchable` only
/// when every check passes (otherwise the one-at-a-time path produces the syndrome).
unsafe fn plan_of(v: &mut View, w: &LaneWqe) -> LanePlan {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let base = LanePlan {
            len: w.len,
            signaled: w.signaled,
            wqe_index: w.wqe_index,
            opcode: w.opcode,
            fenced: w.fenced,
            ..LanePlan::default()
        };
        if w.opcode == ibgda_abi::mlx5::opcode::NOP {
            // Nothing to check or move: it completes (a NOP executes even against a responder
            // that is not ready).
            return LanePlan {
                batchable: true,
                ..base
            };
        }
        if let Some(op) = w.atomic {
            let width = op.width() as u64;
            // A misaligned target fails on the one-at-a-time path, with its syndrome.
            let ok = w.raddr & (width - 1) == 0
                && check_mr_cached(
                    &mut v.local_mr,
                    v.mrs,
                    w.lkey,
                    v.pd,
                    w.laddr,
                    width,
                    access::LOCAL_WRITE,
                )
                && v.remote_ready
                && check_mr_cached(
                    &mut v.remote_mr,
                    v.remote_mrs,
                    w.rkey,
                    v.remote_pd,
                    w.raddr,
                    width,
                    access::REMOTE_ATOMIC,
                );
            return LanePlan {
                batchable: ok && w.laddr != 0 && w.raddr != 0,
                dst: w.laddr,
                src: w.raddr,
                atomic: Some(op),
                wide: w.wqebbs == 2,
                ..base
            };
        }
        let read = w.opcode == ibgda_abi::mlx5::opcode::RDMA_READ;
        let inline = w.inline_offset != 0;
        let (local_need, remote_need) = if read {
            (access::LOCAL_WRITE, access::REMOTE_READ)
        } else {
            (0, access::REMOTE_WRITE)
        };
        if !inline && !check_mr_cached(&mut v.local_mr, v.mrs, w.lkey, v.pd, w.laddr, w.len as u64, local_need) {
            return LanePlan::default();
        }
        if !v.remote_ready
            || !check_mr_cached(
                &mut v.remote_mr,
                v.remote_mrs,
                w.rkey,
                v.remote_pd,
                w.raddr,
                w.len as u64,
                remote_need,
            )
        {
            return LanePlan::default();
        }
        let (dst, src) = if read { (w.laddr, w.raddr) } else { (w.raddr, w.laddr) };
        LanePlan {
            batchable: w.len > 0 && (src != 0 || inline),
            dst,
            src,
            inline_offset: w.inline_offset,
            ..base
        }
    }
}

/// [`batch_len`] computed by the lanes of a warp together, each holding its own plan (lanes at
/// or beyond `avail` hold none). The usual case is decided in a few warp instructions
/// ([`disjoint_at_a_glance`]); otherwise lane `j` checks its WQE against every earlier lane's
/// through shuffles and the first lane that may not join ends the batch. Returns the same `k` in
/// every lane; every lane must call it. Tested against [`batch_len`] on random plans, both ways
/// (`tests/tests/emu_lanes.rs`).
pub fn batch_len_lanes(plan: &LanePlan, lane: u32, avail: u32) -> u32 {
    // A WRITE or READ after an atomic, or a fenced WQE after the first, ends the batch too.
    let atomics = arch::ballot(lane < avail && plan.batchable && plan.atomic.is_some());
    let after_atomic = atomics != 0 && lane > atomics.trailing_zeros();
    let bad = arch::ballot(
        lane >= avail || !plan.batchable || (lane > 0 && plan.fenced) || (after_atomic && plan.moves_data()),
    );
    let k0 = if bad == 0 {
        avail.min(32)
    } else {
        bad.trailing_zeros().min(avail)
    };
    if k0 < 2 || disjoint_at_a_glance(plan, lane, k0) {
        return whole_wqes(plan, k0);
    }
    let overlaps = |a: u64, alen: u32, b: u64, blen: u32| a < b + blen as u64 && b < a + alen as u64;
    let mut stop = lane >= k0;
    let mut j = 0;
    while j + 1 < k0 {
        let (dst, src, len) = (
            arch::shfl_idx_u64(plan.dst, j),
            arch::shfl_idx_u64(plan.src, j),
            arch::shfl_idx_u32(plan.len, j),
        );
        if j < lane
            && (overlaps(plan.dst, plan.len, dst, len)
                || (plan.src != 0 && overlaps(plan.src, plan.len, dst, len))
                || (src != 0 && overlaps(plan.dst, plan.len, src, len)))
        {
            stop = true;
        }
        j += 1;
    }
    let stops = arch::ballot(stop);
    let k = if stops == 0 { k0 } else { stops.trailing_zeros().min(k0) };
    whole_wqes(plan, k)
}

/// `k`, less one when lane `k - 1` holds a two-WQEBB WQE whose second half is outside the first
/// `k` lanes (a batch never splits a WQE). Every lane must call it.
#[inline(always)]
fn whole_wqes(plan: &LanePlan, k: u32) -> u32 {
    let wide = arch::ballot(plan.wide);
    if k > 0 && wide >> (k - 1) & 1 != 0 {
        k - 1
    } else {
        k
    }
}

/// Whether the first `k` lanes' WQEs (all batchable) are certainly free of overlaps, decided
/// without comparing pairs: every destination fits in one aligned granule of a size common to
/// the batch (8 B for `p`-sized WRITEs, 4 KiB for page-sized ones, ...), no two lanes share a
/// granule (one `match.any`), and the sources' span misses the destinations' span. `false` means
/// "compare the pairs", never "they overlap".
fn disjoint_at_a_glance(plan: &LanePlan, lane: u32, k: u32) -> bool {
    // NOPs (nothing to overlap) and lanes outside the batch take no part.
    let mine = lane < k && plan.len > 0;
    let (lo, hi) = if mine {
        (plan.dst, plan.dst + plan.len as u64 - 1)
    } else {
        (0, 0)
    };
    // Granules of 8 B, 64 B, 512 B, 4 KiB, then every 16x up to 4 GiB.
    let mut g = 3;
    while arch::ballot(!mine || lo >> g == hi >> g) != u32::MAX {
        g += if g < 12 { 3 } else { 4 };
        if g > 32 {
            return false;
        }
    }
    // Lanes outside the batch match nothing: their keys are distinct and above any granule.
    let key = if mine { lo >> g } else { u64::MAX - lane as u64 };
    // SAFETY: every lane of the warp reaches this call (this function's callers are called by
    // every lane).
    let peers = unsafe { arch::match_any_u64(u32::MAX, key) };
    if arch::ballot(mine && peers != 1 << lane) != 0 {
        return false;
    }
    // The spans of the sources and of the destinations (inline data has no source).
    let has_src = mine && plan.src != 0;
    let mut span = [
        if mine { plan.dst } else { u64::MAX },
        if mine { hi } else { 0 },
        if has_src { plan.src } else { u64::MAX },
        if has_src { plan.src + plan.len as u64 - 1 } else { 0 },
    ];
    let mut off = 16;
    while off > 0 {
        let other = [
            arch::shfl_idx_u64(span[0], lane ^ off),
            arch::shfl_idx_u64(span[1], lane ^ off),
            arch::shfl_idx_u64(span[2], lane ^ off),
            arch::shfl_idx_u64(span[3], lane ^ off),
        ];
        span = [
            span[0].min(other[0]),
            span[1].max(other[1]),
            span[2].min(other[2]),
            span[3].max(other[3]),
        ];
        off /= 2;
    }
    let no_sources = span[2] > span[3];
    no_sources || span[3] < span[0] || span[1] < span[2]
}

/// Lane 0's view (passed as `Some` in lane 0), as every lane of the warp needs it to plan and
/// complete its own WQE: the queue, the keys' tables, the consumer index and where CQEs go,
/// shuffled from lane 0. The CQ's counters, the QP's statistics and the model's port stay lane
/// 0's. Every lane must call it.
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
        cq_buf: u64_of(|v| v.cq_buf),
        cq_log: u32_of(|v| v.cq_log),
        cq_collapsed: u32_of(|v| v.cq_collapsed as u32) != 0,
        sq_remote: u32_of(|v| v.sq_remote as u32) != 0,
        charge_fetch: false,
        mrs: super::engine::Mrs {
            table: u64_of(|v| v.mrs.table as u64) as *const MrEntry,
            len: u32_of(|v| v.mrs.len),
        },
        delay_ns: 0,
        dev: core::ptr::null_mut(),
        model: Model {
            on: u32_of(|v| v.model.on as u32) != 0,
            fs_per_byte: u64_of(|v| v.model.fs_per_byte),
            fs_per_msg: u64_of(|v| v.model.fs_per_msg),
            max_rd_atomic: u64_of(|v| v.model.max_rd_atomic),
            ..Model::default()
        },
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
        doorbell: 0,
        last_doorbell: 0,
        last_dbr_check_ns: 0,
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
/// # Safety
/// `plan` is a planned, validated atomic of this batch; `op` its operation.
pub unsafe fn execute_atomic(op: &AtomicOp, plan: &LanePlan) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let old = super::engine::atomic(op, plan.src);
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
/// # Safety
/// As [`execute_atomic`] for every lane's own plan.
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
                    execute_atomic(&op, plan);
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

/// The GPU engine's batch path ([`plan_lane`], [`batch_len`], [`complete_batch`]) with the warp's
/// 32 lanes run one after another by this thread: what the CPU engine executes, so every CPU test
/// of the device (exact syndromes, random traffic against a model) runs the batch rules too.
/// Returns the WQEBBs consumed and the WQEs executed ((0, 0): take the next one alone).
///
/// # Safety
/// As [`service_qp`], with `v` from [`learn`].
pub(super) unsafe fn batch_with_serial_lanes(v: &mut View, limit: u32) -> (u32, u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if !batching_allowed(v) || v.posted == v.consumed {
            return (0, 0);
        }
        let avail = (v.posted - v.consumed).min(BATCH_LANES as u64).min(limit as u64) as usize;
        let mut plans = [LanePlan::default(); BATCH_LANES];
        let mut words = [[0u64; 8]; BATCH_LANES];
        let mut j = 0;
        while j < avail {
            (plans[j], words[j]) = plan_lane(v, j as u64);
            if plans[j].wide || super::decode::claims_two_wqebbs(words[j][0]) {
                // Its second WQEBB is the next lane's, when it is here at all.
                if j + 1 < avail {
                    plans[j + 1] = CONTINUATION;
                } else {
                    plans[j].batchable = false;
                }
                j += 1;
            }
            j += 1;
        }
        let mut k = batch_len(&plans, avail);
        // The CQ must hold every CQE the batch asks for (an overrun is the one-at-a-time path's).
        let (room, _) = cq_room(v);
        while k > 0 && plans[..k].iter().filter(|p| p.signaled).count() as u64 > room {
            k -= 1;
        }
        if v.model.on {
            // At most the QP's room of READs and atomics outstanding: the batch ends before the
            // one past it (a WQE start: continuations are neither).
            let room = super::retire::rd_room(v);
            let mut seen = 0;
            let mut j = 0;
            while j < k {
                if plans[j].round_trip() {
                    seen += 1;
                    if seen > room {
                        k = j;
                        break;
                    }
                }
                j += 1;
            }
        }
        if k == 0 {
            return (0, 0);
        }
        if v.model.on {
            let mut d = Demand::default();
            for p in &plans[..k] {
                d.add(&demand_of_plan(&v.model, p));
            }
            let round_trips = plans[..k].iter().filter(|p| p.round_trip()).count() as u64;
            super::retire::pace_counted(v, &d, plans[0].fenced, round_trips);
        }
        // In WQE order: a batch's atomics follow its data (see `batch_len`), as the warp runs them.
        for (p, w) in plans[..k].iter().zip(&words[..k]) {
            if let Some(op) = p.atomic {
                execute_atomic(&op, p);
            } else if p.len == 0 {
                // A NOP, or a WQE's second WQEBB.
            } else if p.src == 0 {
                execute_inline(p, w);
            } else {
                copy_bytes(p.dst as *mut u8, p.src as *const u8, p.len as usize);
            }
        }
        complete_batch(v, &plans, k);
        arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.qp).batches), 1);
        arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.qp).retirements), 1);
        (k as u32, plans[..k].iter().filter(|p| !p.continuation).count() as u64)
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

    fn add(result: u64, target: u64) -> LanePlan {
        LanePlan {
            batchable: true,
            dst: result,
            src: target,
            len: 8,
            atomic: Some(ibgda_device::ibgda::AtomicOp::add(8, 1)),
            ..LanePlan::default()
        }
    }

    #[test]
    fn a_fence_only_starts_a_batch_and_no_data_follows_an_atomic() {
        let fenced = LanePlan {
            fenced: true,
            ..write(64, 1064, 8)
        };
        assert_eq!(
            batch_len(&[write(0, 1000, 8), fenced], 2),
            1,
            "a fence mid-batch ends it"
        );
        assert_eq!(batch_len(&[fenced, write(0, 1000, 8)], 2), 2, "a fence may start one");
        // Data, then atomics (a put, then its signal), then a NOP: one batch.
        let nop = LanePlan {
            batchable: true,
            ..LanePlan::default()
        };
        assert_eq!(batch_len(&[write(0, 1000, 8), add(2000, 3000), nop], 3), 3);
        // A WRITE after an atomic waits for the next batch.
        assert_eq!(batch_len(&[add(2000, 3000), write(0, 1000, 8)], 2), 1);
        // Atomics on one word share a batch (the lanes run them in WQE order); one whose result
        // lands on another's target does not.
        assert_eq!(batch_len(&[add(2000, 3000), add(2008, 3000)], 2), 2);
        assert_eq!(batch_len(&[add(2000, 3000), add(3000, 4000)], 2), 1);
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

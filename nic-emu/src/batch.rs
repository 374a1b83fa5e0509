//! The engine's batch path: the lanes of a warp take the next WQEs of one QP at once. Each lane
//! plans one WQE ([`plan_lane`], or [`load_batch_words`] then [`plan_words`]: decode and every
//! check, writing nothing); the lanes keep the longest prefix that may run concurrently
//! ([`super::rules`]); the lanes copy ([`super::execute`]); one fence, the requested CQEs and one
//! consumer-index store retire them ([`complete_batch`], [`complete_batch_lanes`], which on a
//! collapsed CQ retires several consecutive batches at once). Everything else goes through the
//! one-at-a-time path in [`super::engine`], which also produces every error CQE. The GPU runs it
//! with real lanes ([`super::worker`]); the CPU engine with the lanes one after another
//! ([`batch_with_serial_lanes`]).

use super::cqe::cq_room;
use super::decode::{decode_lane, LaneWqe};
use super::engine::{cached_mr_allows, copy_bytes, load_responder_state, ready_state, refresh_mr_cache, MrCache, View};
use super::execute::{execute_atomic, execute_inline};
use super::model::{Demand, Model, PortFloor};
use super::retire::{complete_batch, demand_of_plan};
use super::rules::batch_len;
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

/// Whether a pass over `v` may execute WQEs in batches: the QP is not in error and completions
/// are not artificially delayed. (A responder that is not ready makes every WQE but a NOP
/// unbatchable in planning, so they fail one at a time.)
pub fn batching_allowed(v: &View) -> bool {
    !v.in_error && v.delay_ns == 0
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
        // Both sides' keys are worked out first and both entries loaded before either is checked,
        // in code every lane runs alike: the local load and the remote one (the responder's
        // table, over NVLink on another GPU) are in flight at once, and an atomic's lane and a
        // WRITE's lane of one batch load together instead of one branch after the other.
        let read = w.opcode == ibgda_abi::mlx5::opcode::RDMA_READ;
        let inline = w.inline_offset != 0;
        let (len, local_need, remote_need) = match w.atomic {
            Some(op) => (op.width() as u64, access::LOCAL_WRITE, access::REMOTE_ATOMIC),
            None if read => (w.len as u64, access::LOCAL_WRITE, access::REMOTE_READ),
            None => (w.len as u64, 0, access::REMOTE_WRITE),
        };
        let check_local = !inline || w.atomic.is_some();
        let local_known = !check_local || refresh_mr_cache(&mut v.local_mr, v.mrs, w.lkey);
        // The responder's state (once per pass) and key entry: both loads issued before either
        // value is looked at, so they are in flight together.
        let state = if v.remote_ready.is_none() {
            load_responder_state(v.remote)
        } else {
            0
        };
        let remote_known = !v.remote.is_null() && refresh_mr_cache(&mut v.remote_mr, v.remote_mrs, w.rkey);
        let remote_known = *v.remote_ready.get_or_insert_with(|| ready_state(state)) && remote_known;
        let local_ok =
            !check_local || (local_known && cached_mr_allows(&v.local_mr, w.lkey, v.pd, w.laddr, len, local_need));
        let remote_ok = remote_known && cached_mr_allows(&v.remote_mr, w.rkey, v.remote_pd, w.raddr, len, remote_need);
        if let Some(op) = w.atomic {
            // A misaligned target fails on the one-at-a-time path, with its syndrome.
            let ok = w.raddr & (len - 1) == 0 && local_ok && remote_ok;
            return LanePlan {
                batchable: ok && w.laddr != 0 && w.raddr != 0,
                dst: w.laddr,
                src: w.raddr,
                atomic: Some(op),
                wide: w.wqebbs == 2,
                ..base
            };
        }
        if !local_ok || !remote_ok {
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
        remote: u64_of(|v| v.remote as u64) as *mut QpContext,
        // Each lane loads it when it first plans (lane 0's is not known yet either).
        remote_ready: None,
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
        cqe_due_ns: 0,
        local_mr: MrCache::default(),
        remote_mr: MrCache::default(),
        key_lease_ns: 0,
        learned: false,
        from_dbr: false,
        doorbell_ns: 0,
    }
}

/// The GPU engine's batch path ([`plan_lane`], [`batch_len`], [`complete_batch`]) with the warp's
/// 32 lanes run one after another by this thread: what the CPU engine executes, so every CPU test
/// of the device (exact syndromes, random traffic against a model) runs the batch rules too.
/// Returns the WQEBBs consumed and the WQEs executed ((0, 0): take the next one alone).
///
/// # Safety
/// As [`service_qp`], with `v` from [`learn`].
pub(super) unsafe fn batch_with_serial_lanes(v: &mut View, limit: u32, floor: &mut PortFloor) -> (u32, u64) {
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
            super::retire::pace_counted(v, &d, plans[0].fenced, round_trips, floor);
        }
        // In WQE order: a batch's atomics follow its data (see `batch_len`), as the warp runs them.
        for (p, w) in plans[..k].iter().zip(&words[..k]) {
            if let Some(op) = p.atomic {
                execute_atomic::<false>(&op, p);
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

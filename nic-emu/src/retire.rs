//! Admitting a warp batch and retiring it: the CQ's room and the rate model decide how many of
//! the planned WQEs run ([`admit_batch_lanes`]); after the copies one system-scope fence, the
//! requested CQEs and one consumer-index store retire them ([`complete_batch`] on the CPU
//! engine's serial lanes, [`complete_batch_lanes`] on a warp, where a collapsed CQ retires several
//! consecutive batches at once).

use super::batch::LanePlan;
use super::cqe::write_cqe;
use super::cqe::{cq_room, cqe_words, write_cqe_body, write_cqe_tail};
use super::engine::View;
use super::model::{self, Demand, Model, PortFloor};
use ibgda_abi::mlx5::opcode;
use ibgda_device::arch;

/// Retires a batch of `plans[..k]` after every lane's copy (ordered before this call by the
/// caller's warp barrier): one system-scope fence for all of them (cumulative over the lanes'
/// stores), the CQEs the WQEs requested (only the last one on a collapsed CQ, which keeps only the
/// latest), then the consumer index once.
///
/// # Safety
/// As [`complete`](super::engine::complete); `plans[..k]` are the next `k` WQEs of `v`, executed.
pub unsafe fn complete_batch(v: &mut View, plans: &[LanePlan], k: usize) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        await_cqe_due(v);
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
        // WQEs, not WQEBBs: a two-WQEBB WQE's second lane is no WQE of its own.
        let wqes = plans[..k].iter().filter(|p| !p.continuation).count() as u64;
        v.executed += wqes;
        v.batched += wqes;
        v.consumed += k as u64;
        arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.qp).consumed), v.consumed);
    }
}

/// One planned WQE's demand on the model.
pub(super) fn demand_of_plan(m: &Model, p: &LanePlan) -> Demand {
    if p.continuation {
        // The second WQEBB of a WQE already charged.
        return Demand::default();
    }
    Demand::of(m, p.len as u64, p.opcode == opcode::RDMA_READ, p.atomic.is_some())
}

/// Waits until the model says `d` takes effect ([`Demand::lands_ns`]) and keeps when it is due
/// (completes) for the retirement's CQE (lane 0's view). Returns when it is due.
/// `floor` is what the caller's earlier bookings in this pass (or group of batches) showed of the
/// port's clocks ([`PortFloor`]; a fresh one when there were none).
///
/// # Safety
/// `v` is a live pass's view.
pub(super) unsafe fn pace(v: &mut View, d: &Demand, floor: &mut PortFloor) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let due = model::due_ns(&v.model, v.dev, d, v.fetched_ns, floor);
        model::wait_until(v.dev, d.lands_ns(&v.model, due), d.messages, &watch_of(v));
        v.cqe_due_ns = v.cqe_due_ns.max(due);
        due
    }
}

/// Waits, before a CQE is written, until every batch it completes is due (the round trip of
/// their READs and atomics; see [`pace`]). Nothing with the model off.
///
/// # Safety
/// As [`pace`].
pub(super) unsafe fn await_cqe_due(v: &View) {
    // SAFETY: this function's `# Safety` contract.
    unsafe {
        if v.model.on && arch::global_timer_ns() < v.cqe_due_ns {
            model::wait_until(v.dev, v.cqe_due_ns, 0, &watch_of(v));
        }
    }
}

/// What a wait of `v`'s pass watches: its QP's doorbell register.
fn watch_of(v: &View) -> model::DoorbellWatch {
    model::DoorbellWatch {
        doorbell: v.doorbell as *const u64,
        learned: v.last_doorbell,
        qp: v.qp,
    }
}

/// [`pace`] with the QP's READs and atomics outstanding counted (`max_rd_atomic`): a `fenced`
/// batch starts only once the outstanding responses are back; `round_trips` of this batch's WQEs
/// are READs or atomics, and when they bring the count to the limit the next batch is sent only
/// once these responses are back too. The caller keeps a batch within the room
/// ([`rd_room`]).
///
/// # Safety
/// As [`pace`].
pub(super) unsafe fn pace_counted(
    v: &mut View,
    d: &Demand,
    fenced: bool,
    round_trips: u64,
    floor: &mut PortFloor,
) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        if fenced && v.rd_outstanding > 0 {
            // The fence waits for the QP's earlier READs and atomics.
            v.fetched_ns = v.fetched_ns.max(v.rd_due_ns);
            v.rd_outstanding = 0;
        }
        let due = pace(v, d, floor);
        if round_trips > 0 {
            v.rd_outstanding += round_trips;
            v.rd_due_ns = v.rd_due_ns.max(due);
            let max = v.model.max_rd_atomic;
            if max > 0 && v.rd_outstanding >= max {
                v.fetched_ns = v.fetched_ns.max(v.rd_due_ns);
                v.rd_outstanding = 0;
            }
        }
        due
    }
}

/// How many more READs and atomics the QP may send before it must wait for responses (`u64::MAX`
/// without a limit).
pub(super) fn rd_room(v: &View) -> u64 {
    match v.model.max_rd_atomic {
        0 => u64::MAX,
        max => max.saturating_sub(v.rd_outstanding).max(1),
    }
}

/// Sum of `x` over the warp's lanes, valid in lane 0 (saturating). When every lane's value fits
/// 27 bits (32 of them cannot wrap 32: a message's port time, a small READ's or atomic's
/// response), one `redux`; otherwise a butterfly of shuffles.
fn warp_sum_lane0(mut x: u64, lane: u32) -> u64 {
    if arch::ballot(x >= 1 << 27) == 0 {
        return arch::redux_add_u32(x as u32) as u64;
    }
    // Over the warp's width: 32 on a GPU, a power of two below it on the CPU emulation's narrow
    // warps (a butterfly of 32 there would count lanes more than once).
    let ws = arch::warp_size();
    let mut off = ws / 2;
    while off > 0 {
        x = x.saturating_add(arch::shfl_idx_u64(x, (lane + off) & (ws - 1)));
        off /= 2;
    }
    x
}

/// The warp's batch of `k` planned WQEs (lane `j < k` holds the `j`-th), before its copies: trims
/// `k` to what the CQ has room for and to the QP's room of READs and atomics outstanding, and
/// paces it with the model (waiting until it is due: for a batch that fills the window, until its
/// responses are back, so the next batch need not wait again). Returns the `k` to execute (0: take
/// the next WQE alone), the same in every lane. `view` is `Some` in lane 0; every lane calls it.
///
/// # Safety
/// As [`take`](super::engine::take).
pub unsafe fn admit_batch_lanes(
    view: &mut Option<View>,
    lv: &View,
    plan: &LanePlan,
    lane: u32,
    k: u32,
    floor: &mut PortFloor,
) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let signaled = arch::ballot(lane < k && plan.signaled);
        // Lane 0 decides what its view knows (the CQ's room, the QP's room of READs and atomics
        // outstanding, its own WQE's fence) and hands the warp all three in one shuffle.
        let mut word = 0u32;
        if let Some(v) = view.as_ref() {
            let (room, _) = cq_room(v);
            let mut keep = k;
            while keep > 0 && (signaled & mask_below(keep)).count_ones() as u64 > room {
                keep -= 1;
            }
            let rd = if v.model.on { rd_room(v).min(32) as u32 } else { 0 };
            word = keep | rd << 8 | (plan.fenced as u32) << 16;
        }
        let word = arch::shfl_idx_u32(word, 0);
        let (mut k, room, fenced) = (word & 0xff, ((word >> 8) & 0xff) as u64, word >> 16 & 1 != 0);
        if k == 0 || !lv.model.on {
            return k;
        }
        // At most the QP's room of READs and atomics outstanding: the batch ends before the one
        // past it (always a WQE's first lane, so no WQE is split).
        let rt = arch::ballot(lane < k && plan.round_trip());
        if rt.count_ones() as u64 > room {
            let mut m = rt;
            let mut n = 0;
            while n < room {
                m &= m - 1;
                n += 1;
            }
            k = m.trailing_zeros();
        }
        let round_trips = (rt & mask_below(k)).count_ones() as u64;
        let mine = if lane < k {
            demand_of_plan(&lv.model, plan)
        } else {
            Demand::default()
        };
        let sent_fs = warp_sum_lane0(mine.sent_fs, lane);
        // Only READs and atomics bring data back: a batch of WRITEs skips their collectives (the
        // branch is the same in every lane).
        let (returned_fs, reads) = if round_trips > 0 {
            (warp_sum_lane0(mine.returned_fs, lane), arch::ballot(mine.reads) != 0)
        } else {
            (0, false)
        };
        let round_trip = round_trips > 0;
        let messages = arch::ballot(lane < k && !plan.continuation).count_ones() as u64;
        if let Some(v) = view.as_mut() {
            let d = Demand {
                messages,
                sent_fs,
                returned_fs,
                round_trip,
                reads,
            };
            pace_counted(v, &d, fenced, round_trips, floor);
        }
        arch::sync_warp();
        k
    }
}

#[inline(always)]
fn mask_below(k: u32) -> u32 {
    if k >= 32 {
        u32::MAX
    } else {
        (1u32 << k) - 1
    }
}

/// Retires the warp's `retired` executed WQEBBs (`wqes` WQEs) after every lane's copy: each of the first `k`
/// lanes whose plan asks for a CQE writes its body (on a collapsed CQ only the last such lane, as
/// the CQ keeps only the latest), one system-scope fence per lane after a warp barrier orders
/// every lane's data and bodies before any tail, then the tails, and lane 0 moves the CQ's
/// producer count and the QP's consumer index by `retired` once. The CQ had room
/// ([`admit_batch_lanes`]). `view` is `Some` in lane 0; every lane calls it.
///
/// # Safety
/// As [`complete_batch`]; the next `retired` WQEs were executed; on an owner-bit CQ `retired ==
/// k` and lane `j < k` holds the `j`-th one's plan; on a collapsed CQ the lanes' plans that ask
/// for a CQE are among them, the latest one last.
pub unsafe fn complete_batch_lanes(
    view: &mut Option<View>,
    lv: &View,
    plan: &LanePlan,
    lane: u32,
    k: u32,
    retired: u64,
    wqes: u64,
) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let signaled = arch::ballot(lane < k && plan.signaled) & mask_below(k);
        let mut produced = 0;
        if let Some(v) = view.as_ref() {
            if !v.cq_collapsed {
                produced = arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.cq).produced));
            }
        }
        let produced = arch::shfl_idx_u64(produced, 0);
        let writes = if lv.cq_collapsed {
            // Only the last requested CQE survives on a collapsed CQ.
            signaled != 0 && lane == 31 - signaled.leading_zeros()
        } else {
            signaled >> lane & 1 != 0
        };
        let (mut entry, mut words) = (0u64, [0u64; 3]);
        if writes {
            let (slot, owner) = if lv.cq_collapsed {
                (0, 0)
            } else {
                let n = produced + (signaled & mask_below(lane)).count_ones() as u64;
                (n & ((1u64 << lv.cq_log) - 1), ((n >> lv.cq_log) & 1) as u8)
            };
            entry = slot;
            words = cqe_words(lv.qpn, plan.wqe_index, Ok(plan.len), plan.opcode, owner);
            write_cqe_body(lv.cq_buf, entry, &words);
        }
        // The CQEs wait for the round trip of what they complete (lane 0 for the warp).
        if let Some(v) = view.as_ref() {
            await_cqe_due(v);
        }
        // Every lane's data and CQE body before this lane's fence (cumulativity), the fence before
        // its tail; one fence instruction for the warp.
        arch::sync_warp();
        arch::fence_acq_rel_sys();
        if writes {
            write_cqe_tail(lv.cq_buf, entry, &words);
        }
        if let Some(v) = view.as_mut() {
            if !v.cq_collapsed && signaled != 0 {
                arch::store_relaxed_sys_u64(
                    core::ptr::addr_of_mut!((*v.cq).produced),
                    produced + signaled.count_ones() as u64,
                );
            }
            v.executed += wqes;
            v.batched += wqes;
            v.consumed += retired;
            arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*v.qp).consumed), v.consumed);
        }
    }
}

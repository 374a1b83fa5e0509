//! The engine as a GPU runs it: each warp owns some QPs; lane 0 follows doorbells, validates and
//! executes WQEs, and the whole warp moves each WQE's data with 16-byte loads and stores (over
//! NVLink when the target is a peer GPU's heap). The same code runs (and is tested) on CPU threads,
//! on one lane or on whole warps of 32 (`tests/tests/emu_queue.rs`).

use super::batch::{
    admit_batch_lanes, batch_len_lanes, batching_allowed, complete_batch_lanes, execute_inline, lane_view, plan_lane,
    LanePlan,
};
use super::engine::{complete, finish, learn, take, Taken, View};
use crate::arch;
use crate::memory::copy_cooperative;
use ibgda_abi::emu::{EngineControl, EngineTally, QpContext};

/// WQEs a warp executes on one QP before it looks at its next QP.
pub const BUDGET_PER_QP: u32 = 256;

/// Bytes a lane copies alone in a batch; a larger WRITE is copied by the whole warp.
const LANE_COPY_BYTES: u32 = 256;

/// Service passes between two looks at the host's stop flag (it is in host memory: a look costs
/// a PCIe round trip, which would otherwise delay every doorbell an idle engine notices).
const STOP_CHECK_PASSES: u32 = 256;

/// Services `qp` with the calling warp; every lane must call it. Returns the WQEs processed.
///
/// # Safety
/// As [`super::service_qp`]: a live QP context, serviced by this warp only.
pub unsafe fn service_qp_warp(qp: *mut QpContext, budget: u32) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let lane = arch::lane_id();
        // Only lane 0 holds the pass's view (and moves the QP's indices); the others plan, copy and
        // write CQEs from their copy of it.
        let mut view = None;
        if lane == 0 {
            view = learn(qp);
        }
        if arch::shfl_idx_u32(view.is_some() as u32, 0) == 0 {
            return 0;
        }
        // The producer index does not move within a pass, so the lanes take lane 0's view once.
        let mut lv = lane_view(view.as_ref());
        // Lane 0 learned the producer index with an acquire load (the poster released its WQEs
        // with the doorbell or DBR); the warp barrier extends that to the lanes about to read the
        // WQEs (without it a lane may read a WQEBB half from the previous lap of the ring), and
        // each lane acquires the producer index itself too (one coalesced load each for the
        // warp), so the poster's release covers its own WQE reads.
        arch::sync_warp();
        acquire_producer_index(qp);
        let mut n = 0;
        while n < budget {
            let k = run_batch(&mut view, &mut lv, lane, budget - n);
            if k > 0 {
                n += k;
                continue;
            }
            let mut t = Taken::default();
            let mut have = 0u32;
            if let Some(v) = view.as_mut() {
                if let Some(x) = take(v) {
                    t = x;
                    have = 1;
                }
            }
            if arch::shfl_idx_u32(have, 0) == 0 {
                break;
            }
            let len = arch::shfl_idx_u32(t.copy_len, 0);
            // Lane 0's acquire of the producer index covers the source data for the other lanes only
            // through a warp barrier.
            arch::sync_warp();
            if len > 0 {
                let dst = arch::shfl_idx_u64(t.copy_dst, 0);
                let src = arch::shfl_idx_u64(t.copy_src, 0);
                copy_cooperative(dst as *mut u8, src as *const u8, len as usize, lane, arch::warp_size());
            }
            // Orders every lane's copy before lane 0's `complete`, whose system-scope fence then
            // covers them (cumulativity) before the CQE and the QP's next WQE.
            arch::sync_warp();
            if let Some(v) = view.as_mut() {
                complete(v, &t);
            }
            n += 1;
        }
        if let Some(v) = view.as_ref() {
            finish(v);
        }
        n
    }
}

/// Executes the next WQEs of the QP as one batch, one per lane, when the QP allows it and at
/// least two qualify: every lane loads and decodes its own WQE ([`plan_lane`]), the lanes decide
/// the batch together ([`batch_len_lanes`]), the CQ's room and the rate model admit it
/// ([`admit_batch_lanes`]), each lane copies its data (the whole warp a large WRITE's) and writes
/// its CQE ([`complete_batch_lanes`]). Returns how many (0: take them one at a time). Every lane
/// must call it; `view` is `Some` in lane 0 only.
///
/// # Safety
/// As [`service_qp_warp`], with `lv` from this pass's [`lane_view`].
unsafe fn run_batch(view: &mut Option<View>, lv: &mut View, lane: u32, limit: u32) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (mut ok, mut consumed) = (0u32, 0u64);
        if let Some(v) = view.as_ref() {
            ok = (batching_allowed(v) && v.posted() - v.consumed() >= 2) as u32;
            consumed = v.consumed();
        }
        if arch::shfl_idx_u32(ok, 0) == 0 {
            return 0;
        }
        lv.set_consumed(arch::shfl_idx_u64(consumed, 0));
        let avail = (lv.posted() - lv.consumed())
            .min(arch::warp_size() as u64)
            .min(limit as u64) as u32;
        let (mut plan, mut words) = (LanePlan::default(), [0u64; 8]);
        if lane < avail {
            (plan, words) = plan_lane(lv, lane as u64);
        }
        let k = batch_len_lanes(&plan, lane, avail);
        if k < 2 {
            return 0;
        }
        let k = admit_batch_lanes(view, lv, &plan, lane, k);
        if k < 2 {
            return 0;
        }
        let mine = lane < k;
        if mine && plan.src == 0 {
            execute_inline(&plan, &words);
        } else if mine && plan.len <= LANE_COPY_BYTES {
            copy_cooperative(plan.dst as *mut u8, plan.src as *const u8, plan.len as usize, 0, 1);
        }
        let mut big = arch::ballot(mine && plan.src != 0 && plan.len > LANE_COPY_BYTES);
        while big != 0 {
            let l = big.trailing_zeros();
            let (dst, src) = (arch::shfl_idx_u64(plan.dst, l), arch::shfl_idx_u64(plan.src, l));
            let len = arch::shfl_idx_u32(plan.len, l);
            copy_cooperative(dst as *mut u8, src as *const u8, len as usize, lane, arch::warp_size());
            big &= big - 1;
        }
        complete_batch_lanes(view, lv, &plan, lane, k);
        k
    }
}

/// An acquire load of the QP's doorbell register and DBR by the calling lane.
///
/// # Safety
/// `qp` is a live QP context.
#[inline(always)]
unsafe fn acquire_producer_index(qp: *mut QpContext) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        use ibgda_abi::mlx5::{SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};
        arch::load_acquire_sys_u64(((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64);
        arch::load_acquire_sys_u32(((*qp).dbr + SND_DBR_OFFSET as u64) as *const u32);
    }
}

/// The engine kernel's body: warp `w` of the grid services QPs `w, w + warps, ...` of `qps` until
/// the host sets `control.stop`. The warps count themselves in and out in `tally` (GPU memory,
/// zeroed by the host before the launch); the warp that completes a count publishes it to
/// `control` (host-mapped) with plain stores, as nothing read-modify-writes host memory.
///
/// # Safety
/// `qps` holds `n_qps` live [`QpContext`] addresses, no other engine services them, `control` is
/// a live [`EngineControl`] (host-mapped) and `tally` a live, zeroed [`EngineTally`] only this
/// launch uses. Every lane of every warp runs this.
pub unsafe fn run_engine(qps: *const u64, n_qps: u32, control: *mut EngineControl, tally: *mut EngineTally) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let lane = arch::lane_id();
        let warps_per_block = (arch::block_size() / arch::warp_size()).max(1);
        let warp = arch::block_idx_x() * warps_per_block + arch::thread_rank_in_block() / arch::warp_size();
        let warps = arch::grid_dim_x() * warps_per_block;
        if lane == 0 {
            let before = arch::atomic_add_acq_rel_sys_u32(core::ptr::addr_of_mut!((*tally).started), 1);
            if before + 1 == warps {
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*control).warps_started), warps);
            }
        }
        let (mut passes, mut wqes) = (0u64, 0u64);
        loop {
            let mut work = 0;
            let mut q = warp;
            while q < n_qps {
                work += service_qp_warp(*qps.add(q as usize) as *mut QpContext, BUDGET_PER_QP);
                q += warps;
            }
            passes += 1;
            wqes += work as u64;
            if passes % STOP_CHECK_PASSES as u64 == 0 {
                let mut stop = 0;
                if lane == 0 {
                    stop = arch::load_acquire_sys_u32(core::ptr::addr_of!((*control).stop));
                }
                if arch::shfl_idx_u32(stop, 0) != 0 {
                    break;
                }
            }
            if work == 0 {
                arch::nanosleep(32);
            }
        }
        if lane == 0 {
            arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*tally).wqes), wqes);
            arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*tally).passes), passes);
            // Acquire-release: the last warp out sees every other warp's sums.
            let before = arch::atomic_add_acq_rel_sys_u32(core::ptr::addr_of_mut!((*tally).stopped), 1);
            if before + 1 == warps {
                let w = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*tally).wqes));
                let p = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*tally).passes));
                // Only this thread writes these while the kernel runs; the host reads them after
                // `warps_stopped`, released below.
                let cw = core::ptr::addr_of_mut!((*control).wqes);
                let cp = core::ptr::addr_of_mut!((*control).passes);
                arch::store_relaxed_sys_u64(cw, arch::load_relaxed_sys_u64(cw) + w);
                arch::store_relaxed_sys_u64(cp, arch::load_relaxed_sys_u64(cp) + p);
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*control).warps_stopped), warps);
            }
        }
    }
}

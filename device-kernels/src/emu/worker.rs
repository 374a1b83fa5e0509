//! The engine as a GPU runs it: each warp owns some QPs; lane 0 follows doorbells, validates and
//! executes WQEs, and the whole warp moves each WQE's data with 16-byte loads and stores (over
//! NVLink when the target is a peer GPU's heap). On the host a warp has one lane, so the same code
//! runs (and is tested) on a CPU thread.

use super::engine::{complete, finish, learn, take, Taken};
use crate::arch;
use crate::memory::copy_cooperative;
use ibgda_abi::emu::{EngineControl, EngineTally, QpContext};

/// WQEs a warp executes on one QP before it looks at its next QP.
pub const BUDGET_PER_QP: u32 = 64;

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
        // Only lane 0 holds the pass's view; the others only copy.
        let mut view = None;
        if lane == 0 {
            view = learn(qp);
        }
        if arch::shfl_idx_u32(view.is_some() as u32, 0) == 0 {
            return 0;
        }
        let mut n = 0;
        while n < budget {
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
            if len > 0 {
                let dst = arch::shfl_idx_u64(t.copy_dst, 0);
                let src = arch::shfl_idx_u64(t.copy_src, 0);
                copy_cooperative(dst as *mut u8, src as *const u8, len as usize, lane, arch::WARP_SIZE);
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
        let warps_per_block = (arch::block_size() / arch::WARP_SIZE).max(1);
        let warp = arch::block_idx_x() * warps_per_block + arch::thread_rank_in_block() / arch::WARP_SIZE;
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

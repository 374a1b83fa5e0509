//! The engine as a GPU runs it: each warp owns some QPs; lane 0 follows doorbells, validates and
//! executes WQEs, and the whole warp moves each WQE's data with 16-byte loads and stores (over
//! NVLink when the target is a peer GPU's heap). The same code runs (and is tested) on CPU threads,
//! on one lane or on whole warps of 32 (`tests/tests/emu_queue.rs`).

use super::batch::{batching_allowed, lane_view, load_batch_words, plan_words, LanePlan, CONTINUATION};
use super::decode::claims_two_wqebbs;
use super::engine::{complete, finish, take, Taken, View};
use super::execute::{execute_atomics_lanes, execute_inline};
use super::learn::{learn, learn_cached, QpCache};
use super::model::PortFloor;
use super::retire::{admit_batch_lanes, complete_batch_lanes};
use super::rules::{batch_len_lanes, wqe_starts};
use ibgda_abi::emu::{CopyJob, EngineControl, EngineTally, QpContext};
use ibgda_device::arch;
use ibgda_device::{copy_cooperative, copy_cooperative_unrolled};

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
    unsafe { service_qp_warp_on(qp, budget, None, None) }
}

/// [`service_qp_warp`] with the QP's context kept in `cache` (lane 0's) between calls (see
/// [`QpCache`]).
///
/// # Safety
/// As [`service_qp_warp`]; `cache` is used with this QP only, by this warp.
pub unsafe fn service_qp_warp_cached(qp: *mut QpContext, budget: u32, cache: &mut QpCache) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { service_qp_warp_on(qp, budget, None, Some(cache)) }
}

/// [`service_qp_warp`] with large copies shared through `board` (when `Some`).
///
/// # Safety
/// As [`service_qp_warp`]; `board` is the engine's live job board, this warp's slot its own.
unsafe fn service_qp_warp_on(
    qp: *mut QpContext,
    budget: u32,
    board: Option<&Board>,
    mut cache: Option<&mut QpCache>,
) -> u32 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let lane = arch::lane_id();
        // Only lane 0 holds the pass's view (and moves the QP's indices); the others plan, copy and
        // write CQEs from their copy of it.
        let mut view = None;
        if lane == 0 {
            view = match cache.as_deref_mut() {
                Some(c) => learn_cached(qp, c),
                None => learn(qp),
            };
        }
        // An idle QP (nothing posted beyond what was consumed) costs the warp nothing more: no
        // shuffles of the view, no acquire loads by every lane, so a doorbell is noticed sooner.
        let busy = view.as_ref().is_some_and(|v| v.posted() > v.consumed());
        if arch::shfl_idx_u32(busy as u32, 0) == 0 {
            if let (Some(c), Some(v)) = (cache, view.as_ref()) {
                c.keep(v);
            }
            return 0;
        }
        // The producer index does not move within a pass, so the lanes take lane 0's view once.
        let mut lv = lane_view(view.as_ref());
        resume_lane_keys(&mut lv, view.as_ref(), cache.as_deref_mut(), qp);
        // Lane 0 learned the producer index with an acquire load (the poster released its WQEs
        // with the doorbell or DBR); the warp barrier extends that to the lanes about to read the
        // WQEs (without it a lane may read a WQEBB half from the previous lap of the ring), and
        // each lane acquires the producer index itself too (one coalesced load each for the
        // warp), so the poster's release covers its own WQE reads.
        arch::sync_warp();
        let from_dbr = arch::shfl_idx_u32(view.as_ref().is_some_and(|v| v.from_dbr) as u32, 0) != 0;
        acquire_producer_index(qp, from_dbr);
        let ready_ns = arch::global_timer_ns();
        // WQEBBs consumed (the budget) and WQEs executed (what the pass reports).
        let (mut n, mut executed) = (0u32, 0u32);
        while n < budget {
            let (k, wqes) = run_batch(&mut view, &mut lv, lane, budget - n, board);
            if k > 0 {
                n += k;
                executed += wqes as u32;
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
                copy_large(board, lane, lane == 0, dst, src, len as u64);
            }
            // Orders every lane's copy before lane 0's `complete`, whose system-scope fence then
            // covers them (cumulativity) before the CQE and the QP's next WQE.
            arch::sync_warp();
            if let Some(v) = view.as_mut() {
                complete(v, &t);
            }
            n += 1;
            executed += 1;
        }
        if let Some(c) = cache.as_deref_mut() {
            c.keys.local_mr = lv.local_mr;
            c.keys.remote_mr = lv.remote_mr;
            c.keys.remote_ready = lv.remote_ready == Some(true);
        }
        if let Some(v) = view.as_ref() {
            if v.doorbell_ns != 0 {
                let q = v.qp();
                arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*q).ready_ns_sum), ready_ns);
                arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*q).retired_ns_sum), arch::global_timer_ns());
            }
            finish(v);
            if let Some(c) = cache {
                c.keep(v);
            }
        }
        executed
    }
}

/// Gives each lane's view (`lv`) the key checks the lane kept from earlier passes over this QP
/// (`cache`, each lane's own; see [`QpCache`]) while the key lease lasts: the responder's region
/// entry and state are then not read again over NVLink, a round trip of about 2 us on every pass
/// of a lone WQE. Lane 0 (which holds `view`) decides for the warp: the lease is for one QP at
/// one generation and lasts the device's `key_lease_ns` from when it started; when it ends, every
/// lane checks afresh and a new lease starts. Every lane must call it.
///
/// # Safety
/// `qp` is the QP this pass services and `cache` (when `Some`) the lane's cache for it.
unsafe fn resume_lane_keys(lv: &mut View, view: Option<&View>, cache: Option<&mut QpCache>, qp: *mut QpContext) {
    let mut keep = 0u32;
    let mut cache = cache;
    if let (Some(v), Some(c)) = (view, cache.as_deref_mut()) {
        let now = arch::global_timer_ns();
        let generation = c.generation();
        let k = &mut c.keys;
        let same = k.lease_qp == qp as u64 && k.lease_generation == generation;
        let endless = arch::mutant(arch::Mutant::EndlessKeyLease);
        if same && (now.wrapping_sub(k.lease_start_ns) < v.key_lease_ns || endless) {
            keep = 1;
        } else {
            (k.lease_qp, k.lease_generation, k.lease_start_ns) = (qp as u64, generation, now);
        }
    }
    if arch::shfl_idx_u32(keep, 0) != 0 {
        if let Some(c) = cache {
            lv.local_mr = c.keys.local_mr;
            lv.remote_mr = c.keys.remote_mr;
            if c.keys.remote_ready {
                lv.remote_ready = Some(true);
            }
        }
    }
}

/// Executes the next WQEs of the QP in batches, one WQE per lane, when the QP allows it and the
/// first one qualifies (a batch of one is still the cheap path: decoded in registers, keys from
/// the lane's cache, no local-memory parse): the warp loads the batch's WQEBBs together
/// ([`load_batch_words`]), every lane decodes and checks its own ([`plan_words`]), the lanes decide the batch together ([`batch_len_lanes`]), the CQ's room and
/// the rate model admit it ([`admit_batch_lanes`]), each lane copies its data (the whole warp a
/// large WRITE's). On a collapsed CQ (every transport QP's) up to [`GROUP_WQES`] WQEs in
/// consecutive batches share one retirement ([`complete_batch_lanes`]: one system-scope fence,
/// the latest requested CQE, one consumer-index store), as the fence costs more than planning
/// and copying a batch of small WRITEs; an owner-bit CQ retires each batch with its CQEs.
/// Returns the WQEBBs it consumed and the WQEs it executed ((0, 0): take the next one alone).
/// Every lane must call it; `view` is `Some` in lane 0 only.
///
/// Under the rate model a batch that fills the QP's outstanding READs and atomics does not end
/// the group: [`admit_batch_lanes`] has already waited until the batch is due, which is after its
/// responses are back, so the next batch may go at once.
///
/// # Safety
/// As [`service_qp_warp`], with `lv` from this pass's [`lane_view`].
unsafe fn run_batch(
    view: &mut Option<View>,
    lv: &mut View,
    lane: u32,
    limit: u32,
    board: Option<&Board>,
) -> (u32, u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (mut ok, mut consumed) = (0u32, 0u64);
        if let Some(v) = view.as_ref() {
            ok = (batching_allowed(v) && v.posted() > v.consumed()) as u32;
            consumed = v.consumed();
        }
        if arch::shfl_idx_u32(ok, 0) == 0 {
            return (0, 0);
        }
        let base = arch::shfl_idx_u64(consumed, 0);
        // The previous batch of the group executed atomics: fence before this one's data.
        let mut atomics_before = false;
        // Data stored (by any lane) since the last system-scope fence in every lane. True at the
        // start: what came before may be the one-at-a-time path's data, after which only lane 0
        // fenced, and a relaxed atomic in another lane is a release only after a fence in its own
        // program order. So a group's first atomics always follow a fence of the whole warp.
        let mut unfenced_data = true;
        // What the retirement writes CQEs from, over its first `retire_lanes` lanes: on a collapsed
        // CQ the latest WQE of the group that asked for a CQE, in the lane that executed it (every
        // other lane holds a plan that asks for none, as the CQ keeps only the latest); on an
        // owner-bit CQ the one batch's plans.
        let (mut retire, mut retire_lanes) = (LanePlan::default(), arch::warp_size());
        let (mut done, mut batches, mut plan_cycles, mut copy_cycles) = (0u32, 0u64, 0u64, 0u64);
        // WQEs among the `done` WQEBBs (a two-WQEBB WQE's second lane is none).
        let mut wqes = 0u64;
        // What the group's bookings taught lane 0 of the port's clocks (see `PortFloor`): the
        // batches after the first are booked with one read-modify-write while the port is busy.
        let mut floor = PortFloor::default();
        loop {
            lv.set_consumed(base + done as u64);
            let t0 = arch::clock64();
            let avail = (lv.posted() - lv.consumed())
                .min(arch::warp_size() as u64)
                .min((limit - done) as u64) as u32;
            if avail == 0 {
                break;
            }
            let words = load_batch_words(lv, lane, avail);
            // Where WQEs start: a two-WQEBB WQE's second WQEBB is the next lane's, whose first 16
            // bytes it reads (every lane shuffles; only such a WQE's decode uses them).
            let starts = wqe_starts(arch::ballot(lane < avail && claims_two_wqebbs(words[0])), avail);
            let next = [
                arch::shfl_idx_u64(words[0], (lane + 1) & 31),
                arch::shfl_idx_u64(words[1], (lane + 1) & 31),
            ];
            let mut plan = LanePlan::default();
            if lane < avail {
                plan = if starts >> lane & 1 != 0 {
                    plan_words(lv, lane as u64, &words, next)
                } else {
                    CONTINUATION
                };
                if plan.wide && lane + 1 >= avail {
                    // Its second half is not here (past the warp, the budget or the producer
                    // index): the next batch or the one-at-a-time path takes it.
                    plan.batchable = false;
                }
            }
            let mut k = batch_len_lanes(&plan, lane, avail);
            if k > 0 {
                k = admit_batch_lanes(view, lv, &plan, lane, k, &mut floor);
            }
            if k == 0 {
                break;
            }
            let t1 = arch::clock64();
            let mine = lane < k;
            let data = mine && plan.moves_data();
            let moves_data = arch::ballot(data) != 0;
            // A fenced WQE starts the batch: everything before it executed (earlier batches,
            // ordered by the barrier between batches); make it visible before this one runs. And
            // the previous batch's atomics (ordered before this point by the barrier between
            // batches) before this batch's data: no later WRITE overtakes an atomic (a batch of
            // atomics alone needs no fence for that: a word's atomics are serialised anyway).
            if arch::shfl_idx_u32(plan.fenced as u32, 0) != 0 || (atomics_before && moves_data) {
                arch::fence_acq_rel_sys();
                unfenced_data = false;
            }
            unfenced_data |= moves_data;
            if data && plan.src == 0 {
                execute_inline(&plan, &words);
            } else if data && plan.len <= LANE_COPY_BYTES {
                copy_cooperative(plan.dst as *mut u8, plan.src as *const u8, plan.len as usize, 0, 1);
            }
            let big = data && plan.src != 0 && plan.len > LANE_COPY_BYTES;
            let copied_much = arch::ballot(big) != 0;
            if copied_much {
                copy_large(board, lane, big, plan.dst, plan.src, plan.len as u64);
            }
            let atomic = mine && plan.atomic.is_some();
            atomics_before = arch::ballot(atomic) != 0;
            if atomics_before {
                // Data before atomics (a signal after its data; this batch's and the group's
                // earlier batches'): every lane's stores, then one fence, then the atomics,
                // relaxed (fence then write is the release pattern). No data since the warp's
                // last fence in this group, no fence.
                arch::sync_warp();
                if unfenced_data {
                    arch::fence_acq_rel_sys();
                    unfenced_data = false;
                }
                execute_atomics_lanes(&plan, lane, atomic);
            }
            plan_cycles += t1 - t0;
            copy_cycles += arch::clock64() - t1;
            batches += 1;
            wqes += (k - arch::ballot(mine && plan.continuation).count_ones()) as u64;
            if !lv.cq_collapsed {
                // Owner-bit CQs: each CQE has its own slot, written from this batch's plans.
                (retire, retire_lanes, done) = (plan, k, k);
                break;
            }
            let signaled = arch::ballot(mine && plan.signaled);
            if signaled != 0 {
                let holder = 31 - signaled.leading_zeros();
                retire = if lane == holder { plan } else { LanePlan::default() };
            }
            done += k;
            // The group ends at a WQE the lanes may not execute (a WQE of three or more WQEBBs, an
            // error: it goes alone next), when the queue had no more (fewer than a warp were
            // waiting), after large copies (the fence is cheap against them, and the group would
            // hold their completions back) and at its size; an overlap, a fence or data after
            // atomics only ends this batch.
            let blocked = k < avail && arch::shfl_idx_u32(plan.batchable as u32, k) == 0;
            let drained = k == avail && avail < arch::warp_size();
            if blocked || drained || copied_much || done >= GROUP_WQES.min(limit) {
                break;
            }
            // This batch's stores before the next batch's loads and stores in other lanes (a
            // later WQE may read or overwrite what an earlier one wrote).
            arch::sync_warp();
        }
        if done == 0 {
            return (0, 0);
        }
        let t2 = arch::clock64();
        complete_batch_lanes(view, lv, &retire, lane, retire_lanes, done as u64, wqes);
        if lane == 0 {
            let t3 = arch::clock64();
            let qp = lv.qp();
            // Fire-and-forget adds (the results are unused), published with the QP's counters.
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*qp).cycles_plan), plan_cycles);
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*qp).cycles_copy), copy_cycles);
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*qp).cycles_complete), t3 - t2);
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*qp).batches), batches);
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*qp).retirements), 1);
        }
        (done, wqes)
    }
}

/// Most WQEs that consecutive batches on a collapsed CQ retire together: a pass's whole budget
/// ([`BUDGET_PER_QP`]), so a QP with a backlog pays one retirement fence per pass (half the
/// fences of 128: `p` rate about 11% higher on 2x H200), and its completions wait at most a pass.
pub const GROUP_WQES: u32 = 256;

/// An acquire load by the calling lane of what exposed this pass's WQEs: the QP's doorbell
/// register, or its DBR when a lost doorbell was recovered from it.
///
/// # Safety
/// `qp` is a live QP context.
#[inline(always)]
unsafe fn acquire_producer_index(qp: *mut QpContext, from_dbr: bool) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        use ibgda_abi::mlx5::{SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};
        if from_dbr {
            arch::load_acquire_sys_u32(((*qp).dbr + SND_DBR_OFFSET as u64) as *const u32);
        } else {
            arch::load_acquire_sys_u64(((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64);
        }
    }
}

/// The engine kernel's body: warp `i` of block `b` services QPs `i * blocks + b`, then every
/// `warps`-th, of `qps` (consecutive QPs on different SMs) until
/// the host sets `control.stop`; a warp whose QPs are idle (or that has none) takes chunks of other
/// warps' large copies from the job board that follows `tally`. The warps count themselves in and out in `tally` (GPU memory,
/// zeroed by the host before the launch); the warp that completes a count publishes it to
/// `control` (host-mapped) with plain stores, as nothing read-modify-writes host memory.
///
/// # Safety
/// `qps` holds `n_qps` live [`QpContext`] addresses, no other engine services them, `control` is
/// a live [`EngineControl`] (host-mapped) and `tally` a live, zeroed allocation of
/// [`ibgda_abi::emu::engine_scratch_bytes`] for the launch's warps that only this launch uses. Every lane of every warp runs this.
pub unsafe fn run_engine(qps: *const u64, n_qps: u32, control: *mut EngineControl, tally: *mut EngineTally) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let lane = arch::lane_id();
        let warps_per_block = (arch::block_size() / arch::warp_size()).max(1);
        let warp = arch::block_idx_x() * warps_per_block + arch::thread_rank_in_block() / arch::warp_size();
        let warps = arch::grid_dim_x() * warps_per_block;
        let first_qp = first_qp_of(
            arch::block_idx_x(),
            arch::thread_rank_in_block() / arch::warp_size(),
            arch::grid_dim_x(),
        );
        if lane == 0 {
            let before = arch::atomic_add_acq_rel_sys_u32(core::ptr::addr_of_mut!((*tally).started), 1);
            if before + 1 == warps {
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*control).warps_started), warps);
            }
        }
        let board = Board {
            jobs: (tally as *mut u8).add(core::mem::size_of::<EngineTally>().next_multiple_of(64)) as *mut CopyJob,
            warps,
            me: warp,
        };
        let (mut passes, mut wqes) = (0u64, 0u64);
        // Idle passes since this warp last found work (its own or a copy to help with): a warp
        // that owns QPs scans the job board on every `HELP_EVERY`-th, so it looks at its
        // doorbells again sooner (a scan is a dependent load per 32 warps, longer than the look
        // itself).
        let mut idle_looks = 0u32;
        // A warp with no QP of its own has no doorbell to notice sooner: it scans every pass.
        let help_every = if first_qp < n_qps { HELP_EVERY } else { 1 };
        // The contexts of this warp's first QPs, kept between passes (lane 0's).
        let mut caches = [QpCache::new(); CACHED_QPS_PER_WARP];
        loop {
            let mut work = 0;
            let mut q = first_qp;
            let mut k = 0;
            while q < n_qps {
                let cache = caches.get_mut(k);
                work += service_qp_warp_on(
                    *qps.add(q as usize) as *mut QpContext,
                    BUDGET_PER_QP,
                    Some(&board),
                    cache,
                );
                q += warps;
                k += 1;
            }
            if work == 0 && idle_looks.is_multiple_of(help_every) {
                // Idle: help with other warps' large copies, a bounded number of chunks before
                // this warp looks at its own QPs (and the stop flag) again.
                let mut helped = 0;
                while helped < HELP_PER_PASS && board.help(lane) {
                    helped += 1;
                }
                if helped > 0 {
                    work = 1;
                }
            }
            idle_looks = if work == 0 { idle_looks.wrapping_add(1) } else { 0 };
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
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*tally).wqes), wqes);
            arch::red_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*tally).passes), passes);
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

/// The first QP that warp `warp_in_block` of block `block` (of `blocks`) serves; it then serves
/// every `blocks * warps_per_block`-th after it, so each QP has exactly one warp. QPs are dealt
/// over the blocks first, so consecutive QPs (what a job's first blocks post on) run on different
/// SMs: in block order 8 busy QPs of 32 sat on one SM's warps, sharing its issue slots, while the
/// other SMs only helped with copies (`p` from 8,192 threads 122 -> 133 M/s on 2x H200).
#[inline(always)]
pub fn first_qp_of(block: u32, warp_in_block: u32, blocks: u32) -> u32 {
    warp_in_block * blocks + block
}

/// QPs per engine warp whose contexts the warp keeps between passes (the runtime gives each warp
/// one QP when the engine has the blocks for it).
const CACHED_QPS_PER_WARP: usize = 1;

/// Chunks an idle warp copies for others before it looks at its own QPs again.
const HELP_PER_PASS: u32 = 16;

/// An idle warp that owns QPs scans the job board on every this-many idle passes (and at once
/// after work); the warps without QPs, the engine's helpers, scan on every pass.
const HELP_EVERY: u32 = 4;

/// A batch's large copies are shared with idle warps when they add up to this many bytes. Below
/// it the owner copies alone: for a low-latency MoE batch of two or three 7–14 KiB rows the
/// claims, a helper's delay in noticing the job and the owner's wait for the slowest helper cost
/// more than the copy (16 KiB here made the LL dispatch and combine over the NIC 2–4% slower on
/// 2x H200, HT unchanged; no sharing at all, HT 6% slower: `docs/benchmarks.md`, session 34).
const SHARE_BYTES: u64 = 64 << 10;
/// 16-byte loads in flight per lane in the engine's warp copies: a warp keeps 4 KiB in flight,
/// as a copy is bound by latency times bytes in flight.
const COPY_UNROLL: usize = 8;
/// Bytes a warp copies per claimed chunk of a shared copy: each chunk costs a claim (one
/// system-scope add) and, for a helper, a system-scope fence, so it must be long against both.
const CHUNK_BYTES: u64 = 16 << 10;
/// A copy of at least this many bytes is shared through the board (in chunks of up to
/// [`CHUNK_BYTES`]).
const SHARED_COPY_BYTES: u64 = 4 << 10;

/// The engine's job board: one [`CopyJob`] per warp, in GPU memory.
pub(super) struct Board {
    jobs: *mut CopyJob,
    warps: u32,
    me: u32,
}

const CHUNK_BITS: u32 = 24;
const CHUNK_MASK: u64 = (1 << CHUNK_BITS) - 1;

/// Claims the next chunk of `job` (lane 0): its number, or `None` when every chunk is claimed.
/// One fetch-and-add, never a retry loop: the old ticket says which generation and which chunk
/// the add took; an add past the last chunk claims nothing (the counter only grows, and the
/// owner's next ticket replaces it). The acquire of the add orders the descriptor loads after it
/// behind the owner's release of that ticket; the owner rewrites the descriptors only after
/// every claimed chunk is done, so a successful claim always reads its generation's descriptors.
///
/// # Safety
/// `job` is a live job-board slot.
unsafe fn claim(job: *mut CopyJob) -> Option<u64> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let ticket = core::ptr::addr_of_mut!((*job).ticket);
        // Acquire only: a release would first wait for this warp's earlier stores (the previous
        // chunk's, over NVLink) to be performed, a round trip per chunk that nothing needs (the
        // chunks are released to the owner through `done`, and the owner's fence covers its own).
        let t = arch::atomic_add_acquire_sys_u64(ticket, 1);
        let (next, chunks) = (t & CHUNK_MASK, (t >> CHUNK_BITS) & CHUNK_MASK);
        (next < chunks).then_some(next)
    }
}

/// One lane's copy in a shared batch (the lane's own WRITE or READ, or an entry a helper loaded).
#[derive(Clone, Copy, Default)]
struct Entry {
    dst: u64,
    src: u64,
    len: u64,
    first_chunk: u64,
    chunks: u64,
}

/// Copies chunk `c` of the batch whose entries the warp's lanes hold (lane `l` entry `l`, `n`
/// of them) with the whole warp.
///
/// # Safety
/// As [`copy_cooperative`], for every entry.
unsafe fn copy_chunk(mine: &Entry, n: u32, c: u64, lane: u32) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let hit = arch::ballot(lane < n && mine.first_chunk <= c && c < mine.first_chunk + mine.chunks);
        if hit == 0 {
            return;
        }
        let e = hit.trailing_zeros();
        let (dst, src, len, first) = (
            arch::shfl_idx_u64(mine.dst, e),
            arch::shfl_idx_u64(mine.src, e),
            arch::shfl_idx_u64(mine.len, e),
            arch::shfl_idx_u64(mine.first_chunk, e),
        );
        let at = (c - first) * CHUNK_BYTES;
        let bytes = CHUNK_BYTES.min(len - at);
        copy_cooperative_unrolled::<COPY_UNROLL>(
            (dst + at) as *mut u8,
            (src + at) as *const u8,
            bytes as usize,
            lane,
            arch::warp_size(),
        );
    }
}

impl Board {
    /// Shares the copies the lanes hold (lane `l`'s when `mine`), at least [`SHARE_BYTES`] in
    /// all: each lane publishes its entry in this warp's slot, lane 0 the ticket; then the warp
    /// copies chunks itself until none is left, and waits until the helpers finished theirs (a
    /// helper never waits on anything while it holds a chunk, so this ends). Every lane calls
    /// it; the data is written when it returns, ordered (through the helpers' release of `done`
    /// and lane 0's acquire of it, then the barrier) before the caller's fence.
    ///
    /// # Safety
    /// As [`copy_cooperative`] for every lane's copy; the board is live and this warp's slot
    /// free.
    unsafe fn share(&self, lane: u32, mine: bool, dst: u64, src: u64, len: u64) {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            let job = self.jobs.add(self.me as usize);
            let chunks = if mine { len.div_ceil(CHUNK_BYTES) } else { 0 };
            // Inclusive prefix sum of the lanes' chunk counts.
            let mut upto = chunks;
            let mut off = 1;
            while off < 32 {
                let below = arch::shfl_idx_u64(upto, lane.saturating_sub(off));
                if lane >= off {
                    upto += below;
                }
                off *= 2;
            }
            let total = arch::shfl_idx_u64(upto, 31);
            let owners = arch::ballot(mine);
            let at = (owners & arch::lanemask_lt()).count_ones();
            // Lane `l`'s register copy of entry `l` (the entries are packed: entry `at` is this
            // lane's copy).
            let entry = Entry {
                dst,
                src,
                len,
                first_chunk: upto - chunks,
                chunks,
            };
            if mine {
                let e = core::ptr::addr_of_mut!((*job).entry[at as usize]);
                arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*e).dst), dst);
                arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*e).src), src);
                arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*e).len), len);
                arch::store_relaxed_sys_u32(core::ptr::addr_of_mut!((*e).first_chunk), entry.first_chunk as u32);
            }
            // The owner copies from registers: lane `l` must hold entry `l`, which the lane of the
            // `l`-th set bit of `owners` has.
            let l_src = nth_set_bit(owners, lane);
            let packed = Entry {
                dst: arch::shfl_idx_u64(entry.dst, l_src),
                src: arch::shfl_idx_u64(entry.src, l_src),
                len: arch::shfl_idx_u64(entry.len, l_src),
                first_chunk: arch::shfl_idx_u64(entry.first_chunk, l_src),
                chunks: arch::shfl_idx_u64(entry.chunks, l_src),
            };
            let n = owners.count_ones();
            // Every lane's entry before lane 0's release of the ticket.
            arch::sync_warp();
            if lane == 0 {
                arch::store_relaxed_sys_u32(core::ptr::addr_of_mut!((*job).entries), n);
                arch::store_relaxed_sys_u32(core::ptr::addr_of_mut!((*job).done), 0);
                let ticket = core::ptr::addr_of_mut!((*job).ticket);
                let generation = ((arch::load_relaxed_sys_u64(ticket) >> 48) + 1) & 0xffff;
                arch::store_release_sys_u64(ticket, generation << 48 | total << CHUNK_BITS);
            }
            let mut own = 0u64;
            loop {
                let mut c = u64::MAX;
                if lane == 0 {
                    c = claim(job).unwrap_or(u64::MAX);
                }
                let c = arch::shfl_idx_u64(c, 0);
                if c == u64::MAX {
                    break;
                }
                copy_chunk(&packed, n, c, lane);
                own += 1;
            }
            if lane == 0 {
                let done = core::ptr::addr_of_mut!((*job).done);
                while arch::load_acquire_sys_u32(done) as u64 + own < total {
                    arch::nanosleep(20);
                }
            }
            arch::sync_warp();
        }
    }

    /// Takes one chunk of another warp's shared copies and copies it; returns whether there was
    /// one. Every lane calls it.
    ///
    /// # Safety
    /// The board is live.
    unsafe fn help(&self, lane: u32) -> bool {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            let mut base = 0;
            while base < self.warps {
                let slot = base + lane;
                let mut open = false;
                if slot < self.warps && slot != self.me {
                    let t = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*self.jobs.add(slot as usize)).ticket));
                    open = t & CHUNK_MASK < (t >> CHUNK_BITS) & CHUNK_MASK;
                }
                let open = arch::ballot(open);
                if open != 0 {
                    // Helpers start their search at different slots, so they spread over the
                    // open jobs instead of all adding to the lowest one's ticket.
                    let turn = self.me % 32;
                    let pick = (open.rotate_right(turn).trailing_zeros() + turn) % 32;
                    let job = self.jobs.add((base + pick) as usize);
                    let mut c = u64::MAX;
                    if lane == 0 {
                        c = claim(job).unwrap_or(u64::MAX);
                    }
                    let c = arch::shfl_idx_u64(c, 0);
                    if c == u64::MAX {
                        return true;
                    }
                    // Lane 0's acquire (the claim) covers the descriptors for the other lanes
                    // through the barrier.
                    arch::sync_warp();
                    let n = arch::load_relaxed_sys_u32(core::ptr::addr_of!((*job).entries));
                    let mut mine = Entry::default();
                    if lane < n {
                        let e = core::ptr::addr_of!((*job).entry[lane as usize]);
                        mine.dst = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*e).dst));
                        mine.src = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*e).src));
                        mine.len = arch::load_relaxed_sys_u64(core::ptr::addr_of!((*e).len));
                        mine.first_chunk = arch::load_relaxed_sys_u32(core::ptr::addr_of!((*e).first_chunk)) as u64;
                        mine.chunks = mine.len.div_ceil(CHUNK_BYTES);
                    }
                    copy_chunk(&mine, n, c, lane);
                    // Every lane's stores, then lane 0's release of them (system scope: the owner
                    // then orders them before its CQEs for every observer).
                    arch::sync_warp();
                    if lane == 0 {
                        arch::fence_acq_rel_sys();
                        arch::red_add_relaxed_sys_u32(core::ptr::addr_of_mut!((*job).done), 1);
                    }
                    return true;
                }
                base += arch::warp_size();
            }
            false
        }
    }
}

/// The position of the `n`-th set bit of `mask` (0 when there are not that many).
#[inline(always)]
fn nth_set_bit(mut mask: u32, n: u32) -> u32 {
    let mut k = 0;
    while mask != 0 {
        if k == n {
            return mask.trailing_zeros();
        }
        mask &= mask - 1;
        k += 1;
    }
    0
}

/// The lanes' copies (lane `l`'s when `mine`) with the calling warp. Copies of
/// [`SHARED_COPY_BYTES`] or more are shared with idle warps through `board` when they add up to
/// [`SHARE_BYTES`] or more (a claim is a system-scope atomic, worth it only for a chunk of work);
/// the rest go one after another, each by the whole warp. Every lane calls it.
///
/// # Safety
/// As [`copy_cooperative`], for every lane's copy.
unsafe fn copy_large(board: Option<&Board>, lane: u32, mine: bool, dst: u64, src: u64, len: u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let chunky = mine && len >= SHARED_COPY_BYTES;
        let mut total = if chunky { len } else { 0 };
        let mut off = 16;
        while off > 0 {
            total += arch::shfl_idx_u64(total, lane ^ off);
            off /= 2;
        }
        let shared = match board {
            Some(b) if total >= SHARE_BYTES && b.warps > 1 => {
                b.share(lane, chunky, dst, src, len);
                true
            }
            _ => false,
        };
        let mut rest = arch::ballot(mine && !(shared && chunky));
        while rest != 0 {
            let l = rest.trailing_zeros();
            let (d, s, n) = (
                arch::shfl_idx_u64(dst, l),
                arch::shfl_idx_u64(src, l),
                arch::shfl_idx_u64(len, l),
            );
            copy_cooperative_unrolled::<COPY_UNROLL>(d as *mut u8, s as *const u8, n as usize, lane, arch::warp_size());
            rest &= rest - 1;
        }
    }
}

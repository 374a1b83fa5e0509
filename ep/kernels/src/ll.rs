//! Low-latency kernels: dispatch and combine, each a send and a receive half, with the sequence
//! numbers in device memory (no host synchronisation, capturable in a CUDA graph).

use crate::copy::{accumulate_bf16x8, copy_bytes, last_block, max4, store_bf16x8, RowTail};
use crate::geometry::{work, Geometry, LlLayout, MAX_TOPK};
use crate::numeric::{bf16_to_f32, f32_to_e4m3, pow2_ceil, E4M3_MAX};
use crate::{load, peer_ptr, store, valid_expert};
use ibgda_abi::DeviceState;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

/// Phase bits of a low-latency kernel launch: both in one launch (DeepEP's single kernel per
/// operation), or each in its own (the receive half behind a hook).
pub mod phase {
    /// Send this rank's rows.
    pub const SEND: u32 = 1;
    /// Receive the peers' rows.
    pub const RECV: u32 = 2;
}

ibgda_device::kernel! {
    /// Low-latency dispatch: with [`phase::SEND`], the send half ([`dispatch_send`]); with
    /// [`phase::RECV`], the receive half ([`dispatch_recv`]) for the call whose sequence number
    /// the send half left in `handle_seq[0]` (the same launch's, or an earlier one's). A launch
    /// with both must have every block resident at once (its blocks wait in the receive half for
    /// the last block of every rank's send half); the host sizes its grid for that. Its PTX entry
    /// is `ibgda_ep::dispatch()` as a C++ name, so profilers list it as DeepEP's `dispatch`.
    pub fn ep_ll_dispatch(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, topk_idx: *const i64, tokens: u32, area: *mut u8, work_words: *mut u64, handle_seq: *mut u64, recv_x: *mut u8, recv_scales: *mut f32, recv_count: *mut i32, src_info: *mut i32, layout_range: *mut i64, phases: u32) as "_ZN8ibgda_ep8dispatchEv" {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { dispatch::<true>(state, g0, g1, x, topk_idx, tokens, area, work_words, handle_seq, recv_x, recv_scales, recv_count, src_info, layout_range, phases) }
    }

    /// [`ep_ll_dispatch`] when every peer is reached by NVLink loads and stores: no NIC or
    /// proxy route (a peer that is not load/store reachable stops the kernel), so fewer
    /// registers and more threads. Its PTX entry is `ibgda_ep::dispatch_p2p()`.
    pub fn ep_ll_dispatch_p2p(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, topk_idx: *const i64, tokens: u32, area: *mut u8, work_words: *mut u64, handle_seq: *mut u64, recv_x: *mut u8, recv_scales: *mut f32, recv_count: *mut i32, src_info: *mut i32, layout_range: *mut i64, phases: u32) as "_ZN8ibgda_ep12dispatch_p2pEv" {
        // SAFETY: the launch contract (`kernel!`), as `ep_ll_dispatch`.
        unsafe { dispatch::<false>(state, g0, g1, x, topk_idx, tokens, area, work_words, handle_seq, recv_x, recv_scales, recv_count, src_info, layout_range, phases) }
    }

    /// Low-latency combine: with [`phase::SEND`], the send half ([`combine_send`]); with
    /// [`phase::RECV`], the receive half ([`combine_recv`]), as [`ep_ll_dispatch`]; its PTX entry
    /// is `ibgda_ep::combine()`.
    pub fn ep_ll_combine(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, src_info: *const i32, layout_range: *const i64, area: *mut u8, work_words: *mut u64, handle_seq: *mut u64, topk_idx: *const i64, topk_weights: *const f32, tokens: u32, out: *mut u16, phases: u32) as "_ZN8ibgda_ep7combineEv" {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { combine::<true>(state, g0, g1, x, src_info, layout_range, area, work_words, handle_seq, topk_idx, topk_weights, tokens, out, phases) }
    }

    /// [`ep_ll_combine`] when every peer is reached by NVLink loads and stores (as
    /// [`ep_ll_dispatch_p2p`]); its PTX entry is `ibgda_ep::combine_p2p()`.
    pub fn ep_ll_combine_p2p(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, src_info: *const i32, layout_range: *const i64, area: *mut u8, work_words: *mut u64, handle_seq: *mut u64, topk_idx: *const i64, topk_weights: *const f32, tokens: u32, out: *mut u16, phases: u32) as "_ZN8ibgda_ep11combine_p2pEv" {
        // SAFETY: the launch contract (`kernel!`), as `ep_ll_combine`.
        unsafe { combine::<false>(state, g0, g1, x, src_info, layout_range, area, work_words, handle_seq, topk_idx, topk_weights, tokens, out, phases) }
    }
}

/// [`ep_ll_dispatch`]'s body; `NIC`: peers may be behind a NIC (else every peer is load/store
/// reachable).
///
/// # Safety
/// As [`ep_ll_dispatch`]'s launch contract.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    x: *const u16,
    topk_idx: *const i64,
    tokens: u32,
    area: *mut u8,
    work_words: *mut u64,
    handle_seq: *mut u64,
    recv_x: *mut u8,
    recv_scales: *mut f32,
    recv_count: *mut i32,
    src_info: *mut i32,
    layout_range: *mut i64,
    phases: u32,
) {
    // SAFETY: this function's contract.
    unsafe {
        let sh = Shmem::attach(state);
        let g = Geometry::unpack(g0, g1);
        let seq = if phases & phase::SEND != 0 {
            dispatch_send::<NIC>(&sh, g, x, topk_idx, tokens, area, work_words, handle_seq)
        } else {
            load(handle_seq)
        };
        if phases & phase::RECV != 0 {
            dispatch_recv(
                &sh,
                g,
                area,
                seq,
                recv_x,
                recv_scales,
                recv_count,
                src_info,
                layout_range,
            );
        }
    }
}

/// [`ep_ll_combine`]'s body; `NIC` as [`dispatch`].
///
/// # Safety
/// As [`ep_ll_combine`]'s launch contract.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn combine<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    x: *const u16,
    src_info: *const i32,
    layout_range: *const i64,
    area: *mut u8,
    work_words: *mut u64,
    handle_seq: *mut u64,
    topk_idx: *const i64,
    topk_weights: *const f32,
    tokens: u32,
    out: *mut u16,
    phases: u32,
) {
    // SAFETY: this function's contract.
    unsafe {
        let sh = Shmem::attach(state);
        let g = Geometry::unpack(g0, g1);
        let seq = if phases & phase::SEND != 0 {
            combine_send::<NIC>(&sh, g, x, src_info, layout_range, area, work_words, handle_seq)
        } else {
            load(handle_seq.add(1))
        };
        if phases & phase::RECV != 0 {
            combine_recv::<NIC>(&sh, g, topk_idx, topk_weights, tokens, area, seq, out);
        }
    }
}

/// Token `t`'s top-k entries (of `topk`) that name one of the `experts` experts, one bit each.
///
/// # Safety
/// `topk_idx` holds at least `(t + 1) * topk` entries.
#[inline(always)]
unsafe fn entries_with_expert(topk_idx: *const i64, t: u32, topk: u32, experts: u32) -> u32 {
    let mut has = 0u32;
    let mut k = 0;
    while k < topk {
        // SAFETY: this function's contract.
        if valid_expert(unsafe { *topk_idx.add((t * topk + k) as usize) }, experts) {
            has |= 1 << k;
        }
        k += 1;
    }
    has
}

/// Lanes that share one 128-channel FP8 group in [`quantize_chunks`]: 8 lanes of 16 channels on
/// a GPU (a warp does four groups at once), fewer where the warp is narrower (the CPU emulation).
#[inline(always)]
fn group_lanes() -> u32 {
    let ws = arch::warp_size();
    if ws < 8 {
        ws
    } else {
        8
    }
}

/// The 16 BF16 channels of `row` from channel `c`: eight words of two.
///
/// # Safety
/// `row + 2c .. row + 2c + 32` is readable and 16-byte aligned.
#[inline(always)]
unsafe fn load_bf16x16(row: *const u8, c: u32) -> [u32; 8] {
    // SAFETY: this function's contract.
    unsafe {
        let a = arch::load_v4(row.add(c as usize * 2) as *const [u32; 4]);
        let b = arch::load_v4(row.add(c as usize * 2 + 16) as *const [u32; 4]);
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// The largest magnitude of the four BF16 values in two words.
#[inline(always)]
fn max_abs_bf16x4(v0: u32, v1: u32) -> f32 {
    max4(
        bf16_to_f32(v0 as u16),
        bf16_to_f32((v0 >> 16) as u16),
        bf16_to_f32(v1 as u16),
        bf16_to_f32((v1 >> 16) as u16),
    )
}

/// The four BF16 values in two words times `inv`, as FP8 e4m3 bytes in one word (in order).
#[inline(always)]
fn e4m3x4(v0: u32, v1: u32, inv: f32) -> u32 {
    f32_to_e4m3(bf16_to_f32(v0 as u16) * inv) as u32
        | (f32_to_e4m3(bf16_to_f32((v0 >> 16) as u16) * inv) as u32) << 8
        | (f32_to_e4m3(bf16_to_f32(v1 as u16) * inv) as u32) << 16
        | (f32_to_e4m3(bf16_to_f32((v1 >> 16) as u16) * inv) as u32) << 24
}

/// One 128-channel group of BF16 `row` (the group `grp`) quantised to FP8 e4m3 by the
/// [`group_lanes`] lanes that share it, each lane 16 channels at a time: every lane reads its
/// chunks for the group's largest magnitude, the lanes agree on it (shuffles), then each lane
/// hands `emit(channel, four words of FP8)` its chunks and returns the group's scale
/// (`amax / 448`, or with `round_scale` that rounded up to a power of two). Every lane of the
/// warp calls it (the shuffles), `active` false for lanes without a group this round.
///
/// # Safety
/// `row` holds the token's `hidden` BF16 channels, 16-byte aligned, when `active`.
#[inline(always)]
unsafe fn quantize_group(
    row: *const u8,
    grp: u32,
    active: bool,
    round_scale: bool,
    mut emit: impl FnMut(u32, [u32; 4]),
) -> f32 {
    // SAFETY: this function's contract.
    unsafe {
        let gl = group_lanes();
        let sub = arch::lane_id() % gl;
        let mut amax = 1.0e-4f32;
        if active {
            let mut chunk = sub;
            while chunk < 8 {
                let w = load_bf16x16(row, grp * 128 + chunk * 16);
                let m = max_abs_bf16x4(w[0], w[1])
                    .max(max_abs_bf16x4(w[2], w[3]))
                    .max(max_abs_bf16x4(w[4], w[5]))
                    .max(max_abs_bf16x4(w[6], w[7]));
                amax = if m > amax { m } else { amax };
                chunk += gl;
            }
        }
        // The group's lanes are `gl` consecutive lanes from a multiple of `gl`.
        let mut m = 1;
        while m < gl {
            let o = f32::from_bits(arch::shfl_idx_u32(amax.to_bits(), arch::lane_id() ^ m));
            amax = if o > amax { o } else { amax };
            m <<= 1;
        }
        let scale = if round_scale {
            pow2_ceil(amax / E4M3_MAX)
        } else {
            amax / E4M3_MAX
        };
        let inv = if round_scale { 1.0 / scale } else { E4M3_MAX / amax };
        if active {
            let mut chunk = sub;
            while chunk < 8 {
                let c = grp * 128 + chunk * 16;
                let w = load_bf16x16(row, c);
                let q = [
                    e4m3x4(w[0], w[1], inv),
                    e4m3x4(w[2], w[3], inv),
                    e4m3x4(w[4], w[5], inv),
                    e4m3x4(w[6], w[7], inv),
                ];
                emit(c, q);
                chunk += gl;
            }
        }
        scale
    }
}

/// Low-latency dispatch, send side: each (token, top-k entry) with an expert takes the next
/// slot of that expert's receive region on its rank and gets the token written there
/// (quantised once per token to FP8 e4m3 with one scale per 128 channels, eight lanes per
/// 128-channel group, when the geometry says so). The last block to finish publishes every
/// expert's count as `(seq << 32) | tokens`, one thread per expert, and records `seq` in
/// `handle_seq[0]` for the receive side.
///
/// # Safety
/// As [`ep_ll_dispatch`]'s launch contract. Returns the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch_send<const NIC: bool>(
    sh: &Shmem,
    g: Geometry,
    x: *const u16,
    topk_idx: *const i64,
    tokens: u32,
    area: *mut u8,
    work_words: *mut u64,
    handle_seq: *mut u64,
) -> u64 {
    // SAFETY: this function's contract: the kernel's arguments, alive for the whole call.
    unsafe {
        let (me, ranks) = (sh.my_pe(), sh.n_pes());
        let (tid, nt) = (arch::thread_rank_in_block(), arch::block_size());
        let (lane, ws) = (arch::lane_id(), arch::warp_size());
        let (wi, warps) = (tid / ws, nt / ws);
        let experts = g.local_experts * ranks;
        let l = LlLayout::of(&g, ranks);
        let seq = load(work_words.add(work::LL_DISPATCH_SEQ as usize)) + 1;
        let p = (seq & 1) as u32;
        let counters = area.add(l.slot_counters() as usize) as *mut u32;
        let table = area.add(l.slot_table() as usize) as *mut u32;
        let (meta, sent) = (g.ll_meta(), g.ll_sent());
        // Where entry `k` of token `t` goes: the expert's rank, the remote row, this thread's
        // write target (the peer's row itself over NVLink, else a staging row sent afterwards),
        // and whether it is staged.
        let target = |t: u32, k: u32| -> (u32, *mut u8, *mut u8, bool) {
            let e = *topk_idx.add((t * g.topk + k) as usize);
            let (r, le) = (e as u32 / g.local_experts, e as u32 % g.local_experts);
            let slot = *table.add((t * MAX_TOPK + k) as usize);
            let remote = area.add(l.dispatch_recv(p, le, me, slot) as usize);
            let peer = peer_ptr::<NIC, u8>(sh, remote, r);
            if peer.is_null() {
                (r, remote, area.add(l.dispatch_stage(p, t, k) as usize), true)
            } else {
                (r, remote, peer, false)
            }
        };
        // Token groups of 128 channels a warp quantises at once, and the group rounds.
        let groups_per_warp = ws / group_lanes();
        let mut t = arch::block_idx_x();
        while t < tokens {
            // A thread per top-k entry takes the entry's slot (the atomics in parallel, not one
            // dependent round trip after another).
            let mut k = tid;
            while k < g.topk {
                let e = *topk_idx.add((t * g.topk + k) as usize);
                if valid_expert(e, experts) {
                    let slot = arch::atomic_add_relaxed_sys_u32(counters.add(e as usize), 1);
                    *table.add((t * MAX_TOPK + k) as usize) = slot;
                }
                k += nt;
            }
            arch::sync_threads();
            let src = (x as *const u8).add((t as u64 * g.hidden as u64 * 2) as usize);
            // The token is quantised once, into its own stage (local stores), and a warp per
            // entry then copies the message to where it goes: the expert's slot on its rank over
            // NVLink, the entry's staging row for its own WRITE behind a NIC (runs of 16-byte
            // stores with eight loads in flight, the destination worked out once per entry;
            // storing each quantised chunk to every destination at once took the send half 2 us
            // longer at EP2 over NVLink, and staging a token behind a NIC 12.5 us).
            let stage = area.add(l.dispatch_stage(p, t, 0) as usize);
            if g.fp8 {
                let groups = g.hidden / 128;
                let mut round = wi * groups_per_warp;
                while round < groups {
                    let grp = round + lane / group_lanes();
                    let active = grp < groups;
                    let scale = quantize_group(src, grp, active, g.round_scale, |c, q| {
                        arch::store_v4(stage.add(c as usize) as *mut [u32; 4], q);
                    });
                    if active && lane % group_lanes() == 0 {
                        *(stage.add((g.hidden + grp * 4) as usize) as *mut f32) = scale;
                    }
                    round += warps * groups_per_warp;
                }
                // The stage is complete before any warp copies it.
                arch::sync_threads();
            }
            // Each entry's warp copies the stage (BF16: the token's row itself) and writes the
            // entry's metadata after it (entry 0's staging row is the stage itself: no copy); the
            // block barrier after the token loop orders every copy before the ticket.
            let body = if g.fp8 { stage as *const u8 } else { src };
            let mut k = wi;
            while k < g.topk {
                if valid_expert(*topk_idx.add((t * g.topk + k) as usize), experts) {
                    let dst = target(t, k).2;
                    if !core::ptr::eq(dst as *const u8, body) {
                        copy_bytes(dst, body, meta as usize, lane, ws);
                    }
                    if lane == 0 {
                        let m = dst.add(meta as usize) as *mut i32;
                        *m = t as i32;
                        *m.add(1) = k as i32;
                    }
                }
                k += warps;
            }
            if NIC {
                // Every staging row complete (its copy and metadata) before any WRITE of it.
                arch::sync_threads();
            }
            if NIC {
                // Peers behind a NIC: warp `k` sends entry `k`'s staged row on the queue of its
                // expert, where the expert's count will follow it; the token's posts go together
                // instead of one after another (each is a chain of round trips to the queue).
                // The block barrier above ordered every warp's staging stores before them.
                let mut k = wi;
                while k < g.topk {
                    let e = *topk_idx.add((t * g.topk + k) as usize);
                    if valid_expert(e, experts) {
                        let (r, remote, dst, staged) = target(t, k);
                        if staged {
                            sh.keyed(e as u32 % g.local_experts).put_nbi_warp(
                                remote,
                                dst as *const u8,
                                sent as usize,
                                r,
                            );
                        }
                    }
                    k += warps;
                }
            }
            t += arch::grid_dim_x();
        }
        arch::sync_threads();
        // No wait for the rows here: each expert's count goes on the queue its rows went on, and
        // a queue delivers in order, so the count lands after them (one NIC trip, not two).
        let last = arch::sync_threads_or(tid == 0 && last_block(work_words.add(work::DONE_LL_SEND as usize)));
        if last {
            // One thread per expert publishes its count (every block issued its rows before
            // taking its ticket, so the count follows them on the expert's queue; over NVLink,
            // the ticket's acquire and the count's release order every block's rows first).
            let mut e = tid;
            while e < experts {
                let n = arch::atomic_swap_relaxed_sys_u32(counters.add(e as usize), 0);
                let (r, le) = (e / g.local_experts, e % g.local_experts);
                let count = area.add(l.count(p, le, me) as usize) as *mut u64;
                if NIC {
                    sh.keyed(le).signal_op(count, (seq << 32) | n as u64, SignalOp::Set, r);
                } else {
                    arch::store_release_sys_u64(peer_ptr::<false, u64>(sh, count, r), (seq << 32) | n as u64);
                }
                e += nt;
            }
            if NIC {
                // Every block's rows and every count complete before the staging rows of this
                // parity may be rewritten (two calls later).
                sh.quiet_all_block();
            }
            if tid == 0 {
                store(work_words.add(work::LL_DISPATCH_SEQ as usize), seq);
                store(handle_seq, seq);
            }
        }
        seq
    }
}

/// Low-latency dispatch, receive side: for each local expert, waits for every rank's count,
/// then packs the tokens into `recv_x [local_experts, ranks * max_tokens, hidden]` (and
/// scales), a warp per row, `recv_count [local_experts]`, `src_info` (source token * 16 +
/// top-k entry) and `layout_range [local_experts, ranks]` (`offset << 32 | count`).
///
/// # Safety
/// As [`ep_ll_dispatch`]'s launch contract; `seq` the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch_recv(
    sh: &Shmem,
    g: Geometry,
    area: *mut u8,
    seq: u64,
    recv_x: *mut u8,
    recv_scales: *mut f32,
    recv_count: *mut i32,
    src_info: *mut i32,
    layout_range: *mut i64,
) {
    // SAFETY: this function's contract: the kernel's arguments, alive for the whole call.
    unsafe {
        let ranks = sh.n_pes();
        let tid = arch::thread_rank_in_block();
        let (lane, wi, warps) = (
            arch::lane_id(),
            tid / arch::warp_size(),
            arch::block_size() / arch::warp_size(),
        );
        let l = LlLayout::of(&g, ranks);
        let p = (seq & 1) as u32;
        let (xb, sb, meta) = (g.x_bytes(), g.scale_bytes(), g.ll_meta());
        let rows_per_expert = ranks as u64 * g.capacity as u64;
        let mut le = arch::block_idx_x();
        while le < g.local_experts {
            if tid == 0 {
                let mut off = 0u64;
                let mut s = 0;
                while s < ranks {
                    let v = sh.signal_wait_until_from(
                        area.add(l.count(p, le, s) as usize) as *const u64,
                        Cmp::Ge,
                        seq << 32,
                        s,
                    );
                    let n = v & 0xffff_ffff;
                    *layout_range.add((le * ranks + s) as usize) = ((off << 32) | n) as i64;
                    off += n;
                    s += 1;
                }
                *recv_count.add(le as usize) = off as i32;
            }
            arch::sync_threads();
            let total = *recv_count.add(le as usize) as u64;
            let mut j = wi as u64;
            while j < total {
                // The source whose range holds row `j`.
                let mut s = 0;
                while s + 1 < ranks && (*layout_range.add((le * ranks + s + 1) as usize) as u64 >> 32) <= j {
                    s += 1;
                }
                let i = j - (*layout_range.add((le * ranks + s) as usize) as u64 >> 32);
                let src = area.add(l.dispatch_recv(p, le, s, i as u32) as usize) as *const u8;
                let row = le as u64 * rows_per_expert + j;
                // The scales and the two metadata words first, into registers: their loads then
                // overlap the payload's instead of following its stores.
                let m = src.add(meta as usize) as *const i32;
                let spt = if sb != 0 { g.scales_per_token() } else { 0 };
                let scales = src.add(xb as usize) as *const u32;
                let tail = RowTail::load(scales, spt, lane, |i| *m.add(i as usize), 2);
                copy_bytes(
                    recv_x.add((row * xb) as usize),
                    src,
                    xb as usize,
                    lane,
                    arch::warp_size(),
                );
                if sb != 0 && g.ue8m0 {
                    // One exponent byte per scale (a power of two: its biased exponent), four
                    // per i32 (DeepEP's UE8M0 layout).
                    let out = (recv_scales as *mut u8).add((row * spt as u64) as usize);
                    let w = arch::warp_size();
                    if spt <= 2 * w {
                        if lane < spt {
                            *out.add(lane as usize) = (tail.scales[0] >> 23) as u8;
                        }
                        if lane + w < spt {
                            *out.add((lane + w) as usize) = (tail.scales[1] >> 23) as u8;
                        }
                    } else {
                        let mut c = lane;
                        while c < spt {
                            *out.add(c as usize) = (*scales.add(c as usize) >> 23) as u8;
                            c += w;
                        }
                    }
                } else if sb != 0 {
                    tail.store(
                        (recv_scales as *mut u8).add((row * sb) as usize) as *mut u32,
                        scales,
                        spt,
                        lane,
                        0,
                        |_| 0,
                        |_, _| {},
                    );
                }
                // Word 1 (the top-k entry) is lane 1's (lane 0's second word in a one-lane warp
                // of the CPU emulation).
                let entry = if arch::warp_size() > 1 {
                    arch::shfl_idx_u32(tail.meta[0] as u32, 1) as i32
                } else {
                    tail.meta[1]
                };
                if lane == 0 {
                    *src_info.add(row as usize) = tail.meta[0] * MAX_TOPK as i32 + entry;
                }
                j += warps as u64;
            }
            arch::sync_threads();
            le += arch::grid_dim_x();
        }
    }
}

/// Low-latency combine, send side: sends every received row of `x [local_experts, ranks *
/// max_tokens, hidden]` (BF16) back to its source's (token, top-k entry) slot, one warp per row.
/// Over NVLink each row gets its own arrival flag (the call's sequence number), so the receiver
/// sums a token as soon as its rows are there; behind a NIC the rows go on their expert's
/// queue and one flag per (expert, rank) follows them.
///
/// The warps are spread over the local experts, several per expert when there are more warps
/// than experts, and each walks only its expert's received rows (the first `sum of counts` row
/// slots), not every slot of the padded layout.
///
/// # Safety
/// As [`ep_ll_combine`]'s launch contract. Returns the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn combine_send<const NIC: bool>(
    sh: &Shmem,
    g: Geometry,
    x: *const u16,
    src_info: *const i32,
    layout_range: *const i64,
    area: *mut u8,
    work_words: *mut u64,
    handle_seq: *mut u64,
) -> u64 {
    // SAFETY: this function's contract: the kernel's arguments, alive for the whole call.
    unsafe {
        let ranks = sh.n_pes();
        let l = LlLayout::of(&g, ranks);
        let seq = load(work_words.add(work::LL_COMBINE_SEQ as usize)) + 1;
        let p = (seq & 1) as u32;
        let hb = g.hidden as u64 * 2;
        let (lane, ws) = (arch::lane_id(), arch::warp_size());
        let warps = arch::block_size() / ws;
        let warp = arch::block_idx_x() * warps + arch::thread_rank_in_block() / ws;
        let all_warps = arch::grid_dim_x() * warps;
        let rows_per_expert = ranks * g.capacity;
        // Warp `warp` takes experts `warp % local_experts` (then every `all_warps`-th), rows
        // `warp / local_experts` (then every `per_expert`-th) of each.
        let per_expert = (all_warps / g.local_experts).max(1);
        let first_row = warp / g.local_experts;
        let mut le = warp % g.local_experts;
        while first_row < per_expert && le < g.local_experts {
            // The received rows are packed from slot 0: the last source's offset plus its count.
            let last = *layout_range.add((le * ranks + ranks - 1) as usize) as u64;
            let received = ((last >> 32) + (last & 0xffff_ffff)).min(rows_per_expert as u64) as u32;
            let mut row = first_row;
            while row < received {
                // The source rank whose range holds `row`.
                let mut s = 0;
                while s + 1 < ranks && (*layout_range.add((le * ranks + s + 1) as usize) as u64 >> 32) as u32 <= row {
                    s += 1;
                }
                let j = le * rows_per_expert + row;
                let info = *src_info.add(j as usize) as u32;
                let (t, k) = (info / MAX_TOPK, info % MAX_TOPK);
                let dst = area.add(l.combine_recv(p, t, k) as usize);
                let src = (x as *const u8).add((j as u64 * hb) as usize);
                let peer = peer_ptr::<NIC, u8>(sh, dst, s);
                if NIC && peer.is_null() {
                    // Behind a NIC: the row alone, on its expert's queue; the expert's one flag
                    // follows all its rows there (below), so the NIC runs rows back to back
                    // instead of a row and its own signal at a time. The stage is this row's
                    // alone in this call and is read until the quiet below.
                    let stage = area.add(l.combine_stage(p, le, row) as usize);
                    copy_bytes(stage, src, hb as usize, lane, ws);
                    sh.keyed(le).put_nbi_warp(dst, stage as *const u8, hb as usize, s);
                } else {
                    // Over NVLink: the row, then its own flag (release, after the warp's stores),
                    // so the receiver reduces it at once.
                    copy_bytes(peer, src, hb as usize, lane, ws);
                    arch::sync_warp();
                    if lane == 0 {
                        let flag = area.add(l.combine_flag(p, t, k) as usize) as *mut u64;
                        arch::fence_sc_sys();
                        arch::store_release_sys_u64(peer_ptr::<NIC, u64>(sh, flag, s), seq);
                    }
                }
                row += per_expert;
            }
            le += all_warps;
        }
        arch::sync_threads();
        let tid = arch::thread_rank_in_block();
        let last = arch::sync_threads_or(tid == 0 && last_block(work_words.add(work::DONE_LL_COMBINE as usize)));
        if last {
            if NIC {
                // Every block issued its rows before taking its ticket: each (local expert, rank
                // behind a NIC) flag now follows that expert's rows on its queue.
                let me = sh.my_pe();
                let mut i = tid;
                while i < g.local_experts * ranks {
                    let (le, r) = (i / ranks, i % ranks);
                    let flag = area.add(l.combine_expert_flag(p, me * g.local_experts + le) as usize) as *mut u64;
                    if sh.ptr(flag, r).is_null() {
                        sh.keyed(le).signal_op(flag, seq, SignalOp::Set, r);
                    }
                    i += arch::block_size();
                }
                // Every block's rows and flags complete before the stages may be rewritten.
                sh.quiet_all_block();
            }
            if tid == 0 {
                store(work_words.add(work::LL_COMBINE_SEQ as usize), seq);
                store(handle_seq.add(1), seq);
            }
        }
        seq
    }
}

/// Low-latency combine, receive side: waits for each of a token's rows, then writes
/// `out [tokens, hidden]` (BF16) = the `topk_weights`-weighted sum of its experts' rows.
///
/// # Safety
/// As [`ep_ll_combine`]'s launch contract; `seq` the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn combine_recv<const NIC: bool>(
    sh: &Shmem,
    g: Geometry,
    topk_idx: *const i64,
    topk_weights: *const f32,
    tokens: u32,
    area: *mut u8,
    seq: u64,
    out: *mut u16,
) {
    // SAFETY: this function's contract: the kernel's arguments, alive for the whole call.
    unsafe {
        let ranks = sh.n_pes();
        let (tid, nt) = (arch::thread_rank_in_block(), arch::block_size());
        let experts = g.local_experts * ranks;
        let l = LlLayout::of(&g, ranks);
        let p = (seq & 1) as u32;
        let vecs = g.hidden / 8;
        let row_bytes = g.hidden as usize * 2;
        let mut t = arch::block_idx_x();
        while t < tokens {
            // A thread per top-k entry waits for its row (the waits overlap).
            let mut k = tid;
            while k < g.topk {
                let e = *topk_idx.add((t * g.topk + k) as usize);
                if valid_expert(e, experts) {
                    // A row from a peer behind a NIC comes with its expert's flag, one over
                    // NVLink (or from this rank) with its own.
                    let r = e as u32 / g.local_experts;
                    let row_flag = area.add(l.combine_flag(p, t, k) as usize) as *mut u64;
                    let flag = if NIC && sh.ptr(row_flag, r).is_null() {
                        area.add(l.combine_expert_flag(p, e as u32) as usize) as *const u64
                    } else {
                        row_flag as *const u64
                    };
                    sh.signal_wait_until_from(flag, Cmp::Ge, seq, r);
                }
                k += nt;
            }
            arch::sync_threads();
            let has = entries_with_expert(topk_idx, t, g.topk, experts);
            let rows = area.add(l.combine_recv(p, t, 0) as usize) as *const u8;
            let weights = topk_weights.add((t * g.topk) as usize);
            let mut v = tid;
            while v < vecs {
                let mut acc = [0.0f32; 8];
                let mut m = has;
                while m != 0 {
                    let k = m.trailing_zeros() as usize;
                    m &= m - 1;
                    accumulate_bf16x8(&mut acc, rows.add(k * row_bytes + v as usize * 16), *weights.add(k));
                }
                store_bf16x8(
                    (out as *mut u8).add((t as u64 * g.hidden as u64 * 2 + v as u64 * 16) as usize),
                    &acc,
                );
                v += nt;
            }
            arch::sync_threads();
            t += arch::grid_dim_x();
        }
    }
}

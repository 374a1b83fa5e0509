//! Low-latency kernels: dispatch and combine, each a send and a receive half, with the sequence
//! numbers in device memory (no host synchronisation, capturable in a CUDA graph).

use crate::copy::{accumulate_bf16x8, last_block, max4, store_bf16x8, warp_max};
use crate::geometry::{work, Geometry, LlLayout, MAX_TOPK};
use crate::numeric::{bf16_to_f32, f32_to_e4m3, pow2_ceil, E4M3_MAX};
use crate::{load, store, valid_expert};
use ibgda_abi::DeviceState;
use ibgda_device::copy_cooperative as copy_bytes;
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
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let seq = if phases & phase::SEND != 0 {
                dispatch_send(&sh, g, x, topk_idx, tokens, area, work_words, handle_seq)
            } else {
                load(handle_seq)
            };
            if phases & phase::RECV != 0 {
                dispatch_recv(&sh, g, area, seq, recv_x, recv_scales, recv_count, src_info, layout_range);
            }
        }
    }

    /// Low-latency combine: with [`phase::SEND`], the send half ([`combine_send`]); with
    /// [`phase::RECV`], the receive half ([`combine_recv`]), as [`ep_ll_dispatch`]; its PTX entry
    /// is `ibgda_ep::combine()`.
    pub fn ep_ll_combine(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, src_info: *const i32, layout_range: *const i64, area: *mut u8, work_words: *mut u64, handle_seq: *mut u64, topk_idx: *const i64, topk_weights: *const f32, tokens: u32, out: *mut u16, phases: u32) as "_ZN8ibgda_ep7combineEv" {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let seq = if phases & phase::SEND != 0 {
                combine_send(&sh, g, x, src_info, layout_range, area, work_words, handle_seq)
            } else {
                load(handle_seq.add(1))
            };
            if phases & phase::RECV != 0 {
                combine_recv(&sh, g, topk_idx, topk_weights, tokens, area, seq, out);
            }
        }
    }
}

/// Low-latency dispatch, send side: each (token, top-k entry) with an expert takes the next
/// slot of that expert's receive region on its rank and gets the token written there
/// (quantised once per token to FP8 e4m3 with one scale per 128 channels, a warp per
/// 128-channel group, when the geometry says so). The last block to finish publishes every
/// expert's count as `(seq << 32) | tokens`, one thread per expert, and records `seq` in
/// `handle_seq[0]` for the receive side.
///
/// # Safety
/// As [`ep_ll_dispatch`]'s launch contract. Returns the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch_send(
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
        let (lane, wi, warps) = (arch::lane_id(), tid / arch::warp_size(), nt / arch::warp_size());
        let experts = g.local_experts * ranks;
        let l = LlLayout::of(&g, ranks);
        let seq = load(work_words.add(work::LL_DISPATCH_SEQ as usize)) + 1;
        let p = (seq & 1) as u32;
        let counters = area.add(l.slot_counters() as usize) as *mut u32;
        let table = area.add(l.slot_table() as usize) as *mut u32;
        let (xb, meta, msg) = (g.x_bytes(), g.ll_meta(), g.ll_msg());
        // Where entry `k` of token `t` goes: the expert's rank, the remote row, this thread's
        // write target (the peer's row itself over NVLink, else a staging row sent afterwards),
        // and whether it is staged.
        let target = |t: u32, k: u32| -> (u32, *mut u8, *mut u8, bool) {
            let e = *topk_idx.add((t * g.topk + k) as usize);
            let (r, le) = (e as u32 / g.local_experts, e as u32 % g.local_experts);
            let slot = *table.add((t * MAX_TOPK + k) as usize);
            let remote = area.add(l.dispatch_recv(p, le, me, slot) as usize);
            let peer = sh.ptr(remote, r);
            if peer.is_null() {
                (r, remote, area.add(l.dispatch_stage(p, t, k) as usize), true)
            } else {
                (r, remote, peer, false)
            }
        };
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
            if g.fp8 {
                // A warp per 128-channel group, 4 channels per lane: quantise once, store to every
                // destination of the token.
                let mut grp = wi;
                while grp < g.hidden / 128 {
                    let s32 = src as *const u32;
                    let mut amax = 1.0e-4f32;
                    let mut ch = lane * 4;
                    while ch < 128 {
                        let (v0, v1) = (
                            *s32.add(((grp * 128 + ch) / 2) as usize),
                            *s32.add(((grp * 128 + ch) / 2 + 1) as usize),
                        );
                        let m = max4(
                            bf16_to_f32(v0 as u16),
                            bf16_to_f32((v0 >> 16) as u16),
                            bf16_to_f32(v1 as u16),
                            bf16_to_f32((v1 >> 16) as u16),
                        );
                        amax = if m > amax { m } else { amax };
                        ch += arch::warp_size() * 4;
                    }
                    let amax = warp_max(amax);
                    // The scale: amax / 448, or (round_scale) that rounded up to a power of two.
                    let scale = if g.round_scale {
                        pow2_ceil(amax / E4M3_MAX)
                    } else {
                        amax / E4M3_MAX
                    };
                    let inv = if g.round_scale { 1.0 / scale } else { E4M3_MAX / amax };
                    let mut ch = lane * 4;
                    while ch < 128 {
                        let (v0, v1) = (
                            *s32.add(((grp * 128 + ch) / 2) as usize),
                            *s32.add(((grp * 128 + ch) / 2 + 1) as usize),
                        );
                        let q = f32_to_e4m3(bf16_to_f32(v0 as u16) * inv) as u32
                            | (f32_to_e4m3(bf16_to_f32((v0 >> 16) as u16) * inv) as u32) << 8
                            | (f32_to_e4m3(bf16_to_f32(v1 as u16) * inv) as u32) << 16
                            | (f32_to_e4m3(bf16_to_f32((v1 >> 16) as u16) * inv) as u32) << 24;
                        let mut k = 0;
                        while k < g.topk {
                            if valid_expert(*topk_idx.add((t * g.topk + k) as usize), experts) {
                                let (_, _, dst, _) = target(t, k);
                                *(dst.add((grp * 128 + ch) as usize) as *mut u32) = q;
                            }
                            k += 1;
                        }
                        ch += arch::warp_size() * 4;
                    }
                    if lane == 0 {
                        let mut k = 0;
                        while k < g.topk {
                            if valid_expert(*topk_idx.add((t * g.topk + k) as usize), experts) {
                                let (_, _, dst, _) = target(t, k);
                                *(dst.add((g.hidden + grp * 4) as usize) as *mut f32) = scale;
                            }
                            k += 1;
                        }
                    }
                    grp += warps;
                }
            } else {
                let mut v = tid;
                while v < xb as u32 / 16 {
                    let val = arch::load_v4(src.add(v as usize * 16) as *const [u32; 4]);
                    let mut k = 0;
                    while k < g.topk {
                        if valid_expert(*topk_idx.add((t * g.topk + k) as usize), experts) {
                            let (_, _, dst, _) = target(t, k);
                            arch::store_v4(dst.add(v as usize * 16) as *mut [u32; 4], val);
                        }
                        k += 1;
                    }
                    v += nt;
                }
            }
            let mut k = tid;
            while k < g.topk {
                if valid_expert(*topk_idx.add((t * g.topk + k) as usize), experts) {
                    let m = target(t, k).2.add(meta as usize) as *mut i32;
                    *m = t as i32;
                    *m.add(1) = k as i32;
                }
                k += nt;
            }
            arch::sync_threads();
            // Peers behind a NIC: send the staged rows (the whole block posts each) on the
            // queue of the row's expert, where its count will follow them.
            let mut k = 0;
            while k < g.topk {
                let e = *topk_idx.add((t * g.topk + k) as usize);
                if valid_expert(e, experts) {
                    let (r, remote, dst, staged) = target(t, k);
                    if staged {
                        sh.keyed(e as u32 % g.local_experts)
                            .put_nbi_block(remote, dst as *const u8, msg as usize, r);
                    }
                }
                k += 1;
            }
            t += arch::grid_dim_x();
        }
        arch::sync_threads();
        // No wait for the rows here: each expert's count goes on the queue its rows went on, and
        // a queue delivers in order, so the count lands after them (one NIC trip, not two).
        let last = arch::sync_threads_or(tid == 0 && last_block(work_words.add(work::DONE_LL_SEND as usize)));
        if last {
            // One thread per expert publishes its count (every block issued its rows before
            // taking its ticket, so the count follows them on the expert's queue).
            let mut e = tid;
            while e < experts {
                let n = arch::atomic_swap_relaxed_sys_u32(counters.add(e as usize), 0);
                let (r, le) = (e / g.local_experts, e % g.local_experts);
                sh.keyed(le).signal_op(
                    area.add(l.count(p, le, me) as usize) as *mut u64,
                    (seq << 32) | n as u64,
                    SignalOp::Set,
                    r,
                );
                e += nt;
            }
            // Every block's rows and every count complete before the staging rows of this
            // parity may be rewritten (two calls later).
            sh.quiet_all_block();
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
                    let per_row = g.scales_per_token() as u64;
                    let out = (recv_scales as *mut u8).add((row * per_row) as usize);
                    let mut c = lane;
                    while c < g.scales_per_token() {
                        let s = *(src.add((xb + c as u64 * 4) as usize) as *const f32);
                        *out.add(c as usize) = (s.to_bits() >> 23) as u8;
                        c += arch::warp_size();
                    }
                } else if sb != 0 {
                    copy_bytes(
                        (recv_scales as *mut u8).add((row * sb) as usize),
                        src.add(xb as usize),
                        sb as usize,
                        lane,
                        arch::warp_size(),
                    );
                }
                if lane == 0 {
                    let m = src.add(meta as usize) as *const i32;
                    *src_info.add(row as usize) = *m * MAX_TOPK as i32 + *m.add(1);
                }
                j += warps as u64;
            }
            arch::sync_threads();
            le += arch::grid_dim_x();
        }
    }
}

/// Low-latency combine, send side: sends every received row of `x [local_experts, ranks *
/// max_tokens, hidden]` (BF16) back to its source's (token, top-k entry) slot, each row with
/// its own arrival flag set to the call's sequence number; one warp per row.
///
/// # Safety
/// As [`ep_ll_combine`]'s launch contract. Returns the call's sequence number.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn combine_send(
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
        let warps = arch::block_size() / arch::warp_size();
        let warp = arch::block_idx_x() * warps + arch::thread_rank_in_block() / arch::warp_size();
        let all_warps = arch::grid_dim_x() * warps;
        let rows_per_expert = ranks * g.capacity;
        let mut j = warp;
        while j < g.local_experts * rows_per_expert {
            let (le, row) = (j / rows_per_expert, j % rows_per_expert);
            // The source rank whose range holds `row`, if any.
            let mut s = 0;
            let mut found = ranks;
            while s < ranks {
                let lr = *layout_range.add((le * ranks + s) as usize) as u64;
                let (off, n) = ((lr >> 32) as u32, lr as u32);
                if row >= off && row < off + n {
                    found = s;
                }
                s += 1;
            }
            if found < ranks {
                let info = *src_info.add(j as usize) as u32;
                let (t, k) = (info / MAX_TOPK, info % MAX_TOPK);
                let dst = area.add(l.combine_recv(p, t, k) as usize);
                let src = (x as *const u8).add((j as u64 * hb) as usize);
                if sh.ptr(dst, found).is_null() {
                    // Behind a NIC: the row alone, on its expert's queue; the expert's one flag
                    // follows all its rows there (below), so the NIC runs rows back to back
                    // instead of a row and its own signal at a time. The stage is this row's
                    // alone in this call and is read until the quiet below.
                    let stage = area.add(l.combine_stage(p, le, row) as usize);
                    copy_bytes(stage, src, hb as usize, arch::lane_id(), arch::warp_size());
                    sh.keyed(le).put_nbi_warp(dst, stage as *const u8, hb as usize, found);
                } else {
                    // Over NVLink: the row's own flag, so the receiver reduces it at once.
                    let flag = area.add(l.combine_flag(p, t, k) as usize) as *mut u64;
                    sh.put_signal_nbi_warp(dst, src, hb as usize, flag, seq, SignalOp::Set, found);
                }
            }
            j += all_warps;
        }
        arch::sync_threads();
        let tid = arch::thread_rank_in_block();
        let last = arch::sync_threads_or(tid == 0 && last_block(work_words.add(work::DONE_LL_COMBINE as usize)));
        if last {
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
unsafe fn combine_recv(
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
                    let flag = if sh.ptr(row_flag, r).is_null() {
                        area.add(l.combine_expert_flag(p, e as u32) as usize) as *const u64
                    } else {
                        row_flag as *const u64
                    };
                    sh.signal_wait_until_from(flag, Cmp::Ge, seq, r);
                }
                k += nt;
            }
            arch::sync_threads();
            let mut v = tid;
            while v < vecs {
                let mut acc = [0.0f32; 8];
                let mut k = 0;
                while k < g.topk {
                    let e = *topk_idx.add((t * g.topk + k) as usize);
                    if valid_expert(e, experts) {
                        let w = *topk_weights.add((t * g.topk + k) as usize);
                        let q = area.add((l.combine_recv(p, t, k) + v as u64 * 16) as usize);
                        accumulate_bf16x8(&mut acc, q, w);
                    }
                    k += 1;
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

//! High-throughput kernels: notify (the count exchange), dispatch and its receive-side
//! compaction, combine and its reduction.

use crate::copy::{add_bf16x8, last_block, split, store_bf16x8, warp_inclusive_sum, warp_run, warp_sum};
use crate::geometry::{info, sync, work, Geometry};
use crate::{load, store};
use ibgda_abi::DeviceState;
use ibgda_device::copy_cooperative_streaming;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

ibgda_device::kernel! {
    /// High-throughput notify: every warp counts the rows its run of tokens sends to each
    /// destination (its block is a channel, its warp a contiguous run of the channel's tokens);
    /// the last block's first warp turns the channel counts into slot offsets, sends each rank
    /// how many rows (and per-expert tokens) it will get, waits for every rank's message, and
    /// writes the [`geometry::info`] record to `info_out`. Nothing moves when a sender would
    /// overflow a receiver's slots: every rank sees the same status.
    pub fn ep_ht_notify(state: *const DeviceState, g0: u64, g1: u64, in_rank: *const u8, tokens_per_expert: *const u32, tokens: u32, sync_words: *mut u64, work_words: *mut u64, info_out: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { notify::<true>(state, g0, g1, in_rank, tokens_per_expert, tokens, sync_words, work_words, info_out) }
    }

    /// [`ep_ht_notify`] when every peer is reached by NVLink loads and stores (see
    /// [`ep_ht_dispatch_p2p`]).
    pub fn ep_ht_notify_p2p(state: *const DeviceState, g0: u64, g1: u64, in_rank: *const u8, tokens_per_expert: *const u32, tokens: u32, sync_words: *mut u64, work_words: *mut u64, info_out: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { notify::<false>(state, g0, g1, in_rank, tokens_per_expert, tokens, sync_words, work_words, info_out) }
    }

    /// High-throughput dispatch, send side: each warp writes its run of the channel's tokens once
    /// per destination rank into the slots the notify assigned (its channel's offset plus the
    /// runs of the warps before it; `send_slot [tokens, ranks]` records each, `-1` where not
    /// sent), a whole warp per row, then adds its row count to the destination's counter.
    pub fn ep_ht_dispatch(state: *const DeviceState, g0: u64, g1: u64, x: *const u8, x_scales: *const f32, topk_idx: *const i64, topk_weights: *const f32, in_rank: *const u8, tokens: u32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, send_slot: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { dispatch_send::<true>(state, g0, g1, x, x_scales, topk_idx, topk_weights, in_rank, tokens, area, sync_words, work_words, send_slot) }
    }

    /// [`ep_ht_dispatch`] when every peer is reached by NVLink loads and stores: the same steps
    /// without the NIC and proxy routes, whose registers would otherwise limit the block's threads.
    pub fn ep_ht_dispatch_p2p(state: *const DeviceState, g0: u64, g1: u64, x: *const u8, x_scales: *const f32, topk_idx: *const i64, topk_weights: *const f32, in_rank: *const u8, tokens: u32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, send_slot: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { dispatch_send::<false>(state, g0, g1, x, x_scales, topk_idx, topk_weights, in_rank, tokens, area, sync_words, work_words, send_slot) }
    }

    /// High-throughput dispatch, receive side: waits for every source's rows, then compacts them
    /// into `recv_x [num_recv, hidden]` (and scales), a warp per row, with `recv_topk_idx` made
    /// local to this rank (`-1` and weight 0 for experts elsewhere) and `recv_src` the token's
    /// index at its source.
    pub fn ep_ht_dispatch_recv(state: *const DeviceState, g0: u64, g1: u64, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, recv_x: *mut u8, recv_scales: *mut f32, recv_topk_idx: *mut i64, recv_topk_weights: *mut f32, recv_src: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let (me, ranks) = (sh.my_pe(), sh.n_pes());
            if arch::thread_rank_in_block() == 0 {
                let mut s = 0;
                while s < ranks {
                    let expected = load(work_words.add(work::dispatch_expected(s) as usize));
                    sh.signal_wait_until_from(sync_words.add(sync::dispatch_rows(ranks, s) as usize), Cmp::Ge, expected, s);
                    s += 1;
                }
            }
            arch::sync_threads();
            let lane = arch::lane_id();
            let (first_warp, all_warps) = warp_run();
            let total = *info_in.add(info::recv_offset(ranks, ranks)) as u32;
            let (xb, sb, meta) = (g.x_bytes(), g.scale_bytes(), g.ht_meta());
            let mut i = first_warp;
            while i < total {
                let mut s = 0;
                while s + 1 < ranks && *info_in.add(info::recv_offset(ranks, s + 1)) as u32 <= i {
                    s += 1;
                }
                let slot = i - *info_in.add(info::recv_offset(ranks, s)) as u32;
                let src = area.add(g.ht_dispatch_recv(s, slot) as usize) as *const u8;
                copy_bytes(recv_x.add((i as u64 * xb) as usize), src, xb as usize, lane, arch::warp_size());
                if sb != 0 {
                    copy_bytes((recv_scales as *mut u8).add((i as u64 * sb) as usize), src.add(xb as usize), sb as usize, lane, arch::warp_size());
                }
                let m = src.add(meta as usize) as *const i32;
                let mut k = lane;
                while k <= g.topk {
                    if k == 0 {
                        *recv_src.add(i as usize) = *m;
                    } else {
                        let e = *m.add(k as usize) as i64;
                        let mine = e >= 0 && (e as u32) / g.local_experts == me;
                        let o = (i as u64 * g.topk as u64 + (k - 1) as u64) as usize;
                        *recv_topk_idx.add(o) = if mine { e - (me * g.local_experts) as i64 } else { -1 };
                        *recv_topk_weights.add(o) = if mine { f32::from_bits(*m.add((k + g.topk) as usize) as u32) } else { 0.0 };
                    }
                    k += arch::warp_size();
                }
                i += all_warps;
            }
        }
    }

    /// High-throughput combine, send side: tells every rank it may receive, waits until each is
    /// ready, then the warps send the received rows of the other ranks back, row `i` (from source
    /// `s`) to slot `i - recv_offset[s]` of `s`, with its `weights [num_recv, topk]` (may be null).
    /// This rank's own rows stay where they are: the reduce reads them from `x`. The remote rows
    /// are split over all the grid's warps (none is left with local rows only).
    pub fn ep_ht_combine(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, weights: *const f32, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { combine_send::<true>(state, g0, g1, x, weights, info_in, area, sync_words, work_words) }
    }

    /// [`ep_ht_combine`] when every peer is reached by NVLink loads and stores (see
    /// [`ep_ht_dispatch_p2p`]).
    pub fn ep_ht_combine_p2p(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, weights: *const f32, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { combine_send::<false>(state, g0, g1, x, weights, info_in, area, sync_words, work_words) }
    }

    /// High-throughput combine in one launch, when every peer is reached by NVLink loads and
    /// stores: the first third of the blocks send the other ranks' rows back (as
    /// [`ep_ht_combine`], in chunks of [`FUSED_CHUNK_ROWS`] rows, each chunk's rows flagged with
    /// the call's [`arrival_flag`] once they are there), while the other blocks sum each token as soon as
    /// its rows have arrived (as [`ep_ht_combine_reduce`]). The reduce, bound by the SMs' loads,
    /// then runs under the send, bound by the links, instead of after it. The host launches it
    /// with at least two blocks, every block resident at once (a grid no larger than the GPU's
    /// SMs). The senders wait for nothing of this launch and are its lowest blocks, the first a
    /// GPU places: a busy GPU that holds back some blocks holds back reducers, which only wait.
    pub fn ep_ht_combine_fused_p2p(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, weights: *const f32, send_slot: *const i32, tokens: u32, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, out: *mut u16, out_weights: *mut f32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let (me, ranks) = (sh.my_pe(), sh.n_pes());
            let (tid, b, blocks) = (arch::thread_rank_in_block(), arch::block_idx_x(), arch::grid_dim_x());
            let (lane, ws) = (arch::lane_id(), arch::warp_size());
            let warps = arch::block_size() / ws;
            let wi = tid / ws;
            let seq = load(work_words.add(work::COMBINE_SEQ as usize)) + 1;
            let senders = fused_senders(blocks);
            let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
            if b < senders {
                // Every rank is ready to receive (its previous combine is over) before any row goes.
                if tid == 0 {
                    if b == 0 {
                        let mut s = 0;
                        while s < ranks {
                            if s != me {
                                arch::store_release_sys_u64(peer_word(&sh, sync_words.add(sync::combine_ready(ranks, me) as usize), s), seq);
                            }
                            s += 1;
                        }
                    }
                    let mut s = 0;
                    while s < ranks {
                        if s != me {
                            sh.signal_wait_until_from(sync_words.add(sync::combine_ready(ranks, s) as usize), Cmp::Ge, seq, s);
                        }
                        s += 1;
                    }
                }
                arch::sync_threads();
                // Chunk `k` of every destination before chunk `k + 1` of any (the warps take the
                // chunks in that order), so each destination's rows arrive in slot order, which
                // is about its token order, the order its reducers take.
                let others = ranks - 1;
                let mut chunks = 0u64;
                let mut s = 0;
                while s < ranks {
                    if s != me {
                        let n = (offset(s + 1) - offset(s)).div_ceil(FUSED_CHUNK_ROWS);
                        chunks = if n > chunks { n } else { chunks };
                    }
                    s += 1;
                }
                let hb = g.hidden as u64 * 2;
                let mut j = (b * warps + wi) as u64;
                while others > 0 && j < chunks * others as u64 {
                    let (k, d) = (j / others as u64, (j % others as u64) as u32);
                    let s = if d < me { d } else { d + 1 };
                    let n = offset(s + 1) - offset(s);
                    let lo = k * FUSED_CHUNK_ROWS;
                    if lo < n {
                        let hi = if lo + FUSED_CHUNK_ROWS < n { lo + FUSED_CHUNK_ROWS } else { n };
                        let peer = peer_word(&sh, area, s);
                        let mut slot = lo;
                        while slot < hi {
                            let i = offset(s) + slot;
                            let dst = peer.add(g.ht_combine_recv(ranks, me, slot as u32) as usize);
                            copy_bytes(dst, (x as *const u8).add((i * hb) as usize), hb as usize, lane, ws);
                            let wd = dst.add(hb as usize) as *mut f32;
                            let mut k = lane;
                            while k < g.topk {
                                *wd.add(k as usize) = if weights.is_null() { 0.0 } else { *weights.add((i * g.topk as u64 + k as u64) as usize) };
                                k += ws;
                            }
                            slot += 1;
                        }
                        // Every lane's rows of the chunk before any of its flags: each flag's
                        // release covers the warp's stores (ordered before it by the barrier).
                        arch::sync_warp();
                        let mut m = lo + lane as u64;
                        while m < hi {
                            let flag = peer.add((g.ht_combine_recv(ranks, me, m as u32) + g.combine_flag()) as usize) as *mut u64;
                            arch::store_release_sys_u64(flag, arrival_flag(seq));
                            m += ws as u64;
                        }
                    }
                    j += (senders * warps) as u64;
                }
            } else {
                let rows = ReduceRows { g, me, ranks, send_slot, tokens, mine: offset(me), area, x, weights, out, out_weights };
                reduce_tokens(&sh, &rows, (b - senders) * warps + wi, (blocks - senders) * warps, Some(seq));
            }
            arch::sync_threads();
            if tid == 0 && last_block(work_words.add(work::DONE_COMBINE as usize)) {
                let s = work_words.add(work::COMBINE_SEQ as usize);
                store(s, load(s) + 1);
            }
        }
    }

    /// High-throughput combine, receive side: waits for the other ranks' rows, then writes
    /// `out [tokens, hidden]` (BF16) = the sum over ranks of the row each sent back for the
    /// token, summed in f32 (this rank's own contribution read from `x`, with `weights`, which
    /// the send side did not copy); `out_weights [tokens, topk]` (may be null) likewise.
    pub fn ep_ht_combine_reduce(state: *const DeviceState, g0: u64, g1: u64, send_slot: *const i32, tokens: u32, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, x: *const u16, weights: *const f32, out: *mut u16, out_weights: *mut f32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let (me, ranks) = (sh.my_pe(), sh.n_pes());
            let tid = arch::thread_rank_in_block();
            if tid == 0 {
                let mut r = 0;
                while r < ranks {
                    if r != me {
                        let expected = load(work_words.add(work::combine_expected(ranks, r) as usize)) + *info_in.add(info::send_count(ranks, r)) as u64;
                        sh.signal_wait_until_from(sync_words.add(sync::combine_rows(ranks, r) as usize), Cmp::Ge, expected, r);
                    }
                    r += 1;
                }
            }
            arch::sync_threads();
            let (first_warp, all_warps) = warp_run();
            let rows = ReduceRows { g, me, ranks, send_slot, tokens, mine: *info_in.add(info::recv_offset(ranks, me)) as u64, area, x, weights, out, out_weights };
            reduce_tokens(&sh, &rows, first_warp, all_warps, None);
            arch::sync_threads();
            if tid == 0 && last_block(work_words.add(work::DONE_COMBINE as usize)) {
                let mut r = 0;
                while r < ranks {
                    // This rank's own rows never travel: nothing counts them.
                    if r != me {
                        let e = work_words.add(work::combine_expected(ranks, r) as usize);
                        store(e, load(e) + *info_in.add(info::send_count(ranks, r)) as u64);
                    }
                    r += 1;
                }
                let s = work_words.add(work::COMBINE_SEQ as usize);
                store(s, load(s) + 1);
            }
        }
    }
}

/// Adds four ranks' 16-byte BF16 vectors to one token's accumulator.
#[inline(always)]
fn add4(acc: &mut [f32; 8], w: &[[u32; 4]; 4]) {
    add_bf16x8(acc, w[0], 1.0);
    add_bf16x8(acc, w[1], 1.0);
    add_bf16x8(acc, w[2], 1.0);
    add_bf16x8(acc, w[3], 1.0);
}

/// The body of [`ep_ht_dispatch`] (`NIC`: every route) and [`ep_ht_dispatch_p2p`] (NVLink only).
///
/// # Safety
/// The kernels' launch contract; without `NIC`, every peer's area is load/store reachable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch_send<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    x: *const u8,
    x_scales: *const f32,
    topk_idx: *const i64,
    topk_weights: *const f32,
    in_rank: *const u8,
    tokens: u32,
    area: *mut u8,
    sync_words: *mut u64,
    work_words: *mut u64,
    send_slot: *mut i32,
) {
    // SAFETY: this function's `# Safety` contract, which the kernels uphold.
    unsafe {
        let sh = Shmem::attach(state);
        let g = Geometry::unpack(g0, g1);
        let (me, ranks) = (sh.my_pe(), sh.n_pes());
        let c = arch::block_idx_x();
        let lane = arch::lane_id();
        let warps = arch::block_size() / arch::warp_size();
        let wi = arch::thread_rank_in_block() / arch::warp_size();
        let (sub, subs) = warp_run();
        let (lo, hi) = split(tokens as u64, sub, subs);
        let (xb, sb, meta, row) = (g.x_bytes(), g.scale_bytes(), g.ht_meta(), g.ht_row());
        let mut staged = false;
        let mut i = 0;
        while i < ranks {
            // Each warp starts at another destination (from the rank after this one, shifted
            // by the warp), so the ranks' warps spread over the receivers' links instead of
            // every warp of every rank sending to rank 0 first.
            let r = (me + 1 + sub + i) % ranks;
            // This warp's first slot: its channel's offset plus the runs of the warps before it.
            let mut before = 0u64;
            let mut j = lane;
            while j < wi {
                before +=
                    arch::load_relaxed_sys_u64(work_words.add(work::warp_count(ranks, c * warps + j, r) as usize));
                j += arch::warp_size();
            }
            let first = load(work_words.add(work::channel_offset(ranks, c, r) as usize)) + warp_sum(before);
            let peer = if NIC { sh.ptr(area, r) } else { peer_word(&sh, area, r) };
            let direct = !NIC || !peer.is_null();
            let mut slot = first;
            let mut base = lo;
            while base < hi {
                let t = base + lane as u64;
                let sent = t < hi && *in_rank.add((t * ranks as u64 + r as u64) as usize) != 0;
                let mask = arch::ballot(sent);
                if t < hi {
                    let mine = slot + (mask & arch::lanemask_lt()).count_ones() as u64;
                    *send_slot.add((t * ranks as u64 + r as u64) as usize) = if sent { mine as i32 } else { -1 };
                }
                // The chunk's sent tokens, one row at a time, the whole warp on each.
                let mut m = mask;
                while m != 0 {
                    let tt = base + m.trailing_zeros() as u64;
                    m &= m - 1;
                    let dst = if direct {
                        peer.add(g.ht_dispatch_recv(me, slot as u32) as usize)
                    } else {
                        area.add(g.ht_stage_dispatch(ranks, r, slot as u32) as usize)
                    };
                    copy_bytes(dst, x.add((tt * xb) as usize), xb as usize, lane, arch::warp_size());
                    if sb != 0 {
                        copy_bytes(
                            dst.add(xb as usize),
                            (x_scales as *const u8).add((tt * sb) as usize),
                            sb as usize,
                            lane,
                            arch::warp_size(),
                        );
                    }
                    let md = dst.add(meta as usize) as *mut i32;
                    let mut i = lane;
                    while i < 1 + 2 * g.topk {
                        let v = if i == 0 {
                            tt as i32
                        } else if i <= g.topk {
                            *topk_idx.add((tt * g.topk as u64 + (i - 1) as u64) as usize) as i32
                        } else {
                            (*topk_weights.add((tt * g.topk as u64 + (i - 1 - g.topk) as u64) as usize)).to_bits()
                                as i32
                        };
                        *md.add(i as usize) = v;
                        i += arch::warp_size();
                    }
                    slot += 1;
                }
                base += arch::warp_size() as u64;
            }
            let n = slot - first;
            if n > 0 {
                let sig = sync_words.add(sync::dispatch_rows(ranks, me) as usize);
                let dst = area.add(g.ht_dispatch_recv(me, first as u32) as usize);
                if !NIC {
                    signal_add_p2p_warp(&sh, sig, n, r);
                } else if direct {
                    sh.put_signal_warp(dst, dst, 0, sig, n, SignalOp::Add, r);
                } else {
                    let src = area.add(g.ht_stage_dispatch(ranks, r, first as u32) as usize);
                    sh.put_signal_nbi_warp(dst, src, (n * row) as usize, sig, n, SignalOp::Add, r);
                    staged = true;
                }
            }
            i += 1;
        }
        if NIC && arch::sync_threads_or(staged) && arch::thread_rank_in_block() == 0 {
            sh.quiet();
        }
    }
}

/// The body of [`ep_ht_combine`] (`NIC`: every route) and [`ep_ht_combine_p2p`] (NVLink only).
///
/// # Safety
/// As [`dispatch_send`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn combine_send<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    x: *const u16,
    weights: *const f32,
    info_in: *const i32,
    area: *mut u8,
    sync_words: *mut u64,
    work_words: *mut u64,
) {
    // SAFETY: this function's `# Safety` contract, which the kernels uphold.
    unsafe {
        let sh = Shmem::attach(state);
        let g = Geometry::unpack(g0, g1);
        let (me, ranks) = (sh.my_pe(), sh.n_pes());
        let tid = arch::thread_rank_in_block();
        let lane = arch::lane_id();
        let seq = load(work_words.add(work::COMBINE_SEQ as usize)) + 1;
        if tid == 0 {
            if arch::block_idx_x() == 0 {
                let mut s = 0;
                while s < ranks {
                    let ready = sync_words.add(sync::combine_ready(ranks, me) as usize);
                    if s == me {
                    } else if NIC {
                        sh.signal_op(ready, seq, SignalOp::Set, s);
                    } else {
                        arch::store_release_sys_u64(peer_word(&sh, ready, s), seq);
                    }
                    s += 1;
                }
            }
            let mut s = 0;
            while s < ranks {
                if s != me {
                    sh.signal_wait_until_from(sync_words.add(sync::combine_ready(ranks, s) as usize), Cmp::Ge, seq, s);
                }
                s += 1;
            }
        }
        arch::sync_threads();
        let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
        let (mine_lo, mine_hi) = (offset(me), offset(me + 1));
        let local = mine_hi - mine_lo;
        // The warps split the remote rows: index `v` of that sequence is receive row `v` below
        // this rank's own rows and `v + local` above them.
        let (sub, subs) = warp_run();
        let (lo, hi) = split(offset(ranks) - local, sub, subs);
        let hb = g.hidden as u64 * 2;
        let row = g.combine_row();
        let mut staged = false;
        let mut s = 0;
        while s < ranks {
            if s == me {
                s += 1;
                continue;
            }
            let shift = if s > me { local } else { 0 };
            let (a, b) = (offset(s) - shift, offset(s + 1) - shift);
            let (a, b) = (if a > lo { a } else { lo }, if b < hi { b } else { hi });
            if a < b {
                let (a, b) = (a + shift, b + shift);
                let peer = if NIC { sh.ptr(area, s) } else { peer_word(&sh, area, s) };
                let direct = !NIC || !peer.is_null();
                let first = (a - offset(s)) as u32;
                let mut i = a;
                while i < b {
                    let slot = first + (i - a) as u32;
                    let dst = if direct {
                        peer.add(g.ht_combine_recv(ranks, me, slot) as usize)
                    } else {
                        area.add(g.ht_stage_combine(ranks, s, slot) as usize)
                    };
                    copy_bytes(
                        dst,
                        (x as *const u8).add((i * hb) as usize),
                        hb as usize,
                        lane,
                        arch::warp_size(),
                    );
                    let wd = dst.add(hb as usize) as *mut f32;
                    let mut k = lane;
                    while k < g.topk {
                        *wd.add(k as usize) = if weights.is_null() {
                            0.0
                        } else {
                            *weights.add((i * g.topk as u64 + k as u64) as usize)
                        };
                        k += arch::warp_size();
                    }
                    i += 1;
                }
                let n = b - a;
                let sig = sync_words.add(sync::combine_rows(ranks, me) as usize);
                let dst = area.add(g.ht_combine_recv(ranks, me, first) as usize);
                if !NIC {
                    signal_add_p2p_warp(&sh, sig, n, s);
                } else if direct {
                    sh.put_signal_warp(dst, dst, 0, sig, n, SignalOp::Add, s);
                } else {
                    let src = area.add(g.ht_stage_combine(ranks, s, first) as usize);
                    sh.put_signal_nbi_warp(dst, src, (n * row) as usize, sig, n, SignalOp::Add, s);
                    staged = true;
                }
            }
            s += 1;
        }
        if NIC && arch::sync_threads_or(staged) && tid == 0 {
            sh.quiet();
        }
    }
}

/// `pe`'s copy of symmetric `word`, for the NVLink-only kernels, whose host launches
/// them only when every peer is load/store reachable (a peer that is not stops the kernel).
///
/// # Safety
/// `word` is in this PE's symmetric heap.
#[inline(always)]
unsafe fn peer_word<T>(sh: &Shmem, word: *mut T, pe: u32) -> *mut T {
    let p = sh.ptr(word, pe);
    if p.is_null() {
        arch::trap();
    }
    p
}

/// Adds `n` to the signal word `sig` on `pe` after every store of the calling warp to `pe`
/// (what `put_signal_warp` with no data does on an NVLink route). Every lane calls it.
///
/// # Safety
/// As [`peer_word`].
#[inline(always)]
unsafe fn signal_add_p2p_warp(sh: &Shmem, sig: *mut u64, n: u64, pe: u32) {
    // SAFETY: this function's contract.
    unsafe {
        arch::sync_warp();
        if arch::lane_id() == 0 {
            // The warp's stores (ordered before this lane's by the barrier) before the signal.
            arch::fence_sc_sys();
            arch::atomic_add_release_sys_u64(peer_word(sh, sig, pe), n);
        }
    }
}

/// The body of [`ep_ht_notify`] (`NIC`: every route) and [`ep_ht_notify_p2p`] (NVLink only).
///
/// # Safety
/// As [`dispatch_send`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn notify<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    in_rank: *const u8,
    tokens_per_expert: *const u32,
    tokens: u32,
    sync_words: *mut u64,
    work_words: *mut u64,
    info_out: *mut i32,
) {
    // SAFETY: this function's `# Safety` contract, which the kernels uphold.
    unsafe {
        let sh = Shmem::attach(state);
        let g = Geometry::unpack(g0, g1);
        let (me, ranks) = (sh.my_pe(), sh.n_pes());
        let chans = arch::grid_dim_x();
        let c = arch::block_idx_x();
        let w = |i: u64| work_words.add(i as usize);
        let lane = arch::lane_id();
        let (sub, subs) = warp_run();
        let (lo, hi) = split(tokens as u64, sub, subs);
        let mut r = 0;
        while r < ranks {
            let mut n = 0u64;
            let mut base = lo;
            while base < hi {
                let t = base + lane as u64;
                let sent = t < hi && *in_rank.add((t * ranks as u64 + r as u64) as usize) != 0;
                n += arch::ballot(sent).count_ones() as u64;
                base += arch::warp_size() as u64;
            }
            if lane == 0 {
                arch::store_relaxed_sys_u64(w(work::warp_count(ranks, sub, r)), n);
                arch::atomic_add_relaxed_sys_u64(w(work::channel_count(ranks, c, r)), n);
            }
            r += 1;
        }
        arch::sync_threads();
        let tid = arch::thread_rank_in_block();
        let last = arch::sync_threads_or(tid == 0 && last_block(w(work::DONE_NOTIFY)));
        if !last || tid >= arch::warp_size() {
            return;
        }
        // The last block's first warp: everything below runs on its lanes.
        arch::fence_acq_rel_sys();
        let seq = load(w(work::HT_SEQ)) + 1;
        arch::sync_warp();
        if lane == 0 {
            store(w(work::HT_SEQ), seq);
        }
        let parity = (seq & 1) as u32;
        let mut overflow: u32 = 0;
        let mut r = 0;
        while r < ranks {
            // Slot offsets per channel: a warp-wide scan of the channel counts.
            let mut off = 0u64;
            let mut base = 0;
            while base < chans {
                let ch = base + lane;
                let n = if ch < chans {
                    arch::load_relaxed_sys_u64(w(work::channel_count(ranks, ch, r)))
                } else {
                    0
                };
                let incl = warp_inclusive_sum(n);
                if ch < chans {
                    arch::store_relaxed_sys_u64(w(work::channel_offset(ranks, ch, r)), off + incl - n);
                    arch::store_relaxed_sys_u64(w(work::channel_count(ranks, ch, r)), 0);
                }
                off += arch::shfl_idx_u64(incl, arch::warp_size() - 1);
                base += arch::warp_size();
            }
            if off > g.capacity as u64 && overflow == 0 {
                overflow = r + 1;
            }
            let msg = w(work::notify_stage(ranks, r));
            if lane == 0 {
                *info_out.add(info::send_count(ranks, r)) = off as i32;
                arch::store_relaxed_sys_u64(msg, off);
            }
            // Every destination's message also carries this rank's count to `r` (each rank
            // learns the whole matrix: DeepEP's handle holds it).
            let mut d = lane;
            while d < ranks {
                arch::store_relaxed_sys_u64(
                    w(work::notify_stage(ranks, d)).add((2 + g.local_experts + r) as usize),
                    off,
                );
                d += arch::warp_size();
            }
            let mut le = lane;
            while le < g.local_experts {
                arch::store_relaxed_sys_u64(
                    msg.add(2 + le as usize),
                    *tokens_per_expert.add((r * g.local_experts + le) as usize) as u64,
                );
                le += arch::warp_size();
            }
            r += 1;
        }
        arch::sync_warp();
        // One lane per destination sends its message.
        let mut r = lane;
        while r < ranks {
            arch::store_relaxed_sys_u64(w(work::notify_stage(ranks, r)).add(1), overflow as u64);
            let dst = sync_words.add(sync::notify_data(ranks, parity, me) as usize);
            let sig = sync_words.add(sync::notify_sig(me) as usize);
            let (src, len) = (w(work::notify_stage(ranks, r)), (2 + g.local_experts + ranks) as usize);
            if NIC {
                sh.put_signal(dst, src, len, sig, seq, SignalOp::Set, r);
            } else {
                let (dst, sig) = (peer_word(&sh, dst, r), peer_word(&sh, sig, r));
                let mut k = 0;
                while k < len {
                    arch::store_relaxed_sys_u64(dst.add(k), arch::load_relaxed_sys_u64(src.add(k)));
                    k += 1;
                }
                // The message before the signal that says it is there.
                arch::store_release_sys_u64(sig, seq);
            }
            r += arch::warp_size();
        }
        // Every rank's message (one lane per source): counts from each, and whether anyone overflowed.
        let mut s = lane;
        while s < ranks {
            sh.signal_wait_until_from(sync_words.add(sync::notify_sig(s) as usize), Cmp::Ge, seq, s);
            s += arch::warp_size();
        }
        arch::sync_warp();
        arch::fence_acq_rel_sys();
        let msg = |s: u32| sync_words.add(sync::notify_data(ranks, parity, s) as usize);
        let mut le = lane;
        while le < g.local_experts {
            let mut n = 0u64;
            let mut s = 0;
            while s < ranks {
                n += arch::load_relaxed_sys_u64(msg(s).add(2 + le as usize));
                s += 1;
            }
            *info_out.add(info::expert_count(ranks, le)) = n as i32;
            le += arch::warp_size();
        }
        if lane == 0 {
            let mut status = overflow;
            let mut total = 0u64;
            let mut s = 0;
            while s < ranks {
                let n = arch::load_relaxed_sys_u64(msg(s));
                let their = arch::load_relaxed_sys_u64(msg(s).add(1)) as u32;
                if status == 0 && their != 0 {
                    status = their;
                }
                *info_out.add(info::recv_count(s)) = n as i32;
                *info_out.add(info::recv_offset(ranks, s)) = total as i32;
                let mut j = 0;
                while j < ranks {
                    let sent = arch::load_relaxed_sys_u64(msg(s).add((2 + g.local_experts + j) as usize));
                    *info_out.add(info::sent(ranks, g.local_experts, s, j)) = sent as i32;
                    j += 1;
                }
                total += n;
                s += 1;
            }
            *info_out.add(info::recv_offset(ranks, ranks)) = total as i32;
            *info_out.add(info::status(ranks, g.local_experts)) = status as i32;
            if status == 0 {
                let mut s = 0;
                while s < ranks {
                    let e = w(work::dispatch_expected(s));
                    store(e, load(e) + *info_out.add(info::recv_count(s)) as u64);
                    s += 1;
                }
            }
        }
        arch::fence_sc_sys();
    }
}

/// A warp's copy of a row (or its scales), read once: eight 16-byte loads in flight per lane, so a
/// 7,168-byte FP8 row is two rounds of loads and a 14,336-byte BF16 row four.
///
/// # Safety
/// As [`ibgda_device::copy_cooperative`].
#[inline(always)]
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    // SAFETY: the caller's contract.
    unsafe { copy_cooperative_streaming::<8>(dst, src, bytes, rank, nthreads) }
}

/// What a combine reduce reads and writes (see [`ep_ht_combine_reduce`]).
#[derive(Clone, Copy)]
struct ReduceRows {
    g: Geometry,
    me: u32,
    ranks: u32,
    send_slot: *const i32,
    tokens: u32,
    /// This rank's own first receive row (`recv_offset[me]`): its rows are read from `x`.
    mine: u64,
    area: *mut u8,
    x: *const u16,
    weights: *const f32,
    out: *mut u16,
    out_weights: *mut f32,
}

/// Sums tokens `first_warp, first_warp + all_warps, ...` (a warp per token) of `rows` into `out`
/// (and `out_weights`). With `wait_seq`, each other rank's row is first awaited by its flag
/// reaching that call number (the fused combine); without, every row is already there.
///
/// # Safety
/// The kernels' launch contract for the buffers `rows` names. Every lane of the warp calls it.
#[inline(always)]
unsafe fn reduce_tokens(sh: &Shmem, rows: &ReduceRows, first_warp: u32, all_warps: u32, wait_seq: Option<u64>) {
    let ReduceRows {
        g,
        me,
        ranks,
        send_slot,
        tokens,
        mine,
        area,
        x,
        weights,
        out,
        out_weights,
    } = *rows;
    // SAFETY: this function's `# Safety` contract.
    unsafe {
        let hb = g.hidden as u64 * 2;
        let vecs = g.hidden / 8;
        let (lane, ws) = (arch::lane_id(), arch::warp_size());
        // A warp per token (the warps of the grid take tokens in turn): each lane sums its
        // vectors of the row (lane, lane + 32, ...) over the ranks the token went to.
        let mut t = first_warp;
        while t < tokens {
            if let Some(seq) = wait_seq {
                // Fused with the send: wait until each other rank's row for this token is
                // there (its flag holds this call's value, `arrival_flag`; one lane per rank).
                let mut r = lane;
                while r < ranks {
                    let slot = *send_slot.add((t * ranks + r) as usize);
                    if r != me && slot >= 0 {
                        let flag = area.add((g.ht_combine_recv(ranks, r, slot as u32) + g.combine_flag()) as usize)
                            as *mut u64;
                        sh.signal_wait_until_from(flag, Cmp::Eq, arrival_flag(seq), r);
                    }
                    r += ws;
                }
                // The lanes' acquires before every lane's loads of the rows.
                arch::sync_warp();
            }
            // Where rank `r`'s row for this token starts, or null: this rank's own in `x`, the
            // others' in the combine receive area. The token's slots are one small run, read
            // from L1 after the first round.
            let row_of = |r: u32| -> *const u8 {
                if r >= ranks {
                    return core::ptr::null();
                }
                let slot = *send_slot.add((t * ranks + r) as usize);
                if slot < 0 {
                    core::ptr::null()
                } else if r == me {
                    (x as *const u8).add(((mine + slot as u64) * hb) as usize)
                } else {
                    area.add(g.ht_combine_recv(ranks, r, slot as u32) as usize)
                }
            };
            // Four vectors per lane and four ranks per round: the round's sixteen loads are
            // issued before its first add, so a 7,168-channel row over up to four ranks is
            // seven load round trips. Written out by hand: an array of accumulators indexed in
            // a loop ends up in local memory.
            let mut v0 = lane;
            while v0 < vecs {
                let (mut a0, mut a1, mut a2, mut a3) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
                let mut r = 0;
                while r < ranks {
                    let p = [row_of(r), row_of(r + 1), row_of(r + 2), row_of(r + 3)];
                    let l = |p: *const u8, j: u32| {
                        let v = v0 + ws * j;
                        if p.is_null() || v >= vecs {
                            [0u32; 4]
                        } else {
                            arch::load_v4_stream(p.add(v as usize * 16) as *const [u32; 4])
                        }
                    };
                    let w = [
                        [l(p[0], 0), l(p[1], 0), l(p[2], 0), l(p[3], 0)],
                        [l(p[0], 1), l(p[1], 1), l(p[2], 1), l(p[3], 1)],
                        [l(p[0], 2), l(p[1], 2), l(p[2], 2), l(p[3], 2)],
                        [l(p[0], 3), l(p[1], 3), l(p[2], 3), l(p[3], 3)],
                    ];
                    add4(&mut a0, &w[0]);
                    add4(&mut a1, &w[1]);
                    add4(&mut a2, &w[2]);
                    add4(&mut a3, &w[3]);
                    r += 4;
                }
                let o = |j: u32| (out as *mut u8).add((t as u64 * hb + (v0 + ws * j) as u64 * 16) as usize);
                store_bf16x8(o(0), &a0);
                if v0 + ws < vecs {
                    store_bf16x8(o(1), &a1);
                }
                if v0 + 2 * ws < vecs {
                    store_bf16x8(o(2), &a2);
                }
                if v0 + 3 * ws < vecs {
                    store_bf16x8(o(3), &a3);
                }
                v0 += 4 * ws;
            }
            if !out_weights.is_null() {
                // Rank `r`'s weights for this token (null: not sent there, or no weights passed).
                let weights_of = |r: u32| -> *const f32 {
                    let p = row_of(r);
                    if p.is_null() {
                        core::ptr::null()
                    } else if r == me {
                        if weights.is_null() {
                            core::ptr::null()
                        } else {
                            let slot = *send_slot.add((t * ranks + r) as usize) as u64;
                            weights.add(((mine + slot) * g.topk as u64) as usize)
                        }
                    } else {
                        p.add(hb as usize) as *const f32
                    }
                };
                let mut k = lane;
                while k < g.topk {
                    let mut acc = 0.0f32;
                    let mut r = 0;
                    while r < ranks {
                        let p = weights_of(r);
                        if !p.is_null() {
                            acc += *p.add(k as usize);
                        }
                        r += 1;
                    }
                    *out_weights.add((t * g.topk + k) as usize) = acc;
                    k += ws;
                }
            }
            t += all_warps;
        }
    }
}

/// Rows per flagged chunk of the fused combine's send: a chunk's flags cost the warp one wait for
/// its stores to land, so a chunk is long against that wait and short against a reducer's.
pub const FUSED_CHUNK_ROWS: u64 = 8;

/// Sending blocks of a fused combine of `blocks` blocks: a third (at least one), the rest reduce.
/// The send is bound by the links (measured: 12 SMs send at EP4 within 8% of 24), the reduce by
/// the SMs' loads (its time halves with twice the SMs).
pub const fn fused_senders(blocks: u32) -> u32 {
    let s = blocks / 3;
    if s == 0 {
        1
    } else {
        s
    }
}

/// The value a fused combine's sender writes into a row's flag once the row is there: a function
/// of the call number that no earlier call writes, spread over all 64 bits because the flag's
/// place may have held row data before (a buffer used with another hidden size or top-k), which
/// must not pass for it. Reducers wait for equality.
pub const fn arrival_flag(seq: u64) -> u64 {
    seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d
}

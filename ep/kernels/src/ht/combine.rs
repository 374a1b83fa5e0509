//! High-throughput combine: the send side, the reduction, and both in one launch (over NVLink, and
//! with peers behind a NIC or the proxy).

use super::signal_add_p2p_warp;
use crate::copy::{add_bf16x8, copy_bytes_wide, last_block, split, store_bf16x8, warp_run};
use crate::geometry::{info, sync, work, Geometry};
use crate::peer_ptr;
use crate::{load, store};
use ibgda_abi::DeviceState;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

ibgda_device::kernel! {
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
    /// [`ep_ht_combine`], in chunks of [`FUSED_CHUNK_ROWS`] rows, each chunk's first row flagged
    /// with the call's [`arrival_flag`] once the chunk is there: [`send_chunks`], as
    /// [`ep_ht_combine_fused`] sends, so a rank running either kernel reads the other's flags
    /// alike), while the other blocks sum each token as soon as its rows have arrived (as
    /// [`ep_ht_combine_reduce`]). The reduce, bound by the SMs' loads,
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
            let ws = arch::warp_size();
            let warps = arch::block_size() / ws;
            let wi = tid / ws;
            let seq = load(work_words.add(work::COMBINE_SEQ as usize)) + 1;
            let senders = fused_senders(blocks);
            let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
            if b < senders {
                if tid == 0 {
                    combine_handshake::<false>(&sh, sync_words, seq, b == 0);
                }
                arch::sync_threads();
                let rows = SendRows { g, me, ranks, info_in, area, x, weights };
                send_chunks::<false>(&sh, &rows, seq, b * warps + wi, senders * warps);
            } else {
                let rows = ReduceRows { g, me, ranks, send_slot, tokens, mine: offset(me), area, x, weights, out, out_weights };
                reduce_tokens(&sh, &rows, (b - senders) * warps + wi, (blocks - senders) * warps, Some(seq), FUSED_CHUNK_ROWS as u32);
            }
            arch::sync_threads();
            if tid == 0 && last_block(work_words.add(work::DONE_COMBINE as usize)) {
                let s = work_words.add(work::COMBINE_SEQ as usize);
                store(s, load(s) + 1);
            }
        }
    }

    /// High-throughput combine in one launch with peers behind a NIC (or the proxy) among the
    /// others: every block first sends its share of the other ranks' rows, in chunks of
    /// [`FUSED_CHUNK_ROWS`] slots of one destination (chunk `k` of every destination before chunk
    /// `k + 1` of any), then sums tokens as soon as the chunks holding their rows are flagged. A
    /// chunk for a peer behind a NIC is staged and sent as one WRITE whose signal then sets the
    /// flag of the chunk's first row to the call's [`arrival_flag`] (a WRITE's bytes land in no
    /// particular order, so no row can flag itself); one for an NVLink peer is stored and flagged
    /// the same way by a release store. Every block sends (staging takes the SMs' loads and
    /// stores: a third of the blocks staged too slowly when the link is fast), then reduces, so
    /// the reduce runs under the transfer instead of after it. A block's reduce waits on rows
    /// other blocks send (of this rank and of the others), so the host launches it only when every
    /// block is resident at once.
    pub fn ep_ht_combine_fused(state: *const DeviceState, g0: u64, g1: u64, x: *const u16, weights: *const f32, send_slot: *const i32, tokens: u32, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, out: *mut u16, out_weights: *mut f32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let (me, ranks) = (sh.my_pe(), sh.n_pes());
            let (tid, b, blocks) = (arch::thread_rank_in_block(), arch::block_idx_x(), arch::grid_dim_x());
            let ws = arch::warp_size();
            let warps = arch::block_size() / ws;
            let wi = tid / ws;
            let seq = load(work_words.add(work::COMBINE_SEQ as usize)) + 1;
            let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
            if tid == 0 {
                combine_handshake::<true>(&sh, sync_words, seq, b == 0);
            }
            arch::sync_threads();
            let send = SendRows { g, me, ranks, info_in, area, x, weights };
            let staged = send_chunks::<true>(&sh, &send, seq, b * warps + wi, blocks * warps);
            // Every lane's posts before any lane waits on a flag (a warp's NIC work must not sit
            // behind its own reduce).
            arch::sync_warp();
            let rows = ReduceRows { g, me, ranks, send_slot, tokens, mine: offset(me), area, x, weights, out, out_weights };
            reduce_tokens(&sh, &rows, b * warps + wi, blocks * warps, Some(seq), FUSED_CHUNK_ROWS as u32);
            // The staged rows are read until the NIC has sent them: complete the block's queue
            // before a later call may rewrite them.
            if arch::sync_threads_or(staged) && tid == 0 {
                sh.quiet();
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
            reduce_tokens(&sh, &rows, first_warp, all_warps, None, 1);
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

/// 16-byte vector `v` of a row at `p` (read once, not kept in L1), or zeros when there is no row
/// (`p` null) or `v` is past its `vecs`.
///
/// # Safety
/// A non-null `p` is a row of `vecs` readable vectors.
#[inline(always)]
unsafe fn row_vector(p: *const u8, v: u32, vecs: u32) -> [u32; 4] {
    if p.is_null() || v >= vecs {
        [0u32; 4]
    } else {
        // SAFETY: this function's contract: `v` is inside the row.
        unsafe { arch::load_v4_stream(p.add(v as usize * 16) as *const [u32; 4]) }
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

/// The body of [`ep_ht_combine`] (`NIC`: every route) and [`ep_ht_combine_p2p`] (NVLink only).
///
/// # Safety
/// The kernels' launch contract; without `NIC`, every peer's area is load/store reachable.
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
            combine_handshake::<NIC>(&sh, sync_words, seq, arch::block_idx_x() == 0);
        }
        arch::sync_threads();
        let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
        let (mine_lo, mine_hi) = (offset(me), offset(me + 1));
        let local = mine_hi - mine_lo;
        // The warps split the remote rows: index `v` of that sequence is receive row `v` below
        // this rank's own rows and `v + local` above them.
        let (sub, subs) = warp_run();
        let (lo, hi) = split(offset(ranks) - local, sub, subs);
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
                let peer = if NIC {
                    sh.ptr(area, s)
                } else {
                    peer_ptr::<false, _>(&sh, area, s)
                };
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
                    write_combine_row(&g, dst, x, weights, i, lane);
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

/// Writes received row `i` of `x` (BF16, `hidden` channels) and its `topk` weights (0 when
/// `weights` is null) as a combined row at `dst` (a peer's receive slot, or a staging row). Every
/// lane of the warp calls it.
///
/// # Safety
/// `dst` is a combined row's worth of writable memory; `x` and `weights` hold row `i`.
#[inline(always)]
unsafe fn write_combine_row(g: &Geometry, dst: *mut u8, x: *const u16, weights: *const f32, i: u64, lane: u32) {
    // SAFETY: this function's contract.
    unsafe {
        let (hb, ws) = (g.hidden as u64 * 2, arch::warp_size());
        copy_bytes_wide(dst, (x as *const u8).add((i * hb) as usize), hb as usize, lane, ws);
        let wd = dst.add(hb as usize) as *mut f32;
        let mut k = lane;
        while k < g.topk {
            *wd.add(k as usize) = if weights.is_null() {
                0.0
            } else {
                *weights.add((i * g.topk as u64 + k as u64) as usize)
            };
            k += ws;
        }
    }
}

/// What the one-launch combines send: the received rows of `x` (with `weights`) back to their
/// sources, as `info_in`'s receive offsets place them.
#[derive(Clone, Copy)]
struct SendRows {
    g: Geometry,
    me: u32,
    ranks: u32,
    info_in: *const i32,
    area: *mut u8,
    x: *const u16,
    weights: *const f32,
}

/// The send side of the one-launch combines: warp `first_warp` (then every `all_warps`-th) sends
/// chunks of [`FUSED_CHUNK_ROWS`] slots, chunk `k` of every destination before chunk `k + 1` of
/// any (so each destination's rows arrive in slot order, about its token order, the order its
/// reducers take), then sets the flag of the chunk's first row to the call's [`arrival_flag`]:
/// for a peer reached by stores, with a release store after the warp's rows; for a peer behind a
/// NIC (`NIC` only), by the signal of the one WRITE that sends the staged chunk (a WRITE's bytes
/// land in no particular order, so no row can flag itself). Returns whether this warp staged
/// rows, which the NIC reads until a quiet. Every lane of the warp calls it.
///
/// # Safety
/// The one-launch combines' launch contract for the buffers `rows` names; without `NIC`, every
/// peer's area is load/store reachable.
#[inline(always)]
unsafe fn send_chunks<const NIC: bool>(sh: &Shmem, rows: &SendRows, seq: u64, first_warp: u32, all_warps: u32) -> bool {
    let SendRows {
        g,
        me,
        ranks,
        info_in,
        area,
        x,
        weights,
    } = *rows;
    // SAFETY: this function's contract.
    unsafe {
        let lane = arch::lane_id();
        let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u64;
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
        let mut staged = false;
        let mut j = first_warp as u64;
        while others > 0 && j < chunks * others as u64 {
            let (k, d) = (j / others as u64, (j % others as u64) as u32);
            let s = if d < me { d } else { d + 1 };
            let n = offset(s + 1) - offset(s);
            let lo = k * FUSED_CHUNK_ROWS;
            if lo < n {
                let hi = if lo + FUSED_CHUNK_ROWS < n {
                    lo + FUSED_CHUNK_ROWS
                } else {
                    n
                };
                let peer = if NIC {
                    sh.ptr(area, s)
                } else {
                    peer_ptr::<false, _>(sh, area, s)
                };
                let direct = !NIC || !peer.is_null();
                let mut slot = lo;
                while slot < hi {
                    let dst = if direct {
                        peer.add(g.ht_combine_recv(ranks, me, slot as u32) as usize)
                    } else {
                        area.add(g.ht_stage_combine(ranks, s, slot as u32) as usize)
                    };
                    write_combine_row(&g, dst, x, weights, offset(s) + slot, lane);
                    if !direct && slot == lo && lane == 0 {
                        // The staged head row's flag lands with the WRITE, before the signal:
                        // it must never pass for this call's arrival.
                        *(dst.add(g.combine_flag() as usize) as *mut u64) = 0;
                    }
                    slot += 1;
                }
                let head = g.ht_combine_recv(ranks, me, lo as u32) + g.combine_flag();
                if direct {
                    // Every lane's rows before the flag: the release covers the warp's stores
                    // (ordered before it by the barrier).
                    arch::sync_warp();
                    if lane == 0 {
                        arch::store_release_sys_u64(peer.add(head as usize) as *mut u64, arrival_flag(seq));
                    }
                } else {
                    let dst = area.add(g.ht_combine_recv(ranks, me, lo as u32) as usize);
                    let src = area.add(g.ht_stage_combine(ranks, s, lo as u32) as usize);
                    let flag = area.add(head as usize) as *mut u64;
                    sh.put_signal_nbi_warp(
                        dst,
                        src,
                        ((hi - lo) * g.combine_row()) as usize,
                        flag,
                        arrival_flag(seq),
                        SignalOp::Set,
                        s,
                    );
                    staged = true;
                }
            }
            j += all_warps as u64;
        }
        staged
    }
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
/// (and `out_weights`). With `wait_seq`, each other rank's row is first awaited by a flag holding
/// that call's [`arrival_flag`] (the fused combines): the flag of the first row of its run of
/// `flag_rows` slots (1: every row has its own); without, every row is already there.
///
/// # Safety
/// The kernels' launch contract for the buffers `rows` names. Every lane of the warp calls it.
#[inline(always)]
unsafe fn reduce_tokens(
    sh: &Shmem,
    rows: &ReduceRows,
    first_warp: u32,
    all_warps: u32,
    wait_seq: Option<u64>,
    flag_rows: u32,
) {
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
                        let head = slot as u32 / flag_rows * flag_rows;
                        let flag =
                            area.add((g.ht_combine_recv(ranks, r, head) + g.combine_flag()) as usize) as *mut u64;
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
            // Two ranks (EP2): the round's sixteen loads are eight vectors of each of the two
            // rows, so a 7,168-channel row is four round trips, not seven with half the loads.
            let (p0, p1) = if ranks <= 2 {
                (row_of(0), row_of(1))
            } else {
                (core::ptr::null(), core::ptr::null())
            };
            while ranks <= 2 && v0 < vecs {
                let l = |p: *const u8, j: u32| row_vector(p, v0 + ws * j, vecs);
                // Written out by hand: arrays indexed in a loop end up in local memory.
                let (w0, w1, w2, w3) = (l(p0, 0), l(p0, 1), l(p0, 2), l(p0, 3));
                let (w4, w5, w6, w7) = (l(p0, 4), l(p0, 5), l(p0, 6), l(p0, 7));
                let (u0, u1, u2, u3) = (l(p1, 0), l(p1, 1), l(p1, 2), l(p1, 3));
                let (u4, u5, u6, u7) = (l(p1, 4), l(p1, 5), l(p1, 6), l(p1, 7));
                let sum = |j: u32, x0: [u32; 4], x1: [u32; 4]| {
                    if v0 + ws * j < vecs {
                        // In rank order from zero, as the rounds below sum.
                        let mut a = [0.0f32; 8];
                        add_bf16x8(&mut a, x0, 1.0);
                        add_bf16x8(&mut a, x1, 1.0);
                        store_bf16x8(
                            (out as *mut u8).add((t as u64 * hb + (v0 + ws * j) as u64 * 16) as usize),
                            &a,
                        );
                    }
                };
                sum(0, w0, u0);
                sum(1, w1, u1);
                sum(2, w2, u2);
                sum(3, w3, u3);
                sum(4, w4, u4);
                sum(5, w5, u5);
                sum(6, w6, u6);
                sum(7, w7, u7);
                v0 += 8 * ws;
            }
            while v0 < vecs {
                let (mut a0, mut a1, mut a2, mut a3) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
                let mut r = 0;
                while r < ranks {
                    let p = [row_of(r), row_of(r + 1), row_of(r + 2), row_of(r + 3)];
                    let l = |p: *const u8, j: u32| row_vector(p, v0 + ws * j, vecs);
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

/// The start of a combine, by thread 0 of a sending block: with `announce` (one block per rank),
/// tells every other rank that this one may receive combine `seq` (its previous combine has
/// stopped reading its area), then waits until every other rank has said the same.
///
/// # Safety
/// `sync_words` is this buffer's sync area; without `NIC`, every peer is load/store reachable.
#[inline(always)]
unsafe fn combine_handshake<const NIC: bool>(sh: &Shmem, sync_words: *mut u64, seq: u64, announce: bool) {
    // SAFETY: this function's contract.
    unsafe {
        let (me, ranks) = (sh.my_pe(), sh.n_pes());
        if announce {
            let ready = sync_words.add(sync::combine_ready(ranks, me) as usize);
            let mut s = 0;
            while s < ranks {
                if s == me {
                } else if NIC {
                    sh.signal_op(ready, seq, SignalOp::Set, s);
                } else {
                    arch::store_release_sys_u64(peer_ptr::<false, _>(sh, ready, s), seq);
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
}

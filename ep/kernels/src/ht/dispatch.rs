//! High-throughput dispatch: the send side and the receive-side compaction.

use super::signal_add_p2p_warp;
use crate::copy::{copy_bytes, split, warp_run, warp_sum, RowTail};
use crate::geometry::{info, sync, work, Geometry};
use crate::peer_ptr;
use crate::{load, store};
use ibgda_abi::DeviceState;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

ibgda_device::kernel! {
    /// High-throughput dispatch, send side: each warp writes its run of the channel's tokens once
    /// per destination rank into the slots the notify assigned (its channel's offset plus the
    /// runs of the warps before it; `send_slot [tokens, ranks]` records each, `-1` where not
    /// sent), a whole warp per row. Each warp adds its row count to an NVLink destination's
    /// counter. For a destination behind a NIC or the proxy each warp stages its rows and posts
    /// them in growing WRITEs as they are staged; after all of them the block writes, on its
    /// queue, where its rows went (its channel's slots, from the notify's per-warp counts, so
    /// `in_rank` and `tokens` must be the notify's) and this call's number. The receive kernel
    /// ([`ep_ht_dispatch_recv`], same grid) completes the block's queue. After a cached notify
    /// ([`ep_ht_notify_cached`](crate::ep_ht_notify_cached)) the slots are read from `send_slot`
    /// instead, and each block first waits for every rank to have entered the call.
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

    /// High-throughput dispatch, receive side: compacts every source's rows into `recv_x
    /// [num_recv, hidden]` (and scales), a warp per row, with `recv_topk_idx` made local to this
    /// rank (`-1` and weight 0 for experts elsewhere) and `recv_src` the token's index at its
    /// source. Rows stored by loads and stores (this rank's, NVLink peers') once each such
    /// source's count is in; a source behind a NIC or the proxy channel by channel, block `b`
    /// taking channel `b` as soon as its word says it arrived, so the compaction runs under the
    /// transfer. Launched with the send kernel's grid, whose queues each block then completes.
    pub fn ep_ht_dispatch_recv(state: *const DeviceState, g0: u64, g1: u64, info_in: *const i32, area: *mut u8, sync_words: *mut u64, work_words: *mut u64, recv_x: *mut u8, recv_scales: *mut f32, recv_topk_idx: *mut i64, recv_topk_weights: *mut f32, recv_src: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let g = Geometry::unpack(g0, g1);
            let (me, ranks) = (sh.my_pe(), sh.n_pes());
            let tid = arch::thread_rank_in_block();
            let out = RecvOut { recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_src };
            let offset = |s: u32| *info_in.add(info::recv_offset(ranks, s)) as u32;
            // This rank's own rows and those of NVLink peers were stored by the send kernels:
            // all of a source's rows at once, by every warp.
            let direct = |s: u32| !peer_ptr::<true, u8>(&sh, area, s).is_null();
            if tid == 0 {
                let mut s = 0;
                while s < ranks {
                    if direct(s) {
                        let expected = load(work_words.add(work::dispatch_expected(s) as usize));
                        sh.signal_wait_until_from(sync_words.add(sync::dispatch_rows(ranks, s) as usize), Cmp::Ge, expected, s);
                    }
                    s += 1;
                }
            }
            arch::sync_threads();
            let (first_warp, all_warps) = warp_run();
            let mut s = 0;
            while s < ranks {
                if direct(s) {
                    let (lo, hi) = (offset(s), offset(s + 1));
                    let mut i = lo + first_warp;
                    while i < hi {
                        compact_row(&g, me, area, &out, i, s, i - lo);
                        i += all_warps;
                    }
                }
                s += 1;
            }
            // A source behind a NIC or the proxy: its channels (the send kernel's blocks; every
            // rank's send runs on as many) in the order they arrive, each compacted by the whole
            // grid, so the last one to arrive takes the grid a row per warp or so, not a block
            // its whole run. Thread 0 of each block looks at every pending channel and takes those
            // in; after `IDLE_LOOKS` looks with none, it waits (with the PE's timeout and its
            // report) on the first pending one.
            let seq = load(work_words.add(work::HT_SEQ as usize));
            let channels = load(work_words.add(work::DISPATCH_CHANNELS as usize)) as u32;
            let mut s = 0;
            while s < ranks {
                if !direct(s) {
                    let lo = offset(s);
                    let done_of = |c: u32| sync_words.add(sync::dispatch_channel_done(ranks, s, c) as usize);
                    let mut pending = if channels >= 128 { u128::MAX } else { (1u128 << channels) - 1 };
                    while pending != 0 {
                        let mut ready = 0u128;
                        if tid == 0 {
                            let mut looks = 0;
                            loop {
                                let mut p = pending;
                                while p != 0 {
                                    let c = p.trailing_zeros();
                                    p &= p - 1;
                                    if sh.signal_fetch(done_of(c)) == seq {
                                        ready |= 1 << c;
                                    }
                                }
                                looks += 1;
                                if ready != 0 {
                                    break;
                                }
                                if looks == IDLE_LOOKS {
                                    // The wait with the PE's timeout (and its report), on one.
                                    let c = pending.trailing_zeros();
                                    sh.signal_wait_until_from(done_of(c), Cmp::Eq, seq, s);
                                    ready = 1 << c;
                                    break;
                                }
                            }
                        }
                        // Thread 0's acquires cover the range words and the rows for the block.
                        let ready = block_broadcast(work_words, ranks, tid, ready);
                        pending &= !ready;
                        let mut r = ready;
                        while r != 0 {
                            let c = r.trailing_zeros();
                            r &= r - 1;
                            let range = load(sync_words.add(sync::dispatch_channel_rows(ranks, s, c) as usize));
                            let (first, rows) = ((range >> 32) as u32, range as u32);
                            let mut j = first_warp;
                            while j < rows {
                                compact_row(&g, me, area, &out, lo + first + j, s, first + j);
                                j += all_warps;
                            }
                        }
                    }
                }
                s += 1;
            }
            // The send kernel's staged rows are read until its queues complete (its blocks posted
            // on queues this grid's blocks may not share: every queue).
            sh.quiet_all_block();
        }
    }
}

/// Looks over a dispatch receive's pending channels before its thread 0 waits on one of them.
const IDLE_LOOKS: u32 = 256;

/// Thread 0's `v` in every thread of the block, through the block's two scratch words of the work
/// area (a barrier before, so every thread has read the previous value, and one after). Every
/// thread calls it.
///
/// # Safety
/// `work_words` is this buffer's work area.
#[inline(always)]
unsafe fn block_broadcast(work_words: *mut u64, ranks: u32, tid: u32, v: u128) -> u128 {
    // SAFETY: the scratch words are this block's, inside the work area.
    unsafe {
        let w = work_words.add(work::block_scratch(ranks, arch::block_idx_x()) as usize);
        arch::sync_threads();
        if tid == 0 {
            w.write_volatile(v as u64);
            w.add(1).write_volatile((v >> 64) as u64);
        }
        // The barrier orders thread 0's stores before the other threads' loads (block scope).
        arch::sync_threads();
        (w.add(1).read_volatile() as u128) << 64 | w.read_volatile() as u128
    }
}

/// Where a dispatch's receive kernel writes a row (see [`ep_ht_dispatch_recv`]).
struct RecvOut {
    recv_x: *mut u8,
    recv_scales: *mut f32,
    recv_topk_idx: *mut i64,
    recv_topk_weights: *mut f32,
    recv_src: *mut i32,
}

/// Copies row `slot` from `s` (in this rank's receive area) to output row `i` with the calling
/// warp: payload, scales, the source token, and the top-k made local to this rank (`-1` and
/// weight 0 for experts elsewhere). Every lane calls it.
///
/// Nothing when `out.recv_x` is null: a dispatch whose outputs could not be made is received and
/// its rows dropped (`Buffer::ht_dispatch_discard`), so the buffer is left ready for the next.
///
/// # Safety
/// The row has arrived (its sender's signal was acquired); `i` is inside the outputs.
#[inline(always)]
unsafe fn compact_row(g: &Geometry, me: u32, area: *mut u8, out: &RecvOut, i: u32, s: u32, slot: u32) {
    // SAFETY: this function's contract.
    unsafe {
        if out.recv_x.is_null() {
            return;
        }
        let lane = arch::lane_id();
        let (xb, sb, meta) = (g.x_bytes(), g.scale_bytes(), g.ht_meta());
        let src = area.add(g.ht_dispatch_recv(s, slot) as usize) as *const u8;
        let m = src.add(meta as usize) as *const i32;
        // The scales and the metadata (lane 0 the source token, lane `k` in `1..=topk` entry `k`'s
        // expert and weight; `topk` is at most 16) loaded first, so their round trips overlap the
        // payload's.
        let tail = RowTail::load(src.add(xb as usize) as *const u32, (sb / 4) as u32, lane, |_| 0, 0);
        // (A warp narrower than `topk + 1` lanes, on the CPU emulation, loads the rest below.)
        let (word, weight) = if lane <= g.topk {
            (
                *m.add(lane as usize),
                if lane > 0 { *m.add((lane + g.topk) as usize) } else { 0 },
            )
        } else {
            (0, 0)
        };
        copy_bytes(
            out.recv_x.add((i as u64 * xb) as usize),
            src,
            xb as usize,
            lane,
            arch::warp_size(),
        );
        tail.store(
            (out.recv_scales as *mut u32).add((i as u64 * (sb / 4)) as usize),
            src.add(xb as usize) as *const u32,
            (sb / 4) as u32,
            lane,
            0,
            |_| 0,
            |_, _| {},
        );
        let put = |k: u32, word: i32, weight: i32| {
            if k == 0 {
                *out.recv_src.add(i as usize) = word;
            } else {
                let e = word as i64;
                let mine = e >= 0 && (e as u32) / g.local_experts == me;
                let o = (i as u64 * g.topk as u64 + (k - 1) as u64) as usize;
                *out.recv_topk_idx.add(o) = if mine { e - (me * g.local_experts) as i64 } else { -1 };
                *out.recv_topk_weights.add(o) = if mine { f32::from_bits(weight as u32) } else { 0.0 };
            }
        };
        if lane <= g.topk {
            put(lane, word, weight);
        }
        let mut k = lane + arch::warp_size();
        while k <= g.topk {
            put(k, *m.add(k as usize), *m.add((k + g.topk) as usize));
            k += arch::warp_size();
        }
    }
}

/// Most staged rows one WRITE of the dispatch carries (a warp's first WRITEs carry 1, 2 and 4).
const STAGED_ROWS_PER_WRITE: u64 = 8;

/// Posts the staged rows `[from, to)` for `r` (behind a NIC or the proxy) as one WRITE into the
/// same slots of `r`'s receive area. Every lane calls it, after writing its part of the rows.
///
/// # Safety
/// The rows are staged in this PE's `area`; `r` is reached through a queue.
#[inline(always)]
unsafe fn post_staged(sh: &Shmem, g: &Geometry, area: *mut u8, me: u32, r: u32, from: u64, to: u64) {
    // SAFETY: this function's contract: both ranges lie in the areas (the slots are the notify's).
    unsafe {
        let ranks = sh.n_pes();
        let dst = area.add(g.ht_dispatch_recv(me, from as u32) as usize);
        let src = area.add(g.ht_stage_dispatch(ranks, r, from as u32) as usize);
        sh.put_nbi_warp(dst, src, ((to - from) * g.ht_row()) as usize, r);
    }
}

/// A cached dispatch's run of tokens `lo..hi` for `r`, from the handle's `send_slot [tokens,
/// ranks]`: the first row's slot (0 when none) and the number of rows, in every lane. Every lane
/// calls it.
///
/// # Safety
/// `send_slot` holds the run's entries (a dispatch of the same routing filled them).
#[inline(always)]
unsafe fn cached_run(send_slot: *const i32, ranks: u32, r: u32, lo: u64, hi: u64) -> (u64, u64) {
    // SAFETY: this function's contract.
    unsafe {
        let lane = arch::lane_id();
        let (mut first, mut rows, mut found) = (0u64, 0u64, false);
        let mut base = lo;
        while base < hi {
            let t = base + lane as u64;
            let v = if t < hi {
                *send_slot.add((t * ranks as u64 + r as u64) as usize)
            } else {
                -1
            };
            let mask = arch::ballot(v >= 0);
            if !found && mask != 0 {
                first = arch::shfl_idx_u32(v as u32, mask.trailing_zeros()) as u64;
                found = true;
            }
            rows += mask.count_ones() as u64;
            base += arch::warp_size() as u64;
        }
        (first, rows)
    }
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
        let (xb, sb, meta) = (g.x_bytes(), g.scale_bytes(), g.ht_meta());
        let seq = load(work_words.add(work::HT_SEQ as usize));
        // After a cached notify (`ep_ht_notify_cached`) the slots come from the handle's
        // `send_slot` (a token's slot on a rank is its place among the tokens sent there, so any
        // grid finds the same ones) and this kernel waits out the barrier: thread 0 of each block
        // for every rank's word of this call, whose acquire the block's barrier extends to its
        // writes into the peers' buffers.
        let cached = load(work_words.add(work::NOTIFY_CACHED as usize)) != 0;
        if cached {
            if arch::thread_rank_in_block() == 0 {
                let mut s = 0;
                while s < ranks {
                    sh.signal_wait_until_from(sync_words.add(sync::notify_sig(s) as usize), Cmp::Ge, seq, s);
                    s += 1;
                }
            }
            arch::sync_threads();
        }
        let mut i = 0;
        while i < ranks {
            // Each warp starts at another destination (from the rank after this one, shifted
            // by the warp), so the ranks' warps spread over the receivers' links instead of
            // every warp of every rank sending to rank 0 first.
            let r = (me + 1 + sub + i) % ranks;
            let peer = peer_ptr::<NIC, u8>(&sh, area, r);
            let direct = !NIC || !peer.is_null();
            // This warp's first slot and (behind a NIC or the proxy, so its last row is known) its
            // row count for `r`.
            let (first, rows_for_r) = if cached {
                let (first, rows) = cached_run(send_slot, ranks, r, lo, hi);
                if NIC && !direct && lane == 0 {
                    // For the block's range word below.
                    store(work_words.add(work::warp_count(ranks, sub, r) as usize), rows);
                    store(work_words.add(work::warp_first(ranks, sub, r) as usize), first);
                }
                (first, rows)
            } else {
                // The channel's offset plus the runs of the warps before it, from the notify.
                let mut before = 0u64;
                let mut j = lane;
                while j < wi {
                    before +=
                        arch::load_relaxed_sys_u64(work_words.add(work::warp_count(ranks, c * warps + j, r) as usize));
                    j += arch::warp_size();
                }
                let first = load(work_words.add(work::channel_offset(ranks, c, r) as usize)) + warp_sum(before);
                let rows = if NIC && !direct {
                    arch::load_relaxed_sys_u64(work_words.add(work::warp_count(ranks, c * warps + wi, r) as usize))
                } else {
                    0
                };
                (first, rows)
            };
            let mut slot = first;
            // Behind a NIC or the proxy: the staged rows from `posted` on are not posted yet, and
            // the next WRITE goes once `chunk` of them are staged (1, 2, 4, then 8 rows): the
            // link starts after the first row instead of after the warp's whole run (which took
            // 53 us of a 4,096-token dispatch on 2x H200, the link idle meanwhile).
            let (mut posted, mut chunk) = (first, 1u64);
            let mut base = lo;
            while base < hi {
                let t = base + lane as u64;
                let sent = t < hi && *in_rank.add((t * ranks as u64 + r as u64) as usize) != 0;
                let mask = arch::ballot(sent);
                if t < hi && !cached {
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
                    // The scales and the metadata words first, into registers: their loads then
                    // overlap the payload's instead of following its stores.
                    let word = |i: u32| {
                        if i == 0 {
                            tt as i32
                        } else if i <= g.topk {
                            *topk_idx.add((tt * g.topk as u64 + (i - 1) as u64) as usize) as i32
                        } else {
                            (*topk_weights.add((tt * g.topk as u64 + (i - 1 - g.topk) as u64) as usize)).to_bits()
                                as i32
                        }
                    };
                    let scales = (x_scales as *const u32).add((tt * (sb / 4)) as usize);
                    let md = dst.add(meta as usize) as *mut i32;
                    if NIC {
                        // In order (the registers a row's tail would hold in flight spill this
                        // variant, which carries the NIC and proxy routes).
                        copy_bytes(dst, x.add((tt * xb) as usize), xb as usize, lane, arch::warp_size());
                        if sb != 0 {
                            copy_bytes(
                                dst.add(xb as usize),
                                scales as *const u8,
                                sb as usize,
                                lane,
                                arch::warp_size(),
                            );
                        }
                        let mut i = lane;
                        while i < 1 + 2 * g.topk {
                            *md.add(i as usize) = word(i);
                            i += arch::warp_size();
                        }
                    } else {
                        let tail = RowTail::load(scales, (sb / 4) as u32, lane, word, 1 + 2 * g.topk);
                        copy_bytes(dst, x.add((tt * xb) as usize), xb as usize, lane, arch::warp_size());
                        tail.store(
                            dst.add(xb as usize) as *mut u32,
                            scales,
                            (sb / 4) as u32,
                            lane,
                            1 + 2 * g.topk,
                            word,
                            |i, v| *md.add(i as usize) = v,
                        );
                    }
                    slot += 1;
                    // The warp's last row posts what is left (one call site: the post is large,
                    // and a second inlined copy spilled the kernel's registers).
                    if NIC && !direct && (slot - posted == chunk || slot - first == rows_for_r) {
                        post_staged(&sh, &g, area, me, r, posted, slot);
                        (posted, chunk) = (
                            slot,
                            if chunk < STAGED_ROWS_PER_WRITE {
                                2 * chunk
                            } else {
                                chunk
                            },
                        );
                    }
                }
                base += arch::warp_size() as u64;
            }
            let n = slot - first;
            if n > 0 {
                let sig = sync_words.add(sync::dispatch_rows(ranks, me) as usize);
                let dst = area.add(g.ht_dispatch_recv(me, first as u32) as usize);
                // Behind a NIC or the proxy the rows alone went (above, as they were staged); the
                // block's range and call number for `r` follow every warp's rows on the block's
                // queue (below), so the queue holds a run of WRITEs the NIC takes in batches, not
                // a WRITE and an atomic per warp (a WRITE after an atomic starts a new batch).
                if !NIC {
                    signal_add_p2p_warp(&sh, sig, n, r);
                } else if direct {
                    sh.put_signal_warp(dst, dst, 0, sig, n, SignalOp::Add, r);
                }
            }
            i += 1;
        }
        if NIC {
            // Every warp's rows are posted (the barrier): one thread per destination behind a
            // NIC or the proxy tells it where the block's rows went (first slot and count, zero
            // rows too), then that they are all there (this call's number), on the queue the
            // rows went on (all of a block's posts go on its queue), so both land after them.
            // The receive kernel compacts each channel as its word arrives, under the transfer
            // of the others, and completes this block's queue at its end (the staged rows are
            // read until then).
            arch::sync_threads();
            let (tid, nt) = (arch::thread_rank_in_block(), arch::block_size());
            if c == 0 && tid == 0 {
                store(
                    work_words.add(work::DISPATCH_CHANNELS as usize),
                    arch::grid_dim_x() as u64,
                );
            }
            let mut r = tid;
            while r < ranks {
                if peer_ptr::<NIC, u8>(&sh, area, r).is_null() {
                    let (mut rows, mut first) = (0u64, 0u64);
                    if !cached {
                        first = load(work_words.add(work::channel_offset(ranks, c, r) as usize));
                    }
                    let mut j = 0;
                    while j < warps {
                        let n = arch::load_relaxed_sys_u64(
                            work_words.add(work::warp_count(ranks, c * warps + j, r) as usize),
                        );
                        if cached && rows == 0 && n != 0 {
                            // The block's rows are contiguous from its first warp with any.
                            first = load(work_words.add(work::warp_first(ranks, c * warps + j, r) as usize));
                        }
                        rows += n;
                        j += 1;
                    }
                    let range = sync_words.add(sync::dispatch_channel_rows(ranks, me, c) as usize);
                    sh.p(range, first << 32 | rows, r);
                    let done = sync_words.add(sync::dispatch_channel_done(ranks, me, c) as usize);
                    sh.signal_op(done, seq, SignalOp::Set, r);
                }
                r += nt;
            }
        }
    }
}

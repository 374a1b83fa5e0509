//! The count exchange before a high-throughput dispatch.

use crate::copy::{last_block, split, warp_inclusive_sum, warp_run};
use crate::geometry::{info, sync, work, Geometry};
use crate::peer_ptr;
use crate::{load, store};
use ibgda_abi::DeviceState;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

ibgda_device::kernel! {
    /// High-throughput notify: every warp counts the rows its run of tokens sends to each
    /// destination (its block is a channel, its warp a contiguous run of the channel's tokens);
    /// the last block's first warp turns the channel counts into slot offsets, sends each rank
    /// how many rows (and per-expert tokens) it will get, waits for every rank's message, and
    /// writes the [`geometry::info`] record to `info_out`. Nothing moves when a sender would
    /// overflow a receiver's slots, (with `topk_idx` not null) a rank's `topk_idx` names an
    /// expert outside `-1..experts`, or (with `max_recv` not 0) a rank would receive more than
    /// `max_recv` rows: every rank's status then says so.
    pub fn ep_ht_notify(state: *const DeviceState, g0: u64, g1: u64, in_rank: *const u8, tokens_per_expert: *const u32, topk_idx: *const i64, tokens: u32, max_recv: u32, sync_words: *mut u64, work_words: *mut u64, info_out: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { notify::<true>(state, g0, g1, in_rank, tokens_per_expert, topk_idx, tokens, max_recv, sync_words, work_words, info_out) }
    }

    /// [`ep_ht_notify`] when every peer is reached by NVLink loads and stores (see
    /// [`ep_ht_dispatch_p2p`]).
    pub fn ep_ht_notify_p2p(state: *const DeviceState, g0: u64, g1: u64, in_rank: *const u8, tokens_per_expert: *const u32, topk_idx: *const i64, tokens: u32, max_recv: u32, sync_words: *mut u64, work_words: *mut u64, info_out: *mut i32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe { notify::<false>(state, g0, g1, in_rank, tokens_per_expert, topk_idx, tokens, max_recv, sync_words, work_words, info_out) }
    }

    /// High-throughput notify of a cached dispatch (its handle's routing, counts and slots are
    /// known from the dispatch that made it): one warp numbers the call, adds the handle's rows
    /// per source to the expected-row counters, and tells every rank it has entered the call
    /// (its kernels before this one are done with the buffer). No counts move and nothing waits
    /// here: the dispatch send kernel that follows takes each token's slots from the handle's
    /// `send_slot` and waits for every rank's word before it writes into any (DeepEP's cached
    /// dispatch keeps only the barrier too). Launched with one warp.
    pub fn ep_ht_notify_cached(state: *const DeviceState, info_in: *const i32, sync_words: *mut u64, work_words: *mut u64) {
        // SAFETY: the launch contract (`kernel!`), as above.
        unsafe { notify_cached::<true>(state, info_in, sync_words, work_words) }
    }

    /// [`ep_ht_notify_cached`] when every peer is reached by NVLink loads and stores.
    pub fn ep_ht_notify_cached_p2p(state: *const DeviceState, info_in: *const i32, sync_words: *mut u64, work_words: *mut u64) {
        // SAFETY: the launch contract (`kernel!`), as above.
        unsafe { notify_cached::<false>(state, info_in, sync_words, work_words) }
    }
}

/// The body of [`ep_ht_notify_cached`] (`NIC`: every route) and [`ep_ht_notify_cached_p2p`].
///
/// # Safety
/// The kernels' launch contract, one warp; `info_in` is the handle's record, whose status is 0;
/// without `NIC`, every peer's sync words are load/store reachable.
#[inline(always)]
unsafe fn notify_cached<const NIC: bool>(
    state: *const DeviceState,
    info_in: *const i32,
    sync_words: *mut u64,
    work_words: *mut u64,
) {
    // SAFETY: this function's `# Safety` contract, which the kernels uphold.
    unsafe {
        let sh = Shmem::attach(state);
        let ranks = sh.n_pes();
        let w = |i: u64| work_words.add(i as usize);
        let lane = arch::lane_id();
        if arch::thread_rank_in_block() >= arch::warp_size() || arch::block_idx_x() != 0 {
            return;
        }
        let seq = load(w(work::HT_SEQ)) + 1;
        // The handle's rows from each source, before any lane's signal can let a sender in.
        let mut s = lane;
        while s < ranks {
            let e = w(work::dispatch_expected(s));
            store(e, load(e) + *info_in.add(info::recv_count(s)) as u64);
            s += arch::warp_size();
        }
        arch::sync_warp();
        if lane == 0 {
            store(w(work::HT_SEQ), seq);
            store(w(work::NOTIFY_CACHED), 1);
        }
        // The work words above are this rank's own (the send kernel after this one on the stream
        // reads them); the signal's release orders this rank's earlier kernels' reads of its
        // buffer before any sender's writes.
        arch::fence_acq_rel_sys();
        let sig = sync_words.add(sync::notify_sig(sh.my_pe()) as usize);
        let mut r = lane;
        while r < ranks {
            if NIC {
                sh.signal_op(sig, seq, SignalOp::Set, r);
            } else {
                arch::store_release_sys_u64(peer_ptr::<false, _>(&sh, sig, r), seq);
            }
            r += arch::warp_size();
        }
    }
}

/// The body of [`ep_ht_notify`] (`NIC`: every route) and [`ep_ht_notify_p2p`] (NVLink only).
///
/// # Safety
/// The kernels' launch contract; without `NIC`, every peer's area is load/store reachable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn notify<const NIC: bool>(
    state: *const DeviceState,
    g0: u64,
    g1: u64,
    in_rank: *const u8,
    tokens_per_expert: *const u32,
    topk_idx: *const i64,
    tokens: u32,
    max_recv: u32,
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
        if !topk_idx.is_null() && g.topk > 0 {
            // The warp's run of top-k entries, in order: the first out of range is the run's
            // least bad token, and the blocks keep the least of theirs.
            let (end, experts) = (hi * g.topk as u64, (g.local_experts * ranks) as i64);
            let mut e = lo * g.topk as u64;
            while e < end {
                let i = e + lane as u64;
                let v = if i < end { *topk_idx.add(i as usize) } else { 0 };
                let bad = arch::ballot(i < end && (v < -1 || v >= experts));
                if bad != 0 {
                    if lane == 0 {
                        let token = (e + bad.trailing_zeros() as u64) / g.topk as u64;
                        arch::red_max_relaxed_sys_u64(w(work::NOTIFY_BAD_TOKEN), work::BAD_TOKEN_KEY - token);
                    }
                    break;
                }
                e += arch::warp_size() as u64;
            }
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
            store(w(work::NOTIFY_CACHED), 0);
        }
        let parity = (seq & 1) as u32;
        // This rank's first token with an expert out of range, plus one (0: none), for every rank.
        // Lane 0 reads and resets it; the warp takes its value.
        let mut bad_key = 0;
        if lane == 0 {
            bad_key = load(w(work::NOTIFY_BAD_TOKEN));
            if bad_key != 0 {
                store(w(work::NOTIFY_BAD_TOKEN), 0);
            }
        }
        let bad_key = arch::shfl_idx_u64(bad_key, 0);
        let bad_token = if bad_key == 0 {
            0
        } else {
            work::BAD_TOKEN_KEY - bad_key + 1
        };
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
        let len = (2 + g.local_experts + ranks) as usize;
        let stage = |r: u32| w(work::notify_stage(ranks, r));
        let dst = sync_words.add(sync::notify_data(ranks, parity, me) as usize);
        let sig = sync_words.add(sync::notify_sig(me) as usize);
        // Word 1 of every message: the overflow (low half) and the bad token plus one (high half).
        let mut r = lane;
        while r < ranks {
            arch::store_relaxed_sys_u64(stage(r).add(1), overflow as u64 | bad_token << 32);
            r += arch::warp_size();
        }
        arch::sync_warp();
        if NIC {
            // One lane per destination posts its message and the signal behind it.
            let mut r = lane;
            while r < ranks {
                sh.put_signal(dst, stage(r), len, sig, seq, SignalOp::Set, r);
                r += arch::warp_size();
            }
        } else {
            // Each message stored by the whole warp, a word a lane: one lane copying a message
            // word by word waits out a load before each store (about 50 us for 132 words).
            let mut r = 0;
            while r < ranks {
                let (to, from) = (peer_ptr::<false, _>(&sh, dst, r), stage(r));
                let mut k = lane as usize;
                while k < len {
                    arch::store_relaxed_sys_u64(to.add(k), arch::load_relaxed_sys_u64(from.add(k)));
                    k += arch::warp_size() as usize;
                }
                r += 1;
            }
            // Every lane's words before any signal that says they are there: each lane's fence,
            // the warp's barrier, then the signals (release).
            arch::fence_acq_rel_sys();
            arch::sync_warp();
            let mut r = lane;
            while r < ranks {
                arch::store_release_sys_u64(peer_ptr::<false, _>(&sh, sig, r), seq);
                r += arch::warp_size();
            }
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
        let le_count = g.local_experts;
        let mut le = lane;
        while le < le_count {
            let mut n = 0u64;
            let mut s = 0;
            while s < ranks {
                n += arch::load_relaxed_sys_u64(msg(s).add(2 + le as usize));
                s += 1;
            }
            *info_out.add(info::expert_count(ranks, le)) = n as i32;
            le += arch::warp_size();
        }
        // The matrix of rows every rank sends every rank, a pair a lane.
        let mut i = lane;
        while i < ranks * ranks {
            let (s, j) = (i / ranks, i % ranks);
            let sent = arch::load_relaxed_sys_u64(msg(s).add((2 + le_count + j) as usize));
            *info_out.add(info::sent(ranks, le_count, s, j)) = sent as i32;
            i += arch::warp_size();
        }
        // Each source's rows and word 1, a source a lane (32 at a time): the first overflow and
        // the first bad input by source rank, the same on every rank, and the receive offsets.
        let mut status = overflow as i32;
        let (mut bad_src, mut bad_at) = (-1i32, 0u64);
        let mut total = 0u64;
        let mut base = 0;
        while base < ranks {
            let s = base + lane;
            let (n, word) = if s < ranks {
                (
                    arch::load_relaxed_sys_u64(msg(s)),
                    arch::load_relaxed_sys_u64(msg(s).add(1)),
                )
            } else {
                (0, 0)
            };
            let incl = warp_inclusive_sum(n);
            if s < ranks {
                *info_out.add(info::recv_count(s)) = n as i32;
                *info_out.add(info::recv_offset(ranks, s)) = (total + incl - n) as i32;
            }
            total += arch::shfl_idx_u64(incl, arch::warp_size() - 1);
            let over = arch::ballot(s < ranks && word as u32 != 0);
            if status == 0 && over != 0 {
                status = arch::shfl_idx_u64(word, over.trailing_zeros()) as u32 as i32;
            }
            let bad = arch::ballot(s < ranks && word >> 32 != 0);
            if bad_src < 0 && bad != 0 {
                let first = bad.trailing_zeros();
                (bad_src, bad_at) = ((base + first) as i32, (arch::shfl_idx_u64(word, first) >> 32) - 1);
            }
            base += arch::warp_size();
        }
        if status == 0 && max_recv != 0 {
            // Every rank has the whole matrix, so every rank finds the same first rank that
            // would receive too many rows (a destination a lane).
            let mut base = 0;
            while base < ranks {
                let d = base + lane;
                let mut rows = 0u64;
                if d < ranks {
                    let mut s = 0;
                    while s < ranks {
                        rows += arch::load_relaxed_sys_u64(msg(s).add((2 + le_count + d) as usize));
                        s += 1;
                    }
                }
                let over = arch::ballot(d < ranks && rows > max_recv as u64);
                if over != 0 {
                    status = (1 + ranks + base + over.trailing_zeros()) as i32;
                    break;
                }
                base += arch::warp_size();
            }
        }
        if bad_src >= 0 {
            status = -(1 + bad_src);
        }
        if lane == 0 {
            *info_out.add(info::recv_offset(ranks, ranks)) = total as i32;
            *info_out.add(info::max_recv(ranks, le_count)) = max_recv as i32;
            *info_out.add(info::status(ranks, le_count)) = status;
            *info_out.add(info::bad_token(ranks, le_count)) = bad_at as i32;
        }
        if status == 0 {
            let mut s = lane;
            while s < ranks {
                let e = w(work::dispatch_expected(s));
                store(e, load(e) + *info_out.add(info::recv_count(s)) as u64);
                s += arch::warp_size();
            }
        }
        arch::fence_sc_sys();
    }
}

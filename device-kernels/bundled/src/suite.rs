//! The GPU test suite's kernels: every scope of put and get, atomics, barriers, signals, keyed
//! queues, bulk puts, random traffic, and faults that must be reported and write nothing.

use crate::{fault, scope};
use ibgda_abi::{Cmp, DeviceState, SignalOp};
use ibgda_device::ibgda::Rdma;
use ibgda_device::{arch, Shmem};

/// (unit index, unit count, rank in unit) for a scope, over a 1-D grid.
#[inline(always)]
fn units(scope_kind: u32) -> (u64, u64) {
    match scope_kind {
        scope::THREAD => (arch::global_thread_id(), arch::global_thread_count()),
        scope::WARP => {
            let warps_per_block = (arch::block_size() / arch::warp_size()).max(1) as u64;
            let w = arch::block_idx_x() as u64 * warps_per_block
                + (arch::thread_rank_in_block() / arch::warp_size()) as u64;
            (w, arch::grid_dim_x() as u64 * warps_per_block)
        }
        _ => (arch::block_idx_x() as u64, arch::grid_dim_x() as u64),
    }
}

/// The element thread `t` writes in `ibgda_test_p_lanes` for `pattern` (see there).
pub fn p_lane_slot(t: u32, pattern: u32) -> u32 {
    match pattern {
        1 => t / 32 * 32 + 31 - t % 32,
        2 => t + t / 5,
        _ => t,
    }
}

/// The value thread `t` writes in round `round` of `ibgda_test_p_lanes` (its low bytes for a
/// narrower element): distinct for every thread of a 256-thread launch in every width.
pub fn p_lane_value(t: u32, round: u32) -> u64 {
    let v = (t * 7 + round * 13 + 1) as u64 & 0xff;
    v | v << 8 | (t as u64) << 16 | (round as u64) << 40 | 0x5a << 56
}

/// Splits `bytes` into `n` chunks at uneven byte boundaries (chunk `i` of `n`), so copies of every
/// alignment are exercised.
#[inline(always)]
fn chunk(bytes: u64, i: u64, n: u64) -> (u64, u64) {
    let start = bytes * i / n;
    let end = bytes * (i + 1) / n;
    (start, end - start)
}

ibgda_device::kernel! {
    /// Test: `src` (local, `bytes` long) is put to symmetric `dst` on `peer`, split into uneven
    /// chunks, one per unit of `scope` (thread, warp or block); `nbi` picks the non-blocking form.
    /// Ends with `quiet`.
    pub fn ibgda_test_put(state: *const DeviceState, scope_kind: u32, nbi: u32, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let (u, n) = units(scope_kind);
            let (off, len) = chunk(bytes, u, n);
            let (d, s, l) = (dst.add(off as usize), src.add(off as usize), len as usize);
            match (scope_kind, nbi != 0) {
                (scope::THREAD, false) => sh.put(d, s, l, peer),
                (scope::THREAD, true) => sh.put_nbi(d, s, l, peer),
                (scope::WARP, false) => sh.put_warp(d, s, l, peer),
                (scope::WARP, true) => sh.put_nbi_warp(d, s, l, peer),
                (_, false) => sh.put_block(d, s, l, peer),
                (_, true) => sh.put_nbi_block(d, s, l, peer),
            }
            sh.quiet();
        }
    }

    /// Test: strided RMA. Thread 0 of block 0 of every PE runs `iput` (`get` 0) or `iget` (1) of
    /// `count` `u64`s (`wide` 1) or `u32`s (0) with PE `pe`: `iput(dst, src, dst_stride,
    /// src_stride, count, pe)` then `quiet`, or `iget(dst, src, ...)` with `src` on `pe`.
    pub fn ibgda_test_strided(state: *const DeviceState, get: u32, wide: u32, dst: *mut u8, src: *const u8, dst_stride: u64, src_stride: u64, count: u64, pe: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and
        // `dst`, `src` buffers that hold the strided arrays the arguments name.
        unsafe {
            if arch::block_idx_x() != 0 || arch::thread_rank_in_block() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let (ds, ss, n) = (dst_stride as usize, src_stride as usize, count as usize);
            match (get, wide) {
                (0, 1) => sh.iput(dst as *mut u64, src as *const u64, ds, ss, n, pe),
                (0, _) => sh.iput(dst as *mut u32, src as *const u32, ds, ss, n, pe),
                (_, 1) => sh.iget(dst as *mut u64, src as *const u64, ds, ss, n, pe),
                _ => sh.iget(dst as *mut u32, src as *const u32, ds, ss, n, pe),
            }
            sh.quiet();
        }
    }

    /// Test: `atomic_fetch_inc` and `atomic_inc`. Every thread of every block adds 1 to `word[0]`
    /// on PE `pe` with `atomic_fetch_inc`, storing what it fetched in `out[global thread]`, and 1
    /// to `word[1]` with `atomic_inc`, then completes them.
    pub fn ibgda_test_inc(state: *const DeviceState, word: *mut u64, out: *mut u64, pe: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state, `word`
        // two symmetric words, `out` a word per thread of the grid.
        unsafe {
            let sh = Shmem::attach(state);
            let t = arch::global_thread_id() as usize;
            *out.add(t) = sh.atomic_fetch_inc(word, pe);
            sh.atomic_inc(word.add(1), pe);
            sh.quiet();
        }
    }

    /// Test: symmetric `src` on `peer` is fetched into local `dst`, split as in `ibgda_test_put`.
    pub fn ibgda_test_get(state: *const DeviceState, scope_kind: u32, nbi: u32, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let (u, n) = units(scope_kind);
            let (off, len) = chunk(bytes, u, n);
            let (d, s, l) = (dst.add(off as usize), src.add(off as usize), len as usize);
            match (scope_kind, nbi != 0) {
                (scope::THREAD, false) => sh.get(d, s, l, peer),
                (scope::THREAD, true) => sh.get_nbi(d, s, l, peer),
                (scope::WARP, false) => sh.get_warp(d, s, l, peer),
                (scope::WARP, true) => sh.get_nbi_warp(d, s, l, peer),
                (_, false) => sh.get_block(d, s, l, peer),
                (_, true) => sh.get_nbi_block(d, s, l, peer),
            }
            sh.quiet();
        }
    }

    /// Test: every thread does `iters` rounds of atomics on `peer`'s symmetric `words`:
    /// `words[0] += 1` (u64 fetch_add; the first round's return value is written to
    /// `tickets[thread]`), `words[1]` low half `+= 1` (u32 add), `words[2] += 1` by a
    /// compare-swap loop, `words[3] -= 1` (i64 add), and `words[4]` swapped with the thread id
    /// (the returned values are XOR-ed into `words[5]` on `peer` with a CAS loop, so the host can
    /// check that every id went in and came out exactly once). Also `p`/`g` of `words[6 + thread]`.
    pub fn ibgda_test_atomics(state: *const DeviceState, words: *mut u64, tickets: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let tid = arch::global_thread_id();
            for i in 0..iters {
                let t = sh.atomic_fetch_add(words, 1u64, peer);
                if i == 0 {
                    tickets.add(tid as usize).write_volatile(t);
                }
                sh.atomic_add(words.add(1) as *mut u32, 1u32, peer);
                let mut seen = sh.atomic_fetch(words.add(2), peer);
                loop {
                    let prev = sh.atomic_compare_swap(words.add(2), seen, seen + 1, peer);
                    if prev == seen {
                        break;
                    }
                    seen = prev;
                }
                sh.atomic_add(words.add(3) as *mut i64, -1i64, peer);
            }
            let old = sh.atomic_swap(words.add(4), tid + 1, peer);
            let mut acc = sh.atomic_fetch(words.add(5), peer);
            loop {
                let prev = sh.atomic_compare_swap(words.add(5), acc, acc ^ old, peer);
                if prev == acc {
                    break;
                }
                acc = prev;
            }
            let slot = words.add(6 + tid as usize);
            sh.p(slot, tid * 3 + 1, peer);
            sh.quiet();
            let back: u64 = sh.g(slot, peer);
            if back != tid * 3 + 1 {
                sh.atomic_add(words.add(3) as *mut i64, 1_000_000i64, peer);
            }
        }
    }

    /// Test: the bitwise atomics from every thread (at most 64 in the grid) to `peer`'s `words`:
    /// thread `t` fetch-ors bit `t` into word 0, fetch-ands it out of word 1, fetch-xors
    /// [`xor_pattern`]`(t)` into word 2 and records the three old values at `olds[3 t..]`; then ors
    /// bit `t % 32` into the `u32` at word 3, ands it out of the `u32` at word 4 and xors the low
    /// half of the pattern into the `i32` at word 5 without fetching, and completes them.
    pub fn ibgda_test_bitwise(state: *const DeviceState, words: *mut u64, olds: *mut u64, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state, `words`
        // six symmetric words and `olds` three words a thread, alive until the kernel ends.
        unsafe {
            let sh = Shmem::attach(state);
            let t = arch::global_thread_id();
            let bit = 1u64 << (t % 64);
            let o = olds.add(3 * t as usize);
            o.write_volatile(sh.atomic_fetch_or(words, bit, peer));
            o.add(1).write_volatile(sh.atomic_fetch_and(words.add(1), !bit, peer));
            o.add(2).write_volatile(sh.atomic_fetch_xor(words.add(2), crate::xor_pattern(t), peer));
            sh.atomic_or(words.add(3) as *mut u32, 1 << (t % 32), peer);
            sh.atomic_and(words.add(4) as *mut u32, !(1 << (t % 32)), peer);
            sh.atomic_xor(words.add(5) as *mut i32, crate::xor_pattern(t) as i32, peer);
            sh.quiet();
        }
    }

    /// Test: `p`s of `size`-byte values (1, 2, 4 or 8) from every thread to symmetric `dst` on
    /// `peer`, `rounds` times, the lanes of each warp together. Thread `t` writes value
    /// [`p_lane_value`]`(t, round)` to element [`p_lane_slot`]`(t, pattern)`: pattern 0 consecutive
    /// elements, 1 descending within each warp, 2 a gap after every fifth lane, 3 consecutive
    /// elements through two keyed queues (even and odd lanes on different QPs). Ends with `quiet`.
    pub fn ibgda_test_p_lanes(state: *const DeviceState, dst: *mut u8, size: u32, pattern: u32, rounds: u32, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let t = arch::global_thread_id() as u32;
            let base = Shmem::attach(state);
            let sh = if pattern == 3 { base.keyed(t % 2) } else { base };
            let slot = p_lane_slot(t, pattern) as usize;
            for round in 0..rounds {
                let v = p_lane_value(t, round);
                arch::sync_warp();
                match size {
                    1 => sh.p(dst.add(slot), v as u8, peer),
                    2 => sh.p((dst as *mut u16).add(slot), v as u16, peer),
                    4 => sh.p((dst as *mut u32).add(slot), v as u32, peer),
                    _ => sh.p((dst as *mut u64).add(slot), v, peer),
                }
            }
            base.quiet();
            sh.quiet();
        }
    }

    /// Test: `rounds` barriers; before each, this PE `p`s the round number into slot `my_pe` of
    /// symmetric `slots` on every PE; after it, all `n_pes` local slots must hold that round.
    /// Mismatches are counted into local `errors[0]`. One thread per PE.
    pub fn ibgda_test_barrier(state: *const DeviceState, slots: *mut u64, errors: *mut u64, rounds: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            for r in 1..=rounds as u64 {
                for pe in 0..sh.n_pes() {
                    sh.p(slots.add(sh.my_pe() as usize), r, pe);
                }
                sh.barrier_all();
                for pe in 0..sh.n_pes() {
                    if slots.add(pe as usize).read_volatile() != r {
                        errors.write_volatile(errors.read_volatile() + 1);
                    }
                }
                sh.barrier_all();
            }
        }
    }

    /// Test: the device-API call `op` (an [`ibgda_abi::Op`] as `u32`) with a bad argument, so that
    /// it reports a device error naming it: `pe = n_pes` for a call that takes a PE (a broadcast's
    /// root), an address past the end of the heap for the local-word calls (`signal_fetch`,
    /// `signal_wait_until`, `wait_until`, `test` and the multi-word waits) and for an all-to-all's,
    /// fcollect's or reduction's `dst`. `word` is a symmetric, aligned `u64`. Calls that cannot be given a bad
    /// argument (`quiet`, `fence`, the barriers, `Shmem::attach`) do nothing.
    pub fn ibgda_test_op_fault(state: *const DeviceState, op: u32, word: *mut u64) {
        use ibgda_abi::Op;
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let bad = sh.n_pes();
            let past = sh.heap_base().add(sh.heap_size() as usize) as *mut u64;
            let (src, dst) = (word as *const u64, word);
            // A well-formed handle whose slot holds no team (the runtime made none).
            let freed_team = || ibgda_abi::Team::strided(ibgda_abi::MAX_TEAMS as u32 - 1, 0, 1, 1).unwrap_or(sh.team_world());
            match Op::from_u32(op) {
                Some(Op::Put) => sh.put(dst, src, 1, bad),
                Some(Op::PutNbi) => sh.put_nbi(dst, src, 1, bad),
                Some(Op::PutWarp) => sh.put_warp(dst, src, 1, bad),
                Some(Op::PutNbiWarp) => sh.put_nbi_warp(dst, src, 1, bad),
                Some(Op::PutBlock) => sh.put_block(dst, src, 1, bad),
                Some(Op::PutNbiBlock) => sh.put_nbi_block(dst, src, 1, bad),
                Some(Op::Get) => sh.get(dst, src, 1, bad),
                Some(Op::GetNbi) => sh.get_nbi(dst, src, 1, bad),
                Some(Op::GetWarp) => sh.get_warp(dst, src, 1, bad),
                Some(Op::GetNbiWarp) => sh.get_nbi_warp(dst, src, 1, bad),
                Some(Op::GetBlock) => sh.get_block(dst, src, 1, bad),
                Some(Op::GetNbiBlock) => sh.get_nbi_block(dst, src, 1, bad),
                Some(Op::PutSignal) => sh.put_signal(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutSignalNbi) => sh.put_signal_nbi(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutSignalWarp) => sh.put_signal_warp(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutSignalNbiWarp) => sh.put_signal_nbi_warp(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutSignalBlock) => sh.put_signal_block(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutSignalNbiBlock) => sh.put_signal_nbi_block(dst, src, 1, word, 1, SignalOp::Add, bad),
                Some(Op::PutBulk) => sh.put_bulk(dst, src, 1, bad),
                Some(Op::P) => sh.p(dst, 1u64, bad),
                Some(Op::G) => {
                    sh.g(src, bad);
                }
                Some(Op::AtomicFetchAdd) => {
                    sh.atomic_fetch_add(dst, 1u64, bad);
                }
                Some(Op::AtomicAdd) => sh.atomic_add(dst, 1u64, bad),
                Some(Op::AtomicCompareSwap) => {
                    sh.atomic_compare_swap(dst, 0u64, 1, bad);
                }
                Some(Op::AtomicSwap) => {
                    sh.atomic_swap(dst, 1u64, bad);
                }
                Some(Op::AtomicFetch) => {
                    sh.atomic_fetch(src, bad);
                }
                Some(Op::AtomicSet) => sh.atomic_set(dst, 1u64, bad),
                Some(Op::SignalOp) => sh.signal_op(word, 1, SignalOp::Set, bad),
                Some(Op::SignalFetch) => {
                    sh.signal_fetch(past);
                }
                Some(Op::SignalWaitUntil) => {
                    sh.signal_wait_until(past, Cmp::Eq, 0);
                }
                Some(Op::WaitUntil) => {
                    sh.wait_until(past as *const u64, Cmp::Eq, 0);
                }
                Some(Op::Ptr) => {
                    sh.ptr(src, bad);
                }
                Some(Op::IbgdaQp) => {
                    sh.ibgda_qp(bad);
                }
                Some(Op::AlltoallBlock) => sh.alltoall_block(past, src, 1),
                Some(Op::BroadcastBlock) => sh.broadcast_block(dst, src, 1, bad),
                Some(Op::FcollectBlock) => sh.fcollect_block(past, src, 1),
                Some(Op::SumReduceBlock) => sh.sum_reduce_block(past, src, 1),
                Some(Op::ProdReduceBlock) => sh.prod_reduce_block(past, src, 1),
                Some(Op::MinReduceBlock) => sh.min_reduce_block(past, src, 1),
                Some(Op::MaxReduceBlock) => sh.max_reduce_block(past, src, 1),
                Some(Op::AndReduceBlock) => sh.and_reduce_block(past, src, 1),
                Some(Op::OrReduceBlock) => sh.or_reduce_block(past, src, 1),
                Some(Op::XorReduceBlock) => sh.xor_reduce_block(past, src, 1),
                Some(Op::Test) => {
                    sh.test(past as *const u64, Cmp::Eq, 0);
                }
                Some(Op::AtomicFetchAnd) => {
                    sh.atomic_fetch_and(dst, 1u64, bad);
                }
                Some(Op::AtomicAnd) => sh.atomic_and(dst, 1u64, bad),
                Some(Op::AtomicFetchOr) => {
                    sh.atomic_fetch_or(dst, 1u64, bad);
                }
                Some(Op::AtomicOr) => sh.atomic_or(dst, 1u64, bad),
                Some(Op::AtomicFetchXor) => {
                    sh.atomic_fetch_xor(dst, 1u64, bad);
                }
                Some(Op::AtomicXor) => sh.atomic_xor(dst, 1u64, bad),
                Some(Op::WaitUntilAll) => sh.wait_until_all(past as *const u64, 1, core::ptr::null(), Cmp::Eq, 0),
                Some(Op::WaitUntilAny) => {
                    sh.wait_until_any(past as *const u64, 1, core::ptr::null(), Cmp::Eq, 0);
                }
                Some(Op::TestAll) => {
                    sh.test_all(past as *const u64, 1, core::ptr::null(), Cmp::Eq, 0);
                }
                Some(Op::TestAny) => {
                    sh.test_any(past as *const u64, 1, core::ptr::null(), Cmp::Eq, 0);
                }
                Some(Op::TeamSync) => sh.team_sync(freed_team()),
                Some(Op::TeamSyncBlock) => sh.team_sync_block(freed_team()),
                Some(Op::TeamBarrier) => sh.team_barrier(freed_team()),
                Some(Op::TeamBarrierBlock) => sh.team_barrier_block(freed_team()),
                Some(Op::TeamAlltoallBlock) => sh.team_alltoall_block(sh.team_world(), past, src, 1),
                Some(Op::TeamBroadcastBlock) => sh.team_broadcast_block(sh.team_world(), dst, src, 1, bad),
                Some(Op::TeamFcollectBlock) => sh.team_fcollect_block(sh.team_world(), past, src, 1),
                Some(Op::TeamSumReduceBlock) => sh.team_sum_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamProdReduceBlock) => sh.team_prod_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamMinReduceBlock) => sh.team_min_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamMaxReduceBlock) => sh.team_max_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamAndReduceBlock) => sh.team_and_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamOrReduceBlock) => sh.team_or_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamXorReduceBlock) => sh.team_xor_reduce_block(sh.team_world(), past, src, 1),
                Some(Op::TeamWorldPe) => {
                    sh.team_world_pe(sh.team_world(), bad);
                }
                Some(Op::Iput) => sh.iput(past, src, 1, 1, 1, 0),
                Some(Op::Iget) => sh.iget(dst, past, 1, 1, 1, 0),
                Some(Op::AtomicFetchInc) => {
                    sh.atomic_fetch_inc(dst, bad);
                }
                Some(Op::AtomicInc) => sh.atomic_inc(dst, bad),
                Some(Op::WaitUntilAllVector) => sh.wait_until_all_vector(past as *const u64, 1, core::ptr::null(), Cmp::Eq, src),
                Some(Op::WaitUntilAnyVector) => {
                    sh.wait_until_any_vector(past as *const u64, 1, core::ptr::null(), Cmp::Eq, src);
                }
                Some(Op::WaitUntilSomeVector) => {
                    let mut at = [0usize; 1];
                    sh.wait_until_some_vector(past as *const u64, 1, at.as_mut_ptr(), core::ptr::null(), Cmp::Eq, src);
                }
                Some(Op::TestAllVector) => {
                    sh.test_all_vector(past as *const u64, 1, core::ptr::null(), Cmp::Eq, src);
                }
                Some(Op::TestAnyVector) => {
                    sh.test_any_vector(past as *const u64, 1, core::ptr::null(), Cmp::Eq, src);
                }
                Some(Op::TestSomeVector) => {
                    let mut at = [0usize; 1];
                    sh.test_some_vector(past as *const u64, 1, at.as_mut_ptr(), core::ptr::null(), Cmp::Eq, src);
                }
                Some(Op::TestSome) => {
                    let mut at = [0usize; 1];
                    sh.test_some(past as *const u64, 1, at.as_mut_ptr(), core::ptr::null(), Cmp::Eq, 0);
                }
                Some(Op::WaitUntilSome) => {
                    let mut at = [0usize; 1];
                    sh.wait_until_some(past as *const u64, 1, at.as_mut_ptr(), core::ptr::null(), Cmp::Eq, 0);
                }
                _ => {}
            }
        }
    }

    /// Test: one thread's non-blocking `put_signal` of `bytes` from `src` to `dst` on PE `pe`,
    /// adding `value` to `sig` there (what a test inspects in the send queue before the NIC runs
    /// it). The other threads of the grid do nothing.
    pub fn ibgda_test_put_signal_nbi_one(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, sig: *mut u64, value: u64, pe: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            if arch::block_idx_x() == 0 && arch::thread_rank_in_block() == 0 {
                Shmem::attach(state).put_signal_nbi(dst, src, bytes as usize, sig, value, SignalOp::Add, pe);
            }
        }
    }

    /// Test: a ring of block-scope `put_signal`s. Each block puts its share of `src` to `dst` on
    /// PE `my_pe + 1` and adds 1 to `sig` there; then waits until its own `sig` reaches the number
    /// of blocks (every block of PE `my_pe - 1` delivered), and gets PE `my_pe - 1`'s `src` share
    /// into local `fetched`.
    pub fn ibgda_test_put_signal(state: *const DeviceState, dst: *mut u8, src: *const u8, fetched: *mut u8, bytes: u64, sig: *mut u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let n = sh.n_pes();
            let next = (sh.my_pe() + 1) % n;
            let prev = (sh.my_pe() + n - 1) % n;
            let (off, len) = chunk(bytes, arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
            sh.put_signal_block(dst.add(off as usize), src.add(off as usize), len as usize, sig, 1, SignalOp::Add, next);
            if arch::thread_rank_in_block() == 0 {
                sh.signal_wait_until(sig, Cmp::Ge, arch::grid_dim_x() as u64);
            }
            arch::sync_threads();
            sh.get_block(fetched.add(off as usize), src.add(off as usize), len as usize, prev);
        }
    }

    /// Test: an MoE dispatch's pattern on one [`Shmem::keyed`] queue. Every block puts its share
    /// of `src` to symmetric `dst` on PE `my_pe + 1` in `piece`-byte non-blocking puts through
    /// `keyed(key)` and never waits for them; the last block to take a ticket (`tickets`, zero
    /// before the launch) adds 1 to `sig` there through the same key, with no `quiet` between,
    /// then completes every queue (`quiet_all_block`). That block then waits for its own `sig`
    /// and copies `dst` into `seen` the moment the signal is seen: with the signal ordered after
    /// every block's rows, `seen` holds all of PE `my_pe - 1`'s `src`.
    pub fn ibgda_test_keyed_rows_then_signal(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, piece: u64, key: u32, seen: *mut u8, sig: *mut u64, tickets: *mut u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let next = (sh.my_pe() + 1) % sh.n_pes();
            let on_key = sh.keyed(key);
            let (off, len) = chunk(bytes, arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
            let mut done = 0;
            while done < len {
                let n = piece.min(len - done);
                let at = (off + done) as usize;
                on_key.put_nbi_block(dst.add(at), src.add(at), n as usize, next);
                done += n;
            }
            arch::sync_threads();
            let last = arch::sync_threads_or(
                arch::thread_rank_in_block() == 0
                    && arch::atomic_add_acq_rel_sys_u64(tickets, 1) + 1 == arch::grid_dim_x() as u64,
            );
            if last {
                if arch::thread_rank_in_block() == 0 {
                    on_key.signal_op(sig, 1, SignalOp::Add, next);
                }
                sh.quiet_all_block();
                if arch::thread_rank_in_block() == 0 {
                    sh.signal_wait_until(sig, Cmp::Ge, 1);
                    let mut i = 0;
                    while i < bytes as usize {
                        seen.add(i).write_volatile(dst.add(i).read_volatile());
                        i += 1;
                    }
                }
            }
        }
    }

    /// Test: which QP to `peer` each block's handle uses, plain and `keyed(key)`: block `b` writes
    /// the two QP numbers to `qpns[2b]` and `qpns[2b + 1]` (IBGDA peers only).
    pub fn ibgda_test_keyed_qpn(state: *const DeviceState, qpns: *mut u32, key: u32, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            if arch::thread_rank_in_block() == 0 {
                let b = arch::block_idx_x() as usize;
                *qpns.add(2 * b) = sh.ibgda_qp(peer).qpn();
                *qpns.add(2 * b + 1) = sh.keyed(key).ibgda_qp(peer).qpn();
            }
        }
    }

    /// Test: thread 0 of each block puts the block's chunk of `src` (uneven boundaries, so every
    /// alignment of head and tail occurs) to symmetric `dst` on PE `my_pe + 1` with `put_bulk`,
    /// while the block's other threads do nothing; then `quiet`.
    pub fn ibgda_test_put_bulk(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let next = (sh.my_pe() + 1) % sh.n_pes();
            if arch::thread_rank_in_block() == 0 {
                let (off, len) = chunk(bytes, arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
                sh.put_bulk(dst.add(off as usize), src.add(off as usize), len as usize, next);
                sh.quiet();
            }
        }
    }

    /// Test: performs one invalid operation (a [`fault`] mode) against `addr` on `peer`; the kernel
    /// must stop with an attributed error, and nothing may be written.
    pub fn ibgda_test_fault(state: *const DeviceState, mode: u32, addr: *mut u8, peer: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let src = addr as *const u8;
            match mode {
                fault::INVALID_PE => sh.put(addr, src, 8, sh.n_pes()),
                fault::OUTSIDE_HEAP => sh.put(addr, src, 64, peer),
                fault::MISALIGNED_ATOMIC => {
                    sh.atomic_fetch_add(addr.add(4) as *mut u64, 1u64, peer);
                }
                fault::SIGNAL_TIMEOUT => {
                    sh.signal_wait_until(addr as *const u64, Cmp::Eq, u64::MAX);
                }
                fault::WAIT_UNTIL_TIMEOUT => {
                    sh.wait_until(addr as *const i64, Cmp::Lt, -5i64);
                }
                fault::BELOW_HEAP => {
                    let v: u64 = sh.g(addr as *const u64, peer);
                    (addr as *mut u64).write_volatile(v);
                }
                fault::WRONG_RKEY => {
                    let qp = sh.ibgda_qp(peer);
                    let raddr = qp.remote_addr(addr as u64 - sh.heap_base() as u64);
                    qp.post_rdma(Rdma::Write, addr as u64, qp.heap_lkey(), raddr, qp.heap_rkey() ^ 0x5a00, 8, true);
                    qp.quiet();
                }
                fault::NIC_OUTSIDE_REGION => {
                    let qp = sh.ibgda_qp(peer);
                    let raddr = qp.remote_addr(sh.heap_size() - 32);
                    qp.post_rdma(Rdma::Write, addr as u64, qp.heap_lkey(), raddr, qp.heap_rkey(), 64, true);
                    qp.quiet();
                }
                fault::PUT_QUIET => {
                    sh.put(addr, src, 8, peer);
                    sh.quiet();
                }
                _ => {}
            }
        }
    }

    /// Test: random one-sided traffic from every thread to `peer`. Thread `t` runs the `per_thread`
    /// operations `ops[t * per_thread ..]`, each four `u64`s: `[kind | len << 8, a, b, c]` where
    /// kind 0 = `put_nbi` of `len` bytes from `src + a` to `dst + b`, 1 = `get_nbi` of `len` bytes
    /// from `src + a` on `peer` to `got + b`, 2 = `atomic_add` of `c` to `counters[b]` on `peer`,
    /// 3 = `atomic_fetch_add` of `c` to `counters[b]`, the previous value stored at `fetched[a]`.
    /// Ends with `quiet`.
    pub fn ibgda_test_random_ops(
        state: *const DeviceState,
        ops: *const u64,
        per_thread: u32,
        src: *mut u8,
        dst: *mut u8,
        got: *mut u8,
        counters: *mut u64,
        fetched: *mut u64,
        peer: u32,
    ) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let t = arch::global_thread_id();
            for i in 0..per_thread as u64 {
                let op = ops.add(((t * per_thread as u64 + i) * 4) as usize);
                let (w0, a, b, c) = (*op, *op.add(1), *op.add(2), *op.add(3));
                let len = (w0 >> 8) as usize;
                match w0 & 0xff {
                    0 => sh.put_nbi(dst.add(b as usize), src.add(a as usize), len, peer),
                    1 => sh.get_nbi(got.add(b as usize), src.add(a as usize), len, peer),
                    2 => sh.atomic_add(counters.add(b as usize), c, peer),
                    _ => {
                        let old = sh.atomic_fetch_add(counters.add(b as usize), c, peer);
                        fetched.add(a as usize).write_volatile(old);
                    }
                }
            }
            sh.quiet();
        }
    }
}

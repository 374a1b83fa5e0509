//! The kernels ibgda ships: its GPU test suite and its benchmarks. Each builds as a PTX entry and,
//! through [`ibgda_device::kernel!`], as a host function the CPU emulation runs.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]

use ibgda_abi::{Cmp, DeviceState, SignalOp};
use ibgda_device::ibgda::Rdma;
use ibgda_device::{arch, Shmem};

/// Values of the `scope` argument of the test kernels.
pub mod scope {
    /// Each thread is one unit.
    pub const THREAD: u32 = 0;
    /// Each warp is one unit.
    pub const WARP: u32 = 1;
    /// Each block is one unit.
    pub const BLOCK: u32 = 2;
}

/// Values of the `mode` argument of [`ibgda_test_fault`].
pub mod fault {
    /// `put` to PE `n_pes`.
    pub const INVALID_PE: u32 = 1;
    /// `put` of 64 bytes starting 8 bytes before the end of the heap.
    pub const OUTSIDE_HEAP: u32 = 2;
    /// `atomic_fetch_add::<u64>` at `addr + 4`.
    pub const MISALIGNED_ATOMIC: u32 = 3;
    /// `signal_wait_until(addr, Eq, u64::MAX)`, which never holds.
    pub const SIGNAL_TIMEOUT: u32 = 4;
    /// `g` from an address below the heap.
    pub const BELOW_HEAP: u32 = 5;
    /// IBGDA: an RDMA WRITE of 8 bytes to `addr` on `peer` with a corrupted rkey, then quiet.
    pub const WRONG_RKEY: u32 = 6;
    /// IBGDA: an RDMA WRITE of 64 bytes ending past the peer's registered heap (the device
    /// API's own bounds check is bypassed through the raw QP handle), then quiet.
    pub const NIC_OUTSIDE_REGION: u32 = 7;
    /// `put` of 8 bytes to `addr` on `peer`, then `quiet` (with the NIC paused by the host:
    /// the quiet must time out).
    pub const PUT_QUIET: u32 = 8;
    /// `wait_until::<i64>(addr, Lt, -5)` on a word holding a positive value: never holds when the
    /// comparison is signed (and at once if it were unsigned).
    pub const WAIT_UNTIL_TIMEOUT: u32 = 9;
}

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

/// The copy-strategy diagnosis kernels' body (`VARIANT` 0: SM copy x4, 1: x8, 2: bulk copy, 3:
/// x4 routed per call).
///
/// # Safety
/// As the kernels: `state` a live device state, `dst` symmetric, `src` local, `bytes` in both.
#[inline(always)]
unsafe fn diag_copy_bw<const VARIANT: u32>(
    state: *const DeviceState,
    dst: *mut u8,
    src: *const u8,
    bytes: u64,
    peer: u32,
    iters: u32,
) {
    let sh = Shmem::attach(state);
    let remote = sh.ptr(dst, peer);
    if remote.is_null() {
        return;
    }
    let per_block = bytes / arch::grid_dim_x() as u64;
    let off = (per_block * arch::block_idx_x() as u64) as usize;
    let (d, s, n) = (remote.add(off), src.add(off), per_block as usize);
    let (rank, size) = (arch::thread_rank_in_block(), arch::block_size());
    for _ in 0..iters {
        match VARIANT {
            0 => ibgda_device::copy_cooperative_unrolled::<4>(d, s, n, rank, size),
            3 => {
                let r = sh.ptr(dst.add(off), peer);
                ibgda_device::copy_cooperative_unrolled::<4>(r, s, n, rank, size)
            }
            1 => ibgda_device::copy_cooperative_unrolled::<8>(d, s, n, rank, size),
            _ => {
                // One thread drives the bulk-copy unit; the block waits for it.
                arch::sync_threads();
                #[cfg(target_arch = "nvptx64")]
                if rank == 0 && ibgda_device::copy_bulk(d, s, n, sh.timeout_ns()).is_err() {
                    arch::trap();
                }
                #[cfg(not(target_arch = "nvptx64"))]
                ibgda_device::copy_cooperative(d, s, n, rank, size);
                arch::sync_threads();
            }
        }
    }
    sh.quiet();
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
    /// Bandwidth: `iters` rounds of one block-scope `put_nbi` per block (the block's share of
    /// `bytes`) from `src` to symmetric `dst` on `peer`, then `quiet`.
    pub fn ibgda_put_bw_block(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let per_block = bytes / arch::grid_dim_x() as u64;
            let off = per_block * arch::block_idx_x() as u64;
            for _ in 0..iters {
                sh.put_nbi_block(dst.add(off as usize), src.add(off as usize), per_block as usize, peer);
            }
            sh.quiet();
        }
    }

    /// Message rate: every thread `p`s one `u64` per iteration to `dst[thread]` on `peer`.
    pub fn ibgda_p_rate(state: *const DeviceState, dst: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let t = dst.add(arch::global_thread_id() as usize);
            for i in 0..iters {
                sh.p(t, i as u64, peer);
            }
            sh.quiet();
        }
    }

    /// Latency: PE 0 `p`s `i` to `flag` on `peer` and waits for it back; the other PE echoes.
    /// One thread per PE.
    pub fn ibgda_pingpong(state: *const DeviceState, flag: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            for i in 1..=iters as u64 {
                if sh.my_pe() == 0 {
                    sh.signal_op(flag, i, SignalOp::Set, peer);
                    sh.signal_wait_until(flag, Cmp::Eq, i);
                } else {
                    sh.signal_wait_until(flag, Cmp::Eq, i);
                    sh.signal_op(flag, i, SignalOp::Set, peer);
                }
            }
        }
    }

    /// Latency in NVSHMEM's form (`long_p` + `long_wait_until`): PE 0 `p`s `i` to `flag` on `peer`
    /// and waits until its own `flag` holds `i`; the other PE echoes. One thread per PE.
    pub fn ibgda_p_pingpong(state: *const DeviceState, flag: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            for i in 1..=iters as u64 {
                if sh.my_pe() == 0 {
                    sh.p(flag, i, peer);
                    sh.wait_until(flag as *const u64, Cmp::Eq, i);
                } else {
                    sh.wait_until(flag as *const u64, Cmp::Eq, i);
                    sh.p(flag, i, peer);
                }
            }
        }
    }

    /// Diagnosis of the latency of one operation over the QP to `peer`, by one thread of PE 0 (the
    /// other PEs return at once), `iters` times. `mode` 0: `p` then `quiet`; 1: `put_signal_nbi` of
    /// 8 bytes then `quiet`; 2: a blocking `atomic_fetch_add`; 4: an 8-byte inline WRITE posted on
    /// the QP handle (no routing) then the QP's `quiet`; 3: the memory primitives the post
    /// and the engine are made of. Writes to `out` (16 words): [0] the SM clock's cycles per
    /// 1,000 ns; modes 0, 1, 2 and 4: [1] the post's cycles and [2] the wait's (`quiet`, or the fetch's
    /// return), summed; [3] `%globaltimer` when each post started, [4] when it returned and [5]
    /// when its wait ended, summed (against the engine's sums of when it learned each doorbell and
    /// finished its pass, they split the latency); mode 3: [6..16] mean cycles of dependent
    /// acquire loads, read-modify-writes and fences at GPU and system scope on a word of this
    /// GPU's heap, a clock read and `nanosleep(32)`.
    pub fn diag_latency_breakdown(
        state: *const DeviceState,
        mode: u32,
        buf: *mut u64,
        sig: *mut u64,
        out: *mut u64,
        peer: u32,
        iters: u32,
    ) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            if sh.my_pe() != 0 || arch::global_thread_id() != 0 {
                return;
            }
            let n = iters.max(1) as u64;
            let (g0, c0) = (arch::global_timer_ns(), arch::clock64());
            let (mut post, mut wait, mut started, mut posted, mut waited) = (0u64, 0u64, 0u64, 0u64, 0u64);
            if mode != 3 {
                let qp = sh.ibgda_qp(peer);
                let raddr = qp.remote_addr(buf as u64 - sh.heap_base() as u64);
                for i in 1..=n {
                    buf.write_volatile(i);
                    let (a, ta) = (arch::clock64(), arch::global_timer_ns());
                    let mut b = a;
                    let mut tb = ta;
                    if mode == 0 {
                        sh.p(buf, i, peer);
                        (b, tb) = (arch::clock64(), arch::global_timer_ns());
                        sh.quiet();
                    } else if mode == 1 {
                        sh.put_signal_nbi(buf, buf, 1, sig, i, SignalOp::Set, peer);
                        (b, tb) = (arch::clock64(), arch::global_timer_ns());
                        sh.quiet();
                    } else if mode == 4 {
                        qp.post_inline_write(raddr, qp.heap_rkey(), &i.to_le_bytes(), false);
                        (b, tb) = (arch::clock64(), arch::global_timer_ns());
                        qp.quiet();
                    } else {
                        sh.atomic_fetch_add(sig, 1u64, peer);
                    }
                    let (c, tc) = (arch::clock64(), arch::global_timer_ns());
                    post += b - a;
                    wait += c - b;
                    started += ta;
                    posted += tb;
                    waited += tc;
                }
                out.add(1).write_volatile(post);
                out.add(2).write_volatile(wait);
                out.add(3).write_volatile(started);
                out.add(4).write_volatile(posted);
                out.add(5).write_volatile(waited);
            } else {
                macro_rules! mean_cycles {
                    ($e:expr) => {{
                        let a = arch::clock64();
                        for _ in 0..n {
                            $e;
                        }
                        (arch::clock64() - a) / n
                    }};
                }
                // On this PE's own `sig` word (GPU memory). Each access's address depends on the
                // previous result (`x >> 63` is 0, which the compiler cannot know), so the means
                // are latencies, not issue rates. Written as they are measured (an array would
                // live in local memory).
                let w = sig;
                let mut x = 0u64;
                out.add(6).write_volatile(mean_cycles!(x = arch::load_acquire_gpu_u64(w.add((x >> 63) as usize))));
                out.add(7).write_volatile(mean_cycles!(x = arch::load_acquire_sys_u64(w.add((x >> 63) as usize))));
                out.add(8).write_volatile(mean_cycles!(
                    x = arch::atomic_add_relaxed_gpu_u64(w.add((x >> 63) as usize), 1)
                ));
                out.add(9).write_volatile(mean_cycles!(
                    x = arch::atomic_add_acq_rel_sys_u64(w.add((x >> 63) as usize), 1)
                ));
                out.add(10).write_volatile(mean_cycles!(
                    x = arch::atomic_cas_acq_rel_gpu_u64(w.add((x >> 63) as usize), x, x + 1)
                ));
                out.add(11).write_volatile(mean_cycles!(arch::fence_sc_gpu()));
                out.add(12).write_volatile(mean_cycles!(arch::fence_sc_sys()));
                out.add(13).write_volatile(mean_cycles!(arch::fence_acq_rel_sys()));
                out.add(14).write_volatile(mean_cycles!(arch::global_timer_ns()));
                out.add(15).write_volatile(mean_cycles!(arch::nanosleep(32)) + (x >> 63));
            }
            let (g1, c1) = (arch::global_timer_ns(), arch::clock64());
            out.add(0).write_volatile((c1 - c0) * 1000 / (g1 - g0).max(1));
        }
    }

    /// Diagnosis of the bandwidth kernel: [`ibgda_put_bw_block`]'s shape with SM copies of 4 loads
    /// in flight per thread, applied to the P2P address of `dst` on `peer` without the device
    /// API's routing. Then `quiet`.
    pub fn diag_copy_bw_sm4(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            diag_copy_bw::<0>(state, dst, src, bytes, peer, iters)
        }
    }

    /// [`diag_copy_bw_sm4`] looking the peer up (`Shmem::ptr`: PE check, bounds check, peer
    /// table) before every copy, as every put does: the cost of the per-call routing alone.
    pub fn diag_copy_bw_sm4_routed(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            diag_copy_bw::<3>(state, dst, src, bytes, peer, iters)
        }
    }

    /// [`diag_copy_bw_sm4`] with 8 loads in flight per thread.
    pub fn diag_copy_bw_sm8(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            diag_copy_bw::<1>(state, dst, src, bytes, peer, iters)
        }
    }

    /// [`diag_copy_bw_sm4`] with thread 0 of each block driving the bulk-copy unit (GPU only).
    pub fn diag_copy_bw_bulk(state: *const DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            diag_copy_bw::<2>(state, dst, src, bytes, peer, iters)
        }
    }

    /// Bandwidth over message sizes: block `b` moves `iters` messages of `bytes` bytes with
    /// block-scope `put_nbi` (`get` = 0) or `get_nbi` (`get` = 1); message `i = b * iters + k` sits
    /// at offset `(i * bytes) % window` of both buffers (`window` a multiple of `bytes`). Then
    /// `quiet`. Put: local `src` to symmetric `dst` on `peer`; get: symmetric `src` on `peer` to
    /// local `dst`.
    pub fn bench_messages(state: *const DeviceState, get: u32, dst: *mut u8, src: *const u8, bytes: u64, window: u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            for k in 0..iters as u64 {
                let i = arch::block_idx_x() as u64 * iters as u64 + k;
                let off = ((i * bytes) % window) as usize;
                if get == 0 {
                    sh.put_nbi_block(dst.add(off), src.add(off), bytes as usize, peer);
                } else {
                    sh.get_nbi_block(dst.add(off), src.add(off), bytes as usize, peer);
                }
            }
            arch::sync_threads();
            if arch::thread_rank_in_block() == 0 {
                sh.quiet();
            }
            arch::sync_threads();
        }
    }

    /// Atomic rate: every thread does `iters` `atomic_fetch_add(1)` on its own word
    /// `counters[thread]` of `peer` (each waits for its result, as fetching atomics do).
    pub fn bench_fetch_add(state: *const DeviceState, counters: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let t = counters.add(arch::global_thread_id() as usize);
            for _ in 0..iters {
                sh.atomic_fetch_add(t, 1u64, peer);
            }
        }
    }

    /// Latency: PE 0 `put_signal`s 8 bytes of `buf` with signal `i` to `peer` and waits for the
    /// same back; the other PE echoes. One thread per PE.
    pub fn bench_put_signal_pingpong(state: *const DeviceState, buf: *mut u64, sig: *mut u64, peer: u32, iters: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            for i in 1..=iters as u64 {
                if sh.my_pe() == 0 {
                    buf.write_volatile(i);
                    sh.put_signal_nbi(buf, buf, 1, sig, i, SignalOp::Set, peer);
                    sh.signal_wait_until(sig, Cmp::Eq, i);
                } else {
                    sh.signal_wait_until(sig, Cmp::Eq, i);
                    sh.put_signal_nbi(buf, buf, 1, sig, i, SignalOp::Set, peer);
                }
            }
            sh.quiet();
        }
    }

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
    /// it reports a device error naming it: `pe = n_pes` for a call that takes a PE, an address
    /// past the end of the heap for the local-word calls (`signal_fetch`, `signal_wait_until`,
    /// `wait_until`). `word` is a symmetric, aligned `u64`. Calls that cannot be given a bad
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
                _ => {}
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

    /// Engine capacity: each thread posts `per_thread` RDMA WRITEs (`read == 0`: from `src` to
    /// `dst + (t % 64) * bytes` on `peer`) or RDMA READs (`read != 0`: from `src` on `peer` to its
    /// own `dst + (t % 64) * bytes`) of `bytes` through its block's QP, ringing only at batch
    /// boundaries and never waiting for completions (run it with fewer WQEs than the send queue
    /// holds, against a paused NIC, then unpause and time the drain).
    pub fn ibgda_post_rdma_burst(
        state: *const DeviceState,
        dst: *mut u8,
        src: *const u8,
        bytes: u32,
        per_thread: u32,
        peer: u32,
        read: u32,
    ) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let qp = sh.ibgda_qp(peer);
            let base = sh.heap_base() as u64;
            let slot = (arch::global_thread_id() % 64) * bytes as u64;
            let (op, laddr, raddr) = if read != 0 {
                (Rdma::Read, dst as u64 + slot, qp.remote_addr(src as u64 - base))
            } else {
                (Rdma::Write, src as u64, qp.remote_addr(dst as u64 - base + slot))
            };
            for _ in 0..per_thread {
                qp.post_rdma(op, laddr, qp.heap_lkey(), raddr, qp.heap_rkey(), bytes, false);
            }
            arch::sync_threads();
            if arch::thread_rank_in_block() == 0 {
                qp.flush();
            }
        }
    }

}

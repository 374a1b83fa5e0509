//! Diagnosis: where one operation's latency goes, and which copy strategy a put should use.

use ibgda_abi::{DeviceState, SignalOp};
use ibgda_device::{arch, Shmem};

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

ibgda_device::kernel! {
    /// Diagnosis of the latency of one operation over the QP to `peer`, by one thread of PE 0 (the
    /// other PEs return at once), `iters` times. `mode` 0: `p` then `quiet`; 1: `put_signal_nbi` of
    /// 8 bytes then `quiet`; 2: a blocking `atomic_fetch_add`; 4: an 8-byte inline WRITE posted on
    /// the QP handle (no routing) then the QP's `quiet`; 3: the memory primitives the post
    /// and the engine are made of. Writes to `out` (20 words): [0] the SM clock's cycles per
    /// 1,000 ns; modes 0, 1, 2 and 4: [1] the post's cycles and [2] the wait's (`quiet`, or the fetch's
    /// return), summed; [3] `%globaltimer` when each post started, [4] when it returned and [5]
    /// when its wait ended, summed (against the engine's sums of when it learned each doorbell and
    /// finished its pass, they split the latency); mode 3: [6..16] mean cycles of dependent
    /// acquire loads, read-modify-writes and fences at GPU and system scope on a word of this
    /// GPU's heap, a clock read and `nanosleep(32)`; [16..19] a relaxed system-scope add, and the
    /// rate model's port booking (a `red.max` then an add on one word) at system and at GPU
    /// scope; [19] the global timer's smallest step in ns.
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
                out.add(16).write_volatile(mean_cycles!(
                    x = arch::atomic_add_relaxed_sys_u64(w.add((x >> 63) as usize), 1)
                ));
                out.add(17).write_volatile(mean_cycles!({
                    arch::red_max_relaxed_sys_u64(w.add((x >> 63) as usize), 5);
                    x = arch::atomic_add_relaxed_sys_u64(w.add((x >> 63) as usize), 1)
                }));
                out.add(18).write_volatile(mean_cycles!({
                    arch::red_max_relaxed_gpu_u64(w.add((x >> 63) as usize), 5);
                    x = arch::atomic_add_relaxed_gpu_u64(w.add((x >> 63) as usize), 1)
                }));
                // The global timer's smallest step (ns; the model's clock), over its next 64 steps
                // (or a million reads, whichever ends first).
                let (mut step, mut seen, mut reads) = (u64::MAX, 0, 0);
                let mut last = arch::global_timer_ns();
                while seen < 64 && reads < 1 << 20 {
                    let t = arch::global_timer_ns();
                    if t != last {
                        step = step.min(t - last);
                        last = t;
                        seen += 1;
                    }
                    reads += 1;
                }
                out.add(19).write_volatile(step + (x >> 63));
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
}

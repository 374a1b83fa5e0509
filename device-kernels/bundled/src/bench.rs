//! Benchmarks: bandwidth, message and atomic rates, ping-pong latency, and the emulated NIC's
//! capacity (WQEs posted to a paused NIC, then drained).

use ibgda_abi::{Cmp, DeviceState, SignalOp};
use ibgda_device::ibgda::Rdma;
use ibgda_device::{arch, Shmem};

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

    /// Message rate: every thread `p`s one `u64` per iteration to `dst[thread * stride]` on
    /// `peer`. With `stride` 1 a warp writes consecutive words, which IBGDA combines three to a
    /// WQE (as NVSHMEM combines a warp's `p`s); with 2 or more every `p` is a WQE of its own.
    pub fn ibgda_p_rate(state: *const DeviceState, dst: *mut u64, peer: u32, iters: u32, stride: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends and
        // used by this kernel only as its documentation says.
        unsafe {
            let sh = Shmem::attach(state);
            let t = dst.add(arch::global_thread_id() as usize * stride as usize);
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

//! A kernel crate as a user writes one: `#![no_std]`, the device API from `ibgda-device`, and
//! kernels declared with `ibgda_device::kernel!` so they build to PTX (for the GPU) and to plain
//! functions (for the CPU emulation). Built to PTX by `ibgda-nvptx-builder` from the examples'
//! `build.rs`.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]

use ibgda_abi::DeviceState;
use ibgda_device::{arch, Cmp, Shmem, SignalOp};

ibgda_device::kernel! {
    /// Every PE sends `bytes` of `send` to `recv` on the next PE (each block a share, one
    /// block-scope `put_signal` adding 1 to `arrived` there), waits until all blocks of the previous
    /// PE have signalled round `round`, then gets the previous PE's `send` into `fetched`.
    pub fn ring_put(state: *const DeviceState, send: *const u8, recv: *mut u8, fetched: *mut u8, bytes: u64, arrived: *mut u64, round: u64) {
        // SAFETY: `state` is this PE's live device state (the launch contract).
        let sh = unsafe { Shmem::attach(state) };
        let n = sh.n_pes();
        let next = (sh.my_pe() + 1) % n;
        let prev = (sh.my_pe() + n - 1) % n;
        let blocks = arch::grid_dim_x() as u64;
        let b = arch::block_idx_x() as u64;
        let (start, end) = ((bytes * b / blocks) as usize, (bytes * (b + 1) / blocks) as usize);
        let len = end - start;
        // SAFETY: `send` holds `bytes` readable bytes on this PE (the launch contract), so this
        // block's share is readable until the blocking put returns. `recv` and `arrived` are
        // symmetric: the device API checks them.
        unsafe {
            sh.put_signal_block(recv.wrapping_add(start), send.wrapping_add(start), len, arrived, 1, SignalOp::Add, next)
        };
        if arch::thread_rank_in_block() == 0 {
            sh.signal_wait_until(arrived, Cmp::Ge, round * blocks);
        }
        arch::sync_threads();
        // SAFETY: `fetched` holds `bytes` writable bytes on this PE and only this block writes its
        // share; the blocking get is complete when it returns.
        unsafe { sh.get_block(fetched.wrapping_add(start), send.wrapping_add(start), len, prev) };
    }
}

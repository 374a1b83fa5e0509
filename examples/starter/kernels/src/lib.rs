//! The starter's kernels: `#![no_std]`, the device API from `ibgda-device`, each kernel declared
//! with `ibgda_device::kernel!` so it builds to PTX for the GPU and to a plain function for the
//! CPU emulation. The builder needs the feature gate below on nvptx; `DeviceState` (from
//! `ibgda-abi`) is the PE's state every kernel takes first.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]

use ibgda_abi::DeviceState;
use ibgda_device::{arch, Shmem};

ibgda_device::kernel! {
    /// Thread 0 of every block adds 1 to `counter` on PE 0; thread 0 of block 0 stores this PE's
    /// rank + 1 into `inbox[my_pe]` on every PE. Then `quiet`: all of it has landed.
    pub fn hello(state: *const DeviceState, counter: *mut u64, inbox: *mut u64) {
        // SAFETY: `state` is this PE's live device state (the launch contract).
        let sh = unsafe { Shmem::attach(state) };
        let me = sh.my_pe();
        if arch::thread_rank_in_block() == 0 {
            sh.atomic_fetch_add(counter, 1u64, 0);
        }
        if arch::global_thread_id() == 0 {
            for pe in 0..sh.n_pes() {
                // `inbox` is symmetric: the device API checks the address and the PE.
                sh.p(inbox.wrapping_add(me as usize), me as u64 + 1, pe);
            }
        }
        sh.quiet();
    }
}

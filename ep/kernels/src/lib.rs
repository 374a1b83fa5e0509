//! `ibgda-ep-kernels`: MoE expert-parallel dispatch and combine, written on the ibgda device API.
//!
//! Every byte to another rank goes through [`ibgda_device::Shmem`]: a same-node peer's buffer is written with
//! plain stores through [`ibgda_device::Shmem::ptr`] (NVLink), a peer behind a NIC gets its rows staged in
//! this rank's heap and sent with `put_signal` (IBGDA or the proxy). Which one is decided per
//! peer by the runtime, as for every other kernel.
//!
//! Two families, with DeepEP V1's semantics:
//! - high-throughput (`ep_ht_*`): [`ep_layout()`] counts tokens per rank and expert; `notify`
//!   exchanges the counts (the host reads them to size the outputs); `dispatch` writes each token
//!   once per destination rank into a slot of that rank's receive area; `dispatch_recv` compacts
//!   the rows into `[num_recv_tokens, hidden]`; `combine` sends each row back to its source slot;
//!   `combine_reduce` sums every rank's row into the token's original position.
//! - low-latency (`ep_ll_*`): no host synchronisation; per-expert padded receive layout
//!   `[local_experts, ranks * max_tokens, hidden]`; sequence numbers live in device memory, so a
//!   call can be captured in a CUDA graph and replayed.
//!
//! Every wait is bounded by the runtime's timeout and names the rank it waited for.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]
#![warn(missing_docs)]

mod copy;
pub mod geometry;
mod ht;
mod layout;
mod ll;
pub mod numeric;

pub use ht::*;
pub use layout::*;
pub use ll::*;

use geometry::NOTIFY_WORDS;
use ibgda_device::{arch, Shmem};

/// Loads a word another block or rank may have written (acquire, system scope).
#[inline(always)]
unsafe fn load(p: *const u64) -> u64 {
    arch::load_acquire_sys_u64(p)
}

/// Stores a word another block or rank will read (release, system scope).
#[inline(always)]
unsafe fn store(p: *mut u64, v: u64) {
    arch::store_release_sys_u64(p, v)
}

/// `pe`'s copy of symmetric `p`: load/store reachable, or (`NIC`) null for a peer behind a NIC.
/// Without `NIC` every peer must be reachable: one that is not stops the kernel.
///
/// # Safety
/// `p` is in this PE's symmetric heap.
#[inline(always)]
pub(crate) unsafe fn peer_ptr<const NIC: bool, T>(sh: &Shmem, p: *mut T, pe: u32) -> *mut T {
    let q = sh.ptr(p, pe);
    if !NIC && q.is_null() {
        arch::trap();
    }
    q
}

/// Whether global expert `e` is valid for `experts` experts.
#[inline(always)]
fn valid_expert(e: i64, experts: u32) -> bool {
    e >= 0 && e < experts as i64
}

/// Words of one notify message.
pub const NOTIFY_MESSAGE_WORDS: u32 = NOTIFY_WORDS;

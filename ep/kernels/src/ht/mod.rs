//! High-throughput kernels: notify (the count exchange), dispatch and its receive-side
//! compaction, combine and its reduction. Each kernel that talks to peers has an NVLink-only
//! variant (`_p2p`) without the NIC and proxy routes, which the host picks when every peer is
//! reached by loads and stores; the helpers those variants share are here.

mod combine;
mod dispatch;
mod notify;

pub use combine::*;
pub use dispatch::*;
pub use notify::*;

use ibgda_device::{arch, Shmem};

/// `pe`'s copy of symmetric `word`, for the NVLink-only kernels, whose host launches
/// them only when every peer is load/store reachable (a peer that is not stops the kernel).
///
/// # Safety
/// `word` is in this PE's symmetric heap.
#[inline(always)]
unsafe fn peer_word<T>(sh: &Shmem, word: *mut T, pe: u32) -> *mut T {
    let p = sh.ptr(word, pe);
    if p.is_null() {
        arch::trap();
    }
    p
}

/// Adds `n` to the signal word `sig` on `pe` after every store of the calling warp to `pe`
/// (what `put_signal_warp` with no data does on an NVLink route). Every lane calls it.
///
/// # Safety
/// As [`peer_word`].
#[inline(always)]
unsafe fn signal_add_p2p_warp(sh: &Shmem, sig: *mut u64, n: u64, pe: u32) {
    // SAFETY: this function's contract.
    unsafe {
        arch::sync_warp();
        if arch::lane_id() == 0 {
            // The warp's stores (ordered before this lane's by the barrier) before the signal.
            arch::fence_sc_sys();
            arch::atomic_add_release_sys_u64(peer_word(sh, sig, pe), n);
        }
    }
}

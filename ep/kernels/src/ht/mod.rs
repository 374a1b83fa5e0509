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

use crate::peer_ptr;
use ibgda_device::{arch, Shmem};

/// Adds `n` to the signal word `sig` on `pe` after every store of the calling warp to `pe`
/// (what `put_signal_warp` with no data does on an NVLink route). Every lane calls it.
///
/// # Safety
/// `sig` is in this PE's symmetric heap; `pe` is load/store reachable.
#[inline(always)]
unsafe fn signal_add_p2p_warp(sh: &Shmem, sig: *mut u64, n: u64, pe: u32) {
    // SAFETY: this function's contract.
    unsafe {
        arch::sync_warp();
        if arch::lane_id() == 0 {
            // The warp's stores (ordered before this lane's by the barrier) before the signal.
            arch::fence_sc_sys();
            arch::atomic_add_release_sys_u64(peer_ptr::<false, u64>(sh, sig, pe), n);
        }
    }
}

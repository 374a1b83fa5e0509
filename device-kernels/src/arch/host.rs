//! Host equivalents of the nvptx primitives, so the device API runs on CPU threads (CI, and the
//! CPU emulation of device code). One CPU thread stands in for one GPU block of one thread: the
//! warp and the block are both of size 1, so warp- and block-scope calls keep their meaning.
//!
//! Orderings are the ones the PTX wrappers name; "system scope" is the whole process here.
//!
//! # Safety (module-wide)
//! Functions taking a raw pointer require it to be valid and aligned for the access width, and
//! every concurrent access to that word to be atomic.

extern crate std;

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::cell::Cell;

std::thread_local! {
    static BLOCK_IDX: Cell<u32> = const { Cell::new(0) };
    static GRID_DIM: Cell<u32> = const { Cell::new(1) };
}

/// Sets the block index and grid size this CPU thread reports (used by the CPU emulation runner).
pub fn set_emulated_block(block_idx: u32, grid_dim: u32) {
    BLOCK_IDX.with(|b| b.set(block_idx));
    GRID_DIM.with(|g| g.set(grid_dim));
}

/// Always 0: one thread per emulated block.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    0
}
/// Always 0.
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    0
}
/// Always 0.
#[inline(always)]
pub fn thread_idx_z() -> u32 {
    0
}
/// Always 1.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    1
}
/// Always 1.
#[inline(always)]
pub fn block_dim_y() -> u32 {
    1
}
/// Always 1.
#[inline(always)]
pub fn block_dim_z() -> u32 {
    1
}
/// The emulated block index set by [`set_emulated_block`].
#[inline(always)]
pub fn block_idx_x() -> u32 {
    BLOCK_IDX.with(|b| b.get())
}
/// The emulated grid size set by [`set_emulated_block`].
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    GRID_DIM.with(|g| g.get())
}
/// Always 0.
#[inline(always)]
pub fn lane_id() -> u32 {
    0
}

/// One lane per emulated warp.
pub const WARP_SIZE: u32 = 1;

/// Nanoseconds since the first call in this process.
pub fn global_timer_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// A block of one thread: nothing to wait for.
#[inline(always)]
pub fn sync_threads() {}
/// A block of one thread: returns `pred`.
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    pred
}
/// The warp has one lane: bit 0 is `pred`.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    pred as u32
}
/// A warp of one lane: nothing to wait for.
#[inline(always)]
pub fn sync_warp() {}
/// The warp has one lane: always `1`.
#[inline(always)]
pub fn active_mask() -> u32 {
    1
}
/// The warp has one lane: no lane is below it.
#[inline(always)]
pub fn lanemask_lt() -> u32 {
    0
}
/// The warp has one lane: it matches itself.
#[inline(always)]
pub fn match_any_u64(_mask: u32, _v: u64) -> u32 {
    1
}
/// The warp has one lane: returns `v`.
#[inline(always)]
pub fn shfl_idx_masked_u32(_mask: u32, v: u32, _src_lane: u32) -> u32 {
    v
}
/// The warp has one lane: nothing to wait for.
#[inline(always)]
pub fn sync_lanes(_mask: u32) {}
/// The warp has one lane: returns `v`.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, _src_lane: u32) -> u32 {
    v
}
/// The warp has one lane: returns `v`.
#[inline(always)]
pub fn shfl_idx_u64(v: u64, _src_lane: u32) -> u64 {
    v
}

/// Yields the CPU: spinning CPU threads must let the thread they wait for run.
pub fn nanosleep(_ns: u32) {
    std::thread::yield_now();
}

/// `SeqCst` fence.
#[inline(always)]
pub fn fence_sc_sys() {
    fence(Ordering::SeqCst);
}
/// `AcqRel` fence.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    fence(Ordering::AcqRel);
}

/// The host twin of each nvptx wrapper: the same name, width and ordering, on `core::sync::atomic`
/// (`$atomic` the atomic type, `$method` its operation, then the orderings).
macro_rules! host_atomic {
    (load $name:ident, $ty:ty, $atomic:ident, $ord:ident) => {
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *const $ty) -> $ty {
            // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
            unsafe { $atomic::from_ptr(p as *mut $ty).load(Ordering::$ord) }
        }
    };
    (store $name:ident, $ty:ty, $atomic:ident, $ord:ident) => {
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) {
            // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
            unsafe { $atomic::from_ptr(p).store(v, Ordering::$ord) }
        }
    };
    (rmw $name:ident, $ty:ty, $atomic:ident, $method:ident, $ord:ident) => {
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) -> $ty {
            // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
            unsafe { $atomic::from_ptr(p).$method(v, Ordering::$ord) }
        }
    };
    (cas $name:ident, $ty:ty, $atomic:ident, $ok:ident, $fail:ident) => {
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, expected: $ty, new: $ty) -> $ty {
            // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
            unsafe {
                match $atomic::from_ptr(p).compare_exchange(expected, new, Ordering::$ok, Ordering::$fail) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    };
}

host_atomic!(load load_acquire_sys_u64, u64, AtomicU64, Acquire);
host_atomic!(load load_acquire_sys_u32, u32, AtomicU32, Acquire);
host_atomic!(load load_relaxed_sys_u64, u64, AtomicU64, Relaxed);
host_atomic!(load load_relaxed_sys_u32, u32, AtomicU32, Relaxed);
host_atomic!(store store_release_sys_u64, u64, AtomicU64, Release);
host_atomic!(store store_release_sys_u32, u32, AtomicU32, Release);
host_atomic!(store store_relaxed_sys_u64, u64, AtomicU64, Relaxed);
host_atomic!(store store_relaxed_sys_u32, u32, AtomicU32, Relaxed);
host_atomic!(rmw atomic_add_acq_rel_sys_u64, u64, AtomicU64, fetch_add, AcqRel);
host_atomic!(rmw atomic_add_acq_rel_sys_u32, u32, AtomicU32, fetch_add, AcqRel);
host_atomic!(rmw atomic_add_release_sys_u64, u64, AtomicU64, fetch_add, Release);
host_atomic!(rmw atomic_add_relaxed_sys_u64, u64, AtomicU64, fetch_add, Relaxed);
host_atomic!(rmw atomic_add_relaxed_sys_u32, u32, AtomicU32, fetch_add, Relaxed);
host_atomic!(rmw atomic_swap_acq_rel_sys_u64, u64, AtomicU64, swap, AcqRel);
host_atomic!(rmw atomic_swap_acq_rel_sys_u32, u32, AtomicU32, swap, AcqRel);
host_atomic!(rmw atomic_swap_relaxed_sys_u64, u64, AtomicU64, swap, Relaxed);
host_atomic!(rmw atomic_swap_relaxed_sys_u32, u32, AtomicU32, swap, Relaxed);
host_atomic!(rmw atomic_max_acq_rel_sys_u64, u64, AtomicU64, fetch_max, AcqRel);
host_atomic!(cas atomic_cas_acq_rel_sys_u64, u64, AtomicU64, AcqRel, Acquire);
host_atomic!(cas atomic_cas_acq_rel_sys_u32, u32, AtomicU32, AcqRel, Acquire);
host_atomic!(cas atomic_cas_relaxed_sys_u64, u64, AtomicU64, Relaxed, Relaxed);
host_atomic!(cas atomic_cas_relaxed_sys_u32, u32, AtomicU32, Relaxed, Relaxed);

/// # Safety
/// `p` is valid, 16-byte aligned, and not written concurrently.
#[inline(always)]
pub unsafe fn load_readonly_v2_u64(p: *const [u64; 2]) -> [u64; 2] {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { p.read() }
}
/// # Safety
/// `p` is valid and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_v4(p: *const [u32; 4]) -> [u32; 4] {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { p.read() }
}
/// # Safety
/// `p` is valid and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_v4(p: *mut [u32; 4], v: [u32; 4]) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe { p.write(v) }
}

/// Ends this emulated thread: the error record is already written; the CPU runner catches the panic
/// and reports the record.
pub fn trap() -> ! {
    panic!("ibgda device trap (see the PE's error record)")
}

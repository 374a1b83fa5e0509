//! Host equivalents of the nvptx primitives, so the device API runs on CPU threads (CI, and the
//! CPU emulation of device code). One CPU thread stands in for one GPU thread: [`run_block`] runs
//! a block's threads together, in warps whose collectives (`ballot`, `shfl`, `match_any`,
//! `activemask`, `bar.warp.sync`, `bar.sync`) are real rendezvous of those threads (see `simt.rs`).
//!
//! Orderings are the ones the PTX wrappers name; "system scope" is the whole process here.
//!
//! # Safety (module-wide)
//! Functions taking a raw pointer require it to be valid and aligned for the access width, and
//! every concurrent access to that word to be atomic.

extern crate std;

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

mod simt;
pub use simt::{
    active_mask, ballot, ballot_masked, block_dim_x, block_idx_x, grid_dim_x, lane_id, lanemask_lt, match_any_u64,
    panic_message, redux_add_u32, run_block, set_emulated_block, shfl_idx_masked_u32, shfl_idx_u32, shfl_idx_u64,
    sync_lanes, sync_threads_or, sync_warp, thread_idx_x, warp_size, COLLECTIVE_TIMEOUT, GATHER_WINDOW, MAX_WARP_SIZE,
};

/// Always 0 (launches are 1-D).
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
pub fn block_dim_y() -> u32 {
    1
}
/// Always 1.
#[inline(always)]
pub fn block_dim_z() -> u32 {
    1
}

/// The host's stand-in for `%clock64`: nanoseconds (the engine's phase counters count in it).
pub fn clock64() -> u64 {
    global_timer_ns()
}

/// Nanoseconds since 1970, as a GPU's `%globaltimer` counts (so that device code's arithmetic on
/// it meets values as large as on a GPU), advancing monotonically from the first call.
pub fn global_timer_ns() -> u64 {
    static START: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    let (at, unix) = START.get_or_init(|| {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (std::time::Instant::now(), unix)
    });
    unix + at.elapsed().as_nanos() as u64
}

/// `bar.sync 0` over the live threads of the block.
#[inline(always)]
pub fn sync_threads() {
    sync_threads_or(false);
}

/// Backs off a waiting CPU thread: the threads it waits for (another emulated GPU thread, a proxy
/// thread, the NIC engine) must get to run. A short wait yields; a thread that keeps backing off
/// (64 times, each at most a millisecond after the last) sleeps instead, since a yield frees
/// little on a busy machine (Linux's EEVDF scheduler lets a yielding spinner run again at once,
/// and on two cores a dozen of them starved a proxy thread for tens of seconds).
pub fn nanosleep(_ns: u32) {
    use std::cell::Cell;
    use std::time::{Duration, Instant};
    std::thread_local! {
        static STREAK: Cell<(Option<Instant>, u32)> = const { Cell::new((None, 0)) };
    }
    let now = Instant::now();
    let streak = STREAK.with(|s| {
        let (last, n) = s.get();
        let n = match last {
            Some(t) if now.duration_since(t) < Duration::from_millis(1) => n.saturating_add(1),
            _ => 0,
        };
        s.set((Some(now), n));
        n
    });
    if streak < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
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
/// `SeqCst` fence (one process is one scope here).
#[inline(always)]
pub fn fence_sc_gpu() {
    fence(Ordering::SeqCst);
}
/// `AcqRel` fence (one process is one scope here).
#[inline(always)]
pub fn fence_acq_rel_gpu() {
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
    (red $name:ident, $ty:ty, $atomic:ident, $method:ident, $ord:ident) => {
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) {
            // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
            unsafe {
                $atomic::from_ptr(p).$method(v, Ordering::$ord);
            }
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
host_atomic!(rmw atomic_add_acquire_sys_u64, u64, AtomicU64, fetch_add, Acquire);
host_atomic!(rmw atomic_add_relaxed_sys_u32, u32, AtomicU32, fetch_add, Relaxed);
host_atomic!(rmw atomic_swap_acq_rel_sys_u64, u64, AtomicU64, swap, AcqRel);
host_atomic!(rmw atomic_swap_acq_rel_sys_u32, u32, AtomicU32, swap, AcqRel);
host_atomic!(rmw atomic_swap_relaxed_sys_u64, u64, AtomicU64, swap, Relaxed);
host_atomic!(rmw atomic_swap_relaxed_sys_u32, u32, AtomicU32, swap, Relaxed);
host_atomic!(rmw atomic_and_relaxed_sys_u64, u64, AtomicU64, fetch_and, Relaxed);
host_atomic!(rmw atomic_and_relaxed_sys_u32, u32, AtomicU32, fetch_and, Relaxed);
host_atomic!(rmw atomic_or_relaxed_sys_u64, u64, AtomicU64, fetch_or, Relaxed);
host_atomic!(rmw atomic_or_relaxed_sys_u32, u32, AtomicU32, fetch_or, Relaxed);
host_atomic!(rmw atomic_xor_relaxed_sys_u64, u64, AtomicU64, fetch_xor, Relaxed);
host_atomic!(rmw atomic_xor_relaxed_sys_u32, u32, AtomicU32, fetch_xor, Relaxed);
host_atomic!(rmw atomic_max_acq_rel_sys_u64, u64, AtomicU64, fetch_max, AcqRel);
host_atomic!(rmw atomic_max_relaxed_sys_u64, u64, AtomicU64, fetch_max, Relaxed);
host_atomic!(red red_add_relaxed_sys_u64, u64, AtomicU64, fetch_add, Relaxed);
host_atomic!(red red_add_relaxed_sys_u32, u32, AtomicU32, fetch_add, Relaxed);
host_atomic!(red red_max_relaxed_sys_u64, u64, AtomicU64, fetch_max, Relaxed);
host_atomic!(red red_max_release_sys_u64, u64, AtomicU64, fetch_max, Release);
host_atomic!(red red_max_release_gpu_u64, u64, AtomicU64, fetch_max, Release);
host_atomic!(red red_max_relaxed_gpu_u64, u64, AtomicU64, fetch_max, Relaxed);
host_atomic!(cas atomic_cas_acq_rel_sys_u64, u64, AtomicU64, AcqRel, Acquire);
host_atomic!(cas atomic_cas_acq_rel_sys_u32, u32, AtomicU32, AcqRel, Acquire);
host_atomic!(cas atomic_cas_relaxed_sys_u64, u64, AtomicU64, Relaxed, Relaxed);
host_atomic!(cas atomic_cas_relaxed_sys_u32, u32, AtomicU32, Relaxed, Relaxed);
// GPU scope: the same operations (one process is one scope on the host).
host_atomic!(load load_acquire_gpu_u64, u64, AtomicU64, Acquire);
host_atomic!(load load_relaxed_gpu_u64, u64, AtomicU64, Relaxed);
host_atomic!(store store_release_gpu_u64, u64, AtomicU64, Release);
host_atomic!(store store_release_gpu_u32, u32, AtomicU32, Release);
host_atomic!(store store_relaxed_gpu_u64, u64, AtomicU64, Relaxed);
host_atomic!(rmw atomic_add_relaxed_gpu_u64, u64, AtomicU64, fetch_add, Relaxed);
host_atomic!(rmw atomic_max_acq_rel_gpu_u64, u64, AtomicU64, fetch_max, AcqRel);
host_atomic!(cas atomic_cas_acq_rel_gpu_u64, u64, AtomicU64, AcqRel, Acquire);
host_atomic!(cas atomic_cas_acq_rel_gpu_u32, u32, AtomicU32, AcqRel, Acquire);

/// # Safety
/// `p` is valid and 16-byte aligned; concurrent writers finished before an acquire that happens
/// before this load (as for a WQEBB below the producer index).
#[inline(always)]
pub unsafe fn load_volatile_v2_u64(p: *const [u64; 2]) -> [u64; 2] {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let w = p as *const u64;
        [w.read_volatile(), w.add(1).read_volatile()]
    }
}
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
/// As the GPU's streaming load (no cache hints on the host).
///
/// # Safety
/// `p` is valid and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_v4_stream(p: *const [u32; 4]) -> [u32; 4] {
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

/// Ends this emulated thread: the error record is already written and is the one report, so the
/// thread unwinds without the panic hook's message; the CPU runner catches it, aborts the block
/// and returns the record.
pub fn trap() -> ! {
    std::panic::resume_unwind(std::boxed::Box::new("ibgda device trap (see the PE's error record)"))
}

static MUTANTS: AtomicU32 = AtomicU32::new(0);

/// Switches the deliberate bug `m` on or off for every thread of this process. For the test
/// binary that proves the suite catches it.
///
/// # Safety
/// A mutant breaks the device code's own contracts (`WrongReservingLane` makes lanes write send
/// queue slots they did not reserve): nothing else may run device code in this process while one
/// is on, except the test that expects the failure, on memory it owns.
pub unsafe fn set_mutant(m: super::Mutant, on: bool) {
    let bit = 1u32 << (m as u32);
    if on {
        MUTANTS.fetch_or(bit, Ordering::SeqCst);
    } else {
        MUTANTS.fetch_and(!bit, Ordering::SeqCst);
    }
}

pub(super) fn mutant_enabled(m: u32) -> bool {
    MUTANTS.load(Ordering::Relaxed) & (1 << m) != 0
}

//! Every machine primitive the device API uses, in one place: nvptx inline asm on the GPU, and
//! `core::sync::atomic` / `std` equivalents when the same code runs on CPU threads.
//!
//! No other module writes `asm!`. See each backend for its safety contract.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

/// Linear index of this thread within its block (x fastest).
#[inline(always)]
pub fn thread_rank_in_block() -> u32 {
    thread_idx_x() + block_dim_x() * (thread_idx_y() + block_dim_y() * thread_idx_z())
}

/// Number of threads in this block.
#[inline(always)]
pub fn block_size() -> u32 {
    block_dim_x() * block_dim_y() * block_dim_z()
}

/// Index of this thread in a 1-D grid: `blockIdx.x * threads_per_block + thread_rank_in_block`.
#[inline(always)]
pub fn global_thread_id() -> u64 {
    block_idx_x() as u64 * block_size() as u64 + thread_rank_in_block() as u64
}

/// Number of threads in a 1-D grid.
#[inline(always)]
pub fn global_thread_count() -> u64 {
    grid_dim_x() as u64 * block_size() as u64
}

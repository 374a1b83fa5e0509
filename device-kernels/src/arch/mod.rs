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

/// Deliberate bugs the host build of the device code can be switched into, so that a test can show
/// the suite catches them (a mutant that survives means the suite does not test that code). The
/// GPU build has none: [`mutant`] is `false` there and compiles away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Mutant {
    /// Warp-aggregated posting: the group's *last* lane takes the reservation instead of the
    /// first, while the others read the first lane's (empty) value.
    WrongReservingLane = 1,
    /// The emulated NIC's warp batches: atomics on one word run in the same round instead of
    /// one after another in WQE order (their fetched values then race).
    UnorderedAtomics = 2,
    /// The emulated NIC's warps keep the key checks of earlier passes past the key lease (a
    /// region deregistered since would still be used).
    EndlessKeyLease = 3,
    /// The emulated NIC ignores a WQE's fence mode: a fenced WQE joins a batch mid-way and does
    /// not wait for the QP's outstanding READs and atomics.
    IgnoredFence = 4,
    /// The emulated NIC's rate model never raises an idle port clock to a booking's ready time
    /// (as if every booking found the port busy): a WQE on an idle port lands early.
    PortRaiseSkipped = 5,
    /// Combined `p`s: a lane joins the previous lane's WQE whatever its address, as if every
    /// warp wrote consecutive words (a gap's values then land in the wrong words).
    CombinedAcrossGaps = 6,
}

/// Whether `m` is switched on (always `false` on the GPU).
#[inline(always)]
pub fn mutant(m: Mutant) -> bool {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = m;
        false
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        host::mutant_enabled(m as u32)
    }
}

//! FP8 quantisation, BF16 vector arithmetic, warp reductions, work splitting and the last-block
//! election the kernels share.

use crate::numeric::{bf16_to_f32, f32_to_bf16};
use ibgda_device::arch;

/// Called by one thread per block after the block's work: true in the last block of the grid
/// to get here (which then sees every other block's writes), after resetting `counter` for the
/// next launch.
///
/// # Safety
/// `counter` is a `u64` word that only this kernel's blocks touch, 0 at launch.
#[inline(always)]
pub unsafe fn last_block(counter: *mut u64) -> bool {
    arch::fence_sc_sys();
    let arrived = arch::atomic_add_acq_rel_sys_u64(counter, 1) + 1;
    if arrived == arch::grid_dim_x() as u64 {
        arch::store_relaxed_sys_u64(counter, 0);
        true
    } else {
        false
    }
}

/// Adds `weight` times the 8 BF16 values of the 16-byte vector at `p` to `acc`.
///
/// # Safety
/// `p` is 16-byte aligned and readable.
#[inline(always)]
pub unsafe fn accumulate_bf16x8(acc: &mut [f32; 8], p: *const u8, weight: f32) {
    add_bf16x8(acc, arch::load_v4(p as *const [u32; 4]), weight);
}

/// Adds `weight` times the 8 BF16 values packed in `w` to `acc`.
#[inline(always)]
pub fn add_bf16x8(acc: &mut [f32; 8], w: [u32; 4], weight: f32) {
    let mut j = 0;
    while j < 4 {
        acc[2 * j] += weight * bf16_to_f32(w[j] as u16);
        acc[2 * j + 1] += weight * bf16_to_f32((w[j] >> 16) as u16);
        j += 1;
    }
}

/// Stores `acc` as 8 BF16 values (round to nearest even) into the 16-byte vector at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and writable.
#[inline(always)]
pub unsafe fn store_bf16x8(p: *mut u8, acc: &[f32; 8]) {
    let mut o = [0u32; 4];
    let mut j = 0;
    while j < 4 {
        o[j] = f32_to_bf16(acc[2 * j]) as u32 | ((f32_to_bf16(acc[2 * j + 1]) as u32) << 16);
        j += 1;
    }
    arch::store_v4(p as *mut [u32; 4], o);
}

/// This warp's index among the grid's warps (block-major), and how many warps the grid has: the
/// high-throughput kernels give each warp its own contiguous run of work.
#[inline(always)]
pub fn warp_run() -> (u32, u32) {
    let warps = arch::block_size() / arch::warp_size();
    (
        arch::block_idx_x() * warps + arch::thread_rank_in_block() / arch::warp_size(),
        arch::grid_dim_x() * warps,
    )
}

/// Part `i` of `n` contiguous parts of `0..total`: `[total * i / n, total * (i + 1) / n)`.
#[inline(always)]
pub fn split(total: u64, i: u32, n: u32) -> (u64, u64) {
    (total * i as u64 / n as u64, total * (i as u64 + 1) / n as u64)
}

/// The sum of `v` over the warp, in every lane.
#[inline(always)]
pub fn warp_sum(v: u64) -> u64 {
    let mut v = v;
    let mut m = 1;
    while m < arch::warp_size() {
        v += arch::shfl_idx_u64(v, arch::lane_id() ^ m);
        m <<= 1;
    }
    v
}

/// The sum of `v` over this lane and the lanes below it.
#[inline(always)]
pub fn warp_inclusive_sum(v: u64) -> u64 {
    let lane = arch::lane_id();
    let mut v = v;
    let mut m = 1;
    while m < arch::warp_size() {
        let below = arch::shfl_idx_u64(v, if lane >= m { lane - m } else { lane });
        if lane >= m {
            v += below;
        }
        m <<= 1;
    }
    v
}

/// The largest absolute value of four.
#[inline(always)]
pub fn max4(a: f32, b: f32, c: f32, d: f32) -> f32 {
    let (a, b, c, d) = (a.abs(), b.abs(), c.abs(), d.abs());
    let ab = if a > b { a } else { b };
    let cd = if c > d { c } else { d };
    if ab > cd {
        ab
    } else {
        cd
    }
}

/// A cooperative copy of a row (or its scales) read once: eight 16-byte loads in flight per
/// thread, not kept in L1, so a 7,168-byte FP8 row is two rounds of loads for a warp and a
/// 14,336-byte BF16 row four.
///
/// # Safety
/// As [`ibgda_device::copy_cooperative`].
#[inline(always)]
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    // SAFETY: the caller's contract.
    unsafe { ibgda_device::copy_cooperative_streaming::<8>(dst, src, bytes, rank, nthreads) }
}

/// [`copy_bytes`] with sixteen 16-byte loads in flight per thread: a 14,336-byte BF16 row in two
/// rounds for a warp (the HT combine's rows, whose send measured faster so on 2x H200; the FP8
/// dispatch rows measured slower).
///
/// # Safety
/// As [`ibgda_device::copy_cooperative`].
#[inline(always)]
pub unsafe fn copy_bytes_wide(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, nthreads: u32) {
    // SAFETY: the caller's contract.
    unsafe { ibgda_device::copy_cooperative_streaming::<16>(dst, src, bytes, rank, nthreads) }
}

/// One lane's share of a row's small parts, the FP8 scales (`u32` words `lane` and `lane + w`
/// for a warp of `w` lanes, when there are at most `2 * w`) and two metadata words (`lane`,
/// `lane + w`), held in registers: a row's copy loads them before its payload and stores them
/// after it, so their round trips overlap the payload's instead of adding two of their own. (A
/// GPU's warp of 32 holds every word of a row; the CPU emulation's narrower warps copy the rest
/// in [`RowTail::store`].)
pub struct RowTail {
    /// Scale words `lane` and `lane + w` (0 past the row's).
    pub scales: [u32; 2],
    /// Metadata words `lane` and `lane + w` (0 past the row's).
    pub meta: [i32; 2],
}

impl RowTail {
    /// Loads `scale_words` words from `scales` (none when 0; when more than two per lane,
    /// [`RowTail::store`] copies them instead) and metadata words `lane` and `lane + w` (those
    /// below `meta_words`) as `meta(i)`.
    ///
    /// # Safety
    /// The words named are readable; `meta` reads only what its row owns.
    #[inline(always)]
    pub unsafe fn load(
        scales: *const u32,
        scale_words: u32,
        lane: u32,
        meta: impl Fn(u32) -> i32,
        meta_words: u32,
    ) -> RowTail {
        // SAFETY: this function's contract.
        unsafe {
            let w = arch::warp_size();
            let few = scale_words <= 2 * w;
            RowTail {
                scales: [
                    if few && lane < scale_words {
                        *scales.add(lane as usize)
                    } else {
                        0
                    },
                    if few && lane + w < scale_words {
                        *scales.add((lane + w) as usize)
                    } else {
                        0
                    },
                ],
                meta: [
                    if lane < meta_words { meta(lane) } else { 0 },
                    if lane + w < meta_words { meta(lane + w) } else { 0 },
                ],
            }
        }
    }

    /// Stores what [`RowTail::load`] loaded: the scales to `scales_to` (copied from `scales_from`
    /// by the warp when there are more than two per lane), metadata word `i < meta_words` by
    /// `put(i, v)` (words past two per lane loaded by `get(i)` here). Every lane calls it.
    ///
    /// # Safety
    /// As [`RowTail::load`], and the destinations are writable.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn store(
        &self,
        scales_to: *mut u32,
        scales_from: *const u32,
        scale_words: u32,
        lane: u32,
        meta_words: u32,
        get: impl Fn(u32) -> i32,
        put: impl Fn(u32, i32),
    ) {
        // SAFETY: this function's contract.
        unsafe {
            let w = arch::warp_size();
            if scale_words > 2 * w {
                copy_bytes(
                    scales_to as *mut u8,
                    scales_from as *const u8,
                    4 * scale_words as usize,
                    lane,
                    w,
                );
            } else {
                if lane < scale_words {
                    *scales_to.add(lane as usize) = self.scales[0];
                }
                if lane + w < scale_words {
                    *scales_to.add((lane + w) as usize) = self.scales[1];
                }
            }
            if lane < meta_words {
                put(lane, self.meta[0]);
            }
            if lane + w < meta_words {
                put(lane + w, self.meta[1]);
            }
            let mut i = lane + 2 * w;
            while i < meta_words {
                put(i, get(i));
                i += w;
            }
        }
    }
}

//! FP8 quantisation, BF16 vector arithmetic and the last-block election the kernels share.

use crate::numeric::{bf16_to_f32, f32_to_bf16, f32_to_e4m3, E4M3_MAX};
use ibgda_device::arch;

/// Quantises one BF16 token of `hidden` channels at `src` into FP8 e4m3 at `dst`, followed by
/// `hidden / 128` f32 scales (`amax / 448` of each 128-channel block, with amax at least 1e-4,
/// as DeepEP does). One block of 128 channels per thread.
///
/// # Safety
/// `src` holds `hidden` BF16 values, `dst` room for `hidden + hidden / 32` bytes, both 4-byte
/// aligned; `hidden` is a multiple of 128.
#[inline(always)]
pub unsafe fn quantize_fp8(dst: *mut u8, src: *const u8, hidden: u32, rank: u32, n: u32) {
    let blocks = hidden / 128;
    let scales = dst.add(hidden as usize) as *mut f32;
    let s = src as *const u32;
    let d = dst as *mut u32;
    let mut b = rank;
    while b < blocks {
        let mut amax = 1.0e-4f32;
        let mut i = b * 64;
        while i < (b + 1) * 64 {
            let w = *s.add(i as usize);
            let (x0, x1) = (bf16_to_f32(w as u16).abs(), bf16_to_f32((w >> 16) as u16).abs());
            amax = if x0 > amax { x0 } else { amax };
            amax = if x1 > amax { x1 } else { amax };
            i += 1;
        }
        let inv = E4M3_MAX / amax;
        let mut i = b * 32;
        while i < (b + 1) * 32 {
            let (w0, w1) = (*s.add(2 * i as usize), *s.add(2 * i as usize + 1));
            let q = f32_to_e4m3(bf16_to_f32(w0 as u16) * inv) as u32
                | (f32_to_e4m3(bf16_to_f32((w0 >> 16) as u16) * inv) as u32) << 8
                | (f32_to_e4m3(bf16_to_f32(w1 as u16) * inv) as u32) << 16
                | (f32_to_e4m3(bf16_to_f32((w1 >> 16) as u16) * inv) as u32) << 24;
            *d.add(i as usize) = q;
            i += 1;
        }
        *scales.add(b as usize) = amax / E4M3_MAX;
        b += n;
    }
}

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
    let w = arch::load_v4(p as *const [u32; 4]);
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

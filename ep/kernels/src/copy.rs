//! Cooperative copies, FP8 quantisation and the last-block election the kernels share.

use crate::numeric::{bf16_to_f32, f32_to_e4m3, E4M3_MAX};
use ibgda_device::arch;

/// Copies `bytes` from `src` to `dst`, shared by `n` threads of which this is `rank`: 16-byte
/// vectors (four in flight per thread) when both pointers and the length allow, else 4-byte
/// words, else bytes.
///
/// # Safety
/// `src..src+bytes` readable, `dst..dst+bytes` writable, not overlapping.
#[inline(always)]
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, bytes: usize, rank: u32, n: u32) {
    let (rank, n) = (rank as usize, n as usize);
    let align = dst as usize | src as usize | bytes;
    if align & 15 == 0 {
        let (d, s) = (dst as *mut [u32; 4], src as *const [u32; 4]);
        let v = bytes / 16;
        let mut i = rank;
        while i + 3 * n < v {
            let a = arch::load_v4(s.add(i));
            let b = arch::load_v4(s.add(i + n));
            let c = arch::load_v4(s.add(i + 2 * n));
            let e = arch::load_v4(s.add(i + 3 * n));
            arch::store_v4(d.add(i), a);
            arch::store_v4(d.add(i + n), b);
            arch::store_v4(d.add(i + 2 * n), c);
            arch::store_v4(d.add(i + 3 * n), e);
            i += 4 * n;
        }
        while i < v {
            arch::store_v4(d.add(i), arch::load_v4(s.add(i)));
            i += n;
        }
    } else if align & 3 == 0 {
        let (d, s) = (dst as *mut u32, src as *const u32);
        let mut i = rank;
        while i < bytes / 4 {
            d.add(i).write_volatile(s.add(i).read_volatile());
            i += n;
        }
    } else {
        let mut i = rank;
        while i < bytes {
            dst.add(i).write_volatile(src.add(i).read_volatile());
            i += n;
        }
    }
}

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

//! Plain host implementations of what the kernels compute, written for clarity, not speed: the
//! tests compare the kernels against them on random routings.

use crate::numeric::{bf16_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e4m3, E4M3_MAX};

/// DeepEP's `get_dispatch_layout` for one rank: `(tokens_per_rank, tokens_per_expert, in_rank)`.
pub fn layout(topk_idx: &[i64], topk: usize, experts: u32, ranks: u32) -> (Vec<u32>, Vec<u32>, Vec<u8>) {
    let tokens = topk_idx.len() / topk;
    let local = (experts / ranks) as i64;
    let mut per_rank = vec![0u32; ranks as usize];
    let mut per_expert = vec![0u32; experts as usize];
    let mut in_rank = vec![0u8; tokens * ranks as usize];
    for t in 0..tokens {
        for &e in &topk_idx[t * topk..(t + 1) * topk] {
            if e >= 0 && e < experts as i64 {
                per_expert[e as usize] += 1;
                in_rank[t * ranks as usize + (e / local) as usize] = 1;
            }
        }
        for r in 0..ranks as usize {
            per_rank[r] += in_rank[t * ranks as usize + r] as u32;
        }
    }
    (per_rank, per_expert, in_rank)
}

/// The rows rank `me` receives in a high-throughput dispatch, in order: `(source rank, token)`
/// for every source (ascending) and every token of it that has an expert on `me` (ascending).
pub fn ht_receive_order(topk_idx_per_rank: &[Vec<i64>], topk: usize, experts: u32, me: u32) -> Vec<(u32, u32)> {
    let ranks = topk_idx_per_rank.len() as u32;
    let mut rows = Vec::new();
    for (s, idx) in topk_idx_per_rank.iter().enumerate() {
        let (_, _, in_rank) = layout(idx, topk, experts, ranks);
        for t in 0..idx.len() / topk {
            if in_rank[t * ranks as usize + me as usize] != 0 {
                rows.push((s as u32, t as u32));
            }
        }
    }
    rows
}

/// One token quantised as the kernels do it: e4m3 codes and one scale (`amax / 448`, amax at
/// least 1e-4) per 128 channels.
pub fn quantize_fp8(x_bf16: &[u16]) -> (Vec<u8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x_bf16.len());
    let mut scales = Vec::new();
    for block in x_bf16.chunks(128) {
        let amax = block.iter().map(|&b| bf16_to_f32(b).abs()).fold(1.0e-4f32, f32::max);
        let inv = E4M3_MAX / amax;
        q.extend(block.iter().map(|&b| f32_to_e4m3(bf16_to_f32(b) * inv)));
        scales.push(amax / E4M3_MAX);
    }
    (q, scales)
}

/// FP8 codes and scales back to f32.
pub fn dequantize_fp8(q: &[u8], scales: &[f32]) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &c)| e4m3_to_f32(c) * scales[i / 128])
        .collect()
}

/// f32 values to BF16 bits.
pub fn to_bf16(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&f| f32_to_bf16(f)).collect()
}

/// BF16 bits to f32 values.
pub fn from_bf16(v: &[u16]) -> Vec<f32> {
    v.iter().map(|&b| bf16_to_f32(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_counts_tokens_once_per_rank_and_once_per_selection() {
        // 2 ranks x 2 experts; token 0 -> experts 0 and 1 (both rank 0), token 1 -> 3 and none.
        let idx = [0, 1, 3, -1];
        let (per_rank, per_expert, in_rank) = layout(&idx, 2, 4, 2);
        assert_eq!(per_rank, vec![1, 1]);
        assert_eq!(per_expert, vec![1, 1, 0, 1]);
        assert_eq!(in_rank, vec![1, 0, 0, 1]);
    }

    #[test]
    fn fp8_round_trip_error_is_within_e4m3_precision() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let b = to_bf16(&x);
        let (q, s) = quantize_fp8(&b);
        let y = dequantize_fp8(&q, &s);
        for (i, (&a, &r)) in from_bf16(&b).iter().zip(&y).enumerate() {
            assert!(
                (a - r).abs() <= a.abs() / 16.0 + s[i / 128] / 512.0 * 448.0 / 64.0,
                "{i}: {a} vs {r}"
            );
        }
    }
}

//! Low-latency dispatch and combine against the reference.

use super::{expert_scale, fail, Case};
use crate::buffer::{Buffer, LlCombine, LlDispatch};
use crate::call_arrays::LlArrays;
use crate::device_vec::DeviceVec;
use crate::error::Result;
use crate::numeric::{bf16_to_f32, e4m3_to_f32, f32_to_bf16};
use crate::reference;
use ibgda::Pe;

/// One low-latency case on this PE; returns the rows compared.
pub(super) fn ll_case(pe: &Pe, buffer: &Buffer, c: &Case) -> Result<u64> {
    let Case {
        fp8,
        hidden,
        topk,
        experts,
        max_tokens,
        ..
    } = *c;
    let case = c.name.as_str();
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let all = c.inputs(ranks);
    let mine = &all[me as usize];
    let tokens = mine.idx.len() / topk;
    let h = hidden as usize;
    let g = buffer.ll_geometry(
        "low_latency_dispatch",
        max_tokens,
        tokens as u32,
        hidden,
        topk as u32,
        experts,
        fp8,
    )?;
    let el = g.local_experts as usize;
    let rows = ranks as usize * max_tokens as usize;
    let x = DeviceVec::from_slice(pe, &mine.x)?;
    let idx = DeviceVec::from_slice(pe, &mine.idx)?;
    let weights = DeviceVec::from_slice(pe, &mine.weights)?;
    let xb = if fp8 { h } else { 2 * h };
    let arrays = LlArrays::new(pe, &g, ranks)?;
    let (handle, recv) = (arrays.handle(), arrays.recv());
    let (src_info, range, rx, rs, count) = (
        &arrays.src_info,
        &arrays.layout_range,
        &arrays.x,
        &arrays.x_scales,
        &arrays.count,
    );
    // Each case twice: in one launch per call, then as the send and receive halves in two
    // launches (DeepEP's `return_recv_hook`) with rank 0 launching its send half late. A receive
    // half's blocks spin until the rows arrive, so when PEs share a GPU they must leave SMs for a
    // late sender's blocks (`LlLaunch::waiting_blocks`); with a grid of every SM the late sender
    // never started and the others timed out (one GPU, two PEs, 2 of 6 `ep_bench` runs).
    let late = |pe: &Pe| {
        if pe.my_pe() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let mut compared = 0;
    for split in [false, true] {
        let a = LlDispatch {
            x: x.ptr(),
            topk_idx: idx.ptr(),
            tokens: tokens as u32,
            max_tokens,
            hidden,
            topk: topk as u32,
            experts,
            fp8,
        };
        // SAFETY: every pointer is a live DeviceVec of the size the call names.
        unsafe {
            if split {
                late(pe);
                buffer.ll_dispatch_send(pe, &g, &a, &handle)?;
                buffer.ll_dispatch_recv(pe, &g, &handle, &recv)?;
            } else {
                buffer.ll_dispatch(pe, &g, &a, &handle, &recv)?;
            }
        }
        let got_count: Vec<i32> = count.read(pe, el)?;
        let got_info: Vec<i32> = src_info.read(pe, el * rows)?;
        let got_x: Vec<u8> = rx.read(pe, el * rows * xb)?;
        let got_s: Vec<f32> = rs.read(pe, el * rows * (h / 128))?;
        let got_range: Vec<i64> = range.read(pe, el * ranks as usize)?;
        for le in 0..el {
            let e = (me as usize * el + le) as i64;
            // (source rank, token, k) of every selection of expert `e`.
            let mut want: Vec<(u32, u32, u32)> = Vec::new();
            for (s, inp) in all.iter().enumerate() {
                for (j, &v) in inp.idx.iter().enumerate() {
                    if v == e {
                        want.push((s as u32, (j / topk) as u32, (j % topk) as u32));
                    }
                }
            }
            if got_count[le] as usize != want.len() {
                return Err(fail(
                    case,
                    me,
                    format!(
                        "expert {e}: {} tokens arrived, the reference has {}",
                        got_count[le],
                        want.len()
                    ),
                ));
            }
            let mut got: Vec<(u32, u32, u32)> = Vec::new();
            for s in 0..ranks as usize {
                let lr = got_range[le * ranks as usize + s] as u64;
                let (off, n) = ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
                for i in off..off + n {
                    let row = le * rows + i;
                    let info = got_info[row] as u32;
                    let (t, k) = (info / 16, info % 16);
                    got.push((s as u32, t, k));
                    let src = &all[s].x[t as usize * h..(t as usize + 1) * h];
                    if fp8 {
                        let (q, sc) = reference::quantize_fp8(src);
                        if got_x[row * h..(row + 1) * h] != q[..]
                            || got_s[row * (h / 128)..(row + 1) * (h / 128)] != sc[..]
                        {
                            return Err(fail(case, me, format!("expert {e} row {i} (rank {s} token {t}): FP8 payload differs from the reference quantisation")));
                        }
                        let deq = reference::dequantize_fp8(&q, &sc);
                        for (c, (&orig, &d)) in src.iter().zip(&deq).enumerate() {
                            let o = bf16_to_f32(orig);
                            if (o - d).abs() > o.abs() / 16.0 + sc[c / 128] / 64.0 {
                                return Err(fail(case, me, format!("FP8 round-off: channel {c}: {o} became {d}")));
                            }
                        }
                    } else if got_x[row * 2 * h..(row + 1) * 2 * h] != *bytemuck::cast_slice::<u16, u8>(src) {
                        return Err(fail(
                            case,
                            me,
                            format!("expert {e} row {i} (rank {s} token {t}): payload differs"),
                        ));
                    }
                    compared += 1;
                }
            }
            got.sort();
            want.sort();
            if got != want {
                return Err(fail(
                    case,
                    me,
                    format!("expert {e}: received selections {got:?}, want {want:?}"),
                ));
            }
        }
        // The experts scale their rows; combine returns the weighted sum per token.
        let mut y = vec![0u16; el * rows * h];
        for le in 0..el {
            for i in 0..got_count[le] as usize {
                let row = le * rows + i;
                for c in 0..h {
                    let xv = if fp8 {
                        e4m3_to_f32(got_x[row * h + c]) * got_s[row * (h / 128) + c / 128]
                    } else {
                        bf16_to_f32(u16::from_le_bytes([
                            got_x[row * 2 * h + 2 * c],
                            got_x[row * 2 * h + 2 * c + 1],
                        ]))
                    };
                    y[row * h + c] = f32_to_bf16(xv * expert_scale(le as i64));
                }
            }
        }
        let yv = DeviceVec::from_slice(pe, &y)?;
        let out = DeviceVec::zeroed(pe, tokens * h * 2)?;
        let c = LlCombine {
            x: yv.ptr(),
            topk_idx: idx.ptr(),
            topk_weights: weights.ptr(),
            out: out.ptr(),
        };
        // SAFETY: as above.
        unsafe {
            if split {
                late(pe);
                buffer.ll_combine_send(pe, &g, &c, &handle)?;
                buffer.ll_combine_recv(pe, &g, tokens as u32, &c, &handle)?;
            } else {
                buffer.ll_combine(pe, &g, tokens as u32, &c, &handle)?;
            }
        }
        let got: Vec<u16> = out.read(pe, tokens * h)?;
        let local = el as i64;
        for t in 0..tokens {
            for ch in 0..h {
                let mut acc = 0.0f32;
                for k in 0..topk {
                    let e = mine.idx[t * topk + k];
                    if e >= 0 {
                        let xv = if fp8 {
                            let (q, sc) = reference::quantize_fp8(&mine.x[t * h..(t + 1) * h]);
                            e4m3_to_f32(q[ch]) * sc[ch / 128]
                        } else {
                            bf16_to_f32(mine.x[t * h + ch])
                        };
                        acc += mine.weights[t * topk + k] * bf16_to_f32(f32_to_bf16(xv * expert_scale(e % local)));
                    }
                }
                if got[t * h + ch] != f32_to_bf16(acc) {
                    return Err(fail(
                        case,
                        me,
                        format!(
                            "low-latency combine: token {t} channel {ch}: got {}, want {acc}",
                            bf16_to_f32(got[t * h + ch])
                        ),
                    ));
                }
            }
        }
    }
    Ok(compared)
}

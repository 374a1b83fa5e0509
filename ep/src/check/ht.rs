//! High-throughput dispatch and combine against the reference.

use super::{expert_scale, fail, Case};
use crate::buffer::{Buffer, HtDispatch, HtRecv};
use crate::call_arrays::{HtHandleArrays, HtRecvArrays, LayoutArrays};
use crate::device_vec::DeviceVec;
use crate::error::Result;
use crate::numeric::{bf16_to_f32, e4m3_to_f32, f32_to_bf16};
use crate::reference;
use ibgda::Pe;

/// One high-throughput case on this PE; returns the rows compared.
pub(super) fn ht_case(pe: &Pe, buffer: &mut Buffer, c: &Case) -> Result<u64> {
    let Case {
        fp8,
        hidden,
        topk,
        experts,
        ..
    } = *c;
    let case = c.name.as_str();
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let all = c.inputs(ranks);
    let mine = &all[me as usize];
    let tokens = mine.idx.len() / topk;
    let h = hidden as usize;
    // FP8 payload: the BF16 token quantised on the host.
    let quant: Vec<(Vec<u8>, Vec<f32>)> = all
        .iter()
        .map(|inp| {
            let mut q = Vec::new();
            let mut s = Vec::new();
            for t in 0..inp.idx.len() / topk {
                let (a, b) = reference::quantize_fp8(&inp.x[t * h..(t + 1) * h]);
                q.extend(a);
                s.extend(b);
            }
            (q, s)
        })
        .collect();
    let x = if fp8 {
        DeviceVec::from_slice(pe, &quant[me as usize].0)?
    } else {
        DeviceVec::from_slice(pe, &mine.x)?
    };
    let x_scales = if fp8 {
        Some(DeviceVec::from_slice(pe, &quant[me as usize].1)?)
    } else {
        None
    };
    let idx = DeviceVec::from_slice(pe, &mine.idx)?;
    let weights = DeviceVec::from_slice(pe, &mine.weights)?;
    let lay = LayoutArrays::new(pe, tokens, ranks, experts)?;
    let (per_rank, per_expert, in_rank, bad) = (&lay.tokens_per_rank, &lay.tokens_per_expert, &lay.in_rank, &lay.bad);
    // SAFETY: every pointer is a live DeviceVec of the size the call names.
    unsafe { buffer.layout(pe, idx.ptr(), tokens as u32, topk as u32, experts, &lay.out())? };
    let (ref_rank, ref_expert, ref_in) = reference::layout(&mine.idx, topk, experts, ranks);
    if per_rank.read::<u32>(pe, ranks as usize)? != ref_rank
        || per_expert.read::<u32>(pe, experts as usize)? != ref_expert
        || in_rank.read::<u8>(pe, tokens * ranks as usize)? != ref_in
        || bad.read::<u32>(pe, 1)?[0] != 0
    {
        return Err(fail(case, me, "get_dispatch_layout differs from the reference".into()));
    }
    let g = buffer.ht_geometry("dispatch", hidden, topk as u32, experts, fp8)?;
    let arrays = HtHandleArrays::new(pe, tokens, ranks, experts)?;
    let handle = arrays.handle(&lay);
    // SAFETY: as above.
    let inf = unsafe {
        buffer.ht_notify(pe, &g, tokens as u32, &handle, idx.ptr(), 0)?;
        buffer.read_info(pe, &g, tokens as u32, &handle)?
    };
    let order = reference::ht_receive_order(
        &all.iter().map(|i| i.idx.clone()).collect::<Vec<_>>(),
        topk,
        experts,
        me,
    );
    let n = inf[crate::geometry::info::recv_offset(ranks, ranks)] as usize;
    if n != order.len() {
        return Err(fail(
            case,
            me,
            format!("notify says {n} rows arrive, the reference {}", order.len()),
        ));
    }
    // Every pair's row count (DeepEP's rank_prefix_matrix before its prefix sums): rank `s`
    // sends rank `d` one row per token with an expert on `d`.
    for s in 0..ranks {
        let (want, _, _) = reference::layout(&all[s as usize].idx, topk, experts, ranks);
        for d in 0..ranks {
            let got = inf[crate::geometry::info::sent(ranks, g.local_experts, s, d)];
            if got as u32 != want[d as usize] {
                return Err(fail(
                    case,
                    me,
                    format!(
                        "notify says rank {s} sends rank {d} {got} rows, the reference {}",
                        want[d as usize]
                    ),
                ));
            }
        }
    }
    for le in 0..g.local_experts {
        let want: u32 = all
            .iter()
            .map(|i| {
                i.idx
                    .iter()
                    .filter(|&&e| e == (me * g.local_experts + le) as i64)
                    .count() as u32
            })
            .sum();
        if inf[crate::geometry::info::expert_count(ranks, le)] as u32 != want {
            return Err(fail(
                case,
                me,
                format!(
                    "local expert {le}: notify counts {} tokens, the reference {want}",
                    inf[crate::geometry::info::expert_count(ranks, le)]
                ),
            ));
        }
    }
    let xb = if fp8 { h } else { 2 * h };
    let received = HtRecvArrays::new(pe, n, &g)?;
    let recv = received.recv();
    let (rx, rs, ri, rw, rsrc) = (
        &received.x,
        &received.x_scales,
        &received.topk_idx,
        &received.topk_weights,
        &received.src,
    );
    let a = HtDispatch {
        x: x.ptr(),
        x_scales: x_scales.as_ref().map_or(0, |s| s.ptr()),
        topk_idx: idx.ptr(),
        topk_weights: weights.ptr(),
        tokens: tokens as u32,
        hidden,
        topk: topk as u32,
        experts,
    };
    // SAFETY: as above.
    unsafe { buffer.ht_dispatch(pe, &g, &a, &handle, &recv)? };
    let got_x: Vec<u8> = rx.read(pe, n * xb)?;
    let got_idx: Vec<i64> = ri.read(pe, n * topk)?;
    let got_w: Vec<f32> = rw.read(pe, n * topk)?;
    let got_src: Vec<i32> = rsrc.read(pe, n)?;
    let got_s: Vec<f32> = rs.read(pe, n * g.scales_per_token() as usize)?;
    let local = g.local_experts as i64;
    for (i, &(s, t)) in order.iter().enumerate() {
        let src = &all[s as usize];
        let t = t as usize;
        let want_x: Vec<u8> = if fp8 {
            quant[s as usize].0[t * h..(t + 1) * h].to_vec()
        } else {
            bytemuck::cast_slice(&src.x[t * h..(t + 1) * h]).to_vec()
        };
        if got_x[i * xb..(i + 1) * xb] != want_x[..] || got_src[i] != t as i32 {
            return Err(fail(case, me, format!("row {i} (rank {s} token {t}) arrived wrong")));
        }
        if fp8 {
            let sp = g.scales_per_token() as usize;
            if got_s[i * sp..(i + 1) * sp] != quant[s as usize].1[t * sp..(t + 1) * sp] {
                return Err(fail(case, me, format!("row {i}: scales differ")));
            }
        }
        for k in 0..topk {
            let e = src.idx[t * topk + k];
            let mine = e >= 0 && e / local == me as i64;
            let (wi, ww) = if mine {
                (e - me as i64 * local, src.weights[t * topk + k])
            } else {
                (-1, 0.0)
            };
            if got_idx[i * topk + k] != wi || got_w[i * topk + k] != ww {
                return Err(fail(
                    case,
                    me,
                    format!(
                        "row {i} entry {k}: got ({}, {}), want ({wi}, {ww})",
                        got_idx[i * topk + k],
                        got_w[i * topk + k]
                    ),
                ));
            }
        }
    }
    // The experts: each row becomes the weighted sum of its local experts' outputs (BF16).
    let xf: Vec<f32> = if fp8 {
        (0..n)
            .flat_map(|i| (0..h).map(move |c| (i, c)))
            .map(|(i, c)| e4m3_to_f32(got_x[i * h + c]) * got_s[i * (h / 128) + c / 128])
            .collect()
    } else {
        got_x
            .chunks_exact(2)
            .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    };
    let y: Vec<u16> = (0..n * h)
        .map(|j| {
            let (i, _) = (j / h, j % h);
            let mut acc = 0.0f32;
            for k in 0..topk {
                if got_idx[i * topk + k] >= 0 {
                    acc += got_w[i * topk + k] * expert_scale(got_idx[i * topk + k]) * xf[j];
                }
            }
            f32_to_bf16(acc)
        })
        .collect();
    let yv = DeviceVec::from_slice(pe, &y)?;
    let yw = DeviceVec::from_slice(pe, &got_w)?;
    let out = DeviceVec::zeroed(pe, tokens * h * 2)?;
    let out_w = DeviceVec::zeroed(pe, tokens * topk * 4)?;
    // SAFETY: as above.
    unsafe {
        buffer.ht_combine(
            pe,
            &g,
            tokens as u32,
            &handle,
            yv.ptr(),
            yw.ptr(),
            out.ptr(),
            out_w.ptr(),
        )?
    };
    let got: Vec<u16> = out.read(pe, tokens * h)?;
    let got_cw: Vec<f32> = out_w.read(pe, tokens * topk)?;
    // Reference: every rank's row for the token, in rank order, summed in f32.
    let row_of = |r: u32, t: usize| -> Option<usize> {
        let ord = reference::ht_receive_order(&all.iter().map(|i| i.idx.clone()).collect::<Vec<_>>(), topk, experts, r);
        ord.iter().position(|&(s, tt)| s == me && tt as usize == t)
    };
    // Other ranks' expert outputs are recomputed here from the inputs (same arithmetic).
    for t in 0..tokens {
        let mut acc = vec![0.0f32; h];
        let mut w = vec![0.0f32; topk];
        for r in 0..ranks {
            if row_of(r, t).is_none() {
                continue;
            }
            for c in 0..h {
                let xv = if fp8 {
                    let q = &quant[me as usize];
                    e4m3_to_f32(q.0[t * h + c]) * q.1[t * (h / 128) + c / 128]
                } else {
                    bf16_to_f32(mine.x[t * h + c])
                };
                let mut v = 0.0f32;
                for k in 0..topk {
                    let e = mine.idx[t * topk + k];
                    if e >= 0 && e / local == r as i64 {
                        v += mine.weights[t * topk + k] * expert_scale(e - r as i64 * local) * xv;
                    }
                }
                acc[c] += bf16_to_f32(f32_to_bf16(v));
            }
            for k in 0..topk {
                let e = mine.idx[t * topk + k];
                if e >= 0 && e / local == r as i64 {
                    w[k] += mine.weights[t * topk + k];
                }
            }
        }
        for c in 0..h {
            if got[t * h + c] != f32_to_bf16(acc[c]) {
                return Err(fail(
                    case,
                    me,
                    format!(
                        "combine: token {t} channel {c}: got {}, want {}",
                        bf16_to_f32(got[t * h + c]),
                        acc[c]
                    ),
                ));
            }
        }
        if got_cw[t * topk..(t + 1) * topk] != w[..] {
            return Err(fail(
                case,
                me,
                format!(
                    "combine: token {t}: weights {:?}, want {w:?}",
                    &got_cw[t * topk..(t + 1) * topk]
                ),
            ));
        }
    }
    // Cached dispatches with the same handle deliver the same rows: the first on another grid
    // (its slots come from the handle, not from the per-warp counts of the notify above, which
    // were for the first grid), the second back on this one, right after a cached call. The third
    // is discarded (its outputs "could not be made"): the next case finds the buffer as usable.
    let sms = buffer.config().num_sms;
    for (round, grid) in [(0, if sms == 2 { 3 } else { 2 }), (1, sms), (2, sms)] {
        buffer.set_num_sms(grid)?;
        let rx2 = DeviceVec::zeroed(pe, n * xb)?;
        let recv2 = HtRecv { x: rx2.ptr(), ..recv };
        let discard = round == 2;
        // SAFETY: as above; the handle's dispatch completed.
        unsafe {
            buffer.ht_notify_cached(pe, &g, &handle, &inf)?;
            if discard {
                buffer.ht_dispatch_send(pe, &g, &a, &handle)?;
                buffer.ht_dispatch_discard(pe, &g, &handle)?;
            } else {
                buffer.ht_dispatch(pe, &g, &a, &handle, &recv2)?;
            }
        }
        if !discard && rx2.read::<u8>(pe, n * xb)? != got_x {
            return Err(fail(
                case,
                me,
                format!("cached dispatch {round} (on {grid} SMs) delivered different rows"),
            ));
        }
        // Each cached dispatch needs its combine too, to keep every rank's counters in step.
        let out2 = DeviceVec::zeroed(pe, tokens * h * 2)?;
        // SAFETY: as above.
        unsafe { buffer.ht_combine(pe, &g, tokens as u32, &handle, yv.ptr(), 0, out2.ptr(), 0)? };
        if out2.read::<u16>(pe, tokens * h)? != got {
            return Err(fail(
                case,
                me,
                format!("combine after cached dispatch {round} (on {grid} SMs) differs"),
            ));
        }
    }
    buffer.set_num_sms(sms)?;
    Ok(n as u64)
}

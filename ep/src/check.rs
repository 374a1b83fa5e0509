//! The self-check every transport and launch layout runs: random routings (including tokens
//! routed to no expert of a rank, every token to one rank, zero tokens and several experts of
//! one rank per token) through high-throughput and low-latency dispatch and combine, BF16 and
//! FP8, compared with [`crate::reference`]; and the bad inputs, which must fail with the right
//! error. Run per PE (threads or processes); every PE runs the same cases in the same order.
#![allow(clippy::needless_range_loop)]

use crate::buffer::{
    read_device, Buffer, BufferConfig, DevicePtr, HtDispatch, HtHandle, HtRecv, LayoutOut, LlCombine, LlDispatch,
    LlHandle, LlRecv,
};
use crate::error::{EpError, Result};
use crate::numeric::{bf16_to_f32, e4m3_to_f32, f32_to_bf16};
use crate::reference;
use ibgda::Pe;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Memory on this PE's device (GPU memory, or host memory on the CPU emulation), freed on drop.
///
/// On a GPU everything is stream-ordered on the PE's own stream: with PEs as threads of one
/// context, the legacy stream (and `cuMemFree`) would wait for a peer's kernel that may itself be
/// waiting for this PE.
pub struct DeviceVec {
    stream: u64,
    ptr: DevicePtr,
    bytes: usize,
    host: Vec<u128>,
    gpu: bool,
}

fn cuda<'a>(pe: &'a Pe, call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> EpError + 'a {
    move |e| {
        ibgda::Error::Cuda {
            call,
            pe: pe.my_pe(),
            source: e,
        }
        .into()
    }
}

/// Waits for this PE's stream.
fn pe_stream_sync(pe: &Pe) -> Result<()> {
    let stream = pe.gpu()?.stream().cu_stream();
    // SAFETY: the PE's live stream.
    unsafe { cudarc::driver::result::stream::synchronize(stream) }.map_err(cuda(pe, "cuStreamSynchronize"))
}

impl DeviceVec {
    /// `bytes` zeroed bytes.
    pub fn zeroed(pe: &Pe, bytes: usize) -> Result<DeviceVec> {
        let bytes = bytes.max(16);
        if pe.is_gpu() {
            let g = pe.gpu()?;
            g.context().bind_to_thread().map_err(cuda(pe, "cuCtxSetCurrent"))?;
            let stream = g.stream().cu_stream();
            // SAFETY: a fresh stream-ordered allocation on this PE's stream, zeroed before use.
            let ptr =
                unsafe { cudarc::driver::result::malloc_async(stream, bytes) }.map_err(cuda(pe, "cuMemAllocAsync"))?;
            // SAFETY: `ptr` holds `bytes` bytes.
            unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream) }
                .map_err(cuda(pe, "cuMemsetD8Async"))?;
            pe_stream_sync(pe)?;
            Ok(DeviceVec {
                stream: stream as u64,
                ptr,
                bytes,
                host: Vec::new(),
                gpu: true,
            })
        } else {
            let host = vec![0u128; bytes.div_ceil(16)];
            Ok(DeviceVec {
                stream: 0,
                ptr: host.as_ptr() as u64,
                bytes,
                host,
                gpu: false,
            })
        }
    }

    /// A copy of `data` (16-byte aligned).
    pub fn from_slice<T: bytemuck::Pod>(pe: &Pe, data: &[T]) -> Result<DeviceVec> {
        let v = DeviceVec::zeroed(pe, std::mem::size_of_val(data))?;
        let src: &[u8] = bytemuck::cast_slice(data);
        if v.gpu {
            // SAFETY: `v` holds at least `src.len()` bytes; `src` outlives the sync below.
            unsafe { cudarc::driver::result::memcpy_htod_async(v.ptr, src, v.stream as cudarc::driver::sys::CUstream) }
                .map_err(cuda(pe, "cuMemcpyHtoDAsync"))?;
            pe_stream_sync(pe)?;
        } else {
            // SAFETY: `v.host` holds at least `src.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v.ptr as *mut u8, src.len()) };
        }
        Ok(v)
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Reads `n` values back (waits for the PE's work first).
    pub fn read<T: bytemuck::Pod + Default>(&self, pe: &Pe, n: usize) -> Result<Vec<T>> {
        assert!(n * std::mem::size_of::<T>() <= self.bytes);
        pe.synchronize()?;
        // SAFETY: in bounds, and the PE's work is done.
        unsafe { read_device(pe, self.ptr, n) }
    }
}

impl Drop for DeviceVec {
    fn drop(&mut self) {
        if self.gpu {
            // SAFETY: allocated by `malloc_async` on this stream and freed once, in stream order
            // after the kernels that use it.
            let _ =
                unsafe { cudarc::driver::result::free_async(self.ptr, self.stream as cudarc::driver::sys::CUstream) };
        }
        let _ = &self.host;
    }
}

/// What one case checks; the counters say how much was compared.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Cases run.
    pub cases: Vec<String>,
    /// Rows compared.
    pub rows: u64,
}

fn fail(case: &str, rank: u32, what: String) -> EpError {
    EpError::InvalidArgument {
        call: "self-check",
        rank,
        what: format!("{case}: {what}"),
    }
}

/// Routing: `topk_idx [tokens, topk]` for one rank.
#[derive(Clone, Copy, Debug)]
enum Routing {
    /// Uniform over experts, with some `-1`s, duplicates of a rank allowed.
    Random,
    /// Every token to experts of rank 0 only.
    AllToRankZero,
    /// No expert at all.
    Nothing,
}

fn route(rng: &mut StdRng, tokens: usize, topk: usize, experts: u32, ranks: u32, how: Routing) -> Vec<i64> {
    let local = experts / ranks;
    let mut idx = vec![-1i64; tokens * topk];
    for t in 0..tokens {
        let mut used: Vec<i64> = Vec::new();
        for k in 0..topk {
            let e = match how {
                Routing::Nothing => -1,
                Routing::AllToRankZero => rng.random_range(0..local) as i64,
                Routing::Random if rng.random_range(0..8) == 0 => -1,
                Routing::Random => rng.random_range(0..experts) as i64,
            };
            // DeepEP's routers never pick an expert twice for one token.
            if e >= 0 && !used.contains(&e) {
                used.push(e);
                idx[t * topk + k] = e;
            }
        }
    }
    idx
}

fn random_bf16(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n).map(|_| f32_to_bf16(rng.random_range(-4.0f32..4.0))).collect()
}

/// The "expert" the checks apply: expert `le` multiplies by `(le + 1) / 4`.
fn expert_scale(le: i64) -> f32 {
    (le + 1) as f32 / 4.0
}

/// Everything a rank contributes to one high-throughput case, for the reference.
struct HtInputs {
    idx: Vec<i64>,
    weights: Vec<f32>,
    x: Vec<u16>,
}

/// Runs every case on this PE; every PE must call it with the same arguments.
pub fn run(pe: &mut Pe, hidden: u32, rounds: u32) -> Result<Report> {
    let mut report = Report::default();
    let ranks = pe.n_pes();
    let experts = 4 * ranks;
    let topk = 4usize;
    let max_tokens = 48u32;
    let config = BufferConfig {
        num_nvl_bytes: Buffer::ht_size_hint(ranks, max_tokens as u64, hidden, topk as u32, false),
        num_rdma_bytes: Buffer::ll_size_hint(max_tokens, hidden, ranks, experts),
        num_sms: 3,
        threads: 256,
    };
    let buffer = Buffer::new(pe, config)?;
    for round in 0..rounds {
        for (how, fp8) in [
            (Routing::Random, false),
            (Routing::Random, true),
            (Routing::AllToRankZero, false),
            (Routing::Nothing, true),
        ] {
            let name = format!("ht {how:?} {} round {round}", if fp8 { "fp8" } else { "bf16" });
            report.rows += ht_case(
                pe,
                &buffer,
                &name,
                how,
                fp8,
                hidden,
                topk,
                experts,
                max_tokens,
                1000 * round + 7,
            )?;
            report.cases.push(name);
        }
        for (how, fp8) in [
            (Routing::Random, false),
            (Routing::Random, true),
            (Routing::AllToRankZero, true),
            (Routing::Nothing, false),
        ] {
            let name = format!("ll {how:?} {} round {round}", if fp8 { "fp8" } else { "bf16" });
            report.rows += ll_case(
                pe,
                &buffer,
                &name,
                how,
                fp8,
                hidden,
                topk,
                experts,
                max_tokens,
                1000 * round + 11,
            )?;
            report.cases.push(name);
        }
    }
    bad_inputs(pe, &buffer, hidden, topk as u32, experts, max_tokens)?;
    report.cases.push("bad inputs".into());
    buffer.destroy(pe)?;
    Ok(report)
}

/// Tokens on rank `r` for a case: zero on the last rank every other case.
fn tokens_for(rng: &mut StdRng, r: u32, ranks: u32, max_tokens: u32, seed: u32) -> usize {
    if ranks > 1 && r == ranks - 1 && seed % 2 == 1 {
        0
    } else {
        rng.random_range(1..=max_tokens) as usize
    }
}

#[allow(clippy::too_many_arguments)]
fn ht_inputs(
    r: u32,
    ranks: u32,
    how: Routing,
    hidden: u32,
    topk: usize,
    experts: u32,
    max_tokens: u32,
    seed: u32,
) -> HtInputs {
    let mut rng = StdRng::seed_from_u64(seed as u64 * 131 + r as u64);
    let tokens = tokens_for(&mut rng, r, ranks, max_tokens, seed);
    let idx = route(&mut rng, tokens, topk, experts, ranks, how);
    let weights = (0..tokens * topk).map(|_| rng.random_range(0.0f32..1.0)).collect();
    let x = random_bf16(&mut rng, tokens * hidden as usize);
    HtInputs { idx, weights, x }
}

#[allow(clippy::too_many_arguments)]
fn ht_case(
    pe: &Pe,
    buffer: &Buffer,
    case: &str,
    how: Routing,
    fp8: bool,
    hidden: u32,
    topk: usize,
    experts: u32,
    max_tokens: u32,
    seed: u32,
) -> Result<u64> {
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let all: Vec<HtInputs> = (0..ranks)
        .map(|r| ht_inputs(r, ranks, how, hidden, topk, experts, max_tokens, seed))
        .collect();
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
    let per_rank = DeviceVec::zeroed(pe, 4 * ranks as usize)?;
    let per_expert = DeviceVec::zeroed(pe, 4 * experts as usize)?;
    let in_rank = DeviceVec::zeroed(pe, tokens * ranks as usize)?;
    let bad = DeviceVec::zeroed(pe, 4)?;
    let out = LayoutOut {
        tokens_per_rank: per_rank.ptr(),
        tokens_per_expert: per_expert.ptr(),
        in_rank: in_rank.ptr(),
        bad: bad.ptr(),
    };
    // SAFETY: every pointer is a live DeviceVec of the size the call names.
    unsafe { buffer.layout(pe, idx.ptr(), tokens as u32, topk as u32, experts, &out)? };
    let (ref_rank, ref_expert, ref_in) = reference::layout(&mine.idx, topk, experts, ranks);
    if per_rank.read::<u32>(pe, ranks as usize)? != ref_rank
        || per_expert.read::<u32>(pe, experts as usize)? != ref_expert
        || in_rank.read::<u8>(pe, tokens * ranks as usize)? != ref_in
        || bad.read::<u32>(pe, 1)?[0] != 0
    {
        return Err(fail(case, me, "get_dispatch_layout differs from the reference".into()));
    }
    let g = buffer.ht_geometry("dispatch", hidden, topk as u32, experts, fp8)?;
    let info = DeviceVec::zeroed(pe, 4 * HtHandle::info_len(ranks, experts))?;
    let send_slot = DeviceVec::zeroed(pe, 4 * tokens * ranks as usize)?;
    let handle = HtHandle {
        info: info.ptr(),
        send_slot: send_slot.ptr(),
        in_rank: in_rank.ptr(),
        tokens_per_expert: per_expert.ptr(),
    };
    // SAFETY: as above.
    let inf = unsafe {
        buffer.ht_notify(pe, &g, tokens as u32, &handle)?;
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
    let rx = DeviceVec::zeroed(pe, n * xb)?;
    let rs = DeviceVec::zeroed(pe, n * g.scales_per_token() as usize * 4)?;
    let ri = DeviceVec::zeroed(pe, n * topk * 8)?;
    let rw = DeviceVec::zeroed(pe, n * topk * 4)?;
    let rsrc = DeviceVec::zeroed(pe, n * 4)?;
    let recv = HtRecv {
        x: rx.ptr(),
        x_scales: if fp8 { rs.ptr() } else { 0 },
        topk_idx: ri.ptr(),
        topk_weights: rw.ptr(),
        src: rsrc.ptr(),
    };
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
    // A cached dispatch with the same handle delivers the same rows.
    let rx2 = DeviceVec::zeroed(pe, n * xb)?;
    let recv2 = HtRecv { x: rx2.ptr(), ..recv };
    // SAFETY: as above.
    unsafe {
        buffer.ht_notify(pe, &g, tokens as u32, &handle)?;
        buffer.ht_dispatch(pe, &g, &a, &handle, &recv2)?;
    }
    if rx2.read::<u8>(pe, n * xb)? != got_x {
        return Err(fail(case, me, "a cached dispatch delivered different rows".into()));
    }
    // The cached dispatch needs its combine too, to keep every rank's counters in step.
    // SAFETY: as above.
    unsafe { buffer.ht_combine(pe, &g, tokens as u32, &handle, yv.ptr(), 0, out.ptr(), 0)? };
    if out.read::<u16>(pe, tokens * h)? != got {
        return Err(fail(case, me, "combine after a cached dispatch differs".into()));
    }
    Ok(n as u64)
}

#[allow(clippy::too_many_arguments)]
fn ll_case(
    pe: &Pe,
    buffer: &Buffer,
    case: &str,
    how: Routing,
    fp8: bool,
    hidden: u32,
    topk: usize,
    experts: u32,
    max_tokens: u32,
    seed: u32,
) -> Result<u64> {
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let all: Vec<HtInputs> = (0..ranks)
        .map(|r| ht_inputs(r, ranks, how, hidden, topk, experts, max_tokens, seed))
        .collect();
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
    let seq = DeviceVec::zeroed(pe, 16)?;
    let src_info = DeviceVec::zeroed(pe, el * rows * 4)?;
    let range = DeviceVec::zeroed(pe, el * ranks as usize * 8)?;
    let xb = if fp8 { h } else { 2 * h };
    let rx = DeviceVec::zeroed(pe, el * rows * xb)?;
    let rs = DeviceVec::zeroed(pe, el * rows * (h / 128) * 4)?;
    let count = DeviceVec::zeroed(pe, el * 4)?;
    let handle = LlHandle {
        seq: seq.ptr(),
        src_info: src_info.ptr(),
        layout_range: range.ptr(),
    };
    let recv = LlRecv {
        x: rx.ptr(),
        x_scales: if fp8 { rs.ptr() } else { 0 },
        count: count.ptr(),
    };
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
        buffer.ll_dispatch_send(pe, &g, &a, &handle)?;
        buffer.ll_dispatch_recv(pe, &g, &handle, &recv)?;
    }
    let got_count: Vec<i32> = count.read(pe, el)?;
    let got_info: Vec<i32> = src_info.read(pe, el * rows)?;
    let got_x: Vec<u8> = rx.read(pe, el * rows * xb)?;
    let got_s: Vec<f32> = rs.read(pe, el * rows * (h / 128))?;
    let got_range: Vec<i64> = range.read(pe, el * ranks as usize)?;
    let mut compared = 0;
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
                    if got_x[row * h..(row + 1) * h] != q[..] || got_s[row * (h / 128)..(row + 1) * (h / 128)] != sc[..]
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
        buffer.ll_combine_send(pe, &g, &c, &handle)?;
        buffer.ll_combine_recv(pe, &g, tokens as u32, &c, &handle)?;
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
    Ok(compared)
}

/// Each bad input fails with its error, on every rank, and moves nothing.
fn bad_inputs(pe: &mut Pe, buffer: &Buffer, hidden: u32, topk: u32, experts: u32, max_tokens: u32) -> Result<()> {
    let me = pe.my_pe();
    let expect = |what: &str, r: Result<crate::Geometry>, needle: &str| -> Result<()> {
        match r {
            Err(e) if e.to_string().contains(needle) => Ok(()),
            Err(e) => Err(fail("bad inputs", me, format!("{what}: wrong error: {e}"))),
            Ok(_) => Err(fail("bad inputs", me, format!("{what}: accepted"))),
        }
    };
    expect(
        "FP8 with hidden 136",
        buffer.ht_geometry("dispatch", 136, topk, experts, true),
        "multiple of 128",
    )?;
    expect(
        "top-k 17",
        buffer.ht_geometry("dispatch", hidden, 17, experts, false),
        "num_topk",
    )?;
    if pe.n_pes() > 1 {
        expect(
            "experts not a multiple of ranks",
            buffer.ht_geometry("dispatch", hidden, topk, experts + 1, false),
            "num_experts",
        )?;
    }
    expect(
        "too many low-latency tokens",
        buffer.ll_geometry(
            "low_latency_dispatch",
            max_tokens,
            max_tokens + 1,
            hidden,
            topk,
            experts,
            false,
        ),
        "more than num_max_dispatch_tokens_per_rank",
    )?;
    // An expert index out of range is reported by the layout and counted nowhere.
    let idx = DeviceVec::from_slice(pe, &[0i64, experts as i64, -1, -2])?;
    let per_rank = DeviceVec::zeroed(pe, 256)?;
    let per_expert = DeviceVec::zeroed(pe, 4 * experts as usize)?;
    let in_rank = DeviceVec::zeroed(pe, 256)?;
    let bad = DeviceVec::zeroed(pe, 4)?;
    let out = LayoutOut {
        tokens_per_rank: per_rank.ptr(),
        tokens_per_expert: per_expert.ptr(),
        in_rank: in_rank.ptr(),
        bad: bad.ptr(),
    };
    // SAFETY: live DeviceVecs of the sizes named (2 tokens x top-2).
    unsafe { buffer.layout(pe, idx.ptr(), 2, 2, experts, &out)? };
    let b = bad.read::<u32>(pe, 1)?[0];
    if b == 0 || per_expert.read::<u32>(pe, experts as usize)?.iter().sum::<u32>() != 1 {
        return Err(fail(
            "bad inputs",
            me,
            format!("an out-of-range expert was not flagged (bad = {b})"),
        ));
    }
    // Too many tokens for the area: every rank gets BufferTooSmall, and the buffer stays usable.
    let small = Buffer::new(
        pe,
        BufferConfig {
            num_nvl_bytes: Buffer::ht_size_hint(pe.n_pes(), 2, hidden, topk, false),
            num_rdma_bytes: 16,
            num_sms: 2,
            threads: 64,
        },
    )?;
    let tokens = 8usize;
    let idx: Vec<i64> = (0..tokens * topk as usize)
        .map(|j| if j % topk as usize == 0 { 0 } else { -1 })
        .collect();
    let (_, per_e, inr) = reference::layout(&idx, topk as usize, experts, pe.n_pes());
    let inr = DeviceVec::from_slice(pe, &inr)?;
    let per_e = DeviceVec::from_slice(pe, &per_e)?;
    let info = DeviceVec::zeroed(pe, 4 * HtHandle::info_len(pe.n_pes(), experts))?;
    let handle = HtHandle {
        info: info.ptr(),
        send_slot: 0,
        in_rank: inr.ptr(),
        tokens_per_expert: per_e.ptr(),
    };
    let g = small.ht_geometry("dispatch", hidden, topk, experts, false)?;
    // SAFETY: live DeviceVecs of the sizes named.
    let r = unsafe {
        small.ht_notify(pe, &g, tokens as u32, &handle)?;
        small.read_info(pe, &g, tokens as u32, &handle)
    };
    match r {
        Err(EpError::BufferTooSmall { receiver: 0, .. }) => {}
        Err(e) => return Err(fail("bad inputs", me, format!("overflow: wrong error: {e}"))),
        Ok(_) => return Err(fail("bad inputs", me, "overflow: accepted".into())),
    }
    small.destroy(pe)?;
    Ok(())
}

//! `ep-bench`: dispatch/combine throughput and latency from Rust, with DeepEP's configurations and
//! byte accounting, over whatever transport the runtime picks (`IBGDA_TRANSPORT=p2p|ibgda|proxy`:
//! the NIC paths run on the emulated NIC). One PE per process under a launcher
//! (`ibgda-run -n 2 ep_bench`, torchrun, Slurm) or `--pes N` threads.
//!
//! High-throughput: FP8 cached dispatch (the handle's slots, as DeepEP times it; `dispatch_recount`
//! with the full count exchange again) and BF16 combine
//! of `--tokens` tokens per rank; bandwidth is received rows times `hidden * (1 + 4/128)` bytes
//! (dispatch) or `hidden * 2` bytes (combine) per call. Low-latency: `--ll-tokens` tokens, FP8 dispatch and BF16 combine
//! latency. CUDA events around each call on a GPU (wall clock on the CPU emulation), warm-up,
//! median of `--iters`; random routing and payload, and every result checked: sampled received
//! rows against the senders' data (regenerated from their seeds), combine of all-ones rows
//! against each token's rank count, low-latency expert counts and weighted sums.
//! Rows (`--csv`, appended): `system,mode,metric,tokens,value,unit`.
use clap::Parser;
use ibgda::{run_in_process, Config, Pe};
use ibgda_ep::call_arrays::{HtHandleArrays, HtRecvArrays, LayoutArrays, LlArrays};
use ibgda_ep::numeric::{bf16_to_f32, f32_to_bf16};
use ibgda_ep::{Buffer, BufferConfig, DeviceVec, EpError, Result};
use ibgda_ep::{HtDispatch, LlCombine, LlDispatch};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::time::Instant;

#[derive(Parser, Clone)]
#[command(about = "MoE dispatch/combine benchmark (DeepEP's configurations and byte accounting)")]
struct Args {
    /// PEs as threads of this process (without a launcher).
    #[arg(long, default_value_t = 2)]
    pes: u32,
    /// Tokens per rank of the high-throughput runs (comma-separated; empty: none).
    #[arg(long, default_value = "4096")]
    tokens: String,
    /// Channels per token.
    #[arg(long, default_value_t = 7168)]
    hidden: u32,
    /// Experts over all ranks.
    #[arg(long, default_value_t = 256)]
    experts: u32,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    topk: u32,
    /// Tokens per rank of the low-latency run (0: none).
    #[arg(long, default_value_t = 128)]
    ll_tokens: u32,
    /// Timed calls per point (the median is reported).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Blocks of the high-throughput kernels (DeepEP's `num_sms`).
    #[arg(long, default_value_t = 24)]
    num_sms: u32,
    /// The `system` column of the CSV rows (default `ibgda-ep/<transport>`).
    #[arg(long)]
    system: Option<String>,
    /// Append rows to this CSV file (rank 0).
    #[arg(long)]
    csv: Option<String>,
}

/// One rank's inputs, regenerated identically by every rank from the rank's seed.
struct Inputs {
    idx: Vec<i64>,
    weights: Vec<f32>,
    x: Vec<u8>,
    scales: Vec<f32>,
}

fn inputs(rank: u32, tokens: u32, a: &Args) -> Inputs {
    let mut rng = StdRng::seed_from_u64(0x5eed_0000 + rank as u64 * 7919 + tokens as u64);
    let (t, k, h) = (tokens as usize, a.topk as usize, a.hidden as usize);
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        // k distinct experts per token.
        let mut chosen: Vec<i64> = Vec::with_capacity(k);
        while chosen.len() < k {
            let e = rng.random_range(0..a.experts) as i64;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        idx.extend(chosen);
    }
    let weights = (0..t * k).map(|_| rng.random_range(0.0f32..1.0)).collect();
    // FP8 bytes below 0x78 are finite e4m3 values.
    let x = (0..t * h).map(|_| rng.random_range(0u8..0x78)).collect();
    let scales = (0..t * h / 128).map(|_| rng.random_range(0.01f32..1.0)).collect();
    Inputs {
        idx,
        weights,
        x,
        scales,
    }
}

fn mismatch(pe: &Pe, what: String) -> EpError {
    EpError::InvalidArgument {
        call: "ep-bench result check",
        rank: pe.my_pe(),
        what,
    }
}

/// Median time (µs) of `iters` calls of `f` after two warm-ups: CUDA events on this PE's stream
/// on a GPU, the wall clock on the CPU emulation (whose launches return when done).
fn time_us(pe: &Pe, iters: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    // One half that is the whole call; the other half is empty.
    Ok(time_halves_us(pe, iters, || Ok(()), f, || Ok(()))?.0)
}

/// Median times (µs) of the two halves of `iters` calls (`send` then `recv`, CUDA events around
/// and between them on this PE's stream), each after `prepare` has run and finished, after two
/// warm-ups: where a low-latency call waits. On the CPU emulation (launches return when done) the
/// wall clock of each half.
fn time_halves_us(
    pe: &Pe,
    iters: usize,
    mut prepare: impl FnMut() -> Result<()>,
    mut send: impl FnMut() -> Result<()>,
    mut recv: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    for _ in 0..2 {
        prepare()?;
        send()?;
        recv()?;
    }
    pe.synchronize()?;
    let (mut vs, mut vr) = (Vec::new(), Vec::new());
    for _ in 0..iters.max(1) {
        prepare()?;
        pe.synchronize()?;
        if pe.is_gpu() {
            let err = |source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source };
            let gpu = pe.gpu()?;
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let e: Vec<_> = (0..3)
                .map(|_| gpu.context().new_event(flags).map_err(err))
                .collect::<ibgda::Result<_>>()?;
            e[0].record(gpu.stream()).map_err(err)?;
            send()?;
            e[1].record(gpu.stream()).map_err(err)?;
            recv()?;
            e[2].record(gpu.stream()).map_err(err)?;
            pe.synchronize()?;
            vs.push(e[0].elapsed_ms(&e[1]).map_err(err)? as f64 * 1e3);
            vr.push(e[1].elapsed_ms(&e[2]).map_err(err)? as f64 * 1e3);
        } else {
            let t0 = Instant::now();
            send()?;
            let t1 = Instant::now();
            recv()?;
            pe.synchronize()?;
            vs.push((t1 - t0).as_secs_f64() * 1e6);
            vr.push(t1.elapsed().as_secs_f64() * 1e6);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    Ok((median(vs), median(vr)))
}

/// What this PE's emulated NIC did so far, summed over its QPs: WQEs executed, busy passes,
/// batches, doorbells seen, retirements, WQEBBs waiting at the passes' starts, the engine's SM
/// cycles planning, copying and completing, and the ns from learning a doorbell to finishing its
/// pass (summed over those passes); then the same for the QP that executed the most WQEs (its
/// index last). `None` without one (P2P, or a ConnectX).
fn engine_totals(pe: &Pe) -> Option<([u64; 10], Vec<[u64; 10]>)> {
    let stats = pe.gpu().ok()?.ibgda()?.qp_stats().ok()?;
    let per: Vec<[u64; 10]> = stats
        .iter()
        .map(|s| {
            [
                s.wqes_executed,
                s.busy_passes,
                s.batches,
                s.doorbells_seen,
                s.retirements,
                s.backlog_sum,
                s.cycles_plan,
                s.cycles_copy,
                s.cycles_complete,
                s.finished_ns_sum.wrapping_sub(s.learned_ns_sum),
            ]
        })
        .collect();
    let total = per.iter().fold([0u64; 10], |mut t, s| {
        for (a, b) in t.iter_mut().zip(s) {
            *a = a.wrapping_add(*b);
        }
        t
    });
    Some((total, per))
}

/// Runs each call once more under the host clock and prints, when peers are behind the emulated
/// NIC, what the NIC did in it: the rate model's waits (summed over the engine's warps), the WQEs,
/// QPs, passes, batches and engine cycles, and the same for the busiest QP. Collective.
fn nic_evidence(pe: &Pe, kind: &str, calls: &[(&str, &dyn Fn() -> Result<()>)]) -> Result<()> {
    let me = pe.my_pe();
    for (call, f) in calls {
        let (before, model0) = (engine_totals(pe), model_stats(pe));
        pe.barrier()?;
        let clock = std::time::Instant::now();
        f()?;
        pe.synchronize()?;
        let us = clock.elapsed().as_secs_f64() * 1e6;
        let (after, model1) = (engine_totals(pe), model_stats(pe));
        pe.barrier()?;
        if let (Some(m0), Some(m1)) = (model0, model1) {
            println!(
                "ep-bench: PE {me} {kind} {call}: {us:.1} us on the host clock; the rate model's waits \
                 {:.1} us summed over the engine's warps",
                m1.wait_ns.saturating_sub(m0.wait_ns) as f64 / 1e3
            );
            let advance = m1.tx_booked_ps.saturating_sub(m0.tx_booked_ps);
            let idle = m1.tx_idle_ps.saturating_sub(m0.tx_idle_ps);
            // The port time the call's WQEs took, to set beside the call's time (the latency
            // rows): what the model itself costs. The jumps include the idle time from the port's
            // last booking before the call to its first in it.
            println!(
                "ep-bench: PE {me} {kind} {call}: the modelled transmitter was booked for {:.1} us (its clock \
                 jumped {:.1} us of idle time, the time before the call's first booking included)",
                advance.saturating_sub(idle) as f64 / 1e6,
                idle as f64 / 1e6
            );
        }
        if let (Some(x), Some(y)) = (before, after) {
            let d: Vec<u64> = y.0.iter().zip(x.0.iter()).map(|(b, a)| b.wrapping_sub(*a)).collect();
            // The QP that did the most in this call, and what it did.
            let per: Vec<Vec<u64>> =
                y.1.iter()
                    .zip(x.1.iter())
                    .map(|(b, a)| b.iter().zip(a).map(|(b, a)| b.wrapping_sub(*a)).collect())
                    .collect();
            let busiest = per.iter().enumerate().max_by_key(|(_, q)| q[0]);
            let active = per.iter().filter(|q| q[0] > 0).count();
            println!(
                "ep-bench: PE {me} {kind} {call}: the emulated NIC executed {} WQEs on {active} QPs in {} busy passes \
                 ({} batches, {} retirements, {} doorbells seen, {} WQEBBs waiting at pass starts, {} ns from doorbell \
                 to pass end summed); engine SM cycles: plan {}, copy {}, complete {}",
                d[0], d[1], d[2], d[4], d[3], d[5], d[9], d[6], d[7], d[8]
            );
            if let Some((i, q)) = busiest {
                println!(
                    "ep-bench: PE {me} {kind} {call}: busiest QP {i}: {} WQEs, {} busy passes, {} batches, {} \
                     WQEBBs waiting at pass starts, {} ns doorbell to pass end summed; cycles plan {}, copy {}, complete {}",
                    q[0], q[1], q[2], q[5], q[9], q[6], q[7], q[8]
                );
            }
        }
    }
    Ok(())
}

/// What the emulated NIC's rate model did on this PE so far (its waits summed over the engine's
/// warps, its transmitter's clock and idle jumps); `None` without the model's device.
fn model_stats(pe: &Pe) -> Option<ibgda::emu::ModelStats> {
    let g = pe.gpu().ok()?.ibgda()?;
    g.transport.emulated()?.device().model_stats().ok()
}

type Row = (String, &'static str, &'static str, u32, f64, &'static str);

fn ht(pe: &Pe, buffer: &Buffer, a: &Args, tokens: u32, system: &str, rows: &mut Vec<Row>) -> Result<()> {
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let (h, k) = (a.hidden as usize, a.topk as usize);
    let all: Vec<Inputs> = (0..ranks).map(|r| inputs(r, tokens, a)).collect();
    let mine = &all[me as usize];
    let t = tokens as usize;
    let x = DeviceVec::from_slice(pe, &mine.x)?;
    let xs = DeviceVec::from_slice(pe, &mine.scales)?;
    let idx = DeviceVec::from_slice(pe, &mine.idx)?;
    let w = DeviceVec::from_slice(pe, &mine.weights)?;
    let lay = LayoutArrays::new(pe, t, ranks, a.experts)?;
    // SAFETY: every pointer is a live DeviceVec of the size the call names.
    unsafe { buffer.layout(pe, idx.ptr(), tokens, a.topk, a.experts, &lay.out())? };
    let g = buffer.ht_geometry("dispatch", a.hidden, a.topk, a.experts, true)?;
    let arrays = HtHandleArrays::new(pe, t, ranks, a.experts)?;
    let handle = arrays.handle(&lay);
    // SAFETY: as above.
    let inf = unsafe {
        buffer.ht_notify(pe, &g, tokens, &handle, idx.ptr(), 0)?;
        buffer.read_info(pe, &g, tokens, &handle)?
    };
    let n = inf[ibgda_ep::geometry::info::recv_offset(ranks, ranks)] as usize;
    let order =
        ibgda_ep::reference::ht_receive_order(&all.iter().map(|i| i.idx.clone()).collect::<Vec<_>>(), k, a.experts, me);
    if n != order.len() {
        return Err(mismatch(
            pe,
            format!("{n} rows arrive, the reference says {}", order.len()),
        ));
    }
    let received = HtRecvArrays::new(pe, n, &g)?;
    let recv = received.recv();
    let (rx, rs) = (&received.x, &received.x_scales);
    let d = HtDispatch {
        x: x.ptr(),
        x_scales: xs.ptr(),
        topk_idx: idx.ptr(),
        topk_weights: w.ptr(),
        tokens,
        hidden: a.hidden,
        topk: a.topk,
        experts: a.experts,
    };
    // SAFETY: as above. The notify above is completed by its dispatch (every notify is).
    unsafe { buffer.ht_dispatch(pe, &g, &d, &handle, &recv)? };
    // A cached dispatch, as DeepEP's benchmark times it: the handle's slots, no count exchange.
    // SAFETY: as above.
    let dispatch = || unsafe {
        buffer.ht_notify_cached(pe, &g, &handle, &inf)?;
        buffer.ht_dispatch(pe, &g, &d, &handle, &recv)
    };
    let t_d = time_us(pe, a.iters, dispatch)?;
    // The same dispatch with the full count exchange again (what every cached dispatch did
    // before `ht_notify_cached`; a fresh routing's dispatch, less the layout and the host's read).
    // SAFETY: as above.
    let t_d_recount = time_us(pe, a.iters, || unsafe {
        buffer.ht_notify(pe, &g, tokens, &handle, 0, 0)?;
        buffer.ht_dispatch(pe, &g, &d, &handle, &recv)
    })?;
    // Sampled rows against the senders' data.
    let got_x: Vec<u8> = rx.read(pe, n * h)?;
    let got_s: Vec<f32> = rs.read(pe, n * h / 128)?;
    let step = (n / 64).max(1);
    for i in (0..n).step_by(step) {
        let (s, tt) = (order[i].0 as usize, order[i].1 as usize);
        if got_x[i * h..(i + 1) * h] != all[s].x[tt * h..(tt + 1) * h]
            || got_s[i * h / 128..(i + 1) * h / 128] != all[s].scales[tt * h / 128..(tt + 1) * h / 128]
        {
            return Err(mismatch(
                pe,
                format!("received row {i} (rank {s} token {tt}) differs from the sender's"),
            ));
        }
    }
    // Combine all-ones rows: each token comes back as the number of ranks it went to.
    let ones = DeviceVec::from_slice(pe, &vec![f32_to_bf16(1.0); n * h])?;
    let out = DeviceVec::zeroed(pe, t * h * 2)?;
    // SAFETY: as above; the dispatch of `handle` ran.
    let combine = || unsafe { buffer.ht_combine(pe, &g, tokens, &handle, ones.ptr(), 0, out.ptr(), 0) };
    let t_c = time_us(pe, a.iters, combine)?;
    let got: Vec<u16> = out.read(pe, t * h)?;
    let (_, _, ref_in) = ibgda_ep::reference::layout(&mine.idx, k, a.experts, ranks);
    for tt in 0..t {
        let want = ref_in[tt * ranks as usize..(tt + 1) * ranks as usize]
            .iter()
            .map(|&b| b as f32)
            .sum::<f32>();
        for c in [0, h / 2, h - 1] {
            if bf16_to_f32(got[tt * h + c]) != want {
                return Err(mismatch(
                    pe,
                    format!(
                        "combined token {tt} channel {c} is {}, want {want}",
                        bf16_to_f32(got[tt * h + c])
                    ),
                ));
            }
        }
    }
    // Where each call's time goes: its kernels in two halves (events between them), timed again
    // after the whole calls above (notify with the send half of a dispatch).
    // SAFETY: as above.
    let (d_send, d_recv) = unsafe {
        time_halves_us(
            pe,
            a.iters,
            || Ok(()),
            || {
                buffer.ht_notify_cached(pe, &g, &handle, &inf)?;
                buffer.ht_dispatch_send(pe, &g, &d, &handle)
            },
            || buffer.ht_dispatch_recv(pe, &g, &handle, &recv),
        )?
    };
    // The count exchange alone (the first half), every notify completed by its dispatch; also
    // with the ranks aligned by a barrier first, so a late rank's start is not counted.
    let notify_us = |aligned: bool| -> Result<f64> {
        // SAFETY: as above.
        let (t, _) = unsafe {
            time_halves_us(
                pe,
                a.iters,
                || if aligned { Ok(pe.barrier()?) } else { Ok(()) },
                || buffer.ht_notify(pe, &g, tokens, &handle, 0, 0),
                || buffer.ht_dispatch(pe, &g, &d, &handle, &recv),
            )?
        };
        Ok(t)
    };
    let (d_notify, d_notify_aligned) = (notify_us(false)?, notify_us(true)?);
    // SAFETY: as above.
    let (c_send, c_reduce) = unsafe {
        time_halves_us(
            pe,
            a.iters,
            || Ok(()),
            || buffer.ht_combine_send(pe, &g, &handle, ones.ptr(), 0),
            || buffer.ht_combine_reduce(pe, &g, tokens, &handle, ones.ptr(), 0, out.ptr(), 0),
        )?
    };
    // The receive halves alone: every rank's send half finished first (the waits inside them then
    // find everything there), so what is left is the receivers' own work.
    // SAFETY: as above.
    let (_, d_recv_only) = unsafe {
        time_halves_us(
            pe,
            a.iters,
            || {
                buffer.ht_notify_cached(pe, &g, &handle, &inf)?;
                buffer.ht_dispatch_send(pe, &g, &d, &handle)?;
                pe.synchronize()?;
                Ok(pe.barrier()?)
            },
            || Ok(()),
            || buffer.ht_dispatch_recv(pe, &g, &handle, &recv),
        )?
    };
    // SAFETY: as above.
    let (_, c_reduce_only) = unsafe {
        time_halves_us(
            pe,
            a.iters,
            || {
                buffer.ht_combine_send(pe, &g, &handle, ones.ptr(), 0)?;
                pe.synchronize()?;
                Ok(pe.barrier()?)
            },
            || Ok(()),
            || buffer.ht_combine_reduce(pe, &g, tokens, &handle, ones.ptr(), 0, out.ptr(), 0),
        )?
    };
    nic_evidence(pe, "high-throughput", &[("dispatch", &dispatch), ("combine", &combine)])?;
    let bd = n as f64 * h as f64 * (1.0 + 4.0 / 128.0);
    let bc = n as f64 * h as f64 * 2.0;
    rows.push((system.into(), "ht", "dispatch_bw", tokens, bd / t_d / 1e3, "GB/s"));
    rows.push((system.into(), "ht", "combine_bw", tokens, bc / t_c / 1e3, "GB/s"));
    rows.push((system.into(), "ht", "dispatch_latency", tokens, t_d, "us"));
    rows.push((system.into(), "ht", "combine_latency", tokens, t_c, "us"));
    rows.push((
        system.into(),
        "ht",
        "dispatch_recount_latency",
        tokens,
        t_d_recount,
        "us",
    ));
    rows.push((system.into(), "ht", "dispatch_notify_latency", tokens, d_notify, "us"));
    rows.push((
        system.into(),
        "ht",
        "dispatch_notify_aligned_latency",
        tokens,
        d_notify_aligned,
        "us",
    ));
    rows.push((system.into(), "ht", "dispatch_send_latency", tokens, d_send, "us"));
    rows.push((system.into(), "ht", "dispatch_recv_latency", tokens, d_recv, "us"));
    rows.push((system.into(), "ht", "combine_send_latency", tokens, c_send, "us"));
    rows.push((system.into(), "ht", "combine_reduce_latency", tokens, c_reduce, "us"));
    rows.push((
        system.into(),
        "ht",
        "dispatch_recv_only_latency",
        tokens,
        d_recv_only,
        "us",
    ));
    rows.push((
        system.into(),
        "ht",
        "combine_reduce_only_latency",
        tokens,
        c_reduce_only,
        "us",
    ));
    Ok(())
}

fn ll(pe: &Pe, buffer: &Buffer, a: &Args, system: &str, rows: &mut Vec<Row>) -> Result<()> {
    let (me, ranks) = (pe.my_pe(), pe.n_pes());
    let (h, k, t) = (a.hidden as usize, a.topk as usize, a.ll_tokens as usize);
    let all: Vec<Inputs> = (0..ranks).map(|r| inputs(r, a.ll_tokens, a)).collect();
    let mine = &all[me as usize];
    let g = buffer.ll_geometry(
        "low_latency_dispatch",
        a.ll_tokens,
        a.ll_tokens,
        a.hidden,
        a.topk,
        a.experts,
        true,
    )?;
    let el = g.local_experts as usize;
    let rows_per_expert = ranks as usize * t;
    let mut rng = StdRng::seed_from_u64(me as u64);
    let xb: Vec<u16> = (0..t * h)
        .map(|_| f32_to_bf16(rng.random_range(-2.0f32..2.0)))
        .collect();
    let x = DeviceVec::from_slice(pe, &xb)?;
    let idx = DeviceVec::from_slice(pe, &mine.idx)?;
    let w = DeviceVec::from_slice(pe, &mine.weights)?;
    let arrays = LlArrays::new(pe, &g, ranks)?;
    let (handle, recv) = (arrays.handle(), arrays.recv());
    let d = LlDispatch {
        x: x.ptr(),
        topk_idx: idx.ptr(),
        tokens: a.ll_tokens,
        max_tokens: a.ll_tokens,
        hidden: a.hidden,
        topk: a.topk,
        experts: a.experts,
        fp8: true,
    };
    // SAFETY: every pointer is a live DeviceVec of the size the call names.
    let dispatch = || unsafe { buffer.ll_dispatch(pe, &g, &d, &handle, &recv) };
    let ones = DeviceVec::from_slice(pe, &vec![f32_to_bf16(1.0); el * rows_per_expert * h])?;
    let out = DeviceVec::zeroed(pe, t * h * 2)?;
    let c = LlCombine {
        x: ones.ptr(),
        topk_idx: idx.ptr(),
        topk_weights: w.ptr(),
        out: out.ptr(),
    };
    // SAFETY: as above, after the dispatch that filled `handle`.
    let combine = || unsafe { buffer.ll_combine(pe, &g, a.ll_tokens, &c, &handle) };
    let t_d = time_us(pe, a.iters, dispatch)?;
    let t_both = time_us(pe, a.iters, || {
        dispatch()?;
        combine()
    })?;
    // Where each call waits: its send and receive halves, and what the NIC did for one round.
    // SAFETY: as `dispatch` and `combine`.
    let (d_send, d_recv) = time_halves_us(
        pe,
        a.iters,
        || Ok(()),
        || unsafe { buffer.ll_dispatch_send(pe, &g, &d, &handle) },
        || unsafe { buffer.ll_dispatch_recv(pe, &g, &handle, &recv) },
    )?;
    // SAFETY: as above; each combine follows a dispatch, as `handle` needs.
    let (c_send, c_recv) = time_halves_us(
        pe,
        a.iters,
        dispatch,
        || unsafe { buffer.ll_combine_send(pe, &g, &c, &handle) },
        || unsafe { buffer.ll_combine_recv(pe, &g, a.ll_tokens, &c, &handle) },
    )?;
    nic_evidence(pe, "low-latency", &[("dispatch", &dispatch), ("combine", &combine)])?;
    // One more call, checked below: each half launched alone, rank 0's sends 20 ms late. The
    // other ranks' receive halves spin until its rows come; on a GPU that PEs share they must
    // leave SMs for its send halves (`LlLaunch::waiting_blocks`), or it never starts.
    let late = || {
        if me == 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    late();
    // SAFETY: as `dispatch` and `combine`.
    unsafe {
        buffer.ll_dispatch_send(pe, &g, &d, &handle)?;
        buffer.ll_dispatch_recv(pe, &g, &handle, &recv)?;
    }
    late();
    // SAFETY: as above.
    unsafe {
        buffer.ll_combine_send(pe, &g, &c, &handle)?;
        buffer.ll_combine_recv(pe, &g, a.ll_tokens, &c, &handle)?;
    }
    pe.synchronize()?;
    // Checks (of that last call): each local expert's count, and each token's weighted sum of
    // all-ones rows.
    let got_count: Vec<i32> = arrays.count.read(pe, el)?;
    for (le, &got_n) in got_count.iter().enumerate() {
        let e = (me as usize * el + le) as i64;
        let want: usize = all.iter().map(|i| i.idx.iter().filter(|&&x| x == e).count()).sum();
        if got_n as usize != want {
            return Err(mismatch(
                pe,
                format!("local expert {le} received {got_n} tokens, want {want}"),
            ));
        }
    }
    let got: Vec<u16> = out.read(pe, t * h)?;
    for tt in 0..t {
        let want: f32 = mine.weights[tt * k..(tt + 1) * k].iter().sum();
        let v = bf16_to_f32(got[tt * h]);
        if (v - want).abs() > want.abs() / 64.0 + 1e-3 {
            return Err(mismatch(
                pe,
                format!("low-latency combined token {tt} is {v}, want {want}"),
            ));
        }
    }
    let sel = (t * k) as f64;
    rows.push((system.into(), "ll", "dispatch_latency", a.ll_tokens, t_d, "us"));
    rows.push((system.into(), "ll", "combine_latency", a.ll_tokens, t_both - t_d, "us"));
    for (metric, v) in [
        ("dispatch_send_latency", d_send),
        ("dispatch_recv_latency", d_recv),
        ("combine_send_latency", c_send),
        ("combine_recv_latency", c_recv),
    ] {
        rows.push((system.into(), "ll", metric, a.ll_tokens, v, "us"));
    }
    rows.push((
        system.into(),
        "ll",
        "dispatch_bw",
        a.ll_tokens,
        sel * (h as f64 * (1.0 + 4.0 / 128.0) + 16.0) / t_d / 1e3,
        "GB/s",
    ));
    rows.push((
        system.into(),
        "ll",
        "combine_bw",
        a.ll_tokens,
        sel * h as f64 * 2.0 / (t_both - t_d).max(1e-3) / 1e3,
        "GB/s",
    ));
    Ok(())
}

fn one(pe: &mut Pe, a: &Args) -> Result<Vec<Row>> {
    let sweep: Vec<u32> = a
        .tokens
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| mismatch(pe, format!("--tokens: {s:?} is not a number")))
        })
        .collect::<Result<_>>()?;
    let max = sweep.iter().copied().max().unwrap_or(1);
    let ranks = pe.n_pes();
    let config = BufferConfig {
        num_nvl_bytes: Buffer::ht_size_hint(ranks, max as u64, a.hidden, a.topk, true),
        num_rdma_bytes: Buffer::ll_size_hint(a.ll_tokens.max(1), a.hidden, ranks, a.experts),
        num_sms: a.num_sms,
        ..BufferConfig::default()
    };
    let buffer = Buffer::new(pe, config)?;
    let transport = pe
        .transport_to((pe.my_pe() + 1) % ranks)
        .map_or("local".to_string(), |t| format!("{t:?}").to_lowercase());
    let system = a.system.clone().unwrap_or_else(|| format!("ibgda-ep/{transport}"));
    let mut rows = Vec::new();
    for &tokens in &sweep {
        ht(pe, &buffer, a, tokens, &system, &mut rows)?;
    }
    if a.ll_tokens > 0 {
        ll(pe, &buffer, a, &system, &mut rows)?;
    }
    buffer.destroy(pe)?;
    Ok(rows)
}

/// Prints the rows (`pe_rows`: every PE's in one process, or rank 0's of a launched job of
/// `n_pes`).
fn report(a: &Args, pe_rows: &[Vec<Row>], n_pes: u32, where_: &str) {
    let Some(rows) = pe_rows.first() else { return };
    println!(
        "ep-bench: {n_pes} PEs ({where_}), hidden {}, top-{} of {} experts, {} SMs; every result checked",
        a.hidden, a.topk, a.experts, a.num_sms
    );
    for r in rows {
        println!(
            "  {:16} {:2} {:17} tokens={:5} {:10.2} {}",
            r.0, r.1, r.2, r.3, r.4, r.5
        );
    }
    if let Some(path) = &a.csv {
        use std::io::Write;
        let new = !std::path::Path::new(path).exists();
        match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(mut f) => {
                if new {
                    let _ = writeln!(f, "system,mode,metric,tokens,value,unit");
                }
                for r in rows {
                    let _ = writeln!(f, "{},{},{},{},{:.3},{}", r.0, r.1, r.2, r.3, r.4, r.5);
                }
            }
            Err(e) => eprintln!("ep-bench: cannot write {path}: {e}"),
        }
    }
}

/// The symmetric heap the buffer needs ([`Buffer::heap_bytes_for`], as the Python package sizes
/// it; a larger `IBGDA_SYMMETRIC_SIZE` stays).
fn sized(mut config: Config, a: &Args, ranks: u32) -> Config {
    let max = a
        .tokens
        .split(',')
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(1);
    let need = Buffer::heap_bytes_for(
        Buffer::ht_size_hint(ranks, max, a.hidden, a.topk, true),
        Buffer::ll_size_hint(a.ll_tokens.max(1), a.hidden, ranks, a.experts),
    );
    config.heap_size = config.heap_size.max(need);
    config
}

fn main() {
    let a = Args::parse();
    let result = (|| -> Result<()> {
        let world = std::env::var("WORLD_SIZE").ok().and_then(|w| w.parse().ok());
        let config = sized(Config::from_env()?, &a, world.unwrap_or(a.pes));
        if std::env::var_os("WORLD_SIZE").is_some() {
            let mut pe = Pe::from_env(config)?;
            match one(&mut pe, &a) {
                Ok(rows) => {
                    let gpu = pe.is_gpu();
                    let (rank, n_pes) = (pe.my_pe(), pe.n_pes());
                    pe.finalize()?;
                    if rank == 0 {
                        report(
                            &a,
                            &[rows],
                            n_pes,
                            if gpu {
                                "processes, GPU"
                            } else {
                                "processes, CPU emulation"
                            },
                        );
                    }
                    Ok(())
                }
                Err(e) => {
                    pe.abort();
                    Err(e)
                }
            }
        } else {
            let a2 = a.clone();
            let per_pe = run_in_process(a.pes, config, move |pe| Ok(one(pe, &a2)))?;
            let rows: Vec<Vec<Row>> = per_pe.into_iter().collect::<Result<_>>()?;
            report(&a, &rows, a.pes, "threads");
            Ok(())
        }
    })();
    if let Err(e) = result {
        eprintln!("ep-bench: {e}");
        std::process::exit(1);
    }
}

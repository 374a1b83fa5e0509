//! Transport benchmark, comparable with `shared/baselines/nvshmem_bench.cu` run on the same
//! machine: block-scope `put_nbi` bandwidth PE 0 -> PE 1 (8 KiB to 128 MiB, 32 and 132 blocks),
//! 8-byte `p` message rate over thread counts, and `p` + `signal_wait_until` ping-pong latency,
//! over the transport `IBGDA_TRANSPORT` selects (P2P by default; `ibgda` goes through the
//! emulated mlx5 device's GPU engine, `IBGDA_DOORBELL=cpu` adds the CPU-assisted doorbell).
//! Over IBGDA, `--engine-capacity` also measures the emulated NIC itself: WQEs are posted to a
//! paused NIC (up to a 32K-deep send queue per QP), then the NIC is resumed and the drain timed.
//!
//! Timed with CUDA events after a warm-up launch; each figure is the median of `--reps` launches;
//! the source is random and the destination is checked against it after each size.

use clap::Parser;
use ibgda::{run_in_process, Config, KernelArg, Pe};
use rand::{Rng, SeedableRng};
use std::io::Write;

#[derive(Parser, Debug, Clone)]
#[command(about = "P2P put bandwidth, p rate and ping-pong latency between two PEs")]
struct Args {
    /// Repetitions per point (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 128 << 20)]
    max_bytes: usize,
    /// CSV output file.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Also append every row to this CSV as `layout,metric,x,value,unit` (layout `threads` or
    /// `processes`, x = 2 PEs): run once as threads and once under `ibgda-run -n 2` into the
    /// same file to compare the layouts (`docs/results/multiprocess-2gpu.csv`).
    #[arg(long)]
    layout_csv: Option<std::path::PathBuf>,
    /// Block counts for the bandwidth sweep.
    #[arg(long, value_delimiter = ',', default_value = "32,132")]
    blocks: Vec<u32>,
    /// Thread counts for the `p` message-rate sweep.
    #[arg(long, value_delimiter = ',', default_value = "32768,135168")]
    rate_threads: Vec<u32>,
    /// `p` calls per thread in the message-rate test.
    #[arg(long, default_value_t = 1000)]
    rate_iters: u32,
    /// Ping-pong round trips per repetition.
    #[arg(long, default_value_t = 10_000)]
    pingpong_iters: u32,
    /// Over IBGDA: time the emulated NIC draining pre-posted WQEs (8 B, 4 KiB, 64 KiB writes).
    #[arg(long)]
    engine_capacity: bool,
    /// Over IBGDA: where one operation's latency goes (`diag_latency_breakdown`): the post, the
    /// wait for its completion, and the memory primitives both are made of, in SM cycles and ns.
    #[arg(long)]
    latency_breakdown: bool,
    /// Over P2P: also time each copy strategy alone (SM copies with 4 and 8 loads in flight per
    /// thread, and one thread driving the bulk-copy unit) in the bandwidth kernel's shape, and the
    /// host-initiated copy-engine put (`Pe::put_on_stream`).
    #[arg(long)]
    copy_variants: bool,
    /// Write the figures NVSHMEM's program also measures to this CSV as
    /// `system,metric,x,value,unit` (system `ibgda-rs`; `put_bw` per size at the better block
    /// count, `put_bw_<n>blocks`, `p_rate` per thread count, `p_pingpong`).
    #[arg(long)]
    compare_csv: Option<std::path::PathBuf>,
    /// Instead of measuring: append the figures of a log of `shared/baselines/nvshmem_bench.cu`
    /// to `--compare-csv` as system `nvshmem`, then print the ratio table of the two systems.
    #[arg(long)]
    nvshmem_log: Option<std::path::PathBuf>,
}

/// A row of the comparison with NVSHMEM: metric, x, value, unit.
type CompareRow = (String, u64, f64, &'static str);

/// A result row: operation, configuration, value, unit.
type Row = (String, String, f64, String);

fn cfg(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Median of `reps` timed launches (ms), after one warm-up.
fn time_ms(pe: &Pe, reps: usize, mut launch: impl FnMut() -> ibgda::Result<()>) -> ibgda::Result<f64> {
    let ctx = pe.gpu()?.context();
    let err = |source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source };
    launch()?;
    pe.synchronize()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (a, b) = (
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?,
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?,
        );
        a.record(pe.gpu()?.stream()).map_err(err)?;
        launch()?;
        b.record(pe.gpu()?.stream()).map_err(err)?;
        pe.synchronize()?;
        v.push(a.elapsed_ms(&b).map_err(err)? as f64);
    }
    Ok(median(v))
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// The emulated NIC's own drain capacity as rows (see [`ibgda_examples::engine`]).
fn engine_capacity(
    pe: &Pe,
    a: &Args,
    dst: &ibgda::SymmetricBuffer<u8>,
    src: &ibgda::SymmetricBuffer<u8>,
    rows: &mut Vec<(String, String, f64, String)>,
) -> ibgda::Result<()> {
    let mut points = ibgda_examples::engine::drain_capacity(pe, dst, src, &[8, 4096, 65536], false, a.reps)?;
    points.extend(ibgda_examples::engine::drain_capacity(
        pe,
        dst,
        src,
        &[65536],
        true,
        a.reps,
    )?);
    for p in points {
        let op = if p.read { "READ" } else { "WRITE" };
        let what = format!("{op} {} B, {} QPs x {}", p.bytes, p.qps, p.wqes_per_qp);
        rows.push((
            "emulated NIC drain".into(),
            what.clone(),
            p.wqe_rate_mops,
            "M WQE/s".into(),
        ));
        rows.push(("emulated NIC drain".into(), what, p.gbps, "GB/s".into()));
    }
    Ok(())
}

/// One PE's part of the benchmark (the same as a thread or as a process); rows on PE 0.
fn bench(pe: &mut Pe, a: &Args) -> ibgda::Result<(Vec<Row>, Vec<CompareRow>)> {
    ibgda_bundled::load(pe)?;
    let mut rows: Vec<Row> = Vec::new();
    let mut compare: Vec<CompareRow> = Vec::new();
    let src = pe.malloc::<u8>(a.max_bytes)?;
    let dst = pe.malloc::<u8>(a.max_bytes)?;
    let max_threads = a.rate_threads.iter().copied().max().unwrap_or(1) as usize;
    let parr = pe.malloc::<u64>(max_threads)?;
    let transport = format!("{:?}", pe.transport_to(1 - pe.my_pe()).expect("peer"));
    let flag = pe.malloc::<u64>(1)?;
    // Where `--latency-breakdown` writes its figures.
    let diag_out = pe.malloc::<u64>(20)?;
    let me = pe.my_pe();
    let peer = 1 - me;
    let mut r = rand::rngs::StdRng::seed_from_u64(42 + me as u64);
    let data: Vec<u8> = (0..a.max_bytes).map(|_| r.random()).collect();
    pe.write(&src, 0, &data)?;
    pe.barrier()?;
    let st = pe.state_ptr();
    // Blocks of 1024 threads as in NVSHMEM's program, unless the kernel's register use caps it.
    let tpb = |name: &str| -> ibgda::Result<u32> {
        let f = ibgda_bundled::function(pe, name)?;
        let max = f
            .max_threads_per_block()
            .map_err(|e| ibgda::Error::KernelFailed { pe: me, source: e })?;
        // A power of two, so thread counts divide evenly.
        Ok(1u32 << (31 - (max as u32).min(1024).leading_zeros()))
    };
    let bw_threads = tpb("ibgda_put_bw_block")?;
    let p_threads = tpb("ibgda_p_rate")?;
    if me == 0 && (bw_threads < 1024 || p_threads < 1024) {
        eprintln!("note: register use caps blocks at {bw_threads} (put_bw) / {p_threads} (p_rate) threads");
    }
    for &blocks in &a.blocks {
        let mut bytes = 8192usize;
        while bytes <= a.max_bytes {
            if me == 0 {
                let iters: u32 = if bytes >= 16 << 20 { 20 } else { 200 };
                let args: [KernelArg; 6] = [
                    st.into(),
                    pe.ptr(&dst)?.into(),
                    pe.ptr(&src)?.into(),
                    (bytes as u64).into(),
                    peer.into(),
                    iters.into(),
                ];
                // SAFETY: ibgda_put_bw_block(state, dst, src, bytes, peer, iters).
                let ms = time_ms(pe, a.reps, || unsafe {
                    ibgda_bundled::launch(pe, "ibgda_put_bw_block", cfg(blocks, bw_threads), &args)
                })?;
                let gbs = bytes as f64 * iters as f64 / ms / 1e6;
                rows.push((
                    "put_nbi_block".into(),
                    format!("blocks={blocks}x{bw_threads} bytes={bytes}"),
                    gbs,
                    "GB/s".into(),
                ));
                compare.push((format!("put_bw_{blocks}blocks"), bytes as u64, gbs, "GB/s"));
            }
            pe.barrier()?;
            if me == 1 {
                // Every byte the blocks covered (bytes rounded down to a multiple of blocks).
                check_received(pe, &dst, bytes / blocks as usize * blocks as usize, "put_nbi_block")?;
            }
            pe.barrier()?;
            bytes *= 4;
        }
    }
    for &threads in &a.rate_threads {
        if me == 0 {
            let iters = a.rate_iters;
            let args: [KernelArg; 5] = [st.into(), pe.ptr(&parr)?.into(), peer.into(), iters.into(), 1u32.into()];
            // SAFETY: ibgda_p_rate(state, dst, peer, iters, stride 1) with dst holding `threads` u64s.
            let ms = time_ms(pe, a.reps, || unsafe {
                ibgda_bundled::launch(pe, "ibgda_p_rate", cfg(threads / p_threads, p_threads), &args)
            })?;
            let mops = threads as f64 * iters as f64 / ms / 1e3;
            rows.push(("p (8 B)".into(), format!("threads={threads}"), mops, "Mops/s".into()));
            compare.push(("p_rate".into(), threads as u64, mops, "Mops/s"));
        }
        pe.barrier()?;
        if me == 1 {
            let v = pe.read(&parr, 0, threads as usize)?;
            if v.iter().any(|&x| x != a.rate_iters as u64 - 1) {
                return Err(ibgda::Error::Config {
                    name: "check",
                    value: "p_rate".into(),
                    why: "last p value not rate_iters - 1".into(),
                });
            }
        }
        pe.barrier()?;
    }
    // Two ping-pongs: NVSHMEM's form (`p` + `wait_until`), and `signal_op` + `signal_wait_until`
    // (a release store: the signal orders the data before it).
    for (kernel, name) in [
        ("ibgda_p_pingpong", "p+wait_until ping-pong"),
        ("ibgda_pingpong", "signal_op+signal_wait ping-pong"),
    ] {
        let us = pingpong(pe, kernel, &flag, a)?;
        if me == 0 {
            rows.push((name.into(), "1 thread each".into(), us, "us/round trip".into()));
            if kernel == "ibgda_p_pingpong" {
                compare.push(("p_pingpong".into(), 1, us, "us"));
            }
        }
    }
    if a.copy_variants && pe.transport_to(peer) == Some(ibgda::abi::TransportKind::P2p) {
        copy_variants(pe, a, &dst, &src, bw_threads, &mut rows)?;
        copy_engine(pe, a, &dst, &src, &mut rows, &mut compare)?;
    }
    if a.latency_breakdown && pe.transport_to(peer) == Some(ibgda::abi::TransportKind::Ibgda) {
        latency_breakdown(pe, a, &dst, &flag, &diag_out, &mut rows)?;
    }
    if a.engine_capacity && pe.transport_to(peer) == Some(ibgda::abi::TransportKind::Ibgda) {
        engine_capacity(pe, a, &dst, &src, &mut rows)?;
    }
    if let Some(g) = pe.gpu()?.ibgda() {
        for (i, s) in g.qp_stats()?.iter().enumerate() {
            eprintln!(
                "PE {me} QP {i}: {} WQEs executed, {} doorbells seen, {} recovered from the DBR, {} CPU doorbells",
                s.wqes_executed,
                s.doorbells_seen,
                s.doorbells_recovered,
                g.cpu_doorbells_rung()
            );
        }
    }
    for r in rows.iter_mut() {
        r.0 = format!("{transport}/{}", r.0);
    }
    Ok((rows, compare))
}

/// Median round trip (µs) of `kernel(state, flag, peer, iters)` run by one thread on each PE.
fn pingpong(pe: &Pe, kernel: &str, flag: &ibgda::SymmetricBuffer<u64>, a: &Args) -> ibgda::Result<f64> {
    let me = pe.my_pe();
    let iters = a.pingpong_iters;
    let mut lat = Vec::new();
    // One untimed round first (module and peer mappings warm), as NVSHMEM's program does.
    for rep in 0..a.reps.max(1) + 1 {
        pe.write(flag, 0, &[0])?;
        pe.barrier()?;
        let args: [KernelArg; 4] = [
            pe.state_ptr().into(),
            pe.ptr(flag)?.into(),
            (1 - me).into(),
            iters.into(),
        ];
        let ctx = pe.gpu()?.context();
        let err = |source| ibgda::Error::KernelFailed { pe: me, source };
        let (e0, e1) = (
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?,
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?,
        );
        e0.record(pe.gpu()?.stream()).map_err(err)?;
        // SAFETY: `kernel(state, flag, peer, iters)`; both PEs launch it.
        unsafe { ibgda_bundled::launch(pe, kernel, cfg(1, 1), &args)? };
        e1.record(pe.gpu()?.stream()).map_err(err)?;
        pe.synchronize()?;
        if rep > 0 {
            lat.push(e0.elapsed_ms(&e1).map_err(err)? as f64 * 1000.0 / iters as f64);
        }
        pe.barrier()?;
    }
    let last = pe.read(flag, 0, 1)?[0];
    if last != iters as u64 {
        return Err(ibgda::Error::Config {
            name: "check",
            value: kernel.into(),
            why: format!("the flag ended at {last}, not {iters}"),
        });
    }
    Ok(median(lat))
}

/// Rows of `diag_latency_breakdown` (PE 0's thread; collective): for `p`, `put_signal_nbi` and a
/// blocking fetch-add, the mean post, the mean wait, and the wait split at the moments the engine
/// learned the doorbell and finished its pass (sums of `%globaltimer` readings on one GPU, so
/// only when the engine serving PE 0's QPs runs on PE 0's GPU, which the emulated NIC's does);
/// then the memory primitives, in SM cycles converted to ns.
fn latency_breakdown(
    pe: &Pe,
    a: &Args,
    dst: &ibgda::SymmetricBuffer<u8>,
    flag: &ibgda::SymmetricBuffer<u64>,
    out: &ibgda::SymmetricBuffer<u64>,
    rows: &mut Vec<Row>,
) -> ibgda::Result<()> {
    let me = pe.my_pe();
    let iters = a.pingpong_iters.clamp(1, 2000);
    let gpu = pe.gpu()?;
    // The engine's sums over this PE's QPs: doorbells seen, learned ns, finished ns, and the
    // batch path's cycles (plan, copy, complete).
    let engine_sums = || -> ibgda::Result<[u64; 8]> {
        let mut t = [0u64; 8];
        if let Some(g) = gpu.ibgda() {
            for s in g.qp_stats()? {
                for (k, x) in [
                    s.doorbells_seen + s.doorbells_recovered,
                    s.learned_ns_sum,
                    s.finished_ns_sum,
                    s.cycles_plan,
                    s.cycles_copy,
                    s.cycles_complete,
                    s.ready_ns_sum,
                    s.retired_ns_sum,
                ]
                .into_iter()
                .enumerate()
                {
                    t[k] = t[k].wrapping_add(x);
                }
            }
        }
        Ok(t)
    };
    // What the rate model made the engine wait in total (0 without the model or the NIC).
    let model_wait_ns = || -> ibgda::Result<u64> {
        match gpu.ibgda().and_then(|g| g.transport.emulated()) {
            Some(e) => Ok(e.device().model_stats()?.wait_ns),
            None => Ok(0),
        }
    };
    for (mode, op) in [
        (0u32, "p"),
        (4, "post_inline_write 8 B (raw QP)"),
        (1, "put_signal_nbi 8 B"),
        (2, "atomic_fetch_add"),
        (3, ""),
    ] {
        pe.write(out, 0, &[0; 20])?;
        pe.barrier()?;
        let before = engine_sums()?;
        let wait_before = model_wait_ns()?;
        let args: [KernelArg; 7] = [
            pe.state_ptr().into(),
            mode.into(),
            pe.ptr(dst)?.into(),
            pe.ptr(flag)?.into(),
            pe.ptr(out)?.into(),
            (1 - me).into(),
            iters.into(),
        ];
        // SAFETY: `diag_latency_breakdown(state, mode, buf, sig, out, peer, iters)` with `buf` (8
        // bytes used) and `sig` symmetric, `out` 20 words; every PE launches it.
        unsafe { ibgda_bundled::launch(pe, "diag_latency_breakdown", cfg(1, 1), &args)? };
        pe.synchronize()?;
        let after = engine_sums()?;
        let waited_ns = model_wait_ns()?.wrapping_sub(wait_before);
        pe.barrier()?;
        if me != 0 {
            continue;
        }
        let v = pe.read(out, 0, 20)?;
        let per_ns = v[0] as f64 / 1000.0;
        if per_ns <= 0.0 {
            return Err(ibgda::Error::Config {
                name: "check",
                value: "diag_latency_breakdown".into(),
                why: "the kernel wrote no clock rate".into(),
            });
        }
        let mut row = |what: String, cycles: f64| {
            rows.push((
                format!("latency breakdown: {what}"),
                format!("{cycles:.0} cycles"),
                cycles / per_ns,
                "ns".into(),
            ))
        };
        if mode != 3 {
            let n = iters as f64;
            row(format!("{op}: post"), v[1] as f64 / n);
            row(format!("{op}: wait"), v[2] as f64 / n);
            let delta = |k: usize| after[k].wrapping_sub(before[k]);
            let doorbells = delta(0);
            if doorbells == iters as u64 {
                // Mean (engine moment - poster moment) in ns, back to cycles for the row.
                let gap = |later: u64, earlier: u64| later.wrapping_sub(earlier) as i64 as f64 / n * per_ns;
                let (learned, finished) = (delta(1), delta(2));
                row(
                    format!("{op}: post returned -> engine learned the doorbell"),
                    gap(learned, v[4]),
                );
                let (ready, retired) = (delta(6), delta(7));
                row(format!("{op}: engine learned -> pass finished"), gap(finished, learned));
                row(format!("{op}:   learned -> first batch ready"), gap(ready, learned));
                row(format!("{op}:   ready -> last WQE retired"), gap(retired, ready));
                row(format!("{op}:     of which batch planning"), delta(3) as f64 / n);
                row(format!("{op}:     of which batch execution"), delta(4) as f64 / n);
                row(format!("{op}:     of which batch retirement"), delta(5) as f64 / n);
                // Whether the rate model held the operation (the engine's own work was slower
                // than the modelled NIC when this is 0).
                row(
                    format!("{op}:     of which the rate model's wait"),
                    waited_ns as f64 / n * per_ns,
                );
                row(
                    format!("{op}:   retired -> statistics published"),
                    gap(finished, retired),
                );
                row(format!("{op}: pass finished -> wait returned"), gap(v[5], finished));
            } else {
                eprintln!("latency breakdown: {op}: the engine saw {doorbells} doorbells for {iters} posts; no split");
            }
        } else {
            for (k, name) in [
                "ld.acquire.gpu, dependent (own heap)",
                "ld.acquire.sys, dependent (own heap)",
                "atom.relaxed.gpu.add, dependent (own heap)",
                "atom.acq_rel.sys.add, dependent (own heap)",
                "atom.acq_rel.gpu.cas, dependent (own heap)",
                "fence.sc.gpu",
                "fence.sc.sys",
                "fence.acq_rel.sys",
                "%globaltimer read",
                "nanosleep(32)",
                "atom.relaxed.sys.add, dependent (own heap)",
                "rate-model port booking at system scope (red.max + atom.add)",
                "rate-model port booking at GPU scope (red.max + atom.add)",
            ]
            .iter()
            .enumerate()
            {
                row(name.to_string(), v[6 + k] as f64);
            }
            // Not cycles: the model's clock (the global timer) and its resolution.
            rows.push((
                "latency breakdown: %globaltimer smallest step".into(),
                format!("{} ns", v[19]),
                v[19] as f64,
                "ns".into(),
            ));
        }
    }
    Ok(())
}

/// Each copy strategy alone in the bandwidth kernel's shape (PE 0 to PE 1 over P2P), every size
/// checked on PE 1. Collective.
fn copy_variants(
    pe: &Pe,
    a: &Args,
    dst: &ibgda::SymmetricBuffer<u8>,
    src: &ibgda::SymmetricBuffer<u8>,
    bw_threads: u32,
    rows: &mut Vec<Row>,
) -> ibgda::Result<()> {
    let me = pe.my_pe();
    for (kernel, name) in [
        ("diag_copy_bw_sm4", "sm copy x4"),
        ("diag_copy_bw_sm4_routed", "sm copy x4 routed per call"),
        ("diag_copy_bw_sm8", "sm copy x8"),
        ("diag_copy_bw_bulk", "bulk copy"),
    ] {
        let f = ibgda_bundled::function(pe, kernel)?;
        let max = f
            .max_threads_per_block()
            .map_err(|e| ibgda::Error::KernelFailed { pe: me, source: e })?;
        // The put kernel's block size (or less, if this kernel's registers allow fewer), so the
        // rows differ in the copy alone.
        let threads = 1u32 << (31 - (max as u32).min(bw_threads).leading_zeros());
        for &blocks in &a.blocks {
            let mut bytes = 8192usize;
            while bytes <= a.max_bytes {
                pe.write(dst, 0, &vec![0u8; bytes])?;
                pe.barrier()?;
                if me == 0 {
                    let iters: u32 = if bytes >= 16 << 20 { 20 } else { 200 };
                    let args: [KernelArg; 6] = [
                        pe.state_ptr().into(),
                        pe.ptr(dst)?.into(),
                        pe.ptr(src)?.into(),
                        (bytes as u64).into(),
                        1u32.into(),
                        iters.into(),
                    ];
                    // SAFETY: diag_copy_bw_*(state, dst, src, bytes, peer, iters).
                    let ms = time_ms(pe, a.reps, || unsafe {
                        ibgda_bundled::launch(pe, kernel, cfg(blocks, threads), &args)
                    })?;
                    rows.push((
                        format!("copy variant: {name}"),
                        format!("blocks={blocks}x{threads} bytes={bytes}"),
                        bytes as f64 * iters as f64 / ms / 1e6,
                        "GB/s".into(),
                    ));
                }
                pe.barrier()?;
                if me == 1 {
                    check_received(pe, dst, bytes / blocks as usize * blocks as usize, name)?;
                }
                pe.barrier()?;
                bytes *= 4;
            }
        }
    }
    Ok(())
}

/// Host-initiated puts through the copy engine (`Pe::put_on_stream`), PE 0 to PE 1: `iters`
/// copies of each size enqueued back to back, timed with CUDA events, checked on PE 1. Collective.
fn copy_engine(
    pe: &Pe,
    a: &Args,
    dst: &ibgda::SymmetricBuffer<u8>,
    src: &ibgda::SymmetricBuffer<u8>,
    rows: &mut Vec<Row>,
    compare: &mut Vec<CompareRow>,
) -> ibgda::Result<()> {
    let me = pe.my_pe();
    let mut bytes = 8192usize;
    while bytes <= a.max_bytes {
        pe.write(dst, 0, &vec![0u8; bytes])?;
        pe.barrier()?;
        if me == 0 {
            let iters: u32 = if bytes >= 16 << 20 { 20 } else { 200 };
            let ms = time_ms(pe, a.reps, || {
                for _ in 0..iters {
                    pe.put_on_stream(dst, 0, src, 0, bytes, 1)?;
                }
                Ok(())
            })?;
            let gbs = bytes as f64 * iters as f64 / ms / 1e6;
            rows.push((
                "put_on_stream (copy engine)".into(),
                format!("bytes={bytes}"),
                gbs,
                "GB/s".into(),
            ));
            compare.push(("put_on_stream_bw".into(), bytes as u64, gbs, "GB/s"));
        }
        pe.barrier()?;
        if me == 1 {
            check_received(pe, dst, bytes, "put_on_stream")?;
        }
        pe.barrier()?;
        bytes *= 4;
    }
    Ok(())
}

/// Checks on PE 1 that the first `len` bytes of `dst` are PE 0's source (its random bytes from
/// seed 42); `what` names the measurement in the error.
fn check_received(pe: &Pe, dst: &ibgda::SymmetricBuffer<u8>, len: usize, what: &str) -> ibgda::Result<()> {
    let mut r0 = rand::rngs::StdRng::seed_from_u64(42);
    let want: Vec<u8> = (0..len).map(|_| r0.random()).collect();
    if pe.read(dst, 0, len)? != want {
        return Err(ibgda::Error::Config {
            name: "check",
            value: format!("{what} {len} bytes"),
            why: "the data PE 1 received differs from PE 0's source".into(),
        });
    }
    Ok(())
}

/// `put_bw` per size at the better of the measured block counts (what a user would pick), from
/// the per-block-count rows.
fn with_best_put_bw(mut rows: Vec<CompareRow>) -> Vec<CompareRow> {
    let mut best: std::collections::BTreeMap<u64, f64> = std::collections::BTreeMap::new();
    for (m, x, v, _) in &rows {
        if m.starts_with("put_bw_") {
            let e = best.entry(*x).or_insert(0.0);
            *e = e.max(*v);
        }
    }
    rows.extend(best.into_iter().map(|(x, v)| ("put_bw".to_string(), x, v, "GB/s")));
    rows
}

/// `path` opened for appending, with `header` written first when the file is new.
fn append_csv(path: &std::path::Path, header: &str) -> std::io::Result<std::fs::File> {
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    if new {
        writeln!(f, "{header}")?;
    }
    Ok(f)
}

fn append_compare_csv(path: &std::path::Path, system: &str, rows: &[CompareRow]) -> std::io::Result<()> {
    let mut f = append_csv(path, "system,metric,x,value,unit")?;
    for (m, x, v, u) in rows {
        writeln!(f, "{system},{m},{x},{v:.3},{u}")?;
    }
    Ok(())
}

/// The figures of an `nvshmem_bench.cu` log, as comparison rows.
fn parse_nvshmem_log(text: &str) -> Vec<CompareRow> {
    let num = |s: &str, key: &str| -> Option<f64> {
        let i = s.find(key)? + key.len();
        s[i..]
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()?
            .parse()
            .ok()
    };
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.contains("putmem_nbi_block") {
            if let (Some(b), Some(x), Some(v)) = (num(line, "blocks="), num(line, "bytes="), num(line, ": ")) {
                rows.push((format!("put_bw_{b}blocks"), x as u64, v, "GB/s"));
            }
        } else if line.contains("long_p threads=") {
            if let (Some(t), Some(v)) = (num(line, "threads="), num(line, ": ")) {
                rows.push(("p_rate".into(), t as u64, v, "Mops/s"));
            }
        } else if line.contains("ping-pong:") {
            if let Some(v) = num(line, "ping-pong: ") {
                rows.push(("p_pingpong".into(), 1, v, "us"));
            }
        }
    }
    rows
}

/// The ratio table (ibgda-rs ÷ nvshmem) of every metric both systems have in `path`.
fn print_ratio_table(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut by: std::collections::BTreeMap<(String, u64), [Option<f64>; 2]> = Default::default();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 5 {
            continue;
        }
        let k = match f[0] {
            "ibgda-rs" => 0,
            "nvshmem" => 1,
            _ => continue,
        };
        by.entry((f[1].to_string(), f[2].parse()?)).or_default()[k] = Some(f[3].parse()?);
    }
    println!("| metric | x | ibgda-rs | nvshmem | ratio |");
    println!("|---|---|---|---|---|");
    for ((m, x), [ours, theirs]) in &by {
        if let (Some(o), Some(t)) = (ours, theirs) {
            println!("| {m} | {x} | {o:.1} | {t:.1} | {:.3} |", o / t);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    if let Some(log) = &a.nvshmem_log {
        let csv = a.compare_csv.as_ref().ok_or("--nvshmem-log needs --compare-csv")?;
        let rows = parse_nvshmem_log(&std::fs::read_to_string(log)?);
        if rows.is_empty() {
            return Err(format!("no NVSHMEM figures in {}", log.display()).into());
        }
        append_compare_csv(csv, "nvshmem", &with_best_put_bw(rows))?;
        return print_ratio_table(csv);
    }
    let gpus = ibgda::cuda::device_count()?;
    let mut config = Config::from_env()?;
    if std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        config.pes_per_gpu = if gpus >= 2 { 1 } else { 2 };
    }
    config.heap_size = config.heap_size.max(2 * a.max_bytes as u64 + (64 << 20));
    if a.engine_capacity {
        config.ibgda.log_depth = 15;
    }
    // One process per PE under ibgda-run / torchrun / Slurm (the layout the multi-process
    // comparison measures), else the two PEs as threads of this process.
    let launched = ibgda::bootstrap::LaunchEnv::from_env()?;
    let layout = if launched.is_some() { "processes" } else { "threads" };
    let rows = match launched {
        Some(_) => {
            let mut pe = Pe::from_env(config)?;
            if pe.n_pes() != 2 {
                return Err(format!("p2p_bench needs exactly 2 PEs, the launcher started {}", pe.n_pes()).into());
            }
            let rows = bench(&mut pe, &a)?;
            let me = pe.my_pe();
            pe.finalize()?;
            if me != 0 {
                return Ok(());
            }
            rows
        }
        None => run_in_process(2, config, |pe| bench(pe, &a))?.swap_remove(0),
    };
    let (rows, compare) = rows;
    if let Some(p) = &a.compare_csv {
        append_compare_csv(p, "ibgda-rs", &with_best_put_bw(compare))?;
    }
    let rows = &rows;
    println!("layout: {layout} (2 PEs)");
    println!("{:<26} {:<28} {:>12} unit", "op", "config", "value");
    for (op, c, v, u) in rows {
        println!("{op:<26} {c:<28} {v:>12.1} {u}");
    }
    if let Some(p) = &a.csv {
        let mut f = std::fs::File::create(p)?;
        writeln!(f, "op,config,value,unit")?;
        for (op, c, v, u) in rows {
            writeln!(f, "{op},{c},{v:.3},{u}")?;
        }
    }
    if let Some(p) = &a.layout_csv {
        let mut f = append_csv(p, "layout,metric,x,value,unit")?;
        for (op, c, v, u) in rows {
            writeln!(f, "{layout},{op} {c},2,{v:.3},{u}")?;
        }
    }
    println!("all results checked: OK");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvshmem_log_lines_become_comparison_rows() {
        let log = "noise\n\
            nvshmem putmem_nbi_block blocks=32 bytes=8192: 20.7 GB/s\n\
            nvshmem putmem_nbi_block blocks=132 bytes=8192: 8.8 GB/s\n\
            nvshmem long_p threads=32768: 40508.2 Mops/s\n\
            nvshmem p+wait_until ping-pong: 2.180 us round trip\n";
        let rows = with_best_put_bw(parse_nvshmem_log(log));
        let find = |m: &str, x: u64| rows.iter().find(|r| r.0 == m && r.1 == x).map(|r| r.2);
        assert_eq!(find("put_bw_32blocks", 8192), Some(20.7));
        assert_eq!(find("put_bw_132blocks", 8192), Some(8.8));
        assert_eq!(find("put_bw", 8192), Some(20.7), "the better block count");
        assert_eq!(find("p_rate", 32768), Some(40508.2));
        assert_eq!(find("p_pingpong", 1), Some(2.18));
        assert_eq!(rows.len(), 5);
    }
}

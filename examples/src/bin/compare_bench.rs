//! One process, one run, the same kernels over every way ibgda reaches a peer: P2P loads and
//! stores, GPU-initiated IBGDA (GPU doorbell), IBGDA with a CPU-assisted doorbell, and the full
//! CPU proxy. Two PEs (on two GPUs when there are two, else on one).
//!
//! Measures put and get bandwidth over message sizes (block-scope `_nbi`, 32 blocks by default),
//! the 8-byte `p` message rate over issuing threads, the `atomic_fetch_add` rate, `put_signal`
//! ping-pong latency, and the proxy's `p` rate against its thread count. Every point is the median
//! of `--reps` launches timed with CUDA events after a warm-up launch; sources are random, and
//! every destination is checked after its sweep point (a mismatch fails the run).
//!
//! Output: a table on stdout, `--csv`, and with `--plots DIR` PNG plots (bandwidth vs size, rate
//! vs threads, latency, proxy scaling). `--plot-from CSV --plots DIR` redraws the plots of an
//! earlier run on any machine (they need a TrueType font: DejaVu Sans, or `IBGDA_PLOT_FONT`).

use clap::Parser;
use ibgda::transport::ibgda::DoorbellMode;
use ibgda::{run_in_process, Config, KernelArg, Pe, PeerTransport};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug, Clone)]
#[command(about = "P2P vs IBGDA vs CPU-doorbell IBGDA vs CPU proxy, same kernels, one run")]
struct Args {
    /// Modes to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "p2p,ibgda,ibgda-cpu-doorbell,proxy")]
    modes: Vec<String>,
    /// Smallest message in bytes (sizes go up by 4x).
    #[arg(long, default_value_t = 8)]
    min_bytes: u64,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_bytes: u64,
    /// Blocks in the bandwidth kernels (each moves its own messages).
    #[arg(long, default_value_t = 32)]
    bw_blocks: u32,
    /// Issuing-thread counts of the `p` message-rate sweep.
    #[arg(long, value_delimiter = ',', default_value = "32,128,512,2048,8192,32768,131072")]
    rate_threads: Vec<u32>,
    /// Thread counts of the `atomic_fetch_add` rate sweep.
    #[arg(long, value_delimiter = ',', default_value = "32,256,2048,8192")]
    atomic_threads: Vec<u32>,
    /// Threads per block of the `p` rate kernel (a power of two up to what the kernel allows;
    /// default the largest). A block posts through one QP (IBGDA) or one channel (proxy), so
    /// smaller blocks spread a thread count over more of them.
    #[arg(long)]
    rate_block: Option<u32>,
    /// Operations per launch the rate kernels aim for (split over the threads, 2..=256 each).
    #[arg(long, default_value_t = 1 << 18)]
    rate_ops: u32,
    /// Ping-pong round trips per repetition.
    #[arg(long, default_value_t = 1000)]
    pingpong_iters: u32,
    /// Proxy thread counts of the proxy scaling sweep (comma-separated; empty to skip).
    #[arg(long, default_value = "1,2,4", value_parser = parse_counts)]
    proxy_threads: Counts,
    /// Issuing threads of the proxy scaling sweep.
    #[arg(long, default_value_t = 16384)]
    scaling_threads: u32,
    /// What `measure` runs per mode: any of bw, rate, atomic, pingpong (the proxy scaling sweep
    /// is `--proxy-threads`); `none` measures no mode (with `--engine-capacity`, only that).
    #[arg(long, value_delimiter = ',', default_value = "bw,rate,atomic,pingpong")]
    sections: Vec<String>,
    /// Repetitions per point (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// With the `ibgda` mode: also measure the emulated NIC's own capacity (WRITEs queued to a
    /// paused NIC, then its drain timed), as rows `engine_wqe_rate` (Mops/s) and `engine_bw`
    /// (GB/s) over the WRITE size; `false` skips it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    engine_capacity: bool,
    /// QPs per peer while the engine's capacity is measured (each gets its own engine warp).
    #[arg(long, default_value_t = 16)]
    engine_qps: u32,
    /// The emulated NIC's rate model for the comparison: `cx7` (ConnectX-7 defaults, each
    /// overridable with IBGDA_NIC_LINK_GBPS, IBGDA_NIC_MSG_RATE, IBGDA_NIC_LATENCY_NS,
    /// IBGDA_NIC_WQE_FETCH_NS) or `off` (the engine as fast as it goes). Default: IBGDA_NIC_MODEL
    /// when set, else `cx7`. The capacity measurement always runs without it.
    #[arg(long)]
    nic_model: Option<String>,
    /// CSV output file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Directory to write PNG plots into.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Draw the plots of earlier runs' CSVs (comma-separated) instead of measuring.
    #[arg(long)]
    plot_from: Option<PathBuf>,
}

/// One measured point.
#[derive(Clone, Debug)]
struct Row {
    mode: String,
    metric: String,
    x: f64,
    value: f64,
    unit: String,
}

/// Prints a finished point at once (stderr, `ROW ` + its CSV line), so a run cut short still
/// leaves every point it measured in its log.
fn emit(rows: &[Row]) {
    if let Some(r) = rows.last() {
        eprintln!("ROW {},{},{},{:.4},{}", r.mode, r.metric, r.x, r.value, r.unit);
    }
}

fn row(mode: &str, metric: &str, x: f64, value: f64, unit: &str) -> Row {
    Row {
        mode: mode.into(),
        metric: metric.into(),
        x,
        value,
        unit: unit.into(),
    }
}

fn mode_config(base: &Config, mode: &str) -> Result<Config, String> {
    let mut c = base.clone();
    match mode {
        "p2p" => c = c.with_transport(PeerTransport::P2p),
        "ibgda" => {
            c = c.with_transport(PeerTransport::Ibgda);
            c.ibgda.doorbell = DoorbellMode::Gpu;
        }
        "ibgda-cpu-doorbell" => {
            c = c.with_transport(PeerTransport::Ibgda);
            c.ibgda.doorbell = DoorbellMode::Cpu;
        }
        "proxy" => c = c.with_transport(PeerTransport::Proxy),
        other => {
            return Err(format!(
                "unknown mode {other:?}: expected p2p, ibgda, ibgda-cpu-doorbell or proxy"
            ))
        }
    }
    Ok(c)
}

fn launch_cfg(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn new_event(pe: &Pe) -> ibgda::Result<cudarc::driver::CudaEvent> {
    pe.gpu()?
        .context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source })
}

/// Median of `reps` launches (ms) timed with CUDA events, after one warm-up.
fn time_ms(pe: &Pe, reps: usize, mut launch: impl FnMut() -> ibgda::Result<()>) -> ibgda::Result<f64> {
    let err = |source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source };
    launch()?;
    pe.synchronize()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let (a, b) = (new_event(pe)?, new_event(pe)?);
        a.record(pe.gpu()?.stream()).map_err(err)?;
        launch()?;
        b.record(pe.gpu()?.stream()).map_err(err)?;
        pe.synchronize()?;
        v.push(a.elapsed_ms(&b).map_err(err)? as f64);
    }
    v.sort_by(|x, y| x.total_cmp(y));
    Ok(v[v.len() / 2])
}

fn mismatch(what: String) -> ibgda::Error {
    ibgda::Error::Config {
        name: "result check",
        value: what,
        why: "the destination does not hold what was sent".into(),
    }
}

/// The largest block size (a power of two, at most 1024) `kernel` launches with.
fn block_size(pe: &Pe, kernel: &str) -> ibgda::Result<u32> {
    let f = pe.gpu()?.bundled_function(kernel)?;
    let max = f
        .max_threads_per_block()
        .map_err(|source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source })?;
    Ok(1u32 << (31 - (max as u32).clamp(1, 1024).leading_zeros()))
}

/// The `p` rate kernel's block size: `--rate-block`, checked against the kernel's limit.
fn p_rate_block(pe: &Pe, a: &Args) -> ibgda::Result<u32> {
    let max = block_size(pe, "ibgda_p_rate")?;
    match a.rate_block {
        None => Ok(max),
        Some(b) if b.is_power_of_two() && (32..=max).contains(&b) => Ok(b),
        Some(b) => Err(ibgda::Error::Config {
            name: "--rate-block",
            value: b.to_string(),
            why: format!("must be a power of two from 32 to {max} (the p rate kernel's limit)"),
        }),
    }
}

fn sizes(a: &Args) -> Vec<u64> {
    let mut v = Vec::new();
    let mut b = a.min_bytes.max(1);
    while b <= a.max_bytes {
        v.push(b);
        b *= 4;
    }
    if v.last() != Some(&a.max_bytes) {
        v.push(a.max_bytes);
    }
    v
}

fn src_data(pe: u32, n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(0x5eed + pe as u64);
    (0..n).map(|_| r.random()).collect()
}

fn window_of(a: &Args) -> u64 {
    a.max_bytes.next_power_of_two().max(16 << 20)
}

/// Every measurement of one mode; rows come from PE 0. Collective.
fn measure(pe: &mut Pe, a: &Args, mode: &str, bar: &ProgressBar) -> ibgda::Result<Vec<Row>> {
    let me = pe.my_pe();
    let peer = 1 - me;
    let lead = me == 0;
    let mut rows = Vec::new();
    let window = window_of(a);
    let src = pe.malloc::<u8>(window as usize)?;
    let dst = pe.malloc::<u8>(window as usize)?;
    let data = src_data(me, window as usize);
    let peer_data = src_data(peer, window as usize);
    pe.write(&src, 0, &data)?;
    let st = pe.state_ptr();
    let bw_threads = block_size(pe, "bench_messages")?.min(256);
    let run = |s: &str| a.sections.iter().any(|x| x == s);
    let directions: &[(u32, &str)] = if run("bw") {
        &[(0, "put_bw"), (1, "get_bw")]
    } else {
        &[]
    };
    for &(get, metric) in directions {
        for &m in &sizes(a) {
            bar.set_message(format!("{mode}: {metric} {m} B"));
            let blocks = a.bw_blocks;
            let iters = ((64u64 << 20) / (blocks as u64 * m)).clamp(1, 64) as u32;
            let w = window / m * m;
            // Every message lands in [0, covered); clear it so stale data cannot pass the check.
            let covered = (blocks as u64 * iters as u64 * m).min(w) as usize;
            pe.write(&dst, 0, &vec![0u8; covered])?;
            pe.barrier()?;
            if lead {
                let args: [KernelArg; 8] = [
                    st.into(),
                    get.into(),
                    pe.ptr(&dst)?.into(),
                    pe.ptr(&src)?.into(),
                    m.into(),
                    w.into(),
                    peer.into(),
                    iters.into(),
                ];
                // SAFETY: bench_messages(state, get, dst, src, bytes, window, peer, iters); every
                // message lies inside the window, inside both buffers.
                let ms = time_ms(pe, a.reps, || unsafe {
                    pe.gpu()?
                        .launch_bundled("bench_messages", launch_cfg(blocks, bw_threads), &args)
                })?;
                let total = m as f64 * blocks as f64 * iters as f64;
                rows.push(row(mode, metric, m as f64, total / ms / 1e6, "GB/s"));
                emit(&rows);
            }
            pe.barrier()?;
            // Put: PE 1's dst holds PE 0's source; get: PE 0's dst holds PE 1's source.
            let checker = if get == 0 { 1 } else { 0 };
            if me == checker && pe.read(&dst, 0, covered)? != peer_data[..covered] {
                return Err(mismatch(format!("{mode} {metric} {m} B")));
            }
            pe.barrier()?;
            bar.inc(1);
        }
    }
    // 8-byte p message rate over issuing threads.
    let max_threads = a
        .rate_threads
        .iter()
        .chain(&a.atomic_threads)
        .copied()
        .max()
        .unwrap_or(32) as usize;
    let words = pe.malloc::<u64>(max_threads.max(a.scaling_threads as usize))?;
    let p_block = p_rate_block(pe, a)?;
    let mut seen = Evidence::default();
    if lead {
        engine_evidence(pe, mode, 0, &mut seen, &mut Vec::new())?;
    }
    for &threads in a.rate_threads.iter().filter(|_| run("rate")) {
        bar.set_message(format!("{mode}: p rate {threads} threads"));
        p_rate_point(pe, a, &words, threads, p_block, mode, &mut rows)?;
        if lead {
            emit(&rows);
        }
        if lead {
            engine_evidence(pe, mode, threads, &mut seen, &mut rows)?;
        }
        bar.inc(1);
    }
    // Fetch-add rate.
    let fa_block = block_size(pe, "bench_fetch_add")?;
    for &threads in a.atomic_threads.iter().filter(|_| run("atomic")) {
        bar.set_message(format!("{mode}: fetch_add {threads} threads"));
        pe.write(&words, 0, &vec![0u64; threads as usize])?;
        pe.barrier()?;
        let iters = (a.rate_ops / 8 / threads).clamp(2, 64);
        let tpb = fa_block.min(threads);
        if lead {
            let args: [KernelArg; 4] = [st.into(), pe.ptr(&words)?.into(), peer.into(), iters.into()];
            // SAFETY: bench_fetch_add(state, counters, peer, iters), one counter per thread.
            let ms = time_ms(pe, a.reps, || unsafe {
                pe.gpu()?
                    .launch_bundled("bench_fetch_add", launch_cfg(threads / tpb, tpb), &args)
            })?;
            rows.push(row(
                mode,
                "fetch_add_rate",
                threads as f64,
                threads as f64 * iters as f64 / ms / 1e3,
                "Mops/s",
            ));
            emit(&rows);
        }
        pe.barrier()?;
        if me == 1 {
            let want = iters as u64 * (a.reps.max(1) as u64 + 1);
            if pe.read(&words, 0, threads as usize)?.iter().any(|&v| v != want) {
                return Err(mismatch(format!("{mode} fetch_add {threads} threads")));
            }
        }
        pe.barrier()?;
        bar.inc(1);
    }
    // put_signal ping-pong.
    bar.set_message(format!("{mode}: put_signal ping-pong"));
    let ping = pe.malloc::<u64>(2)?;
    let mut lat = Vec::new();
    for _ in 0..if run("pingpong") { a.reps.max(1) + 1 } else { 0 } {
        pe.write(&ping, 0, &[0, 0])?;
        pe.barrier()?;
        let sig = pe.ptr(&ping)? + 8;
        let args: [KernelArg; 5] = [
            st.into(),
            pe.ptr(&ping)?.into(),
            sig.into(),
            peer.into(),
            a.pingpong_iters.into(),
        ];
        let err = |source| ibgda::Error::KernelFailed { pe: me, source };
        let (e0, e1) = (new_event(pe)?, new_event(pe)?);
        e0.record(pe.gpu()?.stream()).map_err(err)?;
        // SAFETY: bench_put_signal_pingpong(state, buf, sig, peer, iters); both PEs launch it.
        unsafe {
            pe.gpu()?
                .launch_bundled("bench_put_signal_pingpong", launch_cfg(1, 1), &args)?
        };
        e1.record(pe.gpu()?.stream()).map_err(err)?;
        pe.synchronize()?;
        lat.push(e0.elapsed_ms(&e1).map_err(err)? as f64 * 1e3 / a.pingpong_iters as f64);
        if pe.read(&ping, 0, 2)? != [a.pingpong_iters as u64; 2] {
            return Err(mismatch(format!("{mode} ping-pong")));
        }
        pe.barrier()?;
    }
    if !lat.is_empty() {
        lat.remove(0); // warm-up
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    if lead && !lat.is_empty() {
        rows.push(row(
            mode,
            "put_signal_pingpong",
            8.0,
            lat[lat.len() / 2],
            "us/round trip",
        ));
        emit(&rows);
    }
    bar.inc(1);
    if let Some(p) = pe.gpu()?.ibgda().and_then(|g| g.proxy()) {
        eprintln!("PE {me} {mode} proxy threads: {:?}", p.stats());
    }
    Ok(rows)
}

/// One `p` rate point; pushes the row on PE 0 and checks the peer's words. Collective.
fn p_rate_point(
    pe: &Pe,
    a: &Args,
    words: &ibgda::SymmetricBuffer<u64>,
    threads: u32,
    block: u32,
    mode: &str,
    rows: &mut Vec<Row>,
) -> ibgda::Result<()> {
    let me = pe.my_pe();
    let iters = (a.rate_ops / threads).clamp(2, 256);
    let tpb = block.min(threads);
    if me == 0 {
        let args: [KernelArg; 4] = [pe.state_ptr().into(), pe.ptr(words)?.into(), 1u32.into(), iters.into()];
        // SAFETY: ibgda_p_rate(state, dst, peer, iters), `dst` holds one u64 per thread.
        let ms = time_ms(pe, a.reps, || unsafe {
            pe.gpu()?
                .launch_bundled("ibgda_p_rate", launch_cfg(threads / tpb, tpb), &args)
        })?;
        rows.push(row(
            mode,
            "p_rate",
            threads as f64,
            threads as f64 * iters as f64 / ms / 1e3,
            "Mops/s",
        ));
    }
    pe.barrier()?;
    if me == 1
        && pe
            .read(words, 0, threads as usize)?
            .iter()
            .any(|&v| v != iters as u64 - 1)
    {
        return Err(mismatch(format!("{mode} p rate {threads} threads")));
    }
    pe.barrier()
}

/// With the rate model on: the smallest size whose bandwidth reaches 90% of the modelled link
/// (`link_gbs` GB/s), per mode and direction (none when a mode never does).
fn link_ninety_percent(rows: &[Row], link_gbs: f64) -> Vec<Row> {
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.metric == "put_bw" || r.metric == "get_bw")
        .map(|r| (r.mode.clone(), r.metric.clone()))
        .collect();
    keys.dedup();
    keys.into_iter()
        .filter_map(|(mode, metric)| {
            rows.iter()
                .filter(|r| r.mode == mode && r.metric == metric && r.value >= 0.9 * link_gbs)
                .map(|r| r.x)
                .reduce(f64::min)
                .map(|x| {
                    row(
                        &mode,
                        &format!("{metric}_90pct_link_size"),
                        x,
                        link_gbs,
                        "bytes at 90% of the modelled link (GB/s)",
                    )
                })
        })
        .collect()
}

/// The engine counters [`engine_evidence`] differences.
#[derive(Default)]
struct Evidence {
    passes: u64,
    backlog: u64,
    busy_passes_per_qp: Vec<u64>,
    model_wait_ns: u64,
    /// Batches, WQEs batched, SM cycles planning / copying / completing, retirements.
    phases: [u64; 6],
    at: Option<std::time::Instant>,
}

/// Where the posting path waits, after a `p` rate point (PE 0, emulated NIC only): the WQEBBs
/// the engine found waiting per busy pass (near zero: the engine and the modelled NIC keep up,
/// the posters are the limit; large: WQEs queue for the NIC), and the share of its time a busy
/// QP's engine warp spent waiting for the rate model (near 1: the modelled NIC is the limit, as
/// it would be on hardware; near 0 with a large backlog: the engine itself is).
fn engine_evidence(pe: &Pe, mode: &str, threads: u32, before: &mut Evidence, rows: &mut Vec<Row>) -> ibgda::Result<()> {
    let Some(g) = pe.gpu()?.ibgda() else { return Ok(()) };
    let stats = g.qp_stats()?;
    let now = std::time::Instant::now();
    let busy: Vec<u64> = stats.iter().map(|s| s.busy_passes).collect();
    let passes = busy.iter().sum::<u64>();
    let backlog = stats.iter().map(|s| s.backlog_sum).sum::<u64>();
    let wait = match g.transport.emulated() {
        Some(e) => e.device().model_stats()?.wait_ns,
        None => 0,
    };
    let busy_qps = busy
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b > before.busy_passes_per_qp.get(i).copied().unwrap_or(0))
        .count();
    let phases = ibgda_examples::engine::phase_totals(&stats);
    let dphase: Vec<f64> = phases.iter().zip(before.phases).map(|(a, b)| (a - b) as f64).collect();
    let (dp, db, dw) = (
        passes - before.passes,
        backlog - before.backlog,
        wait - before.model_wait_ns,
    );
    let elapsed = before.at.map(|t| now.duration_since(t).as_nanos() as f64);
    *before = Evidence {
        passes,
        backlog,
        busy_passes_per_qp: busy,
        model_wait_ns: wait,
        phases,
        at: Some(now),
    };
    if dp > 0 {
        rows.push(row(
            mode,
            "engine_backlog",
            threads as f64,
            db as f64 / dp as f64,
            "WQEBBs waiting per busy pass",
        ));
        emit(rows);
    }
    if dphase[0] > 0.0 && threads > 0 {
        // Where the engine's time per warp batch goes (SM cycles; the plan includes waiting for
        // the modelled NIC), and how full its batches are.
        for (metric, value, unit) in [
            ("engine_batch_wqes", dphase[1] / dphase[0], "WQEs per warp batch"),
            ("engine_cycles_plan", dphase[2] / dphase[0], "SM cycles per batch"),
            ("engine_cycles_copy", dphase[3] / dphase[0], "SM cycles per batch"),
            ("engine_cycles_complete", dphase[4] / dphase[0], "SM cycles per batch"),
            (
                "engine_batches_per_retirement",
                dphase[0] / dphase[5].max(1.0),
                "batches per fence",
            ),
        ] {
            rows.push(row(mode, metric, threads as f64, value, unit));
            emit(rows);
        }
    }
    if let (Some(ns), true, true) = (elapsed, busy_qps > 0, pe.config().nic_model.is_some()) {
        rows.push(row(
            mode,
            "engine_model_wait_share",
            threads as f64,
            dw as f64 / (ns * busy_qps as f64),
            "of a busy QP's engine time spent waiting for the modelled NIC",
        ));
        emit(rows);
    }
    Ok(())
}

/// The smallest size whose bandwidth reaches 90% of the mode's peak, per mode and direction.
fn ninety_percent(rows: &[Row]) -> Vec<Row> {
    let mut out = Vec::new();
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.metric.ends_with("_bw"))
        .map(|r| (r.mode.clone(), r.metric.clone()))
        .collect();
    keys.dedup();
    for (mode, metric) in keys {
        let pts: Vec<&Row> = rows.iter().filter(|r| r.mode == mode && r.metric == metric).collect();
        let peak = pts.iter().map(|r| r.value).fold(0.0, f64::max);
        if let Some(r) = pts.iter().find(|r| r.value >= 0.9 * peak) {
            out.push(row(
                &mode,
                &format!("{metric}_90pct_size"),
                r.x,
                peak,
                "bytes at 90% of peak GB/s",
            ));
        }
    }
    out
}

fn run(a: &Args) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let gpus = ibgda::cuda::device_count().unwrap_or(0);
    if gpus == 0 {
        return Err("compare_bench measures GPUs and found none (`--plot-from CSV --plots DIR` works anywhere)".into());
    }
    let mut base = Config::from_env()?;
    base.nic_model = match a.nic_model.as_deref() {
        Some("off") => None,
        Some("cx7") => ibgda::emu::RateModel::from_env(Some(ibgda::emu::RateModel::CONNECTX7))?
            .or(Some(ibgda::emu::RateModel::CONNECTX7)),
        Some(other) => return Err(format!("--nic-model {other:?}: expected cx7 or off").into()),
        None if std::env::var_os("IBGDA_NIC_MODEL").is_some() => base.nic_model,
        None => ibgda::emu::RateModel::from_env(Some(ibgda::emu::RateModel::CONNECTX7))?,
    };
    if std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        base.pes_per_gpu = if gpus >= 2 { 1 } else { 2 };
    }
    base.heap_size = base.heap_size.max(2 * window_of(a) + (64 << 20));
    let configs = a
        .modes
        .iter()
        .map(|m| mode_config(&base, m).map(|c| (m.clone(), c)))
        .collect::<Result<Vec<_>, _>>()?;
    let steps = configs.len() as u64 * (2 * sizes(a).len() + a.rate_threads.len() + a.atomic_threads.len() + 1) as u64
        + a.proxy_threads.0.len() as u64;
    eprintln!(
        "compare_bench: modes {:?}, {} GPU(s), PEs per GPU {}, emulated NIC {}",
        a.modes,
        gpus,
        base.pes_per_gpu,
        base.nic_model
            .map_or("unpaced (rate model off)".to_string(), |m| format!("paced as {m}"))
    );
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("=> "),
    );
    let mut rows = Vec::new();
    // `--sections none`: only the engine's capacity (one set of PEs in this process, not two).
    let measuring = a.sections.iter().any(|s| s != "none" && !s.is_empty());
    for (mode, config) in configs.iter().filter(|_| measuring) {
        let r = run_in_process(2, config.clone(), |pe| measure(pe, a, mode, &bar))?;
        rows.extend(r.into_iter().next().unwrap_or_default());
    }
    if a.engine_capacity && a.modes.iter().any(|m| m == "ibgda") {
        bar.set_message("the emulated NIC's capacity");
        let mut c = mode_config(&base, "ibgda")?;
        // Deep queues: every QP holds a full backlog before the NIC resumes; the engine as fast
        // as it goes.
        c.ibgda.log_depth = match std::env::var("IBGDA_SQ_LOG_DEPTH") {
            Ok(v) => v
                .parse()
                .map_err(|_| format!("IBGDA_SQ_LOG_DEPTH={v:?}: expected 12..=15"))?,
            Err(_) => 15,
        };
        c.ibgda.qps_per_peer = a.engine_qps;
        c.nic_model = None;
        let r = run_in_process(2, c, |pe| {
            let sizes = [8u32, 4096, 65536];
            let dst = pe.malloc::<u8>(64 * 65536)?;
            let src = pe.malloc::<u8>(65536)?;
            let mut points = ibgda_examples::engine::drain_capacity(pe, &dst, &src, &sizes, false, a.reps)?;
            points.extend(ibgda_examples::engine::drain_capacity(
                pe,
                &dst,
                &src,
                &sizes[1..],
                true,
                a.reps,
            )?);
            let mut rows = Vec::new();
            for p in points {
                // WRITEs as `engine_wqe_rate` / `engine_bw`, READs as `engine_read_*`.
                let (rate, bw) = if p.read {
                    ("engine_read_wqe_rate", "engine_read_bw")
                } else {
                    ("engine_wqe_rate", "engine_bw")
                };
                rows.push(row("ibgda", rate, p.bytes as f64, p.wqe_rate_mops, "Mops/s"));
                rows.push(row("ibgda", bw, p.bytes as f64, p.gbps, "GB/s"));
                if p.read {
                    continue;
                }
                rows.push(row("ibgda", "engine_qps", p.bytes as f64, p.qps as f64, "QPs"));
                rows.push(row(
                    "ibgda",
                    "engine_warps",
                    p.bytes as f64,
                    p.engine_warps as f64,
                    "warps",
                ));
                rows.push(row(
                    "ibgda",
                    "engine_sms",
                    p.bytes as f64,
                    p.engine_blocks as f64,
                    "blocks",
                ));
                rows.push(row(
                    "ibgda",
                    "engine_batch_wqes",
                    p.bytes as f64,
                    p.wqes_per_batch,
                    "WQEs per warp batch",
                ));
                rows.push(row(
                    "ibgda",
                    "engine_batches_per_retirement",
                    p.bytes as f64,
                    p.batches_per_retirement,
                    "batches per fence",
                ));
                for (name, c) in ["engine_cycles_plan", "engine_cycles_copy", "engine_cycles_complete"]
                    .iter()
                    .zip(p.cycles_per_batch)
                {
                    rows.push(row("ibgda", name, p.bytes as f64, c, "SM cycles per batch"));
                }
            }
            if pe.my_pe() == 0 {
                for k in 1..=rows.len() {
                    emit(&rows[..k]);
                }
            }
            Ok(rows)
        })?;
        rows.extend(r.into_iter().next().unwrap_or_default());
    }
    let scaling: &[u32] = if a.modes.iter().any(|m| m == "proxy") {
        &a.proxy_threads.0
    } else {
        &[]
    };
    for &t in scaling {
        bar.set_message(format!("proxy scaling: {t} proxy threads"));
        let mut c = mode_config(&base, "proxy")?;
        c.proxy.threads = t;
        c.proxy.channels = c.proxy.channels.max(t);
        let r = run_in_process(2, c, |pe| {
            let words = pe.malloc::<u64>(a.scaling_threads as usize)?;
            let block = p_rate_block(pe, a)?;
            let mut rows = Vec::new();
            p_rate_point(pe, a, &words, a.scaling_threads, block, "proxy", &mut rows)?;
            for r in &mut rows {
                r.metric = "proxy_scaling".into();
                r.mode = format!("proxy ({} issuing threads)", a.scaling_threads);
                r.x = t as f64;
            }
            if pe.my_pe() == 0 {
                emit(&rows);
            }
            Ok(rows)
        })?;
        rows.extend(r.into_iter().next().unwrap_or_default());
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut extra = ninety_percent(&rows);
    if let Some(m) = base.nic_model {
        extra.extend(link_ninety_percent(&rows, m.link_gbps / 8.0));
    }
    rows.extend(extra);
    Ok(rows)
}

fn write_csv(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    writeln!(f, "mode,metric,x,value,unit")?;
    // Fields are plain text; a comma inside one would shift every later field.
    let field = |s: &str| s.replace(',', ";");
    for r in rows {
        writeln!(
            f,
            "{},{},{},{:.4},{}",
            field(&r.mode),
            field(&r.metric),
            r.x,
            r.value,
            field(&r.unit)
        )?;
    }
    Ok(())
}

fn read_csv(path: &Path) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 5 {
            return Err(format!("{}:{}: expected 5 fields, got {}", path.display(), i + 1, f.len()).into());
        }
        rows.push(row(f[0], f[1], f[2].parse()?, f[3].parse()?, f[4]));
    }
    Ok(rows)
}

fn main() {
    let a = Args::parse();
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let rows = match &a.plot_from {
            Some(csvs) => {
                let mut rows = Vec::new();
                for c in csvs.to_string_lossy().split(',') {
                    rows.extend(read_csv(Path::new(c))?);
                }
                // A run cut short (or gathered from `ROW` lines) has no 90% rows: derive them.
                if !rows.iter().any(|r| r.metric.ends_with("_90pct_size")) {
                    let extra = ninety_percent(&rows);
                    for r in &extra {
                        println!("{} {}: {} bytes (peak {:.1} GB/s)", r.mode, r.metric, r.x, r.value);
                    }
                    rows.extend(extra);
                }
                rows
            }
            None => {
                let rows = run(&a)?;
                println!("{:<34} {:<26} {:>12} {:>12} unit", "mode", "metric", "x", "value");
                for r in &rows {
                    println!(
                        "{:<34} {:<26} {:>12} {:>12.3} {}",
                        r.mode, r.metric, r.x, r.value, r.unit
                    );
                }
                if let Some(p) = &a.csv {
                    write_csv(p, &rows)?;
                }
                println!("all results checked: OK");
                rows
            }
        };
        if let Some(dir) = &a.plots {
            for f in ibgda_examples_plot::draw_all(&rows_for_plot(&rows), dir)? {
                println!("plot: {}", f.display());
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!("compare_bench failed: {e}");
        std::process::exit(1);
    }
}

fn rows_for_plot(rows: &[Row]) -> Vec<ibgda_examples_plot::Point> {
    rows.iter()
        .map(|r| ibgda_examples_plot::Point {
            series: r.mode.clone(),
            metric: r.metric.clone(),
            x: r.x,
            y: r.value,
        })
        .collect()
}

#[allow(dead_code)] // draw_ep is ep_plot's
#[path = "../plot.rs"]
mod ibgda_examples_plot;

/// A comma-separated list of counts, possibly empty (`--proxy-threads ''` skips the sweep).
#[derive(Clone, Debug, PartialEq)]
struct Counts(Vec<u32>);

fn parse_counts(s: &str) -> Result<Counts, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().map_err(|_| format!("{p:?} is not a count")))
        .collect::<Result<Vec<_>, _>>()
        .map(Counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_threads_may_be_empty_to_skip_the_sweep() {
        let parse = |v: &str| Args::try_parse_from(["compare_bench", "--proxy-threads", v]).map(|a| a.proxy_threads);
        assert_eq!(parse("").unwrap(), Counts(vec![]));
        assert_eq!(parse("1,2,4").unwrap(), Counts(vec![1, 2, 4]));
        assert!(parse("1,x").unwrap_err().to_string().contains("\"x\" is not a count"));
        let default = Args::try_parse_from(["compare_bench"]).unwrap().proxy_threads;
        assert_eq!(default, Counts(vec![1, 2, 4]));
    }

    #[test]
    fn csv_round_trips_every_row_and_derives_the_90_percent_sizes() {
        let rows = vec![
            row("p2p", "put_bw", 8.0, 1.0, "GB/s"),
            row("p2p", "put_bw", 1024.0, 95.0, "GB/s"),
            row("p2p", "put_bw", 4096.0, 100.0, "GB/s"),
            row("proxy (16384 issuing threads)", "proxy_scaling", 2.0, 0.1431, "Mops/s"),
            row("odd, mode", "p_rate", 32.0, 0.5, "Mops/s"),
        ];
        let path = std::env::temp_dir().join(format!("compare_bench_test_{}.csv", std::process::id()));
        write_csv(&path, &rows).unwrap();
        let back = read_csv(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back.len(), rows.len());
        assert_eq!(back[3].mode, "proxy (16384 issuing threads)");
        assert_eq!((back[3].x, back[3].value), (2.0, 0.1431));
        assert_eq!(back[4].mode, "odd; mode");
        let ninety = ninety_percent(&back);
        assert_eq!(ninety.len(), 1);
        assert_eq!((ninety[0].x, ninety[0].value), (1024.0, 100.0));
    }
}

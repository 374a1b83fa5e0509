//! The measurements `compare_bench` runs per mode on each PE: put and get bandwidth, the `p`
//! rate, the `atomic_fetch_add` rate and `put_signal` ping-pong, timed with CUDA events (median
//! of `--reps` after a warm-up), every destination checked.

use crate::evidence::{engine_evidence, Evidence};
use crate::rows::{emit, row, Row};
use crate::Args;
use ibgda::{KernelArg, Pe};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};

pub(crate) fn launch_cfg(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn new_event(pe: &Pe) -> ibgda::Result<cudarc::driver::CudaEvent> {
    pe.gpu()?
        .context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source })
}

/// Median of `reps` launches (ms) timed with CUDA events, after one warm-up.
pub(crate) fn time_ms(pe: &Pe, reps: usize, mut launch: impl FnMut() -> ibgda::Result<()>) -> ibgda::Result<f64> {
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

pub(crate) fn mismatch(what: String) -> ibgda::Error {
    ibgda::Error::Config {
        name: "result check",
        value: what,
        why: "the destination does not hold what was sent".into(),
    }
}

/// The largest block size (a power of two, at most 1024) `kernel` launches with.
pub(crate) fn block_size(pe: &Pe, kernel: &str) -> ibgda::Result<u32> {
    let f = ibgda_bundled::function(pe, kernel)?;
    let max = f
        .max_threads_per_block()
        .map_err(|source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source })?;
    Ok(1u32 << (31 - (max as u32).clamp(1, 1024).leading_zeros()))
}

/// The `p` rate kernel's block size: `--rate-block`, checked against the kernel's limit.
pub(crate) fn p_rate_block(pe: &Pe, a: &Args) -> ibgda::Result<u32> {
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

pub(crate) fn sizes(a: &Args) -> Vec<u64> {
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

pub(crate) fn src_data(pe: u32, n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(0x5eed + pe as u64);
    (0..n).map(|_| r.random()).collect()
}

pub(crate) fn window_of(a: &Args) -> u64 {
    a.max_bytes.next_power_of_two().max(16 << 20)
}

/// Every measurement of one mode; rows come from PE 0. Collective.
pub(crate) fn measure(pe: &mut Pe, a: &Args, mode: &str, bar: &ProgressBar) -> ibgda::Result<Vec<Row>> {
    ibgda_bundled::load(pe)?;
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
                    ibgda_bundled::launch(pe, "bench_messages", launch_cfg(blocks, bw_threads), &args)
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
    // Room for the scattered `p` rate's every other word.
    let words = pe.malloc::<u64>(2 * max_threads.max(a.scaling_threads as usize))?;
    let p_block = p_rate_block(pe, a)?;
    let mut seen = Evidence::default();
    if lead {
        engine_evidence(pe, mode, "", 0, &mut seen, &mut Vec::new())?;
    }
    for &threads in a.rate_threads.iter().filter(|_| run("rate")) {
        bar.set_message(format!("{mode}: p rate {threads} threads"));
        // Consecutive words (a warp's `p`s combined on IBGDA), then every other word (one WQE
        // each): both, so the combining never hides the per-WQE rate.
        // The engine's evidence after each (`engine_*` for consecutive words,
        // `p_rate_scattered_engine_*` for every other word).
        for (stride, prefix) in [(1, ""), (2, "p_rate_scattered_")] {
            p_rate_point(pe, a, &words, threads, p_block, stride, mode, &mut rows)?;
            if lead {
                engine_evidence(pe, mode, prefix, threads, &mut seen, &mut rows)?;
            }
        }
        if lead {
            emit(&rows);
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
        let tpb = fa_block.min(a.atomic_block.max(32)).min(threads);
        if lead {
            let args: [KernelArg; 4] = [st.into(), pe.ptr(&words)?.into(), peer.into(), iters.into()];
            // SAFETY: bench_fetch_add(state, counters, peer, iters), one counter per thread.
            let ms = time_ms(pe, a.reps, || unsafe {
                ibgda_bundled::launch(pe, "bench_fetch_add", launch_cfg(threads / tpb, tpb), &args)
            })?;
            rows.push(row(
                mode,
                "fetch_add_rate",
                threads as f64,
                threads as f64 * iters as f64 / ms / 1e3,
                "Mops/s",
            ));
            emit(&rows);
            // Where the engine's time went for these atomics, as `fetch_add_engine_*` rows (the
            // `p` rate's are `engine_*` at the same thread counts).
            engine_evidence(pe, mode, "fetch_add_", threads, &mut seen, &mut rows)?;
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
        unsafe { ibgda_bundled::launch(pe, "bench_put_signal_pingpong", launch_cfg(1, 1), &args)? };
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

/// One `p` rate point, each thread writing word `thread * stride` (`p_rate` for 1: consecutive
/// words, which IBGDA combines; `p_rate_scattered` otherwise); pushes the row on PE 0 and checks
/// the peer's words. Collective.
#[allow(clippy::too_many_arguments)]
pub(crate) fn p_rate_point(
    pe: &Pe,
    a: &Args,
    words: &ibgda::SymmetricBuffer<u64>,
    threads: u32,
    block: u32,
    stride: u32,
    mode: &str,
    rows: &mut Vec<Row>,
) -> ibgda::Result<()> {
    let me = pe.my_pe();
    let iters = (a.rate_ops / threads).clamp(2, 256);
    let tpb = block.min(threads);
    let span = (threads * stride) as usize;
    if me == 1 {
        pe.write(words, 0, &vec![u64::MAX; span])?;
    }
    pe.barrier()?;
    if me == 0 {
        let args: [KernelArg; 5] = [
            pe.state_ptr().into(),
            pe.ptr(words)?.into(),
            1u32.into(),
            iters.into(),
            stride.into(),
        ];
        // SAFETY: ibgda_p_rate(state, dst, peer, iters, stride), `dst` holds `threads * stride` u64s.
        let ms = time_ms(pe, a.reps, || unsafe {
            ibgda_bundled::launch(pe, "ibgda_p_rate", launch_cfg(threads / tpb, tpb), &args)
        })?;
        rows.push(row(
            mode,
            if stride == 1 { "p_rate" } else { "p_rate_scattered" },
            threads as f64,
            threads as f64 * iters as f64 / ms / 1e3,
            "Mops/s",
        ));
    }
    pe.barrier()?;
    if me == 1 {
        let got = pe.read(words, 0, span)?;
        // Each thread's word holds its last value; the gaps between them were never written.
        let wrong = got.iter().enumerate().any(|(i, &v)| {
            let want = if i % stride as usize == 0 {
                iters as u64 - 1
            } else {
                u64::MAX
            };
            v != want
        });
        if wrong {
            return Err(mismatch(format!("{mode} p rate {threads} threads, stride {stride}")));
        }
    }
    pe.barrier()
}

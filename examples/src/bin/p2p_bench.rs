//! P2P benchmark, comparable with `shared/baselines/nvshmem_bench.cu` run on the same machine:
//! block-scope `put_nbi` bandwidth PE 0 -> PE 1 (8 KiB to 128 MiB, 32 and 132 blocks of 1024
//! threads), 8-byte `p` message rate, and `p` + `signal_wait_until` ping-pong latency.
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
}

fn cfg(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Median of `reps` timed launches (ms), after one warm-up.
fn time_ms(pe: &Pe, reps: usize, mut launch: impl FnMut() -> ibgda::Result<()>) -> ibgda::Result<f64> {
    let ctx = pe.context();
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
        a.record(pe.stream()).map_err(err)?;
        launch()?;
        b.record(pe.stream()).map_err(err)?;
        pe.synchronize()?;
        v.push(a.elapsed_ms(&b).map_err(err)? as f64);
    }
    v.sort_by(|x, y| x.partial_cmp(y).unwrap());
    Ok(v[v.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let gpus = ibgda::cuda::device_count()?;
    let mut config = Config::from_env()?;
    if std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        config.pes_per_gpu = if gpus >= 2 { 1 } else { 2 };
    }
    config.heap_size = config.heap_size.max(2 * a.max_bytes as u64 + (64 << 20));
    let rows = run_in_process(2, config, |pe| {
        let mut rows: Vec<(String, String, f64, String)> = Vec::new();
        let src = pe.malloc::<u8>(a.max_bytes)?;
        let dst = pe.malloc::<u8>(a.max_bytes)?;
        let parr = pe.malloc::<u64>(132 * 1024)?;
        let flag = pe.malloc::<u64>(1)?;
        let me = pe.my_pe();
        let peer = 1 - me;
        let mut r = rand::rngs::StdRng::seed_from_u64(42 + me as u64);
        let data: Vec<u8> = (0..a.max_bytes).map(|_| r.random()).collect();
        pe.write(&src, 0, &data)?;
        pe.barrier()?;
        let st = pe.state_ptr();
        // Blocks of 1024 threads as in NVSHMEM's program, unless the kernel's register use caps it.
        let tpb = |name: &str| -> ibgda::Result<u32> {
            let f = pe.bundled_function(name)?;
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
        for blocks in [32u32, 132] {
            let mut bytes = 8192usize;
            while bytes <= a.max_bytes {
                if me == 0 {
                    let iters: u32 = if bytes >= 16 << 20 { 20 } else { 200 };
                    let args: [KernelArg; 6] = [
                        st.into(),
                        pe.ptr(&dst).into(),
                        pe.ptr(&src).into(),
                        (bytes as u64).into(),
                        peer.into(),
                        iters.into(),
                    ];
                    // SAFETY: ibgda_put_bw_block(state, dst, src, bytes, peer, iters).
                    let ms = time_ms(pe, a.reps, || unsafe {
                        pe.launch_bundled("ibgda_put_bw_block", cfg(blocks, bw_threads), &args)
                    })?;
                    let gbs = bytes as f64 * iters as f64 / ms / 1e6;
                    rows.push((
                        "put_nbi_block".into(),
                        format!("blocks={blocks}x{bw_threads} bytes={bytes}"),
                        gbs,
                        "GB/s".into(),
                    ));
                }
                pe.barrier()?;
                if me == 1 {
                    // Every byte the blocks covered (bytes rounded down to a multiple of blocks).
                    let covered = bytes / blocks as usize * blocks as usize;
                    let got = pe.read(&dst, 0, covered)?;
                    let want: Vec<u8> = {
                        let mut r0 = rand::rngs::StdRng::seed_from_u64(42);
                        (0..covered).map(|_| r0.random()).collect()
                    };
                    if got != want {
                        return Err(ibgda::Error::Config {
                            name: "check",
                            value: format!("{bytes}"),
                            why: "put data mismatch".into(),
                        });
                    }
                }
                pe.barrier()?;
                bytes *= 4;
            }
        }
        for threads in [32 * 1024u32, 132 * 1024] {
            if me == 0 {
                let iters = 1000u32;
                let args: [KernelArg; 4] = [st.into(), pe.ptr(&parr).into(), peer.into(), iters.into()];
                // SAFETY: ibgda_p_rate(state, dst, peer, iters) with dst holding `threads` u64s.
                let ms = time_ms(pe, a.reps, || unsafe {
                    pe.launch_bundled("ibgda_p_rate", cfg(threads / p_threads, p_threads), &args)
                })?;
                rows.push((
                    "p (8 B)".into(),
                    format!("threads={threads}"),
                    threads as f64 * iters as f64 / ms / 1e3,
                    "Mops/s".into(),
                ));
            }
            pe.barrier()?;
            if me == 1 {
                let v = pe.read(&parr, 0, threads as usize)?;
                if v.iter().any(|&x| x != 999) {
                    return Err(ibgda::Error::Config {
                        name: "check",
                        value: "p_rate".into(),
                        why: "last p value not 999".into(),
                    });
                }
            }
            pe.barrier()?;
        }
        let iters = 10_000u32;
        let mut lat = Vec::new();
        for _ in 0..a.reps.max(1) {
            pe.write(&flag, 0, &[0])?;
            pe.barrier()?;
            let args: [KernelArg; 4] = [st.into(), pe.ptr(&flag).into(), peer.into(), iters.into()];
            let ctx = pe.context();
            let err = |source| ibgda::Error::KernelFailed { pe: me, source };
            let (e0, e1) = (
                ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(err)?,
                ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(err)?,
            );
            e0.record(pe.stream()).map_err(err)?;
            // SAFETY: ibgda_pingpong(state, flag, peer, iters); both PEs launch it.
            unsafe { pe.launch_bundled("ibgda_pingpong", cfg(1, 1), &args)? };
            e1.record(pe.stream()).map_err(err)?;
            pe.synchronize()?;
            lat.push(e0.elapsed_ms(&e1).map_err(err)? as f64 * 1000.0 / iters as f64);
            pe.barrier()?;
        }
        lat.sort_by(|x, y| x.partial_cmp(y).unwrap());
        if me == 0 {
            rows.push((
                "p+signal_wait ping-pong".into(),
                "1 thread each".into(),
                lat[lat.len() / 2],
                "us/round trip".into(),
            ));
        }
        Ok(rows)
    })?;
    let rows = &rows[0];
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
    println!("all results checked: OK");
    Ok(())
}

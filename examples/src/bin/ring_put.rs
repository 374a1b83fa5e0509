//! The first program to run: each PE puts a block of random data to the next PE with a signal,
//! waits for its own data to arrive, and gets the previous PE's data back; the host checks every
//! byte. Runs on GPUs when there are any (P2P over NVLink/PCIe), else on the CPU emulation, where
//! the same kernel code runs on CPU threads.

use clap::Parser;
use ibgda::cpu::{CpuTransport, CpuWorld};
use ibgda::transport::ibgda::IbgdaOptions;
use ibgda::transport::proxy::ProxyOptions;
use ibgda::{run_in_process, Config, KernelArg};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Ring of put_signal + get over the symmetric heap, every byte checked")]
struct Args {
    /// Number of PEs.
    #[arg(long, default_value_t = 2)]
    pes: u32,
    /// Bytes each PE sends per round.
    #[arg(long, default_value_t = 16 << 20)]
    bytes: usize,
    /// Rounds (fresh random data each round).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Blocks per PE.
    #[arg(long, default_value_t = 16)]
    blocks: u32,
    /// Use the CPU emulation even if a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// Print each PE's progress (init, module load, each round) with timestamps to stderr.
    #[arg(long)]
    progress: bool,
    /// Transport between CPU-emulated PEs: `ibgda` (WQEs on the emulated mlx5 device), `proxy`
    /// (descriptors to CPU proxy threads, which post the WQEs) or `p2p`.
    #[arg(long, default_value = "ibgda")]
    cpu_transport: String,
}

fn data(round: u64, pe: u32, n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(round * 1_000_003 + pe as u64);
    (0..n).map(|_| r.random()).collect()
}

fn check(what: &str, pe: u32, round: u64, got: &[u8], want: &[u8]) -> Result<(), String> {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!(
            "PE {pe} round {round}: {what} has {} bytes, expected {}",
            got.len(),
            want.len()
        )),
        Some(i) => Err(format!(
            "PE {pe} round {round}: {what} byte {i} is {:#04x}, expected {:#04x}",
            got[i], want[i]
        )),
    }
}

fn on_gpu(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let gpus = ibgda::cuda::device_count()? as u32;
    let mut config = Config::from_env()?;
    if std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        config.pes_per_gpu = a.pes.div_ceil(gpus);
    }
    config.heap_size = config.heap_size.max(3 * a.bytes as u64 + (8 << 20));
    println!(
        "ring_put: {} PEs on {} GPU(s), {} bytes per PE per round, {} rounds",
        a.pes,
        gpus.min(a.pes),
        a.bytes,
        a.rounds
    );
    let t0 = Instant::now();
    let progress = |pe: u32, what: &str| {
        if a.progress {
            eprintln!("[{:>8.3} s] PE {pe}: {what}", t0.elapsed().as_secs_f64());
        }
    };
    let results = run_in_process(a.pes, config, |pe| {
        progress(pe.my_pe(), "up; loading the ring_put module");
        let module = pe.load_ptx(ibgda_examples::RING_PUT_PTX)?;
        progress(pe.my_pe(), "module loaded");
        let kernel = pe.function(&module, "ring_put")?;
        let (send, recv, fetched) = (
            pe.malloc::<u8>(a.bytes)?,
            pe.malloc::<u8>(a.bytes)?,
            pe.malloc::<u8>(a.bytes)?,
        );
        let arrived = pe.malloc::<u64>(1)?;
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let prev = (me + n - 1) % n;
        let mut secs = 0.0;
        for round in 1..=a.rounds {
            pe.write(&send, 0, &data(round, me, a.bytes))?;
            pe.barrier()?;
            let t = Instant::now();
            let args: [KernelArg; 7] = [
                pe.state_ptr().into(),
                pe.ptr(&send).into(),
                pe.ptr(&recv).into(),
                pe.ptr(&fetched).into(),
                (a.bytes as u64).into(),
                pe.ptr(&arrived).into(),
                round.into(),
            ];
            let cfg = cudarc::driver::LaunchConfig {
                grid_dim: (a.blocks, 1, 1),
                block_dim: (512, 1, 1),
                shared_mem_bytes: 0,
            };
            progress(me, &format!("round {round}: launching"));
            // SAFETY: `ring_put` takes (state, send, recv, fetched, bytes, arrived, round).
            unsafe { pe.launch(&kernel, cfg, &args)? };
            pe.synchronize()?;
            progress(me, &format!("round {round}: kernel done"));
            secs += t.elapsed().as_secs_f64();
            pe.barrier()?;
            let want = data(round, prev, a.bytes);
            let (got_recv, got_fetched) = (pe.read(&recv, 0, a.bytes)?, pe.read(&fetched, 0, a.bytes)?);
            let ok = check("recv", me, round, &got_recv, &want)
                .and_then(|_| check("fetched", me, round, &got_fetched, &want));
            if let Err(msg) = ok {
                return Ok(Err(msg));
            }
        }
        Ok(Ok(secs))
    })?;
    let mut failed = false;
    for (pe, r) in results.iter().enumerate() {
        match r {
            Ok(secs) => println!("PE {pe}: {} rounds, {} bytes received and {} fetched per round, every byte checked: OK ({:.2} ms per round incl. launch)", a.rounds, a.bytes, a.bytes, secs * 1e3 / a.rounds as f64),
            Err(m) => {
                println!("{m}");
                failed = true;
            }
        }
    }
    if failed {
        return Err("data mismatch".into());
    }
    Ok(())
}

fn on_cpu(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = a.bytes.min(4 << 20);
    let transport = match a.cpu_transport.as_str() {
        "ibgda" => CpuTransport::Ibgda(IbgdaOptions::default()),
        "proxy" => CpuTransport::Proxy(ProxyOptions {
            pin: false,
            ..Default::default()
        }),
        "p2p" => CpuTransport::P2p,
        other => return Err(format!("--cpu-transport {other}: expected `ibgda`, `proxy` or `p2p`").into()),
    };
    let how = match transport {
        CpuTransport::Ibgda(_) => "IBGDA: the device code builds mlx5 WQEs, rings doorbells and polls CQs of RC QPs on the emulated mlx5 device (a CPU engine thread)",
        CpuTransport::Proxy(_) => "CPU proxy: the device code writes descriptors into rings; proxy threads turn them into WQEs on RC QPs of the emulated mlx5 device (a CPU engine thread)",
        CpuTransport::P2p => "P2P: loads and stores into the peers' heaps",
    };
    println!("ring_put: no GPU in use: CPU emulation (device code on CPU threads), {} PEs, {bytes} bytes per PE per round, {} rounds", a.pes, a.rounds);
    println!("ring_put: transport {how}");
    let blocks = a.blocks.min(8);
    let mut w = CpuWorld::with_transport(a.pes, 3 * bytes as u64 + (1 << 20), Duration::from_secs(30), transport)?;
    let (send, recv, fetched) = (w.malloc::<u8>(bytes)?, w.malloc::<u8>(bytes)?, w.malloc::<u8>(bytes)?);
    let arrived = w.malloc::<u64>(1)?;
    for round in 1..=a.rounds {
        for pe in 0..a.pes {
            w.write(pe, &send, 0, &data(round, pe, bytes))?;
        }
        let wr = &w;
        wr.launch(blocks, |pe, st| {
            // SAFETY: the buffers are live allocations of `bytes` bytes in this world.
            unsafe {
                ring_put_kernel::ring_put(
                    st,
                    wr.ptr(pe, &send).unwrap() as *const u8,
                    wr.ptr(pe, &recv).unwrap() as *mut u8,
                    wr.ptr(pe, &fetched).unwrap() as *mut u8,
                    bytes as u64,
                    wr.ptr(pe, &arrived).unwrap() as *mut u64,
                    round,
                )
            }
        })?;
        for pe in 0..a.pes {
            let prev = (pe + a.pes - 1) % a.pes;
            let want = data(round, prev, bytes);
            check("recv", pe, round, &w.read(pe, &recv, 0, bytes)?, &want)?;
            check("fetched", pe, round, &w.read(pe, &fetched, 0, bytes)?, &want)?;
        }
    }
    for pe in 0..a.pes {
        println!(
            "PE {pe}: {} rounds, {bytes} bytes received and fetched per round, every byte checked: OK",
            a.rounds
        );
    }
    if let Some(t) = w.ibgda() {
        let (mut wqes, mut doorbells) = (0, 0);
        for pe in 0..a.pes {
            for peer in (0..a.pes).filter(|&p| p != pe) {
                for q in 0..t.options.qps_per_peer {
                    let s = t.qp(pe, peer, q).expect("qp").stats().unwrap();
                    wqes += s.wqes_executed;
                    doorbells += s.doorbells_seen;
                }
            }
        }
        println!("emulated mlx5 device: {wqes} WQEs executed after {doorbells} doorbells");
    }
    if w.proxy(0).is_some() {
        for pe in 0..a.pes {
            let s = w.proxy(pe).expect("proxy").stats();
            let (d, b) = (
                s.iter().map(|t| t.descriptors).sum::<u64>(),
                s.iter().map(|t| t.batches).sum::<u64>(),
            );
            println!("PE {pe} proxy: {d} descriptors in {b} batches over {} threads", s.len());
        }
    }
    Ok(())
}

fn main() {
    let a = Args::parse();
    let gpu = !a.cpu && ibgda::cuda::device_count().unwrap_or(0) > 0;
    let r = if gpu { on_gpu(&a) } else { on_cpu(&a) };
    if let Err(e) = r {
        eprintln!("ring_put failed: {e}");
        std::process::exit(1);
    }
}

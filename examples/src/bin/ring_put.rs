//! The first program to run: each PE puts a block of random data to the next PE with a signal,
//! waits for its own data to arrive, and gets the previous PE's data back; the host checks every
//! byte.
//!
//! One host program for every way it can run: on GPUs (P2P over NVLink/PCIe, or IBGDA / the proxy
//! on the emulated NIC) or on the CPU emulation (the same kernel code on CPU threads); as threads
//! of this process (`--pes N`), or one process per PE under a launcher:
//!
//! ```text
//! ring_put --pes 4                                  # 4 PEs, threads of one process
//! ibgda-run -n 4 ring_put                           # 4 processes
//! torchrun --nproc-per-node 2 --no-python ring_put  # 2 processes, started by PyTorch's launcher
//! ```

use clap::Parser;
use ibgda::{Config, DeviceChoice, Grid, Pe, PeerTransport};
use rand::{Rng, SeedableRng};
use ring_put_kernel::ring_put;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Ring of put_signal + get over the symmetric heap, every byte checked")]
struct Args {
    /// Number of PEs when run as threads of one process (ignored under a launcher, which says).
    #[arg(long, default_value_t = 2)]
    pes: u32,
    /// Bytes each PE sends per round (at most 4 MiB on the CPU emulation).
    #[arg(long, default_value_t = 16 << 20)]
    bytes: usize,
    /// Rounds (fresh random data each round).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Blocks per PE (at most 8 on the CPU emulation, where a block is a thread).
    #[arg(long, default_value_t = 16)]
    blocks: u32,
    /// Use the CPU emulation even if a GPU is present (same as IBGDA_DEVICE=cpu).
    #[arg(long)]
    cpu: bool,
    /// Print each PE's progress (init, module load, each round) with timestamps to stderr.
    #[arg(long)]
    progress: bool,
    /// Transport between PEs: `p2p`, `ibgda` (WQEs on the emulated mlx5 device) or `proxy`
    /// (descriptors to CPU proxy threads). Default: IBGDA_TRANSPORT, else `ibgda` on the CPU
    /// emulation (to show the NIC path) and `p2p` on GPUs.
    #[arg(long, alias = "cpu-transport")]
    transport: Option<String>,
}

fn data(round: u64, pe: u32, n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(round * 1_000_003 + pe as u64);
    (0..n).map(|_| r.random()).collect()
}

/// A PE's failure: the runtime's, or a byte that did not arrive.
type PeError = Box<dyn std::error::Error + Send + Sync>;

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

/// What one PE does; the same on GPUs and CPUs, as a thread or a process.
fn ring(pe: &mut Pe, a: &Args, bytes: usize, blocks: u32, t0: Instant) -> Result<f64, PeError> {
    let me = pe.my_pe();
    let progress = |what: &str| {
        if a.progress {
            eprintln!("[{:>8.3} s] PE {me}: {what}", t0.elapsed().as_secs_f64());
        }
    };
    progress("up; loading the ring_put module");
    if me == 0 {
        println!(
            "PE 0: up after {:.3} s (init of every PE, collective)",
            t0.elapsed().as_secs_f64()
        );
    }
    let module = pe.load_module(ibgda_examples::RING_PUT_PTX)?;
    let (send, recv, fetched) = (
        pe.malloc::<u8>(bytes)?,
        pe.malloc::<u8>(bytes)?,
        pe.malloc::<u8>(bytes)?,
    );
    let arrived = pe.malloc::<u64>(1)?;
    let n = pe.n_pes();
    let prev = (me + n - 1) % n;
    let mut secs = 0.0;
    for round in 1..=a.rounds {
        pe.write(&send, 0, &data(round, me, bytes))?;
        pe.barrier()?;
        let t = Instant::now();
        progress(&format!("round {round}: launching"));
        // SAFETY: every pointer is a live symmetric buffer of `bytes` bytes (or one u64) of this
        // PE, alive until the synchronize below.
        unsafe {
            pe.launch(
                &module,
                ring_put::Kernel,
                Grid::new(blocks, 512),
                (
                    pe.state(),
                    pe.const_ptr(&send)?,
                    pe.mut_ptr(&recv)?,
                    pe.mut_ptr(&fetched)?,
                    bytes as u64,
                    pe.mut_ptr(&arrived)?,
                    round,
                ),
            )?
        };
        pe.synchronize()?;
        secs += t.elapsed().as_secs_f64();
        progress(&format!("round {round}: kernel done"));
        pe.barrier()?;
        let want = data(round, prev, bytes);
        let (got_recv, got_fetched) = (pe.read(&recv, 0, bytes)?, pe.read(&fetched, 0, bytes)?);
        check("recv", me, round, &got_recv, &want)?;
        check("fetched", me, round, &got_fetched, &want)?;
    }
    if let Some((nic, _)) = pe.emulated_nic() {
        let (mut wqes, mut doorbells) = (0, 0);
        for q in nic.emulated_qps() {
            let s = q.stats()?;
            wqes += s.wqes_executed;
            doorbells += s.doorbells_seen;
        }
        println!("PE {me}: emulated mlx5 device executed {wqes} WQEs after {doorbells} doorbells");
    }
    if let Some(p) = pe.cpu_proxy() {
        let s = p.stats();
        println!(
            "PE {me}: proxy took {} descriptors in {} batches over {} threads",
            s.iter().map(|t| t.descriptors).sum::<u64>(),
            s.iter().map(|t| t.batches).sum::<u64>(),
            s.len()
        );
    }
    Ok(secs)
}

fn run(a: &Args) -> Result<(), PeError> {
    let mut config = Config::from_env()?;
    if a.cpu {
        config.device = DeviceChoice::Cpu;
    }
    let gpu = match config.device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Gpu => true,
        DeviceChoice::Auto => ibgda::cuda::device_count().unwrap_or(0) > 0,
    };
    match (&a.transport, std::env::var_os("IBGDA_TRANSPORT")) {
        (Some(t), _) => {
            config.transport = t.parse()?;
            config.peer_transports.clear();
        }
        (None, None) if !gpu => config.transport = PeerTransport::Ibgda,
        _ => {}
    }
    if !gpu {
        config.proxy.pin = false;
    }
    let (bytes, blocks) = if gpu {
        (a.bytes, a.blocks)
    } else {
        (a.bytes.min(4 << 20), a.blocks.min(8))
    };
    config.heap_size = config.heap_size.min(64 << 20).max(3 * bytes as u64 + (8 << 20));
    let launched = ibgda::bootstrap::LaunchEnv::from_env()?;
    let pes = launched.as_ref().map_or(a.pes, |e| e.world_size);
    let gpus = if gpu { ibgda::cuda::device_count()? as u32 } else { 0 };
    if !gpu {
        // (On GPUs, `ibgda::run` spreads the PEs over them.)
        println!("ring_put: no GPU in use: CPU emulation (device code on CPU threads)");
    }
    let how = match config.transport {
        PeerTransport::Ibgda => "IBGDA: device code builds mlx5 WQEs, rings doorbells and polls CQs of RC QPs on the emulated mlx5 device",
        PeerTransport::Proxy => "CPU proxy: device code writes descriptors into rings; proxy threads post the WQEs to the emulated mlx5 device",
        _ => "P2P: loads and stores into the peers' heaps",
    };
    let layout = match &launched {
        Some(e) => format!("one process per PE ({} variables), this is PE {}", e.source, e.rank),
        None => "threads of one process".into(),
    };
    if launched.as_ref().is_none_or(|e| e.rank == 0) {
        println!(
            "ring_put: {pes} PEs ({layout}) on {}, {bytes} bytes per PE per round, {} rounds; transport {how}",
            if gpu {
                format!("{} GPU(s)", gpus.min(pes))
            } else {
                "the CPU emulation".into()
            },
            a.rounds
        );
    }
    let t0 = Instant::now();
    // Every PE of the job: threads of this process, or this process's PE under a launcher.
    let results = ibgda::run(a.pes, config, |pe| ring(pe, a, bytes, blocks, t0))?;
    for (pe, secs) in results {
        println!(
            "PE {pe}: {} rounds, {bytes} bytes received and fetched per round, every byte checked: OK ({:.2} ms per round incl. launch, {:.1} GB/s put+get)",
            a.rounds,
            secs * 1e3 / a.rounds as f64,
            2.0 * bytes as f64 * a.rounds as f64 / secs / 1e9
        );
    }
    Ok(())
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("ring_put failed: {e}");
        std::process::exit(1);
    }
}

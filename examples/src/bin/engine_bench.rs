//! The CPU engine's capacity: how many WQEs per second (and bytes) the emulated device's CPU
//! engine thread executes when nothing else is in the way. WRITEs are written straight into
//! deep send queues in host memory with their doorbells rung, then one thread runs the engine's
//! passes (what the engine thread does) until every queue is drained; the median of `--reps`.
//! The GPU engine's capacity is `compare_bench`'s `engine_wqe_rate` / `engine_bw` rows.
//!
//!   cargo run --release -p ibgda-examples --bin engine_bench -- --csv docs/results/engine-cpu.csv

use clap::Parser;
use ibgda::emu::{access, CqMode, Fabric, HostRegion};
use ibgda_abi::mlx5::{doorbell_value, fm_ce_se, opcode, wqe_ds};
use ibgda_device::ibgda::wqe;
use std::io::Write;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "The emulated NIC's CPU engine: WQEs per second with pre-built queues")]
struct Args {
    /// WRITE sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "8,4096,65536")]
    sizes: Vec<u32>,
    /// QPs (each with a 2^15-WQEBB send queue, filled to 32,704 WQEs).
    #[arg(long, default_value_t = 4)]
    qps: u32,
    /// Repetitions per size (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// CSV output (`mode,metric,x,value,unit`).
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
}

const LOG_DEPTH: u32 = 15;
const PER_QP: u16 = (1 << LOG_DEPTH) - 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let fabric = Fabric::new();
    let (dev_a, dev_b) = (fabric.open_device(), fabric.open_device());
    let (pa, pb) = (dev_a.alloc_pd(), dev_b.alloc_pd());
    let max = *a.sizes.iter().max().unwrap_or(&8) as usize;
    // 64 destination slots of the largest size, so a batch's WRITEs do not overlap.
    let (src, dst) = (HostRegion::filled(max, 64, 0x5a), HostRegion::zeroed(64 * max, 64));
    // SAFETY: both regions outlive the fabric's use of them (the engine only runs in this
    // function, below, while they are alive).
    let (lkey, rkey) = unsafe {
        (
            dev_a.register(pa, src.addr(), max as u64, access::LOCAL_WRITE)?.key,
            dev_b
                .register(pb, dst.addr(), 64 * max as u64, access::REMOTE_WRITE)?
                .key,
        )
    };
    let mut qps = Vec::new();
    for _ in 0..a.qps {
        let cq = dev_a.create_cq(0, CqMode::Collapsed)?;
        let q = dev_a.create_qp(pa, &cq, LOG_DEPTH)?;
        let r = dev_b.create_qp(pb, &dev_b.create_cq(0, CqMode::Collapsed)?, 2)?;
        q.to_init()?;
        q.to_rtr(r.address())?;
        q.to_rts()?;
        r.to_init()?;
        r.to_rtr(q.address())?;
        qps.push((q, cq, r));
    }
    let mut rows = Vec::new();
    let mut produced = vec![0u64; qps.len()];
    for &bytes in &a.sizes {
        let mut times = Vec::new();
        for _ in 0..a.reps.max(1) {
            for ((q, _, _), pi) in qps.iter().zip(produced.iter_mut()) {
                for k in 0..PER_QP as u64 {
                    let i = *pi + k;
                    // The last WQE asks for a CQE; the rest are unsignalled, as a poster batches.
                    let fm = if k + 1 == PER_QP as u64 { fm_ce_se::CQ_UPDATE } else { 0 };
                    let segs = [
                        wqe::ctrl(i as u16, opcode::RDMA_WRITE, 0, q.qpn(), fm, wqe_ds::RDMA, 0),
                        wqe::raddr(dst.addr() + (k % 64) * bytes as u64, rkey),
                        wqe::data(bytes, lkey, src.addr()),
                    ];
                    let slot = q.sq() + ((i & ((1 << LOG_DEPTH) - 1)) << 6);
                    for (s, seg) in segs.iter().enumerate() {
                        // SAFETY: a WQEBB of the QP's send queue that the engine has consumed
                        // (every earlier round was drained).
                        unsafe { ((slot + 16 * s as u64) as *mut [u32; 4]).write_volatile(*seg) };
                    }
                }
                *pi += PER_QP as u64;
                let end = *pi as u16;
                // SAFETY: the QP's DBR and doorbell register are live host memory.
                unsafe {
                    ((q.dbr() + 4) as *mut u32).write_volatile((end as u32).to_be());
                    let db = doorbell_value(end, q.qpn());
                    (q.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
                }
            }
            let t = Instant::now();
            loop {
                fabric.service_once();
                let mut drained = true;
                for ((q, _, _), pi) in qps.iter().zip(&produced) {
                    drained &= q.consumed()? >= *pi;
                }
                if drained {
                    break;
                }
            }
            times.push(t.elapsed().as_secs_f64());
            for (q, _, _) in &qps {
                let s = q.stats()?;
                if s.state != ibgda::emu::QpState::Rts {
                    return Err(format!("QP {:#x} failed: {s:?}", q.qpn()).into());
                }
            }
        }
        if dst.len() >= bytes as usize {
            // SAFETY: the engine is idle; `dst` is live.
            let landed = unsafe { std::slice::from_raw_parts(dst.as_ptr::<u8>(), bytes as usize) };
            if landed.iter().any(|&b| b != 0x5a) {
                return Err(format!("{bytes} B: the destination does not hold the source").into());
            }
        }
        times.sort_by(|x, y| x.total_cmp(y));
        let t = times[times.len() / 2];
        let wqes = PER_QP as f64 * qps.len() as f64;
        let rate = wqes / t / 1e6;
        let gbps = wqes * bytes as f64 / t / 1e9;
        println!(
            "CPU engine, {} QPs, {bytes} B WRITEs: {rate:.2} M WQE/s, {gbps:.2} GB/s",
            qps.len()
        );
        rows.push(format!("cpu-engine,engine_wqe_rate,{bytes},{rate:.4},Mops/s"));
        rows.push(format!("cpu-engine,engine_bw,{bytes},{gbps:.4},GB/s"));
    }
    if let Some(path) = &a.csv {
        let mut f = std::fs::File::create(path)?;
        writeln!(f, "mode,metric,x,value,unit")?;
        for r in rows {
            writeln!(f, "{r}")?;
        }
    }
    Ok(())
}

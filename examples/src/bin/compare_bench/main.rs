//! One process, one run, the same kernels over every way ibgda reaches a peer: P2P loads and
//! stores, GPU-initiated IBGDA (GPU doorbell), IBGDA with a CPU-assisted doorbell, and the full
//! CPU proxy. Two PEs (on two GPUs when there are two, else on one).
//!
//! Measures put and get bandwidth over message sizes (block-scope `_nbi`, 32 blocks by default),
//! the 8-byte `p` message rate over issuing threads (`p_rate`: each thread its own word, so a
//! warp writes consecutive words, which IBGDA combines as NVSHMEM does; `p_rate_scattered`: every
//! other word, one WQE per `p`), the `atomic_fetch_add` rate, `put_signal`
//! ping-pong latency, and the proxy's `p` rate against its thread count. Every point is the median
//! of `--reps` launches timed with CUDA events after a warm-up launch; sources are random, and
//! every destination is checked after its sweep point (a mismatch fails the run).
//!
//! Output: a table on stdout, `--csv`, and with `--plots DIR` PNG plots (bandwidth vs size, rate
//! vs threads, latency, proxy scaling). `--plot-from CSV --plots DIR` redraws the plots of an
//! earlier run on any machine (they need a TrueType font: DejaVu Sans, or `IBGDA_PLOT_FONT`).

mod evidence;
mod measure;
mod rows;

use clap::Parser;
use evidence::capacity_rows;
use ibgda::transport::ibgda::DoorbellMode;
use ibgda::{run_in_process, Config, PeerTransport};
use indicatif::{ProgressBar, ProgressStyle};
use measure::{measure, p_rate_block, p_rate_point, sizes, window_of};
use rows::{emit, link_ninety_percent, ninety_percent, read_csv, rows_for_plot, write_csv, Row};
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
    /// Threads per block of the `atomic_fetch_add` sweep (at most what the kernel allows). A block
    /// posts through one QP or channel and a QP has at most 16 READs and atomics outstanding
    /// (`max_rd_atomic`), so 8,192 threads in 32 blocks of 256 keep 32 QPs busy where 8 blocks of
    /// 1,024 keep 8.
    #[arg(long, default_value_t = 256)]
    atomic_block: u32,
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
        let r = run_in_process(2, config.clone(), |pe| measure(pe, a, mode, &bar))
            .map_err(in_job(&format!("the {mode} mode")))?;
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
        c.qps_per_peer_auto = false;
        c.nic_model = None;
        let r = run_in_process(2, c, |pe| {
            ibgda_bundled::load(pe)?;
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
            let rows = capacity_rows(&points);
            if pe.my_pe() == 0 {
                for k in 1..=rows.len() {
                    emit(&rows[..k]);
                }
            }
            Ok(rows)
        })
        .map_err(in_job("the emulated NIC's capacity step"))?;
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
            ibgda_bundled::load(pe)?;
            let words = pe.malloc::<u64>(a.scaling_threads as usize)?;
            let block = p_rate_block(pe, a)?;
            let mut rows = Vec::new();
            p_rate_point(pe, a, &words, a.scaling_threads, block, 1, "proxy", &mut rows)?;
            for r in &mut rows {
                r.metric = "proxy_scaling".into();
                r.mode = format!("proxy ({} issuing threads)", a.scaling_threads);
                r.x = t as f64;
            }
            if pe.my_pe() == 0 {
                emit(&rows);
            }
            Ok(rows)
        })
        .map_err(in_job(&format!("proxy scaling with {t} proxy threads")))?;
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

/// Names the job (one set of PEs of this process) an error came from: the jobs run in turn on the
/// same GPUs, so which one failed is the first thing to know.
fn in_job(job: &str) -> impl FnOnce(ibgda::Error) -> String + '_ {
    move |e| format!("{job}: {e}")
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

#[allow(dead_code)] // draw_ep is ep_plot's
#[path = "../../plot.rs"]
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
}

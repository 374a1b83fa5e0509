//! `ep-check`: runs the dispatch/combine self-check ([`ibgda_ep::check`]) on every PE and prints
//! what was compared. Threads with `--pes N`; one process per PE under a launcher
//! (`ibgda-run -n 4 ep-check`, torchrun, Slurm). Exits non-zero on the first mismatch.
use clap::Parser;
use ibgda::{run_in_process, Config, Pe};

#[derive(Parser)]
#[command(about = "MoE dispatch/combine self-check against the host reference")]
struct Args {
    /// PEs as threads of this process (without a launcher).
    #[arg(long, default_value_t = 2)]
    pes: u32,
    /// Channels per token (a multiple of 128).
    #[arg(long, default_value_t = 256)]
    hidden: u32,
    /// Rounds of every case (exercises both buffer parities and the cumulative counters).
    #[arg(long, default_value_t = 2)]
    rounds: u32,
}

fn one(pe: &mut Pe, args: &Args) -> Result<String, ibgda_ep::EpError> {
    let transport = (0..pe.n_pes())
        .map(|p| format!("{:?}", pe.transport_to(p)))
        .collect::<Vec<_>>()
        .join(",");
    let r = ibgda_ep::check::run(pe, args.hidden, args.rounds)?;
    Ok(format!(
        "ep-check: PE {}/{} ({}, transports {transport}): {} cases, {} rows compared: ok",
        pe.my_pe(),
        pe.n_pes(),
        if pe.is_gpu() { "gpu" } else { "cpu emulation" },
        r.cases.len(),
        r.rows
    ))
}

fn main() {
    let args = Args::parse();
    let result = (|| -> Result<Vec<String>, ibgda_ep::EpError> {
        let config = Config::from_env()?;
        if std::env::var_os("WORLD_SIZE").is_some() {
            let mut pe = Pe::from_env(config)?;
            let line = one(&mut pe, &args);
            match line {
                Ok(l) => {
                    pe.finalize()?;
                    Ok(vec![l])
                }
                Err(e) => {
                    pe.abort();
                    Err(e)
                }
            }
        } else {
            let lines = run_in_process(args.pes, config, |pe| Ok(one(pe, &args)))?;
            lines.into_iter().collect()
        }
    })();
    match result {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => {
            eprintln!("ep-check: {e}");
            std::process::exit(1);
        }
    }
}

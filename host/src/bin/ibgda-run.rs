//! `ibgda-run -n N PROGRAM [ARGS...]`: starts N processes of PROGRAM on this machine, one per PE,
//! with the variables torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`), so a program written for torchrun runs unchanged.
//!
//! When a rank fails, the others are given `--grace` seconds to notice (they report
//! `PeerFailed` naming it) before they are killed; the exit status is the first failed rank's.

use clap::Parser;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "ibgda-run",
    about = "Start N processes of PROGRAM, one per PE, with torchrun's environment variables"
)]
struct Args {
    /// Number of processes (PEs).
    #[arg(short = 'n', long = "np")]
    n: u32,
    /// Rendezvous port (default: a free port).
    #[arg(long)]
    master_port: Option<u16>,
    /// Seconds the other ranks get to exit on their own after one fails, before they are killed.
    #[arg(long, default_value_t = 60)]
    grace: u64,
    /// The program, then its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn describe(s: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => s.to_string(),
    }
}

fn status_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn main() {
    let a = Args::parse();
    if a.n == 0 {
        eprintln!("ibgda-run: -n must be at least 1");
        std::process::exit(2);
    }
    let port = match a.master_port.map(Ok).unwrap_or_else(free_port) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ibgda-run: cannot find a free port for the rendezvous: {e}");
            std::process::exit(2);
        }
    };
    let mut children: Vec<(u32, Child)> = Vec::new();
    for rank in 0..a.n {
        let spawned = Command::new(&a.command[0])
            .args(&a.command[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", a.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", a.n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match spawned {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                eprintln!("ibgda-run: cannot start rank {rank} ({}): {e}", a.command[0]);
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                std::process::exit(127);
            }
        }
    }
    let mut first_failure: Option<(u32, ExitStatus)> = None;
    let mut failed_at: Option<Instant> = None;
    let mut running: Vec<(u32, Child)> = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        for (rank, mut c) in running {
            match c.try_wait() {
                Ok(Some(s)) => {
                    if !s.success() {
                        eprintln!("ibgda-run: rank {rank} (pid {}) ended with {}", c.id(), describe(&s));
                        if first_failure.is_none() {
                            first_failure = Some((rank, s));
                            failed_at = Some(Instant::now());
                        }
                    }
                }
                Ok(None) => still.push((rank, c)),
                Err(e) => {
                    eprintln!("ibgda-run: waiting for rank {rank}: {e}");
                    still.push((rank, c));
                }
            }
        }
        running = still;
        if let Some(t) = failed_at {
            if t.elapsed() > Duration::from_secs(a.grace) && !running.is_empty() {
                for (rank, c) in &mut running {
                    eprintln!(
                        "ibgda-run: rank {rank} still running {} s after a rank failed: killing it",
                        a.grace
                    );
                    let _ = c.kill();
                    let _ = c.wait();
                }
                running.clear();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((rank, s)) = first_failure {
        eprintln!("ibgda-run: failed: rank {rank} first ({})", describe(&s));
        std::process::exit(status_code(&s));
    }
}

//! Running a job of PEs: the one entry point [`run`] (threads of this process, or this process's
//! PE under a launcher), [`run_in_process`], and the choice of the error a failed job reports.

use super::Pe;
use crate::bootstrap::{Bootstrap, ThreadBootstrap};
use crate::config::Config;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Runs `body` on every PE of the job and returns each PE's result this process holds, as
/// `(PE, value)` in rank order: the one entry point of a host program.
///
/// - Under a launcher (`ibgda-run`, torchrun, Slurm: see [`crate::bootstrap::LaunchEnv`]) this
///   process is one PE: `body` runs once on it, and the result holds that one PE. `threads` is
///   ignored (the launcher's world size counts).
/// - Otherwise `threads` PEs run as threads of this process ([`run_in_process`]). On GPUs they
///   are spread over the GPUs there are (`threads / GPUs`, rounded up, per GPU) unless
///   `IBGDA_PES_PER_GPU` or `config.pes_per_gpu` (above 1) says otherwise.
///
/// On a GPU or on the CPU emulation, as `config.device` says. Every PE is finalized when its body
/// returns `Ok`; when one returns `Err` or panics, it is aborted, so peers waiting in host
/// collectives return instead of hanging, and that PE's own error is returned (in the body's
/// error type `E`; the runtime's errors convert into it), never a peer's echo of it. A panic is
/// resumed after every PE is torn down.
///
/// ```no_run
/// type Error = Box<dyn std::error::Error + Send + Sync>;
///
/// fn main() -> Result<(), Error> {
///     let config = ibgda::Config::from_env()?;
///     let sums = ibgda::run(2, config, |pe| -> Result<u32, Error> {
///         let buf = pe.malloc::<u64>(1)?;
///         pe.write(&buf, 0, &[pe.my_pe() as u64])?;
///         pe.barrier()?;
///         Ok(pe.n_pes())
///     })?;
///     for (rank, n) in sums {
///         println!("PE {rank} of {n}: done");
///     }
///     Ok(())
/// }
/// ```
pub fn run<T, E, F>(threads: u32, config: Config, body: F) -> std::result::Result<Vec<(u32, T)>, E>
where
    T: Send,
    E: From<Error> + Send,
    F: Fn(&mut Pe) -> std::result::Result<T, E> + Sync,
{
    if crate::bootstrap::LaunchEnv::from_env()?.is_some() {
        let mut pe = Pe::from_env(config)?;
        let me = pe.my_pe();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut pe)));
        return match out {
            Ok(Ok(v)) => {
                pe.finalize()?;
                Ok(vec![(me, v)])
            }
            Ok(Err(e)) => {
                pe.abort();
                Err(e)
            }
            Err(panic) => {
                pe.abort();
                drop(pe);
                std::panic::resume_unwind(panic)
            }
        };
    }
    let mut config = config;
    if config.pes_per_gpu == 1 && std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        let gpus = match config.device {
            crate::DeviceChoice::Cpu => 0,
            _ => crate::cuda::device_count().unwrap_or(0) as u32,
        };
        if gpus > 0 && threads > gpus {
            config.pes_per_gpu = threads.div_ceil(gpus);
        }
    }
    let results = run_threads(threads, config, |pe| body(pe).map(|v| (pe.my_pe(), v)));
    results.map_err(|f| match f {
        Failed::Body { error, .. } => error,
        Failed::Runtime(e) => E::from(e),
    })
}

/// Runs `body` on `n_pes` PEs in this process, one thread per PE, and returns each PE's result
/// in rank order. PEs are placed `config.pes_per_gpu` to a GPU (or on the CPU emulation, per
/// `config.device`). [`run`] is the entry point that also runs under launchers.
///
/// If any PE fails, the others are told (their host collectives return `PeerFailed`), and the
/// error returned is the first PE's own failure (not a `PeerFailed` echo). A failed PE is not
/// torn down while others run: its heap, NIC engine and proxy stay until every PE's thread has
/// returned, then every PE's kernels are waited for and its engine and proxy stopped before any
/// memory is released (a peer's kernel or NIC may be writing into the failed PE's heap). A panic
/// in `body` (a failed assertion) counts as that PE failing, and is resumed once every PE is
/// torn down.
///
/// Refuses (a `Config` error) to start in a process that a launcher (`ibgda-run`, torchrun) made
/// one rank of several, as every rank would start its own whole job on the same GPUs.
pub fn run_in_process<T, F>(n_pes: u32, config: Config, body: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&mut Pe) -> Result<T> + Sync,
{
    refuse_launched_ranks(n_pes, crate::bootstrap::LaunchEnv::from_env())?;
    run_threads(n_pes, config, body).map_err(|f| match f {
        Failed::Body { error, .. } | Failed::Runtime(error) => error,
    })
}

/// Refuses to start `n_pes` PEs in this process when a launcher (`ibgda-run`, torchrun) made it
/// one rank of several (`RANK` / `WORLD_SIZE`): every rank would start its own whole job on the
/// same GPUs, and the jobs would share the node's state (they fail at random, with traps rather
/// than errors). Slurm's variables do not count: a batch script's one process has them too.
fn refuse_launched_ranks(n_pes: u32, launch: Result<Option<crate::bootstrap::LaunchEnv>>) -> Result<()> {
    match launch {
        Ok(Some(e)) if e.source == "torchrun" && e.world_size > 1 => Err(Error::Config {
            name: "RANK / WORLD_SIZE",
            value: format!("{} / {}", e.rank, e.world_size),
            why: format!(
                "run_in_process starts all {n_pes} PEs in this one process, but the launcher made it rank {} of {}: \
                 every rank would run its own job on the same GPUs. Start the program once, without a launcher \
                 (or use ibgda::run, which follows the launcher)",
                e.rank, e.world_size
            ),
        }),
        // A launcher's variables that do not even parse: not one process alone either.
        Err(e) if std::env::var_os("WORLD_SIZE").is_some() => Err(e),
        _ => Ok(()),
    }
}

/// How a job of PE threads failed: a body's own error (`echo` when a peer had already failed,
/// so it is likely that failure seen from here), or the runtime's (init, finalize).
enum Failed<E> {
    Body { error: E, echo: bool },
    Runtime(Error),
}

/// [`run_in_process`] for a body with its own error type.
fn run_threads<T, E, F>(n_pes: u32, config: Config, body: F) -> std::result::Result<Vec<T>, Failed<E>>
where
    T: Send,
    E: Send,
    F: Fn(&mut Pe) -> std::result::Result<T, E> + Sync,
{
    let group = ThreadBootstrap::group(n_pes, config.collective_timeout);
    let outcomes: Vec<PeEnd<T, E>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|b| {
                let (config, body) = (config.clone(), &body);
                s.spawn(move || {
                    let boot: Arc<dyn Bootstrap> = Arc::new(b.clone());
                    let mut pe = match Pe::init(boot, config) {
                        Ok(pe) => pe,
                        Err(e) => {
                            b.abort();
                            return (Outcome::Done(Err(Failed::Runtime(e))), None);
                        }
                    };
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut pe)));
                    match out {
                        Ok(Ok(v)) => match pe.try_finalize() {
                            Ok(()) => (Outcome::Done(Ok(v)), None),
                            Err((e, pe)) => {
                                b.abort();
                                (Outcome::Done(Err(Failed::Runtime(e))), Some(pe))
                            }
                        },
                        Ok(Err(error)) => {
                            // A peer failed first, or this PE's GPU context ended with another
                            // PE's device error: its failure is likely an echo of theirs.
                            let echo = pe.failed_peer().is_some() || pe.faulted_by_another();
                            pe.abort();
                            (Outcome::Done(Err(Failed::Body { error, echo })), Some(Box::new(pe)))
                        }
                        Err(panic) => {
                            pe.abort();
                            (Outcome::Panicked(panic), Some(Box::new(pe)))
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a PE thread panicked outside its body"))
            })
            .collect()
    });
    let (outcomes, mut survivors): (Vec<_>, Vec<_>) = outcomes.into_iter().unzip();
    // A device error a failed PE recorded: the root cause when every body's failure was an echo
    // (a PE whose kernel trapped may itself have been waiting in a collective when a PE sharing
    // its GPU saw the context end).
    let recorded = survivors.iter().flatten().find_map(|pe| pe.recorded_error());
    for pe in survivors.iter_mut().flatten() {
        pe.quiesce();
    }
    drop(survivors);
    let mut results = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        match o {
            Outcome::Done(r) => results.push(r),
            Outcome::Panicked(panic) => std::panic::resume_unwind(panic),
        }
    }
    first_failure(results, recorded)
}

/// How the body of one PE thread ended.
enum Outcome<T, E> {
    Done(std::result::Result<T, Failed<E>>),
    Panicked(Box<dyn std::any::Any + Send>),
}

/// A PE thread's outcome and, if it failed, the PE itself, torn down after every thread ended.
type PeEnd<T, E> = (Outcome<T, E>, Option<Box<Pe>>);

/// All results, or the most informative failure: a body's own error, then a runtime error that is
/// not an echo of another PE's failure, then a device error a PE `recorded`, then a body's error
/// after a peer failed, then an echo (each the lowest rank's).
fn first_failure<T, E>(
    results: Vec<std::result::Result<T, Failed<E>>>,
    recorded: Option<Error>,
) -> std::result::Result<Vec<T>, Failed<E>> {
    let mut out = Vec::with_capacity(results.len());
    let mut worst: Option<(u8, Failed<E>)> = None;
    for r in results {
        let f = match r {
            Ok(v) => {
                out.push(v);
                continue;
            }
            Err(f) => f,
        };
        let rank = match &f {
            Failed::Body { echo: false, .. } => 0,
            Failed::Runtime(e) if !matches!(e, Error::PeerFailed { .. } | Error::SharedContextFault { .. }) => 1,
            Failed::Body { echo: true, .. } => 2,
            Failed::Runtime(_) => 3,
        };
        if worst.as_ref().is_none_or(|(r, _)| rank < *r) {
            worst = Some((rank, f));
        }
    }
    match (worst, recorded) {
        (Some((rank, _)), Some(device)) if rank >= 2 => Err(Failed::Runtime(device)),
        (Some((_, f)), _) => Err(f),
        (None, _) => Ok(out),
    }
}

#[cfg(test)]
mod failure_tests {
    use super::{first_failure, Error, Failed};

    fn config_error(what: &str) -> Error {
        Error::Config {
            name: "test",
            value: what.into(),
            why: String::new(),
        }
    }

    fn which(f: Failed<&'static str>) -> String {
        match f {
            Failed::Body { error, .. } => format!("body {error}"),
            Failed::Runtime(Error::Config { value, .. }) => format!("runtime {value}"),
            Failed::Runtime(e) => format!("runtime {e}"),
        }
    }

    #[test]
    fn a_pes_own_failure_wins_over_echoes_and_a_recorded_device_error_over_echoes_only() {
        let echo = |e| Err(Failed::Body { error: e, echo: true });
        let own = |e| Err(Failed::Body { error: e, echo: false });
        // PE 0 only echoed PE 1's failure: PE 1's own error, though PE 0 comes first.
        let r: Vec<Result<u32, _>> = vec![echo("pe0 echo"), own("pe1 own")];
        assert_eq!(which(first_failure(r, None).unwrap_err()), "body pe1 own");
        // Every body only echoed (PE 0 in a barrier when PE 1 saw their shared context end): the
        // device error a PE recorded is the report.
        let r: Vec<Result<u32, _>> = vec![echo("pe0 peer failed"), echo("pe1 context ended")];
        assert_eq!(
            which(first_failure(r, Some(config_error("pe0 device"))).unwrap_err()),
            "runtime pe0 device"
        );
        // A body's own failure is not replaced by a record.
        let r: Vec<Result<u32, _>> = vec![own("pe0 own"), echo("pe1 echo")];
        assert_eq!(
            which(first_failure(r, Some(config_error("x"))).unwrap_err()),
            "body pe0 own"
        );
        // All well: every value in order.
        let r: Vec<Result<u32, Failed<&str>>> = vec![Ok(1), Ok(2)];
        assert_eq!(first_failure(r, None).ok(), Some(vec![1, 2]));
    }
}

#[cfg(test)]
mod launched_rank_tests {
    use super::refuse_launched_ranks;
    use crate::bootstrap::LaunchEnv;

    fn launch(vars: &[(&str, &str)]) -> crate::error::Result<Option<LaunchEnv>> {
        LaunchEnv::from_vars(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn in_process_jobs_refuse_to_start_in_one_rank_of_a_launched_job() {
        let e = refuse_launched_ranks(
            2,
            launch(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 1 of 2") && e.contains("run_in_process starts all 2 PEs"),
            "{e}"
        );
        // Alone, or the only rank of a launch: fine.
        refuse_launched_ranks(2, launch(&[])).unwrap();
        refuse_launched_ranks(
            2,
            launch(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "29500")]),
        )
        .unwrap();
        // Slurm's variables alone: a batch script's one process has them too.
        let slurm = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "node1"),
        ]);
        assert_eq!(slurm.as_ref().unwrap().as_ref().unwrap().source, "Slurm");
        refuse_launched_ranks(2, slurm).unwrap();
    }
}

//! Where this process sits in a multi-process job, read from the variables launchers already set:
//! torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`), `ibgda-run` (the same names) and Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`, the node list and job id).

use crate::error::{Error, Result};

/// A process's place in a job and where its rendezvous is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank (the PE index).
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// Rank among the processes of this node (picks the GPU).
    pub local_rank: u32,
    /// Processes on this node.
    pub local_world_size: u32,
    /// Host of rank 0's rendezvous.
    pub master_addr: String,
    /// Its TCP port.
    pub master_port: u16,
    /// Which launcher's variables these came from (for messages).
    pub source: &'static str,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T> {
    v.trim().parse::<T>().map_err(|_| Error::Config {
        name,
        value: v.to_string(),
        why: "expected a non-negative integer".into(),
    })
}

impl LaunchEnv {
    /// The launch described by the environment: torchrun / `ibgda-run` variables first, then
    /// Slurm's; `None` when neither is set (a single process).
    pub fn from_env() -> Result<Option<LaunchEnv>> {
        Self::from_vars(var)
    }

    /// [`LaunchEnv::from_env`] over any variable source (tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        if let (Some(rank), Some(size)) = (get("RANK"), get("WORLD_SIZE")) {
            let rank: u32 = number("RANK", &rank)?;
            let world_size: u32 = number("WORLD_SIZE", &size)?;
            let local_rank = match get("LOCAL_RANK") {
                Some(v) => number("LOCAL_RANK", &v)?,
                None => rank,
            };
            let local_world_size = match get("LOCAL_WORLD_SIZE") {
                Some(v) => number("LOCAL_WORLD_SIZE", &v)?,
                None => world_size,
            };
            let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            let master_port = match (get("IBGDA_BOOTSTRAP_PORT"), get("MASTER_PORT")) {
                (Some(v), _) => number("IBGDA_BOOTSTRAP_PORT", &v)?,
                // Under torchrun, its agent's TCPStore already listens on MASTER_PORT: ours takes
                // the next port.
                (None, Some(v)) if get("TORCHELASTIC_RUN_ID").is_some() => {
                    let p: u16 = number("MASTER_PORT", &v)?;
                    p.checked_add(1).ok_or_else(|| Error::Config {
                        name: "MASTER_PORT",
                        value: v.clone(),
                        why: "under torchrun the bootstrap uses MASTER_PORT + 1; set IBGDA_BOOTSTRAP_PORT".into(),
                    })?
                }
                (None, Some(v)) => number("MASTER_PORT", &v)?,
                (None, None) => {
                    return Err(Error::Config {
                        name: "MASTER_PORT",
                        value: String::new(),
                        why: "RANK and WORLD_SIZE are set but MASTER_PORT is not: the ranks have no rendezvous".into(),
                    })
                }
            };
            return Self::checked(LaunchEnv {
                rank,
                world_size,
                local_rank,
                local_world_size,
                master_addr,
                master_port,
                source: "torchrun",
            })
            .map(Some);
        }
        let Some(procid) = get("SLURM_PROCID") else {
            return Ok(None);
        };
        let rank: u32 = number("SLURM_PROCID", &procid)?;
        let world_size: u32 = match get("SLURM_NTASKS").or_else(|| get("SLURM_NPROCS")) {
            Some(v) => number("SLURM_NTASKS", &v)?,
            None => {
                return Err(Error::Config {
                    name: "SLURM_NTASKS",
                    value: String::new(),
                    why: "SLURM_PROCID is set but SLURM_NTASKS is not".into(),
                })
            }
        };
        let local_rank = match get("SLURM_LOCALID") {
            Some(v) => number("SLURM_LOCALID", &v)?,
            None => 0,
        };
        let local_world_size = match get("SLURM_NTASKS_PER_NODE").or_else(|| get("SLURM_TASKS_PER_NODE")) {
            // "4" or "4(x2)" or "4(x2),3": this node's count is not knowable from the list
            // alone; the first entry is the usual (uniform) case.
            Some(v) => number("SLURM_TASKS_PER_NODE", v.split(['(', ',']).next().unwrap_or(""))?,
            None => world_size,
        };
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a,
            None => {
                let list = get("SLURM_STEP_NODELIST")
                    .or_else(|| get("SLURM_JOB_NODELIST"))
                    .or_else(|| get("SLURM_NODELIST"))
                    .ok_or_else(|| Error::Config {
                        name: "SLURM_JOB_NODELIST",
                        value: String::new(),
                        why: "neither MASTER_ADDR nor a Slurm node list is set: no host for rank 0".into(),
                    })?;
                first_host(&list).ok_or_else(|| Error::Config {
                    name: "SLURM_JOB_NODELIST",
                    value: list.clone(),
                    why: "could not read a first host from the node list".into(),
                })?
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(v) => number("MASTER_PORT", &v)?,
            // The usual rule: a port derived from the job id, the same on every node.
            None => match get("SLURM_JOB_ID") {
                Some(id) => 20_000 + (number::<u64>("SLURM_JOB_ID", &id)? % 10_000) as u16,
                None => {
                    return Err(Error::Config {
                        name: "MASTER_PORT",
                        value: String::new(),
                        why: "neither MASTER_PORT nor SLURM_JOB_ID is set".into(),
                    })
                }
            },
        };
        Self::checked(LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            source: "Slurm",
        })
        .map(Some)
    }

    fn checked(e: LaunchEnv) -> Result<LaunchEnv> {
        let bad = |name, value: u32, why: String| {
            Err(Error::Config {
                name,
                value: value.to_string(),
                why,
            })
        };
        if e.world_size == 0 {
            return bad("WORLD_SIZE", 0, "must be at least 1".into());
        }
        if e.rank >= e.world_size {
            return bad("RANK", e.rank, format!("must be below WORLD_SIZE={}", e.world_size));
        }
        if e.local_world_size == 0 || e.local_world_size > e.world_size {
            return bad(
                "LOCAL_WORLD_SIZE",
                e.local_world_size,
                format!("must be 1..=WORLD_SIZE={}", e.world_size),
            );
        }
        if e.local_rank >= e.local_world_size {
            return bad(
                "LOCAL_RANK",
                e.local_rank,
                format!("must be below LOCAL_WORLD_SIZE={}", e.local_world_size),
            );
        }
        Ok(e)
    }
}

/// The first host of a Slurm node list: `gpu[03-05,07],cpu1` gives `gpu03`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..list[end..].find(']')? + end];
        let first = inner.split([',', '-']).next()?;
        return Some(format!("{prefix}{first}"));
    }
    (!prefix.is_empty()).then(|| prefix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables() {
        let e = LaunchEnv::from_vars(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                e.rank,
                e.world_size,
                e.local_rank,
                e.local_world_size,
                e.master_addr.as_str(),
                e.master_port
            ),
            (3, 8, 1, 2, "node7", 29500)
        );
        assert_eq!(e.source, "torchrun");
        // Under torchrun its agent's store holds MASTER_PORT; ours is the next one, or the override.
        let under = |extra: &[(&str, &str)]| {
            let mut v = vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_PORT", "29500"),
                ("TORCHELASTIC_RUN_ID", "none"),
            ];
            v.extend_from_slice(extra);
            LaunchEnv::from_vars(env(&v)).unwrap().unwrap().master_port
        };
        assert_eq!(under(&[]), 29501);
        assert_eq!(under(&[("IBGDA_BOOTSTRAP_PORT", "31000")]), 31000);
    }

    #[test]
    fn nothing_set_is_a_single_process_and_bad_values_are_named() {
        assert_eq!(LaunchEnv::from_vars(env(&[])).unwrap(), None);
        let e = LaunchEnv::from_vars(env(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")])).unwrap_err();
        assert!(matches!(e, Error::Config { name: "RANK", .. }), "{e}");
        let e = LaunchEnv::from_vars(env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Config {
                    name: "MASTER_PORT",
                    ..
                }
            ),
            "{e}"
        );
        let e = LaunchEnv::from_vars(env(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")])).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x\""), "{e}");
    }

    #[test]
    fn slurm_variables_with_the_first_host_rule_and_a_job_port() {
        let e = LaunchEnv::from_vars(env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[03-05,07],cpu1"),
            ("SLURM_JOB_ID", "123456"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                e.rank,
                e.world_size,
                e.local_rank,
                e.local_world_size,
                e.master_addr.as_str(),
                e.master_port
            ),
            (5, 8, 1, 4, "gpu03", 23456)
        );
        assert_eq!(first_host("solo"), Some("solo".into()));
        assert_eq!(first_host("a1,b2"), Some("a1".into()));
        assert_eq!(first_host("n[9]"), Some("n9".into()));
    }
}

//! In-process bootstrap: PEs are threads of one process sharing a rendezvous.

use super::Bootstrap;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Two PEs that called differently named collectives in one round: `(rank, call)` of the lowest
/// rank and of the first rank that differs from it.
type Mismatch = ((u32, &'static str), (u32, &'static str));

struct Round {
    generation: u64,
    contributions: Vec<Option<(&'static str, Vec<u8>)>>,
    arrived: u32,
    /// The completed result of round `generation - 1`.
    last: Arc<std::result::Result<Vec<Vec<u8>>, Mismatch>>,
    failed: Option<u32>,
}

struct Shared {
    size: u32,
    timeout: Duration,
    round: Mutex<Round>,
    cv: Condvar,
}

/// One PE's handle on an in-process rendezvous. Create all of them with [`ThreadBootstrap::group`].
#[derive(Clone)]
pub struct ThreadBootstrap {
    rank: u32,
    shared: Arc<Shared>,
}

impl ThreadBootstrap {
    /// Handles for `size` PEs whose collectives wait at most `timeout` for each other.
    pub fn group(size: u32, timeout: Duration) -> Vec<ThreadBootstrap> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            round: Mutex::new(Round {
                generation: 0,
                contributions: vec![None; size as usize],
                arrived: 0,
                last: Arc::new(Ok(Vec::new())),
                failed: None,
            }),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadBootstrap {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl ThreadBootstrap {
    /// This PE's view of a completed round: the data, or the mismatch named from its side.
    fn outcome(&self, call: &'static str, last: &std::result::Result<Vec<Vec<u8>>, Mismatch>) -> Result<Vec<Vec<u8>>> {
        match last {
            Ok(all) => Ok(all.clone()),
            Err(((ra, ca), (rb, cb))) => {
                // A PE whose call differs from the lowest rank's hears of that one; a PE that
                // agrees with it hears of the first one that differs.
                let (other_pe, theirs, mine) = if call != *ca {
                    (*ra, *ca, call)
                } else {
                    (*rb, *cb, call)
                };
                Err(Error::CollectiveMismatch {
                    call,
                    pe: self.rank,
                    mine: mine.to_string(),
                    other_pe,
                    theirs: theirs.to_string(),
                })
            }
        }
    }
}

impl Bootstrap for ThreadBootstrap {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.shared.size
    }

    fn allgather(&self, call: &'static str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let s = &self.shared;
        let mut r = s.round.lock();
        if let Some(f) = r.failed {
            return Err(Error::PeerFailed {
                call,
                pe: self.rank,
                failed_pe: f,
            });
        }
        let generation = r.generation;
        r.contributions[self.rank as usize] = Some((call, mine.to_vec()));
        r.arrived += 1;
        if r.arrived == s.size {
            let all: Vec<(&'static str, Vec<u8>)> = r
                .contributions
                .iter_mut()
                .map(|c| c.take().expect("every PE contributed"))
                .collect();
            let differs = (1..all.len()).find(|&j| all[j].0 != all[0].0);
            r.last = Arc::new(match differs {
                Some(j) => Err(((0, all[0].0), (j as u32, all[j].0))),
                None => Ok(all.into_iter().map(|(_, d)| d).collect()),
            });
            r.arrived = 0;
            r.generation += 1;
            s.cv.notify_all();
            return self.outcome(call, &r.last);
        }
        let start = Instant::now();
        let deadline = start + s.timeout;
        while r.generation == generation {
            if let Some(f) = r.failed {
                return Err(Error::PeerFailed {
                    call,
                    pe: self.rank,
                    failed_pe: f,
                });
            }
            if s.cv.wait_until(&mut r, deadline).timed_out() && r.generation == generation {
                let missing = (0..s.size).filter(|&i| r.contributions[i as usize].is_none()).collect();
                // Withdraw, so a late arrival cannot complete a round this PE has given up on.
                r.contributions[self.rank as usize] = None;
                r.arrived -= 1;
                return Err(Error::BootstrapTimeout {
                    call,
                    pe: self.rank,
                    missing,
                    elapsed_ms: start.elapsed().as_millis() as u64,
                });
            }
        }
        let last = r.last.clone();
        drop(r);
        self.outcome(call, &last)
    }

    fn abort(&self) {
        let mut r = self.shared.round.lock();
        r.failed.get_or_insert(self.rank);
        self.shared.cv.notify_all();
    }

    fn failed_peer(&self) -> Option<u32> {
        self.shared.round.lock().failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allgather_returns_every_contribution_in_rank_order_repeatedly() {
        let group = ThreadBootstrap::group(4, Duration::from_secs(10));
        let handles: Vec<_> = group
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let mut outs = Vec::new();
                    for round in 0..50u8 {
                        outs.push(b.allgather("test", &[b.rank() as u8, round]).unwrap());
                    }
                    outs
                })
            })
            .collect();
        for h in handles {
            let outs = h.join().unwrap();
            for (round, all) in outs.iter().enumerate() {
                let want: Vec<Vec<u8>> = (0..4u8).map(|r| vec![r, round as u8]).collect();
                assert_eq!(all, &want);
            }
        }
    }

    #[test]
    fn a_missing_pe_times_out_naming_it() {
        let group = ThreadBootstrap::group(3, Duration::from_millis(100));
        let (a, b) = (group[0].clone(), group[1].clone());
        let t = std::thread::spawn(move || b.barrier("barrier"));
        let e = a.barrier("barrier").unwrap_err();
        match e {
            Error::BootstrapTimeout {
                pe, ref missing, call, ..
            } => {
                assert_eq!((pe, call), (0, "barrier"));
                // PE 2 never came; PE 1 may have withdrawn already after its own timeout.
                assert!(missing.contains(&2) && !missing.contains(&0), "{missing:?}");
            }
            other => panic!("unexpected {other}"),
        }
        assert!(matches!(t.join().unwrap(), Err(Error::BootstrapTimeout { pe: 1, .. })));
    }

    #[test]
    fn differently_named_collectives_fail_on_every_pe_naming_both() {
        let group = ThreadBootstrap::group(3, Duration::from_secs(10));
        let calls = ["barrier", "malloc", "malloc"];
        let handles: Vec<_> = group
            .into_iter()
            .zip(calls)
            .map(|(b, c)| std::thread::spawn(move || b.allgather(c, &[1]).unwrap_err()))
            .collect();
        let errs: Vec<Error> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (pe, e) in errs.iter().enumerate() {
            match e {
                Error::CollectiveMismatch {
                    pe: p,
                    mine,
                    other_pe,
                    theirs,
                    ..
                } => {
                    assert_eq!(*p, pe as u32);
                    let want = if pe != 0 {
                        (0, "barrier", "malloc")
                    } else {
                        (1, "malloc", "barrier")
                    };
                    assert_eq!((*other_pe, theirs.as_str(), mine.as_str()), want, "PE {pe}: {e}");
                }
                other => panic!("PE {pe}: {other}"),
            }
        }
    }

    #[test]
    fn abort_releases_waiters_with_the_failed_pe() {
        let group = ThreadBootstrap::group(2, Duration::from_secs(30));
        let (a, b) = (group[0].clone(), group[1].clone());
        let t = std::thread::spawn(move || a.barrier("barrier"));
        std::thread::sleep(Duration::from_millis(50));
        b.abort();
        assert!(matches!(
            t.join().unwrap(),
            Err(Error::PeerFailed {
                pe: 0,
                failed_pe: 1,
                ..
            })
        ));
    }
}

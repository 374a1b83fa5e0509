//! TCP bootstrap for one process per PE: rank 0 listens at `MASTER_ADDR:MASTER_PORT` and every
//! other rank connects to it (a star, as torchrun's store is). Messages are serde values encoded
//! with bincode straight onto the stream (bincode knows every value's length, so the stream needs
//! no framing of our own).
//!
//! Every collective carries its name and sequence number; rank 0 compares them and, when ranks
//! disagree, every rank returns [`Error::CollectiveMismatch`] naming both calls and ranks. A
//! rank whose connection drops without saying goodbye (it exited or was killed) is reported to
//! every other rank at once ([`Bootstrap::failed_peer`], and `PeerFailed` from any collective);
//! a rank that never arrives gives `BootstrapTimeout` naming it.

use super::{Bootstrap, LaunchEnv};
use crate::error::{Error, Result};
use crate::node::hostname;
use bincode::Options;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest message accepted from a peer (a bad peer cannot make us allocate more).
const MAX_MESSAGE: u64 = 1 << 30;
/// How much longer a non-root rank waits than rank 0, so rank 0's verdict (naming the rank that
/// is really missing) arrives before the rank's own timeout.
const VERDICT_GRACE: Duration = Duration::from_secs(5);
const NO_FAILURE: u32 = u32::MAX;

#[derive(Serialize, Deserialize, Debug)]
enum Msg {
    Hello {
        rank: u32,
        world_size: u32,
        abi_version: u32,
        host: String,
        pid: u32,
    },
    Welcome,
    Refused {
        field: String,
        root_value: String,
    },
    Contribute {
        seq: u64,
        call: String,
        data: Vec<u8>,
    },
    All {
        seq: u64,
        data: Vec<Vec<u8>>,
    },
    Mismatch {
        rank_a: u32,
        call_a: String,
        rank_b: u32,
        call_b: String,
    },
    TimedOut {
        missing: Vec<u32>,
        elapsed_ms: u64,
    },
    Failed {
        rank: u32,
    },
    Abort,
    Bye,
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new().with_limit(MAX_MESSAGE)
}

fn send(stream: &Mutex<TcpStream>, msg: &Msg) -> std::io::Result<()> {
    let bytes = codec()
        .serialize(msg)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    stream.lock().write_all(&bytes)
}

enum Event {
    Msg(u32, Msg),
    Gone(u32, String),
}

struct Link {
    rank: u32,
    stream: Mutex<TcpStream>,
    said_bye: AtomicBool,
}

struct Inner {
    rank: u32,
    size: u32,
    timeout: Duration,
    /// Rank 0: one link per other rank (index = rank). Others: one link, to rank 0.
    links: Vec<Arc<Link>>,
    seq: Mutex<u64>,
    inbox: Receiver<Event>,
    failed: AtomicU32,
    closing: AtomicBool,
    readers: Mutex<Vec<JoinHandle<()>>>,
}

/// One process's handle on a TCP rendezvous. Create with [`TcpBootstrap::from_env`] (torchrun,
/// Slurm or `ibgda-run` variables) or [`TcpBootstrap::connect`].
pub struct TcpBootstrap {
    inner: Arc<Inner>,
    env: LaunchEnv,
}

impl TcpBootstrap {
    /// Joins the job the environment describes; `None` when no launcher variables are set.
    pub fn from_env(timeout: Duration) -> Result<Option<TcpBootstrap>> {
        match LaunchEnv::from_env()? {
            Some(env) => Self::connect(env, timeout).map(Some),
            None => Ok(None),
        }
    }

    /// Joins the job `env` describes: rank 0 listens, every other rank connects (retrying until
    /// rank 0 is up). Collectives, and the wait for every rank to arrive, are bounded by
    /// `timeout`.
    pub fn connect(env: LaunchEnv, timeout: Duration) -> Result<TcpBootstrap> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let links = if env.rank == 0 {
            accept_all(&env, timeout)?
        } else {
            vec![dial_root(&env, timeout)?]
        };
        let inner = Arc::new(Inner {
            rank: env.rank,
            size: env.world_size,
            timeout,
            links,
            seq: Mutex::new(0),
            inbox: rx,
            failed: AtomicU32::new(NO_FAILURE),
            closing: AtomicBool::new(false),
            readers: Mutex::new(Vec::new()),
        });
        let mut readers = Vec::new();
        for link in &inner.links {
            let stream = link.stream.lock().try_clone().map_err(|e| rendezvous_err(&env, e))?;
            stream.set_read_timeout(None).map_err(|e| rendezvous_err(&env, e))?;
            let (inner2, link2, tx2) = (Arc::downgrade(&inner), link.clone(), tx.clone());
            readers.push(
                std::thread::Builder::new()
                    .name(format!("ibgda-bootstrap-{}", link.rank))
                    .spawn(move || read_loop(inner2, link2, stream, tx2))
                    .map_err(|e| rendezvous_err(&env, e))?,
            );
        }
        *inner.readers.lock() = readers;
        tracing::debug!(rank = env.rank, size = env.world_size, "TCP bootstrap connected");
        Ok(TcpBootstrap { inner, env })
    }

    /// The launch this bootstrap was created from.
    pub fn launch_env(&self) -> &LaunchEnv {
        &self.env
    }
}

fn rendezvous_err(env: &LaunchEnv, e: impl std::fmt::Display) -> Error {
    Error::Rendezvous {
        pe: env.rank,
        addr: format!("{}:{}", env.master_addr, env.master_port),
        why: e.to_string(),
    }
}

/// Rank 0: listens and takes one `Hello` from every other rank.
fn accept_all(env: &LaunchEnv, timeout: Duration) -> Result<Vec<Arc<Link>>> {
    let listener = TcpListener::bind(("0.0.0.0", env.master_port)).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "MASTER_PORT={} is already in use on this host (another job, or a rank 0 left running): {e}",
                env.master_port
            )
        } else {
            format!("rank 0 cannot listen on port {}: {e}", env.master_port)
        };
        Error::Rendezvous {
            pe: 0,
            addr: format!("0.0.0.0:{}", env.master_port),
            why,
        }
    })?;
    listener.set_nonblocking(true).map_err(|e| rendezvous_err(env, e))?;
    let start = Instant::now();
    let mut links: Vec<Option<Arc<Link>>> = (0..env.world_size).map(|_| None).collect();
    let mut arrived = 1;
    while arrived < env.world_size {
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            let missing: Vec<u32> = (1..env.world_size).filter(|&r| links[r as usize].is_none()).collect();
            for l in links.iter().flatten() {
                let _ = send(
                    &l.stream,
                    &Msg::TimedOut {
                        missing: missing.clone(),
                        elapsed_ms: elapsed.as_millis() as u64,
                    },
                );
            }
            return Err(Error::BootstrapTimeout {
                call: "init/connect",
                pe: 0,
                missing,
                elapsed_ms: elapsed.as_millis() as u64,
            });
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(rendezvous_err(env, e)),
        };
        stream.set_nonblocking(false).map_err(|e| rendezvous_err(env, e))?;
        let _ = stream.set_nodelay(true);
        // A connection that sends nothing sensible (a port scanner, a stale client) is dropped.
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let hello: Msg = match codec().deserialize_from(&mut &stream) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("bootstrap: dropped a connection that sent no valid hello: {e}");
                continue;
            }
        };
        let Msg::Hello {
            rank,
            world_size,
            abi_version,
            host,
            pid,
        } = hello
        else {
            continue;
        };
        let link = Arc::new(Link {
            rank,
            stream: Mutex::new(stream),
            said_bye: AtomicBool::new(false),
        });
        let refuse = |field: &str, root_value: String| {
            let _ = send(
                &link.stream,
                &Msg::Refused {
                    field: field.into(),
                    root_value,
                },
            );
        };
        if world_size != env.world_size {
            refuse("WORLD_SIZE", env.world_size.to_string());
            return Err(Error::CollectiveMismatch {
                call: "init (WORLD_SIZE)",
                pe: 0,
                mine: env.world_size.to_string(),
                other_pe: rank,
                theirs: world_size.to_string(),
            });
        }
        if abi_version != ibgda_abi::ABI_VERSION {
            refuse("ABI version", ibgda_abi::ABI_VERSION.to_string());
            return Err(Error::CollectiveMismatch {
                call: "init (ABI version)",
                pe: 0,
                mine: ibgda_abi::ABI_VERSION.to_string(),
                other_pe: rank,
                theirs: abi_version.to_string(),
            });
        }
        if rank == 0 || rank >= env.world_size || links[rank as usize].is_some() {
            refuse("RANK", format!("rank {rank} is taken or out of range"));
            return Err(Error::Config {
                name: "RANK",
                value: rank.to_string(),
                why: format!("two processes claim rank {rank} (the second from {host}, pid {pid}), or it is out of range for WORLD_SIZE={}", env.world_size),
            });
        }
        links[rank as usize] = Some(link);
        arrived += 1;
    }
    for l in links.iter().flatten() {
        send(&l.stream, &Msg::Welcome).map_err(|e| rendezvous_err(env, e))?;
    }
    Ok(links.into_iter().flatten().collect())
}

/// Every other rank: connects to rank 0 (retrying while it is not up yet) and says hello.
fn dial_root(env: &LaunchEnv, timeout: Duration) -> Result<Arc<Link>> {
    let start = Instant::now();
    let target = format!("{}:{}", env.master_addr, env.master_port);
    let mut last_err = String::new();
    let stream = loop {
        if start.elapsed() >= timeout {
            return Err(Error::Rendezvous {
                pe: env.rank,
                addr: target,
                why: format!(
                    "rank 0 did not accept within {} ms (is MASTER_ADDR/MASTER_PORT right, and rank 0 started?): {last_err}",
                    timeout.as_millis()
                ),
            });
        }
        let addrs = match target.to_socket_addrs() {
            Ok(a) => a.collect::<Vec<_>>(),
            Err(e) => {
                return Err(Error::Rendezvous {
                    pe: env.rank,
                    addr: target,
                    why: format!("cannot resolve MASTER_ADDR: {e}"),
                })
            }
        };
        match addrs.iter().find_map(|a| {
            TcpStream::connect_timeout(a, Duration::from_secs(1))
                .map_err(|e| last_err = e.to_string())
                .ok()
        }) {
            Some(s) => break s,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let _ = stream.set_nodelay(true);
    let link = Arc::new(Link {
        rank: 0,
        stream: Mutex::new(stream),
        said_bye: AtomicBool::new(false),
    });
    send(
        &link.stream,
        &Msg::Hello {
            rank: env.rank,
            world_size: env.world_size,
            abi_version: ibgda_abi::ABI_VERSION,
            host: hostname(),
            pid: std::process::id(),
        },
    )
    .map_err(|e| rendezvous_err(env, e))?;
    let reader = link.stream.lock().try_clone().map_err(|e| rendezvous_err(env, e))?;
    // Rank 0 answers once every rank has arrived: wait as long as it does, plus the grace.
    let left = timeout.saturating_sub(start.elapsed()) + VERDICT_GRACE;
    reader
        .set_read_timeout(Some(left))
        .map_err(|e| rendezvous_err(env, e))?;
    match codec().deserialize_from::<_, Msg>(&mut &reader) {
        Ok(Msg::Welcome) => Ok(link),
        Ok(Msg::Refused { field, root_value }) => Err(Error::CollectiveMismatch {
            call: "init (rendezvous)",
            pe: env.rank,
            mine: format!(
                "{field} {}",
                match field.as_str() {
                    "WORLD_SIZE" => env.world_size.to_string(),
                    "ABI version" => ibgda_abi::ABI_VERSION.to_string(),
                    _ => env.rank.to_string(),
                }
            ),
            other_pe: 0,
            theirs: format!("{field} {root_value}"),
        }),
        Ok(Msg::TimedOut { missing, elapsed_ms }) => Err(Error::BootstrapTimeout {
            call: "init/connect",
            pe: env.rank,
            missing,
            elapsed_ms,
        }),
        Ok(other) => Err(rendezvous_err(env, format!("unexpected {other:?} from rank 0"))),
        Err(e) => Err(Error::BootstrapTimeout {
            call: "init/connect",
            pe: env.rank,
            missing: vec![0],
            elapsed_ms: {
                tracing::debug!("bootstrap: no answer from rank 0: {e}");
                start.elapsed().as_millis() as u64
            },
        }),
    }
}

/// One connection's reader: forwards messages to the inbox. On rank 0, a rank that drops without
/// a goodbye (or aborts) is announced to every other rank at once.
fn read_loop(inner: std::sync::Weak<Inner>, link: Arc<Link>, stream: TcpStream, tx: Sender<Event>) {
    let mut r = BufReader::new(stream);
    loop {
        let msg = codec().deserialize_from::<_, Msg>(&mut r);
        let Some(inner) = inner.upgrade() else { return };
        match msg {
            Ok(Msg::Bye) => {
                link.said_bye.store(true, Ordering::Release);
                let _ = tx.send(Event::Msg(link.rank, Msg::Bye));
            }
            Ok(Msg::Abort) => {
                inner.note_failure(link.rank);
                let _ = tx.send(Event::Msg(link.rank, Msg::Abort));
            }
            Ok(Msg::Failed { rank }) => {
                inner.note_failure(rank);
                let _ = tx.send(Event::Msg(link.rank, Msg::Failed { rank }));
            }
            Ok(m) => {
                let _ = tx.send(Event::Msg(link.rank, m));
            }
            Err(e) => {
                if !link.said_bye.load(Ordering::Acquire) && !inner.closing.load(Ordering::Acquire) {
                    inner.note_failure(link.rank);
                    let _ = tx.send(Event::Gone(link.rank, e.to_string()));
                }
                return;
            }
        }
    }
}

impl Inner {
    /// Records that `rank` failed (the first failure wins); rank 0 tells every other rank.
    fn note_failure(&self, rank: u32) {
        let first = self
            .failed
            .compare_exchange(NO_FAILURE, rank, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first && self.rank == 0 {
            tracing::warn!(failed = rank, "bootstrap: rank {rank} failed; telling every rank");
            for l in self.links.iter().filter(|l| l.rank != rank) {
                let _ = send(&l.stream, &Msg::Failed { rank });
            }
        }
    }

    fn peer_failed(&self, call: &'static str) -> Option<Error> {
        let f = self.failed.load(Ordering::Acquire);
        (f != NO_FAILURE).then_some(Error::PeerFailed {
            call,
            pe: self.rank,
            failed_pe: f,
        })
    }

    fn root_allgather(&self, call: &'static str, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.size as usize;
        let mut got: Vec<Option<(String, u64, Vec<u8>)>> = vec![None; n];
        got[0] = Some((call.to_string(), seq, mine.to_vec()));
        let start = Instant::now();
        let deadline = start + self.timeout;
        while got.iter().any(Option::is_none) {
            if let Some(e) = self.peer_failed(call) {
                return Err(e);
            }
            let ev = match self.inbox.recv_deadline(deadline) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    let missing: Vec<u32> = (0..n as u32).filter(|&r| got[r as usize].is_none()).collect();
                    let elapsed_ms = start.elapsed().as_millis() as u64;
                    for l in &self.links {
                        let _ = send(
                            &l.stream,
                            &Msg::TimedOut {
                                missing: missing.clone(),
                                elapsed_ms,
                            },
                        );
                    }
                    return Err(Error::BootstrapTimeout {
                        call,
                        pe: 0,
                        missing,
                        elapsed_ms,
                    });
                }
                Err(RecvTimeoutError::Disconnected) => unreachable!("the inbox sender lives in the readers"),
            };
            match ev {
                Event::Msg(from, Msg::Contribute { seq: s, call: c, data }) => got[from as usize] = Some((c, s, data)),
                Event::Msg(from, Msg::Bye) => {
                    self.note_failure(from);
                }
                // Failures were recorded by the reader; the loop head reports them.
                _ => {}
            }
        }
        if let Some(e) = self.peer_failed(call) {
            return Err(e);
        }
        let named = |r: usize| {
            let (c, s, _) = got[r].as_ref().expect("all arrived");
            (c.clone(), *s)
        };
        if let Some(b) = (1..n).find(|&r| named(r) != named(0)) {
            let (ca, sa) = named(0);
            let (cb, sb) = named(b);
            let (call_a, call_b) = (format!("{ca} (#{sa})"), format!("{cb} (#{sb})"));
            for l in &self.links {
                let _ = send(
                    &l.stream,
                    &Msg::Mismatch {
                        rank_a: 0,
                        call_a: call_a.clone(),
                        rank_b: b as u32,
                        call_b: call_b.clone(),
                    },
                );
            }
            return Err(Error::CollectiveMismatch {
                call,
                pe: 0,
                mine: call_a,
                other_pe: b as u32,
                theirs: call_b,
            });
        }
        let data: Vec<Vec<u8>> = got.into_iter().map(|g| g.expect("all arrived").2).collect();
        let all = Msg::All { seq, data };
        for l in &self.links {
            if let Err(e) = send(&l.stream, &all) {
                self.note_failure(l.rank);
                tracing::warn!("bootstrap: sending {call} to rank {} failed: {e}", l.rank);
            }
        }
        let Msg::All { data, .. } = all else { unreachable!() };
        Ok(data)
    }

    fn leaf_allgather(&self, call: &'static str, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let root = &self.links[0];
        let start = Instant::now();
        if send(
            &root.stream,
            &Msg::Contribute {
                seq,
                call: call.to_string(),
                data: mine.to_vec(),
            },
        )
        .is_err()
        {
            self.note_failure(0);
            return Err(self.peer_failed(call).expect("just noted"));
        }
        let deadline = start + self.timeout + VERDICT_GRACE;
        loop {
            let ev = match self.inbox.recv_deadline(deadline) {
                Ok(ev) => ev,
                Err(_) => {
                    return Err(Error::BootstrapTimeout {
                        call,
                        pe: self.rank,
                        missing: vec![0],
                        elapsed_ms: start.elapsed().as_millis() as u64,
                    })
                }
            };
            match ev {
                Event::Msg(_, Msg::All { seq: s, data }) if s == seq => {
                    if data.len() != self.size as usize {
                        return Err(Error::Rendezvous {
                            pe: self.rank,
                            addr: "rank 0".into(),
                            why: format!("{call}: {} contributions for {} ranks", data.len(), self.size),
                        });
                    }
                    return Ok(data);
                }
                Event::Msg(
                    _,
                    Msg::Mismatch {
                        rank_a,
                        call_a,
                        rank_b,
                        call_b,
                    },
                ) => {
                    // A rank whose call differs from rank 0's hears of rank 0's; a rank that
                    // agrees with rank 0 hears of the first one that differs.
                    let _ = rank_a;
                    let mine = format!("{call} (#{seq})");
                    let (other_pe, theirs) = if mine != call_a { (0, call_a) } else { (rank_b, call_b) };
                    return Err(Error::CollectiveMismatch {
                        call,
                        pe: self.rank,
                        mine,
                        other_pe,
                        theirs,
                    });
                }
                Event::Msg(_, Msg::TimedOut { missing, elapsed_ms }) => {
                    return Err(Error::BootstrapTimeout {
                        call,
                        pe: self.rank,
                        missing,
                        elapsed_ms,
                    })
                }
                Event::Msg(_, Msg::Failed { rank }) => {
                    return Err(Error::PeerFailed {
                        call,
                        pe: self.rank,
                        failed_pe: rank,
                    })
                }
                Event::Gone(from, why) => {
                    tracing::warn!(
                        pe = self.rank,
                        "bootstrap: connection to rank {from} lost in {call}: {why}"
                    );
                    self.note_failure(0);
                    return Err(self.peer_failed(call).expect("just noted"));
                }
                Event::Msg(_, Msg::Bye) => {
                    self.note_failure(0);
                    return Err(self.peer_failed(call).expect("just noted"));
                }
                _ => {}
            }
        }
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> u32 {
        self.inner.rank
    }

    fn size(&self) -> u32 {
        self.inner.size
    }

    fn allgather(&self, call: &'static str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        // One collective at a time per process: the sequence number orders them.
        let mut seq = self.inner.seq.lock();
        if let Some(e) = self.inner.peer_failed(call) {
            return Err(e);
        }
        *seq += 1;
        if self.inner.size == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        if self.inner.rank == 0 {
            self.inner.root_allgather(call, *seq, mine)
        } else {
            self.inner.leaf_allgather(call, *seq, mine)
        }
    }

    fn abort(&self) {
        if self.inner.rank == 0 {
            self.inner.note_failure(0);
        } else if let Some(root) = self.inner.links.first() {
            let _ = send(&root.stream, &Msg::Abort);
        }
    }

    fn failed_peer(&self) -> Option<u32> {
        let f = self.inner.failed.load(Ordering::Acquire);
        (f != NO_FAILURE).then_some(f)
    }

    fn local_rank(&self) -> Option<(u32, u32)> {
        Some((self.env.local_rank, self.env.local_world_size))
    }
}

impl Drop for TcpBootstrap {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::Release);
        for l in &self.inner.links {
            let _ = send(&l.stream, &Msg::Bye);
            let _ = l.stream.lock().shutdown(Shutdown::Both);
        }
        for h in self.inner.readers.lock().drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(rank: u32, size: u32, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size: size,
            local_rank: rank,
            local_world_size: size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            source: "test",
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn group(size: u32, timeout: Duration) -> Vec<TcpBootstrap> {
        let port = free_port();
        let hs: Vec<_> = (0..size)
            .map(|r| std::thread::spawn(move || TcpBootstrap::connect(env(r, size, port), timeout).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn allgather_over_tcp_returns_every_contribution_in_rank_order_repeatedly() {
        let hs: Vec<_> = group(3, Duration::from_secs(20))
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    (0..20u8)
                        .map(|round| b.allgather("test", &[b.rank() as u8, round]).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in hs {
            for (round, all) in h.join().unwrap().iter().enumerate() {
                assert_eq!(all, &(0..3u8).map(|r| vec![r, round as u8]).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn an_abort_reaches_every_rank_at_once_naming_who() {
        let mut g = group(3, Duration::from_secs(60));
        let quitter = g.pop().unwrap();
        let waiting: Vec<_> = g
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let e = b.barrier("barrier").unwrap_err();
                    (e, b.failed_peer(), t.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        quitter.abort();
        for h in waiting {
            let (e, failed, took) = h.join().unwrap();
            assert!(matches!(e, Error::PeerFailed { failed_pe: 2, .. }), "{e}");
            assert_eq!(failed, Some(2));
            assert!(
                took < Duration::from_secs(30),
                "reported at once, not at the timeout: {took:?}"
            );
        }
    }

    #[test]
    fn a_dropped_connection_without_goodbye_is_a_failure_but_a_goodbye_is_not() {
        let mut g = group(2, Duration::from_secs(60));
        let leaf = g.pop().unwrap();
        let root = g.pop().unwrap();
        // A process that dies closes its socket without a Bye: simulate by shutting it down.
        leaf.inner.links[0].stream.lock().shutdown(Shutdown::Both).unwrap();
        let t = Instant::now();
        while root.failed_peer().is_none() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(root.failed_peer(), Some(1));
        drop(leaf);
        // A clean goodbye is not a failure.
        let mut g = group(2, Duration::from_secs(60));
        let leaf = g.pop().unwrap();
        let root = g.pop().unwrap();
        drop(leaf);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(root.failed_peer(), None);
    }
}

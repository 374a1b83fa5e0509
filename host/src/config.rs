//! Runtime configuration, read from `IBGDA_*` environment variables (all documented here and in
//! docs/configuration.md) and overridable in code.

use crate::error::{Error, Result};
use crate::transport::ibgda::{DoorbellMode, IbgdaOptions};
use crate::transport::proxy::ProxyOptions;
use std::time::Duration;

/// How a PE reaches a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerTransport {
    /// The runtime decides: same-node peers (every peer today) use P2P.
    Auto,
    /// NVLink/PCIe loads and stores into the peer's mapped heap.
    P2p,
    /// RC queue pairs on the (emulated) mlx5 NIC, posted to by GPU threads.
    Ibgda,
    /// The same queue pairs, posted to by CPU proxy threads that GPU threads hand descriptors.
    Proxy,
}

impl PeerTransport {
    fn parse(name: &'static str, whole: &str, s: &str) -> Result<PeerTransport> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(PeerTransport::Auto),
            "p2p" => Ok(PeerTransport::P2p),
            "ibgda" => Ok(PeerTransport::Ibgda),
            "proxy" => Ok(PeerTransport::Proxy),
            _ => Err(Error::Config {
                name,
                value: whole.to_string(),
                why: format!("unknown transport {s:?}: expected auto, p2p, ibgda or proxy"),
            }),
        }
    }
}

/// Where PEs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DeviceChoice {
    /// A GPU when one is visible, else the CPU emulation.
    #[default]
    Auto,
    /// A GPU (an error without one).
    Gpu,
    /// The CPU emulation: device code on CPU threads, heaps in host (or shared) memory.
    Cpu,
}

impl std::str::FromStr for PeerTransport {
    type Err = Error;

    /// `auto`, `p2p`, `ibgda` or `proxy` (any case).
    fn from_str(s: &str) -> Result<PeerTransport> {
        PeerTransport::parse("transport", s, s)
    }
}

/// Settings for bringing up PEs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes of symmetric heap per PE (`IBGDA_SYMMETRIC_SIZE`, accepts `K`/`M`/`G` suffixes;
    /// default 256M). Rounded up to the GPU's allocation granularity.
    pub heap_size: u64,
    /// Bytes at the start of each PE's heap kept for the device reductions' scratch
    /// (`IBGDA_COLLECTIVE_SCRATCH`, `K`/`M`/`G` suffixes; default 1M), at most a 64th of the
    /// heap (see [`ibgda_abi::collective_scratch_bytes`]). A reduction larger than the scratch
    /// runs in rounds of what it holds, two barriers a round.
    pub collective_scratch: u64,
    /// Bound on every device-side wait and on the emulated NIC's start (`IBGDA_TIMEOUT_MS`,
    /// default 10000).
    pub timeout: Duration,
    /// Bound on host collectives (barrier, allgather) between PEs
    /// (`IBGDA_COLLECTIVE_TIMEOUT_MS`, default 300000). Longer than `timeout` on purpose: a PE
    /// legitimately waits in a host barrier while a peer runs a long kernel, and a peer that
    /// failed is noticed at once anyway (its collectives return `PeerFailed`), while a hung
    /// kernel ends within `timeout` through its bounded device waits.
    pub collective_timeout: Duration,
    /// PEs placed on each GPU (`IBGDA_PES_PER_GPU`, default 1): PE `i` uses GPU
    /// `i / pes_per_gpu`. Two PEs on one GPU make multi-PE logic testable on a single-GPU machine.
    pub pes_per_gpu: u32,
    /// Transport to every peer (`IBGDA_TRANSPORT=auto|p2p|ibgda|proxy`, default auto), with
    /// per-peer exceptions (`IBGDA_TRANSPORT=p2p,3=ibgda`: IBGDA to and from PE 3). A pair of PEs
    /// uses the NIC when either side asks for it. One job uses the NIC either GPU-initiated
    /// (`ibgda`) or through the proxy (`proxy`), not both.
    pub transport: PeerTransport,
    /// Per-peer exceptions to `transport`.
    pub peer_transports: Vec<(u32, PeerTransport)>,
    /// IBGDA layout: QPs per peer (`IBGDA_QPS_PER_PEER`; see `qps_per_peer_auto`), send-queue
    /// depth (`IBGDA_SQ_LOG_DEPTH`, default 10), doorbell mode (`IBGDA_DOORBELL=gpu|cpu`, default
    /// gpu).
    pub ibgda: IbgdaOptions,
    /// GPU PEs pick their QPs per NIC peer from the job (default true): the emulated NIC's engine
    /// warps split over the other PEs, a power of two from 2 to 128 (128 with 2 PEs, 32 with 4,
    /// 16 with 8 on an H100 or H200 with one PE each; see [`auto_qps_per_peer`]), as the engine
    /// gives each QP its own warp and a block posts through QP `block % qps_per_peer`; the PEs
    /// take the smallest choice of any PE. PE 0 states the choice at init.
    /// `IBGDA_QPS_PER_PEER` sets `ibgda.qps_per_peer` and turns this off; so must a program that
    /// sets `ibgda.qps_per_peer` itself. CPU-emulated PEs always use `ibgda.qps_per_peer`.
    pub qps_per_peer_auto: bool,
    /// Proxy layout: threads (`IBGDA_PROXY_THREADS`, default 2), channels
    /// (`IBGDA_PROXY_CHANNELS`, default 8), ring slots (`IBGDA_PROXY_RING_LOG_SLOTS`, default
    /// 10), batch (`IBGDA_PROXY_BATCH`, default 64), pinning (`IBGDA_PROXY_PIN=0` to opt out).
    pub proxy: ProxyOptions,
    /// GPU or CPU emulation (`IBGDA_DEVICE=auto|gpu|cpu`, default auto).
    pub device: DeviceChoice,
    /// The GPU of a PE started by a launcher (`IBGDA_GPU`; default `LOCAL_RANK`, or rank /
    /// `pes_per_gpu` in one process).
    pub gpu: Option<usize>,
    /// Where the CPU emulation maps the shared windows of PEs in other processes
    /// (`IBGDA_SHM_VA_BASE`, hex or decimal; default `0x200000000000`).
    pub shm_va_base: u64,
    /// Where GPU PEs in separate processes that use the NIC map every PE's heap and queue window,
    /// the same address in every process (`IBGDA_GPU_VA_BASE`; default `0x500000000000`).
    pub gpu_va_base: u64,
    /// Blocks of the emulated NIC's GPU engine per PE (`IBGDA_ENGINE_BLOCKS`; 0, the default,
    /// picks [`auto_engine_blocks`] from the GPU). Each has as many warps as the engine's
    /// registers allow, one per QP; the engine gets at least what its QPs need.
    pub engine_blocks: u32,
    /// Which NIC backend serves peers behind a NIC (`IBGDA_NIC=auto|emu|mlx5|verbs`, default
    /// auto: a ConnectX through DEVX when one opens, else the emulated device, with a message).
    /// `ibgda-probe` shows what the node has.
    pub nic: crate::nic::NicChoice,
    /// The RDMA device GPU PEs open (`IBGDA_HCA`, e.g. `mlx5_0`; default the first mlx5 device).
    pub hca: Option<String>,
    /// Its port (`IBGDA_IB_PORT`, default 1).
    pub ib_port: u8,
    /// The GID index of the source address on RoCE (`IBGDA_GID_INDEX`, default 3, RoCE v2 on
    /// IPv4 in a usual rdma-core GID table).
    pub gid_index: u8,
    /// The emulated NIC's rate model (`IBGDA_NIC_MODEL=off|cx7`, default off: the engine runs as
    /// fast as it can; `IBGDA_NIC_LINK_GBPS`, `IBGDA_NIC_MSG_RATE` (M msg/s),
    /// `IBGDA_NIC_LATENCY_NS` and `IBGDA_NIC_WQE_FETCH_NS` override its parameters). The
    /// benchmarks that compare posting paths turn it on. See [`crate::emu::RateModel`].
    pub nic_model: Option<crate::emu::RateModel>,
    /// CPU threads per block on a CPU-emulated PE (`IBGDA_CPU_BLOCK_THREADS`, default 1): a
    /// launch runs `min(grid.threads, this)` threads per block, each a CPU thread, in warps of 32
    /// lanes (or one narrow warp of a power-of-two width below 32) whose `ballot`, `shfl`,
    /// `match_any`, `activemask` and barriers are real rendezvous. The default keeps the
    /// emulation to one thread per block, cheap on small machines; kernels read their shape from
    /// `arch`, so the result is the same.
    pub cpu_block_threads: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heap_size: 256 << 20,
            collective_scratch: 1 << 20,
            timeout: Duration::from_millis(10_000),
            collective_timeout: Duration::from_millis(300_000),
            pes_per_gpu: 1,
            transport: PeerTransport::Auto,
            peer_transports: Vec::new(),
            ibgda: IbgdaOptions::default(),
            qps_per_peer_auto: true,
            proxy: ProxyOptions::default(),
            engine_blocks: 0,
            nic: crate::nic::NicChoice::Auto,
            hca: None,
            ib_port: 1,
            gid_index: 3,
            nic_model: None,
            cpu_block_threads: 1,
            device: DeviceChoice::Auto,
            gpu: None,
            shm_va_base: crate::shm::DEFAULT_VA_BASE,
            gpu_va_base: 0x5000_0000_0000,
        }
    }
}

fn parse_positive(name: &'static str, v: &str) -> Result<u32> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::Config {
            name,
            value: v.to_string(),
            why: "expected a positive integer".into(),
        })
}

/// Parses a positive number of milliseconds.
fn parse_millis(name: &'static str, v: &str) -> Result<Duration> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|&m| m > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| Error::Config {
            name,
            value: v.to_string(),
            why: "expected a positive number of milliseconds".into(),
        })
}

/// Parses a 1 GiB-aligned address (hex with 0x, or decimal).
fn parse_va_base(name: &'static str, v: &str) -> Result<u64> {
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse::<u64>().ok(),
    };
    parsed
        .filter(|b| b.is_multiple_of(crate::shm::WINDOW_ALIGN) && *b > 0)
        .ok_or_else(|| Error::Config {
            name,
            value: v.to_string(),
            why: "expected a 1 GiB-aligned address, e.g. 0x500000000000".into(),
        })
}

/// Parses sizes like `4096`, `64K`, `256M`, `1G`.
pub fn parse_size(name: &'static str, s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::Config {
            name,
            value: s.to_string(),
            why: "expected a positive size such as 4096, 64K, 256M or 1G".into(),
        })
}

impl Config {
    /// Defaults, overridden by any `IBGDA_*` variables that are set.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Ok(v) = std::env::var("IBGDA_SYMMETRIC_SIZE") {
            c.heap_size = parse_size("IBGDA_SYMMETRIC_SIZE", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_COLLECTIVE_SCRATCH") {
            c.collective_scratch = parse_size("IBGDA_COLLECTIVE_SCRATCH", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_TIMEOUT_MS") {
            c.timeout = parse_millis("IBGDA_TIMEOUT_MS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_COLLECTIVE_TIMEOUT_MS") {
            c.collective_timeout = parse_millis("IBGDA_COLLECTIVE_TIMEOUT_MS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_PES_PER_GPU") {
            c.pes_per_gpu = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Config {
                    name: "IBGDA_PES_PER_GPU",
                    value: v.clone(),
                    why: "expected a positive integer".into(),
                })?;
        }
        if let Ok(v) = std::env::var("IBGDA_TRANSPORT") {
            c.peer_transports.clear();
            for (i, part) in v.split(',').enumerate() {
                match part.split_once('=') {
                    None if i == 0 => c.transport = PeerTransport::parse("IBGDA_TRANSPORT", &v, part)?,
                    Some((pe, kind)) => {
                        let pe = pe.trim().parse::<u32>().map_err(|_| Error::Config {
                            name: "IBGDA_TRANSPORT",
                            value: v.clone(),
                            why: format!("{part:?}: expected PE=KIND, e.g. 1=ibgda"),
                        })?;
                        c.peer_transports
                            .push((pe, PeerTransport::parse("IBGDA_TRANSPORT", &v, kind)?));
                    }
                    None => {
                        return Err(Error::Config {
                            name: "IBGDA_TRANSPORT",
                            value: v.clone(),
                            why: format!("{part:?}: only the first entry may be a bare kind"),
                        })
                    }
                }
            }
        }
        if let Ok(v) = std::env::var("IBGDA_DEVICE") {
            c.device = match v.trim().to_ascii_lowercase().as_str() {
                "auto" | "" => DeviceChoice::Auto,
                "gpu" => DeviceChoice::Gpu,
                "cpu" => DeviceChoice::Cpu,
                _ => {
                    return Err(Error::Config {
                        name: "IBGDA_DEVICE",
                        value: v,
                        why: "expected auto, gpu or cpu".into(),
                    })
                }
            };
        }
        if let Ok(v) = std::env::var("IBGDA_GPU") {
            c.gpu = Some(v.trim().parse::<usize>().map_err(|_| Error::Config {
                name: "IBGDA_GPU",
                value: v.clone(),
                why: "expected a device ordinal".into(),
            })?);
        }
        if let Ok(v) = std::env::var("IBGDA_GPU_VA_BASE") {
            c.gpu_va_base = parse_va_base("IBGDA_GPU_VA_BASE", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_SHM_VA_BASE") {
            c.shm_va_base = parse_va_base("IBGDA_SHM_VA_BASE", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_QPS_PER_PEER") {
            c.ibgda.qps_per_peer = parse_positive("IBGDA_QPS_PER_PEER", &v)?;
            c.qps_per_peer_auto = false;
        }
        if let Ok(v) = std::env::var("IBGDA_SQ_LOG_DEPTH") {
            c.ibgda.log_depth = parse_positive("IBGDA_SQ_LOG_DEPTH", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_DOORBELL") {
            c.ibgda.doorbell = match v.trim().to_ascii_lowercase().as_str() {
                "gpu" => DoorbellMode::Gpu,
                "cpu" => DoorbellMode::Cpu,
                _ => {
                    return Err(Error::Config {
                        name: "IBGDA_DOORBELL",
                        value: v,
                        why: "expected gpu or cpu".into(),
                    })
                }
            };
        }
        if let Ok(v) = std::env::var("IBGDA_NIC") {
            c.nic = v.parse()?;
        }
        if let Ok(v) = std::env::var("IBGDA_HCA") {
            c.hca = Some(v).filter(|v| !v.trim().is_empty());
        }
        c.nic_model = crate::emu::RateModel::from_env(c.nic_model)?;
        for (name, field) in [("IBGDA_IB_PORT", &mut c.ib_port), ("IBGDA_GID_INDEX", &mut c.gid_index)] {
            if let Ok(v) = std::env::var(name) {
                *field = v.trim().parse().map_err(|_| Error::Config {
                    name,
                    value: v.clone(),
                    why: "expected a number 0..=255".into(),
                })?;
            }
        }
        if let Ok(v) = std::env::var("IBGDA_ENGINE_BLOCKS") {
            c.engine_blocks = parse_positive("IBGDA_ENGINE_BLOCKS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_CPU_BLOCK_THREADS") {
            c.cpu_block_threads = parse_positive("IBGDA_CPU_BLOCK_THREADS", &v)?;
            if c.cpu_block_threads > 1024 {
                return Err(Error::Config {
                    name: "IBGDA_CPU_BLOCK_THREADS",
                    value: v,
                    why: "a block has at most 1024 threads".into(),
                });
            }
        }
        if let Ok(v) = std::env::var("IBGDA_PROXY_THREADS") {
            c.proxy.threads = parse_positive("IBGDA_PROXY_THREADS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_PROXY_CHANNELS") {
            c.proxy.channels = parse_positive("IBGDA_PROXY_CHANNELS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_PROXY_RING_LOG_SLOTS") {
            c.proxy.log_ring_slots = parse_positive("IBGDA_PROXY_RING_LOG_SLOTS", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_PROXY_BATCH") {
            c.proxy.batch = parse_positive("IBGDA_PROXY_BATCH", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_PROXY_PIN") {
            c.proxy.pin = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" => false,
                _ => {
                    return Err(Error::Config {
                        name: "IBGDA_PROXY_PIN",
                        value: v,
                        why: "expected 1 or 0".into(),
                    })
                }
            };
        }
        if c.proxy.channels < c.proxy.threads {
            // More threads than the default channel count asks for at least one channel each.
            c.proxy.channels = c.proxy.threads;
        }
        c.ibgda.check()?;
        c.proxy.check()?;
        Ok(c)
    }

    /// The transport this PE asks for toward `peer` (before `Auto` is resolved).
    pub fn transport_to(&self, peer: u32) -> PeerTransport {
        self.peer_transports
            .iter()
            .rev()
            .find(|(pe, _)| *pe == peer)
            .map_or(self.transport, |(_, t)| *t)
    }

    /// Uses `t` toward every peer (clearing per-peer exceptions).
    pub fn with_transport(mut self, t: PeerTransport) -> Config {
        self.transport = t;
        self.peer_transports.clear();
        self
    }

    /// Uses `t` toward (and, since pairs agree, from) PE `peer`.
    pub fn with_peer_transport(mut self, peer: u32, t: PeerTransport) -> Config {
        self.peer_transports.push((peer, t));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("X", "4096").unwrap(), 4096);
        assert_eq!(parse_size("X", "64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("X", "256m").unwrap(), 256 << 20);
        assert_eq!(parse_size("X", " 2G ").unwrap(), 2 << 30);
    }

    #[test]
    fn transport_choice_per_peer() {
        let c = Config::default()
            .with_transport(PeerTransport::P2p)
            .with_peer_transport(3, PeerTransport::Ibgda);
        assert_eq!(c.transport_to(0), PeerTransport::P2p);
        assert_eq!(c.transport_to(3), PeerTransport::Ibgda);
        assert_eq!(Config::default().transport_to(1), PeerTransport::Auto);
        assert!(PeerTransport::parse("X", "nic", "nic").is_err());
    }

    #[test]
    fn milliseconds_parse_and_bad_ones_name_the_variable() {
        assert_eq!(parse_millis("X", " 2500 ").unwrap(), Duration::from_millis(2500));
        for bad in ["", "0", "-5", "1.5", "10s"] {
            let e = parse_millis("IBGDA_COLLECTIVE_TIMEOUT_MS", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("IBGDA_COLLECTIVE_TIMEOUT_MS"), "{bad}: {e}");
        }
        let d = Config::default();
        assert!(d.collective_timeout > d.timeout);
    }

    #[test]
    fn bad_sizes_are_rejected_with_the_variable_named() {
        for bad in ["", "0", "-1", "12Q", "G", "99999999999999999999G"] {
            let e = parse_size("IBGDA_SYMMETRIC_SIZE", bad).unwrap_err().to_string();
            assert!(e.contains("IBGDA_SYMMETRIC_SIZE"), "{bad}: {e}");
        }
    }
}

/// The emulated NIC's engine blocks (SMs) per PE when `Config::engine_blocks` is 0 (auto), for
/// `sms` SMs shared by `pes_per_gpu` PEs: an eighth of the GPU's SMs per GPU (16 of 132 on an H100
/// or H200 with one PE, 8 per PE of two), 1 to 16 per PE. The engine is the emulated NIC: it moves
/// data with SM loads and NVLink stores, one warp per QP at 255 registers (8 warps per SM), and a
/// QP's WQEs go one batch after another on its warp, so what it sustains grows with its warps and
/// QPs ([`auto_qps_per_peer`] gives each warp a QP). On 2 H200s with the CX-7 model a low-latency
/// MoE call over the NIC took 177 / 217 us on 8 blocks with 32 QPs per peer, 145 / 206 us on 16
/// blocks with 128 and 135 / 206 us on 32; the `put_signal` ping-pong 26.6, 27.4 and 28.4 us (the
/// idle warps' polling), `p` from 8,192 threads 135, 128 and 127 M/s (session 27,
/// `docs/benchmarks.md`). The MoE kernels themselves use 24 SMs.
pub fn auto_engine_blocks(sms: u32, pes_per_gpu: u32) -> u32 {
    (sms / 8 / pes_per_gpu.max(1)).clamp(1, 16)
}

/// Engine warps per block that [`auto_qps_per_peer`] counts on: what the engine kernel's 255
/// registers leave on an SM (the engine then runs as many as its registers allow).
pub const ENGINE_WARPS_PER_BLOCK: u32 = 8;

/// The QPs per NIC peer a GPU PE of an `n_pes`-PE job uses when `Config::qps_per_peer_auto` is
/// on, its engine on `engine_blocks` blocks: the engine's warps ([`ENGINE_WARPS_PER_BLOCK`] a
/// block) shared over the other PEs, rounded down to a power of two, 2 to 128. Each QP has a warp
/// of its own, so the engine serves them all at once: 128 per peer with 2 PEs on 16 blocks, 32
/// with 4, 16 with 8.
pub fn auto_qps_per_peer(n_pes: u32, engine_blocks: u32) -> u32 {
    let warps = engine_blocks.max(1) * ENGINE_WARPS_PER_BLOCK;
    let share = warps / n_pes.saturating_sub(1).max(1);
    let pow2 = if share == 0 {
        1
    } else {
        1 << (31 - share.leading_zeros())
    };
    pow2.clamp(2, 128)
}

/// The QPs per NIC peer the job uses, from this PE's count (`mine`, chosen automatically when
/// `auto`) and every PE's (`all`, by rank): an automatic choice takes the smallest of any PE (a
/// smaller GPU's engine has fewer warps), a configured count must be every PE's. `Err((pe,
/// count))` names the first PE whose count differs from a configured one.
pub fn agree_qps_per_peer(mine: u32, auto: bool, all: &[u32]) -> std::result::Result<u32, (u32, u32)> {
    if auto {
        return Ok(all.iter().copied().fold(mine, u32::min));
    }
    match all.iter().enumerate().find(|&(_, &q)| q != mine) {
        Some((j, &q)) => Err((j as u32, q)),
        None => Ok(mine),
    }
}

#[cfg(test)]
mod auto_qps_tests {
    use super::{agree_qps_per_peer, auto_engine_blocks, auto_qps_per_peer};

    #[test]
    fn the_job_takes_the_smallest_automatic_choice_and_rejects_configured_mismatches() {
        assert_eq!(agree_qps_per_peer(128, true, &[128, 64, 128]), Ok(64));
        assert_eq!(agree_qps_per_peer(32, true, &[128, 32]), Ok(32));
        assert_eq!(agree_qps_per_peer(128, true, &[]), Ok(128));
        assert_eq!(agree_qps_per_peer(16, false, &[16, 16, 16]), Ok(16));
        assert_eq!(agree_qps_per_peer(16, false, &[16, 8, 4]), Err((1, 8)));
    }

    #[test]
    fn the_engine_takes_an_eighth_of_the_gpu_shared_by_its_pes() {
        assert_eq!(auto_engine_blocks(132, 1), 16);
        assert_eq!(auto_engine_blocks(132, 2), 8);
        assert_eq!(auto_engine_blocks(132, 8), 2);
        assert_eq!(auto_engine_blocks(132, 64), 1);
        assert_eq!(auto_engine_blocks(8, 1), 1);
        assert_eq!(auto_engine_blocks(1000, 1), 16);
    }

    #[test]
    fn qps_per_peer_share_the_engine_and_shrink_as_the_job_grows() {
        let got: Vec<u32> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 1000]
            .iter()
            .map(|&n| auto_qps_per_peer(n, 16))
            .collect();
        assert_eq!(got, [128, 128, 64, 32, 32, 16, 16, 8, 8, 4, 2, 2]);
        // Fewer engine blocks (PEs sharing a GPU): fewer QPs, never fewer than 2.
        assert_eq!(auto_qps_per_peer(2, 8), 64);
        assert_eq!(auto_qps_per_peer(2, 4), 32);
        assert_eq!(auto_qps_per_peer(8, 2), 2);
        assert_eq!(auto_qps_per_peer(2, 1), 8);
        // Every PE's QPs fit the engine's warps.
        for blocks in [1, 2, 4, 8, 16, 32] {
            for n in 2..=64u32 {
                let q = auto_qps_per_peer(n, blocks);
                assert!(
                    q == 2 || q * (n - 1) <= blocks * super::ENGINE_WARPS_PER_BLOCK,
                    "{n} PEs, {blocks} blocks: {q}"
                );
            }
        }
    }
}

//! The NIC backend boundary: what the transports need from a NIC, and nothing of how a
//! particular NIC provides it.
//!
//! A [`Nic`] is one opened device with one protection domain. It registers memory (an lkey for
//! local WQEs, an rkey for peers), creates RC QPs whose send queue, doorbell
//! record, UAR doorbell and collapsed CQ live where the caller says ([`QueueHome`]), and says how
//! peers reach it ([`NicAddress`]). A [`NicQp`] connects to a peer's QP (RESET → INIT → RTR →
//! RTS) and reports the addresses the device code posts through ([`QpQueues`]).
//!
//! Backends: [`super::emulated`] (the emulated mlx5 device, in CI and on machines without an RDMA
//! device) and [`super::mlx5`] (a ConnectX through DEVX). The transports hold `dyn Nic` and
//! `dyn NicQp`; only code that drives the emulator's own hardware model (its execution engines,
//! fault injection in tests) reaches the emulated types, through [`NicQp::as_any`].

use crate::error::Result;
use std::any::Any;
use std::sync::Arc;

pub use ibgda_abi::emu::access;

/// Which backend a [`Nic`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The emulated mlx5 device (`crate::emu`).
    Emulated,
    /// A ConnectX through rdma-core's DEVX interface.
    Mlx5,
    /// Any RDMA device through standard verbs (the CPU proxy only).
    Verbs,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Emulated => "emulated mlx5",
            Backend::Mlx5 => "mlx5 (DEVX)",
            Backend::Verbs => "verbs",
        })
    }
}

pub use crate::placement::QueueHome;

/// Link layer of a real port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// Ethernet (RoCE v2): addressed by GID.
    Ethernet,
}

/// What the other side of a connection needs of a real port (exchanged through the bootstrap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortAddress {
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The GID at the chosen index.
    pub gid: [u8; 16],
    /// The GID index used as our source address (RoCE).
    pub gid_index: u8,
    /// The active MTU (the IB enum, 1..=5).
    pub active_mtu: u8,
}

/// How peers reach a [`Nic`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NicAddress {
    /// An emulated device on the job's fabric (its id plays the LID).
    Emulated {
        /// The device id.
        device: u32,
    },
    /// A port of a real NIC.
    Port(PortAddress),
}

/// A peer QP as the bootstrap carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// The peer's NIC.
    pub address: NicAddress,
    /// Its QP number.
    pub qpn: u32,
    /// Backend-specific locator ([`NicQp::locator`]; 0 for real NICs).
    pub locator: u64,
}

/// The keys of a registered range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryKey {
    /// What local WQEs name the range by.
    pub lkey: u32,
    /// What peers name it by.
    pub rkey: u32,
    /// First byte registered.
    pub addr: u64,
    /// Bytes registered.
    pub len: u64,
}

/// A QP's queues in the CPU's address space, where the CPU can reach them (proxy QPs and
/// CPU-assisted doorbells).
#[derive(Clone, Copy, Debug)]
pub struct HostQueues {
    /// The send queue's first WQEBB (`None` when only the doorbell is on the host).
    pub sq: Option<*mut u8>,
    /// The doorbell record (8 bytes; the send counter at `SND_DBR_OFFSET`).
    pub dbr: *mut u8,
    /// The UAR page (the doorbell register at `UAR_DOORBELL_OFFSET`).
    pub uar: *mut u8,
    /// The collapsed CQ's one CQE (`None` when the CQ is not on the host).
    pub cqe: Option<*mut u8>,
}

/// What the device code needs to post to a QP: addresses as the posting GPU (or CPU, for
/// CPU-emulated PEs) sees them.
#[derive(Clone, Copy, Debug)]
pub struct QpQueues {
    /// The QP number.
    pub qpn: u32,
    /// log2 of the send queue's depth in WQEBBs.
    pub log_depth: u32,
    /// The send queue.
    pub sq: u64,
    /// The doorbell record.
    pub dbr: u64,
    /// The doorbell register (UAR page + `UAR_DOORBELL_OFFSET`'s page base).
    pub doorbell: u64,
    /// The collapsed CQ's buffer.
    pub cq: u64,
    /// The same queues from the CPU, where it can reach them.
    pub host: Option<HostQueues>,
}

/// One opened NIC with one protection domain.
pub trait Nic: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;
    /// A name for messages (`"emulated device 3"`, `"mlx5_0 port 1"`).
    fn name(&self) -> String;
    /// How peers reach this NIC.
    fn address(&self) -> NicAddress;
    /// Registers `[addr, addr + len)` with [`access`] rights.
    ///
    /// # Safety
    /// The range stays allocated for as long as the NIC (and any QP that may name the key) lives.
    unsafe fn register(&self, addr: u64, len: u64, access: u32) -> Result<MemoryKey>;
    /// Creates an RC QP in RESET with a `2^log_depth`-WQEBB send queue and a collapsed CQ, its
    /// queues where `home` says.
    fn create_qp(&self, log_depth: u32, home: QueueHome<'_>) -> Result<Arc<dyn NicQp>>;
    /// The backend's own type, for code that drives it specifically.
    fn as_any(&self) -> &dyn Any;
}

/// One RC QP of a [`Nic`].
pub trait NicQp: Send + Sync {
    /// The QP number.
    fn qpn(&self) -> u32;
    /// What a peer needs besides the QPN to connect to this QP, backend-specific: the emulated
    /// device's context address (its engine plays the responder); 0 on real NICs.
    fn locator(&self) -> u64;
    /// Connects to `remote` and moves the QP RESET → INIT → RTR → RTS.
    fn connect(&self, remote: &RemoteQp) -> Result<()>;
    /// The addresses the device code posts through.
    fn queues(&self) -> QpQueues;
    /// The backend's own type (the emulated QP, for its engines and fault injection).
    fn as_any(&self) -> &dyn Any;
}

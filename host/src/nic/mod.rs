//! NIC backends behind one boundary ([`backend`]): the transports hold a [`Nic`] and its
//! [`NicQp`]s and never name a backend. [`emulated`] wraps the emulated mlx5 device
//! ([`crate::emu`]); [`mlx5`] drives a ConnectX through rdma-core's DEVX interface, loaded at run
//! time ([`rdma_core`]); [`probe`] decides per GPU which one (and which doorbell path) a job uses.

pub mod backend;
pub mod emulated;
pub mod mlx5;
pub mod probe;
pub mod rdma_core;

pub use backend::{
    access, Backend, HostQueues, LinkLayer, MemoryKey, Nic, NicAddress, NicQp, PortAddress, QpQueues, QueueHome,
    RemoteQp,
};
pub use emulated::EmulatedNic;
pub use probe::{probe, probe_with, Affinity, GpuPlan, Mode, NicChoice, Probe};
pub use rdma_core::{RdmaCore, RdmaDevice};

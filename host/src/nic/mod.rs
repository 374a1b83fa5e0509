//! NIC backends. Today: the capability probe and rdma-core loaded at run time; the transports
//! use the emulated mlx5 device (`crate::emu`) for every peer behind a NIC. The mlx5 DEVX backend
//! (queues in GPU memory, the UAR doorbell mapped into the GPU) is being built in [`mlx5`] (its PRM
//! command layer so far), and the verbs proxy will live here beside it.

pub mod mlx5;
pub mod probe;
pub mod rdma_core;

pub use probe::{probe, probe_with, Affinity, GpuPlan, Mode, NicChoice, Probe};
pub use rdma_core::{RdmaCore, RdmaDevice};

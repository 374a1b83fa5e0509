//! `ibgda`: the host runtime of ibgda-rs, GPU-initiated communication for CUDA kernels written in
//! Rust, modeled on NVSHMEM and its IBGDA transport.
//!
//! It brings up processing elements (PEs), one or more per GPU, gives each a symmetric heap
//! (collective [`Pe::malloc`]/[`Pe::free`] return the same offset everywhere), connects peers with
//! a transport, and hands kernels a versioned device state through which the device API
//! (`ibgda-device`) reaches every PE:
//!
//! - [`transport::p2p`]: same-node peers by NVLink/PCIe loads and stores into their mapped heaps.
//! - [`transport::ibgda`]: RC queue pairs that GPU threads post mlx5 WQEs to themselves (queues,
//!   doorbell records and CQs in GPU memory), optionally with CPU-assisted doorbells.
//! - [`transport::proxy`]: the same device API through descriptors that CPU proxy threads post.
//! - [`nic`]: the NICs behind those two, one boundary for all: a ConnectX through DEVX, any RDMA
//!   device through verbs (proxy only), or the emulated mlx5 device ([`emu`]) whose engine runs as
//!   a persistent GPU kernel (or a CPU thread) where there is no NIC.
//!
//! ```no_run
//! use ibgda::{run_in_process, Config};
//! let sums = run_in_process(2, Config::from_env()?, |pe| {
//!     let buf = pe.malloc::<u64>(1024)?;
//!     // launch kernels with pe.stream(), passing pe.state_ptr() and pe.ptr(&buf) ...
//!     pe.barrier()?;
//!     Ok(pe.read(&buf, 0, 1024)?.iter().sum::<u64>())
//! })?;
//! # Ok::<(), ibgda::Error>(())
//! ```
//!
//! One host API: [`Pe`] runs on a GPU or on the CPU emulation (the same device code on CPU
//! threads; `IBGDA_DEVICE`), as threads of one process ([`run_in_process`]) or one process per PE
//! ([`Pe::from_env`] under torchrun, Slurm or `ibgda-run`, over [`bootstrap::TcpBootstrap`]).
//! Kernels declared with `ibgda_device::kernel!` are launched by type ([`Pe::launch`]).
//!
//! Device-side failures (bad PE, address outside the heap, misaligned atomic, a wait past its
//! timeout) come back from [`Pe::synchronize`] as [`Error::Device`], naming the PE, the peer, the
//! address, what was expected and observed, and how long a wait lasted.
//!
//! Configuration: `IBGDA_SYMMETRIC_SIZE`, `IBGDA_COLLECTIVE_SCRATCH`, `IBGDA_TIMEOUT_MS`, `IBGDA_COLLECTIVE_TIMEOUT_MS`,
//! `IBGDA_PES_PER_GPU`, `IBGDA_TRANSPORT`, `IBGDA_QPS_PER_PEER`, `IBGDA_SQ_LOG_DEPTH`,
//! `IBGDA_DOORBELL`, `IBGDA_ENGINE_BLOCKS`, `IBGDA_PROXY_*` (see [`Config`]). The runtime synchronises its own streams and never the
//! whole context: with IBGDA, the emulated NIC's engine is a kernel that runs until finalize.
#![warn(missing_docs)]

pub mod bootstrap;
pub mod config;
pub mod cuda;
pub mod emu;
pub mod error;
pub mod heap;
pub mod kernels;
pub mod nic;
pub mod node;
mod pe;
pub mod placement;
pub mod shm;
pub mod symmetric;
pub mod transport;

pub use config::{Config, DeviceChoice, PeerTransport};
pub use error::{Error, Result};
pub use ibgda_abi as abi;
pub use ibgda_abi::kernel::KernelFn;
pub use pe::{run, run_in_process, GpuPe, Grid, IntoKernelArg, KernelArg, KernelArgs, Module, Pe};
pub use symmetric::SymmetricBuffer;

//! `ibgda-ep`: MoE expert-parallel dispatch and combine on the ibgda runtime, with DeepEP V1's
//! semantics, for every transport the runtime has (NVLink P2P for same-node peers, IBGDA or the
//! CPU proxy for peers behind a NIC) and on the CPU emulation.
//!
//! [`Buffer`] owns the symmetric areas and launches the kernels of `ibgda-ep-kernels`:
//! - [`Buffer::layout`]: DeepEP's `get_dispatch_layout`.
//! - high-throughput: [`Buffer::ht_notify`] (the counts; the caller reads them with
//!   [`Buffer::read_info`] to size the outputs), or for a cached dispatch (the handle of an earlier
//!   one) [`Buffer::ht_notify_cached`] (a barrier, no counts); then [`Buffer::ht_dispatch`] and
//!   [`Buffer::ht_combine`].
//! - low-latency: [`Buffer::ll_dispatch`] and [`Buffer::ll_combine`] (one kernel launch each), or
//!   their halves [`Buffer::ll_dispatch_send`] / [`Buffer::ll_dispatch_recv`] and
//!   [`Buffer::ll_combine_send`] / [`Buffer::ll_combine_recv`], with no host synchronisation.
//!
//! Tensors are passed as device addresses ([`DevicePtr`]: GPU memory on a GPU PE, host memory
//! on the CPU emulation), which is what the Python package (`ibgda_ep`, PyTorch tensors) and
//! other bindings hold. [`reference`] computes the same results on the host, for tests.
#![warn(missing_docs)]

mod buffer;
pub mod call_arrays;
pub mod check;
mod device_vec;
mod error;
pub mod reference;

pub use buffer::{
    Buffer, BufferConfig, DevicePtr, HtDispatch, HtHandle, HtRecv, LayoutOut, LlCombine, LlDispatch, LlHandle, LlRecv,
};
pub use device_vec::DeviceVec;
pub use error::{EpError, Result};
pub use ibgda_ep_kernels::geometry::{self, Geometry, LlLayout};
pub use ibgda_ep_kernels::numeric;

/// PTX of the EP kernels (`ep/kernels`), loaded by [`Buffer::new`] on a GPU PE.
pub const EP_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_ep_kernels.ptx"));

//! `ibgda-nic-emu`: the emulated mlx5 device (ConnectX) of ibgda: its processing core and its GPU
//! engine kernel.
//!
//! A ConnectX follows doorbells, fetches WQEs in order per QP, validates every field against its
//! context memory (QP state, memory-region keys, bounds, access rights), moves the data and writes
//! CQEs. This crate does the same against the tables in [`ibgda_abi::emu`], executing the very
//! bytes a real NIC would read. It is `no_std` so that the CPU engine thread (host crate,
//! `ibgda::emu`) and the GPU engine kernel ([`run_engine`], the PTX entry `ibgda_emu_engine` this
//! crate builds to) share it. The runtime (`ibgda`) embeds this crate's PTX and reaches the
//! device through its `Nic` boundary; a user kernel crate depends on `ibgda-device` only and never
//! compiles this one.
//!
//! A remote access violation moves both QPs to ERR: the requester with its error CQE, the
//! responder as an RC responder does after NAKing it (later WQEs of either are flushed).
//!
//! Atomics take their operands big-endian from the WQE and work on host-endian memory, as a
//! ConnectX in the host-endianness atomic mode does (Linux's mlx5_core selects it when the HCA
//! supports it, kernel commit f91e6d8941bf); every other reader of an atomic target is a
//! little-endian GPU or CPU load.
//!
//! An owner-bit CQ that overflows drops the completion, sets `overrun` (the host raises it as a
//! CQ-error async event) and moves the QP that produced it to ERR, as a ConnectX does.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]
#![warn(missing_docs)]
// Every unsafe operation sits in an `unsafe` block with a `// SAFETY:` line, inside unsafe
// functions too: a function's `# Safety` contract does not silently cover its body.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The address of field `$f` of the context `$p` points at (no load: the caller picks the access).
macro_rules! field {
    ($p:expr, $f:ident) => {
        core::ptr::addr_of_mut!((*$p).$f)
    };
}

mod batch;
mod cqe;
mod decode;
mod engine;
mod execute;
mod learn;
pub mod model;
pub mod parse;
mod retire;
mod rules;
mod worker;

pub use batch::{
    batching_allowed, lane_view, load_batch_words, plan_lane, plan_words, LanePlan, BATCH_LANES, CONTINUATION,
};
pub use decode::{claims_two_wqebbs, decode_lane, LaneWqe};
pub use engine::{complete, finish, service_qp, take, Serviced, Taken, View};
pub use execute::{execute_atomic, execute_atomics_lanes, execute_inline};
pub use learn::{learn, learn_cached, QpCache};
pub use retire::{admit_batch_lanes, complete_batch, complete_batch_lanes};
pub use rules::{batch_len, batch_len_lanes, wqe_starts};
pub use worker::{first_qp_of, run_engine, service_qp_warp, service_qp_warp_cached, BUDGET_PER_QP};

use ibgda_abi::emu::{EngineControl, EngineTally};

ibgda_device::kernel! {
    /// The emulated mlx5 device's GPU engine: a persistent kernel whose warps service the `n_qps`
    /// QP contexts in `qps` until the host sets `control.stop`; `tally` is its zeroed counters in
    /// GPU memory (see [`run_engine`]).
    pub fn ibgda_emu_engine(qps: *const u64, n_qps: u32, control: *mut EngineControl, tally: *mut EngineTally) {
        // SAFETY: the launch contract (`kernel!`): every pointer argument is what `run_engine`
        // asks for, alive until the kernel ends and used by no other engine.
        unsafe {
            run_engine(qps, n_qps, control, tally);
        }
    }
}

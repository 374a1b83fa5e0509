//! The processing core of ibgda's emulated mlx5 device.
//!
//! A ConnectX follows doorbells, fetches WQEs in order per QP, validates every field against its
//! context memory (QP state, memory-region keys, bounds, access rights), moves the data and writes
//! CQEs. This module does the same against the tables in [`ibgda_abi::emu`], executing the very
//! bytes a real NIC would read. It is `no_std` so that the CPU engine thread (host crate,
//! `ibgda::emu`) and the GPU engine kernel ([`run_engine`], bundled as `ibgda_emu_engine`) share
//! it.
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

mod batch;
mod cqe;
mod decode;
mod engine;
pub mod model;
pub mod parse;
mod retire;
mod worker;

pub use batch::{
    batch_len, batch_len_lanes, batching_allowed, execute_inline, lane_view, load_batch_words, plan_lane, plan_words,
    LanePlan, BATCH_LANES,
};
pub use decode::{decode_lane, LaneWqe};
pub use engine::{complete, finish, learn, service_qp, take, Serviced, Taken, View};
pub use retire::{admit_batch_lanes, complete_batch, complete_batch_lanes};
pub use worker::{run_engine, service_qp_warp, BUDGET_PER_QP};

//! The processing core of ibgda's emulated mlx5 device.
//!
//! A ConnectX follows doorbells, fetches WQEs in order per QP, validates every field against its
//! context memory (QP state, memory-region keys, bounds, access rights), moves the data and writes
//! CQEs. This module does the same against the tables in [`ibgda_abi::emu`], executing the very
//! bytes a real NIC would read. It is `no_std` so that the CPU engine thread (host crate,
//! `ibgda::emu`) and a GPU engine kernel share it.
//!
//! Deviations from hardware, all deliberate: atomics are host-endian (a ConnectX configured for
//! host-endian atomic responses); a responder-side error leaves the remote QP untouched; an
//! owner-bit CQ that overflows sets `overrun` and drops CQEs instead of raising an async event.

mod engine;
pub mod parse;

pub use engine::{service_qp, Serviced};

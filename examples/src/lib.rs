//! Shared bits of the example programs.

/// PTX of the example kernel crate (`kernels/ring-put`).
pub const RING_PUT_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ring_put_kernel.ptx"));

pub mod engine;

//! The bundled kernels (`device-kernels/bundled`), compiled to PTX at build time by
//! `ibgda-nvptx-builder` and embedded here. On the host the same kernels are plain functions in
//! [`host`], which the CPU emulation ([`crate::cpu`]) runs.

/// PTX of the bundled kernels, for `sm_90`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_kernels.ptx"));

/// PTX of the emulated NIC's GPU engine (`ibgda-nic-emu`, entry `ibgda_emu_engine`), for `sm_90`.
pub const ENGINE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_nic_emu.ptx"));

/// The bundled kernels as host functions, plus their argument constants (`scope`, `fault`).
pub use ibgda_kernels as host;

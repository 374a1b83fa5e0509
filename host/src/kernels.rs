//! The kernels the runtime embeds, compiled to PTX at build time by `ibgda-nvptx-builder`: the
//! emulated NIC's GPU engine, and with the `bundled-kernels` feature this repository's test and
//! benchmark kernels (`device-kernels/bundled`), which are also plain functions in `host` for
//! the CPU emulation ([`crate::cpu`]).

/// PTX of the bundled kernels, for `sm_90`.
#[cfg(feature = "bundled-kernels")]
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_kernels.ptx"));

/// PTX of the emulated NIC's GPU engine (`ibgda-nic-emu`, entry `ibgda_emu_engine`), for `sm_90`.
pub const ENGINE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_nic_emu.ptx"));

/// The bundled kernels as host functions, plus their argument constants (`scope`, `fault`).
#[cfg(feature = "bundled-kernels")]
pub use ibgda_kernels as host;

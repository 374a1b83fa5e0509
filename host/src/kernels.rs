//! The one kernel the runtime embeds, compiled to PTX at build time by `ibgda-nvptx-builder`: the
//! emulated NIC's GPU engine. User kernels come from the user's own kernel crate
//! ([`crate::Pe::load_module`]).

/// PTX of the emulated NIC's GPU engine (`ibgda-nic-emu`, entry `ibgda_emu_engine`), for `sm_90`.
pub const ENGINE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_nic_emu.ptx"));

//! This repository's own kernels for its tests and benchmarks (`device-kernels/bundled`): their
//! PTX, built when this crate builds, and [`load`] / [`launch`], which load it on a GPU PE and
//! launch its kernels by name. On the CPU emulation the same kernels are host functions
//! ([`host`]`::<name>`), launched by type with [`ibgda::Pe::launch`].
//!
//! The runtime (`ibgda`) embeds none of this: a program of your own builds its own kernel crate
//! (see `examples/starter`).

use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use ibgda::{KernelArg, Pe, Result};
use std::sync::{Arc, Mutex, Weak};

pub use ibgda_kernels as host;

/// PTX of the bundled kernels, for `sm_90`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ibgda_kernels.ptx"));

/// The module each live GPU PE loaded, by the PE's device-state address (unique while the PE
/// lives; the PE holds its modules until it is finalized, so a dead entry never upgrades).
static LOADED: Mutex<Vec<(u64, Weak<CudaModule>)>> = Mutex::new(Vec::new());

/// Collective: loads the bundled kernels on GPU PE `pe`, then waits for every PE to have loaded
/// them (a module load on a GPU waits for the kernels running there, so no PE may launch a
/// kernel that waits on another before all have loaded). Call it once per PE, before
/// [`launch`] or [`function`].
pub fn load(pe: &Pe) -> Result<()> {
    let module = pe.gpu()?.load_ptx(PTX)?;
    {
        let mut all = LOADED.lock().expect("bundled module registry");
        all.retain(|(_, m)| m.strong_count() > 0);
        all.push((pe.state_ptr(), Arc::downgrade(&module)));
    }
    pe.barrier()
}

/// Kernel `name` of the bundled module `pe` loaded with [`load`].
///
/// # Panics
/// If `pe` did not call [`load`] (a mistake in the calling program).
pub fn function(pe: &Pe, name: &str) -> Result<CudaFunction> {
    let gpu = pe.gpu()?;
    let module = LOADED
        .lock()
        .expect("bundled module registry")
        .iter()
        .find(|(state, _)| *state == pe.state_ptr())
        .and_then(|(_, m)| m.upgrade())
        .unwrap_or_else(|| panic!("PE {}: ibgda_bundled::load was not called before '{name}'", pe.my_pe()));
    gpu.function(&module, name)
}

/// Launches bundled kernel `name` with the raw arguments `args` on `pe`'s stream.
///
/// # Safety
/// `args` are the kernel's parameter list and satisfy its contract (see
/// [`ibgda::GpuPe::launch_function`]).
pub unsafe fn launch(pe: &Pe, name: &str, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
    let f = function(pe, name)?;
    // SAFETY: the caller's contract.
    unsafe { pe.gpu()?.launch_function(&f, cfg, args) }
}

//! Thin, safe wrappers over the CUDA driver calls cudarc's safe layer does not cover: VMM
//! allocations for the symmetric heap, host-mapped pinned memory, peer checks, and module loading
//! that returns the JIT log. Each resource is an RAII type; the `unsafe` lives in this module.

mod memory;
pub(crate) use memory::fixed_range_is_free;

pub use memory::{dmabuf_fd, MappedHost, MappedIo, VmmHeap};

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaModule, DriverError};
use std::sync::Arc;

/// Whether a CUDA driver library can be loaded here. Call before anything else touches CUDA:
/// cudarc's dynamic loader panics when the library is missing.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    unsafe { sys::is_culib_present() }
}

/// Number of visible CUDA devices, or `NoCudaDriver`.
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(Error::NoCudaDriver);
    }
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(|source| Error::Cuda {
            call: "cuDeviceGetCount",
            pe: 0,
            source,
        })
}

pub(crate) fn check(call: &'static str, pe: u32, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|source| Error::Cuda { call, pe, source })
}

/// Whether device `a` can access memory on device `b` by loads and stores.
pub fn can_access_peer(pe: u32, a: &CudaContext, b: &CudaContext) -> Result<bool> {
    if a.cu_device() == b.cu_device() {
        return Ok(true);
    }
    let mut ok = 0;
    // SAFETY: plain query on two valid device handles.
    check("cuDeviceCanAccessPeer", pe, unsafe {
        sys::cuDeviceCanAccessPeer(&mut ok, a.cu_device(), b.cu_device())
    })?;
    Ok(ok != 0)
}

/// Names of the kernels (`.entry`) a PTX module defines.
pub fn ptx_entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix(".visible .entry ")
                .or_else(|| l.trim_start().strip_prefix(".entry "))
        })
        .map(|rest| rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(""))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The modules this process has loaded, by GPU and PTX text (a hash of it and its length): the
/// PEs of a process share their GPU's primary context, so a module one PE loaded serves every PE
/// there. Each PE holds what it uses until it is finalized; an entry whose module is gone is
/// loaded again.
static LOADED: parking_lot::Mutex<Vec<LoadedModule>> = parking_lot::Mutex::new(Vec::new());

/// An entry of [`LOADED`]: the GPU, the PTX's hash and length, the module.
type LoadedModule = (sys::CUdevice, u64, usize, std::sync::Weak<CudaModule>);

fn ptx_key(ptx: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ptx.hash(&mut h);
    h.finish()
}

/// `ptx`'s module on `ctx`'s GPU if a live PE of this process already loaded it.
pub(crate) fn loaded_module(ctx: &CudaContext, ptx: &str) -> Option<Arc<CudaModule>> {
    let (device, key) = (ctx.cu_device(), ptx_key(ptx));
    let mut all = LOADED.lock();
    all.retain(|e| e.3.strong_count() > 0);
    all.iter()
        .find(|e| e.0 == device && e.1 == key && e.2 == ptx.len())
        .and_then(|e| e.3.upgrade())
}

/// [`load_module`] unless this process already has `ptx` loaded on `ctx`'s GPU
/// ([`loaded_module`]): a second load of the same code would only cost a JIT and, on a GPU whose
/// NIC engine runs, a halt of the engine (which an in-flight kernel waiting on the NIC cannot
/// afford).
pub(crate) fn load_module_once(
    ctx: &Arc<CudaContext>,
    ptx: &str,
    load: impl FnOnce() -> Result<Arc<CudaModule>>,
) -> Result<Arc<CudaModule>> {
    if let Some(m) = loaded_module(ctx, ptx) {
        return Ok(m);
    }
    let m = load()?;
    LOADED
        .lock()
        .push((ctx.cu_device(), ptx_key(ptx), ptx.len(), Arc::downgrade(&m)));
    Ok(m)
}

/// Loads PTX into `ctx` and resolves every kernel in it at once; on failure returns the JIT
/// compiler's log with the error.
///
/// Resolving eagerly matters: under CUDA's lazy loading (the default since CUDA 12), the first
/// resolution of a kernel waits for the kernels already running in the context, so a PE sharing a
/// GPU with a peer whose kernel spins waiting for it would deadlock if its own kernel were resolved
/// only at launch.
pub fn load_module(ctx: &Arc<CudaContext>, pe: u32, ptx: &str) -> Result<Arc<CudaModule>> {
    let m = match ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)) {
        Ok(m) => m,
        Err(source) => {
            return Err(Error::ModuleLoad {
                pe,
                source,
                log: jit_log(ctx, ptx),
            })
        }
    };
    let mut driver = 0;
    // SAFETY: an out-pointer to a live integer.
    unsafe { sys::cuDriverGetVersion(&mut driver) }
        .result()
        .map_err(cuda_err("cuDriverGetVersion", pe))?;
    for name in ptx_entries(ptx) {
        let f = m.load_function(name).map_err(cuda_err("cuModuleGetFunction", pe))?;
        load_code_now(pe, &f, driver)?;
    }
    Ok(m)
}

/// Makes the driver load `f`'s code now, while the caller holds the GPU's engines halted: under
/// lazy loading `cuModuleGetFunction` may return before the code is loaded, and loading it at the
/// first launch waits for every kernel running in the context, a persistent NIC engine included
/// (seen as an engine whose warps never all started, with two PEs on one GPU). A function
/// attribute query loads it on every driver; `cuFuncLoad` (drivers of CUDA 12.4 and later, as
/// `driver` says) says so explicitly.
fn load_code_now(pe: u32, f: &cudarc::driver::CudaFunction, driver: i32) -> Result<()> {
    f.get_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
        .map_err(cuda_err("cuFuncGetAttribute", pe))?;
    if driver >= 12040 {
        // SAFETY: a function handle of a module that `f` keeps loaded.
        unsafe { sys::cuFuncLoad(f.cu_function()) }
            .result()
            .map_err(cuda_err("cuFuncLoad", pe))?;
    }
    Ok(())
}

/// Re-runs the JIT with log buffers to explain a failed load.
fn jit_log(ctx: &Arc<CudaContext>, ptx: &str) -> String {
    if ctx.bind_to_thread().is_err() {
        return "(could not bind the context to read the log)".into();
    }
    let mut log = vec![0u8; 16 << 10];
    let src = std::ffi::CString::new(ptx).unwrap_or_default();
    let mut opts = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut vals: [*mut std::ffi::c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut std::ffi::c_void];
    let mut module = std::ptr::null_mut();
    // SAFETY: option/value arrays of equal length; the log buffer outlives the call; a module that
    // loads is unloaded at once.
    unsafe {
        let r = sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr().cast(),
            2,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        );
        if r == sys::CUresult::CUDA_SUCCESS {
            sys::cuModuleUnload(module);
        }
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).into_owned()
}

/// Maps a driver error to ours with the call and PE.
pub(crate) fn cuda_err(call: &'static str, pe: u32) -> impl Fn(DriverError) -> Error {
    move |source| Error::Cuda { call, pe, source }
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_every_entry() {
        let ptx = ".version 8.5\n.visible .entry ibgda_p_rate(\n.param .u64 a\n)\n.entry other (\n.func helper()\n";
        assert_eq!(super::ptx_entries(ptx), vec!["ibgda_p_rate", "other"]);
        assert!(super::ptx_entries(crate::kernels::ENGINE_PTX).contains(&"ibgda_emu_engine"));
    }
}

//! The GPU engine: the emulated device's processing core (`ibgda_nic_emu::run_engine`, bundled
//! as the kernel `ibgda_emu_engine`) running as a persistent kernel on its own stream.
//!
//! How it stays out of the way and is never starved: it is launched once, before any user kernel,
//! with a few blocks (`IBGDA_ENGINE_BLOCKS`, default a sixteenth of the SMs, more when the QPs need them), each with as
//! many warps as the kernel's registers allow: one warp per QP, and every warp without a QP or
//! with idle QPs takes chunks of other warps' large copies; the launch is confirmed by every warp checking in through host-mapped memory, so by the time a user
//! kernel starts, the engine's blocks are resident on their SMs and stay there (the GPU does not
//! preempt a running block for another kernel of the same context). User kernels get the remaining
//! SMs. While it runs, a context-wide synchronize would never return: the runtime synchronises its
//! own streams only, and so must users.

use super::device::QueuePair;
use crate::cuda::{cuda_err, MappedHost};
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use ibgda_abi::emu::EngineControl;
use parking_lot::Mutex;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What a stopped engine did (summed over its launches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// WQEs processed.
    pub wqes: u64,
    /// Service passes (over each warp's QPs), summed over warps.
    pub passes: u64,
    /// Warps that ran.
    pub warps: u32,
}

/// Every engine of this process by CUDA device, so that loading a module can halt them (module
/// loading may need the context to be idle; a persistent kernel never is).
static ENGINES: Mutex<Vec<(usize, Weak<Mutex<EngineKernel>>)>> = Mutex::new(Vec::new());

/// Held while an engine starts (launch, check-in, registration in [`ENGINES`]) and while a module
/// loads with the engines halted: a module load that began while another PE's engine was launched
/// but not yet registered would wait for that persistent kernel forever (and the engine's blocks
/// would not start behind the load: seen as an engine-start timeout with two PEs on one GPU).
static ENGINE_TRANSITIONS: Mutex<()> = Mutex::new(());

/// Runs `f` (a module load) with every engine on device `ordinal` halted, then relaunches them.
/// Work posted meanwhile waits in the queues (doorbells stay latched) and runs after.
pub fn with_engines_halted<T>(ordinal: usize, f: impl FnOnce() -> T) -> Result<T> {
    let _transition = ENGINE_TRANSITIONS.lock();
    let engines: Vec<Arc<Mutex<EngineKernel>>> = {
        let mut all = ENGINES.lock();
        all.retain(|(_, w)| w.strong_count() > 0);
        all.iter()
            .filter(|(o, _)| *o == ordinal)
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    };
    // Locked in registration order by every caller, so concurrent callers cannot deadlock.
    let mut guards: Vec<_> = engines.iter().map(|e| e.lock()).collect();
    let mut halted = Vec::new();
    let mut failed = None;
    for (i, g) in guards.iter_mut().enumerate() {
        if g.running {
            match g.halt() {
                Ok(()) => halted.push(i),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
    }
    let out = failed.is_none().then(f);
    // Every engine halted here runs again, whatever failed.
    for i in halted {
        if let Err(e) = guards[i].launch() {
            failed.get_or_insert(e);
        }
    }
    match (failed, out) {
        (Some(e), _) => Err(e),
        (None, out) => Ok(out.expect("f ran")),
    }
}

struct EngineKernel {
    pe: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernel: CudaFunction,
    control: MappedHost<EngineControl>,
    table: CudaSlice<u64>,
    /// The kernel's [`ibgda_abi::emu::EngineTally`] and copy jobs (GPU memory), zeroed before
    /// each launch.
    tally: CudaSlice<u64>,
    n_qps: u32,
    _qps: Vec<QueuePair>,
    blocks: u32,
    per_block: u32,
    timeout: Duration,
    running: bool,
}

impl EngineKernel {
    fn field(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the control block is live host-mapped memory for `self`'s life; the GPU updates
        // it atomically.
        unsafe { AtomicU32::from_ptr((self.control.host_ptr() as *mut u8).add(offset) as *mut u32) }
    }

    /// Launches the kernel and waits until every warp checked in.
    fn launch(&mut self) -> Result<()> {
        let pe = self.pe;
        self.ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent", pe))?;
        self.field(offset_of!(EngineControl, stop)).store(0, Ordering::Release);
        self.field(offset_of!(EngineControl, warps_started))
            .store(0, Ordering::Release);
        self.field(offset_of!(EngineControl, warps_stopped))
            .store(0, Ordering::Release);
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (self.per_block * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Stream order: the tally is zero before the kernel starts.
        self.stream
            .memset_zeros(&mut self.tally)
            .map_err(cuda_err("cuMemsetD8(engine tally)", pe))?;
        let (table_ptr, guard) = self.table.device_ptr(&self.stream);
        let (tally_ptr, tally_guard) = self.tally.device_ptr(&self.stream);
        let control_ptr = self.control.device_ptr();
        let mut b = self.stream.launch_builder(&self.kernel);
        b.arg(&table_ptr).arg(&self.n_qps).arg(&control_ptr).arg(&tally_ptr);
        // SAFETY: the kernel's parameters are (qps: *const u64, n_qps: u32, control: *mut
        // EngineControl, tally: *mut EngineTally); the table, the QPs (held in `_qps`), the
        // control block and the tally outlive the kernel, which `halt` ends before they are
        // released.
        unsafe { b.launch(cfg) }.map_err(|source| Error::KernelFailed { pe, source })?;
        drop((guard, tally_guard));
        self.running = true;
        let warps = self.blocks * self.per_block;
        let start = Instant::now();
        loop {
            let up = self
                .field(offset_of!(EngineControl, warps_started))
                .load(Ordering::Acquire);
            if up == warps {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                let _ = self.halt();
                return Err(Error::EmulatedDevice {
                    op: "start GPU engine",
                    reason: format!(
                        "PE {pe}: not all of the {warps} engine warps ({} blocks x {} warps) started within {:?} \
                         (published count {up}); the GPU may be too busy to make the engine resident",
                        self.blocks, self.per_block, self.timeout
                    ),
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Asks the kernel to stop and waits for it. When the wait itself fails (the context holds an
    /// earlier error), it still waits, briefly, for the warps to count themselves out in the
    /// host-mapped control block, so the caller does not free what a live engine reads.
    fn halt(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        self.field(offset_of!(EngineControl, stop)).store(1, Ordering::Release);
        let waited = self
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.pe))
            .and_then(|()| {
                self.stream
                    .synchronize()
                    .map_err(|source| Error::KernelFailed { pe: self.pe, source })
            });
        if waited.is_err() {
            // A running engine sees `stop` within a few passes (microseconds); a faulted one never
            // counts out, so the wait is short.
            let warps = self.blocks * self.per_block;
            let start = Instant::now();
            while self
                .field(offset_of!(EngineControl, warps_stopped))
                .load(Ordering::Acquire)
                != warps
                && start.elapsed() < HALT_GRACE
            {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.running = false;
        waited
    }

    fn stats(&self) -> EngineStats {
        let c = self.control.read(0);
        EngineStats {
            wqes: c.wqes,
            passes: c.passes,
            warps: self.blocks * self.per_block,
        }
    }
}

/// How long [`EngineKernel::halt`] waits for the engine's warps to stop when it cannot wait for
/// the kernel through CUDA.
const HALT_GRACE: Duration = Duration::from_millis(200);

/// A running GPU engine servicing a fixed set of QPs. Stop it with [`GpuEngine::stop`] (dropping
/// it stops it too) before their memory, or any memory their regions name, goes away.
pub struct GpuEngine {
    inner: Arc<Mutex<EngineKernel>>,
}

impl GpuEngine {
    /// Launches `kernel` (the bundled `ibgda_emu_engine`) over `qps` with `blocks` blocks (one
    /// warp per QP, at most 32 a block) and waits, up to `timeout`, until every warp is running.
    pub fn launch(
        pe: u32,
        ctx: &Arc<CudaContext>,
        kernel: &CudaFunction,
        qps: &[QueuePair],
        blocks: u32,
        timeout: Duration,
    ) -> Result<GpuEngine> {
        if qps.is_empty() || blocks == 0 {
            return Err(Error::EmulatedDevice {
                op: "start GPU engine",
                reason: format!("{} QPs on {blocks} blocks: nothing to run", qps.len()),
            });
        }
        ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent", pe))?;
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate(engine)", pe))?;
        let addrs: Vec<u64> = qps.iter().map(|q| q.context_addr()).collect();
        let table = stream
            .clone_htod(&addrs)
            .map_err(cuda_err("cuMemcpyHtoD(engine QPs)", pe))?;
        let control = MappedHost::<EngineControl>::new_zeroed(ctx, pe, 1)?;

        // One warp per QP, as many per block as the kernel's registers allow (more blocks when the
        // QPs need them).
        let max_warps = kernel
            .max_threads_per_block()
            .map_err(cuda_err("cuFuncGetAttribute(engine)", pe))?
            .clamp(32, 1024) as u32
            / 32;
        // Every block as many warps as the kernel's registers allow: one per QP, and the rest
        // (and any warp whose QPs are idle) share large copies.
        let per_block = max_warps;
        let blocks = blocks.max((qps.len() as u32).div_ceil(per_block));
        // The tally, then one copy job per warp (zeroed before each launch).
        let tally = stream
            .alloc_zeros::<u64>(ibgda_abi::emu::engine_scratch_bytes(blocks * per_block) / 8)
            .map_err(cuda_err("cuMemAlloc(engine tally)", pe))?;
        let mut k = EngineKernel {
            pe,
            ctx: ctx.clone(),
            stream,
            kernel: kernel.clone(),
            control,
            table,
            tally,
            n_qps: qps.len() as u32,
            _qps: qps.to_vec(),
            blocks,
            per_block,
            timeout,
            running: false,
        };
        let _transition = ENGINE_TRANSITIONS.lock();
        k.launch()?;
        tracing::debug!(pe, qps = qps.len(), blocks, per_block, "GPU engine running");
        let inner = Arc::new(Mutex::new(k));
        ENGINES.lock().push((ctx.ordinal(), Arc::downgrade(&inner)));
        Ok(GpuEngine { inner })
    }

    /// Warps the engine runs.
    pub fn warps(&self) -> u32 {
        let k = self.inner.lock();
        k.blocks * k.per_block
    }

    /// Blocks the engine runs (each resident on an SM of its own while the GPU has free SMs at
    /// launch, which the engine's early launch ensures).
    pub fn blocks(&self) -> u32 {
        self.inner.lock().blocks
    }

    /// Whether the engine is running.
    pub fn is_running(&self) -> bool {
        self.inner.lock().running
    }

    /// Asks the engine to stop and waits for its kernel; returns what it did.
    pub fn stop(&mut self) -> Result<EngineStats> {
        let mut k = self.inner.lock();
        k.halt()?;
        Ok(k.stats())
    }
}

impl Drop for GpuEngine {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("GPU engine did not stop cleanly: {e}");
        }
    }
}

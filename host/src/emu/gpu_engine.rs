//! The GPU engine: the emulated device's processing core (`ibgda_device::emu::run_engine`, bundled
//! as the kernel `ibgda_emu_engine`) running as a persistent kernel on its own stream.
//!
//! How it stays out of the way and is never starved: it is launched once, before any user kernel,
//! with a few blocks (`IBGDA_ENGINE_BLOCKS`, default 1) of at most 32 warps (one per QP); the
//! launch is confirmed by every warp checking in through host-mapped memory, so by the time a user
//! kernel starts, the engine's blocks are resident on their SMs and stay there (the GPU does not
//! preempt a running block for another kernel of the same context). User kernels get the remaining
//! SMs. While it runs, a context-wide synchronize would never return: the runtime synchronises its
//! own streams only, and so must users.

use super::device::QueuePair;
use crate::cuda::{cuda_err, MappedHost};
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use ibgda_abi::emu::EngineControl;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a stopped engine did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// WQEs processed.
    pub wqes: u64,
    /// Service passes (over each warp's QPs), summed over warps.
    pub passes: u64,
    /// Warps that ran.
    pub warps: u32,
}

/// A running GPU engine servicing a fixed set of QPs. Stop it with [`GpuEngine::stop`] (dropping
/// it stops it too) before their memory, or any memory their regions name, goes away.
pub struct GpuEngine {
    pe: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    control: MappedHost<EngineControl>,
    _table: CudaSlice<u64>,
    _qps: Vec<QueuePair>,
    warps: u32,
    running: bool,
}

impl GpuEngine {
    /// Launches `kernel` (the bundled `ibgda_emu_engine`) over `qps` with `blocks` blocks and
    /// waits, up to `timeout`, until every warp is running.
    pub fn launch(
        pe: u32,
        ctx: &Arc<CudaContext>,
        kernel: &CudaFunction,
        qps: &[QueuePair],
        blocks: u32,
        timeout: Duration,
    ) -> Result<GpuEngine> {
        let fail = |reason: String| Error::EmulatedDevice {
            op: "start GPU engine",
            reason,
        };
        if qps.is_empty() || blocks == 0 {
            return Err(fail(format!("{} QPs on {blocks} blocks: nothing to run", qps.len())));
        }
        ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent", pe))?;
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate(engine)", pe))?;
        let addrs: Vec<u64> = qps.iter().map(|q| q.context_addr()).collect();
        let table = stream
            .clone_htod(&addrs)
            .map_err(cuda_err("cuMemcpyHtoD(engine QPs)", pe))?;
        let control = MappedHost::<EngineControl>::new_zeroed(ctx, pe, 1)?;
        // One warp per QP, spread over the blocks; at most 32 warps a block.
        let per_block = (qps.len() as u32).div_ceil(blocks).clamp(1, 32);
        let warps = per_block * blocks;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (per_block * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (table_ptr, guard) = table.device_ptr(&stream);
        let n = qps.len() as u32;
        let control_ptr = control.device_ptr();
        let mut b = stream.launch_builder(kernel);
        b.arg(&table_ptr).arg(&n).arg(&control_ptr);
        // SAFETY: the kernel's parameters are (qps: *const u64, n_qps: u32, control: *mut
        // EngineControl); the table, the QPs (held in `_qps`) and the control block outlive the
        // kernel, which `stop` (or drop) ends before releasing them.
        unsafe { b.launch(cfg) }.map_err(|source| Error::KernelFailed { pe, source })?;
        drop(guard);
        let mut engine = GpuEngine {
            pe,
            ctx: ctx.clone(),
            stream,
            control,
            _table: table,
            _qps: qps.to_vec(),
            warps,
            running: true,
        };
        let start = Instant::now();
        loop {
            let up = engine.counter(offset_of!(EngineControl, warps_started));
            if up == warps {
                break;
            }
            if start.elapsed() > timeout {
                let _ = engine.stop();
                return Err(fail(format!(
                    "PE {pe}: {up} of {warps} engine warps ({blocks} blocks x {per_block} warps) started within \
                     {timeout:?}; the GPU may be too busy to make the engine resident"
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        tracing::debug!(pe, qps = qps.len(), blocks, warps, "GPU engine running");
        Ok(engine)
    }

    fn counter(&self, offset: usize) -> u32 {
        // SAFETY: the control block is live host-mapped memory; the GPU updates it atomically.
        unsafe {
            AtomicU32::from_ptr((self.control.host_ptr() as *mut u8).add(offset) as *mut u32).load(Ordering::Acquire)
        }
    }

    /// Warps the engine runs.
    pub fn warps(&self) -> u32 {
        self.warps
    }

    /// Whether the engine is still running.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Asks the engine to stop and waits for its kernel; returns what it did.
    pub fn stop(&mut self) -> Result<EngineStats> {
        if !self.running {
            return Ok(self.stats());
        }
        self.running = false;
        // SAFETY: live host-mapped control block; atomic store the GPU reads with acquire.
        unsafe { AtomicU32::from_ptr(self.control.host_ptr() as *mut u32).store(1, Ordering::Release) };
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.pe))?;
        self.stream
            .synchronize()
            .map_err(|source| Error::KernelFailed { pe: self.pe, source })?;
        Ok(self.stats())
    }

    fn stats(&self) -> EngineStats {
        let c = self.control.read(0);
        EngineStats {
            wqes: c.wqes,
            passes: c.passes,
            warps: c.warps_stopped,
        }
    }
}

impl Drop for GpuEngine {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(pe = self.pe, "GPU engine did not stop cleanly: {e}");
        }
    }
}

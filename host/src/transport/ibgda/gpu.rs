//! One GPU PE's IBGDA transport: its emulated NIC with every queue in GPU memory, the QPs to its
//! IBGDA peers connected through the bootstrap, the GPU engine that executes them, and (in
//! CPU-assisted mode) the doorbell thread.

use super::{ConnectInfo, CpuDoorbell, DoorbellMode, IbgdaOptions, PeIbgda};
use crate::bootstrap::Bootstrap;
use crate::emu::{EngineStats, Fabric, GpuEngine};
use crate::error::Result;
use crate::nic::NicRequest;
use crate::placement::{GpuArena, Placement};
use crate::transport::proxy::{Proxy, ProxyChannels, ProxyOptions};
use cudarc::driver::{CudaContext, CudaFunction};
use std::sync::Arc;
use std::time::Duration;

/// A job id that no other job in this process shares.
pub(crate) fn job_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (std::process::id() as u64) << 40 ^ nanos ^ NEXT.fetch_add(1, Ordering::Relaxed) << 20
}

/// The windows of GPU PEs in separate processes: this PE's queue arena (mapped by every peer at
/// the same address) and the peers' windows mapped here `(base, len)`.
pub struct SharedWindows<'a> {
    /// This PE's queue memory.
    pub arena: Arc<GpuArena>,
    /// Peers' heaps and queue windows mapped into this process.
    pub peers: &'a [(u64, u64)],
}

/// A GPU PE's IBGDA transport. Fields drop in order: doorbell thread and engine stop before the
/// queues and the fabric go.
pub struct GpuIbgda {
    proxy: Option<Proxy>,
    doorbell: Option<CpuDoorbell>,
    engine: Option<GpuEngine>,
    /// The PE's device, QPs and descriptor table.
    pub transport: PeIbgda,
    channels: Option<Arc<ProxyChannels>>,
    arena: Arc<GpuArena>,
    _fabric: Arc<Fabric>,
}

impl GpuIbgda {
    /// Collective over every PE (each passes whether it has IBGDA peers; all must call it when
    /// any pair of PEs uses IBGDA): creates this PE's side in GPU memory mapped for the devices
    /// `access`, exchanges connection info and connects. Returns `None` for a PE with no IBGDA
    /// peer. With `proxy`, the QPs are the proxy's (`options` from
    /// [`ProxyOptions::qp_options`]) and this PE's proxy channels are created too.
    ///
    /// With `windows` (PEs in separate processes), the queues go in the given arena (this PE's
    /// window, which every peer process maps at the same address) and the peers' windows mapped
    /// here are where remote QP contexts are found.
    ///
    /// # Safety
    /// `heap` is this PE's symmetric heap, alive until the returned value is dropped (its engine
    /// stopped) on every PE; so are the peer windows.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn connect(
        bootstrap: &dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        heap: (u64, u64),
        access: &[usize],
        peers: &[bool],
        mut options: IbgdaOptions,
        proxy: Option<ProxyOptions>,
        windows: Option<SharedWindows<'_>>,
        nic: &NicRequest,
    ) -> Result<Option<GpuIbgda>> {
        let me = bootstrap.rank();
        let ids = bootstrap.allgather("ibgda/fabric", &job_id().to_le_bytes())?;
        let id = u64::from_le_bytes(ids[0][..8].try_into().expect("8 bytes"));
        let fabric = Fabric::for_job(id);
        if let Some(w) = &windows {
            for &(base, len) in w.peers {
                // SAFETY: the caller keeps the peers' windows mapped until this transport (and
                // its engine) is gone.
                unsafe { fabric.add_peer_window(base, len, false) };
            }
        }
        let mine = if peers.iter().any(|&p| p) {
            let arena = match &windows {
                Some(w) => w.arena.clone(),
                None => GpuArena::new(ctx, me, access)?,
            };
            let mut gpu_doorbell = options.doorbell == DoorbellMode::Gpu;
            let proxied = options.doorbell == DoorbellMode::Proxy;
            let nic = crate::nic::open_for_gpu(
                nic,
                &fabric,
                Placement::Gpu(arena.clone()),
                me,
                proxied,
                &mut gpu_doorbell,
            )?;
            if options.doorbell == DoorbellMode::Gpu && !gpu_doorbell {
                options.doorbell = DoorbellMode::Cpu;
            }
            let t = PeIbgda::create(nic, Placement::Gpu(arena.clone()), me, heap, peers, options, Some(ctx))?;
            Some((t, arena))
        } else {
            None
        };
        let info = mine.as_ref().map_or_else(
            || ConnectInfo::none(heap.0, peers.len() as u32, &options),
            |(t, _)| t.local_info(),
        );
        let all = bootstrap.allgather("ibgda/connect", &info.encode())?;
        let infos = all.iter().map(|b| ConnectInfo::decode(b)).collect::<Result<Vec<_>>>()?;
        let Some((transport, arena)) = mine else {
            return Ok(None);
        };
        transport.connect(&infos)?;
        let channels = match proxy {
            Some(p) => Some(Arc::new(ProxyChannels::create(
                &transport,
                &Placement::Gpu(arena.clone()),
                Some(ctx),
                p,
            )?)),
            None => None,
        };
        Ok(Some(GpuIbgda {
            proxy: None,
            doorbell: None,
            engine: None,
            transport,
            channels,
            arena,
            _fabric: fabric,
        }))
    }

    /// Launches the GPU engine (`kernel` is the bundled `ibgda_emu_engine`) on `blocks` blocks
    /// and, in CPU-assisted mode, the doorbell thread.
    pub fn start(&mut self, kernel: &CudaFunction, blocks: u32, timeout: Duration) -> Result<()> {
        let me = self.transport.me;
        let ctx = self.arena.context().clone();
        // Only the emulated NIC needs an engine: a real one executes the queues itself.
        if self.transport.emulated().is_some() {
            self.engine = Some(GpuEngine::launch(
                me,
                &ctx,
                kernel,
                &self.transport.emulated_qps(),
                blocks,
                timeout,
            )?);
        }
        if self.transport.options.doorbell == DoorbellMode::Cpu {
            self.doorbell = Some(CpuDoorbell::start(me, self.transport.doorbell_slots())?);
        }
        if let Some(c) = &self.channels {
            self.proxy = Some(Proxy::start(&self.transport, c.clone())?);
        }
        Ok(())
    }

    /// The proxy channels (proxy mode only).
    pub fn proxy_channels(&self) -> Option<&ProxyChannels> {
        self.channels.as_deref()
    }

    /// The running proxy threads (proxy mode only).
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    /// Stops the proxy or doorbell thread and the engine; returns what the engine did.
    pub fn stop(&mut self) -> Result<EngineStats> {
        if let Some(mut p) = self.proxy.take() {
            p.stop();
        }
        if let Some(mut d) = self.doorbell.take() {
            d.stop();
        }
        match self.engine.as_mut() {
            Some(e) => e.stop(),
            None => Ok(EngineStats::default()),
        }
    }

    /// The engine's warps (0 when not started).
    pub fn engine_warps(&self) -> u32 {
        self.engine.as_ref().map_or(0, |e| e.warps())
    }

    /// The engine's blocks (0 when not started).
    pub fn engine_blocks(&self) -> u32 {
        self.engine.as_ref().map_or(0, |e| e.blocks())
    }

    /// Doorbells the CPU-assisted doorbell thread rang (0 in GPU-doorbell mode).
    pub fn cpu_doorbells_rung(&self) -> u64 {
        self.doorbell.as_ref().map_or(0, |d| d.rung())
    }
}

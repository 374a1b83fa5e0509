//! The GPU backend of a PE: its context and stream, symmetric heap (VMM, exported to and imported
//! from the other processes of the node), peer table, device state and error record.

use super::transports::TransportPlan;
use super::{enc, u64s, KernelArg};
use crate::bootstrap::Bootstrap;
use crate::config::Config;
use crate::cuda::{self, cuda_err, MappedHost, VmmHeap};
use crate::error::{Error, Result};
use crate::node::{exchange_fds, ProcessMap};
use crate::transport::ibgda::GpuIbgda;
use crate::transport::p2p;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use ibgda_abi::{collective_scratch_bytes, error_state, DeviceState, ErrorRecord, HeapHeader, PeerInfo, TransportKind};
use std::sync::Arc;

/// The GPU side of a [`super::Pe`]: its CUDA context and stream, modules, and the emulated NIC's
/// GPU engine. Reach it with `Pe::gpu()`.
pub struct GpuPe {
    // First, so it drops first: its engine writes into heaps and must stop before they go.
    ibgda: Option<GpuIbgda>,
    // Every module `load_ptx` loaded, kept until the PE goes (after every engine on the GPU has
    // stopped): unloading one needs an idle context, like loading.
    modules: parking_lot::Mutex<Vec<Arc<CudaModule>>>,
    // Kernels `Pe::launch` resolved, with their block-size limit: a typed launch looks its kernel
    // up once, not with two driver calls (cuModuleGetFunction, cuFuncGetAttribute) per launch.
    // Each entry holds its module, so the module's address names no other while cached.
    kernels: parking_lot::Mutex<Vec<CachedKernel>>,
    // Peers' heaps of other processes, mapped here (before our own heap goes).
    _imported: Vec<VmmHeap>,
    rank: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    heap: VmmHeap,
    peers: Vec<PeerInfo>,
    error: Arc<MappedHost<ErrorRecord>>,
    _state: CudaSlice<u8>,
    _peer_table: CudaSlice<u8>,
    state_ptr: u64,
}

/// Collective: exports `mine` to the other processes of this node and maps each one's
/// allocation of the same size, at `at(owner)` when that says where (else anywhere), for this
/// process's GPUs `access`. Entry `j` is PE `j`'s mapping here; `None` for PEs of this process.
#[allow(clippy::too_many_arguments)]
fn share_on_node(
    boot: &dyn Bootstrap,
    procs: &ProcessMap,
    config: &Config,
    ctx: &Arc<CudaContext>,
    what: &'static str,
    mine: &VmmHeap,
    access: &[usize],
    at: &dyn Fn(u32) -> Option<u64>,
) -> Result<Vec<Option<VmmHeap>>> {
    use std::os::fd::AsFd;
    let rank = boot.rank();
    let fd = mine.export_fd(rank)?;
    let fds = exchange_fds(boot, procs, what, Some(fd.as_fd()), config.collective_timeout)?;
    fds.into_iter()
        .enumerate()
        .map(|(j, fd)| {
            fd.map(|fd| VmmHeap::import_at(ctx, rank, fd, mine.size(), access, at(j as u32)))
                .transpose()
        })
        .collect()
}

/// The job-wide base of the fixed GPU windows: `first` (`IBGDA_GPU_VA_BASE`) when the whole
/// range `[first, first + len)` is free in every process, else the first of a few candidates
/// 4 TiB apart that is (a process may already hold part of a range: the driver's own placements,
/// a framework's allocations). Every process probes each candidate and they agree.
fn agree_on_va_base(boot: &dyn Bootstrap, rank: u32, first: u64, len: u64) -> Result<u64> {
    const TRIES: u64 = 8;
    const STEP: u64 = 4 << 40;
    let mut taken_by = Vec::new();
    for k in 0..TRIES {
        let at = first + k * STEP;
        if at + len > 0x7000_0000_0000 {
            break;
        }
        let free = crate::cuda::fixed_range_is_free(rank, at, len)?;
        let all = boot.allgather("init/gpu-va-probe", &[free as u8])?;
        taken_by = all
            .iter()
            .enumerate()
            .filter(|(_, b)| b.first() != Some(&1))
            .map(|(j, _)| j)
            .collect();
        if taken_by.is_empty() {
            if k > 0 {
                tracing::info!(
                    pe = rank,
                    "GPU windows at {at:#x}: IBGDA_GPU_VA_BASE {first:#x} was taken"
                );
            }
            return Ok(at);
        }
    }
    Err(Error::Config {
        name: "IBGDA_GPU_VA_BASE",
        value: format!("{first:#x}"),
        why: format!(
            "no range of {len:#x} bytes at it or at {TRIES} candidates 4 TiB apart was free in every process (taken in the processes of PEs {taken_by:?} at the last try): set IBGDA_GPU_VA_BASE to a free, 1 GiB-aligned range"
        ),
    })
}

/// The NIC layout every PE of the job uses: the proxy's, or IBGDA's with the QPs per peer chosen
/// for the job when `Config::qps_per_peer_auto` ([`crate::config::auto_qps_per_peer`] for this
/// PE's `engine_blocks`; the smallest choice of any PE, so GPUs of different sizes still pair
/// their QPs). A count set in the configuration must be the same on every PE.
fn agree_nic_options(
    boot: &dyn Bootstrap,
    config: &Config,
    plan: &TransportPlan,
    n_pes: u32,
    engine_blocks: u32,
) -> Result<crate::transport::ibgda::IbgdaOptions> {
    let mut o = plan.nic_options(config);
    let auto = !plan.use_proxy && config.qps_per_peer_auto;
    if auto {
        o.qps_per_peer = crate::config::auto_qps_per_peer(n_pes, engine_blocks);
    }
    let all = boot.allgather("init/qps-per-peer", &(o.qps_per_peer as u64).to_le_bytes())?;
    let theirs: Vec<u32> = all.iter().map(|b| u64s(b).next().unwrap_or(0) as u32).collect();
    match crate::config::agree_qps_per_peer(o.qps_per_peer, auto, &theirs) {
        Ok(q) => o.qps_per_peer = q,
        Err((j, q)) => {
            return Err(Error::CollectiveMismatch {
                call: "init (QPs per NIC peer: IBGDA_QPS_PER_PEER)",
                pe: boot.rank(),
                mine: o.qps_per_peer.to_string(),
                other_pe: j,
                theirs: q.to_string(),
            })
        }
    }
    Ok(o)
}

fn to_bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: T is a plain #[repr(C)] ABI struct; reading its bytes is fine.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()).to_vec() }
}

impl GpuPe {
    /// Brings up this PE's GPU side: binds its GPU (the launcher's local rank, `IBGDA_GPU`, or
    /// rank / `pes_per_gpu` in one process), checks that every same-node peer's GPU is reachable
    /// peer-to-peer, creates the symmetric heap (mapped for every GPU of this process, exported
    /// to the other processes of the node and their heaps imported), and uploads the device
    /// state. Collective.
    pub(crate) fn init(bootstrap: Arc<dyn Bootstrap>, config: &Config, procs: &ProcessMap) -> Result<GpuPe> {
        let rank = bootstrap.rank();
        let n_pes = bootstrap.size();
        let count = cuda::device_count()?;
        let device = match (config.gpu, bootstrap.local_rank()) {
            (Some(d), _) => d,
            (None, Some((local, _))) => local as usize % count.max(1),
            (None, None) => (rank / config.pes_per_gpu) as usize,
        };
        if device >= count {
            return Err(Error::NoSuchDevice {
                pe: rank,
                device,
                count,
            });
        }
        if let Some(j) = (0..n_pes).find(|&j| !procs.same_node(rank, j)) {
            return Err(Error::Config {
                name: "IBGDA_TRANSPORT",
                value: format!("PE {j} on {}", procs.procs[j as usize].0),
                why: "peers on other machines need a ConnectX NIC, which this build does not drive yet; every PE must run on one node".into(),
            });
        }
        let ctx = CudaContext::new(device).map_err(cuda_err("cuDevicePrimaryCtxRetain", rank))?;
        // We pass raw device pointers to kernels; cudarc's per-slice event tracking only adds work.
        // SAFETY: called before this context object allocates anything.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate", rank))?;

        let devices: Vec<usize> = bootstrap
            .allgather("init/devices", &(device as u64).to_le_bytes())?
            .iter()
            .map(|b| u64s(b).next().unwrap_or(0) as usize)
            .collect();
        // Device ordinals mean the same GPUs in every process of a node (one visibility list).
        let access = p2p::check_reachable(rank, &ctx, &devices)?;
        // GPUs of this process that map our heap (its other PEs'), and ours.
        let mut local_access: Vec<usize> = (0..n_pes)
            .filter(|&j| procs.same_process(rank, j))
            .map(|j| devices[j as usize])
            .collect();
        local_access.push(device);
        let across = !procs.single_process();
        let plan = TransportPlan::agree(bootstrap.as_ref(), config)?;
        // The emulated NIC's engine blocks and the QPs per NIC peer, chosen before the NIC window
        // is sized (its queues live there when PEs of several processes share the NIC).
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", rank))?
            .max(1) as u32;
        let engine_blocks = match config.engine_blocks {
            0 => crate::config::auto_engine_blocks(sms, config.pes_per_gpu),
            n => n,
        };
        let nic_options = agree_nic_options(bootstrap.as_ref(), config, &plan, n_pes, engine_blocks)?;
        // PEs in separate processes that use the NIC: every PE's heap and queue window at one
        // job-wide address in every process, so that the emulated NIC's engine in any process
        // finds a peer's QP contexts, key tables and heap where the peer put them.
        let fixed = across && plan.any_nic;
        let heap_len = config.heap_size.next_multiple_of(2 << 20);
        let nic_len = nic_options.window_bytes(n_pes);
        let gib = crate::shm::WINDOW_ALIGN;
        let stride = heap_len.next_multiple_of(gib) + nic_len.next_multiple_of(gib);
        if fixed {
            let all = bootstrap.allgather("init/gpu-window", &enc(&[config.gpu_va_base, stride]))?;
            for (j, b) in all.iter().enumerate() {
                let w: Vec<u64> = u64s(b).collect();
                if w != [config.gpu_va_base, stride] {
                    return Err(Error::CollectiveMismatch {
                        call: "init (GPU windows: IBGDA_GPU_VA_BASE, IBGDA_SYMMETRIC_SIZE, the NIC layout)",
                        pe: rank,
                        mine: format!("{:#x} + {stride:#x}", config.gpu_va_base),
                        other_pe: j as u32,
                        theirs: format!("{:#x} + {:#x}", w[0], w[1]),
                    });
                }
            }
        }
        let va_base = if fixed {
            agree_on_va_base(bootstrap.as_ref(), rank, config.gpu_va_base, stride * n_pes as u64)?
        } else {
            config.gpu_va_base
        };
        let window = |j: u32| va_base + j as u64 * stride;
        let heap = if fixed {
            VmmHeap::new_exportable_at(&ctx, rank, heap_len, &local_access, window(rank))?
        } else if across {
            VmmHeap::new_exportable(&ctx, rank, config.heap_size, &local_access)?
        } else {
            let mut all = access.clone();
            all.extend(devices.iter().copied());
            VmmHeap::new(&ctx, rank, config.heap_size, &all)?
        };
        let mut imported: Vec<Option<VmmHeap>> = (0..n_pes).map(|_| None).collect();
        let mut nic_windows: Vec<VmmHeap> = Vec::new();
        let mut own_arena = None;
        if across {
            let share = |what, mine: &VmmHeap, at: &dyn Fn(u32) -> Option<u64>| {
                share_on_node(bootstrap.as_ref(), procs, config, &ctx, what, mine, &local_access, at)
            };
            imported = share("GPU heap", &heap, &|j| fixed.then(|| window(j)))?;
            if fixed {
                let nic_at = |j: u32| window(j) + heap_len.next_multiple_of(gib);
                let chunk = VmmHeap::new_exportable_at(&ctx, rank, nic_len, &local_access, nic_at(rank))?;
                nic_windows = share("NIC window", &chunk, &|j| Some(nic_at(j)))?
                    .into_iter()
                    .flatten()
                    .collect();
                own_arena = Some(crate::emu::GpuArena::in_chunk(&ctx, rank, chunk)?);
            }
        }
        let scratch = collective_scratch_bytes(heap.size(), config.collective_scratch);
        let bases = bootstrap.allgather("init/heaps", &enc(&[heap.base(), heap.size(), scratch]))?;
        let mut peers = Vec::with_capacity(n_pes as usize);
        for (j, b) in bases.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            if w[1] != heap.size() {
                return Err(Error::CollectiveMismatch {
                    call: "init (heap size after granularity rounding, IBGDA_SYMMETRIC_SIZE)",
                    pe: rank,
                    mine: heap.size().to_string(),
                    other_pe: j as u32,
                    theirs: w[1].to_string(),
                });
            }
            super::check_same_scratch(rank, scratch, j as u32, w[2])?;
            // A peer of another process is reached through our own mapping of its heap.
            let base = imported[j].as_ref().map_or(w[0], |h| h.base());
            peers.push(p2p::peer_entry(base, devices[j]));
        }
        let mut access_all = access.clone();
        access_all.extend(devices.iter().copied());
        let ibgda_peers = plan.nic_peers.clone();
        let use_proxy = plan.use_proxy;
        let proxy_options = use_proxy.then_some(config.proxy);
        let peer_windows: Vec<(u64, u64)> = imported
            .iter()
            .flatten()
            .chain(nic_windows.iter())
            .map(|h| (h.base(), h.size()))
            .collect();
        let mut ibgda = if plan.any_nic {
            // SAFETY: the heap outlives `ibgda` (dropped first; finalize stops every engine
            // before any heap is unmapped).
            unsafe {
                GpuIbgda::connect(
                    bootstrap.as_ref(),
                    &ctx,
                    (heap.base(), heap.size()),
                    &access_all,
                    &ibgda_peers,
                    nic_options,
                    proxy_options,
                    own_arena.map(|arena| crate::transport::ibgda::SharedWindows {
                        arena,
                        peers: peer_windows.as_slice(),
                    }),
                    &crate::nic::NicRequest::from_config(config),
                )?
            }
        } else {
            None
        };
        let nic_kind = if use_proxy {
            TransportKind::Proxy
        } else {
            TransportKind::Ibgda
        };
        for (j, p) in peers.iter_mut().enumerate() {
            if ibgda_peers[j] {
                p.transport = nic_kind as u32;
            }
        }
        let error = Arc::new(MappedHost::<ErrorRecord>::new_zeroed(&ctx, rank, 1)?);
        shared_context::register(ctx.ordinal(), rank, &error);
        // The claim word lives in the (zeroed) heap header: device memory, where a GPU CAS is
        // atomic (on the host-mapped record it would not be, over PCIe).
        error.write(
            0,
            ErrorRecord {
                claim: heap.base() + std::mem::offset_of!(HeapHeader, error_claim) as u64,
                ..ErrorRecord::default()
            },
        );
        let table: Vec<u8> = peers.iter().flat_map(to_bytes).collect();
        let peer_table = stream
            .clone_htod(&table)
            .map_err(cuda_err("cuMemcpyHtoD(peers)", rank))?;
        let (peer_table_ptr, _g) = peer_table.device_ptr(&stream);
        let nic = ibgda.as_ref().filter(|_| !use_proxy).map(|g| &g.transport);
        let channels = ibgda.as_ref().and_then(|g| g.proxy_channels());
        let ds = DeviceState {
            qps: nic.map_or(0, |t| t.descriptor_table()),
            qps_per_peer: nic.map_or(0, |t| t.options.qps_per_peer),
            proxy: channels.map_or(0, |c| c.table()),
            proxy_channels: channels.map_or(0, |c| c.count()),
            ..DeviceState::new(
                rank,
                n_pes,
                (heap.base(), heap.size()),
                peer_table_ptr,
                error.device_ptr(),
                config.timeout.as_nanos() as u64,
            )
            .with_scratch(scratch)
        };
        drop(_g);
        let state = stream
            .clone_htod(&to_bytes(&ds))
            .map_err(cuda_err("cuMemcpyHtoD(state)", rank))?;
        let state_ptr = state.device_ptr(&stream).0;
        stream.synchronize().map_err(cuda_err("cuStreamSynchronize", rank))?;
        let engine_module = match ibgda {
            Some(_) => Some(cuda::load_module_once(&ctx, crate::kernels::ENGINE_PTX, || {
                cuda::load_module(&ctx, rank, crate::kernels::ENGINE_PTX)
            })?),
            None => None,
        };
        // No PE's engine may start while another still loads its modules (see `load_ptx`).
        bootstrap.barrier("init/modules")?;
        if let (Some(g), Some(engine_module)) = (ibgda.as_mut(), engine_module.as_ref()) {
            let engine = engine_module
                .load_function("ibgda_emu_engine")
                .map_err(cuda_err("cuModuleGetFunction", rank))?;
            g.start(&engine, engine_blocks, config.timeout)?;
            if rank == 0 && !use_proxy {
                // Stated once per process: what the job runs on, and how to change it.
                static SAID: std::sync::Once = std::sync::Once::new();
                let (qps, blocks) = (nic_options.qps_per_peer, g.engine_blocks());
                let why = if config.qps_per_peer_auto {
                    format!("chosen for {n_pes} PEs; IBGDA_QPS_PER_PEER sets it")
                } else {
                    "as configured".to_string()
                };
                let engine = if blocks > 0 {
                    format!(", the emulated NIC's engine on {blocks} blocks (IBGDA_ENGINE_BLOCKS sets it)")
                } else {
                    String::new()
                };
                let msg = format!("IBGDA: {qps} QPs per NIC peer ({why}){engine}");
                SAID.call_once(|| eprintln!("ibgda: {msg}"));
                tracing::info!("{msg}");
            }
        }
        tracing::debug!(
            pe = rank,
            device,
            heap_base = heap.base(),
            heap_size = heap.size(),
            "PE up"
        );
        Ok(GpuPe {
            ibgda,
            modules: parking_lot::Mutex::new(Vec::new()),
            kernels: parking_lot::Mutex::new(Vec::new()),
            _imported: imported.into_iter().flatten().chain(nic_windows).collect(),
            rank,
            ctx,
            stream,
            heap,
            peers,
            error,
            _state: state,
            _peer_table: peer_table,
            state_ptr,
        })
    }

    /// The CUDA context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream this PE's runtime operations and launches use.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device-state pointer to pass as the first argument of kernels using `ibgda-device`.
    pub fn state_ptr(&self) -> u64 {
        self.state_ptr
    }

    /// Base device address of this PE's symmetric heap.
    pub fn heap_base(&self) -> u64 {
        self.heap.base()
    }

    /// Size of every PE's symmetric heap (after rounding to the allocation granularity).
    pub fn heap_size(&self) -> u64 {
        self.heap.size()
    }

    /// Heap base and size of every PE as this PE's GPU sees them (the peer table).
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// The device error record, if a kernel of this PE reported one.
    pub fn device_error(&self) -> Option<ErrorRecord> {
        let rec = self.error.read(0);
        (rec.state == error_state::WRITTEN).then_some(rec)
    }

    /// Waits for this PE's stream. A kernel that reported an error becomes [`Error::Device`] with
    /// the full record ([`Error::ProxyFailed`], with the reason, when a proxy thread died); a kernel that failed otherwise becomes [`Error::KernelFailed`].
    pub fn synchronize(&self) -> Result<()> {
        let r = self.stream.synchronize();
        if let Some(rec) = self.device_error() {
            let proxy = self.ibgda.as_ref().and_then(|g| g.proxy());
            return Err(crate::transport::proxy::Proxy::device_error(proxy, rec));
        }
        r.map_err(|source| self.kernel_failed(source))
    }

    /// The device error this PE's kernels recorded, as [`GpuPe::synchronize`] reports it.
    pub(crate) fn recorded_error(&self) -> Option<Error> {
        let proxy = self.ibgda.as_ref().and_then(|g| g.proxy());
        self.device_error()
            .map(|rec| crate::transport::proxy::Proxy::device_error(proxy, rec))
    }

    /// Whether this PE's kernels failed only because another PE on its GPU in this process hit a
    /// device error (this PE wrote no record of its own, the other did).
    pub(crate) fn faulted_by_another(&self) -> bool {
        self.device_error().is_none() && shared_context::fault_of_another(self.ctx.ordinal(), self.rank).is_some()
    }

    /// A failed kernel or launch of this PE with no record of its own: the device error of
    /// another PE on this GPU in this process when one faulted (the shared context ended with it),
    /// else [`Error::KernelFailed`].
    fn kernel_failed(&self, source: cudarc::driver::DriverError) -> Error {
        match shared_context::fault_of_another(self.ctx.ordinal(), self.rank) {
            Some(record) => Error::SharedContextFault {
                pe: self.rank,
                source,
                record: Box::new(record),
            },
            None => Error::KernelFailed { pe: self.rank, source },
        }
    }

    /// Loads a PTX module (e.g. a kernel crate built with `ibgda-nvptx-builder`) and resolves all
    /// its kernels. Load modules before launching kernels that wait on other PEs: on a GPU shared
    /// by several PEs, loading waits for the kernels running there.
    ///
    /// Loading a module may need the GPU's context to be idle, which it never is while an
    /// emulated NIC's engine runs there: every engine on this GPU is halted for the load and
    /// relaunched after (posted work waits in its queues meanwhile).
    ///
    /// A module this process already loaded on this GPU (another PE's, or an earlier call's) is
    /// shared, not loaded again: nothing is halted then. The module stays loaded until the PE is
    /// finalized, whatever happens to the returned handle: unloading, too, needs an idle context.
    pub fn load_ptx(&self, ptx: &str) -> Result<Arc<CudaModule>> {
        let loaded = cuda::load_module_once(&self.ctx, ptx, || {
            crate::emu::with_engines_halted(self.ctx.ordinal(), || cuda::load_module(&self.ctx, self.rank, ptx))
                .and_then(|r| r)
        });
        let m = loaded.map_err(|e| self.with_device_record(e))?;
        self.modules.lock().push(m.clone());
        Ok(m)
    }

    /// `e`, or the device error this PE's kernels recorded when there is one: a kernel that
    /// trapped after writing its record (a wait past the timeout, say) leaves the context failed,
    /// and the next CUDA call anywhere (a module load restarting the NIC engine, for one) reports
    /// only `CUDA_ERROR_LAUNCH_FAILED`; the record says which wait, PE, peer and counter.
    fn with_device_record(&self, e: Error) -> Error {
        match self.device_error() {
            Some(rec) => {
                tracing::debug!(pe = self.rank, "{e}, after a device error");
                let proxy = self.ibgda.as_ref().and_then(|g| g.proxy());
                crate::transport::proxy::Proxy::device_error(proxy, rec)
            }
            None => e,
        }
    }

    /// Kernel `name` of `module` with the most threads a block of it may have, looked up in the
    /// driver on first use only.
    pub(crate) fn cached_kernel(&self, module: &Arc<CudaModule>, name: &'static str) -> Result<(CudaFunction, u32)> {
        let mut cache = self.kernels.lock();
        if let Some(k) = cache.iter().find(|k| Arc::ptr_eq(&k.module, module) && k.name == name) {
            return Ok((k.function.clone(), k.max_threads));
        }
        let function = self.function(module, name)?;
        let max_threads = function
            .max_threads_per_block()
            .map_err(crate::cuda::cuda_err("cuFuncGetAttribute", self.rank))?
            .max(0) as u32;
        cache.push(CachedKernel {
            module: module.clone(),
            name,
            function: function.clone(),
            max_threads,
        });
        Ok((function, max_threads))
    }

    /// A kernel from a module loaded with [`Pe::load_ptx`].
    pub fn function(&self, module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
        module
            .load_function(name)
            .map_err(cuda_err("cuModuleGetFunction", self.rank))
    }

    /// Local teardown of a PE whose job failed, with no collective: waits for its kernels (device
    /// waits are bounded, so they end), then stops its NIC engine and proxy threads. Called on
    /// every surviving PE before any of them is dropped, so no kernel, engine or proxy still
    /// reaches into a heap that is being unmapped.
    pub(crate) fn quiesce(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            tracing::debug!(pe = self.rank, "quiesce: stream: {e}");
        }
        if let Some(g) = self.ibgda.as_mut() {
            if let Err(e) = g.stop() {
                tracing::debug!(pe = self.rank, "quiesce: NIC: {e}");
            }
        }
    }

    /// How this PE reaches `peer`.
    pub fn transport_to(&self, peer: u32) -> Option<TransportKind> {
        let p = self.peers.get(peer as usize)?;
        TransportKind::from_u32(p.transport)
    }

    /// Stops this PE's emulated NIC engine, doorbell and proxy threads (collective teardown).
    pub(crate) fn stop_nic(&mut self) -> Result<()> {
        if let Some(g) = self.ibgda.as_mut() {
            let stats = g.stop()?;
            tracing::debug!(pe = self.rank, ?stats, "GPU engine stopped");
        }
        Ok(())
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.rank))
    }

    /// Zeroes heap bytes `[off, off + len)` (inside the heap: checked by the caller).
    pub(crate) fn zero(&self, off: u64, len: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: [base+off, +len) is inside our mapped heap.
        cuda::check("cuMemsetD8Async", self.rank, unsafe {
            sys::cuMemsetD8Async(self.heap.base() + off, 0, len as usize, self.stream.cu_stream())
        })?;
        self.synchronize()
    }

    /// Copies `data` to heap offset `off` (in bounds: checked by the caller).
    pub(crate) fn write_bytes(&self, off: u64, data: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: in the heap (checked); the host slice outlives the synchronisation below.
        cuda::check("cuMemcpyHtoDAsync", self.rank, unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.heap.base() + off,
                data.as_ptr().cast(),
                data.len(),
                self.stream.cu_stream(),
            )
        })?;
        self.synchronize()
    }

    /// Enqueues a copy-engine copy of `bytes` from this heap's offset `src_off` to `pe`'s heap at
    /// `dst_off` (both in bounds: checked by the caller) on this PE's stream.
    pub(crate) fn copy_engine_put(&self, pe: u32, dst_off: u64, src_off: u64, bytes: u64) -> Result<()> {
        let peer = self.peers.get(pe as usize).copied().unwrap_or_default();
        if peer.transport != TransportKind::P2p as u32 || peer.heap_base == 0 {
            return Err(Error::PeerUnreachable {
                pe: self.rank,
                device: self.ctx.ordinal(),
                peer: pe,
                peer_device: peer.device as usize,
            });
        }
        self.bind()?;
        // SAFETY: both ranges lie inside mapped heaps (checked by the caller); the copy is ordered
        // on this PE's stream, and the heaps outlive it (a PE's teardown synchronises its stream).
        cuda::check("cuMemcpyDtoDAsync", self.rank, unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                peer.heap_base + dst_off,
                self.heap.base() + src_off,
                bytes as usize,
                self.stream.cu_stream(),
            )
        })
    }

    /// Copies heap bytes from offset `off` into `out` (in bounds: checked by the caller).
    pub(crate) fn read_bytes(&self, off: u64, out: &mut [u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: in the heap (checked); `out` outlives the synchronisation below.
        cuda::check("cuMemcpyDtoHAsync", self.rank, unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                self.heap.base() + off,
                out.len(),
                self.stream.cu_stream(),
            )
        })?;
        self.synchronize()
    }

    /// This PE's IBGDA transport (its emulated NIC, QPs and engine), if any peer uses IBGDA.
    pub fn ibgda(&self) -> Option<&GpuIbgda> {
        self.ibgda.as_ref()
    }
}

impl GpuPe {
    /// Launches `f` on this PE's stream with scalar arguments (asynchronous; see
    /// [`Pe::synchronize`]).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and width, and every pointer
    /// among them must be valid for what the kernel does with it.
    pub unsafe fn launch_function(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let max = f
            .max_threads_per_block()
            .map_err(crate::cuda::cuda_err("cuFuncGetAttribute", self.rank))?;
        // SAFETY: the caller's contract.
        unsafe { self.launch_checked(f, max.max(0) as u32, cfg, args) }
    }

    /// [`GpuPe::launch_function`] with the kernel's block-size limit `max` already known.
    ///
    /// # Safety
    /// As [`GpuPe::launch_function`].
    pub(crate) unsafe fn launch_checked(
        &self,
        f: &CudaFunction,
        max: u32,
        cfg: cudarc::driver::LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        use cudarc::driver::PushKernelArg;
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        if threads > max {
            let registers = f
                .get_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
                .unwrap_or(-1);
            return Err(Error::BlockTooLarge {
                pe: self.rank,
                threads,
                max,
                registers,
            });
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                KernelArg::U32(v) => b.arg(v),
                KernelArg::U64(v) => b.arg(v),
                KernelArg::I32(v) => b.arg(v),
                KernelArg::I64(v) => b.arg(v),
                KernelArg::F32(v) => b.arg(v),
            };
        }
        b.launch(cfg).map_err(|source| self.kernel_failed(source))?;
        Ok(())
    }
}

/// A kernel [`GpuPe::cached_kernel`] resolved.
pub(crate) struct CachedKernel {
    module: Arc<CudaModule>,
    name: &'static str,
    function: CudaFunction,
    max_threads: u32,
}

/// The error records of this process's GPU PEs by device: when one PE's kernel traps, the CUDA
/// context it shares with the other PEs on its GPU ends, and they see a bare
/// `CUDA_ERROR_LAUNCH_FAILED`; this lets them name the PE that faulted and its error instead.
mod shared_context {
    use crate::cuda::MappedHost;
    use ibgda_abi::{error_state, ErrorRecord};
    use std::sync::{Arc, Weak};

    type Entry = (usize, u32, Weak<MappedHost<ErrorRecord>>);
    static PES: parking_lot::Mutex<Vec<Entry>> = parking_lot::Mutex::new(Vec::new());

    /// Records PE `rank`'s error record, on device `ordinal`, for as long as the PE lives.
    pub(super) fn register(ordinal: usize, rank: u32, record: &Arc<MappedHost<ErrorRecord>>) {
        let mut pes = PES.lock();
        pes.retain(|(_, _, r)| r.strong_count() > 0);
        pes.push((ordinal, rank, Arc::downgrade(record)));
    }

    /// The written device error of a live PE other than `rank` on device `ordinal`, if any.
    pub(super) fn fault_of_another(ordinal: usize, rank: u32) -> Option<ErrorRecord> {
        let pes = PES.lock();
        pes.iter()
            .filter(|(o, r, _)| *o == ordinal && *r != rank)
            .filter_map(|(_, _, rec)| rec.upgrade())
            .map(|rec| rec.read(0))
            .find(|rec| rec.state == error_state::WRITTEN)
    }
}

//! A processing element on a GPU: its context and stream, symmetric heap, peer table, device state
//! and error record.

use crate::bootstrap::{Bootstrap, ThreadBootstrap};
use crate::config::Config;
use crate::config::PeerTransport;
use crate::cuda::{self, cuda_err, MappedHost, VmmHeap};
use crate::error::{Error, Result};
use crate::heap::SymmetricAllocator;
use crate::symmetric::SymmetricBuffer;
use crate::transport::ibgda::GpuIbgda;
use crate::transport::p2p;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use ibgda_abi::{
    error_state, DeviceState, ErrorRecord, HeapHeader, PeerInfo, TransportKind, ABI_MAGIC, ABI_VERSION,
    HEAP_RESERVED_BYTES,
};
use std::sync::{Arc, OnceLock};

/// One PE on one GPU. Create with [`Pe::init`] (or let [`run_in_process`] do it), use it from one
/// thread, and end it with [`Pe::finalize`], which is collective.
///
/// The runtime never calls `cuCtxSynchronize`: it synchronises its own stream, so long-running
/// kernels on other streams of the same context (such as a persistent engine) never block it.
pub struct Pe {
    // First, so it drops first: its engine writes into heaps and must stop before they go.
    ibgda: Option<GpuIbgda>,
    // Every module `load_ptx` loaded, kept until the PE goes (after every engine on the GPU has
    // stopped): unloading one needs an idle context, like loading.
    modules: parking_lot::Mutex<Vec<Arc<CudaModule>>>,
    rank: u32,
    n_pes: u32,
    config: Config,
    bootstrap: Arc<dyn Bootstrap>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    heap: VmmHeap,
    alloc: SymmetricAllocator,
    peers: Vec<PeerInfo>,
    error: MappedHost<ErrorRecord>,
    _state: CudaSlice<u8>,
    _peer_table: CudaSlice<u8>,
    state_ptr: u64,
    bundled: OnceLock<Arc<CudaModule>>,
}

fn to_bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: T is a plain #[repr(C)] ABI struct; reading its bytes is fine.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()).to_vec() }
}

fn u64s(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

fn enc(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl Pe {
    /// Brings up this PE: binds its GPU (PE `rank` uses GPU `rank / pes_per_gpu`), checks that
    /// every peer's GPU is reachable peer-to-peer, creates the symmetric heap (mapped for every
    /// participating GPU), exchanges heap addresses, and uploads the device state. Collective.
    pub fn init(bootstrap: Arc<dyn Bootstrap>, config: Config) -> Result<Pe> {
        let rank = bootstrap.rank();
        let n_pes = bootstrap.size();
        let count = cuda::device_count()?;
        let device = (rank / config.pes_per_gpu) as usize;
        if device >= count {
            return Err(Error::NoSuchDevice {
                pe: rank,
                device,
                count,
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
        let access = p2p::check_reachable(rank, &ctx, &devices)?;
        let mut access_all: Vec<usize> = access.clone();
        access_all.extend(devices.iter().copied());
        let heap = VmmHeap::new(&ctx, rank, config.heap_size, &access_all)?;

        let bases = bootstrap.allgather("init/heaps", &enc(&[heap.base(), heap.size()]))?;
        let mut peers = Vec::with_capacity(n_pes as usize);
        for (j, b) in bases.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            if w[1] != heap.size() {
                return Err(Error::CollectiveMismatch {
                    call: "init (heap size after granularity rounding)",
                    pe: rank,
                    mine: heap.size().to_string(),
                    other_pe: j as u32,
                    theirs: w[1].to_string(),
                });
            }
            peers.push(p2p::peer_entry(w[0], devices[j]));
        }

        // Transports: a pair of PEs uses the NIC when either side asks for it; one job uses it
        // either GPU-initiated (IBGDA) or through CPU proxies.
        let wants: Vec<u64> = (0..n_pes)
            .map(|j| match config.transport_to(j) {
                _ if j == rank => 0,
                PeerTransport::Ibgda => 1,
                PeerTransport::Proxy => 2,
                PeerTransport::Auto | PeerTransport::P2p => 0,
            })
            .collect();
        let all_wants: Vec<Vec<u64>> = bootstrap
            .allgather("init/transports", &enc(&wants))?
            .iter()
            .map(|b| u64s(b).collect())
            .collect();
        let asked = |k: u64| all_wants.iter().position(|w| w.contains(&k));
        let use_proxy = match (asked(1), asked(2)) {
            (Some(a), Some(b)) => {
                return Err(Error::Config {
                    name: "transport",
                    value: format!("PE {a} asks for ibgda, PE {b} for proxy"),
                    why: "one job reaches its NIC peers either GPU-initiated or through the proxy, not both".into(),
                })
            }
            (_, p) => p.is_some(),
        };
        let ibgda_pair = |i: usize, j: usize| i != j && (all_wants[i][j] != 0 || all_wants[j][i] != 0);
        let ibgda_peers: Vec<bool> = (0..n_pes as usize).map(|j| ibgda_pair(rank as usize, j)).collect();
        let any_ibgda = (0..n_pes as usize).any(|i| (0..n_pes as usize).any(|j| ibgda_pair(i, j)));
        let (nic_options, proxy_options) = if use_proxy {
            (config.proxy.qp_options(), Some(config.proxy))
        } else {
            (config.ibgda, None)
        };
        let mut ibgda = if any_ibgda {
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

        let error = MappedHost::<ErrorRecord>::new_zeroed(&ctx, rank, 1)?;
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
        let ds = DeviceState {
            magic: ABI_MAGIC,
            version: ABI_VERSION,
            size: DeviceState::SIZE,
            my_pe: rank,
            n_pes,
            flags: 0,
            heap_base: heap.base(),
            heap_size: heap.size(),
            heap_reserved: HEAP_RESERVED_BYTES,
            peers: peer_table_ptr,
            error: error.device_ptr(),
            timeout_ns: config.timeout.as_nanos() as u64,
            qps: ibgda
                .as_ref()
                .filter(|_| !use_proxy)
                .map_or(0, |g| g.transport.descriptor_table()),
            qps_per_peer: ibgda
                .as_ref()
                .filter(|_| !use_proxy)
                .map_or(0, |g| g.transport.options.qps_per_peer),
            _pad: 0,
            proxy: ibgda.as_ref().and_then(|g| g.proxy_channels()).map_or(0, |c| c.table()),
            proxy_channels: ibgda.as_ref().and_then(|g| g.proxy_channels()).map_or(0, |c| c.count()),
            _pad2: 0,
            reserved: [0; 3],
        };
        drop(_g);
        let state = stream
            .clone_htod(&to_bytes(&ds))
            .map_err(cuda_err("cuMemcpyHtoD(state)", rank))?;
        let state_ptr = state.device_ptr(&stream).0;
        stream.synchronize().map_err(cuda_err("cuStreamSynchronize", rank))?;
        let alloc = SymmetricAllocator::new(rank, HEAP_RESERVED_BYTES, heap.size());
        // Load the bundled kernels now, while no PE's kernel can be running (see `load_module`).
        let bundled = OnceLock::new();
        let module = cuda::load_module(&ctx, rank, crate::kernels::PTX)?;
        // No PE's engine may start while another still loads its modules (see `load_ptx`).
        bootstrap.barrier("init/modules")?;
        if let Some(g) = ibgda.as_mut() {
            let engine = module
                .load_function("ibgda_emu_engine")
                .map_err(cuda_err("cuModuleGetFunction", rank))?;
            g.start(&engine, config.engine_blocks, config.timeout)?;
        }
        let _ = bundled.set(module);
        bootstrap.barrier("init")?;
        tracing::debug!(
            pe = rank,
            device,
            heap_base = heap.base(),
            heap_size = heap.size(),
            "PE up"
        );
        Ok(Pe {
            ibgda,
            modules: parking_lot::Mutex::new(Vec::new()),
            rank,
            n_pes,
            config,
            bootstrap,
            ctx,
            stream,
            heap,
            alloc,
            peers,
            error,
            _state: state,
            _peer_table: peer_table,
            state_ptr,
            bundled,
        })
    }

    /// This PE's index.
    pub fn my_pe(&self) -> u32 {
        self.rank
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> u32 {
        self.n_pes
    }

    /// The configuration this PE was brought up with.
    pub fn config(&self) -> &Config {
        &self.config
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

    /// This PE's device address of `buf`.
    pub fn ptr<T>(&self, buf: &SymmetricBuffer<T>) -> u64 {
        self.heap.base() + buf.offset
    }

    /// Collective: allocates `len` zeroed elements at the same offset on every PE. Every PE must
    /// call it with the same `len`; a PE whose heap is exhausted makes the call fail on all PEs,
    /// leaving every heap as it was.
    pub fn malloc<T>(&mut self, len: usize) -> Result<SymmetricBuffer<T>> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let local = self.alloc.alloc(bytes);
        let (ok, off, largest) = match &local {
            Ok(o) => (1, *o, 0),
            Err(Error::HeapExhausted { largest_free, .. }) => (0, 0, *largest_free),
            Err(_) => (0, 0, 0),
        };
        let all = self.bootstrap.allgather("malloc", &enc(&[ok, bytes, off, largest]))?;
        let undo = |me: &mut Self| {
            if let Ok(o) = local.as_ref() {
                let _ = me.alloc.free(*o);
            }
        };
        for (j, b) in all.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            if w[1] != bytes {
                undo(self);
                return Err(Error::CollectiveMismatch {
                    call: "malloc (bytes)",
                    pe: self.rank,
                    mine: bytes.to_string(),
                    other_pe: j as u32,
                    theirs: w[1].to_string(),
                });
            }
            if w[0] == 0 {
                undo(self);
                return Err(match local {
                    Err(e) => e,
                    Ok(_) => Error::HeapExhausted {
                        pe: j as u32,
                        requested: bytes,
                        largest_free: w[3],
                        heap_size: self.heap.size() - HEAP_RESERVED_BYTES,
                    },
                });
            }
            if w[2] != off {
                undo(self);
                return Err(Error::CollectiveMismatch {
                    call: "malloc (offset: the PEs' malloc/free sequences differ)",
                    pe: self.rank,
                    mine: format!("{off:#x}"),
                    other_pe: j as u32,
                    theirs: format!("{:#x}", w[2]),
                });
            }
        }
        let rounded = self.alloc.size_of(off).unwrap_or(bytes);
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.rank))?;
        // SAFETY: [base+off, +rounded) is inside our mapped heap.
        cuda::check("cuMemsetD8Async", self.rank, unsafe {
            sys::cuMemsetD8Async(self.heap.base() + off, 0, rounded as usize, self.stream.cu_stream())
        })?;
        self.synchronize()?;
        Ok(SymmetricBuffer::new(off, len))
    }

    /// Collective: frees `buf` on every PE. A buffer this heap did not allocate (or already freed)
    /// is rejected with `ForeignFree` and nothing changes.
    pub fn free<T>(&mut self, buf: SymmetricBuffer<T>) -> Result<()> {
        self.free_offset(buf.offset)
    }

    /// Collective [`Pe::free`] by heap offset.
    pub fn free_offset(&mut self, offset: u64) -> Result<()> {
        self.synchronize()?;
        let known = self.alloc.size_of(offset).is_some();
        let all = self.bootstrap.allgather("free", &enc(&[known as u64, offset]))?;
        for (j, b) in all.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            if w[1] != offset {
                return Err(Error::CollectiveMismatch {
                    call: "free (offset)",
                    pe: self.rank,
                    mine: format!("{offset:#x}"),
                    other_pe: j as u32,
                    theirs: format!("{:#x}", w[1]),
                });
            }
            if w[0] == 0 {
                return Err(Error::ForeignFree { pe: j as u32, offset });
            }
        }
        self.alloc.free(offset)
    }

    /// Copies `data` into this PE's copy of `buf`, starting at element `start`.
    pub fn write<T: Copy>(&self, buf: &SymmetricBuffer<T>, start: usize, data: &[T]) -> Result<()> {
        buf.check_range("write", self.rank, start, data.len())?;
        let dst = self.ptr(buf) + (start * std::mem::size_of::<T>()) as u64;
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.rank))?;
        // SAFETY: the range is inside `buf` (checked); the host slice outlives the synchronous
        // completion below.
        cuda::check("cuMemcpyHtoDAsync", self.rank, unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                self.stream.cu_stream(),
            )
        })?;
        self.synchronize()
    }

    /// Reads `len` elements of this PE's copy of `buf` from element `start`.
    pub fn read<T: Copy + Default>(&self, buf: &SymmetricBuffer<T>, start: usize, len: usize) -> Result<Vec<T>> {
        buf.check_range("read", self.rank, start, len)?;
        let mut out = vec![T::default(); len];
        let src = self.ptr(buf) + (start * std::mem::size_of::<T>()) as u64;
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.rank))?;
        // SAFETY: the range is inside `buf` (checked); `out` outlives the synchronisation below.
        cuda::check("cuMemcpyDtoHAsync", self.rank, unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                src,
                len * std::mem::size_of::<T>(),
                self.stream.cu_stream(),
            )
        })?;
        self.synchronize()?;
        Ok(out)
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
        r.map_err(|source| Error::KernelFailed { pe: self.rank, source })
    }

    /// Host-side barrier across PEs: completes this PE's stream, then waits for every PE.
    pub fn barrier(&self) -> Result<()> {
        self.synchronize()?;
        self.bootstrap.barrier("barrier")
    }

    /// Loads a PTX module (e.g. a kernel crate built with `ibgda-nvptx-builder`) and resolves all
    /// its kernels. Load modules before launching kernels that wait on other PEs: on a GPU shared
    /// by several PEs, loading waits for the kernels running there.
    ///
    /// Loading a module may need the GPU's context to be idle, which it never is while an
    /// emulated NIC's engine runs there: every engine on this GPU is halted for the load and
    /// relaunched after (posted work waits in its queues meanwhile).
    ///
    /// The module stays loaded until the PE is finalized, whatever happens to the returned handle:
    /// unloading, too, needs an idle context.
    pub fn load_ptx(&self, ptx: &str) -> Result<Arc<CudaModule>> {
        let m = crate::emu::with_engines_halted(self.ctx.ordinal(), || cuda::load_module(&self.ctx, self.rank, ptx))??;
        self.modules.lock().push(m.clone());
        Ok(m)
    }

    /// A kernel of the bundled module ([`crate::kernels`]), loaded on first use.
    pub fn bundled_function(&self, name: &str) -> Result<CudaFunction> {
        let m = match self.bundled.get() {
            Some(m) => m.clone(),
            None => {
                let m = self.load_ptx(crate::kernels::PTX)?;
                self.bundled.get_or_init(|| m).clone()
            }
        };
        m.load_function(name)
            .map_err(cuda_err("cuModuleGetFunction", self.rank))
    }

    /// A kernel from a module loaded with [`Pe::load_ptx`].
    pub fn function(&self, module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
        module
            .load_function(name)
            .map_err(cuda_err("cuModuleGetFunction", self.rank))
    }

    /// Collective teardown: completes this PE's work and waits for every PE, stops this PE's
    /// emulated NIC, and waits for every PE again before the heap is unmapped (a peer, or a
    /// peer's NIC, may still be using it until then).
    ///
    /// If it fails (a peer failed or never came), this PE is dropped on return, heap included:
    /// callers that run several PEs in one process should rather let [`run_in_process`] tear
    /// them down, which keeps a failed PE's memory until every PE has stopped.
    pub fn finalize(self) -> Result<()> {
        self.try_finalize().map_err(|(e, _pe)| e)
    }

    /// [`Pe::finalize`], handing the PE back on failure (its memory may still be in use by peers).
    fn try_finalize(mut self) -> std::result::Result<(), (Error, Box<Pe>)> {
        if let Err(e) = self.synchronize() {
            return Err((e, Box::new(self)));
        }
        if let Err(e) = self.bootstrap.barrier("finalize") {
            return Err((e, Box::new(self)));
        }
        if let Some(g) = self.ibgda.as_mut() {
            match g.stop() {
                Ok(stats) => tracing::debug!(pe = self.rank, ?stats, "GPU engine stopped"),
                Err(e) => return Err((e, Box::new(self))),
            }
        }
        match self.bootstrap.barrier("finalize/nic") {
            Ok(()) => Ok(()),
            Err(e) => Err((e, Box::new(self))),
        }
    }

    /// Local teardown of a PE whose job failed, with no collective: waits for its kernels (device
    /// waits are bounded, so they end), then stops its NIC engine and proxy threads. Called on
    /// every surviving PE before any of them is dropped, so no kernel, engine or proxy still
    /// reaches into a heap that is being unmapped.
    fn quiesce(&mut self) {
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

    /// This PE's IBGDA transport (its emulated NIC, QPs and engine), if any peer uses IBGDA.
    pub fn ibgda(&self) -> Option<&GpuIbgda> {
        self.ibgda.as_ref()
    }

    /// Marks this PE as failed so peers' host collectives return instead of waiting.
    pub fn abort(&self) {
        self.bootstrap.abort();
    }
}

/// Runs `body` on `n_pes` PEs in this process, one thread per PE, and returns each PE's result
/// in rank order. PEs are placed `config.pes_per_gpu` to a GPU.
///
/// If any PE fails, the others are told (their host collectives return `PeerFailed`), and the
/// error returned is the first PE's own failure (not a `PeerFailed` echo). A failed PE is not
/// torn down while others run: its heap, NIC engine and proxy stay until every PE's thread has
/// returned, then every PE's kernels are waited for and its engine and proxy stopped before any
/// memory is released (a peer's kernel or NIC may be writing into the failed PE's heap). A panic
/// in `body` (a failed assertion) counts as that PE failing, and is resumed once every PE is
/// torn down.
pub fn run_in_process<T, F>(n_pes: u32, config: Config, body: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&mut Pe) -> Result<T> + Sync,
{
    let group = ThreadBootstrap::group(n_pes, config.collective_timeout);
    let outcomes: Vec<PeEnd<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|b| {
                let (config, body) = (config.clone(), &body);
                s.spawn(move || {
                    let boot: Arc<dyn Bootstrap> = Arc::new(b.clone());
                    let mut pe = match Pe::init(boot, config) {
                        Ok(pe) => pe,
                        Err(e) => {
                            b.abort();
                            return (Outcome::Done(Err(e)), None);
                        }
                    };
                    // A panicking body (a failed assertion in a test) is a failure like any other
                    // here: its PE is kept, its peers told; the panic resumes after teardown.
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut pe)));
                    match out {
                        Ok(Ok(v)) => match pe.try_finalize() {
                            Ok(()) => (Outcome::Done(Ok(v)), None),
                            Err((e, pe)) => {
                                b.abort();
                                (Outcome::Done(Err(e)), Some(pe))
                            }
                        },
                        Ok(Err(e)) => {
                            pe.abort();
                            (Outcome::Done(Err(e)), Some(Box::new(pe)))
                        }
                        Err(panic) => {
                            pe.abort();
                            (Outcome::Panicked(panic), Some(Box::new(pe)))
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a PE thread panicked outside its body"))
            })
            .collect()
    });
    // A PE that failed is kept until every PE thread has returned: peers' kernels, NIC engines and
    // proxies may still be writing into its heap (dropping it at once unmapped memory a peer GPU
    // was using: CUDA_ERROR_ILLEGAL_ADDRESS there, blamed on the wrong PE). Then all of them are
    // quiesced before any is dropped.
    let (outcomes, mut survivors): (Vec<_>, Vec<_>) = outcomes.into_iter().unzip();
    for pe in survivors.iter_mut().flatten() {
        pe.quiesce();
    }
    drop(survivors);
    let mut results = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        match o {
            Outcome::Done(r) => results.push(r),
            Outcome::Panicked(panic) => std::panic::resume_unwind(panic),
        }
    }
    first_error(results)
}

/// How the body of one [`run_in_process`] PE ended.
enum Outcome<T> {
    Done(Result<T>),
    Panicked(Box<dyn std::any::Any + Send>),
}

/// A PE thread's outcome and, if it failed, the PE itself, torn down after every thread ended.
type PeEnd<T> = (Outcome<T>, Option<Box<Pe>>);

/// All results, or the most informative error: a PE's own failure before any `PeerFailed` echo.
pub(crate) fn first_error<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(results.len());
    let mut echo = None;
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e @ Error::PeerFailed { .. }) => {
                echo.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match echo {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// One scalar kernel argument for [`Pe::launch`]. Pointers (device addresses from
/// [`Pe::state_ptr`] and [`Pe::ptr`]) are `U64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 64-bit unsigned integer or a device pointer.
    U64(u64),
    /// A 32-bit signed integer.
    I32(i32),
    /// A 64-bit signed integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
}

impl From<u32> for KernelArg {
    fn from(v: u32) -> Self {
        KernelArg::U32(v)
    }
}
impl From<u64> for KernelArg {
    fn from(v: u64) -> Self {
        KernelArg::U64(v)
    }
}
impl From<i32> for KernelArg {
    fn from(v: i32) -> Self {
        KernelArg::I32(v)
    }
}
impl From<i64> for KernelArg {
    fn from(v: i64) -> Self {
        KernelArg::I64(v)
    }
}
impl From<f32> for KernelArg {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}

impl Pe {
    /// Launches `f` on this PE's stream with scalar arguments (asynchronous; see
    /// [`Pe::synchronize`]).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and width, and every pointer
    /// among them must be valid for what the kernel does with it.
    pub unsafe fn launch(&self, f: &CudaFunction, cfg: cudarc::driver::LaunchConfig, args: &[KernelArg]) -> Result<()> {
        use cudarc::driver::PushKernelArg;
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        let max = f
            .max_threads_per_block()
            .map_err(crate::cuda::cuda_err("cuFuncGetAttribute", self.rank))?;
        if threads as i32 > max {
            let registers = f
                .get_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
                .unwrap_or(-1);
            return Err(Error::BlockTooLarge {
                pe: self.rank,
                threads,
                max: max as u32,
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
        b.launch(cfg)
            .map_err(|source| Error::KernelFailed { pe: self.rank, source })?;
        Ok(())
    }

    /// [`Pe::launch`] of a bundled kernel by name.
    ///
    /// # Safety
    /// As [`Pe::launch`].
    pub unsafe fn launch_bundled(
        &self,
        name: &str,
        cfg: cudarc::driver::LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let f = self.bundled_function(name)?;
        self.launch(&f, cfg, args)
    }
}

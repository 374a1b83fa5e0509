//! A processing element: one host API whether it runs on a GPU or on the CPU emulation, and
//! whether its peers are threads of this process or other processes (torchrun, Slurm,
//! `ibgda-run`).

mod cpu;
mod gpu;
mod job;
mod launch;
mod teams;
mod transports;

pub use gpu::GpuPe;
pub use job::{run, run_in_process};
pub use launch::{Grid, IntoKernelArg, KernelArg, KernelArgs, Module};

use crate::bootstrap::{Bootstrap, TcpBootstrap, ThreadBootstrap};
use crate::config::{Config, DeviceChoice};
use crate::error::{Error, Result};
use crate::heap::SymmetricAllocator;
use crate::node::ProcessMap;
use crate::symmetric::SymmetricBuffer;
use bytemuck::Pod;
use cpu::CpuPe;
use ibgda_abi::kernel::KernelFn;
use ibgda_abi::{collective_scratch_bytes, DeviceState, ErrorRecord, TransportKind, HEAP_RESERVED_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) fn u64s(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

/// The reductions' scratch must be the same on every PE (its offset and size are symmetric, and a
/// reduction's rounds follow its size): a PE whose `IBGDA_COLLECTIVE_SCRATCH` gave another is
/// named at init.
fn check_same_scratch(pe: u32, mine: u64, other_pe: u32, theirs: u64) -> Result<()> {
    if mine == theirs {
        return Ok(());
    }
    Err(Error::CollectiveMismatch {
        call: "init (collective scratch bytes, IBGDA_COLLECTIVE_SCRATCH)",
        pe,
        mine: mine.to_string(),
        other_pe,
        theirs: theirs.to_string(),
    })
}

pub(crate) fn enc(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Where a PE runs.
enum Backend {
    Gpu(Box<GpuPe>),
    Cpu(Box<CpuPe>),
}

/// Heap identities: a buffer remembers the heap that allocated it.
static NEXT_HEAP_ID: AtomicU64 = AtomicU64::new(1);

/// One PE: on a GPU, or on the CPU emulation (device code on CPU threads). Create it with
/// [`Pe::from_env`] (one process per PE under torchrun, Slurm or `ibgda-run`, or a single PE),
/// [`Pe::init`] with a bootstrap of your own, or let [`run_in_process`] make several as threads;
/// use it from one thread, and end it with [`Pe::finalize`], which is collective.
///
/// ```no_run
/// # use ibgda::{Pe, Config};
/// let mut pe = Pe::from_env(Config::from_env()?)?;
/// let buf = pe.malloc::<u64>(1024)?;
/// pe.write(&buf, 0, &[pe.my_pe() as u64; 1024])?;
/// pe.barrier()?;
/// pe.finalize()?;
/// # Ok::<(), ibgda::Error>(())
/// ```
///
/// The runtime never calls `cuCtxSynchronize`: it synchronises its own stream, so long-running
/// kernels on other streams of the same context (such as the emulated NIC's engine) never block
/// it.
pub struct Pe {
    // First, so it drops first: its engines and proxies stop before anything else goes.
    backend: Backend,
    rank: u32,
    n_pes: u32,
    config: Config,
    bootstrap: Arc<dyn Bootstrap>,
    alloc: SymmetricAllocator,
    heap_id: u64,
    /// The teams made with `team_split_strided`, by header slot (slot 0, the world, is never held
    /// here).
    teams: Vec<Option<teams::HeldTeam>>,
    /// Each slot's generation: how many teams it has held, modulo 256 (the next handle's).
    generations: Vec<u8>,
}

impl Pe {
    /// Joins the job the environment describes: with torchrun / Slurm / `ibgda-run` variables
    /// set, this process is one PE of it (rendezvous over TCP at `MASTER_ADDR:MASTER_PORT`);
    /// otherwise it is the only PE. Collective.
    pub fn from_env(config: Config) -> Result<Pe> {
        let boot: Arc<dyn Bootstrap> = match TcpBootstrap::from_env(config.collective_timeout)? {
            Some(b) => Arc::new(b),
            None => Arc::new(ThreadBootstrap::group(1, config.collective_timeout).pop().expect("one")),
        };
        Pe::init(boot, config)
    }

    /// Brings up this PE on a GPU or the CPU emulation (`config.device`; `auto` takes a GPU when
    /// one is visible): its symmetric heap (mapped for every same-node peer, across processes
    /// too), its transports to every peer, and the device state. Collective.
    pub fn init(bootstrap: Arc<dyn Bootstrap>, config: Config) -> Result<Pe> {
        let rank = bootstrap.rank();
        let n_pes = bootstrap.size();
        teams::check_world_size(rank, n_pes)?;
        let gpu = match config.device {
            DeviceChoice::Cpu => false,
            DeviceChoice::Gpu => true,
            DeviceChoice::Auto => crate::cuda::device_count().unwrap_or(0) > 0,
        };
        // Every PE must agree; a mix would leave some peers unreachable.
        let kinds = bootstrap.allgather("init/device", &[gpu as u8])?;
        if let Some(j) = kinds.iter().position(|k| k.first() != Some(&(gpu as u8))) {
            let name = |g: bool| if g { "gpu" } else { "cpu" };
            return Err(Error::CollectiveMismatch {
                call: "init (device kind, IBGDA_DEVICE)",
                pe: rank,
                mine: name(gpu).into(),
                other_pe: j as u32,
                theirs: name(!gpu).into(),
            });
        }
        let procs = ProcessMap::exchange(bootstrap.as_ref())?;
        let backend = if gpu {
            Backend::Gpu(Box::new(GpuPe::init(bootstrap.clone(), &config, &procs)?))
        } else {
            Backend::Cpu(Box::new(CpuPe::init(bootstrap.as_ref(), &config, &procs)?))
        };
        let heap_size = match &backend {
            Backend::Gpu(g) => g.heap_size(),
            Backend::Cpu(c) => c.heap_size(),
        };
        bootstrap.barrier("init")?;
        // The header, then the reductions' scratch (as the device state says).
        let reserved = HEAP_RESERVED_BYTES + collective_scratch_bytes(heap_size, config.collective_scratch);
        tracing::debug!(pe = rank, gpu, reserved, "PE up");
        Ok(Pe {
            backend,
            rank,
            n_pes,
            config,
            bootstrap,
            alloc: SymmetricAllocator::new(rank, reserved, heap_size),
            heap_id: NEXT_HEAP_ID.fetch_add(1, Ordering::Relaxed),
            teams: vec![None; ibgda_abi::MAX_TEAMS],
            generations: vec![0; ibgda_abi::MAX_TEAMS],
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

    /// Whether this PE runs on a GPU (else on the CPU emulation).
    pub fn is_gpu(&self) -> bool {
        matches!(self.backend, Backend::Gpu(_))
    }

    /// The GPU side of this PE (context, stream, modules, the emulated NIC's GPU engine), or
    /// `WrongDevice` on a CPU-emulated PE.
    pub fn gpu(&self) -> Result<&GpuPe> {
        match &self.backend {
            Backend::Gpu(g) => Ok(g),
            Backend::Cpu(_) => Err(Error::WrongDevice {
                call: "gpu",
                pe: self.rank,
                what: "a CUDA context, stream or module",
            }),
        }
    }

    /// The device state kernels take as their first argument.
    pub fn state(&self) -> *const DeviceState {
        self.state_ptr() as *const DeviceState
    }

    /// [`Pe::state`] as an address.
    pub fn state_ptr(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.state_ptr(),
            Backend::Cpu(c) => c.state_ptr(),
        }
    }

    /// Base address of this PE's symmetric heap (as its kernels see it).
    pub fn heap_base(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.heap_base(),
            Backend::Cpu(c) => c.heap_base(),
        }
    }

    /// Size of every PE's symmetric heap.
    pub fn heap_size(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.heap_size(),
            Backend::Cpu(c) => c.heap_size(),
        }
    }

    /// How this PE reaches `peer`.
    pub fn transport_to(&self, peer: u32) -> Option<TransportKind> {
        match &self.backend {
            Backend::Gpu(g) => g.transport_to(peer),
            Backend::Cpu(c) => c.transport_kind(peer),
        }
    }

    /// Checks that `buf` was allocated by this PE's heap and is still live.
    fn check_buffer<T>(&self, call: &'static str, buf: &SymmetricBuffer<T>) -> Result<()> {
        if buf.heap != self.heap_id {
            return Err(Error::ForeignBuffer {
                call,
                pe: self.rank,
                why: "it was allocated by another PE's heap or another world".into(),
            });
        }
        match self.alloc.containing(buf.offset) {
            Some((start, len)) if buf.offset + buf.bytes() <= start + len => Ok(()),
            _ => Err(Error::ForeignBuffer {
                call,
                pe: self.rank,
                why: format!("its allocation at offset {:#x} has been freed", buf.offset),
            }),
        }
    }

    /// This PE's address of `buf` (what its kernels pass as the symmetric address for any PE).
    /// A buffer from another heap, or one already freed, is an error.
    pub fn ptr<T>(&self, buf: &SymmetricBuffer<T>) -> Result<u64> {
        self.check_buffer("ptr", buf)?;
        Ok(self.heap_base() + buf.offset)
    }

    /// [`Pe::ptr`] as a typed mutable pointer, for kernel arguments.
    pub fn mut_ptr<T>(&self, buf: &SymmetricBuffer<T>) -> Result<*mut T> {
        self.ptr(buf).map(|a| a as *mut T)
    }

    /// [`Pe::ptr`] as a typed const pointer, for kernel arguments.
    pub fn const_ptr<T>(&self, buf: &SymmetricBuffer<T>) -> Result<*const T> {
        self.ptr(buf).map(|a| a as *const T)
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
                        heap_size: self.heap_size() - self.alloc.start(),
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
        match &self.backend {
            Backend::Gpu(g) => g.zero(off, rounded)?,
            Backend::Cpu(c) => c.zero(off, rounded),
        }
        Ok(SymmetricBuffer::new(self.heap_id, off, len))
    }

    /// Collective: frees `buf` on every PE. A buffer this heap did not allocate (or already freed)
    /// is rejected and nothing changes.
    pub fn free<T>(&mut self, buf: SymmetricBuffer<T>) -> Result<()> {
        if buf.heap != self.heap_id {
            return Err(Error::ForeignBuffer {
                call: "free",
                pe: self.rank,
                why: "it was allocated by another PE's heap or another world".into(),
            });
        }
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
    pub fn write<T: Pod>(&self, buf: &SymmetricBuffer<T>, start: usize, data: &[T]) -> Result<()> {
        self.check_buffer("write", buf)?;
        buf.check_range("write", self.rank, start, data.len())?;
        let off = buf.offset + (start * std::mem::size_of::<T>()) as u64;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        match &self.backend {
            Backend::Gpu(g) => g.write_bytes(off, bytes),
            Backend::Cpu(c) => {
                c.write_bytes(off, bytes);
                Ok(())
            }
        }
    }

    /// Host-initiated put through the GPU's copy engine, enqueued on this PE's stream (NVSHMEM's
    /// `nvshmemx_putmem_on_stream` for NVLink peers): copies `count` elements of this PE's `src`
    /// from element `src_start` to `dst` from element `dst_start` on PE `pe`. Returns once the copy
    /// is enqueued; it is complete when the stream is ([`Pe::synchronize`]) and ordered with the
    /// kernels launched on that stream before and after it.
    ///
    /// The copy engine moves large transfers faster than SM copies on the same link (2× H200
    /// NVLink: `p2p_bench`'s copy-engine rows in docs/benchmarks.md) and takes no SMs. Only peers
    /// reached over P2P (and this PE) have this path: a peer reached through a NIC or the proxy is
    /// a `PeerUnreachable` error, and CPU-emulated PEs have no copy engine (`EmulatedDevice`).
    pub fn put_on_stream<T: Pod>(
        &self,
        dst: &SymmetricBuffer<T>,
        dst_start: usize,
        src: &SymmetricBuffer<T>,
        src_start: usize,
        count: usize,
        pe: u32,
    ) -> Result<()> {
        const CALL: &str = "put_on_stream";
        self.check_buffer(CALL, dst)?;
        self.check_buffer(CALL, src)?;
        if pe >= self.n_pes {
            return Err(Error::InvalidPe {
                call: CALL,
                pe,
                n_pes: self.n_pes,
            });
        }
        dst.check_range(CALL, pe, dst_start, count)?;
        src.check_range(CALL, self.rank, src_start, count)?;
        let size = std::mem::size_of::<T>();
        let (dst_off, src_off) = (
            dst.offset + (dst_start * size) as u64,
            src.offset + (src_start * size) as u64,
        );
        match &self.backend {
            Backend::Gpu(g) => g.copy_engine_put(pe, dst_off, src_off, (count * size) as u64),
            Backend::Cpu(_) => Err(Error::EmulatedDevice {
                op: CALL,
                reason: format!(
                    "PE {} is CPU-emulated: there is no copy engine (use a kernel's put)",
                    self.rank
                ),
            }),
        }
    }

    /// Reads `len` elements of this PE's copy of `buf` from element `start`.
    pub fn read<T: Pod>(&self, buf: &SymmetricBuffer<T>, start: usize, len: usize) -> Result<Vec<T>> {
        self.check_buffer("read", buf)?;
        buf.check_range("read", self.rank, start, len)?;
        let mut out = vec![T::zeroed(); len];
        let off = buf.offset + (start * std::mem::size_of::<T>()) as u64;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        match &self.backend {
            Backend::Gpu(g) => g.read_bytes(off, bytes)?,
            Backend::Cpu(c) => c.read_bytes(off, bytes),
        }
        Ok(out)
    }

    /// Zeroes this PE's copy of `buf`, after this PE's work on its stream; returns when done (a
    /// memset on the GPU, without a host copy). Only this PE's copy: peers zero theirs.
    pub fn zero<T>(&self, buf: &SymmetricBuffer<T>) -> Result<()> {
        self.check_buffer("zero", buf)?;
        let bytes = (buf.len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        match &self.backend {
            Backend::Gpu(g) => g.zero(buf.offset, bytes),
            Backend::Cpu(c) => {
                c.zero(buf.offset, bytes);
                Ok(())
            }
        }
    }

    /// A copy of this PE's whole heap (tests check that a fault wrote nothing anywhere).
    pub fn heap_snapshot(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.heap_size() as usize];
        match &self.backend {
            Backend::Gpu(g) => g.read_bytes(0, &mut out)?,
            Backend::Cpu(c) => c.read_bytes(0, &mut out),
        }
        Ok(out)
    }

    /// The device error record, if a kernel of this PE reported one.
    pub fn device_error(&self) -> Option<ErrorRecord> {
        match &self.backend {
            Backend::Gpu(g) => g.device_error(),
            Backend::Cpu(c) => c.device_error(),
        }
    }

    /// A device error becomes `PeerFailed` when a peer is known to have failed: its death is what
    /// the timed-out wait was waiting on.
    fn attribute(&self, e: Error) -> Error {
        match (&e, self.bootstrap.failed_peer()) {
            (Error::Device(_), Some(failed)) => {
                tracing::warn!(pe = self.rank, "device error after PE {failed} failed: {e}");
                Error::PeerFailed {
                    call: "synchronize",
                    pe: self.rank,
                    failed_pe: failed,
                }
            }
            _ => e,
        }
    }

    /// Waits for this PE's work. A kernel that reported an error becomes [`Error::Device`] with
    /// the full record ([`Error::ProxyFailed`] when a proxy thread died; `PeerFailed` when a peer
    /// is known to have failed meanwhile).
    pub fn synchronize(&self) -> Result<()> {
        let r = match &self.backend {
            Backend::Gpu(g) => g.synchronize(),
            Backend::Cpu(c) => c.error_to_result(),
        };
        r.map_err(|e| self.attribute(e))
    }

    /// Host-side barrier across PEs: completes this PE's work, then waits for every PE.
    pub fn barrier(&self) -> Result<()> {
        self.synchronize()?;
        self.bootstrap.barrier("barrier")
    }

    /// Loads the kernels of a PTX module (a kernel crate built with `ibgda-nvptx-builder`) on a
    /// GPU PE; on a CPU-emulated PE the kernels are linked into the program already and nothing
    /// is loaded. Load modules before launching kernels that wait on other PEs (see
    /// [`GpuPe::load_ptx`]).
    pub fn load_module(&self, ptx: &str) -> Result<Module> {
        match &self.backend {
            Backend::Gpu(g) => Ok(Module::Gpu(g.load_ptx(ptx)?)),
            Backend::Cpu(_) => Ok(Module::Cpu),
        }
    }

    /// Launches kernel `K` (declared with `ibgda_device::kernel!`; pass `my_kernel::Kernel`) with
    /// its arguments as one tuple, type-checked against the kernel's parameters. On a GPU PE it
    /// runs asynchronously on this PE's stream (see [`Pe::synchronize`]); on a CPU-emulated PE,
    /// `grid.blocks` blocks of CPU threads run it (each block `grid.threads` threads, capped by
    /// [`Config::cpu_block_threads`](crate::Config::cpu_block_threads), in warps whose collectives
    /// are real) and the call returns when they have, with any device error.
    ///
    /// # Safety
    /// The arguments must satisfy the kernel's contract: pointers valid for what the kernel does
    /// with them (symmetric buffers of this PE from [`Pe::mut_ptr`], sizes that fit them) and
    /// alive until the kernel has finished.
    pub unsafe fn launch<K: KernelFn>(&self, module: &Module, _kernel: K, grid: Grid, args: K::Args) -> Result<()>
    where
        K::Args: KernelArgs,
    {
        match (&self.backend, module) {
            (Backend::Gpu(g), Module::Gpu(m)) => {
                let (f, max) = g.cached_kernel(m, K::NAME)?;
                // SAFETY: the argument list is K's parameter tuple (checked by the type system);
                // the pointers are the caller's contract.
                unsafe { g.launch_checked(&f, max, grid.cuda(), &args.kernel_args()) }
            }
            (Backend::Cpu(c), Module::Cpu) => {
                // SAFETY: the caller's contract.
                let panicked =
                    unsafe { launch::run_on_cpu_threads::<K>(grid.blocks, c.block_threads(grid.threads), args) };
                c.error_to_result().map_err(|e| self.attribute(e))?;
                match panicked {
                    Some((block, message)) => Err(Error::EmulatedPanic {
                        pe: c.rank(),
                        block,
                        message,
                    }),
                    None => Ok(()),
                }
            }
            _ => Err(Error::WrongDevice {
                call: "launch",
                pe: self.rank,
                what: "a module loaded by this PE (Pe::load_module)",
            }),
        }
    }

    /// The threads each block of a launch asking for `threads` per block really runs: `threads` on
    /// a GPU; on the CPU emulation at most [`Config::cpu_block_threads`](crate::Config::cpu_block_threads)
    /// (default 1), and below a warp (32) rounded down to a power of two. A kernel that counts its
    /// threads' work checks against this.
    pub fn block_threads(&self, threads: u32) -> u32 {
        match &self.backend {
            Backend::Gpu(_) => threads,
            Backend::Cpu(c) => c.block_threads(threads),
        }
    }

    /// The most threads a block of kernel `K` may have: its register use caps it on a GPU (a
    /// launch asking for more fails with [`Error::BlockTooLarge`]); 1024 on the CPU emulation,
    /// which runs at most [`Config::cpu_block_threads`](crate::Config::cpu_block_threads) of them.
    pub fn max_block_threads<K: KernelFn>(&self, module: &Module, _kernel: K) -> Result<u32> {
        match (&self.backend, module) {
            (Backend::Gpu(g), Module::Gpu(m)) => Ok(g.cached_kernel(m, K::NAME)?.1),
            (Backend::Cpu(_), Module::Cpu) => Ok(1024),
            _ => Err(Error::WrongDevice {
                call: "max_block_threads",
                pe: self.rank,
                what: "a module loaded by this PE (Pe::load_module)",
            }),
        }
    }

    /// Clears a CPU-emulated PE's device error record so it can launch again (the emulation
    /// survives a trap; a GPU context does not, so on a GPU this is `WrongDevice`).
    pub fn clear_device_error(&mut self) -> Result<()> {
        match &mut self.backend {
            Backend::Cpu(c) => {
                c.clear_error();
                Ok(())
            }
            Backend::Gpu(_) => Err(Error::WrongDevice {
                call: "clear_device_error",
                pe: self.rank,
                what: "a CPU-emulated PE (a GPU context does not survive a trap)",
            }),
        }
    }

    /// The CPU-emulated PE's emulated NIC side and fabric, when it has NIC peers (statistics,
    /// fault injection).
    pub fn emulated_nic(&self) -> Option<(&crate::transport::ibgda::PeIbgda, &Arc<crate::emu::Fabric>)> {
        match &self.backend {
            Backend::Cpu(c) => c.nic().zip(c.fabric()),
            Backend::Gpu(_) => None,
        }
    }

    /// The CPU-emulated PE's proxy threads, when it uses the proxy transport (statistics, fault
    /// injection: pause, kill a thread).
    pub fn cpu_proxy(&self) -> Option<&crate::transport::proxy::Proxy> {
        match &self.backend {
            Backend::Cpu(c) => c.proxy(),
            Backend::Gpu(_) => None,
        }
    }

    /// The CPU-emulated PE's proxy channels (their rings and published progress), when it uses
    /// the proxy transport.
    pub fn cpu_proxy_channels(&self) -> Option<&crate::transport::proxy::ProxyChannels> {
        match &self.backend {
            Backend::Cpu(c) => c.proxy_channels(),
            Backend::Gpu(_) => None,
        }
    }

    /// Collective teardown: completes this PE's work and waits for every PE, stops this PE's
    /// emulated NIC and proxies, and waits for every PE again before the heap goes (a peer, or a
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
        let stopped = match &mut self.backend {
            Backend::Gpu(g) => g.stop_nic(),
            Backend::Cpu(c) => {
                c.stop();
                Ok(())
            }
        };
        if let Err(e) = stopped {
            return Err((e, Box::new(self)));
        }
        match self.bootstrap.barrier("finalize/nic") {
            Ok(()) => Ok(()),
            Err(e) => Err((e, Box::new(self))),
        }
    }

    /// Local teardown of a PE whose job failed, with no collective: waits for its kernels (device
    /// waits are bounded, so they end), then stops its NIC engine and proxy threads.
    fn quiesce(&mut self) {
        match &mut self.backend {
            Backend::Gpu(g) => g.quiesce(),
            Backend::Cpu(c) => c.stop(),
        }
    }

    /// The device error this PE's kernels recorded, if any (GPU PEs).
    fn recorded_error(&self) -> Option<Error> {
        match &self.backend {
            Backend::Gpu(g) => g.recorded_error(),
            Backend::Cpu(_) => None,
        }
    }

    /// Whether this PE's kernels failed only because another PE sharing its GPU's CUDA context
    /// (threads of one process) hit a device error.
    fn faulted_by_another(&self) -> bool {
        match &self.backend {
            Backend::Gpu(g) => g.faulted_by_another(),
            Backend::Cpu(_) => false,
        }
    }

    /// Marks this PE as failed so peers' host collectives return instead of waiting.
    pub fn abort(&self) {
        self.bootstrap.abort();
    }

    /// The peer known to have failed, if any (without a collective).
    pub fn failed_peer(&self) -> Option<u32> {
        self.bootstrap.failed_peer()
    }
}

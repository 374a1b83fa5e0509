//! The communication buffer: symmetric areas, the calls' checks, and the kernel launches. The
//! buffer itself (areas, configuration, per-kernel threads, size hints) is here; the
//! high-throughput calls are in `ht`, the low-latency ones in `ll`.

mod ht;
mod ll;

use ll::LlLaunch;

pub use ht::{HtDispatch, HtHandle, HtRecv, LayoutOut};
pub use ll::{LlCombine, LlDispatch, LlHandle, LlRecv};

use crate::error::{EpError, Result};
use ibgda::{Grid, Module, Pe, SymmetricBuffer};
use ibgda_abi::TransportKind;
use ibgda_ep_kernels as k;
use k::geometry::{sync, work, Geometry, LlLayout, FP8_BLOCK, MAX_CHANNELS, MAX_EXPERTS, MAX_TOPK};

/// A device address: GPU memory on a GPU PE, host memory on the CPU emulation. `0` is "none"
/// where an argument is optional.
pub type DevicePtr = u64;

/// How big the areas are and how many SMs the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferConfig {
    /// Bytes of the high-throughput area (DeepEP's `num_nvl_bytes`; [`Buffer::ht_size_hint`]).
    pub num_nvl_bytes: u64,
    /// Bytes of the low-latency area (DeepEP's `num_rdma_bytes`; [`Buffer::ll_size_hint`]).
    pub num_rdma_bytes: u64,
    /// Blocks (SMs) per high-throughput kernel, at most 128 (DeepEP's `Buffer.set_num_sms`).
    pub num_sms: u32,
    /// The most threads per block on a GPU: each kernel takes as many as its registers allow,
    /// up to this (the CPU emulation runs one per block).
    pub threads: u32,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            num_nvl_bytes: 0,
            num_rdma_bytes: 0,
            num_sms: 20,
            // More warps per SM keep more rows in flight; kernels with many registers get fewer.
            threads: 1024,
        }
    }
}

/// The symmetric areas of one rank and the kernels that use them.
pub struct Buffer {
    ht: SymmetricBuffer<u8>,
    ll: SymmetricBuffer<u8>,
    sync: SymmetricBuffer<u64>,
    work: SymmetricBuffer<u64>,
    module: Module,
    config: BufferConfig,
    threads: KernelThreads,
    ll_launch: LlLaunch,
    rank: u32,
    ranks: u32,
}

/// Threads per block of each kernel: `BufferConfig::threads`, or fewer where the kernel's
/// registers do not allow that many. Notify and dispatch share one count, since a warp's run of
/// tokens is the same in both. With `p2p` (every peer reached by NVLink loads and stores) the
/// high-throughput kernels are their NVLink-only variants, which carry no NIC or proxy route
/// and so fit more threads; so are the low-latency kernels.
#[derive(Clone, Copy, Debug)]
struct KernelThreads {
    p2p: bool,
    /// Threads per block of the one-launch combine: `ep_ht_combine_fused_p2p` with every peer over
    /// NVLink, `ep_ht_combine_fused` with peers behind a NIC or the proxy. It runs when its
    /// blocks (`num_sms` at the call, at least two) are all resident at once (see
    /// [`Buffer::ht_combine`]).
    ht_fused: u32,
    layout: u32,
    ht_send: u32,
    ht_recv: u32,
    ht_combine: u32,
    ht_reduce: u32,
    ll_dispatch: u32,
    ll_combine: u32,
}

impl KernelThreads {
    fn new(pe: &Pe, m: &Module, cap: u32) -> Result<KernelThreads> {
        let fit = |max: u32| -> u32 { (cap.min(max) / 32 * 32).max(32) };
        let p2p = (0..pe.n_pes()).all(|r| r == pe.my_pe() || pe.transport_to(r) == Some(TransportKind::P2p));
        let (ht_send, ht_combine) = if p2p {
            (
                pe.max_block_threads(m, k::ep_ht_notify_p2p::Kernel)?
                    .min(pe.max_block_threads(m, k::ep_ht_dispatch_p2p::Kernel)?),
                pe.max_block_threads(m, k::ep_ht_combine_p2p::Kernel)?,
            )
        } else {
            (
                pe.max_block_threads(m, k::ep_ht_notify::Kernel)?
                    .min(pe.max_block_threads(m, k::ep_ht_dispatch::Kernel)?),
                pe.max_block_threads(m, k::ep_ht_combine::Kernel)?,
            )
        };
        let ht_fused = fit(if p2p {
            pe.max_block_threads(m, k::ep_ht_combine_fused_p2p::Kernel)?
        } else {
            pe.max_block_threads(m, k::ep_ht_combine_fused::Kernel)?
        });
        Ok(KernelThreads {
            p2p,
            ht_fused,
            layout: fit(pe.max_block_threads(m, k::ep_layout::Kernel)?),
            ht_send: fit(ht_send),
            ht_recv: fit(pe.max_block_threads(m, k::ep_ht_dispatch_recv::Kernel)?),
            ht_combine: fit(ht_combine),
            ht_reduce: fit(pe.max_block_threads(m, k::ep_ht_combine_reduce::Kernel)?),
            ll_dispatch: fit(if p2p {
                pe.max_block_threads(m, k::ep_ll_dispatch_p2p::Kernel)?
            } else {
                pe.max_block_threads(m, k::ep_ll_dispatch::Kernel)?
            }),
            ll_combine: fit(if p2p {
                pe.max_block_threads(m, k::ep_ll_combine_p2p::Kernel)?
            } else {
                pe.max_block_threads(m, k::ep_ll_combine::Kernel)?
            }),
        })
    }
}

fn bad(call: &'static str, rank: u32, what: impl Into<String>) -> EpError {
    EpError::InvalidArgument {
        call,
        rank,
        what: what.into(),
    }
}

impl Buffer {
    /// Allocates the areas (collective: every rank calls it with the same sizes) and loads the
    /// kernels.
    pub fn new(pe: &mut Pe, config: BufferConfig) -> Result<Buffer> {
        let (rank, ranks) = (pe.my_pe(), pe.n_pes());
        if config.num_sms == 0 || config.num_sms > MAX_CHANNELS {
            return Err(bad(
                "Buffer::new",
                rank,
                format!("num_sms is {}; it must be 1..={MAX_CHANNELS}", config.num_sms),
            ));
        }
        if config.threads == 0 || config.threads > 1024 || !config.threads.is_multiple_of(32) {
            return Err(bad(
                "Buffer::new",
                rank,
                format!("threads is {}; it must be a multiple of 32 up to 1024", config.threads),
            ));
        }
        if ranks > 64 {
            return Err(bad(
                "Buffer::new",
                rank,
                format!("{ranks} ranks; at most 64 are supported"),
            ));
        }
        let module = pe.load_module(crate::EP_PTX)?;
        let threads = KernelThreads::new(pe, &module, config.threads)?;
        let ht = pe.malloc::<u8>(config.num_nvl_bytes.max(16) as usize)?;
        let ll = pe.malloc::<u8>(config.num_rdma_bytes.max(16) as usize)?;
        let sync = pe.malloc::<u64>(sync::words(ranks) as usize)?;
        let work = pe.malloc::<u64>(work::words(ranks) as usize)?;
        // `malloc` zeroes every area: the sync and work words, and the low-latency slot counters
        // that must start at zero.
        let ll_launch = LlLaunch::for_pe(pe)?;
        // Every PE of the process decides alike (same configuration, same GPU sharing).
        if let Some(why) = ll_launch.too_many_waiting(config.num_sms) {
            return Err(bad("Buffer::new", rank, why));
        }
        pe.barrier()?;
        Ok(Buffer {
            ht,
            ll,
            sync,
            work,
            module,
            config,
            threads,
            ll_launch,
            rank,
            ranks,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BufferConfig {
        &self.config
    }

    /// Sets the blocks (SMs) of the high-throughput kernels (the same on every rank).
    pub fn set_num_sms(&mut self, num_sms: u32) -> Result<()> {
        if num_sms == 0 || num_sms > MAX_CHANNELS {
            return Err(bad(
                "set_num_sms",
                self.rank,
                format!("num_sms is {num_sms}; it must be 1..={MAX_CHANNELS}"),
            ));
        }
        if let Some(why) = self.ll_launch.too_many_waiting(num_sms) {
            return Err(bad("set_num_sms", self.rank, why));
        }
        self.config.num_sms = num_sms;
        Ok(())
    }

    /// Bytes of the high-throughput area for up to `max_tokens` tokens per rank.
    pub fn ht_size_hint(ranks: u32, max_tokens: u64, hidden: u32, topk: u32, fp8: bool) -> u64 {
        let g = Geometry {
            hidden,
            topk,
            local_experts: 1,
            capacity: 0,
            fp8,
            round_scale: false,
            ue8m0: false,
        };
        // BF16 rows are the larger; size for those so one buffer serves both.
        let g = Geometry { fp8: false, ..g };
        let _ = fp8;
        ranks as u64 * max_tokens * g.ht_slot_bytes()
    }

    /// The symmetric heap a PE needs for one buffer of `num_nvl_bytes` + `num_rdma_bytes`: its
    /// areas, room for later (smaller) buffers and the runtime's own allocations.
    pub fn heap_bytes_for(num_nvl_bytes: u64, num_rdma_bytes: u64) -> u64 {
        (num_nvl_bytes + num_rdma_bytes + (256 << 20)).next_multiple_of(2 << 20)
    }

    /// Bytes of the low-latency area (DeepEP's `get_low_latency_rdma_size_hint`).
    pub fn ll_size_hint(max_tokens: u32, hidden: u32, ranks: u32, experts: u32) -> u64 {
        LlLayout {
            ranks,
            local_experts: experts / ranks.max(1),
            max_tokens,
            hidden,
        }
        .total_bytes()
    }

    fn grid(blocks: u32, threads: u32) -> Grid {
        Grid::new(blocks, threads)
    }

    fn check_experts(&self, call: &'static str, experts: u32, topk: u32) -> Result<u32> {
        if experts == 0 || !experts.is_multiple_of(self.ranks) || experts > MAX_EXPERTS {
            return Err(bad(
                call,
                self.rank,
                format!(
                    "num_experts is {experts}; it must be a multiple of the {} ranks, at most {MAX_EXPERTS}",
                    self.ranks
                ),
            ));
        }
        if topk == 0 || topk > MAX_TOPK {
            return Err(bad(
                call,
                self.rank,
                format!("num_topk is {topk}; it must be 1..={MAX_TOPK}"),
            ));
        }
        Ok(experts / self.ranks)
    }

    fn check_hidden(&self, call: &'static str, hidden: u32, fp8: bool) -> Result<()> {
        if hidden == 0 || !hidden.is_multiple_of(8) {
            return Err(bad(
                call,
                self.rank,
                format!("hidden is {hidden}; it must be a positive multiple of 8"),
            ));
        }
        if fp8 && !hidden.is_multiple_of(FP8_BLOCK) {
            return Err(bad(
                call,
                self.rank,
                format!("hidden is {hidden}; FP8 needs a multiple of {FP8_BLOCK} (one scale per {FP8_BLOCK} channels)"),
            ));
        }
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Collective: zeroes the low-latency area on every PE (DeepEP's `clean_low_latency_buffer`).
    /// Its layout follows the call's `num_max_dispatch_tokens_per_rank`, hidden size and experts,
    /// and a low-latency dispatch needs its counters and counts zero where it puts them: clean
    /// before a low-latency call whose shape differs from the last one's. Waits for this PE's
    /// work first, and returns once every PE has cleaned (no peer writes into an area not yet
    /// zeroed).
    pub fn clean_low_latency(&self, pe: &Pe) -> Result<()> {
        pe.zero(&self.ll)?;
        pe.barrier()?;
        Ok(())
    }

    /// Whether the low-latency area is all zero on this PE (after this PE's work): the check's
    /// proof that high-throughput calls, which own the area before it, never write past their
    /// own.
    pub(crate) fn ll_area_is_zero(&self, pe: &Pe) -> Result<bool> {
        pe.synchronize()?;
        let bytes: Vec<u8> = pe.read(&self.ll, 0, self.config.num_rdma_bytes.max(16) as usize)?;
        Ok(bytes.iter().all(|&b| b == 0))
    }

    /// Frees the areas (collective).
    pub fn destroy(self, pe: &mut Pe) -> Result<()> {
        pe.synchronize()?;
        pe.free(self.work)?;
        pe.free(self.sync)?;
        pe.free(self.ll)?;
        pe.free(self.ht)?;
        Ok(())
    }
}

/// Zeroes `bytes` bytes at device address `dst` of this PE's device, in stream order on the PE's
/// stream (before the kernels launched after it).
///
/// # Safety
/// `dst` holds `bytes` writable bytes on this PE's device that no kernel is using.
pub(crate) unsafe fn zero_device(pe: &Pe, dst: DevicePtr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    if pe.is_gpu() {
        let g = pe.gpu()?;
        let cuda = |call: &'static str| {
            move |e| ibgda::Error::Cuda {
                call,
                pe: pe.my_pe(),
                source: e,
            }
        };
        g.context().bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        // SAFETY: the caller's contract; the PE's live stream.
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, bytes, g.stream().cu_stream()) }
            .map_err(cuda("cuMemsetD8Async"))?;
    } else {
        // SAFETY: the caller's contract; on the CPU emulation device memory is host memory.
        unsafe { std::ptr::write_bytes(dst as *mut u8, 0, bytes) };
    }
    Ok(())
}

/// Copies `n` values from device address `src` of this PE's device to the host.
///
/// # Safety
/// `src` holds `n` initialised `T`s on this PE's device, and no kernel is writing them.
pub(crate) unsafe fn read_device<T: bytemuck::Pod + Default>(pe: &Pe, src: DevicePtr, n: usize) -> Result<Vec<T>> {
    let mut out = vec![T::default(); n];
    if n == 0 {
        return Ok(out);
    }
    if pe.is_gpu() {
        let g = pe.gpu()?;
        g.context().bind_to_thread().map_err(|e| ibgda::Error::Cuda {
            call: "cuCtxSetCurrent",
            pe: pe.my_pe(),
            source: e,
        })?;
        // SAFETY: the caller's contract; the stream was synchronised.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, src, g.stream().cu_stream()) }.map_err(|e| {
            ibgda::Error::Cuda {
                call: "cuMemcpyDtoHAsync",
                pe: pe.my_pe(),
                source: e,
            }
        })?;
        // The PE's stream, not the legacy one, which (PEs as threads of one context) would wait
        // for a peer's kernel that may be waiting for this PE.
        // SAFETY: the PE's live stream; `out` is complete after it.
        unsafe { cudarc::driver::result::stream::synchronize(g.stream().cu_stream()) }.map_err(|e| {
            ibgda::Error::Cuda {
                call: "cuStreamSynchronize",
                pe: pe.my_pe(),
                source: e,
            }
        })?;
    } else {
        // SAFETY: the caller's contract; on the CPU emulation device memory is host memory.
        unsafe { std::ptr::copy_nonoverlapping(src as *const T, out.as_mut_ptr(), n) };
    }
    Ok(out)
}

//! The communication buffer: symmetric areas, the calls' checks, and the kernel launches.

use crate::error::{EpError, Result};
use ibgda::{Grid, Module, Pe, SymmetricBuffer};
use ibgda_ep_kernels as k;
use k::geometry::{info, sync, work, Geometry, LlLayout, FP8_BLOCK, MAX_CHANNELS, MAX_EXPERTS, MAX_TOPK};

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

/// Outputs of [`Buffer::layout`]; the three counts must be zero on entry.
#[derive(Clone, Copy, Debug)]
pub struct LayoutOut {
    /// `u32 [ranks]`.
    pub tokens_per_rank: DevicePtr,
    /// `u32 [experts]`.
    pub tokens_per_expert: DevicePtr,
    /// `u8 [tokens, ranks]` (0 or 1).
    pub in_rank: DevicePtr,
    /// One `u32`: 0, or 1 + a token whose `topk_idx` is out of range.
    pub bad: DevicePtr,
}

/// Inputs of a high-throughput dispatch.
#[derive(Clone, Copy, Debug)]
pub struct HtDispatch {
    /// `[tokens, hidden]`: BF16, or FP8 e4m3 when `x_scales` is not 0.
    pub x: DevicePtr,
    /// `f32 [tokens, hidden / 128]`, or 0 for BF16.
    pub x_scales: DevicePtr,
    /// `i64 [tokens, topk]`.
    pub topk_idx: DevicePtr,
    /// `f32 [tokens, topk]`.
    pub topk_weights: DevicePtr,
    /// Tokens on this rank.
    pub tokens: u32,
    /// Channels.
    pub hidden: u32,
    /// Entries per token.
    pub topk: u32,
    /// Experts over all ranks.
    pub experts: u32,
}

/// What a high-throughput dispatch leaves for combine and for a cached dispatch: device arrays
/// the caller owns ([`HtHandle::info_len`] `i32`s of [`geometry::info`](crate::geometry::info),
/// `i32 [tokens, ranks]` send slots, the layout's `in_rank` and `tokens_per_expert`).
#[derive(Clone, Copy, Debug)]
pub struct HtHandle {
    /// The notify record.
    pub info: DevicePtr,
    /// `i32 [tokens, ranks]`: the slot each token took on each rank, or -1.
    pub send_slot: DevicePtr,
    /// `u8 [tokens, ranks]`.
    pub in_rank: DevicePtr,
    /// `u32 [experts]`.
    pub tokens_per_expert: DevicePtr,
}

impl HtHandle {
    /// `i32`s of the `info` array for `ranks` ranks and `experts` experts.
    pub fn info_len(ranks: u32, experts: u32) -> usize {
        info::len(ranks, experts / ranks.max(1))
    }
}

/// Receive-side outputs of a high-throughput dispatch (`num_recv` rows each).
#[derive(Clone, Copy, Debug)]
pub struct HtRecv {
    /// `[num_recv, hidden]`, the dispatch's dtype.
    pub x: DevicePtr,
    /// `f32 [num_recv, hidden / 128]` (FP8 only; else 0).
    pub x_scales: DevicePtr,
    /// `i64 [num_recv, topk]`: local expert index, or -1.
    pub topk_idx: DevicePtr,
    /// `f32 [num_recv, topk]`: the weight, or 0 where the expert is elsewhere.
    pub topk_weights: DevicePtr,
    /// `i32 [num_recv]`: the token's index on its source rank.
    pub src: DevicePtr,
}

/// Inputs of a low-latency dispatch.
#[derive(Clone, Copy, Debug)]
pub struct LlDispatch {
    /// `bf16 [tokens, hidden]`.
    pub x: DevicePtr,
    /// `i64 [tokens, topk]`.
    pub topk_idx: DevicePtr,
    /// Tokens on this rank (at most `max_tokens`).
    pub tokens: u32,
    /// `num_max_dispatch_tokens_per_rank`.
    pub max_tokens: u32,
    /// Channels.
    pub hidden: u32,
    /// Entries per token.
    pub topk: u32,
    /// Experts over all ranks.
    pub experts: u32,
    /// Quantise to FP8 e4m3 with one f32 scale per 128 channels.
    pub fp8: bool,
}

/// A low-latency dispatch's handle: device arrays the caller owns.
#[derive(Clone, Copy, Debug)]
pub struct LlHandle {
    /// `u64 [2]`: the dispatch's and the combine's sequence numbers (written by the kernels).
    pub seq: DevicePtr,
    /// `i32 [local_experts, ranks * max_tokens]`: source token * 16 + top-k entry.
    pub src_info: DevicePtr,
    /// `i64 [local_experts, ranks]`: `offset << 32 | count`.
    pub layout_range: DevicePtr,
}

/// Receive-side outputs of a low-latency dispatch.
#[derive(Clone, Copy, Debug)]
pub struct LlRecv {
    /// `[local_experts, ranks * max_tokens, hidden]`, FP8 or BF16.
    pub x: DevicePtr,
    /// `f32 [local_experts, ranks * max_tokens, hidden / 128]` (FP8 only).
    pub x_scales: DevicePtr,
    /// `i32 [local_experts]`.
    pub count: DevicePtr,
}

/// Inputs of a low-latency combine.
#[derive(Clone, Copy, Debug)]
pub struct LlCombine {
    /// `bf16 [local_experts, ranks * max_tokens, hidden]`.
    pub x: DevicePtr,
    /// `i64 [tokens, topk]` (the dispatch's).
    pub topk_idx: DevicePtr,
    /// `f32 [tokens, topk]`.
    pub topk_weights: DevicePtr,
    /// `bf16 [tokens, hidden]`: the result.
    pub out: DevicePtr,
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
    rank: u32,
    ranks: u32,
}

/// Threads per block of each kernel: `BufferConfig::threads`, or fewer where the kernel's
/// registers do not allow that many. Notify and dispatch share one count, since a warp's run of
/// tokens is the same in both.
#[derive(Clone, Copy, Debug)]
struct KernelThreads {
    layout: u32,
    ht_send: u32,
    ht_recv: u32,
    ht_combine: u32,
    ht_reduce: u32,
    ll_dispatch: u32,
    ll_recv: u32,
    ll_combine: u32,
    ll_combine_recv: u32,
}

impl KernelThreads {
    fn new(pe: &Pe, m: &Module, cap: u32) -> Result<KernelThreads> {
        let fit = |max: u32| -> u32 { (cap.min(max) / 32 * 32).max(32) };
        Ok(KernelThreads {
            layout: fit(pe.max_block_threads(m, k::ep_layout::Kernel)?),
            ht_send: fit(pe
                .max_block_threads(m, k::ep_ht_notify::Kernel)?
                .min(pe.max_block_threads(m, k::ep_ht_dispatch::Kernel)?)),
            ht_recv: fit(pe.max_block_threads(m, k::ep_ht_dispatch_recv::Kernel)?),
            ht_combine: fit(pe.max_block_threads(m, k::ep_ht_combine::Kernel)?),
            ht_reduce: fit(pe.max_block_threads(m, k::ep_ht_combine_reduce::Kernel)?),
            ll_dispatch: fit(pe.max_block_threads(m, k::ep_ll_dispatch::Kernel)?),
            ll_recv: fit(pe.max_block_threads(m, k::ep_ll_dispatch_recv::Kernel)?),
            ll_combine: fit(pe.max_block_threads(m, k::ep_ll_combine::Kernel)?),
            ll_combine_recv: fit(pe.max_block_threads(m, k::ep_ll_combine_recv::Kernel)?),
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
        pe.write(&sync, 0, &vec![0u64; sync::words(ranks) as usize])?;
        pe.write(&work, 0, &vec![0u64; work::words(ranks) as usize])?;
        // Slot counters of the low-latency area start at zero; the rest is written before read.
        pe.write(&ll, 0, &vec![0u8; config.num_rdma_bytes.max(16) as usize])?;
        pe.barrier()?;
        Ok(Buffer {
            ht,
            ll,
            sync,
            work,
            module,
            config,
            threads,
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
        };
        // BF16 rows are the larger; size for those so one buffer serves both.
        let g = Geometry { fp8: false, ..g };
        let _ = fp8;
        ranks as u64 * max_tokens * g.ht_slot_bytes()
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

    /// DeepEP's `get_dispatch_layout`: counts tokens per rank and per expert and marks
    /// `in_rank`. The outputs' counts must be zero. Read `out.bad` to learn of an expert index
    /// out of range (the Python package does).
    ///
    /// # Safety
    /// The pointers are valid on this PE's device for the shapes named, until the kernel ends.
    pub unsafe fn layout(
        &self,
        pe: &Pe,
        topk_idx: DevicePtr,
        tokens: u32,
        topk: u32,
        experts: u32,
        out: &LayoutOut,
    ) -> Result<()> {
        self.check_experts("get_dispatch_layout", experts, topk)?;
        if tokens == 0 {
            return Ok(());
        }
        let blocks = tokens.div_ceil(self.threads.layout).clamp(1, 132);
        // SAFETY: the caller's contract.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_layout::Kernel,
                Self::grid(blocks, self.threads.layout),
                (
                    topk_idx as *const i64,
                    tokens,
                    topk,
                    experts,
                    self.ranks,
                    out.tokens_per_rank as *mut u32,
                    out.tokens_per_expert as *mut u32,
                    out.in_rank as *mut u8,
                    out.bad as *mut u32,
                ),
            )?;
        }
        Ok(())
    }

    /// The geometry of a high-throughput call, checked.
    pub fn ht_geometry(&self, call: &'static str, hidden: u32, topk: u32, experts: u32, fp8: bool) -> Result<Geometry> {
        let local_experts = self.check_experts(call, experts, topk)?;
        self.check_hidden(call, hidden, fp8)?;
        let mut g = Geometry {
            hidden,
            topk,
            local_experts,
            capacity: 0,
            fp8,
        };
        let cap = g
            .ht_capacity(self.config.num_nvl_bytes, self.ranks)
            .min(u32::MAX as u64);
        if cap == 0 {
            return Err(bad(
                call,
                self.rank,
                format!(
                    "num_nvl_bytes ({}) does not hold one token per rank at hidden {hidden}; Buffer::ht_size_hint gives the size",
                    self.config.num_nvl_bytes
                ),
            ));
        }
        g.capacity = cap as u32;
        Ok(g)
    }

    /// High-throughput step 1: exchanges how many rows each rank sends each other rank, into
    /// `handle.info` (read it with [`Buffer::read_info`] before sizing the receive outputs; a
    /// cached dispatch, with a handle from before, may skip the read).
    ///
    /// # Safety
    /// As [`Buffer::layout`]; `handle` holds arrays of the sizes [`HtHandle`] names.
    pub unsafe fn ht_notify(&self, pe: &Pe, g: &Geometry, tokens: u32, handle: &HtHandle) -> Result<()> {
        let (g0, g1) = g.pack();
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ht_notify::Kernel,
                Self::grid(self.config.num_sms, self.threads.ht_send),
                (
                    pe.state(),
                    g0,
                    g1,
                    handle.in_rank as *const u8,
                    handle.tokens_per_expert as *const u32,
                    tokens,
                    pe.mut_ptr(&self.sync)?,
                    pe.mut_ptr(&self.work)?,
                    handle.info as *mut i32,
                ),
            )?;
        }
        Ok(())
    }

    /// Reads a notify record (waits for this PE's work first) and turns a bad status into
    /// [`EpError::BufferTooSmall`].
    ///
    /// # Safety
    /// `handle.info` is a live array of [`HtHandle::info_len`] `i32`s on this PE's device.
    pub unsafe fn read_info(&self, pe: &Pe, g: &Geometry, tokens: u32, handle: &HtHandle) -> Result<Vec<i32>> {
        pe.synchronize()?;
        let n = info::len(self.ranks, g.local_experts);
        // SAFETY: the caller's contract.
        let v: Vec<i32> = unsafe { read_device(pe, handle.info, n)? };
        let status = v[info::status(self.ranks, g.local_experts)];
        if status != 0 {
            return Err(EpError::BufferTooSmall {
                call: "dispatch",
                rank: self.rank,
                receiver: status as u32 - 1,
                capacity: g.capacity as u64,
                tokens: tokens as u64,
                needed: Buffer::ht_size_hint(self.ranks, tokens as u64, g.hidden, g.topk, g.fp8),
            });
        }
        Ok(v)
    }

    /// High-throughput step 2: sends the tokens and compacts what arrives into `recv`
    /// (`num_recv` = the info's total; the `handle.send_slot` array is filled).
    ///
    /// # Safety
    /// As [`Buffer::ht_notify`], and the notify of this `handle` ran before on this PE.
    pub unsafe fn ht_dispatch(
        &self,
        pe: &Pe,
        g: &Geometry,
        a: &HtDispatch,
        handle: &HtHandle,
        recv: &HtRecv,
    ) -> Result<()> {
        let (g0, g1) = g.pack();
        let area = pe.mut_ptr(&self.ht)?;
        let (sync, work) = (pe.mut_ptr(&self.sync)?, pe.mut_ptr(&self.work)?);
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ht_dispatch::Kernel,
                Self::grid(self.config.num_sms, self.threads.ht_send),
                (
                    pe.state(),
                    g0,
                    g1,
                    a.x as *const u8,
                    a.x_scales as *const f32,
                    a.topk_idx as *const i64,
                    a.topk_weights as *const f32,
                    handle.in_rank as *const u8,
                    a.tokens,
                    area,
                    sync,
                    work,
                    handle.send_slot as *mut i32,
                ),
            )?;
            pe.launch(
                &self.module,
                k::ep_ht_dispatch_recv::Kernel,
                Self::grid(self.config.num_sms, self.threads.ht_recv),
                (
                    pe.state(),
                    g0,
                    g1,
                    handle.info as *const i32,
                    area,
                    sync,
                    work,
                    recv.x as *mut u8,
                    recv.x_scales as *mut f32,
                    recv.topk_idx as *mut i64,
                    recv.topk_weights as *mut f32,
                    recv.src as *mut i32,
                ),
            )?;
        }
        Ok(())
    }

    /// High-throughput combine: sends each received row of `x` (`bf16 [num_recv, hidden]`, with
    /// `weights [num_recv, topk]` or 0) back to its source, and sums what comes back into `out`
    /// (`bf16 [tokens, hidden]`) and `out_weights` (`f32 [tokens, topk]`, or 0).
    ///
    /// # Safety
    /// As [`Buffer::ht_dispatch`], for the dispatch that produced `handle`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ht_combine(
        &self,
        pe: &Pe,
        g: &Geometry,
        tokens: u32,
        handle: &HtHandle,
        x: DevicePtr,
        weights: DevicePtr,
        out: DevicePtr,
        out_weights: DevicePtr,
    ) -> Result<()> {
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        let area = pe.mut_ptr(&self.ht)?;
        let (sync, work) = (pe.mut_ptr(&self.sync)?, pe.mut_ptr(&self.work)?);
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ht_combine::Kernel,
                Self::grid(self.config.num_sms, self.threads.ht_combine),
                (
                    pe.state(),
                    g0,
                    g1,
                    x as *const u16,
                    weights as *const f32,
                    handle.info as *const i32,
                    area,
                    sync,
                    work,
                ),
            )?;
            pe.launch(
                &self.module,
                k::ep_ht_combine_reduce::Kernel,
                Self::grid(self.config.num_sms, self.threads.ht_reduce),
                (
                    pe.state(),
                    g0,
                    g1,
                    handle.send_slot as *const i32,
                    tokens,
                    handle.info as *const i32,
                    area,
                    sync,
                    work,
                    out as *mut u16,
                    out_weights as *mut f32,
                ),
            )?;
        }
        Ok(())
    }

    /// The geometry of a low-latency call, checked against the area.
    #[allow(clippy::too_many_arguments)]
    pub fn ll_geometry(
        &self,
        call: &'static str,
        max_tokens: u32,
        tokens: u32,
        hidden: u32,
        topk: u32,
        experts: u32,
        fp8: bool,
    ) -> Result<Geometry> {
        let local_experts = self.check_experts(call, experts, topk)?;
        self.check_hidden(call, hidden, fp8)?;
        if tokens > max_tokens {
            return Err(bad(
                call,
                self.rank,
                format!("{tokens} tokens, more than num_max_dispatch_tokens_per_rank ({max_tokens})"),
            ));
        }
        let need = Buffer::ll_size_hint(max_tokens, hidden, self.ranks, experts);
        if need > self.config.num_rdma_bytes {
            return Err(bad(
                call,
                self.rank,
                format!(
                    "num_rdma_bytes is {}; {max_tokens} tokens per rank at hidden {hidden} with {experts} experts need {need} \
                     (Buffer::ll_size_hint)",
                    self.config.num_rdma_bytes
                ),
            ));
        }
        Ok(Geometry {
            hidden,
            topk,
            local_experts,
            capacity: max_tokens,
            fp8,
        })
    }

    /// Low-latency dispatch, send half: no host synchronisation; returns once launched.
    ///
    /// # Safety
    /// As [`Buffer::layout`]; `handle` arrays sized as [`LlHandle`] names.
    pub unsafe fn ll_dispatch_send(&self, pe: &Pe, g: &Geometry, a: &LlDispatch, handle: &LlHandle) -> Result<()> {
        let (g0, g1) = g.pack();
        let blocks = a.tokens.clamp(1, 132);
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ll_dispatch::Kernel,
                Self::grid(blocks, self.threads.ll_dispatch),
                (
                    pe.state(),
                    g0,
                    g1,
                    a.x as *const u16,
                    a.topk_idx as *const i64,
                    a.tokens,
                    pe.mut_ptr(&self.ll)?,
                    pe.mut_ptr(&self.work)?,
                    handle.seq as *mut u64,
                ),
            )?;
        }
        Ok(())
    }

    /// Low-latency dispatch, receive half (DeepEP's hook).
    ///
    /// # Safety
    /// As [`Buffer::ll_dispatch_send`], after it on this PE.
    pub unsafe fn ll_dispatch_recv(&self, pe: &Pe, g: &Geometry, handle: &LlHandle, recv: &LlRecv) -> Result<()> {
        let (g0, g1) = g.pack();
        let blocks = g.local_experts.clamp(1, 132);
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ll_dispatch_recv::Kernel,
                Self::grid(blocks, self.threads.ll_recv),
                (
                    pe.state(),
                    g0,
                    g1,
                    pe.mut_ptr(&self.ll)?,
                    handle.seq as *const u64,
                    recv.x as *mut u8,
                    recv.x_scales as *mut f32,
                    recv.count as *mut i32,
                    handle.src_info as *mut i32,
                    handle.layout_range as *mut i64,
                ),
            )?;
        }
        Ok(())
    }

    /// Low-latency combine, send half.
    ///
    /// # Safety
    /// As [`Buffer::ll_dispatch_recv`], for the dispatch that filled `handle`.
    pub unsafe fn ll_combine_send(&self, pe: &Pe, g: &Geometry, c: &LlCombine, handle: &LlHandle) -> Result<()> {
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        let rows = g.local_experts * self.ranks * g.capacity;
        let warps = self.threads.ll_combine / 32;
        let blocks = rows.div_ceil(warps).clamp(1, 132);
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ll_combine::Kernel,
                Self::grid(blocks, self.threads.ll_combine),
                (
                    pe.state(),
                    g0,
                    g1,
                    c.x as *const u16,
                    handle.src_info as *const i32,
                    handle.layout_range as *const i64,
                    pe.mut_ptr(&self.ll)?,
                    pe.mut_ptr(&self.work)?,
                    handle.seq as *mut u64,
                ),
            )?;
        }
        Ok(())
    }

    /// Low-latency combine, receive half: the weighted sum into `c.out`.
    ///
    /// # Safety
    /// As [`Buffer::ll_combine_send`], after it on this PE.
    pub unsafe fn ll_combine_recv(
        &self,
        pe: &Pe,
        g: &Geometry,
        tokens: u32,
        c: &LlCombine,
        handle: &LlHandle,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            pe.launch(
                &self.module,
                k::ep_ll_combine_recv::Kernel,
                Self::grid(tokens.clamp(1, 132), self.threads.ll_combine_recv),
                (
                    pe.state(),
                    g0,
                    g1,
                    c.topk_idx as *const i64,
                    c.topk_weights as *const f32,
                    tokens,
                    pe.mut_ptr(&self.ll)?,
                    handle.seq as *const u64,
                    c.out as *mut u16,
                ),
            )?;
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

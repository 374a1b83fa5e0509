//! Low-latency calls: dispatch and combine in send and receive halves (DeepEP's hooks).

use super::{bad, Buffer, DevicePtr};
use crate::error::Result;
use ibgda::Pe;
use ibgda_ep_kernels as k;
use k::geometry::Geometry;

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

impl Buffer {
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
            round_scale: false,
            ue8m0: false,
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
}

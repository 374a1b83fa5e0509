//! Low-latency calls: dispatch and combine in send and receive halves (DeepEP's hooks).

use super::{bad, Buffer, DevicePtr};
use crate::error::Result;
use ibgda::abi::TransportKind;
use ibgda::Pe;
use ibgda_ep_kernels as k;
use k::geometry::Geometry;
use k::phase;

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

    /// Low-latency dispatch in one kernel launch (DeepEP's shape; on the CPU emulation with a peer
    /// behind a NIC, as its two halves, see [`LlLaunch`]): every rank's rows sent and this rank's
    /// received, with no host synchronisation; returns once launched. A single launch's blocks
    /// wait for each other across the phases, so its grid is at most what is resident on the GPU
    /// at once ([`LlLaunch`]).
    ///
    /// # Safety
    /// As [`Buffer::layout`]; `handle` and `recv` arrays sized as [`LlHandle`] and [`LlRecv`] name.
    pub unsafe fn ll_dispatch(
        &self,
        pe: &Pe,
        g: &Geometry,
        a: &LlDispatch,
        handle: &LlHandle,
        recv: &LlRecv,
    ) -> Result<()> {
        if !self.ll_launch.single {
            // SAFETY: the caller's contract.
            unsafe {
                self.ll_dispatch_send(pe, g, a, handle)?;
                return self.ll_dispatch_recv(pe, g, handle, recv);
            }
        }
        let blocks = a.tokens.max(g.local_experts).clamp(1, self.ll_launch.resident_blocks);
        // SAFETY: the caller's contract.
        unsafe { self.launch_ll_dispatch(pe, g, Some(a), handle, Some(recv), phase::SEND | phase::RECV, blocks) }
    }

    /// Low-latency dispatch, send half alone (DeepEP's `return_recv_hook`): returns once launched.
    ///
    /// # Safety
    /// As [`Buffer::ll_dispatch`].
    pub unsafe fn ll_dispatch_send(&self, pe: &Pe, g: &Geometry, a: &LlDispatch, handle: &LlHandle) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_ll_dispatch(pe, g, Some(a), handle, None, phase::SEND, a.tokens.clamp(1, 132)) }
    }

    /// Low-latency dispatch, receive half alone (DeepEP's hook).
    ///
    /// # Safety
    /// As [`Buffer::ll_dispatch_send`], after it on this PE.
    pub unsafe fn ll_dispatch_recv(&self, pe: &Pe, g: &Geometry, handle: &LlHandle, recv: &LlRecv) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.launch_ll_dispatch(
                pe,
                g,
                None,
                handle,
                Some(recv),
                phase::RECV,
                self.ll_launch.waiting_blocks(g.local_experts.min(132)),
            )
        }
    }

    /// # Safety
    /// As [`Buffer::ll_dispatch`], for the phases given (`a` with the send phase, `recv` with the
    /// receive phase).
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_ll_dispatch(
        &self,
        pe: &Pe,
        g: &Geometry,
        a: Option<&LlDispatch>,
        handle: &LlHandle,
        recv: Option<&LlRecv>,
        phases: u32,
        blocks: u32,
    ) -> Result<()> {
        let (g0, g1) = g.pack();
        let (x, topk_idx, tokens) = a.map_or((0, 0, 0), |a| (a.x, a.topk_idx, a.tokens));
        let (rx, rs, rc) = recv.map_or((0, 0, 0), |r| (r.x, r.x_scales, r.count));
        let grid = Self::grid(blocks, self.threads.ll_dispatch);
        let args = (
            pe.state(),
            g0,
            g1,
            x as *const u16,
            topk_idx as *const i64,
            tokens,
            pe.mut_ptr(&self.ll)?,
            pe.mut_ptr(&self.work)?,
            handle.seq as *mut u64,
            rx as *mut u8,
            rs as *mut f32,
            rc as *mut i32,
            handle.src_info as *mut i32,
            handle.layout_range as *mut i64,
            phases,
        );
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ll_dispatch_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ll_dispatch::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// Low-latency combine in one kernel launch: every received row sent back and this rank's
    /// `tokens` tokens summed into `c.out` (grid as [`Buffer::ll_dispatch`]).
    ///
    /// # Safety
    /// As [`Buffer::ll_dispatch`], for the dispatch that filled `handle`.
    pub unsafe fn ll_combine(
        &self,
        pe: &Pe,
        g: &Geometry,
        tokens: u32,
        c: &LlCombine,
        handle: &LlHandle,
    ) -> Result<()> {
        if !self.ll_launch.single {
            // SAFETY: the caller's contract.
            unsafe {
                self.ll_combine_send(pe, g, c, handle)?;
                return self.ll_combine_recv(pe, g, tokens, c, handle);
            }
        }
        let blocks = self
            .ll_combine_send_blocks(g)
            .max(tokens)
            .clamp(1, self.ll_launch.resident_blocks);
        // SAFETY: the caller's contract.
        unsafe { self.launch_ll_combine(pe, g, tokens, c, handle, phase::SEND | phase::RECV, blocks) }
    }

    /// Low-latency combine, send half alone.
    ///
    /// # Safety
    /// As [`Buffer::ll_combine`].
    pub unsafe fn ll_combine_send(&self, pe: &Pe, g: &Geometry, c: &LlCombine, handle: &LlHandle) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_ll_combine(pe, g, 0, c, handle, phase::SEND, self.ll_combine_send_blocks(g)) }
    }

    /// Low-latency combine, receive half alone: the weighted sum into `c.out`.
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
        // SAFETY: the caller's contract.
        unsafe {
            self.launch_ll_combine(
                pe,
                g,
                tokens,
                c,
                handle,
                phase::RECV,
                self.ll_launch.waiting_blocks(tokens.min(132)),
            )
        }
    }

    /// Blocks of a combine's send half: one warp per received row slot.
    fn ll_combine_send_blocks(&self, g: &Geometry) -> u32 {
        let rows = g.local_experts * self.ranks * g.capacity;
        rows.div_ceil(self.threads.ll_combine / 32).clamp(1, 132)
    }

    /// # Safety
    /// As [`Buffer::ll_combine`], for the phases given.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_ll_combine(
        &self,
        pe: &Pe,
        g: &Geometry,
        tokens: u32,
        c: &LlCombine,
        handle: &LlHandle,
        phases: u32,
        blocks: u32,
    ) -> Result<()> {
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        let grid = Self::grid(blocks, self.threads.ll_combine);
        let args = (
            pe.state(),
            g0,
            g1,
            c.x as *const u16,
            handle.src_info as *const i32,
            handle.layout_range as *const i64,
            pe.mut_ptr(&self.ll)?,
            pe.mut_ptr(&self.work)?,
            handle.seq as *mut u64,
            c.topk_idx as *const i64,
            c.topk_weights as *const f32,
            tokens,
            c.out as *mut u16,
            phases,
        );
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ll_combine_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ll_combine::Kernel, grid, args)?;
            }
        }
        Ok(())
    }
}

/// How this PE launches a low-latency operation, decided once per buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct LlLaunch {
    /// Both phases in one launch (DeepEP's shape): on a GPU, and on the CPU emulation when every
    /// peer is reached over NVLink. Behind a NIC the receive phase then starts on each expert as
    /// its counts land instead of after the send phase's last completion (2x H200, CX-7 model,
    /// session 27: combine 232 -> 219-227 us; the dispatch's last counts come with its busiest
    /// queue's last rows either way). On the CPU emulation, where a block is a thread, a NIC
    /// call's polling receive phase would only take turns from the send phase and the engine, so
    /// it runs as two launches there.
    single: bool,
    /// The most blocks a single launch may have: all of them must be resident at once. On a GPU,
    /// its SMs less those the emulated NIC's engines keep, shared by the PEs of this process on
    /// the GPU (one block per SM, the kernels' blocks being up to 1024 threads); on the CPU
    /// emulation every block is a thread.
    resident_blocks: u32,
    /// PEs of this process on this PE's GPU.
    sharing: u32,
}

impl LlLaunch {
    /// The most blocks a launch may have when all of them must be resident at once.
    pub(super) fn resident_blocks(&self) -> u32 {
        self.resident_blocks
    }

    /// Why `blocks` blocks of a kernel that waits for other ranks are too many for this PE
    /// (`None` when they fit): on a GPU shared by several PEs of this process, such a kernel must
    /// fit in this PE's share of the SMs (see [`LlLaunch::waiting_blocks`]). The high-throughput
    /// kernels run `num_sms` blocks, which are channels of the data layout and cannot be trimmed.
    pub(super) fn too_many_waiting(&self, blocks: u32) -> Option<String> {
        (self.sharing > 1 && blocks > self.resident_blocks).then(|| {
            format!(
                "num_sms is {blocks}, more than this PE's share of its GPU's SMs ({}: {} PEs share the GPU, \
                 less the emulated NIC's engines); a kernel that waits for another PE's rows would keep \
                 that PE's kernels from starting",
                self.resident_blocks, self.sharing
            )
        })
    }

    /// The blocks of a receive half launched alone, at most `wanted`: its blocks spin until the
    /// other ranks' rows arrive, so on a GPU shared with other PEs it takes at most this PE's
    /// share of the SMs. With every SM, one PE's receive half could keep another PE's send half
    /// on the same GPU from ever starting (two PEs on one H200: the receive half timed out waiting
    /// for a rank whose send was launched a moment later).
    pub(super) fn waiting_blocks(&self, wanted: u32) -> u32 {
        if self.sharing > 1 {
            wanted.clamp(1, self.resident_blocks)
        } else {
            wanted.max(1)
        }
    }

    pub(super) fn for_pe(pe: &Pe) -> Result<LlLaunch> {
        let single =
            pe.is_gpu() || (0..pe.n_pes()).all(|p| p == pe.my_pe() || pe.transport_to(p) == Some(TransportKind::P2p));
        // PEs in one process that share a GPU share its SMs; CPU PEs share nothing.
        let sharing = if pe.is_gpu() { pe.config().pes_per_gpu.max(1) } else { 1 };
        let resident_blocks = match pe.gpu() {
            Err(_) => 132,
            Ok(gpu) => {
                let sms = gpu
                    .context()
                    .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                    .map_err(|source| ibgda::Error::KernelFailed { pe: pe.my_pe(), source })?
                    .max(1) as u32;
                let engine = gpu.ibgda().map_or(0, |g| g.engine_blocks());
                (sms.saturating_sub(engine * sharing) / sharing).clamp(1, 132)
            }
        };
        Ok(LlLaunch {
            single,
            resident_blocks,
            sharing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LlLaunch;

    #[test]
    fn a_receive_half_alone_leaves_a_shared_gpu_to_the_other_pes() {
        // Two PEs on one H200 with 8 engine blocks each: 58 SMs apiece.
        let shared = LlLaunch {
            single: true,
            resident_blocks: 58,
            sharing: 2,
        };
        assert_eq!(shared.waiting_blocks(128), 58, "a token per block would take every SM");
        assert_eq!(shared.waiting_blocks(40), 40);
        assert_eq!(shared.waiting_blocks(0), 1);
        // One PE per GPU: nothing else on the GPU waits for SMs.
        let alone = LlLaunch {
            single: true,
            resident_blocks: 116,
            sharing: 1,
        };
        assert_eq!(alone.waiting_blocks(128), 128);
        // High-throughput kernels cannot be trimmed: too many is an error when the GPU is shared.
        assert!(shared
            .too_many_waiting(64)
            .is_some_and(|why| why.contains("num_sms is 64")));
        assert!(shared.too_many_waiting(24).is_none());
        assert!(alone.too_many_waiting(132).is_none());
    }
}

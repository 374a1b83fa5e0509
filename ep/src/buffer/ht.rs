//! High-throughput calls: layout, notify, dispatch and combine (DeepEP's `Buffer.dispatch`/`combine`).

use super::{bad, read_device, zero_device, Buffer, DevicePtr};
use crate::error::{EpError, Result};
use ibgda::Pe;
use ibgda_ep_kernels as k;
use k::geometry::{info, Geometry};

/// Outputs of [`Buffer::layout`] (any contents on entry: the call zeroes the counts and `bad`, and
/// the kernel writes every entry of `in_rank`).
#[derive(Clone, Copy, Debug)]
pub struct LayoutOut {
    /// `u32 [ranks]`.
    pub tokens_per_rank: DevicePtr,
    /// `u32 [experts]`.
    pub tokens_per_expert: DevicePtr,
    /// `u8 [tokens, ranks]` (0 or 1).
    pub in_rank: DevicePtr,
    /// One `u32`: 0, or 1 + a token whose `topk_idx` is out of range; or 0 (no address) when
    /// the caller does not want it (a non-cached dispatch's notify checks the routing anyway).
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

/// Receive-side outputs of a high-throughput dispatch (`num_recv` rows each); the default (no
/// outputs) is [`Buffer::ht_dispatch_discard`]'s.
#[derive(Clone, Copy, Debug, Default)]
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

impl Buffer {
    /// DeepEP's `get_dispatch_layout`: counts tokens per rank and per expert and marks
    /// `in_rank`; the counts and `out.bad` are zeroed first on this PE's stream, so the outputs
    /// may be uninitialised. `out.bad` then tells of an expert index out of range (a non-cached
    /// dispatch's notify also finds it, on every rank: see [`Buffer::ht_notify`]).
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
        // SAFETY: the caller's contract: the counts' and `bad`'s sizes.
        unsafe {
            zero_device(pe, out.tokens_per_rank, 4 * self.ranks as usize)?;
            zero_device(pe, out.tokens_per_expert, 4 * experts as usize)?;
            if out.bad != 0 {
                zero_device(pe, out.bad, 4)?;
            }
        }
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

    /// The geometry of a high-throughput call, checked; `topk` 0 for a dispatch without top-k.
    pub fn ht_geometry(&self, call: &'static str, hidden: u32, topk: u32, experts: u32, fp8: bool) -> Result<Geometry> {
        // `topk` 0 is a dispatch without top-k (DeepEP's, given only `is_token_in_rank`): rows
        // carry no expert indices or weights, and a combine of them sums rows only.
        let local_experts = self.check_experts(call, experts, topk.max(1))?;
        self.check_hidden(call, hidden, fp8)?;
        let mut g = Geometry {
            hidden,
            topk,
            local_experts,
            capacity: 0,
            fp8,
            round_scale: false,
            ue8m0: false,
        };
        let cap = ht_slots(&g, self.config.num_nvl_bytes, self.ranks).min(u32::MAX as u64);
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
    /// With `topk_idx` (`i64 [tokens, topk]`, not 0) the kernel also checks every entry against
    /// `-1..experts`, on the GPU, so the check costs the host no synchronisation of its own: when
    /// any rank's names an expert out of range, nothing moves and every rank's
    /// [`Buffer::read_info`] fails with [`EpError::ExpertOutOfRange`] naming that rank and a token
    /// of it. A cached dispatch, whose routing was checked when its handle was made, passes 0.
    ///
    /// With `max_recv` not 0 (DeepEP's `num_worst_tokens`: receive outputs sized for that many
    /// rows), a dispatch in which any rank would receive more stops the same way: every rank's
    /// [`Buffer::read_info`] fails with [`EpError::TooManyRows`] naming that rank.
    ///
    /// # Safety
    /// As [`Buffer::layout`]; `handle` holds arrays of the sizes [`HtHandle`] names; `topk_idx`
    /// is 0 or as [`HtDispatch::topk_idx`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ht_notify(
        &self,
        pe: &Pe,
        g: &Geometry,
        tokens: u32,
        handle: &HtHandle,
        topk_idx: DevicePtr,
        max_recv: u32,
    ) -> Result<()> {
        let (g0, g1) = g.pack();
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            let args = (
                pe.state(),
                g0,
                g1,
                handle.in_rank as *const u8,
                handle.tokens_per_expert as *const u32,
                topk_idx as *const i64,
                tokens,
                max_recv,
                pe.mut_ptr(&self.sync)?,
                pe.mut_ptr(&self.work)?,
                handle.info as *mut i32,
            );
            let grid = Self::grid(self.config.num_sms, self.threads.ht_send);
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ht_notify_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ht_notify::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// High-throughput step 1 of a cached dispatch (DeepEP's `dispatch(x, handle=...)`): the
    /// routing, the counts and every token's slots are the handle's, from the dispatch that made
    /// it, so nothing is counted or exchanged. One warp numbers the call, adds the handle's rows
    /// to the expected-row counters and tells every rank it is in; the [`Buffer::ht_dispatch_send`]
    /// that follows waits for every rank's word before it writes into any and takes each
    /// token's slots from `handle.send_slot`. Any grid may follow (a token's slot on a rank is
    /// its place among the tokens sent there), so [`Buffer::set_num_sms`] may change between the
    /// handle's dispatch and this one, as long as every rank uses the same `num_sms` in each call
    /// (as for every high-throughput call: a receiver behind a NIC counts the senders' channels).
    ///
    /// `record` is the handle's notify record as [`Buffer::read_info`] returned it: the slots
    /// must fit `g` (a cached dispatch may move other rows than the handle's, e.g. BF16 after
    /// FP8), and every rank's record holds the same matrix, so every rank fails alike with
    /// [`EpError::BufferTooSmall`] when one would overflow, before anything is launched.
    ///
    /// # Safety
    /// As [`Buffer::ht_notify`]; `handle` is from a dispatch that completed on this buffer
    /// (its `send_slot` filled, `record` read from its `info`), with the same routing on every
    /// rank: every rank makes the cached call with its own handle of that dispatch.
    pub unsafe fn ht_notify_cached(&self, pe: &Pe, g: &Geometry, handle: &HtHandle, record: &[i32]) -> Result<()> {
        let (ranks, le) = (self.ranks, g.local_experts);
        if record.len() != info::len(ranks, le) || record[info::status(ranks, le)] != 0 {
            return Err(bad(
                "dispatch",
                self.rank,
                format!(
                    "a cached dispatch's record has {} entries and status {:?}: it must be the {} of a \
                     dispatch that succeeded at {ranks} ranks and {} experts",
                    record.len(),
                    record.get(info::status(ranks, le)),
                    info::len(ranks, le),
                    le * ranks
                ),
            ));
        }
        let (mut most, mut receiver) = (0u64, 0u32);
        for s in 0..ranks {
            for d in 0..ranks {
                let n = record[info::sent(ranks, le, s, d)].max(0) as u64;
                if n > most {
                    (most, receiver) = (n, d);
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.ht_notify_cached_rows(pe, g, handle, most, receiver) }
    }

    /// [`Buffer::ht_notify_cached`] for a caller that kept of the record only the most rows one
    /// rank sends another (`most_sent`) and the first rank that receives that many (`receiver`).
    ///
    /// # Safety
    /// As [`Buffer::ht_notify_cached`], with the two numbers from the handle's record.
    pub unsafe fn ht_notify_cached_rows(
        &self,
        pe: &Pe,
        g: &Geometry,
        handle: &HtHandle,
        most_sent: u64,
        receiver: u32,
    ) -> Result<()> {
        if most_sent > g.capacity as u64 {
            return Err(EpError::BufferTooSmall {
                call: "dispatch",
                rank: self.rank,
                receiver,
                capacity: g.capacity as u64,
                tokens: most_sent,
                needed: Buffer::ht_size_hint(self.ranks, most_sent, g.hidden, g.topk, g.fp8),
            });
        }
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            let args = (
                pe.state(),
                handle.info as *const i32,
                pe.mut_ptr(&self.sync)?,
                pe.mut_ptr(&self.work)?,
            );
            let grid = Self::grid(1, 32);
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ht_notify_cached_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ht_notify_cached::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// Reads a notify record (waits for this PE's work first) and turns a bad status into
    /// [`EpError::ExpertOutOfRange`], [`EpError::BufferTooSmall`] or [`EpError::TooManyRows`].
    ///
    /// # Safety
    /// `handle.info` is a live array of [`HtHandle::info_len`] `i32`s on this PE's device.
    pub unsafe fn read_info(&self, pe: &Pe, g: &Geometry, tokens: u32, handle: &HtHandle) -> Result<Vec<i32>> {
        let n = info::len(self.ranks, g.local_experts);
        // The copy follows the notify on this PE's stream and one wait covers both (not a wait
        // for the notify, then another for the copy); `synchronize` after it (the stream idle by
        // then) reports a device error the notify recorded, also when the copy failed with it.
        if !pe.is_gpu() {
            pe.synchronize()?;
        }
        // SAFETY: the caller's contract.
        let read: Result<Vec<i32>> = unsafe { read_device(pe, handle.info, n) };
        pe.synchronize()?;
        let v = read?;
        let status = v[info::status(self.ranks, g.local_experts)];
        if status < 0 {
            return Err(EpError::ExpertOutOfRange {
                call: "dispatch",
                rank: self.rank,
                from_rank: (-status - 1) as u32,
                token: v[info::bad_token(self.ranks, g.local_experts)] as u32,
                experts: g.local_experts * self.ranks,
            });
        }
        if status > self.ranks as i32 {
            let receiver = status as u32 - 1 - self.ranks;
            return Err(EpError::TooManyRows {
                call: "dispatch",
                rank: self.rank,
                receiver,
                rows: (0..self.ranks)
                    .map(|s| v[info::sent(self.ranks, g.local_experts, s, receiver)] as u64)
                    .sum(),
                limit: v[info::max_recv(self.ranks, g.local_experts)] as u32,
            });
        }
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
    /// (`num_recv` = the info's total; after [`Buffer::ht_notify`] the `handle.send_slot` array
    /// is filled, after [`Buffer::ht_notify_cached`] it is read): the two launches
    /// [`Buffer::ht_dispatch_send`] and [`Buffer::ht_dispatch_recv`].
    ///
    /// # Safety
    /// As [`Buffer::ht_notify`], and the notify (full or cached) of this `handle` ran last on this PE, with the
    /// same `in_rank` and token count as `a` (the kernels place and count rows by the notify's
    /// per-warp counts: for peers behind a NIC or the proxy a block adds those counts to the
    /// receiver's, so rows that differ from them would be read as arrived without a timeout).
    pub unsafe fn ht_dispatch(
        &self,
        pe: &Pe,
        g: &Geometry,
        a: &HtDispatch,
        handle: &HtHandle,
        recv: &HtRecv,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.ht_dispatch_send(pe, g, a, handle)?;
            self.ht_dispatch_recv(pe, g, handle, recv)
        }
    }

    /// The send half of [`Buffer::ht_dispatch`]: every token to the slots its notify assigned.
    ///
    /// # Safety
    /// As [`Buffer::ht_dispatch`]; [`Buffer::ht_dispatch_recv`] follows on this PE's stream.
    pub unsafe fn ht_dispatch_send(&self, pe: &Pe, g: &Geometry, a: &HtDispatch, handle: &HtHandle) -> Result<()> {
        let (g0, g1) = g.pack();
        let (area, sync, work) = self.ht_areas(pe)?;
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            let args = (
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
            );
            let grid = Self::grid(self.config.num_sms, self.threads.ht_send);
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ht_dispatch_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ht_dispatch::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// The receive half of [`Buffer::ht_dispatch`]: compacts every source's rows into `recv` as
    /// they arrive (a source behind a NIC or the proxy channel by channel, under the transfer),
    /// then completes the send half's queues. Over a NIC or the proxy the send half returns once
    /// its rows are posted, and the transfer's time shows in this half.
    ///
    /// # Safety
    /// As [`Buffer::ht_dispatch`], after its [`Buffer::ht_dispatch_send`] on this PE's stream.
    pub unsafe fn ht_dispatch_recv(&self, pe: &Pe, g: &Geometry, handle: &HtHandle, recv: &HtRecv) -> Result<()> {
        let (g0, g1) = g.pack();
        let (area, sync, work) = self.ht_areas(pe)?;
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
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

    /// Ends a dispatch whose [`Buffer::ht_dispatch_send`] ran but whose outputs could not be made
    /// (out of memory, say): the receive half runs with no outputs, so the rows sent to this PE
    /// arrive and are dropped, and its own sends complete (the receive half waits for its
    /// queues), so that its next dispatch cannot overwrite staged rows still being sent. The
    /// buffer is then as after [`Buffer::ht_dispatch_recv`]. The handle's combine may still follow (it
    /// sends rows the caller provides).
    ///
    /// # Safety
    /// As [`Buffer::ht_dispatch_recv`].
    pub unsafe fn ht_dispatch_discard(&self, pe: &Pe, g: &Geometry, handle: &HtHandle) -> Result<()> {
        // SAFETY: the caller's contract; with no outputs the kernel writes none.
        unsafe { self.ht_dispatch_recv(pe, g, handle, &HtRecv::default()) }
    }

    /// This PE's addresses of the high-throughput area and the sync and work words, which every
    /// high-throughput launch passes.
    fn ht_areas(&self, pe: &Pe) -> Result<(*mut u8, *mut u64, *mut u64)> {
        Ok((pe.mut_ptr(&self.ht)?, pe.mut_ptr(&self.sync)?, pe.mut_ptr(&self.work)?))
    }

    /// High-throughput combine: sends each received row of `x` (`bf16 [num_recv, hidden]`, with
    /// `weights [num_recv, topk]` or 0) back to its source, and sums what comes back into `out`
    /// (`bf16 [tokens, hidden]`) and `out_weights` (`f32 [tokens, topk]`, or 0). One launch whose
    /// blocks send and reduce (the reducers take each token as its rows arrive, also from peers
    /// behind a NIC, whose rows come in flagged chunks) when its `num_sms` blocks, at least two,
    /// are all resident on the GPU at once beside the emulated NIC's engine; otherwise the two
    /// launches [`Buffer::ht_combine_send`] and [`Buffer::ht_combine_reduce`].
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
        // One launch only when all its blocks run at once: its blocks wait on rows that other
        // blocks (of this rank or the others) send, so a block that never starts would hold up
        // every rank. Decided at each call, as `num_sms` may change between calls; every rank
        // decides alike when the ranks share `num_sms` and their GPU's kind (a rank that chose
        // otherwise would wait for flags, or counts, its peers do not send, and time out naming
        // them).
        let blocks = self.config.num_sms;
        if blocks < 2 || blocks > self.ll_launch.resident_blocks() {
            // SAFETY: the caller's contract.
            return unsafe {
                self.ht_combine_send(pe, g, handle, x, weights)?;
                self.ht_combine_reduce(pe, g, tokens, handle, x, weights, out, out_weights)
            };
        }
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        let (area, sync, work) = self.ht_areas(pe)?;
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            let grid = Self::grid(self.config.num_sms, self.threads.ht_fused);
            let args = (
                pe.state(),
                g0,
                g1,
                x as *const u16,
                weights as *const f32,
                handle.send_slot as *const i32,
                tokens,
                handle.info as *const i32,
                area,
                sync,
                work,
                out as *mut u16,
                out_weights as *mut f32,
            );
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ht_combine_fused_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ht_combine_fused::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// The send half of [`Buffer::ht_combine`]: the other ranks' rows of `x` back to them.
    ///
    /// # Safety
    /// As [`Buffer::ht_combine`]; [`Buffer::ht_combine_reduce`] follows on this PE's stream, with
    /// the same `x` and `weights`, which stay unchanged until it ran.
    pub unsafe fn ht_combine_send(
        &self,
        pe: &Pe,
        g: &Geometry,
        handle: &HtHandle,
        x: DevicePtr,
        weights: DevicePtr,
    ) -> Result<()> {
        let g = Geometry { fp8: false, ..*g };
        let (g0, g1) = g.pack();
        let (area, sync, work) = self.ht_areas(pe)?;
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
            let args = (
                pe.state(),
                g0,
                g1,
                x as *const u16,
                weights as *const f32,
                handle.info as *const i32,
                area,
                sync,
                work,
            );
            let grid = Self::grid(self.config.num_sms, self.threads.ht_combine);
            if self.threads.p2p {
                pe.launch(&self.module, k::ep_ht_combine_p2p::Kernel, grid, args)?;
            } else {
                pe.launch(&self.module, k::ep_ht_combine::Kernel, grid, args)?;
            }
        }
        Ok(())
    }

    /// The receive half of [`Buffer::ht_combine`]: waits for the other ranks' rows and sums them,
    /// with this rank's own from `x`, into `out` (and `out_weights`).
    ///
    /// # Safety
    /// As [`Buffer::ht_combine`], after its [`Buffer::ht_combine_send`] on this PE's stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ht_combine_reduce(
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
        let (area, sync, work) = self.ht_areas(pe)?;
        // SAFETY: the caller's contract; the areas are this buffer's.
        unsafe {
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
                    x as *const u16,
                    weights as *const f32,
                    out as *mut u16,
                    out_weights as *mut f32,
                ),
            )?;
        }
        Ok(())
    }
}

/// Slots per source rank of a high-throughput area of `area_bytes` shared by `ranks` ranks, for
/// calls of geometry `g`: counted in BF16 rows whatever `g`'s format, because a combine lays the
/// area out for BF16 rows with the capacity of the dispatch it follows. (Counted in FP8 rows, the
/// capacity was larger, and an FP8 dispatch's combine staged its rows past the area's end, over
/// whatever the heap held next.)
pub(crate) fn ht_slots(g: &Geometry, area_bytes: u64, ranks: u32) -> u64 {
    Geometry { fp8: false, ..*g }.ht_capacity(area_bytes, ranks)
}

#[cfg(test)]
mod tests {
    use super::{ht_slots, Buffer, Geometry};

    /// Every byte a dispatch (either format) and its combine (BF16, the dispatch's capacity)
    /// touch lies inside the area, for the sizes `ht_size_hint` gives and for odd sizes.
    #[test]
    fn dispatch_and_combine_stay_inside_the_area() {
        for ranks in [2u32, 3, 4, 8] {
            for hidden in [256u32, 2048, 4096, 7168] {
                for topk in [0u32, 1, 4, 8] {
                    for tokens in [1u64, 48, 4096] {
                        for fp8 in [false, true] {
                            let hint = Buffer::ht_size_hint(ranks, tokens, hidden, topk, fp8);
                            for area in [hint, hint + 4_000, hint * 3 / 2 + 17] {
                                let g = Geometry {
                                    hidden,
                                    topk,
                                    local_experts: 1,
                                    capacity: 0,
                                    fp8,
                                    round_scale: false,
                                    ue8m0: false,
                                };
                                let cap = ht_slots(&g, area, ranks);
                                assert!(cap >= tokens || area != hint, "the hint holds {tokens} tokens");
                                let d = Geometry {
                                    capacity: cap as u32,
                                    ..g
                                };
                                let c = Geometry { fp8: false, ..d };
                                let (last_src, last) = (ranks - 1, cap as u32 - 1);
                                let ends = [
                                    d.ht_dispatch_recv(last_src, last) + d.ht_row(),
                                    d.ht_stage_dispatch(ranks, last_src, last) + d.ht_row(),
                                    c.ht_combine_recv(ranks, last_src, last) + c.combine_row(),
                                    c.ht_stage_combine(ranks, last_src, last) + c.combine_row(),
                                ];
                                for (what, end) in [
                                    "dispatch receive",
                                    "dispatch staging",
                                    "combine receive",
                                    "combine staging",
                                ]
                                .iter()
                                .zip(ends)
                                {
                                    assert!(
                                        end <= area,
                                        "{what} ends at {end} past the area's {area} bytes (ranks {ranks}, hidden {hidden}, \
                                         top-{topk}, fp8 {fp8}, capacity {cap})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

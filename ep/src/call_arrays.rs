//! The device arrays one dispatch/combine call needs besides the caller's tensors, allocated
//! together for callers that hold device addresses (the self-check, `ep_bench`): the layout's
//! outputs, a high-throughput handle and receive area, a low-latency handle and receive area.

use crate::buffer::{HtHandle, HtRecv, LayoutOut, LlHandle, LlRecv};
use crate::device_vec::DeviceVec;
use crate::error::Result;
use crate::geometry::Geometry;
use ibgda::Pe;

/// The outputs of [`crate::Buffer::layout`] for `tokens` tokens, zeroed (as the call requires).
pub struct LayoutArrays {
    /// `u32 [ranks]`.
    pub tokens_per_rank: DeviceVec,
    /// `u32 [experts]`.
    pub tokens_per_expert: DeviceVec,
    /// `u8 [tokens, ranks]`.
    pub in_rank: DeviceVec,
    /// One `u32`.
    pub bad: DeviceVec,
}

impl LayoutArrays {
    /// Allocates them on `pe`'s device.
    pub fn new(pe: &Pe, tokens: usize, ranks: u32, experts: u32) -> Result<LayoutArrays> {
        Ok(LayoutArrays {
            tokens_per_rank: DeviceVec::zeroed(pe, 4 * ranks as usize)?,
            tokens_per_expert: DeviceVec::zeroed(pe, 4 * experts as usize)?,
            in_rank: DeviceVec::zeroed(pe, tokens * ranks as usize)?,
            bad: DeviceVec::zeroed(pe, 4)?,
        })
    }

    /// Their addresses, for [`crate::Buffer::layout`].
    pub fn out(&self) -> LayoutOut {
        LayoutOut {
            tokens_per_rank: self.tokens_per_rank.ptr(),
            tokens_per_expert: self.tokens_per_expert.ptr(),
            in_rank: self.in_rank.ptr(),
            bad: self.bad.ptr(),
        }
    }
}

/// The arrays of a high-throughput handle (its layout arrays come from [`LayoutArrays`]).
pub struct HtHandleArrays {
    /// `i32 [HtHandle::info_len]`.
    pub info: DeviceVec,
    /// `i32 [tokens, ranks]`.
    pub send_slot: DeviceVec,
}

impl HtHandleArrays {
    /// Allocates them on `pe`'s device.
    pub fn new(pe: &Pe, tokens: usize, ranks: u32, experts: u32) -> Result<HtHandleArrays> {
        Ok(HtHandleArrays {
            info: DeviceVec::zeroed(pe, 4 * HtHandle::info_len(ranks, experts))?,
            send_slot: DeviceVec::zeroed(pe, 4 * tokens * ranks as usize)?,
        })
    }

    /// The handle of a dispatch whose layout is `layout`.
    pub fn handle(&self, layout: &LayoutArrays) -> HtHandle {
        HtHandle {
            info: self.info.ptr(),
            send_slot: self.send_slot.ptr(),
            in_rank: layout.in_rank.ptr(),
            tokens_per_expert: layout.tokens_per_expert.ptr(),
        }
    }
}

/// What a high-throughput dispatch receives: `rows` rows of geometry `g`.
pub struct HtRecvArrays {
    /// `[rows, hidden]`, FP8 or BF16.
    pub x: DeviceVec,
    /// `f32 [rows, hidden / 128]` (written for FP8 only).
    pub x_scales: DeviceVec,
    /// `i64 [rows, topk]`.
    pub topk_idx: DeviceVec,
    /// `f32 [rows, topk]`.
    pub topk_weights: DeviceVec,
    /// `i32 [rows]`.
    pub src: DeviceVec,
    fp8: bool,
}

impl HtRecvArrays {
    /// Allocates them on `pe`'s device.
    pub fn new(pe: &Pe, rows: usize, g: &Geometry) -> Result<HtRecvArrays> {
        let (h, k) = (g.hidden as usize, g.topk as usize);
        Ok(HtRecvArrays {
            x: DeviceVec::zeroed(pe, rows * if g.fp8 { h } else { 2 * h })?,
            x_scales: DeviceVec::zeroed(pe, rows * h / 128 * 4)?,
            topk_idx: DeviceVec::zeroed(pe, rows * k * 8)?,
            topk_weights: DeviceVec::zeroed(pe, rows * k * 4)?,
            src: DeviceVec::zeroed(pe, rows * 4)?,
            fp8: g.fp8,
        })
    }

    /// Their addresses, for [`crate::Buffer::ht_dispatch`].
    pub fn recv(&self) -> HtRecv {
        HtRecv {
            x: self.x.ptr(),
            x_scales: if self.fp8 { self.x_scales.ptr() } else { 0 },
            topk_idx: self.topk_idx.ptr(),
            topk_weights: self.topk_weights.ptr(),
            src: self.src.ptr(),
        }
    }
}

/// A low-latency handle and receive area for geometry `g` (`g.capacity` tokens per rank).
pub struct LlArrays {
    /// Two `u64` sequence words.
    pub seq: DeviceVec,
    /// `i32 [local_experts, ranks * capacity]`.
    pub src_info: DeviceVec,
    /// `i64 [local_experts, ranks]`.
    pub layout_range: DeviceVec,
    /// `[local_experts, ranks * capacity, hidden]`, FP8 or BF16.
    pub x: DeviceVec,
    /// `f32 [local_experts, ranks * capacity, hidden / 128]` (written for FP8 only).
    pub x_scales: DeviceVec,
    /// `i32 [local_experts]`.
    pub count: DeviceVec,
    fp8: bool,
}

impl LlArrays {
    /// Allocates them on `pe`'s device.
    pub fn new(pe: &Pe, g: &Geometry, ranks: u32) -> Result<LlArrays> {
        let (el, h) = (g.local_experts as usize, g.hidden as usize);
        let rows = el * ranks as usize * g.capacity as usize;
        Ok(LlArrays {
            seq: DeviceVec::zeroed(pe, 16)?,
            src_info: DeviceVec::zeroed(pe, rows * 4)?,
            layout_range: DeviceVec::zeroed(pe, el * ranks as usize * 8)?,
            x: DeviceVec::zeroed(pe, rows * if g.fp8 { h } else { 2 * h })?,
            x_scales: DeviceVec::zeroed(pe, rows * h / 128 * 4)?,
            count: DeviceVec::zeroed(pe, el * 4)?,
            fp8: g.fp8,
        })
    }

    /// The handle, for the low-latency calls.
    pub fn handle(&self) -> LlHandle {
        LlHandle {
            seq: self.seq.ptr(),
            src_info: self.src_info.ptr(),
            layout_range: self.layout_range.ptr(),
        }
    }

    /// The receive area, for [`crate::Buffer::ll_dispatch_recv`].
    pub fn recv(&self) -> LlRecv {
        LlRecv {
            x: self.x.ptr(),
            x_scales: if self.fp8 { self.x_scales.ptr() } else { 0 },
            count: self.count.ptr(),
        }
    }
}

//! WQE segment encoders and the stores that place them in a send queue.
//!
//! Every segment is 16 bytes, encoded with `ibgda_abi::mlx5` (big-endian fields exactly as
//! `mlx5dv.h`) and written with one 16-byte vector store. A WQE of several WQEBBs may wrap around
//! the end of the ring; [`SendQueue::segment`] handles that.

use crate::arch;
use ibgda_abi::mlx5::{
    opcode, opmod, wqe_ds, AtomicSeg, Be32, Be64, CtrlSeg, DataSeg, MaskedCs32Seg, MaskedCs64Seg, MaskedFa32Seg,
    MaskedFa64Seg, RaddrSeg, INLINE_SEG, MAX_INLINE_BYTES,
};

/// One 16-byte segment as four native words, ready for a vector store.
pub type Segment = [u32; 4];

#[inline(always)]
fn words<T: Copy>(seg: T) -> Segment {
    const { assert!(core::mem::size_of::<T>() == 16) };
    // SAFETY: T is a 16-byte plain-old-data segment with no padding (checked by ibgda-abi's layout
    // tests), so every byte is initialised.
    unsafe { core::mem::transmute_copy(&seg) }
}

/// The ctrl segment.
#[inline(always)]
pub fn ctrl(wqe_index: u16, op: u8, op_mod: u8, qpn: u32, fm_ce_se: u8, ds: u8, imm: u32) -> Segment {
    words(CtrlSeg::new(wqe_index, op, op_mod, qpn, fm_ce_se, ds, imm))
}

/// The remote-address segment.
#[inline(always)]
pub fn raddr(addr: u64, rkey: u32) -> Segment {
    words(RaddrSeg {
        raddr: Be64::new(addr),
        rkey: Be32::new(rkey),
        reserved: 0,
    })
}

/// A data (scatter/gather) segment.
#[inline(always)]
pub fn data(len: u32, lkey: u32, addr: u64) -> Segment {
    words(DataSeg::new(len, lkey, addr))
}

/// An atomic operation as the NIC executes it, with the operands it carries. The constructors map
/// OpenSHMEM atomics onto mlx5 operations the way NVSHMEM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// `ATOMIC_FA`: 8-byte fetch-and-add.
    FetchAdd64 {
        /// Addend.
        add: u64,
    },
    /// `ATOMIC_CS`: 8-byte compare-and-swap.
    CompareSwap64 {
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// `ATOMIC_MASKED_FA`, 4 bytes: add field by field (fields end at the set bits of `boundary`).
    MaskedFetchAdd32 {
        /// Addend.
        add: u32,
        /// Field boundaries.
        boundary: u32,
    },
    /// `ATOMIC_MASKED_FA`, 8 bytes.
    MaskedFetchAdd64 {
        /// Addend.
        add: u64,
        /// Field boundaries.
        boundary: u64,
    },
    /// `ATOMIC_MASKED_CS`, 4 bytes: if `old & compare_mask == compare & compare_mask`, write
    /// `(old & !swap_mask) | (swap & swap_mask)`.
    MaskedCompareSwap32 {
        /// Bits to write.
        swap: u32,
        /// Value to compare with.
        compare: u32,
        /// Bits of `swap` written.
        swap_mask: u32,
        /// Bits compared.
        compare_mask: u32,
    },
    /// `ATOMIC_MASKED_CS`, 8 bytes (two atomic segments).
    MaskedCompareSwap64 {
        /// Bits to write.
        swap: u64,
        /// Value to compare with.
        compare: u64,
        /// Bits of `swap` written.
        swap_mask: u64,
        /// Bits compared.
        compare_mask: u64,
    },
}

impl AtomicOp {
    /// Adds `v` (fetch or not): plain FA for 8 bytes, masked FA for 4.
    pub const fn add(width: u32, v: u64) -> Self {
        if width == 8 {
            AtomicOp::FetchAdd64 { add: v }
        } else {
            AtomicOp::MaskedFetchAdd32 {
                add: v as u32,
                boundary: 0,
            }
        }
    }
    /// Compare-and-swap: plain CS for 8 bytes, fully masked CS for 4.
    pub const fn compare_swap(width: u32, compare: u64, swap: u64) -> Self {
        if width == 8 {
            AtomicOp::CompareSwap64 { compare, swap }
        } else {
            AtomicOp::MaskedCompareSwap32 {
                swap: swap as u32,
                compare: compare as u32,
                swap_mask: !0,
                compare_mask: !0,
            }
        }
    }
    /// Unconditional swap / set: masked CS comparing nothing and writing every bit.
    pub const fn swap(width: u32, v: u64) -> Self {
        Self::masked_cs(width, v, 0, !0, 0)
    }
    /// Bitwise and: masked CS writing `v` into the bits where `v` is 0.
    pub const fn and(width: u32, v: u64) -> Self {
        Self::masked_cs(width, v, 0, !v, 0)
    }
    /// Bitwise or: masked CS writing `v` into the bits where `v` is 1.
    pub const fn or(width: u32, v: u64) -> Self {
        Self::masked_cs(width, v, 0, v, 0)
    }
    /// Bitwise xor: masked FA with every bit its own field (addition without carries).
    pub const fn xor(width: u32, v: u64) -> Self {
        if width == 8 {
            AtomicOp::MaskedFetchAdd64 { add: v, boundary: !0 }
        } else {
            AtomicOp::MaskedFetchAdd32 {
                add: v as u32,
                boundary: !0,
            }
        }
    }
    /// Atomic load: masked FA adding 0.
    pub const fn fetch(width: u32) -> Self {
        if width == 8 {
            AtomicOp::MaskedFetchAdd64 { add: 0, boundary: 0 }
        } else {
            AtomicOp::MaskedFetchAdd32 { add: 0, boundary: 0 }
        }
    }
    const fn masked_cs(width: u32, swap: u64, compare: u64, swap_mask: u64, compare_mask: u64) -> Self {
        if width == 8 {
            AtomicOp::MaskedCompareSwap64 {
                swap,
                compare,
                swap_mask,
                compare_mask,
            }
        } else {
            AtomicOp::MaskedCompareSwap32 {
                swap: swap as u32,
                compare: compare as u32,
                swap_mask: swap_mask as u32,
                compare_mask: compare_mask as u32,
            }
        }
    }

    /// Operand width in bytes.
    pub const fn width(&self) -> u32 {
        match self {
            AtomicOp::FetchAdd64 { .. }
            | AtomicOp::CompareSwap64 { .. }
            | AtomicOp::MaskedFetchAdd64 { .. }
            | AtomicOp::MaskedCompareSwap64 { .. } => 8,
            _ => 4,
        }
    }
    /// (opcode, opmod, ds) of the WQE.
    pub const fn encoding(&self) -> (u8, u8, u8) {
        match self {
            AtomicOp::FetchAdd64 { .. } => (opcode::ATOMIC_FA, 0, wqe_ds::ATOMIC),
            AtomicOp::CompareSwap64 { .. } => (opcode::ATOMIC_CS, 0, wqe_ds::ATOMIC),
            AtomicOp::MaskedFetchAdd32 { .. } => (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_4B, wqe_ds::ATOMIC),
            AtomicOp::MaskedFetchAdd64 { .. } => (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_8B, wqe_ds::ATOMIC),
            AtomicOp::MaskedCompareSwap32 { .. } => (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_4B, wqe_ds::ATOMIC),
            AtomicOp::MaskedCompareSwap64 { .. } => {
                (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_8B, wqe_ds::MASKED_CS_64)
            }
        }
    }
    /// The atomic segment(s): one, or two for the 8-byte masked CS.
    pub fn segments(&self) -> (Segment, Option<Segment>) {
        match *self {
            AtomicOp::FetchAdd64 { add } => (
                words(AtomicSeg {
                    swap_add: Be64::new(add),
                    compare: Be64::new(0),
                }),
                None,
            ),
            AtomicOp::CompareSwap64 { compare, swap } => (
                words(AtomicSeg {
                    swap_add: Be64::new(swap),
                    compare: Be64::new(compare),
                }),
                None,
            ),
            AtomicOp::MaskedFetchAdd32 { add, boundary } => (
                words(MaskedFa32Seg {
                    add: Be32::new(add),
                    field_boundary: Be32::new(boundary),
                    reserved: [0; 2],
                }),
                None,
            ),
            AtomicOp::MaskedFetchAdd64 { add, boundary } => (
                words(MaskedFa64Seg {
                    add: Be64::new(add),
                    field_boundary: Be64::new(boundary),
                }),
                None,
            ),
            AtomicOp::MaskedCompareSwap32 {
                swap,
                compare,
                swap_mask,
                compare_mask,
            } => (
                words(MaskedCs32Seg {
                    swap: Be32::new(swap),
                    compare: Be32::new(compare),
                    swap_mask: Be32::new(swap_mask),
                    compare_mask: Be32::new(compare_mask),
                }),
                None,
            ),
            AtomicOp::MaskedCompareSwap64 {
                swap,
                compare,
                swap_mask,
                compare_mask,
            } => {
                let both: [Segment; 2] = {
                    let s = MaskedCs64Seg {
                        swap: Be64::new(swap),
                        compare: Be64::new(compare),
                        swap_mask: Be64::new(swap_mask),
                        compare_mask: Be64::new(compare_mask),
                    };
                    // SAFETY: 32 bytes of plain-old-data without padding.
                    unsafe { core::mem::transmute_copy(&s) }
                };
                (both[0], Some(both[1]))
            }
        }
    }
}

/// The inline segment header plus up to 12 payload bytes, then further 16-byte chunks.
/// `chunk(i)` returns the i-th 16-byte unit of the inline part.
#[inline(always)]
pub fn inline_chunk(data: &[u8], i: usize) -> Segment {
    debug_assert!(data.len() as u32 <= MAX_INLINE_BYTES);
    let mut b = [0u8; 16];
    let (start, out) = if i == 0 {
        b[..4].copy_from_slice(&Be32::new(data.len() as u32 | INLINE_SEG).to_raw().to_ne_bytes());
        (0usize, 4usize)
    } else {
        (12 + (i - 1) * 16, 0usize)
    };
    let mut k = 0;
    while out + k < 16 && start + k < data.len() {
        b[out + k] = data[start + k];
        k += 1;
    }
    // SAFETY: 16 bytes reinterpreted as four native words.
    unsafe { core::mem::transmute::<[u8; 16], Segment>(b) }
}

/// Largest inline payload of a one-WQEBB WQE: ctrl, raddr and the inline header leave 28 bytes.
pub const ONE_WQEBB_INLINE_BYTES: u32 = 28;

/// Inline segment `i` (0 or 1) of a one-WQEBB inline WRITE of `len` bytes (at most
/// [`ONE_WQEBB_INLINE_BYTES`]) held in `payload` as little-endian words: the header and payload
/// bytes 0..12, then bytes 12..28.
#[inline(always)]
pub fn inline_words(payload: &[u64; 4], len: u32, i: usize) -> Segment {
    debug_assert!(len <= ONE_WQEBB_INLINE_BYTES);
    if i == 0 {
        [
            Be32::new(len | INLINE_SEG).to_raw(),
            payload[0] as u32,
            (payload[0] >> 32) as u32,
            payload[1] as u32,
        ]
    } else {
        [
            (payload[1] >> 32) as u32,
            payload[2] as u32,
            (payload[2] >> 32) as u32,
            payload[3] as u32,
        ]
    }
}

/// Where a send queue's WQEBBs live.
#[derive(Clone, Copy)]
pub struct SendQueue {
    /// First byte of the ring.
    pub base: u64,
    /// `depth - 1` (depth in WQEBBs, a power of two).
    pub mask: u64,
}

impl SendQueue {
    /// Address of the `j`-th 16-byte segment of the WQE starting at WQEBB `index`.
    #[inline(always)]
    pub fn segment(&self, index: u64, j: u32) -> *mut Segment {
        let bb = (index + (j / 4) as u64) & self.mask;
        (self.base + (bb << 6) + ((j % 4) as u64) * 16) as *mut Segment
    }

    /// Writes segment `j` of the WQE at `index`.
    ///
    /// # Safety
    /// `[index, index + wqebbs)` is reserved by this thread and the ring is live memory.
    #[inline(always)]
    pub unsafe fn write(&self, index: u64, j: u32, seg: Segment) {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe { arch::store_v4(self.segment(index, j), seg) }
    }

    /// Writes the one-WQEBB RDMA WQE `code` (WRITE, WRITE_IMM with `imm`, or READ) of `len` bytes
    /// between local `laddr` (key `lkey`) and remote `raddr` (key `rkey`) at `index`; `fm` is the
    /// ctrl segment's `fm_ce_se`.
    ///
    /// # Safety
    /// As [`SendQueue::write`], for WQEBB `index`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_rdma(
        &self,
        index: u64,
        code: u8,
        imm: u32,
        qpn: u32,
        fm: u8,
        raddr: u64,
        rkey: u32,
        len: u32,
        laddr: u64,
        lkey: u32,
    ) {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            self.write(index, 0, ctrl(index as u16, code, 0, qpn, fm, wqe_ds::RDMA, imm));
            self.write(index, 1, self::raddr(raddr, rkey));
            self.write(index, 2, data(len, lkey, laddr));
        }
    }

    /// Writes the atomic WQE `op` on `raddr` (key `rkey`) at `index`, its previous value landing
    /// at `laddr` (key `lkey`); `fm` is the ctrl segment's `fm_ce_se`.
    ///
    /// # Safety
    /// As [`SendQueue::write`], for the WQE's `wqebbs(op.encoding().2)` WQEBBs.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_atomic(
        &self,
        index: u64,
        op: &AtomicOp,
        qpn: u32,
        fm: u8,
        raddr: u64,
        rkey: u32,
        laddr: u64,
        lkey: u32,
    ) {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            let (code, op_mod, ds) = op.encoding();
            let (first, second) = op.segments();
            self.write(index, 0, ctrl(index as u16, code, op_mod, qpn, fm, ds, 0));
            self.write(index, 1, self::raddr(raddr, rkey));
            self.write(index, 2, first);
            let mut j = 3;
            if let Some(s) = second {
                self.write(index, 3, s);
                j = 4;
            }
            self.write(index, j, data(op.width(), lkey, laddr));
        }
    }
}

//! Decoding and validating one send WQE from its bytes, as strictly as a ConnectX does.
//!
//! Pure and total: any byte string yields a [`Wqe`] or a syndrome, never a panic (fuzzed by
//! `tests/tests/emu_fuzz.rs`). Checks that need the memory tables (keys, bounds, access) are the
//! engine's.

use ibgda_abi::mlx5::{opcode, opmod, syndrome, wqe_ds, INLINE_SEG, MAX_INLINE_BYTES, MAX_MESSAGE_BYTES};
use ibgda_device::ibgda::AtomicOp;

/// Largest WQE the device accepts, in bytes (four WQEBBs, 16 DS).
pub const MAX_WQE_BYTES: usize = 256;
/// Largest DS count the device accepts.
pub const MAX_WQE_DS: u8 = (MAX_WQE_BYTES / 16) as u8;
/// Most scatter/gather entries in one RDMA WQE.
pub const MAX_SGES: usize = 4;

/// One local scatter/gather entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Local address.
    pub addr: u64,
    /// Length in bytes (never 0 after parsing).
    pub len: u32,
    /// Local key.
    pub lkey: u32,
}

/// What a WQE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeOp {
    /// Nothing; completes.
    Nop,
    /// RDMA WRITE (or WRITE_IMM) gathering from `sges[..n_sges]`.
    Write {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Gather list.
        sges: [Sge; MAX_SGES],
        /// Entries used.
        n_sges: u8,
    },
    /// RDMA WRITE of inline data: `len` bytes at byte `offset` of the WQE.
    WriteInline {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Offset of the payload in the WQE bytes.
        offset: u8,
        /// Payload length.
        len: u32,
    },
    /// RDMA READ scattering into `sges[..n_sges]`.
    Read {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Scatter list.
        sges: [Sge; MAX_SGES],
        /// Entries used.
        n_sges: u8,
    },
    /// An atomic; the previous value lands in `result`.
    Atomic {
        /// The operation and its operands.
        op: AtomicOp,
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Where the previous value goes (exactly the operand width).
        result: Sge,
    },
}

/// A decoded, well-formed WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wqe {
    /// mlx5 opcode.
    pub opcode: u8,
    /// 16-bit WQE index from the ctrl segment.
    pub wqe_index: u16,
    /// Size in DS units.
    pub ds: u8,
    /// Whether a CQE is requested (`CQ_UPDATE`).
    pub signaled: bool,
    /// Immediate data (WRITE_IMM), as stored.
    pub imm: u32,
    /// The operation.
    pub op: WqeOp,
}

/// Why a WQE was rejected: the syndrome of its error CQE and the opcode to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// An `mlx5::syndrome` value.
    pub syndrome: u8,
    /// The WQE's opcode byte.
    pub opcode: u8,
}

#[inline(always)]
fn be32(b: &[u8; MAX_WQE_BYTES], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn be64(b: &[u8; MAX_WQE_BYTES], at: usize) -> u64 {
    ((be32(b, at) as u64) << 32) | be32(b, at + 4) as u64
}

#[inline(always)]
fn sge_at(b: &[u8; MAX_WQE_BYTES], at: usize) -> Sge {
    Sge {
        len: be32(b, at),
        lkey: be32(b, at + 4),
        addr: be64(b, at + 8),
    }
}

/// WQEBBs a WQE with this DS count occupies (at least one, even for a malformed DS of 0).
#[inline(always)]
pub const fn wqebbs_of(ds: u8) -> u32 {
    let n = wqe_ds::wqebbs(ds);
    if n == 0 {
        1
    } else {
        n
    }
}

/// Decodes the WQE in `bytes` (its WQEBBs gathered in order; only the first `ds * 16` bytes are
/// meaningful), which must carry `qpn` and the 16-bit index `index`.
pub fn parse(bytes: &[u8; MAX_WQE_BYTES], qpn: u32, index: u16) -> Result<Wqe, Rejected> {
    let word0 = be32(bytes, 0);
    let word1 = be32(bytes, 4);
    let code = word0 as u8;
    let op_mod = (word0 >> 24) as u8;
    let reject = |s: u8| {
        Err(Rejected {
            syndrome: s,
            opcode: code,
        })
    };
    if word1 >> 8 != qpn || ((word0 >> 8) as u16) != index {
        return reject(syndrome::LOCAL_QP_OP_ERR);
    }
    let ds = word1 as u8;
    if ds == 0 || ds > MAX_WQE_DS {
        return reject(syndrome::LOCAL_QP_OP_ERR);
    }
    let fm = bytes[11];
    let imm = u32::from_ne_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let wqe = |op| {
        Ok(Wqe {
            opcode: code,
            wqe_index: index,
            ds,
            signaled: fm & 0x08 != 0,
            imm,
            op,
        })
    };
    let raddr = be64(bytes, 16);
    let rkey = be32(bytes, 24);
    match code {
        opcode::NOP => {
            if op_mod != 0 {
                return reject(syndrome::LOCAL_QP_OP_ERR);
            }
            wqe(WqeOp::Nop)
        }
        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM | opcode::RDMA_READ => {
            if op_mod != 0 || ds < wqe_ds::RDMA {
                return reject(syndrome::LOCAL_QP_OP_ERR);
            }
            let first = be32(bytes, 32);
            if first & INLINE_SEG != 0 {
                if code == opcode::RDMA_READ {
                    return reject(syndrome::LOCAL_QP_OP_ERR);
                }
                let len = first & !INLINE_SEG;
                if len == 0 || len > MAX_INLINE_BYTES {
                    return reject(syndrome::LOCAL_LENGTH_ERR);
                }
                if ds != wqe_ds::inline_write(len) {
                    return reject(syndrome::LOCAL_QP_OP_ERR);
                }
                return wqe(WqeOp::WriteInline {
                    raddr,
                    rkey,
                    offset: 36,
                    len,
                });
            }
            let n = (ds - 2) as usize;
            if n > MAX_SGES {
                return reject(syndrome::LOCAL_QP_OP_ERR);
            }
            let mut sges = [Sge::default(); MAX_SGES];
            let mut total: u64 = 0;
            let mut i = 0;
            while i < n {
                let s = sge_at(bytes, 32 + 16 * i);
                // byte_count 0 means 2 GiB to a ConnectX: above our message limit either way.
                if s.len == 0 || s.len & INLINE_SEG != 0 {
                    return reject(syndrome::LOCAL_LENGTH_ERR);
                }
                total += s.len as u64;
                sges[i] = s;
                i += 1;
            }
            if total > MAX_MESSAGE_BYTES {
                return reject(syndrome::LOCAL_LENGTH_ERR);
            }
            let n_sges = n as u8;
            if code == opcode::RDMA_READ {
                wqe(WqeOp::Read {
                    raddr,
                    rkey,
                    sges,
                    n_sges,
                })
            } else {
                wqe(WqeOp::Write {
                    raddr,
                    rkey,
                    sges,
                    n_sges,
                })
            }
        }
        opcode::ATOMIC_FA | opcode::ATOMIC_CS | opcode::ATOMIC_MASKED_FA | opcode::ATOMIC_MASKED_CS => {
            let op = match (code, op_mod) {
                (opcode::ATOMIC_FA, 0) => AtomicOp::FetchAdd64 { add: be64(bytes, 32) },
                (opcode::ATOMIC_CS, 0) => AtomicOp::CompareSwap64 {
                    swap: be64(bytes, 32),
                    compare: be64(bytes, 40),
                },
                (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_4B) => AtomicOp::MaskedFetchAdd32 {
                    add: be32(bytes, 32),
                    boundary: be32(bytes, 36),
                },
                (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_8B) => AtomicOp::MaskedFetchAdd64 {
                    add: be64(bytes, 32),
                    boundary: be64(bytes, 40),
                },
                (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_4B) => AtomicOp::MaskedCompareSwap32 {
                    swap: be32(bytes, 32),
                    compare: be32(bytes, 36),
                    swap_mask: be32(bytes, 40),
                    compare_mask: be32(bytes, 44),
                },
                (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_8B) => AtomicOp::MaskedCompareSwap64 {
                    swap: be64(bytes, 32),
                    compare: be64(bytes, 40),
                    swap_mask: be64(bytes, 48),
                    compare_mask: be64(bytes, 56),
                },
                _ => return reject(syndrome::LOCAL_QP_OP_ERR),
            };
            let (_, _, want_ds) = op.encoding();
            if ds != want_ds {
                return reject(syndrome::LOCAL_QP_OP_ERR);
            }
            let result = sge_at(bytes, 16 * (ds as usize - 1));
            if result.len != op.width() {
                return reject(syndrome::LOCAL_LENGTH_ERR);
            }
            wqe(WqeOp::Atomic {
                op,
                raddr,
                rkey,
                result,
            })
        }
        _ => reject(syndrome::LOCAL_QP_OP_ERR),
    }
}

/// Applies a masked or plain atomic to `old`, returning the new value (the engine stores it when
/// it differs). Widths are handled by the caller (4-byte ops see the low 32 bits).
pub fn apply_atomic(op: &AtomicOp, old: u64) -> u64 {
    match *op {
        AtomicOp::FetchAdd64 { add } => old.wrapping_add(add),
        AtomicOp::CompareSwap64 { compare, swap } => {
            if old == compare {
                swap
            } else {
                old
            }
        }
        AtomicOp::MaskedFetchAdd32 { add, boundary } => field_add(old, add as u64, boundary as u64, 32),
        AtomicOp::MaskedFetchAdd64 { add, boundary } => field_add(old, add, boundary, 64),
        AtomicOp::MaskedCompareSwap32 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => masked_cs(old, swap as u64, compare as u64, swap_mask as u64, compare_mask as u64) & 0xffff_ffff,
        AtomicOp::MaskedCompareSwap64 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => masked_cs(old, swap, compare, swap_mask, compare_mask),
    }
}

#[inline(always)]
fn masked_cs(old: u64, swap: u64, compare: u64, swap_mask: u64, compare_mask: u64) -> u64 {
    if old & compare_mask == compare & compare_mask {
        (old & !swap_mask) | (swap & swap_mask)
    } else {
        old
    }
}

/// Adds `add` to `old` field by field; a set bit of `boundary` is the top bit of a field, so no
/// carry crosses it.
fn field_add(old: u64, add: u64, boundary: u64, width: u32) -> u64 {
    let mut out = 0u64;
    let mut start = 0u32;
    let mut bit = 0u32;
    while bit < width {
        if boundary >> bit & 1 == 1 || bit == width - 1 {
            let len = bit - start + 1;
            let mask = if len == 64 {
                u64::MAX
            } else {
                ((1u64 << len) - 1) << start
            };
            out |= ((old & mask).wrapping_add(add & mask)) & mask;
            start = bit + 1;
        }
        bit += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_atomics_implement_the_shmem_operations() {
        let cases: [(AtomicOp, u64, u64); 10] = [
            (AtomicOp::add(8, 5), 10, 15),
            (AtomicOp::add(4, 1), 0xffff_ffff, 0),
            (AtomicOp::xor(8, 0b1100), 0b1010, 0b0110),
            (AtomicOp::xor(4, 0xffff_ffff), 0x1234_5678, 0xedcb_a987),
            (AtomicOp::and(8, 0xff00), 0x1234, 0x1200),
            (AtomicOp::or(4, 0x0f), 0xf0, 0xff),
            (AtomicOp::swap(8, 7), 99, 7),
            (AtomicOp::compare_swap(4, 3, 9), 3, 9),
            (AtomicOp::compare_swap(4, 4, 9), 3, 3),
            (AtomicOp::fetch(8), 42, 42),
        ];
        for (op, old, new) in cases {
            assert_eq!(apply_atomic(&op, old), new, "{op:?} on {old:#x}");
        }
        // Two 16-bit fields: the carry out of the low field is dropped.
        let op = AtomicOp::MaskedFetchAdd32 {
            add: 0x0001_0001,
            boundary: 0x8000_8000,
        };
        assert_eq!(apply_atomic(&op, 0x0001_ffff), 0x0002_0000);
    }
}

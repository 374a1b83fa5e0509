//! A batch lane's WQE decoder: the one-WQEBB RDMA WRITE, WRITE_IMM, READ, atomic and NOP WQEs the
//! lanes of a warp execute together, decoded from the eight words a lane loaded (registers on a GPU, where
//! the byte array [`parse`](super::parse::parse) takes lives in local memory). Held to the parser
//! both ways by `tests/tests/emu_fuzz.rs`.

/// A single-WQEBB WQE of the kinds a lane executes in a batch, decoded straight from its eight
/// words (in registers on a GPU, where the byte array [`parse`](super::parse::parse) takes lives in local memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneWqe {
    /// mlx5 opcode (RDMA_WRITE, RDMA_WRITE_IMM or RDMA_READ).
    pub opcode: u8,
    /// The WQE's 16-bit index.
    pub wqe_index: u16,
    /// A CQE is requested.
    pub signaled: bool,
    /// Remote address and key.
    pub raddr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Local address of the one gather/scatter entry (0 for inline data).
    pub laddr: u64,
    /// Its local key.
    pub lkey: u32,
    /// Bytes moved.
    pub len: u32,
    /// Offset of inline data in the WQE (36), or 0.
    pub inline_offset: u8,
    /// The ctrl segment asks for a fence (any fence mode): the WQE may only start a batch.
    pub fenced: bool,
    /// The atomic the WQE performs (ATOMIC_FA, ATOMIC_CS and the masked forms); its result lands
    /// at `laddr` (key `lkey`), `len` bytes (the operand width).
    pub atomic: Option<AtomicOp>,
    /// WQEBBs the WQE spans: 1, or 2 for the 8-byte masked compare-and-swap (whose result entry is
    /// the first 16 bytes of the next WQEBB).
    pub wqebbs: u8,
}

use ibgda_device::arch;
use ibgda_device::ibgda::AtomicOp;

/// The big-endian 32-bit field at byte `at` (a multiple of 4) of a WQEBB held as little-endian
/// words.
#[inline(always)]
fn be32_at(words: &[u64; 8], at: usize) -> u32 {
    ((words[at / 8] >> (8 * (at % 8))) as u32).swap_bytes()
}

#[inline(always)]
fn be64_at(words: &[u64; 8], at: usize) -> u64 {
    ((be32_at(words, at) as u64) << 32) | be32_at(words, at + 4) as u64
}

/// Whether a WQEBB whose first word is `word0` (little-endian, as loaded), read as a WQE's first
/// WQEBB, claims two WQEBBs: the lanes find where WQEs start with it before they decode.
#[inline(always)]
pub fn claims_two_wqebbs(word0: u64) -> bool {
    let ds = (word0 >> 56) as u8;
    super::parse::wqebbs_of(ds) == 2
}

/// Decodes the WQEBB `words` as a lane does (`next`: the first 16 bytes of the WQEBB after it,
/// read only for a two-WQEBB WQE): `Some` exactly when [`parse`](super::parse::parse) would accept
/// it as a one-WQEBB RDMA WRITE or WRITE_IMM with one gather entry or inline data, an RDMA READ
/// with one scatter entry, an atomic (FA, CS, masked FA of 4 or 8 bytes, masked CS of 4, and the
/// two-WQEBB masked CS of 8) or a NOP, with the same fields (`tests/tests/emu_fuzz.rs` checks both directions). A
/// fence mode is reported (`fenced`), not refused: the batch rules let such a WQE only start a
/// batch. Everything else — other opcodes, more entries, several WQEBBs, malformed WQEs — is `None`
/// and goes through the one-at-a-time path, which produces the exact syndrome.
#[inline(always)]
pub fn decode_lane(words: &[u64; 8], next: [u64; 2], qpn: u32, index: u16) -> Option<LaneWqe> {
    use ibgda_abi::mlx5::{opcode, opmod, wqe_ds, INLINE_SEG, MAX_INLINE_BYTES, MAX_MESSAGE_BYTES};
    let word0 = be32_at(words, 0);
    let word1 = be32_at(words, 4);
    let code = word0 as u8;
    let op_mod = (word0 >> 24) as u8;
    let ds = word1 as u8;
    if word1 >> 8 != qpn || (word0 >> 8) as u16 != index {
        return None;
    }
    let fm_ce_se = be32_at(words, 8) as u8;
    let mut w = LaneWqe {
        opcode: code,
        wqe_index: index,
        signaled: fm_ce_se & 0x08 != 0,
        fenced: fence_requested(fm_ce_se),
        raddr: be64_at(words, 16),
        rkey: be32_at(words, 24),
        wqebbs: 1,
        ..LaneWqe::default()
    };
    match code {
        opcode::NOP => {
            return (op_mod == 0 && (1..=4).contains(&ds)).then_some(LaneWqe { raddr: 0, rkey: 0, ..w });
        }
        opcode::ATOMIC_FA | opcode::ATOMIC_CS | opcode::ATOMIC_MASKED_FA | opcode::ATOMIC_MASKED_CS => {
            let op = match (code, op_mod) {
                (opcode::ATOMIC_FA, 0) => AtomicOp::FetchAdd64 {
                    add: be64_at(words, 32),
                },
                (opcode::ATOMIC_CS, 0) => AtomicOp::CompareSwap64 {
                    swap: be64_at(words, 32),
                    compare: be64_at(words, 40),
                },
                (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_4B) => AtomicOp::MaskedFetchAdd32 {
                    add: be32_at(words, 32),
                    boundary: be32_at(words, 36),
                },
                (opcode::ATOMIC_MASKED_FA, opmod::EXT_ATOMIC_8B) => AtomicOp::MaskedFetchAdd64 {
                    add: be64_at(words, 32),
                    boundary: be64_at(words, 40),
                },
                (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_4B) => AtomicOp::MaskedCompareSwap32 {
                    swap: be32_at(words, 32),
                    compare: be32_at(words, 36),
                    swap_mask: be32_at(words, 40),
                    compare_mask: be32_at(words, 44),
                },
                (opcode::ATOMIC_MASKED_CS, opmod::EXT_ATOMIC_8B) => AtomicOp::MaskedCompareSwap64 {
                    swap: be64_at(words, 32),
                    compare: be64_at(words, 40),
                    swap_mask: be64_at(words, 48),
                    compare_mask: be64_at(words, 56),
                },
                _ => return None,
            };
            let (_, _, want_ds) = op.encoding();
            if ds != want_ds {
                return None;
            }
            // The result's scatter entry is the last segment: byte 48 of a one-WQEBB atomic, the
            // next WQEBB's first 16 bytes for the two-WQEBB one.
            let (len, lkey, laddr) = if ds == wqe_ds::ATOMIC {
                (be32_at(words, 48), be32_at(words, 52), be64_at(words, 56))
            } else {
                let entry = [next[0], next[1], 0, 0, 0, 0, 0, 0];
                w.wqebbs = 2;
                (be32_at(&entry, 0), be32_at(&entry, 4), be64_at(&entry, 8))
            };
            if len != op.width() {
                return None;
            }
            w.len = len;
            w.lkey = lkey;
            w.laddr = laddr;
            w.atomic = Some(op);
            return Some(w);
        }
        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM | opcode::RDMA_READ => {}
        _ => return None,
    }
    if op_mod != 0 || !(wqe_ds::RDMA..=4).contains(&ds) {
        return None;
    }
    let first = be32_at(words, 32);
    if first & INLINE_SEG != 0 {
        let len = first & !INLINE_SEG;
        if code == opcode::RDMA_READ || len == 0 || len > MAX_INLINE_BYTES || ds != wqe_ds::inline_write(len) {
            return None;
        }
        w.len = len;
        w.inline_offset = 36;
        return Some(w);
    }
    if ds != wqe_ds::RDMA || first == 0 || first as u64 > MAX_MESSAGE_BYTES {
        return None;
    }
    w.len = first;
    w.lkey = be32_at(words, 36);
    w.laddr = be64_at(words, 40);
    Some(w)
}

/// Whether a ctrl segment's `fm_ce_se` byte asks for a fence (any fence mode): the WQE then waits
/// for the QP's earlier READs and atomics (under the rate model) and only starts a batch.
#[inline(always)]
pub fn fence_requested(fm_ce_se: u8) -> bool {
    fm_ce_se & ibgda_abi::mlx5::fm_ce_se::FENCE_MODE_MASK != 0 && !arch::mutant(arch::Mutant::IgnoredFence)
}

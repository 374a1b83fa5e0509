//! Fuzzing the emulated device's WQE parser: arbitrary bytes, and valid WQEs with random bytes
//! flipped, must yield a decoded WQE or a syndrome — never a panic — and whatever is accepted must
//! be internally consistent. A bounded run (thousands of cases) is part of the test suite.

use ibgda_abi::mlx5::{fm_ce_se, opcode, syndrome, wqe_ds, MAX_INLINE_BYTES};
use ibgda_device::ibgda::{wqe, AtomicOp};
use ibgda_nic_emu::decode_lane;
use ibgda_nic_emu::parse::{parse, WqeOp, MAX_SGES, MAX_WQE_BYTES, MAX_WQE_DS};
use proptest::prelude::*;

fn check_consistent(bytes: &[u8; MAX_WQE_BYTES], qpn: u32, index: u16) {
    match parse(bytes, qpn, index) {
        Ok(w) => {
            assert!(w.ds >= 1 && w.ds <= MAX_WQE_DS);
            assert_eq!(w.wqe_index, index);
            match w.op {
                WqeOp::Write { n_sges, sges, .. } | WqeOp::Read { n_sges, sges, .. } => {
                    assert!((1..=MAX_SGES as u8).contains(&n_sges));
                    assert!(sges[..n_sges as usize].iter().all(|s| s.len > 0));
                }
                WqeOp::WriteInline { len, offset, .. } => {
                    assert!((1..=MAX_INLINE_BYTES).contains(&len) && offset as usize + len as usize <= MAX_WQE_BYTES);
                    assert_eq!(w.ds, wqe_ds::inline_write(len));
                }
                WqeOp::Atomic { op, result, .. } => assert_eq!(result.len, op.width()),
                WqeOp::Nop => {}
            }
        }
        Err(r) => assert!(
            [syndrome::LOCAL_QP_OP_ERR, syndrome::LOCAL_LENGTH_ERR].contains(&r.syndrome),
            "parser-level errors are QP-operation or length errors: {r:?}"
        ),
    }
}

/// A valid WQE of each kind, as bytes.
fn valid(kind: u8, qpn: u32, index: u16) -> [u8; MAX_WQE_BYTES] {
    let mut segs: Vec<[u32; 4]> = Vec::new();
    match kind % 4 {
        0 => {
            segs.push(wqe::ctrl(index, opcode::RDMA_WRITE, 0, qpn, fm_ce_se::CQ_UPDATE, 3, 0));
            segs.push(wqe::raddr(0x1000, 7));
            segs.push(wqe::data(64, 9, 0x2000));
        }
        1 => {
            segs.push(wqe::ctrl(index, opcode::RDMA_READ, 0, qpn, 0, 3, 0));
            segs.push(wqe::raddr(0x1000, 7));
            segs.push(wqe::data(64, 9, 0x2000));
        }
        2 => {
            let op = AtomicOp::MaskedCompareSwap64 {
                swap: 1,
                compare: 2,
                swap_mask: 3,
                compare_mask: 4,
            };
            let (code, m, ds) = op.encoding();
            let (a, b) = op.segments();
            segs.push(wqe::ctrl(index, code, m, qpn, 0, ds, 0));
            segs.push(wqe::raddr(0x1000, 7));
            segs.push(a);
            segs.push(b.unwrap());
            segs.push(wqe::data(8, 9, 0x2000));
        }
        _ => {
            let data = [0xabu8; 40];
            let ds = wqe_ds::inline_write(40);
            segs.push(wqe::ctrl(index, opcode::RDMA_WRITE, 0, qpn, 0, ds, 0));
            segs.push(wqe::raddr(0x1000, 7));
            for c in 0..(ds as usize - 2) {
                segs.push(wqe::inline_chunk(&data, c));
            }
        }
    }
    let mut out = [0u8; MAX_WQE_BYTES];
    for (i, s) in segs.iter().enumerate() {
        for (k, w) in s.iter().enumerate() {
            out[i * 16 + k * 4..][..4].copy_from_slice(&w.to_ne_bytes());
        }
    }
    out
}

/// The lane decoder ([`decode_lane`], what each lane of the GPU engine runs on the WQEBB in its
/// registers) against the parser: it accepts exactly the one-WQEBB WRITE, WRITE_IMM (one gather
/// entry or inline data), READ (one scatter entry), atomic (the two-WQEBB masked compare-and-swap
/// too) and NOP WQEs that the parser accepts,
/// with the same fields (the fence mode reported, not refused); anything else it leaves to the
/// one-at-a-time path.
fn check_lane_decoder(bytes: &[u8; MAX_WQE_BYTES], qpn: u32, index: u16) {
    let mut words = [0u64; 8];
    for (k, w) in words.iter_mut().enumerate() {
        *w = u64::from_le_bytes(bytes[8 * k..8 * k + 8].try_into().unwrap());
    }
    let next = [
        u64::from_le_bytes(bytes[64..72].try_into().unwrap()),
        u64::from_le_bytes(bytes[72..80].try_into().unwrap()),
    ];
    let lane = decode_lane(&words, next, qpn, index);
    let parsed = parse(bytes, qpn, index);
    let fenced = bytes[11] & ibgda_abi::mlx5::fm_ce_se::FENCE_MODE_MASK != 0;
    type Fields = (u8, bool, bool, u64, u32, u64, u32, u32, u8, Option<AtomicOp>);
    let expect: Option<Fields> = match parsed {
        // One WQEBB, or the two of the 8-byte masked compare-and-swap.
        Ok(w)
            if w.ds <= 4
                || matches!(
                    w.op,
                    WqeOp::Atomic {
                        op: AtomicOp::MaskedCompareSwap64 { .. },
                        ..
                    }
                ) =>
        {
            match w.op {
                WqeOp::Write {
                    raddr,
                    rkey,
                    sges,
                    n_sges: 1,
                }
                | WqeOp::Read {
                    raddr,
                    rkey,
                    sges,
                    n_sges: 1,
                } => Some((
                    w.opcode,
                    w.signaled,
                    fenced,
                    raddr,
                    rkey,
                    sges[0].addr,
                    sges[0].lkey,
                    sges[0].len,
                    0u8,
                    None,
                )),
                WqeOp::WriteInline {
                    raddr,
                    rkey,
                    offset,
                    len,
                } => Some((w.opcode, w.signaled, fenced, raddr, rkey, 0, 0, len, offset, None)),
                WqeOp::Atomic {
                    op,
                    raddr,
                    rkey,
                    result,
                } => Some((
                    w.opcode,
                    w.signaled,
                    fenced,
                    raddr,
                    rkey,
                    result.addr,
                    result.lkey,
                    result.len,
                    0,
                    Some(op),
                )),
                WqeOp::Nop => Some((w.opcode, w.signaled, fenced, 0, 0, 0, 0, 0, 0, None)),
                _ => None,
            }
        }
        _ => None,
    };
    let got = lane.map(|l| {
        assert_eq!(l.wqe_index, index);
        (
            l.opcode,
            l.signaled,
            l.fenced,
            l.raddr,
            l.rkey,
            l.laddr,
            l.lkey,
            l.len,
            l.inline_offset,
            l.atomic,
        )
    });
    assert_eq!(
        got,
        expect,
        "lane decoder vs parser on {:02x?}: parser said {parsed:?}",
        &bytes[..64]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), MAX_WQE_BYTES), qpn in any::<u32>(), index in any::<u16>()) {
        let b: [u8; MAX_WQE_BYTES] = bytes.try_into().unwrap();
        check_consistent(&b, qpn & 0xff_ffff, index);
        check_lane_decoder(&b, qpn & 0xff_ffff, index);
        // Also with the QPN and index the bytes claim, so deeper checks are reached.
        let claimed_qpn = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) >> 8;
        let claimed_index = u16::from_be_bytes([b[1], b[2]]);
        check_consistent(&b, claimed_qpn, claimed_index);
        check_lane_decoder(&b, claimed_qpn, claimed_index);
    }

    #[test]
    fn mutated_valid_wqes_never_panic(kind in any::<u8>(), flips in proptest::collection::vec((0usize..80, any::<u8>()), 0..6)) {
        let (qpn, index) = (0x123, 0x4567);
        let mut b = valid(kind, qpn, index);
        if flips.is_empty() {
            prop_assert!(parse(&b, qpn, index).is_ok(), "an unmutated valid WQE must parse");
        }
        for (at, v) in flips {
            b[at] ^= v;
        }
        check_consistent(&b, qpn, index);
        check_lane_decoder(&b, qpn, index);
    }

    /// One-WQEBB WQEs of the lane kinds, with random fields and a few bytes flipped.
    #[test]
    fn the_lane_decoder_agrees_with_the_parser(
        kind in 0u8..10, len in 0u32..40, raddr in any::<u64>(), rkey in any::<u32>(), laddr in any::<u64>(),
        lkey in any::<u32>(), signaled in any::<bool>(), flips in proptest::collection::vec((0usize..64, any::<u8>()), 0..3),
    ) {
        let (qpn, index) = (0x321, 0x89ab);
        let code = [opcode::RDMA_WRITE, opcode::RDMA_WRITE_IMM, opcode::RDMA_READ, opcode::RDMA_WRITE][kind.min(3) as usize];
        let fm = if signaled { fm_ce_se::CQ_UPDATE } else { 0 };
        let mut segs = Vec::new();
        if kind >= 4 {
            // Atomics of every one-WQEBB kind (and the two-WQEBB masked CS), and a NOP.
            let ops = [
                AtomicOp::add(8, raddr),
                AtomicOp::compare_swap(8, laddr, raddr),
                AtomicOp::add(4, raddr),
                AtomicOp::xor(8, laddr),
                AtomicOp::and(4, raddr),
                AtomicOp::swap(8, raddr),
            ];
            if kind == 9 {
                segs.push(wqe::ctrl(index, opcode::NOP, 0, qpn, fm, 1, 0));
            } else {
                let op = ops[kind as usize - 4];
                let (c, m, ds) = op.encoding();
                let (a, b) = op.segments();
                segs.push(wqe::ctrl(index, c, m, qpn, fm | if len % 3 == 0 { fm_ce_se::INITIATOR_SMALL_FENCE } else { 0 }, ds, 0));
                segs.push(wqe::raddr(raddr & !7, rkey));
                segs.push(a);
                if let Some(b) = b {
                    segs.push(b);
                }
                segs.push(wqe::data(op.width(), lkey, laddr));
            }
        } else if kind == 3 {
            let data: Vec<u8> = (0..len as u8).collect();
            let ds = wqe_ds::inline_write(len);
            segs.push(wqe::ctrl(index, code, 0, qpn, fm, ds, 0));
            segs.push(wqe::raddr(raddr, rkey));
            for c in 0..(ds as usize - 2).min(2) {
                segs.push(wqe::inline_chunk(&data, c));
            }
            if len > 0 {
                segs[2][0] = (len | ibgda_abi::mlx5::INLINE_SEG).to_be();
            }
        } else {
            segs.push(wqe::ctrl(index, code, 0, qpn, fm, wqe_ds::RDMA, 0));
            segs.push(wqe::raddr(raddr, rkey));
            segs.push(wqe::data(len, lkey, laddr));
        }
        let mut b = [0u8; MAX_WQE_BYTES];
        for (i, s) in segs.iter().enumerate() {
            for (k, w) in s.iter().enumerate() {
                b[i * 16 + k * 4..][..4].copy_from_slice(&w.to_ne_bytes());
            }
        }
        for (at, v) in flips {
            b[at] ^= v;
        }
        check_lane_decoder(&b, qpn, index);
    }
}

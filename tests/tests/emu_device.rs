//! The emulated mlx5 device, driven by the device-side IBGDA code on CPU threads: every
//! operation's effect, and every bad input's exact syndrome (and that nothing was written).
//! The queue's life (doorbells, pauses, QP states, CQ modes, the GPU engine loop, batches) is
//! in `emu_queue.rs`.

use ibgda::emu::{access, QpState};
use ibgda::Error;
use ibgda_abi::mlx5::{opcode, syndrome};
use ibgda_abi::{ErrorKind, ErrorRecord};
use ibgda_device::ibgda::{wqe, AtomicOp, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use ibgda_tests::random_bytes;
use std::time::Duration;

use ibgda_tests::emu_harness::TWO_PES_HEAP as HEAP;

fn harness(timeout: Duration) -> Harness {
    Harness::two_pes(4, timeout)
}

#[test]
fn every_operation_does_what_the_wqe_says() {
    let h = harness(Duration::from_secs(10));
    let qp = h.qp(0, 1, 0);
    let (lkey, rkey) = (qp.heap_lkey(), qp.heap_rkey());
    let data = random_bytes(1, 3000);
    h.write(0, 0, &data);
    h.write(1, 8192, &[0u8; 64]);
    for (i, v) in [10u64, 0xf0f0, 0b1010, 5, 77, 0xffff_ffff_0000_0001].iter().enumerate() {
        h.write(1, 8192 + 8 * i as u64, &v.to_le_bytes());
    }
    let r = h.run(0, || {
        // WRITE, WRITE_IMM and inline WRITE.
        qp.test_rdma(Rdma::Write, h.addr(0, 0), lkey, h.addr(1, 100), rkey, 3000, false);
        qp.test_rdma(
            Rdma::WriteImm(0x1234),
            h.addr(0, 0),
            lkey,
            h.addr(1, 4000),
            rkey,
            16,
            false,
        );
        qp.post_inline_write(
            h.addr(1, 5000),
            rkey,
            b"inline payload that spans three WQEBBs: 48 bytes",
            false,
        );
        // READ back into PE 0.
        let end = qp.test_rdma(Rdma::Read, h.addr(0, 16384), lkey, h.addr(1, 100), rkey, 3000, true);
        qp.wait(end);
        // Atomics, each fetching into PE 0's heap.
        let results = 20000u64;
        let ops = [
            (AtomicOp::add(8, 5), 0u64),            // 10 -> 15
            (AtomicOp::and(8, 0xff00), 8),          // 0xf0f0 -> 0xf000
            (AtomicOp::xor(8, 0b0110), 16),         // 0b1010 -> 0b1100
            (AtomicOp::compare_swap(8, 5, 50), 24), // 5 -> 50
            (AtomicOp::swap(8, 99), 32),            // 77 -> 99
            (AtomicOp::or(4, 0xf0), 40),            // low half 0x00000001 -> 0xf1
        ];
        let mut end = 0;
        for (k, (op, off)) in ops.iter().enumerate() {
            let width = op.width() as u64;
            end = qp.test_atomic(
                *op,
                h.addr(0, results + 8 * k as u64),
                lkey,
                h.addr(1, 8192 + off),
                rkey,
                false,
            );
            let _ = width;
        }
        // A 4-byte masked CS that fails its comparison, and a fetch.
        qp.test_atomic(
            AtomicOp::compare_swap(4, 7, 8),
            h.addr(0, results + 64),
            lkey,
            h.addr(1, 8192 + 44),
            rkey,
            false,
        );
        end = end.max(qp.test_atomic(
            AtomicOp::fetch(8),
            h.addr(0, results + 72),
            lkey,
            h.addr(1, 8192),
            rkey,
            true,
        ));
        qp.wait(end);
        qp.quiet();
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(h.read(1, 100, 3000), data, "WRITE");
    assert_eq!(h.read(1, 4000, 16), data[..16], "WRITE_IMM");
    assert_eq!(
        &h.read(1, 5000, 48)[..],
        b"inline payload that spans three WQEBBs: 48 bytes"
    );
    assert_eq!(h.read(0, 16384, 3000), data, "READ");
    let word = |pe, off| u64::from_le_bytes(h.read(pe, off, 8).try_into().unwrap());
    assert_eq!(
        [0, 8, 16, 24, 32].map(|o| word(1, 8192 + o)),
        [15, 0xf000, 0b1100, 50, 99],
        "atomic results in memory"
    );
    assert_eq!(
        word(1, 8192 + 40),
        0xffff_ffff_0000_00f1,
        "4-byte or touched only its word"
    );
    assert_eq!(
        [0, 8, 16, 24, 32].map(|k| word(0, 20000 + k)),
        [10, 0xf0f0, 0b1010, 5, 77],
        "fetched previous values"
    );
    assert_eq!(
        u32::from_le_bytes(h.read(0, 20040, 4).try_into().unwrap()),
        1,
        "4-byte previous value"
    );
    assert_eq!(
        u32::from_le_bytes(h.read(0, 20064, 4).try_into().unwrap()),
        0xffff_ffff,
        "failed CS returns old"
    );
    assert_eq!(word(0, 20072), 15, "atomic fetch");
    let stats = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert_eq!(stats.state, QpState::Rts);
    assert!(stats.wqes_executed >= 12, "{stats:?}");
}

/// Posts one bad WQE (via `post`) and checks the exact syndrome, the attribution, that no heap
/// changed, and that the QP is now in ERR.
fn expect_syndrome(h: &Harness, want: u8, post: impl Fn(&ibgda_device::ibgda::Qp) -> u64 + Sync) -> ErrorRecord {
    let before = h.snapshot();
    let qp = h.qp(0, 1, 0);
    let rec = h
        .run(0, || {
            let end = post(&qp);
            qp.wait(end);
        })
        .expect("the bad WQE must complete with an error");
    assert_eq!(
        ErrorKind::from_u32(rec.kind),
        Some(ErrorKind::CompletionError),
        "{rec:?}"
    );
    assert_eq!(
        rec.detail,
        want as u32,
        "syndrome {} expected, got {:#x}",
        syndrome::name(want),
        rec.detail
    );
    assert_eq!((rec.pe, rec.peer, rec.qp), (0, 1, qp.qpn()));
    let msg = Error::Device(Box::new(rec)).to_string();
    assert!(
        msg.contains(syndrome::name(want)) && msg.contains(&format!("QP {:#x}", qp.qpn())),
        "{msg}"
    );
    assert_eq!(h.snapshot(), before, "a failed WQE wrote memory");
    let stats = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert_eq!((stats.state, stats.error_syndrome), (QpState::Err, want));
    rec
}

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    let h = harness(Duration::from_secs(5));
    let rec = expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 0),
            qp.heap_rkey() ^ 0x100,
            64,
            true,
        )
    });
    assert_eq!(
        rec.observed,
        opcode::RDMA_WRITE as u64,
        "the failed WQE's opcode is reported"
    );
    // The responder NAKed it and moved its own QP to ERR, as an RC responder does.
    let responder = h.ib.qp(1, 0, 0).unwrap();
    assert_eq!(responder.state().unwrap(), QpState::Err, "the responder QP is in ERR");
    assert_eq!(responder.stats().unwrap().error_syndrome, syndrome::REMOTE_ACCESS_ERR);
    // A later WQE on the QP in ERR is flushed (an error CQE with WR_FLUSH_ERR for its index), and
    // writes nothing either.
    h.clear_error(0);
    let before = h.snapshot();
    let qp = h.qp(0, 1, 0);
    let mut end = 0;
    assert!(h
        .run(0, || end = qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 0),
            qp.heap_rkey(),
            64,
            true
        ))
        .is_none());
    let nic = h.ib.qp(0, 1, 0).unwrap();
    let t = std::time::Instant::now();
    while nic.stats().unwrap().consumed < end {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "flush never happened: {:?}",
            nic.stats().unwrap()
        );
        std::thread::yield_now();
    }
    let rec = h.run(0, || qp.wait(end)).expect("waiting on a flushed WQE reports it");
    assert_eq!(rec.detail, syndrome::WR_FLUSH_ERR as u32, "{rec:?}");
    assert_eq!(rec.expected, end - 1, "the flushed WQE's index");
    assert_eq!(h.snapshot(), before);
    assert_eq!(
        nic.stats().unwrap().error_syndrome,
        syndrome::REMOTE_ACCESS_ERR,
        "the first error is kept"
    );
}

#[test]
fn wrong_lkey_is_a_local_protection_error() {
    let h = harness(Duration::from_secs(5));
    expect_syndrome(&h, syndrome::LOCAL_PROT_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey() + 1,
            h.addr(1, 0),
            qp.heap_rkey(),
            64,
            true,
        )
    });
}

#[test]
fn out_of_bounds_remote_and_local_ranges_are_rejected() {
    let h = harness(Duration::from_secs(5));
    // Remote range runs 1 byte past the peer's heap.
    expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, HEAP as u64 - 63),
            qp.heap_rkey(),
            64,
            true,
        )
    });
    let h = harness(Duration::from_secs(5));
    // Local source runs past this PE's heap.
    expect_syndrome(&h, syndrome::LOCAL_PROT_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, HEAP as u64 - 8),
            qp.heap_lkey(),
            h.addr(1, 0),
            qp.heap_rkey(),
            64,
            true,
        )
    });
}

#[test]
fn missing_access_rights_are_remote_access_errors() {
    let h = harness(Duration::from_secs(5));
    let peer = &h.ib.pes[1];
    // SAFETY: inside PE 1's heap, which outlives the fabric.
    let read_only = unsafe { peer.nic().register(h.addr(1, 4096), 4096, access::REMOTE_READ) }.unwrap();
    expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 4096),
            read_only.rkey,
            8,
            true,
        )
    });
    let h = harness(Duration::from_secs(5));
    let peer = &h.ib.pes[1];
    // SAFETY: as above.
    let no_atomic = unsafe { peer.nic().register(h.addr(1, 4096), 4096, access::REMOTE_WRITE) }.unwrap();
    expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_atomic(
            AtomicOp::add(8, 1),
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 4096),
            no_atomic.rkey,
            true,
        )
    });
    // A READ needs local write access on its destination.
    let h = harness(Duration::from_secs(5));
    let me = &h.ib.pes[0];
    // SAFETY: inside PE 0's heap.
    let no_local_write = unsafe { me.nic().register(h.addr(0, 4096), 4096, 0) }.unwrap();
    expect_syndrome(&h, syndrome::LOCAL_PROT_ERR, |qp| {
        qp.test_rdma(
            Rdma::Read,
            h.addr(0, 4096),
            no_local_write.lkey,
            h.addr(1, 0),
            qp.heap_rkey(),
            8,
            true,
        )
    });
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    let h = harness(Duration::from_secs(5));
    expect_syndrome(&h, syndrome::REMOTE_INVAL_REQ_ERR, |qp| {
        qp.test_atomic(
            AtomicOp::add(8, 1),
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 4),
            qp.heap_rkey(),
            true,
        )
    });
}

/// A raw WQE: ctrl (with the given opcode, QPN and DS) + raddr + data.
fn raw(index: u16, op: u8, qpn: u32, ds: u8, h: &Harness, lkey: u32, rkey: u32) -> ([wqe::Segment; 16], usize) {
    let mut s = [[0u32; 4]; 16];
    s[0] = wqe::ctrl(index, op, 0, qpn, ibgda_abi::mlx5::fm_ce_se::CQ_UPDATE, ds, 0);
    s[1] = wqe::raddr(h.addr(1, 0), rkey);
    s[2] = wqe::data(8, lkey, h.addr(0, 0));
    s[3] = wqe::data(8, lkey, h.addr(0, 8));
    (s, 4)
}

#[test]
fn malformed_wqes_are_local_qp_operation_errors() {
    // Unknown opcode.
    let h = harness(Duration::from_secs(5));
    let rec = expect_syndrome(&h, syndrome::LOCAL_QP_OP_ERR, |qp| {
        let (q, l, r) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
        qp.test_raw(1, true, |i| raw(i, 0x07, q, 3, &h, l, r))
    });
    assert_eq!(rec.observed, 0x07);
    // Wrong QPN in the ctrl segment.
    let h = harness(Duration::from_secs(5));
    expect_syndrome(&h, syndrome::LOCAL_QP_OP_ERR, |qp| {
        let (q, l, r) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
        qp.test_raw(1, true, |i| raw(i, opcode::RDMA_WRITE, q + 1, 3, &h, l, r))
    });
    // A DS count that does not match the opcode (an atomic needs 4).
    let h = harness(Duration::from_secs(5));
    expect_syndrome(&h, syndrome::LOCAL_QP_OP_ERR, |qp| {
        let (q, l, r) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
        qp.test_raw(1, true, |i| raw(i, opcode::ATOMIC_FA, q, 3, &h, l, r))
    });
    // A WQE index that is not the slot it sits in.
    let h = harness(Duration::from_secs(5));
    expect_syndrome(&h, syndrome::LOCAL_QP_OP_ERR, |qp| {
        let (q, l, r) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
        qp.test_raw(1, true, |i| raw(i.wrapping_add(1), opcode::RDMA_WRITE, q, 3, &h, l, r))
    });
    // Two gather entries of 8 bytes each is fine (DS 4); a zero-length one is a length error.
    let h = harness(Duration::from_secs(5));
    let qp = h.qp(0, 1, 0);
    let (q, l, r) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
    assert!(h
        .run(0, || qp.wait(qp.test_raw(1, true, |i| raw(
            i,
            opcode::RDMA_WRITE,
            q,
            4,
            &h,
            l,
            r
        ))))
        .is_none());
    assert_eq!(h.read(1, 0, 16), h.read(0, 0, 16), "gathered 2 x 8 bytes");
    expect_syndrome(&h, syndrome::LOCAL_LENGTH_ERR, |qp| {
        qp.test_raw(1, true, |i| {
            let (mut s, n) = raw(i, opcode::RDMA_WRITE, q, 3, &h, l, r);
            s[2] = wqe::data(0, l, h.addr(0, 0));
            (s, n)
        })
    });
}

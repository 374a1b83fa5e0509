//! The emulated mlx5 device, driven by the device-side IBGDA code on CPU threads: every operation's
//! effect, every bad input's exact syndrome (and that nothing was written), a lost doorbell
//! recovered through the DBR, and a paused engine turning `quiet` into an attributed timeout.

use ibgda::emu::{access, CqMode, Fabric, QpState};
use ibgda::transport::ibgda::IbgdaOptions;
use ibgda::Error;
use ibgda_abi::mlx5::{cqe_opcode, opcode, syndrome, wqe_ds, CqeTail, CQE_TAIL_OFFSET};
use ibgda_abi::{ErrorKind, ErrorRecord, WaitKind};
use ibgda_device::ibgda::{wqe, AtomicOp, Rdma};
use ibgda_tests::emu_harness::Harness;
use ibgda_tests::random_bytes;
use std::time::Duration;

/// The raw posts on test buffers: every local range a test names is its own part of a harness
/// heap, which nothing else touches while the NIC works on it (each test waits or quiets before
/// reading it), which is the contract of `Qp::post_rdma`, `post_atomic` and `post_raw`.
trait TestPosts {
    #[allow(clippy::too_many_arguments)]
    fn test_rdma(&self, op: Rdma, laddr: u64, lkey: u32, raddr: u64, rkey: u32, len: u32, ring: bool) -> u64;
    fn test_atomic(&self, op: AtomicOp, laddr: u64, lkey: u32, raddr: u64, rkey: u32, ring: bool) -> u64;
    fn test_raw(&self, wqebbs: u32, ring: bool, build: impl FnOnce(u16) -> ([wqe::Segment; 16], usize)) -> u64;
}

impl TestPosts for ibgda_device::ibgda::Qp {
    fn test_rdma(&self, op: Rdma, laddr: u64, lkey: u32, raddr: u64, rkey: u32, len: u32, ring: bool) -> u64 {
        // SAFETY: see the trait.
        unsafe { self.post_rdma(op, laddr, lkey, raddr, rkey, len, ring) }
    }
    fn test_atomic(&self, op: AtomicOp, laddr: u64, lkey: u32, raddr: u64, rkey: u32, ring: bool) -> u64 {
        // SAFETY: see the trait.
        unsafe { self.post_atomic(op, laddr, lkey, raddr, rkey, ring) }
    }
    fn test_raw(&self, wqebbs: u32, ring: bool, build: impl FnOnce(u16) -> ([wqe::Segment; 16], usize)) -> u64 {
        // SAFETY: see the trait.
        unsafe { self.post_raw(wqebbs, ring, build) }
    }
}

const HEAP: usize = 64 << 10;

fn harness(timeout: Duration) -> Harness {
    Harness::new(
        2,
        HEAP,
        IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 4,
            log_landing_slots: 2,
            ..Default::default()
        },
        timeout,
    )
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
    let read_only = unsafe {
        peer.device
            .register(peer.pd, h.addr(1, 4096), 4096, access::REMOTE_READ)
    }
    .unwrap();
    expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 4096),
            read_only.key,
            8,
            true,
        )
    });
    let h = harness(Duration::from_secs(5));
    let peer = &h.ib.pes[1];
    // SAFETY: as above.
    let no_atomic = unsafe {
        peer.device
            .register(peer.pd, h.addr(1, 4096), 4096, access::REMOTE_WRITE)
    }
    .unwrap();
    expect_syndrome(&h, syndrome::REMOTE_ACCESS_ERR, |qp| {
        qp.test_atomic(
            AtomicOp::add(8, 1),
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 4096),
            no_atomic.key,
            true,
        )
    });
    // A READ needs local write access on its destination.
    let h = harness(Duration::from_secs(5));
    let me = &h.ib.pes[0];
    // SAFETY: inside PE 0's heap.
    let no_local_write = unsafe { me.device.register(me.pd, h.addr(0, 4096), 4096, 0) }.unwrap();
    expect_syndrome(&h, syndrome::LOCAL_PROT_ERR, |qp| {
        qp.test_rdma(
            Rdma::Read,
            h.addr(0, 4096),
            no_local_write.key,
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

#[test]
fn a_dropped_doorbell_is_recovered_through_the_dbr() {
    let h = harness(Duration::from_secs(5));
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    nic_qp.drop_next_doorbells(1).unwrap();
    let data = random_bytes(7, 512);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        let end = qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 1024),
            qp.heap_rkey(),
            512,
            true,
        );
        qp.wait(end);
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(h.read(1, 1024, 512), data);
    let s = nic_qp.stats().unwrap();
    assert_eq!(s.doorbells_dropped, 1, "{s:?}");
    assert!(s.doorbells_recovered >= 1, "{s:?}");
}

#[test]
fn a_paused_engine_makes_quiet_time_out_with_attribution() {
    let h = harness(Duration::from_millis(300));
    h.ib.pes[0].device.set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let before = h.snapshot();
    let rec = h
        .run(0, || {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 0),
                qp.heap_rkey(),
                64,
                false,
            );
            qp.quiet();
        })
        .expect("quiet must time out");
    assert_eq!(ErrorKind::from_u32(rec.kind), Some(ErrorKind::Timeout));
    assert_eq!(WaitKind::from_u32(rec.detail), Some(WaitKind::Quiet));
    assert_eq!(
        (rec.pe, rec.peer, rec.qp, rec.expected, rec.observed),
        (0, 1, qp.qpn(), 1, 0)
    );
    assert!(rec.elapsed_ns >= 300_000_000);
    let msg = Error::Device(Box::new(rec)).to_string();
    for want in [
        "timeout on PE 0",
        &format!("QP {:#x}", qp.qpn()),
        "peer 1",
        "cons_idx needed 1, observed 0",
    ] {
        assert!(msg.contains(want), "`{want}` missing from: {msg}");
    }
    assert_eq!(h.snapshot(), before);
    // Resumed, the same WQE goes through.
    h.ib.pes[0].device.set_paused(false).unwrap();
    h.clear_error(0);
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 0, 64), h.read(0, 0, 64));
}

#[test]
fn delayed_completions_still_complete_in_order() {
    let h = harness(Duration::from_secs(5));
    h.ib.pes[0]
        .device
        .set_completion_delay(Duration::from_millis(20))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    let t = std::time::Instant::now();
    let r = h.run(0, || {
        qp.post_inline_write(h.addr(1, 0), qp.heap_rkey(), &[1, 2, 3, 4], false);
        qp.post_inline_write(h.addr(1, 4), qp.heap_rkey(), &[5, 6, 7, 8], false);
        qp.quiet();
    });
    assert!(r.is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(40),
        "two signalled WQEs, 20 ms each"
    );
    assert_eq!(h.read(1, 0, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn qp_state_machine_and_owner_bit_cq() {
    let fabric = Fabric::new();
    let (a, b) = (fabric.open_device(), fabric.open_device());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cq = a.create_cq(2, CqMode::OwnerBit).unwrap();
    let qa = a.create_qp(pa, &cq, 3).unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    // Out-of-order transitions are refused and name the state.
    let e = qa.to_rts().unwrap_err().to_string();
    assert!(e.contains("Reset") && e.contains("modify_qp(RTS)"), "{e}");
    assert!(a.create_qp(pb, &cq, 3).is_err(), "a PD of another device");
    assert!(a.create_qp(pa, &cq, 16).is_err(), "deeper than 32768 WQEBBs");
    qa.to_init().unwrap();
    assert!(
        qa.to_rtr(ibgda::emu::QpAddress {
            device: 99,
            qpn: 1,
            ..Default::default()
        })
        .is_err(),
        "unknown peer"
    );
    qa.to_rtr(qb.address()).unwrap();
    qa.to_rts().unwrap();
    qb.to_init().unwrap();
    qb.to_rtr(qa.address()).unwrap();
    // Post NOPs by hand (the engine is not running; service it explicitly) and poll the owner-bit
    // CQ the way rdma-core does: valid iff opcode != INVALID and owner == (ci & size) != 0.
    let sq = qa.sq();
    let mut pi = 0u16;
    let mut seen = Vec::new();
    // Writes a signalled NOP at `pi` and moves `pi` past it.
    let post_nop = |pi: &mut u16| {
        let ctrl = wqe::ctrl(
            *pi,
            opcode::NOP,
            0,
            qa.qpn(),
            ibgda_abi::mlx5::fm_ce_se::CQ_UPDATE,
            wqe_ds::NOP,
            0,
        );
        // SAFETY: slot `pi % 8` of the QP's 8-WQEBB send queue.
        unsafe { ((sq + ((*pi as u64 & 7) << 6)) as *mut [u32; 4]).write(ctrl) };
        *pi += 1;
    };
    for round in 0..3u32 {
        for _ in 0..4 {
            post_nop(&mut pi);
        }
        // SAFETY: the DBR is live; then the doorbell register.
        unsafe {
            ((qa.dbr() + 4) as *mut u32).write_volatile((pi as u32).to_be());
            let db = ibgda_abi::mlx5::doorbell_value(pi, qa.qpn());
            (qa.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
        }
        while fabric.service_once() > 0 {}
        for k in 0..4u32 {
            let ci = round * 4 + k;
            let cqe = cq.buffer() + ((ci & 3) as u64) * 64;
            // SAFETY: a live CQE.
            let t = CqeTail::from_raw(unsafe { ((cqe + CQE_TAIL_OFFSET as u64) as *const u64).read_volatile() });
            assert_eq!(t.opcode(), cqe_opcode::REQ);
            assert_eq!(t.op_own & 1 == 1, ci & 4 != 0, "owner bit of CQE {ci}");
            seen.push(t.wqe_counter);
        }
        // Consume: report the consumer index in the CQ doorbell record.
        // SAFETY: live CQ DBR.
        unsafe { (cq.dbr() as *mut u32).write_volatile(((round + 1) * 4).to_be()) };
    }
    assert_eq!(seen, (0..12).collect::<Vec<u16>>());
    assert!(!cq.overrun().unwrap());
    // Now 5 more without consuming: the 4-entry CQ overflows.
    for _ in 0..5 {
        post_nop(&mut pi);
    }
    // SAFETY: as above.
    unsafe { ((qa.dbr() + 4) as *mut u32).write_volatile((pi as u32).to_be()) };
    std::thread::sleep(Duration::from_millis(2)); // past the DBR-recovery interval: no doorbell this time
    while fabric.service_once() > 0 {}
    assert!(cq.overrun().unwrap());
    assert_eq!(qa.stats().unwrap().doorbells_recovered, 1);
    // The overrun is raised once as a CQ-error async event, and the QP whose completion was lost
    // is in ERR, as on a ConnectX.
    let events = a.async_events();
    assert_eq!(events, vec![ibgda::emu::AsyncEvent::CqError { cqn: cq.cqn() }]);
    assert!(events[0].to_string().contains("IBV_EVENT_CQ_ERR"), "{}", events[0]);
    assert!(a.async_events().is_empty(), "each event is raised once");
    assert!(b.async_events().is_empty(), "the other device saw nothing");
    assert_eq!(qa.state().unwrap(), QpState::Err);
    // Reset returns the QP to RESET with empty indices.
    qa.reset().unwrap();
    assert_eq!(
        (
            qa.state().unwrap(),
            qa.stats().unwrap().consumed,
            qa.stats().unwrap().posted
        ),
        (QpState::Reset, 0, 0)
    );
}

/// The GPU engine's body (`run_engine`, warp of one lane on the host) in place of the CPU engine
/// thread: it executes what the device API posts, reports itself started, stops on request, and
/// a relaunch (as around a module load) starts from a zeroed tally while the host-visible WQE
/// count keeps adding up.
#[test]
fn the_gpu_engine_loop_runs_the_device_and_stops_on_request() {
    use ibgda_abi::emu::{EngineControl, EngineTally};
    use std::sync::atomic::{AtomicU32, Ordering};
    let h = harness(Duration::from_secs(10));
    h.ib.fabric.stop_engine();
    let qps: Vec<u64> = (0..2)
        .map(|pe| h.ib.qp(pe, 1 - pe, 0).unwrap().context_addr())
        .collect();
    let mut control = Box::new(EngineControl::default());
    let ctl = &mut *control as *mut EngineControl as usize;
    let mut tally = Box::new(EngineTally::default());
    let tly = &mut *tally as *mut EngineTally as usize;
    let table = qps.as_ptr() as usize;
    // SAFETY (both helpers): the control block and tally are live boxes that outlive every
    // engine thread (each is joined before the next launch and before the boxes are read).
    let field = |offset: usize| unsafe { AtomicU32::from_ptr((ctl as *mut u8).add(offset) as *mut u32) };
    let launch = || {
        // What the host does before a launch: clear the flags, zero the tally.
        field(std::mem::offset_of!(EngineControl, stop)).store(0, Ordering::Release);
        field(std::mem::offset_of!(EngineControl, warps_started)).store(0, Ordering::Release);
        field(std::mem::offset_of!(EngineControl, warps_stopped)).store(0, Ordering::Release);
        unsafe { (tly as *mut EngineTally).write(EngineTally::default()) };
        let engine = std::thread::spawn(move || {
            // SAFETY: the QP table, control block and tally outlive the thread (joined below); no
            // other engine runs (the CPU engine was stopped).
            unsafe {
                ibgda_device::emu::run_engine(
                    table as *const u64,
                    2,
                    ctl as *mut EngineControl,
                    tly as *mut EngineTally,
                )
            }
        });
        while field(std::mem::offset_of!(EngineControl, warps_started)).load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        engine
    };
    let stop = |engine: std::thread::JoinHandle<()>| {
        field(std::mem::offset_of!(EngineControl, stop)).store(1, Ordering::Release);
        engine.join().unwrap();
    };
    let engine = launch();
    let data = random_bytes(9, 10_000);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        for k in 0..40u64 {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 20_000 + k * 10),
                qp.heap_rkey(),
                10_000 - k as u32 * 10,
                false,
            );
        }
        let end = qp.test_rdma(
            Rdma::Read,
            h.addr(0, 40_000),
            qp.heap_lkey(),
            h.addr(1, 20_390),
            qp.heap_rkey(),
            9_600,
            true,
        );
        qp.wait(end);
        qp.quiet();
    });
    assert!(r.is_none(), "{r:?}");
    // The last WRITE (k = 39) left data[..9610] at 20_390.
    assert_eq!(h.read(0, 40_000, 9_600), data[..9_600]);
    stop(engine);
    let c = *control;
    assert_eq!((c.warps_started, c.warps_stopped), (1, 1));
    assert_eq!(c.wqes, 41, "{c:?}");
    assert!(c.passes > 0);
    assert_eq!((tally.started, tally.stopped, tally.wqes), (1, 1, 41));

    // Relaunched: five more WQEs; the tally counts this launch, the control block all of them.
    let engine = launch();
    let r = h.run(0, || {
        for k in 0..5u64 {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 60_000 + k * 100),
                qp.heap_rkey(),
                100,
                false,
            );
        }
        qp.quiet();
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(h.read(1, 60_400, 100), data[..100]);
    stop(engine);
    let c = *control;
    assert_eq!((c.warps_started, c.warps_stopped), (1, 1));
    assert_eq!(c.wqes, 46, "{c:?}");
    assert_eq!((tally.started, tally.stopped, tally.wqes), (1, 1, 5));
}

/// A harness whose send queues hold 64 WQEBBs (room for two full batches).
fn deep_harness() -> Harness {
    Harness::new(
        2,
        HEAP,
        IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 6,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(10),
    )
}

#[test]
fn queued_writes_run_in_batches_and_land_exactly() {
    let h = deep_harness();
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    let data = random_bytes(21, 4096);
    h.write(0, 0, &data);
    h.ib.pes[0].device.set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let n = 48u64;
    let r = h.run(0, || {
        for i in 0..n {
            if i % 2 == 0 {
                // 24 bytes from PE 0's heap, to a distinct place on PE 1.
                qp.test_rdma(
                    Rdma::Write,
                    h.addr(0, 24 * i),
                    qp.heap_lkey(),
                    h.addr(1, 8192 + 24 * i),
                    qp.heap_rkey(),
                    24,
                    false,
                );
            } else {
                qp.post_inline_write(
                    h.addr(1, 8192 + 24 * i),
                    qp.heap_rkey(),
                    &data[24 * i as usize..24 * i as usize + 24],
                    false,
                );
            }
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    h.ib.pes[0].device.set_paused(false).unwrap();
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 8192, 24 * n as usize), &data[..24 * n as usize]);
    let s = nic_qp.stats().unwrap();
    assert_eq!(s.wqes_executed, s.consumed, "{s:?}");
    assert!(s.wqes_batched >= 32, "the queued WRITEs went one at a time: {s:?}");
}

#[test]
fn writes_to_one_word_are_never_batched_together_and_the_last_wins() {
    let h = deep_harness();
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    h.ib.pes[0].device.set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        for v in 1u64..=20 {
            qp.post_inline_write(h.addr(1, 512), qp.heap_rkey(), &v.to_le_bytes(), false);
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    h.ib.pes[0].device.set_paused(false).unwrap();
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 512, 8), 20u64.to_le_bytes());
    let s = nic_qp.stats().unwrap();
    assert_eq!(
        s.wqes_batched, 0,
        "overlapping WRITEs must execute in order, one at a time: {s:?}"
    );
}

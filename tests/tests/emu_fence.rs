//! The fence mode of a WQE on the emulated device, under the rate model: a fenced WRITE after a
//! READ waits for the READ's response before it is sent, so it lands a round trip and a latency
//! after both were posted, where an unfenced one would go with the READ. A mutant that ignores
//! the fence (`Mutant::IgnoredFence`) must be caught. The same across passes for the limit on
//! READs and atomics outstanding (`max_rd_atomic`). Its own test binary: a mutant is
//! process-wide.

use ibgda::emu::QueuePair;
use ibgda::emu::RateModel;
use ibgda_abi::mlx5::{fm_ce_se, opcode, wqe_ds};
use ibgda_device::arch::{self, Mutant};
use ibgda_device::ibgda::{wqe, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use std::time::{Duration, Instant};

/// One way. Long enough that a thread descheduled for a while on a loaded 2-core machine still
/// tells the fenced WRITE's three latencies from the two of one sent with the READ.
const LATENCY_MS: u64 = 500;

/// Two PEs, one QP each way, under a model whose only costs are `latency_ms` one way and at most
/// `max_rd_atomic` READs and atomics outstanding per QP (0: no limit).
fn harness(latency_ms: u64, max_rd_atomic: u32) -> Harness {
    let h = Harness::two_pes(9, Duration::from_secs(30));
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            link_gbps: 1.0e6,
            msg_rate_mps: 1.0e6,
            latency_ns: latency_ms * 1_000_000,
            wqe_fetch_ns: 0,
            max_rd_atomic,
        }))
        .unwrap();
    h
}

/// Runs `post` as PE 0 while watching PE `pe`'s 64 bytes at `off` (zero until then): returns when,
/// from `start`, they changed (or 20 s, which the callers' lower bounds then pass and their data
/// checks fail).
fn when_landed(h: &Harness, pe: usize, off: u64, start: Instant, post: impl FnOnce() + Send) -> Duration {
    std::thread::scope(|s| {
        let watcher = s.spawn(|| loop {
            if h.read(pe, off, 64) != [0u8; 64] || start.elapsed() > Duration::from_secs(20) {
                return start.elapsed();
            }
            std::hint::spin_loop();
        });
        let r = h.run(0, post);
        assert!(r.is_none(), "{r:?}");
        watcher.join().unwrap()
    })
}

/// Waits until the engine has learned a doorbell of `qp` (it then waits for what it learned).
fn await_learned(qp: &QueuePair, start: Instant, what: &str) {
    while qp.stats().unwrap().doorbells_seen == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the engine never learned {what}"
        );
        std::thread::yield_now();
    }
}

/// How the READ and the fenced WRITE reach the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Arrival {
    /// Both posted while the device is paused: the engine learns them in one pass.
    Together,
    /// The WRITE posted once the engine has learned the READ (and waits for its response): the
    /// pass that learns the WRITE counts it fetched from when its doorbell was first seen, which
    /// must not let it skip the fence.
    WhileTheReadIsOut,
}

/// Posts, as PE 0, a READ of PE 1's 64 bytes at 0 into its own 4096, then a WRITE of its own 64
/// bytes at 0 to PE 1's 1024 with the fence mode `fence`, arriving as `arrival` says; returns when
/// (from the READ's arrival) the WRITE's data appeared at PE 1, and the bytes the READ fetched.
fn read_then_write(fence: u8, arrival: Arrival) -> (Duration, Vec<u8>) {
    let h = harness(LATENCY_MS, 0);
    h.write(0, 0, &[0x77u8; 64]);
    h.write(1, 0, &[0x3cu8; 64]);
    h.write(1, 1024, &[0u8; 64]);
    let qp = h.qp(0, 1, 0);
    let control = h.ib.qp(0, 1, 0).unwrap();
    let post_read = || {
        qp.test_rdma(
            Rdma::Read,
            h.addr(0, 4096),
            qp.heap_lkey(),
            h.addr(1, 0),
            qp.heap_rkey(),
            64,
            true,
        );
    };
    let post_write = || {
        let (qpn, lkey, rkey) = (qp.qpn(), qp.heap_lkey(), qp.heap_rkey());
        let (src, dst) = (h.addr(0, 0), h.addr(1, 1024));
        qp.test_raw(1, true, |i| {
            let mut segs = [[0u32; 4]; 16];
            segs[0] = wqe::ctrl(
                i,
                opcode::RDMA_WRITE,
                0,
                qpn,
                fm_ce_se::CQ_UPDATE | fence,
                wqe_ds::RDMA,
                0,
            );
            segs[1] = wqe::raddr(dst, rkey);
            segs[2] = wqe::data(64, lkey, src);
            (segs, 3)
        });
    };
    if arrival == Arrival::Together {
        h.ib.device(0).set_paused(true).unwrap();
        assert!(h
            .run(0, || {
                post_read();
                post_write();
            })
            .is_none());
    }
    let start = Instant::now();
    let landed = when_landed(&h, 1, 1024, start, || {
        if arrival == Arrival::Together {
            h.ib.device(0).set_paused(false).unwrap();
        } else {
            post_read();
            await_learned(control, start, "the READ");
            post_write();
        }
        qp.quiet();
    });
    assert_eq!(h.read(1, 1024, 64), [0x77u8; 64], "the WRITE's data");
    (landed, h.read(0, 4096, 64))
}

#[test]
fn a_fenced_write_after_a_read_waits_for_its_response_and_an_ignored_fence_is_caught() {
    let third = Duration::from_millis(3 * LATENCY_MS);
    for fence in [fm_ce_se::FENCE, fm_ce_se::INITIATOR_SMALL_FENCE] {
        for arrival in [Arrival::Together, Arrival::WhileTheReadIsOut] {
            let (landed, fetched) = read_then_write(fence, arrival);
            assert_eq!(fetched, [0x3cu8; 64], "the READ's data");
            assert!(
                landed >= third,
                "fence mode {fence:#x}, {arrival:?}: the WRITE landed after {landed:?}, before the READ's round trip and its own latency"
            );
        }
    }
    // The mutant sends the WRITE with the READ: it lands with the READ's response, two latencies
    // in (a whole latency before the bound).
    // SAFETY: this test binary runs nothing else; the broken run uses its own fabric.
    unsafe { arch::set_mutant(Mutant::IgnoredFence, true) };
    let (landed, _) = read_then_write(fm_ce_se::FENCE, Arrival::Together);
    // SAFETY: as above.
    unsafe { arch::set_mutant(Mutant::IgnoredFence, false) };
    assert!(
        landed < third,
        "the suite must catch an ignored fence: landed after {landed:?}"
    );
}

/// With at most one READ or atomic outstanding, a second READ rung while the first is out is sent
/// only once the first one's response is back, also when the pass that learns it counts it fetched
/// from inside the first one's wait: it lands two round trips after the first was sent (a pass
/// that started with an empty window let it go at once, one round trip in).
#[test]
fn a_read_past_the_outstanding_limit_waits_for_the_response_out() {
    const LATENCY_MS: u64 = 250;
    let h = harness(LATENCY_MS, 1);
    h.write(1, 0, &[0x3cu8; 64]);
    h.write(1, 64, &[0x5au8; 64]);
    h.write(0, 4096, &[0u8; 64]);
    h.write(0, 8192, &[0u8; 64]);
    let qp = h.qp(0, 1, 0);
    let control = h.ib.qp(0, 1, 0).unwrap();
    let read = |from: u64, to: u64| {
        qp.test_rdma(
            Rdma::Read,
            h.addr(0, to),
            qp.heap_lkey(),
            h.addr(1, from),
            qp.heap_rkey(),
            64,
            true,
        );
    };
    let start = Instant::now();
    let landed = when_landed(&h, 0, 8192, start, || {
        read(0, 4096);
        await_learned(control, start, "the first READ");
        read(64, 8192);
        qp.quiet();
    });
    assert_eq!(h.read(0, 4096, 64), [0x3cu8; 64], "the first READ's data");
    assert_eq!(h.read(0, 8192, 64), [0x5au8; 64], "the second READ's data");
    assert!(
        landed >= Duration::from_millis(4 * LATENCY_MS),
        "the second READ landed after {landed:?}, before two round trips"
    );
}

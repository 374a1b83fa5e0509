//! The rate model's port clock under a backlog, on the CPU engine: a pass that books several
//! batches raises the clock to its ready time only when its own earlier bookings do not already
//! prove the port busy past it (`PortFloor`), and must book exactly what it did with a raise
//! before every take. The mutant that never raises (`Mutant::PortRaiseSkipped`) lets a WRITE on
//! an idle port land before its transmission and must be caught. One test in this binary: the
//! mutant is process-wide.

use ibgda::emu::RateModel;
use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::arch::{self, Mutant};
use ibgda_device::ibgda::{Qp, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use std::time::{Duration, Instant};

/// 10 Mb/s: a byte takes 800 ns of the port, 1,250 bytes 1 ms; nothing else is slow.
fn slow_link() -> RateModel {
    RateModel {
        link_gbps: 0.01,
        msg_rate_mps: 1.0e6,
        latency_ns: 0,
        wqe_fetch_ns: 0,
        max_rd_atomic: 0,
    }
}

fn harness() -> Harness {
    let h = Harness::new(
        2,
        64 << 10,
        IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 9,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(30),
    );
    h.ib.device(0).set_rate_model(Some(slow_link())).unwrap();
    h
}

/// A WRITE of `bytes` from PE 0's heap start to PE 1's at `off`; rings when `ring`.
fn post_write(h: &Harness, qp: &Qp, off: u64, bytes: u32, ring: bool) -> u64 {
    qp.test_rdma(
        Rdma::Write,
        h.addr(0, off),
        qp.heap_lkey(),
        h.addr(1, off),
        qp.heap_rkey(),
        bytes,
        ring,
    )
}

/// Runs `f` as a GPU thread of PE 0 and returns how long it took.
fn timed(h: &Harness, f: impl FnOnce() + Send) -> Duration {
    let t = Instant::now();
    let r = h.run(0, f);
    assert!(r.is_none(), "{r:?}");
    t.elapsed()
}

/// A 40 ms WRITE posted after the port has idled 100 ms: how long it took, and the port time the
/// transmitter's clock jumped over for it. (Long against a loaded machine's scheduling: the
/// mutant's WRITE is due 60 ms before it is sent and must still finish under 40 ms.)
fn write_after_idle(h: &Harness, qp: &Qp) -> (Duration, u64) {
    std::thread::sleep(Duration::from_millis(100));
    let s0 = h.ib.device(0).model_stats().unwrap();
    let took = timed(h, || qp.wait(post_write(h, qp, 0, 50_000, true)));
    let s1 = h.ib.device(0).model_stats().unwrap();
    (took, s1.tx_idle_ps - s0.tx_idle_ps)
}

#[test]
fn a_backlog_books_exactly_its_port_time_and_an_idle_port_is_always_raised() {
    let h = harness();
    let qp = h.qp(0, 1, 0);
    // 40 WRITEs of 1,250 bytes (1 ms of port each), rung once: one pass, two batches of the
    // CPU engine's 32 lanes, the second booked on the first's floor.
    let s0 = h.ib.device(0).model_stats().unwrap();
    let took = timed(&h, || {
        let mut end = 0;
        for i in 0..40u64 {
            end = post_write(&h, &qp, 1_250 * i, 1_250, i == 39);
        }
        qp.wait(end);
    });
    let s1 = h.ib.device(0).model_stats().unwrap();
    let (advance, idle) = (s1.tx_booked_ps - s0.tx_booked_ps, s1.tx_idle_ps - s0.tx_idle_ps);
    assert!(took >= Duration::from_millis(40), "40 ms of port time done in {took:?}");
    assert_eq!(
        advance - idle,
        40_000_000_000,
        "booked: advance {advance} ps, idle {idle} ps"
    );
    assert_eq!(s1.wqes - s0.wqes, 40, "{s1:?}");
    // A new pass on an idle port raises the clock to its ready time: the WRITE takes its 40 ms.
    let (took, jumped) = write_after_idle(&h, &qp);
    assert!(took >= Duration::from_millis(40), "{took:?}");
    assert!(
        jumped >= 95_000_000_000,
        "the clock jumped {jumped} ps over a 100 ms idle"
    );
    // The mutant books after the stale clock: the WRITE is due before it was sent.
    // SAFETY: this binary runs this one test; nothing else reads the mutant meanwhile.
    unsafe { arch::set_mutant(Mutant::PortRaiseSkipped, true) };
    let (took, _) = write_after_idle(&h, &qp);
    // SAFETY: as above.
    unsafe { arch::set_mutant(Mutant::PortRaiseSkipped, false) };
    assert!(
        took < Duration::from_millis(40),
        "the suite must catch a port clock never raised: the 40 ms WRITE took {took:?}"
    );
}

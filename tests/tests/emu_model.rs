//! The emulated device's rate model on the CPU engine: a WRITE's data lands one latency after
//! its transmission, a READ's after a round trip; bytes take link time and messages take
//! message slots on one port that every QP of the device shares; a WQE fetch is charged once;
//! off, nothing is paced. Only lower bounds on time are asserted (a busy machine is only slower).

use ibgda::emu::RateModel;
use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::ibgda::{Qp, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use std::time::{Duration, Instant};

fn harness(qps: u32) -> Harness {
    Harness::new(
        2,
        64 << 10,
        IbgdaOptions {
            qps_per_peer: qps,
            log_depth: 9,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(30),
    )
}

/// A model that is fast everywhere but where a test says otherwise.
fn fast() -> RateModel {
    RateModel {
        link_gbps: 1.0e6,
        msg_rate_mps: 1.0e6,
        latency_ns: 0,
        wqe_fetch_ns: 0,
        max_rd_atomic: 0,
    }
}

/// Runs `f` as a GPU thread of PE 0 and returns how long it took.
fn timed(h: &Harness, f: impl FnOnce() + Send) -> Duration {
    let t = Instant::now();
    let r = h.run(0, f);
    assert!(r.is_none(), "{r:?}");
    t.elapsed()
}

#[test]
fn a_write_lands_one_latency_later_and_a_read_after_a_round_trip() {
    let h = harness(1);
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            latency_ns: 20_000_000,
            ..fast()
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    h.write(0, 0, &[7u8; 64]);
    let write = timed(&h, || qp.wait(post_put(&h, &qp, 64, true)));
    assert!(write >= Duration::from_millis(20), "{write:?}");
    assert_eq!(h.read(1, 0, 64), [7u8; 64]);
    let read = timed(&h, || {
        let end = qp.test_rdma(
            Rdma::Read,
            h.addr(0, 1024),
            qp.heap_lkey(),
            h.addr(1, 0),
            qp.heap_rkey(),
            64,
            true,
        );
        qp.wait(end);
    });
    assert!(read >= Duration::from_millis(40), "{read:?}");
    assert_eq!(h.read(0, 1024, 64), [7u8; 64]);
    let s = h.ib.device(0).model_stats().unwrap();
    assert_eq!(s.wqes, 2, "{s:?}");
    // The engine sleeps until each WQE is due (20 + 40 ms from its fetch); an engine thread that
    // runs late on a busy machine sleeps that much less, so only half is asserted (the elapsed
    // times above are the exact bounds).
    assert!(s.wait_ns >= 30_000_000, "{s:?}");
}

/// Long enough that a watcher thread descheduled for a while on a loaded 2-core machine (seen
/// once: 206 ms late at 200) still tells one latency from the two a held-back update takes.
const SIGNAL_LATENCY_MS: u64 = 500;

/// One QP from PE 0 to PE 1 under a model whose only cost is [`SIGNAL_LATENCY_MS`] one way; PE
/// 0's heap holds `data` at 0, PE 1's zeros at 0 and the signal word 5 at 512.
fn signal_setup(data: u8) -> Harness {
    let h = harness(1);
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            latency_ns: SIGNAL_LATENCY_MS * 1_000_000,
            ..fast()
        }))
        .unwrap();
    h.write(0, 0, &[data; 64]);
    h.write(1, 0, &[0u8; 64]);
    h.write(1, 512, &5u64.to_le_bytes());
    h
}

/// PE 1's side, run while `post` runs as PE 0: when (from `start`) the signal word changed, its
/// value then and PE 1's 64 data bytes then; and what `post` returned and how long it took.
fn watch_signal<T: Send>(
    h: &Harness,
    start: Instant,
    post: impl FnOnce() -> T + Send,
) -> ((Duration, u64, Vec<u8>), T, Duration) {
    std::thread::scope(|s| {
        let watcher = s.spawn(|| loop {
            let v = u64::from_le_bytes(h.read(1, 512, 8).try_into().unwrap());
            if v != 5 || start.elapsed() > Duration::from_secs(20) {
                return (start.elapsed(), v, h.read(1, 0, 64));
            }
            std::hint::spin_loop();
        });
        let mut out = None;
        let took = timed(h, || out = Some(post()));
        let seen = watcher.join().unwrap();
        assert_eq!(seen.1, 6, "the signal landed ({:?})", seen.0);
        (seen, out.unwrap(), took)
    })
}

/// Posts PE 0's `bytes` at 0 to PE 1's 0 (a put), ringing its doorbell when `ring`; returns the
/// index to wait for.
fn post_put(h: &Harness, qp: &Qp, bytes: u32, ring: bool) -> u64 {
    qp.test_rdma(
        Rdma::Write,
        h.addr(0, 0),
        qp.heap_lkey(),
        h.addr(1, 0),
        qp.heap_rkey(),
        bytes,
        ring,
    )
}

/// Posts the signal (a fetch-add of 1 on PE 1's word at 512, the old value to PE 0's 1024), rings
/// and waits for its completion.
fn post_signal_and_wait(h: &Harness, qp: &Qp) {
    let end = qp.test_atomic(
        ibgda_device::ibgda::AtomicOp::add(8, 1),
        h.addr(0, 1024),
        qp.heap_lkey(),
        h.addr(1, 512),
        qp.heap_rkey(),
        true,
    );
    qp.wait(end);
}

/// A WRITE and the atomic after it on one QP (a put and its signal) take effect at the responder
/// one latency after they are sent, the WRITE's data before the atomic's update; the requester's
/// completion (and the fetched value it makes readable) waits for the response, a round trip.
#[test]
fn a_signal_lands_one_latency_after_it_is_sent_and_completes_after_a_round_trip() {
    let h = signal_setup(9);
    let qp = h.qp(0, 1, 0);
    let start = Instant::now();
    let ((landed, _, data), (), completed) = watch_signal(&h, start, || {
        post_put(&h, &qp, 64, false);
        post_signal_and_wait(&h, &qp);
    });
    assert!(
        completed >= Duration::from_millis(2 * SIGNAL_LATENCY_MS),
        "completed after {completed:?}, before the round trip"
    );
    assert_eq!(data, [9u8; 64], "the data lands with or before its signal");
    assert!(
        landed >= Duration::from_millis(SIGNAL_LATENCY_MS),
        "landed after {landed:?}"
    );
    // An upper bound, with a latency's margin for a slow machine: the model must not hold the
    // update back for the response (it did, two latencies).
    assert!(
        landed < Duration::from_millis(2 * SIGNAL_LATENCY_MS),
        "landed after {landed:?}: the update waited for the response"
    );
    assert_eq!(
        u64::from_le_bytes(h.read(0, 1024, 8).try_into().unwrap()),
        5,
        "the fetched value"
    );
}

/// A put and its signal with a doorbell each, the signal's rung only once the engine has learned
/// the put and waits for it to land: a ConnectX fetches the signal then, while the put is on the
/// wire, so the signal too lands one latency after it is sent, not a latency after the put landed
/// (the engine used to count the signal fetched when that wait ended: two latencies).
#[test]
fn a_signal_rung_while_its_put_is_in_flight_lands_one_latency_after_it_is_sent() {
    let h = signal_setup(3);
    let qp = h.qp(0, 1, 0);
    let control = h.ib.qp(0, 1, 0).unwrap();
    let start = Instant::now();
    let ((landed, _, data), rung, _) = watch_signal(&h, start, || {
        post_put(&h, &qp, 64, true);
        while control.stats().unwrap().doorbells_seen == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the engine never learned the put"
            );
            std::thread::yield_now();
        }
        let rung = start.elapsed();
        assert_eq!(
            h.read(1, 0, 64),
            [0u8; 64],
            "the put landed before its signal was posted ({rung:?})"
        );
        post_signal_and_wait(&h, &qp);
        rung
    });
    assert_eq!(data, [3u8; 64], "the data lands with or before its signal");
    let after = landed - rung;
    assert!(
        after >= Duration::from_millis(SIGNAL_LATENCY_MS),
        "landed {after:?} after it was rung"
    );
    // Three quarters of a latency's margin for a slow machine; held back to the end of the put's
    // wait it lands a whole latency later.
    assert!(
        after < Duration::from_millis(SIGNAL_LATENCY_MS * 7 / 4),
        "landed {after:?} after it was rung: the fetch waited for the put to land"
    );
}

#[test]
fn bytes_take_link_time_on_one_port_shared_by_every_qp() {
    let h = harness(2);
    // 10 Mb/s: 800 ns a byte. 16 KiB on each of two QPs: 32 KiB through one port, 26 ms at least.
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            link_gbps: 0.01,
            ..fast()
        }))
        .unwrap();
    let (q0, q1) = (h.qp(0, 1, 0), h.qp(0, 1, 1));
    let data = ibgda_tests::random_bytes(5, 16 << 10);
    h.write(0, 0, &data);
    let t = timed(&h, || {
        for (i, qp) in [&q0, &q1].into_iter().enumerate() {
            for k in 0..4u64 {
                let off = i as u64 * (16 << 10) + k * 4096;
                qp.test_rdma(
                    Rdma::Write,
                    h.addr(0, k * 4096),
                    qp.heap_lkey(),
                    h.addr(1, off),
                    qp.heap_rkey(),
                    4096,
                    false,
                );
            }
        }
        q0.quiet();
        q1.quiet();
    });
    assert!(
        t >= Duration::from_millis(26),
        "{t:?} {:?} {:?}",
        h.ib.device(0).model_stats(),
        h.ib.device(0).rate_model()
    );
    assert_eq!(h.read(1, 0, 16 << 10), data);
    assert_eq!(h.read(1, 16 << 10, 16 << 10), data);
}

#[test]
fn small_messages_take_message_slots_even_in_batches() {
    let h = harness(1);
    // 10 000 messages/s: 100 us each; 200 inline WRITEs (which the engine batches) >= 20 ms.
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            msg_rate_mps: 0.01,
            ..fast()
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    let t = timed(&h, || {
        for i in 0..200u64 {
            qp.post_inline_write(h.addr(1, 8 * i), qp.heap_rkey(), &i.to_le_bytes(), false);
        }
        qp.quiet();
    });
    assert!(t >= Duration::from_millis(20), "{t:?}");
    for i in 0..200u64 {
        assert_eq!(h.read(1, 8 * i, 8), i.to_le_bytes());
    }
    let stats = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert!(
        stats.batches > 0 && stats.batches * 4 <= stats.wqes_batched,
        "the model must not turn batching off: {stats:?}"
    );
    assert!(h.ib.device(0).model_stats().unwrap().wqes >= 200);
}

#[test]
fn a_wqe_fetch_is_charged_when_the_engine_reads_the_queue_locally() {
    let h = harness(1);
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            wqe_fetch_ns: 15_000_000,
            max_rd_atomic: 0,
            ..fast()
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    let t = timed(&h, || {
        let end = qp.post_inline_write(h.addr(1, 0), qp.heap_rkey(), &[1, 2, 3], true);
        qp.wait(end);
    });
    assert!(t >= Duration::from_millis(15), "{t:?}");
}

#[test]
fn off_nothing_is_paced() {
    let h = harness(1);
    let qp = h.qp(0, 1, 0);
    timed(&h, || {
        for i in 0..50u64 {
            qp.post_inline_write(h.addr(1, 8 * i), qp.heap_rkey(), &i.to_le_bytes(), false);
        }
        qp.quiet();
    });
    assert_eq!(h.ib.device(0).rate_model(), None);
    assert_eq!(h.ib.device(0).model_stats().unwrap(), Default::default());
}

#[test]
fn the_model_comes_from_the_environment_with_clear_errors() {
    // One test sets these variables (tests in this file run in threads of one process).
    std::env::set_var("IBGDA_NIC_MODEL", "cx7");
    std::env::set_var("IBGDA_NIC_LATENCY_NS", "900");
    let m = RateModel::from_env(None).unwrap().unwrap();
    assert_eq!((m.link_gbps, m.msg_rate_mps, m.latency_ns), (400.0, 330.0, 900));
    std::env::set_var("IBGDA_NIC_LINK_GBPS", "-3");
    let e = RateModel::from_env(None).unwrap_err().to_string();
    assert!(e.contains("IBGDA_NIC_LINK_GBPS") && e.contains("-3"), "{e}");
    std::env::set_var("IBGDA_NIC_MODEL", "cx9");
    let e = RateModel::from_env(None).unwrap_err().to_string();
    assert!(e.contains("IBGDA_NIC_MODEL") && e.contains("cx9"), "{e}");
    std::env::set_var("IBGDA_NIC_MODEL", "off");
    assert_eq!(RateModel::from_env(Some(RateModel::CONNECTX7)).unwrap(), None);
    for v in ["IBGDA_NIC_MODEL", "IBGDA_NIC_LATENCY_NS", "IBGDA_NIC_LINK_GBPS"] {
        std::env::remove_var(v);
    }
    assert_eq!(
        RateModel::from_env(Some(RateModel::CONNECTX7)).unwrap(),
        Some(RateModel::CONNECTX7)
    );
}

/// The model never books another device's port: an atomic's and a READ's response are charged on
/// the requester's own receiver. (On two GPUs the responder's clocks are another GPU's
/// `%globaltimer`, which may be milliseconds apart from the requester's; booking them charged that
/// offset to every round trip.) Device 1 only responds here, so its clocks stay untouched, and
/// device 0's receiver carries the responses.
#[test]
fn responses_are_booked_on_the_requesters_own_receiver_never_on_the_responder() {
    let h = harness(1);
    for pe in 0..2 {
        h.ib.device(pe)
            .set_rate_model(Some(RateModel {
                latency_ns: 1_000,
                ..fast()
            }))
            .unwrap();
    }
    let qp = h.qp(0, 1, 0);
    h.write(1, 0, &[0u8; 8]);
    let r = h.run(0, || {
        let mut end = 0;
        for i in 0..8u64 {
            end = qp.test_atomic(
                ibgda_device::ibgda::AtomicOp::add(8, 1),
                h.addr(0, 4096 + 8 * i),
                qp.heap_lkey(),
                h.addr(1, 0),
                qp.heap_rkey(),
                false,
            );
        }
        end = end.max(qp.test_rdma(
            Rdma::Read,
            h.addr(0, 8192),
            qp.heap_lkey(),
            h.addr(1, 64),
            qp.heap_rkey(),
            4096,
            true,
        ));
        qp.wait(end);
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(u64::from_le_bytes(h.read(1, 0, 8).try_into().unwrap()), 8);
    let requester = h.ib.device(0).model_stats().unwrap();
    let responder = h.ib.device(1).model_stats().unwrap();
    assert!(
        requester.tx_booked_ps > 0 && requester.rx_booked_ps > 0,
        "{requester:?}"
    );
    assert_eq!(
        (responder.tx_booked_ps, responder.rx_booked_ps),
        (0, 0),
        "the responder's clocks were booked by the requester's engine: {responder:?}"
    );
}

/// Queues `n` fetch-and-adds of 1 on PE 1's word 0 to PE 0's QP (each preceded by an 8-byte WRITE
/// when `with_writes`, as `put_signal` posts them) while PE 0's device is paused, under a model of
/// `latency_ns` and 16 READs/atomics outstanding per QP; returns how long the device then takes to
/// complete them all, after checking the sum.
fn drain_atomics(n: u64, with_writes: bool, latency_ns: u64) -> Duration {
    let h = harness(1);
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            latency_ns,
            max_rd_atomic: 16,
            ..fast()
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    h.write(1, 0, &[0u8; 8]);
    h.ib.device(0).set_paused(true).unwrap();
    let r = h.run(0, || {
        for i in 0..n {
            if with_writes {
                qp.test_rdma(
                    Rdma::Write,
                    h.addr(0, 0),
                    qp.heap_lkey(),
                    h.addr(1, 1024 + 8 * i),
                    qp.heap_rkey(),
                    8,
                    false,
                );
            }
            qp.test_atomic(
                ibgda_device::ibgda::AtomicOp::add(8, 1),
                h.addr(0, 4096 + 8 * i),
                qp.heap_lkey(),
                h.addr(1, 0),
                qp.heap_rkey(),
                false,
            );
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    let t = Instant::now();
    h.ib.device(0).set_paused(false).unwrap();
    let r = h.run(0, || qp.quiet());
    assert!(r.is_none(), "{r:?}");
    let took = t.elapsed();
    assert_eq!(u64::from_le_bytes(h.read(1, 0, 8).try_into().unwrap()), n);
    took
}

/// A QP has at most `max_rd_atomic` READs and atomics outstanding (16 on a ConnectX-7): 32
/// fetch-and-adds queued at once take two round trips with a limit of 16, one without. (Only the
/// lower bound is asserted: 32 at once would take one round trip, under the bound.)
#[test]
fn reads_and_atomics_outstanding_per_qp_are_bounded() {
    let latency_ns = 15_000_000;
    let took = drain_atomics(32, false, latency_ns);
    assert!(
        took >= Duration::from_nanos(4 * latency_ns),
        "32 atomics with 16 outstanding take two round trips: {took:?}"
    );
}

/// The outstanding limit spans batches: `put_signal`-like pairs (a WRITE, then its atomic) form one
/// small batch each, and 40 of them still have at most 16 atomics in flight, so they take at least
/// three round trips (16 + 16 + 8) rather than the one that pipelined batches would.
#[test]
fn the_outstanding_limit_spans_batches() {
    let latency_ns = 5_000_000;
    let took = drain_atomics(40, true, latency_ns);
    assert!(
        took >= Duration::from_nanos(6 * latency_ns),
        "40 atomics with 16 outstanding take three round trips: {took:?}"
    );
}

/// The transmitter's clock only moves forward: a booking on an idle port raises it to the
/// booking's ready time, and the jump is counted as idle (`ModelStats::tx_idle_ps`), so the
/// clock's advance minus the jumps is the port time booked. Two WRITEs 50 ms apart on a link
/// that takes 20 ms for each: between the readings after each, a jump of at least the 50 ms
/// between them (asserted with a little room) and exactly the second WRITE's 20 ms booked.
#[test]
fn the_transmitter_counts_the_idle_time_it_jumps() {
    let h = harness(1);
    // 10 Mb/s: 25 kB take 20 ms.
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            link_gbps: 0.01,
            ..fast()
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    let bytes = 25_000u32;
    let write = || timed(&h, || qp.wait(post_put(&h, &qp, bytes, true)));
    let first = write();
    let s0 = h.ib.device(0).model_stats().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let second = write();
    let s1 = h.ib.device(0).model_stats().unwrap();
    assert!(
        first >= Duration::from_millis(20) && second >= Duration::from_millis(20),
        "{first:?} {second:?}"
    );
    let (advance, idle) = (s1.tx_booked_ps - s0.tx_booked_ps, s1.tx_idle_ps - s0.tx_idle_ps);
    // The second WRITE's 20 ms are booked after a jump over the 50 ms sleep (and whatever the
    // engine took beyond the first WRITE's end); the advance is the jump plus its 20 ms.
    let booked_ps = 20_000_000_000u64;
    assert!(idle >= 45_000_000_000, "idle {idle} ps of an advance of {advance} ps");
    assert!(
        advance.abs_diff(idle + booked_ps) < 1_000_000,
        "idle {idle} ps, advance {advance} ps"
    );
}

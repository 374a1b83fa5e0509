//! The CPU-proxy transport's own behaviour on CPU-emulated PEs: the traffic really goes through
//! descriptors and proxy threads, and a stalled proxy, a dead proxy thread and an error completion
//! each end in an attributed error instead of a hang.

use ibgda::abi::{ErrorKind, WaitKind};
use ibgda::transport::proxy::ProxyOptions;
use ibgda::Error;
use ibgda_kernels::fault;
use ibgda_tests::group::{Link, PeGroup};
use std::time::{Duration, Instant};

fn options() -> ProxyOptions {
    ProxyOptions {
        threads: 2,
        channels: 4,
        log_ring_slots: 4,
        batch: 8,
        log_landing_slots: 3,
        log_sq_depth: 5,
        pin: false,
    }
}

fn world(timeout: Duration) -> PeGroup {
    PeGroup::cpu(2, 1 << 20, timeout, Link::Proxy(options())).unwrap()
}

#[test]
fn every_operation_is_one_descriptor_through_the_proxy_threads() {
    let mut w = world(Duration::from_secs(20));
    let words = w.malloc::<u64>(64).unwrap();
    let tickets = w.malloc::<u64>(64).unwrap();
    let (blocks, iters) = (6u32, 20u32);
    let wr = &w;
    wr.launch(blocks, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_test_atomics(
                st,
                wr.ptr(0, &words).unwrap() as *mut u64,
                wr.ptr(0, &tickets).unwrap() as *mut u64,
                1,
                iters,
            );
        }
    })
    .unwrap();
    let got = w.read(1, &words, 0, 8).unwrap();
    let n = (blocks * iters) as u64;
    assert_eq!(got[0], n, "u64 fetch_add");
    assert_eq!(got[1] & 0xffff_ffff, n, "u32 add");
    assert_eq!(got[2], n, "compare-swap loop");
    assert_eq!(got[3] as i64, -(n as i64), "i64 add, and no p/g mismatch");
    // Every block's channel is served by thread `block % channels % threads`; both threads worked
    // and took at least one descriptor per operation (fetch_add, add, fetch, >=1 CAS, add per
    // iteration; swap, fetch, >=1 CAS, p, g per block).
    let stats = w.pe(0).cpu_proxy().unwrap().stats();
    assert!(stats.iter().all(|s| s.descriptors > 0), "{stats:?}");
    let total: u64 = stats.iter().map(|s| s.descriptors).sum();
    assert!(
        total >= 5 * n + 5 * blocks as u64,
        "{total} descriptors for {n} rounds: {stats:?}"
    );
    let wqes: u64 = stats.iter().map(|s| s.wqes).sum();
    assert!(wqes >= total, "one WQE or more per descriptor: {stats:?}");
    let doorbells: u64 = stats.iter().map(|s| s.doorbells).sum();
    assert!(doorbells > 0 && doorbells <= wqes, "{stats:?}");
    // PE 1 issued nothing.
    assert!(w.pe(1).cpu_proxy().unwrap().stats().iter().all(|s| s.descriptors == 0));
    // Each channel's published counters agree: everything consumed has completed.
    for c in 0..4 {
        let (completed, consumed) = w.pe(0).cpu_proxy_channels().unwrap().progress(c).unwrap();
        assert_eq!(completed, consumed, "channel {c}");
    }
}

fn put_quiet(w: &PeGroup) -> Error {
    let buf = 4096u64; // past the heap's header (the reductions' scratch, unused here)
    w.launch(1, |pe, st| unsafe {
        if pe == 0 {
            let sh = ibgda_device::Shmem::attach(st);
            ibgda_kernels::ibgda_test_fault(st, fault::PUT_QUIET, sh.heap_base().add(buf as usize), 1);
        }
    })
    .unwrap_err()
}

#[test]
fn a_stalled_proxy_makes_quiet_time_out_naming_the_channel() {
    let w = world(Duration::from_millis(300));
    w.pe(0).cpu_proxy().unwrap().set_paused(true);
    let e = put_quiet(&w);
    assert_eq!(e.device_kind(), Some(ErrorKind::Timeout), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!(r.detail, WaitKind::ProxyCompletion as u32);
    assert_eq!(
        (r.pe, r.qp, r.expected, r.observed),
        (0, 0, 1, 0),
        "channel 0, ticket 1 never completed"
    );
    assert!(r.elapsed_ns >= 300_000_000);
    let s = e.to_string();
    assert!(
        s.contains("proxy channel 0") && s.contains("proxy completed needed 1, observed 0"),
        "{s}"
    );
    // Resumed, the proxy delivers the put the kernel queued before it gave up.
    w.pe(0).cpu_proxy().unwrap().set_paused(false);
    let t = Instant::now();
    while w.pe(0).cpu_proxy_channels().unwrap().progress(0).unwrap().0 < 1 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the resumed proxy never completed ticket 0"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_dead_proxy_thread_is_reported_at_once_not_waited_on() {
    let w = world(Duration::from_secs(30));
    w.pe(0).cpu_proxy().unwrap().kill_thread(0);
    let t = Instant::now();
    let e = put_quiet(&w);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "waited {:?} for a dead proxy",
        t.elapsed()
    );
    let Error::ProxyFailed { record, thread, reason } = &e else {
        panic!("expected ProxyFailed, got {e}")
    };
    assert_eq!((record.kind, record.qp, *thread), (ErrorKind::ProxyFailed as u32, 0, 0));
    assert!(reason.contains("killed by fault injection"), "{reason}");
    let s = e.to_string();
    assert!(s.contains("proxy thread 0") && s.contains("has died"), "{s}");
}

#[test]
fn an_error_completion_kills_the_proxy_thread_with_the_syndrome() {
    let w = world(Duration::from_secs(30));
    // PE 1 withdraws its heap registration: PE 0's proxy WRITE meets a remote access error.
    let (t, _) = w.pe(1).emulated_nic().unwrap();
    t.emulated().unwrap().deregister(t.heap_key()).unwrap();
    let e = put_quiet(&w);
    let Error::ProxyFailed { reason, .. } = &e else {
        panic!("expected ProxyFailed, got {e}")
    };
    assert!(
        reason.contains("error completion") && reason.contains("REMOTE_ACCESS"),
        "{reason}"
    );
}

/// `fence` over the proxy waits for the block's channel: the proxy posts a channel's descriptors
/// to one QP, but a NIC may place consecutive RDMA WRITEs in any order (the emulated NIC's GPU
/// engine does, within a batch), and nothing tells the proxy where a fence was. So with the proxy
/// stalled, a `put_nbi` then `fence` runs into the timeout, naming the channel, instead of
/// returning while the put is still queued.
#[test]
fn fence_over_the_proxy_waits_for_the_channel() {
    let w = world(Duration::from_millis(300));
    w.pe(0).cpu_proxy().unwrap().set_paused(true);
    let e = w
        .launch(1, |pe, st| unsafe {
            if pe == 0 {
                let sh = ibgda_device::Shmem::attach(st);
                let at = sh.heap_base().add(4096);
                sh.put_nbi(at.add(64), at as *const u8, 8, 1);
                sh.fence();
            }
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::Timeout), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!(r.detail, WaitKind::ProxyCompletion as u32, "{e}");
    assert_eq!((r.pe, r.qp, r.expected, r.observed), (0, 0, 1, 0), "{e}");
    w.pe(0).cpu_proxy().unwrap().set_paused(false);
}

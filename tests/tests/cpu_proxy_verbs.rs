//! The CPU proxy over standard verbs (`IBGDA_NIC=verbs`), end to end on CPU-emulated PEs: the
//! device API's descriptors become `ibv_send_wr` chains handed to `ibv_post_send` and complete
//! through `ibv_poll_cq`, on a stand-in rdma-core (`host/tests/standin/`) that lists a soft-RoCE
//! device (`rxe0`, not mlx5), connects RC QPs over GIDs and executes the requests between the PEs'
//! heaps against the registered regions' bounds and rights, as a NIC would. What standard verbs
//! cannot do (4-byte and bitwise atomics) and what the NIC refuses end in attributed errors.

use ibgda::nic::NicChoice;
use ibgda::transport::proxy::ProxyOptions;
use ibgda::Error;
use ibgda_kernels::{fault, scope};
use ibgda_tests::group::{Link, PeGroup};
use ibgda_tests::random_bytes;
use std::time::Duration;

#[path = "../../host/tests/common/mlx5_ifc.rs"]
mod mlx5_ifc;
#[path = "../../host/tests/common/standin.rs"]
mod standin;
use standin::{standin, Knobs, SERIAL};

/// A world of `n` PEs whose proxies post through the stand-in's verbs; `knobs` set first.
fn world(n: u32, timeout: Duration, knobs: &Knobs) -> PeGroup {
    // A device that holds 4 requests per QP (the proxy asks for 16 and keeps within what it got):
    // a pass's batch (up to 5 per ring) overflows it unless the poster waits for room.
    knobs.set("devices", 2).set("ethernet", 1).set("max_qp_wr", 4);
    // SAFETY: the tests of this binary are serialised by SERIAL, and the variable names the
    // stand-in for every one of them.
    unsafe { std::env::set_var("IBGDA_LIBIBVERBS", standin()) };
    let options = ProxyOptions {
        threads: 2,
        channels: 3,
        log_ring_slots: 3,
        batch: 5,
        log_landing_slots: 2,
        log_sq_depth: 4,
        pin: false,
    };
    let config = ibgda::Config {
        nic: NicChoice::Verbs,
        hca: None,
        ib_port: 1,
        gid_index: 0,
        ..PeGroup::cpu_config(4 << 20, timeout, Link::Proxy(options))
    };
    PeGroup::new(n, config).unwrap()
}

#[test]
fn puts_gets_signals_and_p_go_through_ibv_post_send_byte_for_byte() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    {
        let mut w = world(2, Duration::from_secs(30), &knobs);
        let bytes = 100_003usize;
        let (src, dst, got) = (
            w.malloc::<u8>(bytes).unwrap(),
            w.malloc::<u8>(bytes).unwrap(),
            w.malloc::<u8>(bytes).unwrap(),
        );
        for sc in [scope::THREAD, scope::WARP, scope::BLOCK] {
            for nbi in [0u32, 1] {
                let seed = 10 * sc as u64 + nbi as u64;
                for pe in 0..2 {
                    w.write(pe, &src, 0, &random_bytes(seed + pe as u64, bytes)).unwrap();
                }
                let wr = &w;
                wr.launch_grid(2, 32, |pe, st| unsafe {
                    ibgda_kernels::ibgda_test_put(
                        st,
                        sc,
                        nbi,
                        wr.ptr(pe, &dst).unwrap() as *mut u8,
                        wr.ptr(pe, &src).unwrap() as *const u8,
                        bytes as u64,
                        1 - pe,
                    );
                })
                .unwrap();
                wr.launch_grid(2, 32, |pe, st| unsafe {
                    ibgda_kernels::ibgda_test_get(
                        st,
                        sc,
                        nbi,
                        wr.ptr(pe, &got).unwrap() as *mut u8,
                        wr.ptr(pe, &src).unwrap() as *const u8,
                        bytes as u64,
                        1 - pe,
                    );
                })
                .unwrap();
                for pe in 0..2u32 {
                    let theirs = random_bytes(seed + (1 - pe) as u64, bytes);
                    assert!(
                        w.read(pe, &dst, 0, bytes).unwrap() == theirs,
                        "put, scope {sc} nbi {nbi}, PE {pe}"
                    );
                    assert!(
                        w.read(pe, &got, 0, bytes).unwrap() == theirs,
                        "get, scope {sc} nbi {nbi}, PE {pe}"
                    );
                }
            }
        }
        // put_signal: the data, then an 8-byte fetch-add on the signal, in order on one QP.
        let sig = w.malloc::<u64>(1).unwrap();
        let wr = &w;
        wr.launch(4, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_put_signal(
                st,
                wr.ptr(pe, &dst).unwrap() as *mut u8,
                wr.ptr(pe, &src).unwrap() as *const u8,
                wr.ptr(pe, &got).unwrap() as *mut u8,
                bytes as u64,
                wr.ptr(pe, &sig).unwrap() as *mut u64,
            );
        })
        .unwrap();
        for pe in 0..2u32 {
            assert_eq!(w.read(pe, &sig, 0, 1).unwrap()[0], 4, "one signal add per block");
            assert!(w.read(pe, &got, 0, bytes).unwrap() == w.read(1 - pe, &src, 0, bytes).unwrap());
        }
        // p (an inline 8-byte write) and wait_until, 200 rounds each way.
        let flag = w.malloc::<u64>(1).unwrap();
        let wr = &w;
        wr.launch(1, |pe, st| unsafe {
            ibgda_kernels::ibgda_p_pingpong(st, wr.ptr(pe, &flag).unwrap() as *mut u64, 1 - pe, 200);
        })
        .unwrap();
        for pe in 0..2 {
            assert_eq!(w.read(pe, &flag, 0, 1).unwrap()[0], 200, "PE {pe}");
        }
        let s = w.pe(0).cpu_proxy().unwrap().stats();
        assert!(s.iter().map(|t| t.descriptors).sum::<u64>() > 0, "{s:?}");
    }
    let log = knobs.log();
    // Two PEs x three channels: one RC QP each way per channel (two threads own them), connected
    // over RoCE by GID.
    let count = |p: &str| log.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("ibv_create_qp "), 6, "{log:#?}");
    assert_eq!(count("ibv_modify_qp RTR "), 6);
    assert!(
        log.iter()
            .any(|l| l.starts_with("ibv_modify_qp RTR") && l.contains("global=1 dlid=0 sgid_index=0 port=1")),
        "{log:#?}"
    );
    assert_eq!(
        knobs.live(),
        0,
        "the world's teardown released every verbs object: {log:#?}"
    );
}

/// Runs `ibgda_test_atomics` from PE 0 to PE 1 (a u64 fetch-add, then a u32 add, ...) and returns
/// why the proxy failed (the world is dropped first, and must leave nothing behind).
fn atomics_fail_the_proxy(knobs: &Knobs) -> String {
    let mut w = world(2, Duration::from_secs(20), knobs);
    let (words, tickets) = (w.malloc::<u64>(64).unwrap(), w.malloc::<u64>(64).unwrap());
    let wr = &w;
    let e = wr
        .launch(1, |pe, st| unsafe {
            if pe == 0 {
                ibgda_kernels::ibgda_test_atomics(
                    st,
                    wr.ptr(0, &words).unwrap() as *mut u64,
                    wr.ptr(0, &tickets).unwrap() as *mut u64,
                    1,
                    1,
                );
            }
        })
        .unwrap_err();
    drop(w);
    assert_eq!(knobs.live(), 0, "a failed proxy's world still releases everything");
    match e {
        Error::ProxyFailed { reason, .. } => reason,
        e => panic!("expected ProxyFailed, got {e}"),
    }
}

#[test]
fn a_4_byte_atomic_is_refused_by_the_verbs_proxy_naming_what_verbs_can_do() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    // The u64 fetch-add goes through; the proxy thread refuses the u32 add.
    let reason = atomics_fail_the_proxy(&knobs);
    assert!(
        reason.contains("verbs proxy to PE 1") && reason.contains("8-byte fetch-and-add and compare-and-swap only"),
        "{reason}"
    );
}

#[test]
fn an_error_completion_and_a_refused_post_each_fail_the_proxy_with_the_cause() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    for (knob, want) in [
        ("fail_next_wr", "error completion on verbs QP"),
        ("post_send_refused", "ibv_post_send on QP"),
    ] {
        let w = world(2, Duration::from_secs(20), &knobs);
        knobs.set(knob, 1);
        let buf = 4096u64;
        let e = w
            .launch(1, |pe, st| unsafe {
                if pe == 0 {
                    let sh = ibgda_device::Shmem::attach(st);
                    ibgda_kernels::ibgda_test_fault(st, fault::PUT_QUIET, sh.heap_base().add(buf as usize), 1);
                }
            })
            .unwrap_err();
        knobs.set(knob, 0);
        let Error::ProxyFailed { reason, .. } = &e else {
            panic!("{knob}: expected ProxyFailed, got {e}")
        };
        assert!(reason.contains(want) && reason.contains("rxe0"), "{knob}: {reason}");
        drop(w);
        assert_eq!(
            knobs.live(),
            0,
            "{knob}: a failed proxy's world still releases everything"
        );
    }
}

#[test]
fn a_device_without_atomics_refuses_every_atomic_naming_the_device() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    knobs.set("no_atomics", 1);
    let reason = atomics_fail_the_proxy(&knobs);
    assert!(reason.contains("rxe0 reports no atomics"), "{reason}");
}

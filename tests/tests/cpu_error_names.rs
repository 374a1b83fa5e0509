//! Every device error names the device-API call it happened in: each call that takes a PE, given
//! `pe = n_pes`, each local-word call, given an address past the heap, and each team call given a
//! handle the runtime does not hold, reports an error whose
//! message begins `in <call>:` (and whose record holds the call), over P2P, IBGDA and the proxy.

use ibgda::abi::{ErrorKind, Op};
use ibgda_tests::group::{Link, PeGroup};
use std::time::Duration;

/// The calls a bad argument can fail: every one but the world's barriers and syncs, `quiet`,
/// `fence` and `attach` (a team's barrier and sync fail on a handle the runtime does not hold).
fn failable() -> Vec<Op> {
    Op::ALL
        .iter()
        .copied()
        .filter(|op| {
            !matches!(
                op,
                Op::Quiet
                    | Op::Fence
                    | Op::BarrierAll
                    | Op::BarrierAllBlock
                    | Op::SyncAll
                    | Op::SyncAllBlock
                    | Op::Attach
            )
        })
        .collect()
}

fn check(transport: impl Fn() -> Link) {
    for op in failable() {
        let transport = transport();
        // A fresh job per call: only a PE's first device error is kept.
        let name = format!("{transport:?}");
        let mut w = PeGroup::cpu(2, 1 << 20, Duration::from_secs(5), transport).unwrap();
        let word = w.malloc::<u64>(1).unwrap();
        let addr = w.ptr(0, &word).unwrap();
        let e = w
            .launch(1, |pe, st| unsafe {
                if pe == 0 {
                    ibgda_kernels::ibgda_test_op_fault(st, op as u32, addr as *mut u64);
                }
            })
            .unwrap_err();
        let kind = e.device_kind();
        assert!(
            matches!(
                kind,
                Some(ErrorKind::InvalidPe | ErrorKind::OutsideHeap | ErrorKind::InvalidTeam)
            ),
            "{name} {}: {e}",
            op.name()
        );
        assert_eq!(e.device_record().map(|r| r.op), Some(op as u32), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("device error on PE 0: in {}: ", op.name())),
            "{name} {}: the message does not name the call: {text}",
            op.name()
        );
    }
}

#[test]
fn every_device_error_over_p2p_names_its_call() {
    check(|| Link::P2p);
}

#[test]
fn every_device_error_over_ibgda_names_its_call() {
    check(|| Link::Ibgda(Default::default()));
}

#[test]
fn every_device_error_over_the_proxy_names_its_call() {
    check(|| Link::Proxy(Default::default()));
}

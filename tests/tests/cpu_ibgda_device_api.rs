//! The device API over IBGDA on CPU-emulated PEs: the same kernels as the P2P suite, but every
//! access to another PE is a WQE that device code builds, rings and completes on the emulated
//! mlx5 device. Small queues (16 WQEBBs) so the rings wrap many times.

use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_tests::group::{Link, PeGroup};

fn world_with(n_pes: u32, heap_size: u64, timeout: std::time::Duration) -> PeGroup {
    let options = IbgdaOptions {
        qps_per_peer: 2,
        log_depth: 4,
        log_landing_slots: 2,
        ..Default::default()
    };
    PeGroup::cpu(n_pes, heap_size, timeout, Link::Ibgda(options)).unwrap()
}

include!("common/device_api_cases.rs");

#[test]
fn a_keyed_handle_uses_one_qp_per_key_from_every_block() {
    let mut w = world(2);
    let qpns = w.malloc::<u32>(16).unwrap();
    for key in [0u32, 1, 3, 1 << 20] {
        let wr = &w;
        wr.launch(8, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_keyed_qpn(st, wr.ptr(pe, &qpns).unwrap() as *mut u32, key, 1 - pe);
        })
        .unwrap();
        for pe in 0..2 {
            let got = w.read(pe, &qpns, 0, 16).unwrap();
            let (plain, keyed): (Vec<u32>, Vec<u32>) = got.chunks(2).map(|c| (c[0], c[1])).unzip();
            // Two QPs per peer: blocks alternate between them; a key picks one for every block.
            assert_ne!(plain[0], plain[1], "PE {pe}: blocks 0 and 1 share a QP");
            assert!(keyed.iter().all(|&q| q == keyed[0]), "PE {pe}, key {key}: {keyed:?}");
            assert_eq!(
                keyed[0],
                plain[(key % 2) as usize],
                "PE {pe}, key {key}: the key's QP is block {}'s",
                key % 2
            );
        }
    }
}

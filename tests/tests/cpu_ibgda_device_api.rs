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

#[test]
fn a_threads_put_signal_queues_its_write_before_its_signal() {
    use ibgda_abi::mlx5::opcode;
    let mut w = world(2);
    let (dst, src, sig) = (
        w.malloc::<u8>(64).unwrap(),
        w.malloc::<u8>(64).unwrap(),
        w.malloc::<u64>(1).unwrap(),
    );
    let data: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(7) ^ 0x5a).collect();
    w.write(0, &src, 0, &data).unwrap();
    // PE 0's NIC holds everything posted to it, so the queue shows the post as it was written.
    let (ib, _) = w.pe(0).emulated_nic().expect("IBGDA peers");
    let nic = ib.emulated().expect("the emulated NIC");
    nic.device().set_paused(true).unwrap();
    let wr = &w;
    wr.launch(1, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_test_put_signal_nbi_one(
                st,
                wr.ptr(0, &dst).unwrap() as *mut u8,
                wr.ptr(0, &src).unwrap() as *const u8,
                64,
                wr.ptr(0, &sig).unwrap() as *mut u64,
                5,
                1,
            );
        }
    })
    .unwrap();
    // Block 0 posts on the peer's first QP; a fresh queue starts at WQEBB 0.
    let qp = ib.emulated_qp(1, 0).expect("PE 0's first QP to PE 1");
    let opcode_at = |i: usize| qp.sq_region().read::<[u8; 4]>(64 * i).unwrap()[3];
    assert_eq!(opcode_at(0), opcode::RDMA_WRITE, "the data first");
    assert_eq!(opcode_at(1), opcode::ATOMIC_FA, "then the signal");
    assert_eq!(
        w.read(1, &sig, 0, 1).unwrap(),
        vec![0],
        "nothing delivered while the NIC is paused"
    );
    nic.device().set_paused(false).unwrap();
    let t0 = std::time::Instant::now();
    while w.read(1, &sig, 0, 1).unwrap() != vec![5] {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the signal never arrived"
        );
        std::thread::yield_now();
    }
    assert_eq!(w.read(1, &dst, 0, 64).unwrap(), data, "the signal came with its data");
}

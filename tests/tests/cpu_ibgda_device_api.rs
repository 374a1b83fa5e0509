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

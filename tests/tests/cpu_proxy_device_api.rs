//! The device API through the CPU proxy on CPU-emulated PEs: the same kernels as the P2P and IBGDA
//! suites, but every access to another PE is a descriptor that device code writes into a ring and
//! a proxy thread turns into WQEs on the emulated mlx5 device. Small rings (8 slots), small send
//! queues (16 WQEBBs) and small batches, so flow control, ring wrap and full queues are exercised.

use ibgda::transport::proxy::ProxyOptions;
use ibgda_tests::group::{Link, PeGroup};

fn world_with(n_pes: u32, heap_size: u64, timeout: std::time::Duration) -> PeGroup {
    let options = ProxyOptions {
        threads: 2,
        channels: 3,
        log_ring_slots: 3,
        batch: 5,
        log_landing_slots: 2,
        log_sq_depth: 4,
        pin: false,
    };
    PeGroup::cpu(n_pes, heap_size, timeout, Link::Proxy(options)).unwrap()
}

include!("common/device_api_cases.rs");

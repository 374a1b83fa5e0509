//! The device API over the P2P transport on CPU-emulated PEs: the same kernels the GPU suite runs,
//! on CPU threads over host-memory heaps.

use ibgda::cpu::CpuWorld;

fn world_with(n_pes: u32, heap_size: u64, timeout: std::time::Duration) -> CpuWorld {
    CpuWorld::new(n_pes, heap_size, timeout).unwrap()
}

include!("common/device_api_cases.rs");

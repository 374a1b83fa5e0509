//! The device API over the P2P transport on CPU-emulated PEs: the same kernels the GPU suite runs,
//! on CPU threads over host-memory heaps.

use ibgda_tests::group::{Link, PeGroup};

fn world_with(n_pes: u32, heap_size: u64, timeout: std::time::Duration) -> PeGroup {
    PeGroup::cpu(n_pes, heap_size, timeout, Link::P2p).unwrap()
}

include!("common/device_api_cases.rs");

#[test]
fn put_on_stream_is_refused_on_cpu_emulated_pes_naming_the_pe() {
    let config = ibgda::Config {
        device: ibgda::DeviceChoice::Cpu,
        heap_size: 1 << 20,
        ..Default::default()
    };
    ibgda::run_in_process(2, config, |pe| {
        let b = pe.malloc::<u64>(8)?;
        let e = pe.put_on_stream(&b, 0, &b, 0, 8, 1 - pe.my_pe()).unwrap_err();
        assert!(
            matches!(
                &e,
                ibgda::Error::EmulatedDevice {
                    op: "put_on_stream",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains(&format!("PE {} is CPU-emulated", pe.my_pe())),
            "{e}"
        );
        Ok(())
    })
    .unwrap();
}

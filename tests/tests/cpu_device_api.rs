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

#[test]
fn zero_clears_this_pes_copy_only_and_refuses_a_foreign_buffer() {
    let config = ibgda::Config {
        device: ibgda::DeviceChoice::Cpu,
        heap_size: 1 << 20,
        ..Default::default()
    };
    ibgda::run_in_process(2, config, |pe| {
        let b = pe.malloc::<u64>(64)?;
        let guard = pe.malloc::<u64>(8)?;
        pe.write(&b, 0, &[7u64; 64])?;
        pe.write(&guard, 0, &[9u64; 8])?;
        pe.barrier()?;
        if pe.my_pe() == 0 {
            pe.zero(&b)?;
        }
        pe.barrier()?;
        let want = if pe.my_pe() == 0 { 0 } else { 7 };
        assert_eq!(pe.read(&b, 0, 64)?, vec![want; 64], "PE {}", pe.my_pe());
        assert_eq!(
            pe.read(&guard, 0, 8)?,
            vec![9u64; 8],
            "the next allocation is untouched"
        );
        Ok(())
    })
    .unwrap();
    // A buffer of another PE's heap is refused, naming the call.
    let config = ibgda::Config {
        device: ibgda::DeviceChoice::Cpu,
        heap_size: 1 << 20,
        ..Default::default()
    };
    let bufs = std::sync::Mutex::new(Vec::new());
    let e = ibgda::run_in_process(2, config, |pe| {
        let b = pe.malloc::<u64>(4)?;
        bufs.lock().unwrap().push(b);
        pe.barrier()?;
        let theirs = bufs
            .lock()
            .unwrap()
            .iter()
            .copied()
            .find(|x| pe.ptr(x).is_err())
            .unwrap();
        pe.zero(&theirs)
    })
    .unwrap_err();
    assert!(matches!(e, ibgda::Error::ForeignBuffer { call: "zero", .. }), "{e}");
}

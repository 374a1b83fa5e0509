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

#[test]
fn a_reduction_without_room_in_the_scratch_names_the_call_and_the_setting() {
    use ibgda_kernels::reduce::{self, ty};
    // 255 bytes of scratch asked for: whole 256-byte lines only, so none.
    let mut config = PeGroup::cpu_config(1 << 20, std::time::Duration::from_secs(5), Link::P2p);
    config.collective_scratch = 255;
    let mut w = PeGroup::new(2, config).unwrap();
    let buf = w.malloc::<u64>(4).unwrap();
    let before: Vec<Vec<u8>> = (0..2).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
    let wr = &w;
    let e = wr
        .launch(1, |pe, st| unsafe {
            let p = wr.ptr(pe, &buf).unwrap();
            ibgda_kernels::ibgda_test_reduce(st, reduce::SUM, ty::U64, p as *mut u8, p as *const u8, 4);
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ibgda::abi::ErrorKind::ScratchTooSmall), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("sum_reduce_block")
            && text.contains("IBGDA_COLLECTIVE_SCRATCH")
            && text.contains("16 a round needs"),
        "{text}"
    );
    assert!((0..2).all(|pe| w.heap_snapshot(pe).unwrap() == before[pe as usize]));
}

#[test]
fn the_collective_scratch_is_kept_out_of_the_users_heap() {
    // 1 MiB asked for, a 64th of a 4 MiB heap kept: the first allocation starts after the
    // header's 4 KiB and the scratch's 64 KiB.
    let mut config = PeGroup::cpu_config(4 << 20, std::time::Duration::from_secs(5), Link::P2p);
    config.collective_scratch = 1 << 20;
    let mut w = PeGroup::new(2, config).unwrap();
    let first = w.malloc::<u8>(1).unwrap();
    assert_eq!(first.offset(), 4096 + (64 << 10));
    assert_eq!(ibgda::abi::collective_scratch_bytes(4 << 20, 1 << 20), 64 << 10);
    assert_eq!(ibgda::abi::collective_scratch_bytes(256 << 20, 1 << 20), 1 << 20);
    assert_eq!(ibgda::abi::collective_scratch_bytes(1 << 30, 1000), 768);
}

//! What a real NIC would be given of a GPU, on real GPUs: GPU memory exported as dma-bufs, and
//! the mlx5 backend placing a GPU PE's queues, against the stand-in rdma-core (prebuilt, named by
//! `IBGDA_STANDIN_SO`; `gpu-bundle/run.sh` ships it). Each test prints "skipped: no CUDA device"
//! without a GPU, and fails instead when `IBGDA_REQUIRE_GPU=1`.

use ibgda_tests::gpu_or_skip;

#[path = "../../host/tests/common/mlx5_ifc.rs"]
mod mlx5_ifc;
#[path = "../../host/tests/common/standin.rs"]
mod standin;

/// What the mlx5 backend gives a NIC of GPU memory: a dma-buf of a page-aligned range of a VMM
/// allocation (the symmetric heap and queue arenas are such), whole or in part, exactly when the
/// device says it supports dma-buf; a misaligned range is refused, naming the call.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_memory_exports_as_dmabuf_for_a_nic() {
    use std::os::fd::AsRawFd;
    if !gpu_or_skip("gpu_memory_exports_as_dmabuf_for_a_nic", 1) {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let supported = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
        .unwrap()
        != 0;
    let heap = ibgda::cuda::VmmHeap::new(&ctx, 0, 4 << 20, &[]).unwrap();
    let whole = ibgda::cuda::dmabuf_fd(&ctx, 0, heap.base(), heap.size());
    let page = ibgda::cuda::dmabuf_fd(&ctx, 0, heap.base() + 4096, 4096);
    eprintln!("dma-buf supported: {supported}; whole heap: {whole:?}; one page: {page:?}");
    assert_eq!(whole.is_ok(), supported);
    assert_eq!(page.is_ok(), supported);
    if let (Ok(a), Ok(b)) = (&whole, &page) {
        assert!(a.as_raw_fd() >= 0 && b.as_raw_fd() >= 0 && a.as_raw_fd() != b.as_raw_fd());
    }
    let e = ibgda::cuda::dmabuf_fd(&ctx, 0, heap.base() + 1, 4096)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cuMemGetHandleForAddressRange"), "{e}");
}

/// The mlx5 backend with a GPU PE's placement, against the stand-in rdma-core (prebuilt, named by
/// `IBGDA_STANDIN_SO`): the send queue and CQE live in GPU memory (the CQE initialised invalid),
/// every umem and the heap's MR go to the provider as dma-bufs of that memory exactly when the
/// device supports dma-buf, and the UAR page is either mapped into the GPU (then the QP's doorbell
/// is a GPU address) or refused with the message naming the driver key (then the PE's doorbell
/// records go to host memory for the CPU-assisted doorbell, as init falls back). The stand-in's
/// UAR page is ordinary memory, not a NIC BAR, so which of the two happens is the driver's call;
/// both are checked.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_mlx5_backend_places_queues_in_gpu_memory_registered_by_dmabuf() {
    use cudarc::driver::sys;
    use ibgda::nic::mlx5::{Mlx5Lib, Mlx5Nic};
    use ibgda::nic::{access, Nic, QueueHome};
    use ibgda::placement::{GpuArena, Placement};
    if !gpu_or_skip("gpu_mlx5_backend_places_queues_in_gpu_memory_registered_by_dmabuf", 1) {
        return;
    }
    let _one = standin::SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = standin::Knobs::open();
    let so = standin::standin().to_str().unwrap().to_string();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let dmabuf = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
        .unwrap()
        != 0;
    {
        let arena = GpuArena::new(&ctx, 0, &[]).unwrap();
        let heap = ibgda::cuda::VmmHeap::new(&ctx, 0, 4 << 20, &[]).unwrap();
        let lib = std::sync::Arc::new(Mlx5Lib::load(&so, &so).unwrap());
        let nic = Mlx5Nic::open(lib, None, 1, 0, Placement::Gpu(arena.clone()), 0).unwrap();
        let mapped = nic.map_gpu_doorbell();
        eprintln!("dma-buf supported: {dmabuf}; UAR page mapped into the GPU: {mapped:?}");
        // SAFETY: the heap outlives the NIC (dropped after it, at the end of this block).
        let key = unsafe { nic.register(heap.base(), heap.size(), access::ALL) }.unwrap();
        assert_eq!(key.lkey, key.rkey);
        let home = match &mapped {
            Ok(()) => QueueHome::Device,
            Err(e) => {
                let s = e.to_string();
                assert!(
                    s.contains("PeerMappingOverride=1") && s.contains("IBGDA_DOORBELL=cpu"),
                    "{s}"
                );
                QueueHome::HostDoorbell(&ctx, 0)
            }
        };
        let qp = nic.create_qp(6, home).unwrap();
        let q = qp.queues();
        ctx.bind_to_thread().unwrap();
        for (what, addr) in [("send queue", q.sq), ("CQ", q.cq)] {
            let mut kind = 0u32;
            // SAFETY: a valid out-pointer; the driver classifies any address.
            let r = unsafe {
                sys::cuPointerGetAttribute(
                    &mut kind as *mut u32 as *mut std::ffi::c_void,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    addr,
                )
            };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what} at {addr:#x}");
            assert_eq!(
                kind,
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
                "{what} is in GPU memory"
            );
        }
        let mut cqe = [0u8; 64];
        // SAFETY: 64 bytes of the QP's live CQ buffer into a local array.
        let r = unsafe { sys::cuMemcpyDtoH_v2(cqe.as_mut_ptr() as *mut std::ffi::c_void, q.cq, 64) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        assert!(cqe.iter().all(|&b| b == 0xff), "the CQE starts invalid: {cqe:?}");
        match &mapped {
            Ok(()) => assert!(q.host.is_none() && q.doorbell & 0xfff == 0x800, "{q:?}"),
            Err(_) => {
                let host = q.host.expect("CPU doorbell: the doorbell records are on the host");
                assert!(
                    host.sq.is_none() && host.cqe.is_none(),
                    "only the doorbell records moved: {host:?}"
                );
            }
        }
        let log = knobs.log();
        let via_dmabuf = log
            .iter()
            .filter(|l| l.starts_with("mlx5dv_devx_umem_reg_ex fd=") && !l.starts_with("mlx5dv_devx_umem_reg_ex fd=-"))
            .count();
        let gpu_umems = if mapped.is_ok() { 3 } else { 2 };
        if dmabuf {
            assert_eq!(via_dmabuf, gpu_umems, "every GPU buffer as a dma-buf: {log:#?}");
            assert!(log
                .iter()
                .any(|l| l.starts_with("ibv_reg_dmabuf_mr") && l.contains(&format!("len={}", heap.size()))));
        } else {
            assert_eq!(via_dmabuf, 0, "{log:#?}");
        }
    }
    assert_eq!(knobs.live(), 0, "teardown released every object: {:#?}", knobs.log());
}

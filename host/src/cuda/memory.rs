//! RAII owners of raw CUDA memory.

use super::check;
use crate::error::Result;
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// A CUDA VMM allocation backing one PE's symmetric heap: physical memory on one GPU, mapped at a
/// reserved virtual range, readable and writable from every GPU in `access` (peer access over
/// NVLink/PCIe for the others). Never a multicast object.
pub struct VmmHeap {
    ctx: Arc<CudaContext>,
    base: sys::CUdeviceptr,
    size: usize,
    /// Address space reserved at `base` (at least `size`).
    reserved: usize,
    handle: sys::CUmemGenericAllocationHandle,
    exportable: bool,
}

// SAFETY: the allocation is process-wide; the handle and addresses are plain integers.
unsafe impl Send for VmmHeap {}
unsafe impl Sync for VmmHeap {}

fn device_location(ordinal: i32) -> sys::CUmemLocation {
    // SAFETY: CUmemLocation is plain data for which all-zero is valid.
    let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = ordinal;
    loc
}

/// Address space reserved at a fixed address is at least this large: the driver honours the
/// address only for large reservations (H100, driver 580: 6 and 16 MiB were placed elsewhere,
/// 34 MiB and up where asked). Only address space: just `size` bytes are mapped.
const MIN_FIXED_RESERVATION: usize = 64 << 20;

/// Reserves device address space for `size` bytes, at exactly `at` when given; returns the base
/// and the length reserved.
fn reserve(pe: u32, size: usize, align: usize, at: Option<u64>) -> Result<(u64, usize)> {
    let len = match at {
        // Whole windows: a job's fixed windows then tile their range with no gap between them,
        // where the driver would otherwise place this process's next allocation (seen under
        // PyTorch: a peer's window, planned right after ours, was taken by then).
        Some(_) => size
            .max(MIN_FIXED_RESERVATION)
            .next_multiple_of(align)
            .next_multiple_of(crate::shm::WINDOW_ALIGN as usize),
        None => size,
    };
    let mut base = 0;
    // SAFETY: reserving fresh address space; `at` is only a request.
    check("cuMemAddressReserve", pe, unsafe {
        sys::cuMemAddressReserve(&mut base, len, align, at.unwrap_or(0), 0)
    })?;
    match at {
        Some(want) if base != want => {
            // SAFETY: we just reserved it.
            unsafe { sys::cuMemAddressFree(base, len) };
            Err(crate::error::Error::Config {
                name: "IBGDA_GPU_VA_BASE",
                value: format!("{want:#x}"),
                why: format!(
                    "the driver placed a {len}-byte reservation at {base:#x} instead (the range is taken in this process{}): set IBGDA_GPU_VA_BASE to a free, 1 GiB-aligned range",
                    mapping_at(want, len as u64).map(|m| format!(": {m}")).unwrap_or_default()
                ),
            })
        }
        _ => Ok((base, len)),
    }
}

/// Whether `[at, at + len)` can be reserved at exactly that address in this process now (the
/// probe reservation is released again).
pub(crate) fn fixed_range_is_free(pe: u32, at: u64, len: u64) -> Result<bool> {
    let mut base = 0;
    // SAFETY: reserving fresh address space, released below.
    check("cuMemAddressReserve", pe, unsafe {
        sys::cuMemAddressReserve(&mut base, len as usize, crate::shm::WINDOW_ALIGN as usize, at, 0)
    })?;
    // SAFETY: we just reserved it.
    unsafe { sys::cuMemAddressFree(base, len as usize) };
    Ok(base == at)
}

/// The first line of `/proc/self/maps` that overlaps `[at, at + len)`, to name what holds a
/// range the driver would not give us (the driver mirrors its device reservations there).
fn mapping_at(at: u64, len: u64) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .find(|l| {
            let mut r = l.split_whitespace().next().unwrap_or("").split('-');
            let lo = u64::from_str_radix(r.next().unwrap_or(""), 16).unwrap_or(u64::MAX);
            let hi = u64::from_str_radix(r.next().unwrap_or(""), 16).unwrap_or(0);
            lo < at + len && hi > at
        })
        .map(|l| format!("/proc/self/maps has `{}`", l.trim()))
}

impl VmmHeap {
    /// Allocates at least `size` bytes on `ctx`'s device (rounded up to the allocation
    /// granularity), zeroed, and grants read/write access to each device ordinal in `access`.
    pub fn new(ctx: &Arc<CudaContext>, pe: u32, size: u64, access: &[usize]) -> Result<VmmHeap> {
        Self::create(ctx, pe, size, access, false, None)
    }

    /// [`VmmHeap::new`], exportable as a POSIX file descriptor ([`VmmHeap::export_fd`]) so that
    /// the other processes of the node can map it ([`VmmHeap::import`]).
    pub fn new_exportable(ctx: &Arc<CudaContext>, pe: u32, size: u64, access: &[usize]) -> Result<VmmHeap> {
        Self::create(ctx, pe, size, access, true, None)
    }

    /// [`VmmHeap::new_exportable`] mapped at exactly `at` (a job-wide address, so that every
    /// process maps it at the same place): an error if the range is taken.
    pub fn new_exportable_at(ctx: &Arc<CudaContext>, pe: u32, size: u64, access: &[usize], at: u64) -> Result<VmmHeap> {
        Self::create(ctx, pe, size, access, true, Some(at))
    }

    fn create(
        ctx: &Arc<CudaContext>,
        pe: u32,
        size: u64,
        access: &[usize],
        exportable: bool,
        at: Option<u64>,
    ) -> Result<VmmHeap> {
        ctx.bind_to_thread().map_err(super::cuda_err("cuCtxSetCurrent", pe))?;
        // SAFETY: CUmemAllocationProp is plain data for which all-zero is valid.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = device_location(ctx.ordinal() as i32);
        if exportable {
            prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        // The heap and the queue arenas are what a NIC reads and writes: mark them for GPUDirect
        // RDMA where the device supports it for VMM memory (as NVSHMEM does).
        let rdma = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
            .unwrap_or(0);
        prop.allocFlags.gpuDirectRDMACapable = (rdma != 0) as u8;
        let mut gran = 0usize;
        // SAFETY: valid prop and out-pointer.
        check("cuMemGetAllocationGranularity", pe, unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        let size = (size as usize).next_multiple_of(gran.max(1));
        let mut handle = 0;
        // SAFETY: valid prop; the handle is released on every error path below and in Drop.
        check("cuMemCreate", pe, unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let heap = Self::map_handle(ctx, pe, handle, size, gran, at, exportable, access)?;
        let base = heap.base;
        // Zeroed on a stream of its own, and finished before anyone writes it: `cuMemsetD8`
        // runs on the legacy stream and may return before it is done, and the writes that follow
        // (the emulated NIC's queue contexts, filled on a non-blocking stream) are not ordered
        // after the legacy stream, so they could land first and be wiped (an engine then found a
        // zeroed context: an illegal address with no error record). Not `cuCtxSynchronize`: the
        // engine's kernel never ends.
        let zeroing = ctx
            .new_stream()
            .map_err(super::cuda_err("cuStreamCreate(zero heap)", pe))?;
        // SAFETY: the range is mapped and accessible from this device; the stream is live.
        check("cuMemsetD8Async(heap)", pe, unsafe {
            sys::cuMemsetD8Async(base, 0, size, zeroing.cu_stream())
        })?;
        zeroing
            .synchronize()
            .map_err(super::cuda_err("cuStreamSynchronize(zero heap)", pe))?;
        Ok(heap)
    }

    /// Maps a peer process's heap from the descriptor it exported, at an address of this
    /// process's choosing, readable and writable from this context's device and `access`.
    pub fn import(
        ctx: &Arc<CudaContext>,
        pe: u32,
        fd: std::os::fd::OwnedFd,
        size: u64,
        access: &[usize],
    ) -> Result<VmmHeap> {
        Self::import_at(ctx, pe, fd, size, access, None)
    }

    /// [`VmmHeap::import`] at exactly `at` (where the owner mapped it), when given.
    pub fn import_at(
        ctx: &Arc<CudaContext>,
        pe: u32,
        fd: std::os::fd::OwnedFd,
        size: u64,
        access: &[usize],
        at: Option<u64>,
    ) -> Result<VmmHeap> {
        use std::os::fd::AsRawFd;
        ctx.bind_to_thread().map_err(super::cuda_err("cuCtxSetCurrent", pe))?;
        let mut handle = 0;
        // SAFETY: the driver reads the descriptor (passed by value in the pointer argument, as
        // its API asks) and takes its own reference; we close ours when `fd` drops.
        check("cuMemImportFromShareableHandle", pe, unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        let size = size as usize;
        // 2 MiB alignment: every VMM granularity divides it.
        let heap = Self::map_handle(ctx, pe, handle, size, 2 << 20, at, false, access)?;
        Ok(heap)
    }

    /// Reserves address space (at `at` when given), maps all of `handle` there and grants
    /// `access`; on failure releases what it took, `handle` included.
    #[allow(clippy::too_many_arguments)]
    fn map_handle(
        ctx: &Arc<CudaContext>,
        pe: u32,
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        align: usize,
        at: Option<u64>,
        exportable: bool,
        access: &[usize],
    ) -> Result<VmmHeap> {
        let (base, reserved) = match reserve(pe, size, align, at) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the handle is ours and mapped nowhere.
                unsafe { sys::cuMemRelease(handle) };
                return Err(e);
            }
        };
        // SAFETY: maps the whole allocation at the reserved range.
        if let Err(e) = check("cuMemMap", pe, unsafe { sys::cuMemMap(base, size, 0, handle, 0) }) {
            // SAFETY: ours, unmapped.
            unsafe {
                sys::cuMemAddressFree(base, reserved);
                sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        // From here Drop releases everything.
        let heap = VmmHeap {
            ctx: ctx.clone(),
            base,
            size,
            reserved,
            handle,
            exportable,
        };
        heap.set_access(pe, access)?;
        Ok(heap)
    }

    /// The allocation as a POSIX file descriptor for another process of this node.
    pub fn export_fd(&self, pe: u32) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        if !self.exportable {
            return Err(crate::error::Error::Config {
                name: "heap",
                value: "not exportable".into(),
                why: "created without VmmHeap::new_exportable".into(),
            });
        }
        let mut fd: i32 = -1;
        // SAFETY: the driver writes an int descriptor into `fd`.
        check("cuMemExportToShareableHandle", pe, unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut i32 as *mut std::ffi::c_void,
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: a fresh descriptor the driver made for us.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    fn set_access(&self, pe: u32, access: &[usize]) -> Result<()> {
        let (ctx, base, size) = (&self.ctx, self.base, self.size);
        let mut devices: Vec<usize> = access.to_vec();
        devices.push(ctx.ordinal());
        devices.sort();
        devices.dedup();
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&d| sys::CUmemAccessDesc {
                location: device_location(d as i32),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the range is mapped; descriptors are valid.
        check("cuMemSetAccess", pe, unsafe {
            sys::cuMemSetAccess(base, size, descs.as_ptr(), descs.len())
        })
    }

    /// Device address of the first byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size in bytes (after rounding to the granularity).
    pub fn size(&self) -> u64 {
        self.size as u64
    }
}

impl Drop for VmmHeap {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: we own the mapping, reservation and handle; no kernel uses them any more
        // (the PE synchronised its stream and passed the finalize barrier).
        unsafe {
            sys::cuMemUnmap(self.base, self.size);
            sys::cuMemAddressFree(self.base, self.reserved);
            sys::cuMemRelease(self.handle);
        }
    }
}

/// Pinned host memory mapped into the device address space (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`; deliberately not write-combined, since the CPU reads it).
pub struct MappedHost<T> {
    host: *mut T,
    device: u64,
    len: usize,
}

// SAFETY: the memory is process-wide; accesses go through volatile/atomic operations.
unsafe impl<T> Send for MappedHost<T> {}
unsafe impl<T> Sync for MappedHost<T> {}

impl<T: Copy> MappedHost<T> {
    /// Allocates `len` zeroed `T`s.
    pub fn new_zeroed(ctx: &Arc<CudaContext>, pe: u32, len: usize) -> Result<MappedHost<T>> {
        ctx.bind_to_thread().map_err(super::cuda_err("cuCtxSetCurrent", pe))?;
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer is valid; freed in Drop.
        check("cuMemHostAlloc", pe, unsafe {
            sys::cuMemHostAlloc(
                &mut p,
                bytes,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        })?;
        // SAFETY: fresh allocation of `bytes`.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
        let mut d = 0;
        // SAFETY: `p` was allocated with DEVICEMAP.
        if let Err(e) = check("cuMemHostGetDevicePointer", pe, unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
        }) {
            unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        Ok(MappedHost {
            host: p as *mut T,
            device: d,
            len,
        })
    }

    /// The device-side address.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The host-side address.
    pub fn host_ptr(&self) -> *mut T {
        self.host
    }

    /// A volatile snapshot of element `i` (the GPU may be writing it).
    pub fn read(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in bounds; volatile because another agent writes it.
        unsafe { self.host.add(i).read_volatile() }
    }

    /// Overwrites element `i`.
    pub fn write(&self, i: usize, v: T) {
        assert!(i < self.len);
        // SAFETY: in bounds.
        unsafe { self.host.add(i).write_volatile(v) }
    }
}

impl<T> Drop for MappedHost<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new_zeroed`.
        unsafe { sys::cuMemFreeHost(self.host as *mut std::ffi::c_void) };
    }
}

/// A dma-buf file descriptor for `[addr, addr + len)` of this GPU's memory
/// (`cuMemGetHandleForAddressRange`): how a NIC is given GPU memory without nvidia-peermem. Both
/// ends must be aligned to the host page size.
pub fn dmabuf_fd(ctx: &Arc<CudaContext>, pe: u32, addr: u64, len: u64) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    ctx.bind_to_thread().map_err(super::cuda_err("cuCtxSetCurrent", pe))?;
    let mut fd: i32 = -1;
    // SAFETY: the driver writes an int descriptor into `fd`; it checks the range itself.
    check("cuMemGetHandleForAddressRange(DMA_BUF_FD)", pe, unsafe {
        sys::cuMemGetHandleForAddressRange(
            &mut fd as *mut i32 as *mut std::ffi::c_void,
            addr,
            len as usize,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    // SAFETY: a fresh descriptor the driver made for us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// An I/O memory page (a NIC's UAR doorbell page, mapped into this process by rdma-core)
/// registered with the GPU so that kernels can write it (`cuMemHostRegister` with `IOMEMORY |
/// DEVICEMAP`): the GPU-doorbell half of IBGDA. Drivers refuse it unless peer mappings of I/O
/// memory are allowed (the `PeerMappingOverride=1` registry key of the NVIDIA driver).
pub struct MappedIo {
    ctx: Arc<CudaContext>,
    host: u64,
    device: u64,
}

// SAFETY: a process-wide mapping; the struct only holds addresses.
unsafe impl Send for MappedIo {}
// SAFETY: as for `Send`.
unsafe impl Sync for MappedIo {}

impl MappedIo {
    /// Registers `len` bytes of I/O memory at host address `host` (page-aligned).
    ///
    /// # Safety
    /// `[host, host + len)` is mapped I/O memory that stays mapped until the value is dropped.
    pub unsafe fn register(ctx: &Arc<CudaContext>, pe: u32, host: u64, len: usize) -> Result<MappedIo> {
        ctx.bind_to_thread().map_err(super::cuda_err("cuCtxSetCurrent", pe))?;
        // SAFETY: the caller's mapped range (this function's contract).
        check("cuMemHostRegister(IOMEMORY | DEVICEMAP)", pe, unsafe {
            sys::cuMemHostRegister_v2(
                host as *mut std::ffi::c_void,
                len,
                sys::CU_MEMHOSTREGISTER_IOMEMORY | sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        })?;
        let mut device = 0;
        // SAFETY: registered with DEVICEMAP just above.
        if let Err(e) = check("cuMemHostGetDevicePointer", pe, unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut std::ffi::c_void, 0)
        }) {
            // SAFETY: registered above, unregistered once.
            unsafe { sys::cuMemHostUnregister(host as *mut std::ffi::c_void) };
            return Err(e);
        }
        Ok(MappedIo {
            ctx: ctx.clone(),
            host,
            device,
        })
    }

    /// The GPU's address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }
}

impl Drop for MappedIo {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `register`, unregistered once.
        unsafe { sys::cuMemHostUnregister(self.host as *mut std::ffi::c_void) };
    }
}

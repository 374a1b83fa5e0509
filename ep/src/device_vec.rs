//! Device memory for callers that hold device addresses: GPU memory on a GPU PE (stream-ordered
//! on the PE's own stream), host memory on the CPU emulation. The self-check and benchmarks use it.

use crate::buffer::{read_device, DevicePtr};
use crate::error::{EpError, Result};
use ibgda::Pe;

/// Memory on this PE's device (GPU memory, or host memory on the CPU emulation), freed on drop.
///
/// On a GPU everything is stream-ordered on the PE's own stream: with PEs as threads of one
/// context, the legacy stream (and `cuMemFree`) would wait for a peer's kernel that may itself be
/// waiting for this PE.
pub struct DeviceVec {
    stream: u64,
    ptr: DevicePtr,
    bytes: usize,
    host: Vec<u128>,
    gpu: bool,
}

fn cuda<'a>(pe: &'a Pe, call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> EpError + 'a {
    move |e| {
        ibgda::Error::Cuda {
            call,
            pe: pe.my_pe(),
            source: e,
        }
        .into()
    }
}

/// Waits for this PE's stream.
fn pe_stream_sync(pe: &Pe) -> Result<()> {
    let stream = pe.gpu()?.stream().cu_stream();
    // SAFETY: the PE's live stream.
    unsafe { cudarc::driver::result::stream::synchronize(stream) }.map_err(cuda(pe, "cuStreamSynchronize"))
}

impl DeviceVec {
    /// `bytes` zeroed bytes.
    pub fn zeroed(pe: &Pe, bytes: usize) -> Result<DeviceVec> {
        let bytes = bytes.max(16);
        if pe.is_gpu() {
            let g = pe.gpu()?;
            g.context().bind_to_thread().map_err(cuda(pe, "cuCtxSetCurrent"))?;
            let stream = g.stream().cu_stream();
            // SAFETY: a fresh stream-ordered allocation on this PE's stream, zeroed before use.
            let ptr =
                unsafe { cudarc::driver::result::malloc_async(stream, bytes) }.map_err(cuda(pe, "cuMemAllocAsync"))?;
            // SAFETY: `ptr` holds `bytes` bytes.
            unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream) }
                .map_err(cuda(pe, "cuMemsetD8Async"))?;
            pe_stream_sync(pe)?;
            Ok(DeviceVec {
                stream: stream as u64,
                ptr,
                bytes,
                host: Vec::new(),
                gpu: true,
            })
        } else {
            let host = vec![0u128; bytes.div_ceil(16)];
            Ok(DeviceVec {
                stream: 0,
                ptr: host.as_ptr() as u64,
                bytes,
                host,
                gpu: false,
            })
        }
    }

    /// A copy of `data` (16-byte aligned).
    pub fn from_slice<T: bytemuck::Pod>(pe: &Pe, data: &[T]) -> Result<DeviceVec> {
        let v = DeviceVec::zeroed(pe, std::mem::size_of_val(data))?;
        let src: &[u8] = bytemuck::cast_slice(data);
        if v.gpu {
            // SAFETY: `v` holds at least `src.len()` bytes; `src` outlives the sync below.
            unsafe { cudarc::driver::result::memcpy_htod_async(v.ptr, src, v.stream as cudarc::driver::sys::CUstream) }
                .map_err(cuda(pe, "cuMemcpyHtoDAsync"))?;
            pe_stream_sync(pe)?;
        } else {
            // SAFETY: `v.host` holds at least `src.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v.ptr as *mut u8, src.len()) };
        }
        Ok(v)
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Reads `n` values back (waits for the PE's work first).
    pub fn read<T: bytemuck::Pod + Default>(&self, pe: &Pe, n: usize) -> Result<Vec<T>> {
        assert!(n * std::mem::size_of::<T>() <= self.bytes);
        pe.synchronize()?;
        // SAFETY: in bounds, and the PE's work is done.
        unsafe { read_device(pe, self.ptr, n) }
    }
}

impl Drop for DeviceVec {
    fn drop(&mut self) {
        if self.gpu {
            // SAFETY: allocated by `malloc_async` on this stream and freed once, in stream order
            // after the kernels that use it.
            let _ =
                unsafe { cudarc::driver::result::free_async(self.ptr, self.stream as cudarc::driver::sys::CUstream) };
        }
        let _ = &self.host;
    }
}

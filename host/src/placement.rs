//! Where the runtime puts the memory NICs and posters share: queues, doorbell records, UAR pages,
//! CQ buffers, context tables, counters and landing buffers, in host memory (the CPU engine and
//! CPU-emulated PEs), in GPU memory (the GPU engine and GPU posters), or in host memory mapped
//! into the GPU (registers a CPU writes).

use crate::cuda::{check, cuda_err, MappedHost, VmmHeap};
use crate::error::Result;
use crate::shm::SharedArena;
use cudarc::driver::{sys, CudaContext, CudaStream};
use parking_lot::Mutex;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A zeroed, aligned host allocation with a stable address, freed on drop.
pub struct HostRegion {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the region is plain memory; every concurrent access to it goes through raw pointers with
// atomics or under the emulated hardware's publish protocol, never through Rust references.
unsafe impl Send for HostRegion {}
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// `bytes` zeroed bytes aligned to `align` (a power of two).
    pub fn zeroed(bytes: usize, align: usize) -> HostRegion {
        let layout = Layout::from_size_align(bytes.max(1), align).expect("host region layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostRegion { ptr, layout }
    }

    /// `bytes` bytes filled with `byte`.
    pub fn filled(bytes: usize, align: usize, byte: u8) -> HostRegion {
        let r = Self::zeroed(bytes, align);
        // SAFETY: freshly allocated, `bytes` long, not shared yet.
        unsafe { std::ptr::write_bytes(r.ptr, byte, bytes) };
        r
    }

    /// A region holding one `T`, zeroed.
    pub fn for_value<T>() -> HostRegion {
        Self::zeroed(std::mem::size_of::<T>(), std::mem::align_of::<T>().max(64))
    }

    /// The first byte.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The region as a `*mut T`.
    pub fn as_ptr<T>(&self) -> *mut T {
        self.ptr as *mut T
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether the region is empty (never: regions have at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// Where the emulated device (and the IBGDA transport around it) keeps a buffer.
#[derive(Clone)]
pub enum Placement {
    /// Host memory: the CPU engine and CPU-emulated PEs.
    Host,
    /// GPU memory (a [`GpuArena`]), for the GPU engine and GPU posters.
    Gpu(Arc<GpuArena>),
    /// A PE's shared window ([`SharedArena`]), mapped at the same address in every process of
    /// the node: CPU-emulated PEs in separate processes.
    Shared(Arc<SharedArena>),
}

impl Placement {
    /// `bytes` zeroed bytes aligned to `align` (at most 4096).
    pub fn zeroed(&self, bytes: usize, align: usize) -> Result<Region> {
        match self {
            Placement::Host => {
                let r = HostRegion::zeroed(bytes, align);
                Ok(Region {
                    addr: r.addr(),
                    len: bytes,
                    backing: Backing::Host(r),
                })
            }
            Placement::Gpu(arena) => arena.alloc(bytes, align),
            Placement::Shared(arena) => Ok(Region {
                addr: arena.alloc(bytes, align)?,
                len: bytes,
                backing: Backing::Shared(arena.clone()),
            }),
        }
    }

    /// `bytes` bytes filled with `byte`.
    pub fn filled(&self, bytes: usize, align: usize, byte: u8) -> Result<Region> {
        let r = self.zeroed(bytes, align)?;
        r.fill(byte)?;
        Ok(r)
    }

    /// A region holding one zeroed `T`.
    pub fn for_value<T>(&self) -> Result<Region> {
        self.zeroed(std::mem::size_of::<T>(), std::mem::align_of::<T>().clamp(64, 4096))
    }

    /// Whether CPU threads can read and write this placement's memory directly.
    pub fn is_host(&self) -> bool {
        matches!(self, Placement::Host | Placement::Shared(_))
    }
}

enum Backing {
    Host(HostRegion),
    Gpu(Arc<GpuArena>),
    Mapped(MappedHost<u8>),
    /// Part of a shared window (never freed on its own: the window goes as a whole, once the
    /// last region holding it is gone).
    Shared(#[allow(dead_code)] Arc<SharedArena>),
}

/// One buffer of the emulated device: host memory, GPU memory, or host memory mapped into the
/// GPU. [`Region::addr`] is the address the engine and the posters use; the host reads and writes
/// through the methods here, which copy for GPU memory.
pub struct Region {
    addr: u64,
    len: usize,
    backing: Backing,
}

impl Region {
    /// Host memory mapped into `ctx`'s GPU (`cuMemHostAlloc`), zeroed: for registers a CPU writes
    /// and the GPU engine reads (CPU-assisted doorbells).
    pub fn mapped(ctx: &Arc<CudaContext>, pe: u32, bytes: usize) -> Result<Region> {
        let m = MappedHost::<u8>::new_zeroed(ctx, pe, bytes)?;
        Ok(Region {
            addr: m.device_ptr(),
            len: bytes,
            backing: Backing::Mapped(m),
        })
    }

    /// The address the device side (engine, posters) uses.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A pointer the host may dereference, for host and mapped memory; `None` for GPU memory.
    pub fn host_ptr<T>(&self) -> Option<*mut T> {
        match &self.backing {
            Backing::Host(h) => Some(h.as_ptr()),
            Backing::Mapped(m) => Some(m.host_ptr() as *mut T),
            Backing::Shared(_) => Some(self.addr as *mut T),
            Backing::Gpu(_) => None,
        }
    }

    fn check(&self, offset: usize, n: usize) {
        assert!(
            offset.checked_add(n).is_some_and(|e| e <= self.len),
            "region access {offset}+{n} beyond {} bytes",
            self.len
        );
    }

    /// Writes `bytes` at `offset` (plain stores; for GPU memory, a copy that completes before
    /// returning).
    pub fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check(offset, bytes.len());
        match (&self.backing, self.host_ptr::<u8>()) {
            (Backing::Gpu(a), _) => a.copy_in(self.addr + offset as u64, bytes),
            (_, Some(p)) => {
                // SAFETY: in bounds (checked); the device side does not write these bytes while
                // the control plane does (setup, or fields the engine only reads).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(offset), bytes.len()) };
                Ok(())
            }
            _ => unreachable!("host and mapped regions have host pointers"),
        }
    }

    /// Reads `out.len()` bytes at `offset`.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len());
        match (&self.backing, self.host_ptr::<u8>()) {
            (Backing::Gpu(a), _) => a.copy_out(self.addr + offset as u64, out),
            (_, Some(p)) => {
                for (i, b) in out.iter_mut().enumerate() {
                    // SAFETY: in bounds; volatile because another agent may be writing.
                    *b = unsafe { p.add(offset + i).read_volatile() };
                }
                Ok(())
            }
            _ => unreachable!("host and mapped regions have host pointers"),
        }
    }

    /// Writes a plain-data value at `offset`.
    pub fn write<T: Copy>(&self, offset: usize, v: &T) -> Result<()> {
        // SAFETY: T is plain #[repr(C)] data; viewing it as bytes is fine.
        let b = unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) };
        self.write_bytes(offset, b)
    }

    /// Reads a plain-data value at `offset`.
    pub fn read<T: Copy>(&self, offset: usize) -> Result<T> {
        let mut v = std::mem::MaybeUninit::<T>::zeroed();
        // SAFETY: the buffer is size_of::<T>() bytes; T is plain data valid for any bytes read
        // back from a T written earlier.
        let b = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of::<T>()) };
        self.read_bytes(offset, b)?;
        // SAFETY: fully initialised above.
        Ok(unsafe { v.assume_init() })
    }

    /// Stores a `u32` at `offset` so that a concurrent reader sees the old or the new value
    /// (release for host memory; one 4-byte copy for GPU memory).
    pub fn store_u32(&self, offset: usize, v: u32) -> Result<()> {
        self.check(offset, 4);
        match self.host_ptr::<u8>() {
            // SAFETY: in bounds and 4-aligned (callers pass field offsets); atomic access.
            Some(p) => unsafe {
                AtomicU32::from_ptr(p.add(offset) as *mut u32).store(v, Ordering::Release);
                Ok(())
            },
            None => self.write_bytes(offset, &v.to_le_bytes()),
        }
    }

    /// Stores a `u64` at `offset` (as [`Region::store_u32`]).
    pub fn store_u64(&self, offset: usize, v: u64) -> Result<()> {
        self.check(offset, 8);
        match self.host_ptr::<u8>() {
            // SAFETY: in bounds and 8-aligned; atomic access.
            Some(p) => unsafe {
                AtomicU64::from_ptr(p.add(offset) as *mut u64).store(v, Ordering::Release);
                Ok(())
            },
            None => self.write_bytes(offset, &v.to_le_bytes()),
        }
    }

    /// Loads a `u32` at `offset` (acquire for host memory).
    pub fn load_u32(&self, offset: usize) -> Result<u32> {
        self.check(offset, 4);
        match self.host_ptr::<u8>() {
            // SAFETY: in bounds and 4-aligned; atomic access.
            Some(p) => Ok(unsafe { AtomicU32::from_ptr(p.add(offset) as *mut u32).load(Ordering::Acquire) }),
            None => self.read(offset),
        }
    }

    /// Loads a `u64` at `offset` (acquire for host memory).
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset, 8);
        match self.host_ptr::<u8>() {
            // SAFETY: in bounds and 8-aligned; atomic access.
            Some(p) => Ok(unsafe { AtomicU64::from_ptr(p.add(offset) as *mut u64).load(Ordering::Acquire) }),
            None => self.read(offset),
        }
    }

    /// Fills the whole region with `byte`.
    pub fn fill(&self, byte: u8) -> Result<()> {
        match (&self.backing, self.host_ptr::<u8>()) {
            (Backing::Gpu(a), _) => a.fill(self.addr, byte, self.len),
            (_, Some(p)) => {
                // SAFETY: the whole region, owned.
                unsafe { std::ptr::write_bytes(p, byte, self.len) };
                Ok(())
            }
            _ => unreachable!("host and mapped regions have host pointers"),
        }
    }
}

/// GPU memory for the emulated device's queues and tables: VMM chunks on one GPU, mapped for
/// every GPU of the process (a peer's engine reads a responder QP's context and memory-region
/// table over NVLink), handed out by a bump allocator and freed together when the last region and
/// the arena are dropped. Host access goes through copies on the arena's own non-blocking stream,
/// so it never waits for the persistent engine kernel.
pub struct GpuArena {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pe: u32,
    access: Vec<usize>,
    chunks: Mutex<Vec<(VmmHeap, usize)>>,
    /// One given chunk and no growth (a window shared with other processes at a fixed address).
    fixed: bool,
}

/// Bytes of one arena chunk (at least; a larger request gets a chunk of its own).
const ARENA_CHUNK: usize = 4 << 20;

impl GpuArena {
    /// An arena on `ctx`'s GPU whose memory the GPUs `access` (device ordinals) may also use.
    pub fn new(ctx: &Arc<CudaContext>, pe: u32, access: &[usize]) -> Result<Arc<GpuArena>> {
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate(emu arena)", pe))?;
        Ok(Arc::new(GpuArena {
            ctx: ctx.clone(),
            stream,
            pe,
            access: access.to_vec(),
            chunks: Mutex::new(Vec::new()),
            fixed: false,
        }))
    }

    /// An arena that hands out `chunk` only (never grows): the emulated NIC's window of a PE whose
    /// peers are other processes, exported and mapped by them at the same address.
    pub fn in_chunk(ctx: &Arc<CudaContext>, pe: u32, chunk: VmmHeap) -> Result<Arc<GpuArena>> {
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate(emu arena)", pe))?;
        Ok(Arc::new(GpuArena {
            ctx: ctx.clone(),
            stream,
            pe,
            access: Vec::new(),
            chunks: Mutex::new(vec![(chunk, 0)]),
            fixed: true,
        }))
    }

    /// The context the arena lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Bytes reserved on the GPU so far.
    pub fn reserved_bytes(&self) -> u64 {
        self.chunks.lock().iter().map(|(h, _)| h.size()).sum()
    }

    fn alloc(self: &Arc<Self>, bytes: usize, align: usize) -> Result<Region> {
        assert!(align.is_power_of_two() && align <= 4096, "arena alignment {align}");
        let bytes = bytes.max(1);
        let mut chunks = self.chunks.lock();
        let fits = |(h, used): &(VmmHeap, usize)| used.next_multiple_of(align) + bytes <= h.size() as usize;
        if !chunks.last().is_some_and(fits) {
            if self.fixed {
                return Err(crate::error::Error::EmulatedDevice {
                    op: "allocate queue memory",
                    reason: format!(
                        "PE {}: the NIC window of {} bytes is full ({bytes} more needed); fewer QPs per peer or a smaller IBGDA_SQ_LOG_DEPTH",
                        self.pe,
                        chunks.first().map_or(0, |(h, _)| h.size())
                    ),
                });
            }
            let heap = VmmHeap::new(&self.ctx, self.pe, bytes.max(ARENA_CHUNK) as u64, &self.access)?;
            chunks.push((heap, 0));
        }
        let (heap, used) = chunks.last_mut().expect("a chunk");
        let off = used.next_multiple_of(align);
        *used = off + bytes;
        Ok(Region {
            addr: heap.base() + off as u64,
            len: bytes,
            backing: Backing::Gpu(self.clone()),
        })
    }

    fn copy_in(&self, dst: u64, bytes: &[u8]) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.pe))?;
        // SAFETY: `dst..+len` lies in one of our chunks (Region bounds); the source outlives the
        // synchronisation below.
        check("cuMemcpyHtoDAsync(emu)", self.pe, unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, bytes.as_ptr().cast(), bytes.len(), self.stream.cu_stream())
        })?;
        self.stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize(emu)", self.pe))
    }

    fn copy_out(&self, src: u64, out: &mut [u8]) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.pe))?;
        // SAFETY: as copy_in, reversed.
        check("cuMemcpyDtoHAsync(emu)", self.pe, unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, out.len(), self.stream.cu_stream())
        })?;
        self.stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize(emu)", self.pe))
    }

    fn fill(&self, dst: u64, byte: u8, len: usize) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent", self.pe))?;
        // SAFETY: inside one of our chunks.
        check("cuMemsetD8Async(emu)", self.pe, unsafe {
            sys::cuMemsetD8Async(dst, byte, len, self.stream.cu_stream())
        })?;
        self.stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize(emu)", self.pe))
    }
}

/// The host's page size (4 KiB on x86-64, up to 64 KiB on some aarch64 kernels): the granule in
/// which NIC registrations and dma-buf exports of memory work.
pub fn host_page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .map_or(4096, |p| p as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_regions_read_write_and_store_at_offsets() {
        let r = Placement::Host.filled(64, 64, 0xab).unwrap();
        assert_eq!(r.len(), 64);
        assert_eq!(r.read::<u32>(0).unwrap(), 0xabab_abab);
        r.store_u32(4, 7).unwrap();
        r.store_u64(8, u64::MAX - 1).unwrap();
        r.write(16, &[1u16, 2, 3]).unwrap();
        assert_eq!(r.load_u32(4).unwrap(), 7);
        assert_eq!(r.load_u64(8).unwrap(), u64::MAX - 1);
        assert_eq!(r.read::<[u16; 3]>(16).unwrap(), [1, 2, 3]);
        let mut b = [0u8; 2];
        r.read_bytes(62, &mut b).unwrap();
        assert_eq!(b, [0xab, 0xab]);
        assert_eq!(r.host_ptr::<u8>().unwrap() as u64, r.addr());
    }

    #[test]
    #[should_panic(expected = "beyond 64 bytes")]
    fn out_of_range_access_is_caught() {
        let r = Placement::Host.zeroed(64, 64).unwrap();
        let _ = r.store_u64(60, 1);
    }
}

/// Where a QP's host-facing memory lives, beyond the NIC's own placement of its queues (the NIC
/// backends and the emulated device both take it, so it lives with placement, not with either).
#[derive(Clone, Copy)]
pub enum QueueHome<'a> {
    /// Everything where the NIC places its queues (GPU memory for IBGDA, host memory for
    /// CPU-emulated PEs).
    Device,
    /// The doorbell record and UAR page in host memory mapped into this GPU (PE named for
    /// errors): a CPU rings the doorbell on the GPU's behalf (CPU-assisted doorbell).
    HostDoorbell(&'a Arc<CudaContext>, u32),
    /// The send queue, doorbell record, UAR page and CQ in host memory mapped into this GPU: a
    /// CPU proxy builds the WQEs, rings and polls.
    Host(&'a Arc<CudaContext>, u32),
}

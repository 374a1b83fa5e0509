//! CPU emulation of GPU PEs: every PE's symmetric heap is host memory, and CPU threads stand in
//! for GPU threads (by default one thread per block; [`CpuWorld::launch_grid`] runs whole warps
//! and blocks) running the very same device code
//! (`ibgda-device` compiled for the host). This is what runs on machines without a GPU: CI, and
//! the demo's fallback.

use crate::emu::Placement;
use crate::error::{Error, Result};
use crate::heap::SymmetricAllocator;
use crate::symmetric::SymmetricBuffer;
use crate::transport::ibgda::{EmulatedIbgda, IbgdaOptions};
use crate::transport::proxy::{Proxy, ProxyChannels, ProxyOptions};
use ibgda_abi::{error_state, DeviceState, ErrorRecord, PeerInfo, TransportKind, HEAP_RESERVED_BYTES};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Host memory aligned for the heap (4 KiB), zeroed.
struct HostHeap {
    ptr: *mut u8,
    layout: Layout,
}

impl HostHeap {
    fn new(bytes: u64) -> HostHeap {
        let layout = Layout::from_size_align(bytes as usize, 4096).expect("heap layout");
        // SAFETY: non-zero size (checked by the caller).
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of host memory for a {bytes}-byte emulated heap");
        HostHeap { ptr, layout }
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

struct CpuPe {
    heap: HostHeap,
    state: Box<DeviceState>,
    _peers: Box<[PeerInfo]>,
    error: Box<ErrorRecord>,
    /// The record's claim word (outside the heap, so a fault leaves the heap byte-identical).
    claim: Box<AtomicU32>,
}

/// How CPU-emulated PEs reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuTransport {
    /// Loads and stores into each other's heaps (the P2P transport's semantics).
    P2p,
    /// IBGDA: device code builds WQEs, rings doorbells and polls CQs of RC QPs on the emulated
    /// mlx5 device, whose engine thread moves the data.
    Ibgda(IbgdaOptions),
    /// CPU proxy: device code writes descriptors into rings that proxy threads turn into WQEs on
    /// the emulated device's QPs.
    Proxy(ProxyOptions),
}

/// `n_pes` emulated PEs in this process, driven from one host thread: every PE's heap, launches
/// of host closures and heap snapshots from one place, for the fault-injection and protocol
/// suites that need to see all PEs at once. A program is written against [`crate::Pe`] and run
/// with [`crate::run`], which runs on the CPU emulation too (`IBGDA_DEVICE=cpu`).
pub struct CpuWorld {
    // Dropped first: the proxy threads stop before the QPs they post to.
    proxies: Vec<(Proxy, Arc<ProxyChannels>)>,
    // Then the emulated NIC, before the heaps it writes go away.
    ibgda: Option<EmulatedIbgda>,
    pes: Vec<CpuPe>,
    heap_size: u64,
    alloc: SymmetricAllocator,
}

// SAFETY: the raw heap pointers are owned by the world and only dereferenced by device code under
// the device API's own synchronisation, or by `read`/`write` while no launch is running (they take
// `&self` but launches borrow the world for their whole duration and join every thread).
unsafe impl Send for CpuWorld {}
unsafe impl Sync for CpuWorld {}

impl CpuWorld {
    /// `n_pes` PEs with `heap_size`-byte heaps reaching each other by loads and stores; device
    /// waits time out after `timeout`.
    pub fn new(n_pes: u32, heap_size: u64, timeout: Duration) -> Result<CpuWorld> {
        Self::with_transport(n_pes, heap_size, timeout, CpuTransport::P2p)
    }

    /// `n_pes` PEs connected by `transport`.
    pub fn with_transport(n_pes: u32, heap_size: u64, timeout: Duration, transport: CpuTransport) -> Result<CpuWorld> {
        Self::build(n_pes, heap_size, timeout, transport, None)
    }

    /// `n_pes` PEs connected by the CPU proxy over the NIC `nic` asks for (`verbs`: any RDMA
    /// device through standard verbs; `mlx5`: a ConnectX; else the emulated device).
    pub fn with_proxy_over(
        n_pes: u32,
        heap_size: u64,
        timeout: Duration,
        options: crate::transport::proxy::ProxyOptions,
        nic: &crate::nic::NicRequest,
    ) -> Result<CpuWorld> {
        Self::build(n_pes, heap_size, timeout, CpuTransport::Proxy(options), Some(nic))
    }

    fn build(
        n_pes: u32,
        heap_size: u64,
        timeout: Duration,
        transport: CpuTransport,
        nic: Option<&crate::nic::NicRequest>,
    ) -> Result<CpuWorld> {
        if n_pes == 0 {
            return Err(Error::Config {
                name: "n_pes",
                value: "0".into(),
                why: "need at least one PE".into(),
            });
        }
        if heap_size <= HEAP_RESERVED_BYTES {
            return Err(Error::Config {
                name: "IBGDA_SYMMETRIC_SIZE",
                value: heap_size.to_string(),
                why: format!("must exceed the {HEAP_RESERVED_BYTES} bytes the runtime reserves"),
            });
        }
        let heaps: Vec<HostHeap> = (0..n_pes).map(|_| HostHeap::new(heap_size)).collect();
        let ranges: Vec<(u64, u64)> = heaps.iter().map(|h| (h.ptr as u64, heap_size)).collect();
        let (ibgda, proxy_options) = match transport {
            CpuTransport::P2p => (None, None),
            // SAFETY: the heaps outlive `ibgda` (the world drops it first).
            CpuTransport::Ibgda(options) => (Some(unsafe { EmulatedIbgda::connect(&ranges, options)? }), None),
            CpuTransport::Proxy(options) => {
                options.check()?;
                let open = |fabric: &crate::emu::Fabric, pe: u32| match nic {
                    Some(req) => crate::nic::open_for_cpu(req, fabric, Placement::Host, pe, true),
                    None => Ok(Box::new(crate::nic::EmulatedNic::open(fabric, Placement::Host, pe)?)
                        as Box<dyn crate::nic::Nic>),
                };
                // SAFETY: as above.
                (
                    Some(unsafe { EmulatedIbgda::connect_with(&ranges, options.qp_options(), &open)? }),
                    Some(options),
                )
            }
        };
        let mut proxies = Vec::new();
        if let (Some(t), Some(options)) = (&ibgda, proxy_options) {
            for p in &t.pes {
                let channels = Arc::new(ProxyChannels::create(p, &Placement::Host, None, options)?);
                proxies.push((Proxy::start(p, channels.clone())?, channels));
            }
        }
        let peer_kind = if proxy_options.is_some() {
            TransportKind::Proxy
        } else {
            TransportKind::Ibgda
        };
        let bases: Vec<u64> = heaps.iter().map(|h| h.ptr as u64).collect();
        let heap_base_of = |j: usize| bases[j];
        let pes = heaps
            .into_iter()
            .enumerate()
            .map(|(i, heap)| {
                // Self is always reached directly; other PEs by the chosen transport.
                let peers: Box<[PeerInfo]> = (0..n_pes as usize)
                    .map(|j| {
                        let direct = ibgda.is_none() || j == i;
                        PeerInfo {
                            heap_base: if direct { heap_base_of(j) } else { 0 },
                            transport: if direct { TransportKind::P2p } else { peer_kind } as u32,
                            device: u32::MAX,
                        }
                    })
                    .collect();
                let (qps, qps_per_peer) = match &ibgda {
                    Some(t) if proxy_options.is_none() => (t.pes[i].descriptor_table(), t.options.qps_per_peer),
                    _ => (0, 0),
                };
                let (proxy, proxy_channels) = proxies.get(i).map_or((0, 0), |(_, c)| (c.table(), c.count()));
                let claim = Box::new(AtomicU32::new(0));
                let error = Box::new(ErrorRecord {
                    claim: claim.as_ptr() as u64,
                    ..ErrorRecord::default()
                });
                let state = Box::new(DeviceState {
                    qps,
                    qps_per_peer,
                    proxy,
                    proxy_channels,
                    ..DeviceState::new(
                        i as u32,
                        n_pes,
                        (heap.ptr as u64, heap_size),
                        peers.as_ptr() as u64,
                        &*error as *const ErrorRecord as u64,
                        timeout.as_nanos() as u64,
                    )
                });
                CpuPe {
                    heap,
                    state,
                    _peers: peers,
                    error,
                    claim,
                }
            })
            .collect();
        Ok(CpuWorld {
            proxies,
            ibgda,
            pes,
            heap_size,
            alloc: SymmetricAllocator::new(0, HEAP_RESERVED_BYTES, heap_size),
        })
    }

    /// The IBGDA transport over the emulated device, when the world uses it (its fabric, devices
    /// and QPs, for fault injection and statistics).
    pub fn ibgda(&self) -> Option<&EmulatedIbgda> {
        self.ibgda.as_ref()
    }

    /// PE `pe`'s proxy threads, when the world uses the proxy transport (statistics, fault
    /// injection).
    pub fn proxy(&self, pe: u32) -> Option<&Proxy> {
        self.proxies.get(pe as usize).map(|(p, _)| p)
    }

    /// PE `pe`'s proxy channels, when the world uses the proxy transport.
    pub fn proxy_channels(&self, pe: u32) -> Option<&ProxyChannels> {
        self.proxies.get(pe as usize).map(|(_, c)| &**c)
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> u32 {
        self.pes.len() as u32
    }

    /// Heap size of every PE.
    pub fn heap_size(&self) -> u64 {
        self.heap_size
    }

    fn pe(&self, call: &'static str, pe: u32) -> Result<&CpuPe> {
        self.pes.get(pe as usize).ok_or(Error::InvalidPe {
            call,
            pe,
            n_pes: self.n_pes(),
        })
    }

    /// The device-state pointer for PE `pe`'s kernels.
    pub fn state(&self, pe: u32) -> Result<*const DeviceState> {
        Ok(&*self.pe("state", pe)?.state as *const DeviceState)
    }

    /// PE `pe`'s address of `buf` (its symmetric address in kernels).
    pub fn ptr<T>(&self, pe: u32, buf: &SymmetricBuffer<T>) -> Result<u64> {
        Ok(self.pe("ptr", pe)?.heap.ptr as u64 + buf.offset)
    }

    /// Allocates `len` zeroed elements at the same offset on every PE.
    pub fn malloc<T>(&mut self, len: usize) -> Result<SymmetricBuffer<T>> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let off = self.alloc.alloc(bytes)?;
        let rounded = self.alloc.size_of(off).unwrap_or(bytes);
        for p in &self.pes {
            // SAFETY: [off, off+rounded) is inside every heap; no launch is running (&mut self).
            unsafe { std::ptr::write_bytes(p.heap.ptr.add(off as usize), 0, rounded as usize) };
        }
        Ok(SymmetricBuffer::new(0, off, len))
    }

    /// Frees `buf` on every PE (`ForeignFree` if it is not a live allocation).
    pub fn free<T>(&mut self, buf: SymmetricBuffer<T>) -> Result<()> {
        self.alloc.free(buf.offset)
    }

    /// Frees by heap offset.
    pub fn free_offset(&mut self, offset: u64) -> Result<()> {
        self.alloc.free(offset)
    }

    /// Copies `data` into PE `pe`'s copy of `buf` from element `start`.
    pub fn write<T: Copy>(&mut self, pe: u32, buf: &SymmetricBuffer<T>, start: usize, data: &[T]) -> Result<()> {
        let base = self.pe("write", pe)?.heap.ptr;
        buf.check_range("write", pe, start, data.len())?;
        // SAFETY: in bounds (checked); exclusive access (&mut self).
        unsafe {
            let dst = base.add(buf.offset as usize) as *mut T;
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst.add(start), data.len());
        }
        Ok(())
    }

    /// Reads `len` elements of PE `pe`'s copy of `buf` from element `start`.
    pub fn read<T: Copy>(&self, pe: u32, buf: &SymmetricBuffer<T>, start: usize, len: usize) -> Result<Vec<T>> {
        let base = self.pe("read", pe)?.heap.ptr;
        buf.check_range("read", pe, start, len)?;
        // SAFETY: in bounds (checked); no launch is running while the host reads.
        unsafe {
            let src = (base.add(buf.offset as usize) as *const T).add(start);
            Ok(std::slice::from_raw_parts(src, len).to_vec())
        }
    }

    /// A raw view of PE `pe`'s whole heap (for tests that check nothing outside a target changed).
    pub fn heap_snapshot(&self, pe: u32) -> Result<Vec<u8>> {
        let p = self.pe("heap_snapshot", pe)?;
        // SAFETY: the heap is `heap_size` bytes; no launch is running.
        Ok(unsafe { std::slice::from_raw_parts(p.heap.ptr, self.heap_size as usize).to_vec() })
    }

    /// The error record of PE `pe`, if a kernel reported one.
    pub fn device_error(&self, pe: u32) -> Option<ErrorRecord> {
        let p = self.pes.get(pe as usize)?;
        // SAFETY: the record is a live Box; written by device code with atomics, read after join.
        let rec = unsafe { std::ptr::read_volatile(&*p.error) };
        (rec.state == error_state::WRITTEN).then_some(rec)
    }

    /// Clears every PE's error record (the emulation survives a trap; a GPU context does not).
    pub fn clear_errors(&mut self) {
        for p in &mut self.pes {
            *p.error = ErrorRecord {
                claim: p.claim.as_ptr() as u64,
                ..ErrorRecord::default()
            };
            p.claim.store(0, Ordering::Release);
        }
    }

    /// Runs a kernel on every PE: `blocks` CPU threads per PE, each calling `kernel(pe, state)` as
    /// one block of one thread. Returns when all threads have finished: the first PE's device error
    /// record if any kernel reported one, else a panic as `EmulatedPanic`.
    pub fn launch<F>(&self, blocks: u32, kernel: F) -> Result<()>
    where
        F: Fn(u32, *const DeviceState) + Sync,
    {
        self.launch_grid(blocks, 1, kernel)
    }

    /// [`launch`](Self::launch) with `threads` threads per block, every one a CPU thread calling
    /// `kernel(pe, state)`: warps of 32 lanes (one narrow warp of a power-of-two width below
    /// that) whose collectives are real rendezvous, and a real block barrier, so warp- and
    /// block-scope code runs as on a GPU.
    pub fn launch_grid<F>(&self, blocks: u32, threads: u32, kernel: F) -> Result<()>
    where
        F: Fn(u32, *const DeviceState) + Sync,
    {
        let states: Vec<usize> = self
            .pes
            .iter()
            .map(|p| &*p.state as *const DeviceState as usize)
            .collect();
        // Every PE's blocks run at once: their kernels wait on each other.
        let panics: Vec<(u32, u32, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = states
                .iter()
                .enumerate()
                .map(|(pe, &st)| {
                    let k = &kernel;
                    s.spawn(move || crate::pe::run_blocks(blocks, threads, |_| k(pe as u32, st as *const DeviceState)))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .filter_map(|(pe, h)| h.join().expect("emulated PE thread").map(|(b, m)| (pe as u32, b, m)))
                .collect()
        });
        for pe in 0..self.n_pes() {
            if let Some(rec) = self.device_error(pe) {
                return Err(Proxy::device_error(self.proxy(pe), rec));
            }
        }
        match panics.into_iter().next() {
            Some((pe, block, message)) => Err(Error::EmulatedPanic { pe, block, message }),
            None => Ok(()),
        }
    }
}

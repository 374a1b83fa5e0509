//! A ConnectX behind the [`Nic`] boundary: what IBGDA needs of it, placed as NVSHMEM places it.
//!
//! Per QP, three buffers, each registered with the NIC as a DEVX umem: the send queue; the two
//! doorbell records (the QP's at offset 0, its CQ's at 64); and the collapsed CQ's one CQE,
//! initialised to 0xff (an invalid opcode with the owner bit set, so nothing reads as complete).
//! [`QueueHome::Device`] puts all three where the NIC's [`Placement`] says (GPU memory for GPU
//! posters, registered through dma-buf when the driver gives one, else as peer memory); a CPU-
//! assisted doorbell ([`QueueHome::HostDoorbell`]) puts the doorbell records in host memory
//! mapped into the GPU, which the CPU thread writes; a proxy ([`QueueHome::Host`]) puts all
//! three there.
//!
//! One UAR per NIC carries every QP's doorbell register. GPU posters need its page mapped into the
//! GPU (`cuMemHostRegister` with `IOMEMORY`); when the driver refuses, creating a GPU-doorbell QP
//! fails naming the registry key that allows it and the CPU-assisted doorbell that needs none.

use super::device::{MemoryRegistration, Mlx5Device, Mlx5Lib, NicError, Uar, Umem};
use super::prm::{CqSpec, QpSpec};
use crate::cuda::MappedIo;
use crate::error::{Error, Result};
use crate::nic::backend::{Backend, HostQueues, MemoryKey, Nic, NicAddress, NicQp, QpQueues, QueueHome, RemoteQp};
use crate::nic::dmabuf_for;
use crate::placement::{Placement, Region};
use cudarc::driver::CudaContext;
use ibgda_abi::mlx5::{CQE_BYTES, MAX_SQ_DEPTH, UAR_DOORBELL_OFFSET, WQEBB_BYTES};
use parking_lot::Mutex;
use std::any::Any;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Bytes of the doorbell-record buffer (rounded up to a page): the QP's DBR at 0, its CQ's at
/// [`CQ_DBR_OFFSET`].
const DBR_BYTES: usize = 128;
const CQ_DBR_OFFSET: u64 = 64;

/// The NIC's UAR and, once a GPU-doorbell QP needed it, its page mapped into the GPU.
struct Doorbells {
    gpu: Mutex<Option<Arc<MappedIo>>>,
    uar: Uar,
}

/// An mlx5 device opened with DEVX, placing its queues per [`Placement`].
pub struct Mlx5Nic {
    regions: Mutex<Vec<MemoryRegistration>>,
    doorbells: Arc<Doorbells>,
    dev: Arc<Mlx5Device>,
    placement: Placement,
    pe: u32,
    port: u8,
}

impl Mlx5Nic {
    /// Opens `name` (or the first mlx5 device) with DEVX on `port` (GID index `gid_index` on
    /// RoCE) for PE `pe`, with queues in `placement`, and allocates its doorbell UAR.
    pub fn open(
        lib: Arc<Mlx5Lib>,
        name: Option<&str>,
        port: u8,
        gid_index: u8,
        placement: Placement,
        pe: u32,
    ) -> Result<Mlx5Nic> {
        let dev = Mlx5Device::open(lib, name, port, gid_index)?;
        let uar = dev.alloc_uar()?;
        // The device code and the CPU doorbell ring at a fixed offset of the page.
        if uar.reg_addr().wrapping_sub(uar.page_addr()) != UAR_DOORBELL_OFFSET as u64 {
            return Err(Error::Nic {
                op: "mlx5dv_devx_alloc_uar",
                device: dev.name().to_string(),
                what: format!(
                    "the doorbell register is at offset {:#x} of its UAR page; this backend rings at {UAR_DOORBELL_OFFSET:#x}",
                    uar.reg_addr().wrapping_sub(uar.page_addr())
                ),
            });
        }
        Ok(Mlx5Nic {
            regions: Mutex::new(Vec::new()),
            doorbells: Arc::new(Doorbells {
                gpu: Mutex::new(None),
                uar,
            }),
            dev,
            placement,
            pe,
            port,
        })
    }

    /// Maps the doorbell UAR page into the GPU now (GPU placement only; a no-op elsewhere), so a
    /// PE learns before creating QPs whether its posters can ring the doorbell themselves.
    pub fn map_gpu_doorbell(&self) -> Result<()> {
        match self.cuda() {
            Some(ctx) => self.gpu_doorbell(ctx).map(|_| ()),
            None => Ok(()),
        }
    }

    /// The DEVX device.
    pub fn device(&self) -> &Arc<Mlx5Device> {
        &self.dev
    }

    fn cuda(&self) -> Option<&Arc<CudaContext>> {
        match &self.placement {
            Placement::Gpu(a) => Some(a.context()),
            _ => None,
        }
    }

    /// `bytes` (rounded to pages) for a queue buffer: in the NIC's placement or, for `host`, in
    /// host memory mapped into `cuda`'s GPU; `fill` is the initial byte.
    fn buffer(&self, bytes: usize, host: Option<&Arc<CudaContext>>, fill: u8) -> Result<Region> {
        let page = crate::placement::host_page_size();
        let bytes = bytes.next_multiple_of(page);
        let r = match host {
            Some(c) => Region::mapped(c, self.pe, bytes)?,
            // Page-aligned where the placement can (its alignment is at most 4 KiB); the umem
            // registration works in pages from any address, and a dma-buf export rounds out.
            None => self.placement.zeroed(bytes, page.min(4096))?,
        };
        if fill != 0 {
            r.fill(fill)?;
        }
        Ok(r)
    }

    /// Registers `r` as a umem: GPU memory through a dma-buf when the driver exports it, host
    /// memory (and GPU memory otherwise) by its address in this process.
    fn umem(&self, r: &Region) -> Result<Umem> {
        let host = r.host_ptr::<u8>();
        let addr = host.map_or(r.addr(), |p| p as u64);
        let cuda = if host.is_some() { None } else { self.cuda() };
        // A umem names its dma-buf from byte 0: a range that does not start a page goes by address.
        let fd = match dmabuf_for(cuda, self.pe, addr, r.len() as u64) {
            Ok((fd, 0)) => Some(fd),
            _ => None,
        };
        // SAFETY: the region lives in the QP that holds the umem, dropped after it.
        Ok(unsafe {
            self.dev
                .register_umem(addr, r.len(), fd.as_ref().map(|f| f.as_raw_fd()))
        }?)
    }

    /// The GPU's address of the UAR doorbell register, mapping the page on first use.
    fn gpu_doorbell(&self, ctx: &Arc<CudaContext>) -> Result<(u64, Arc<MappedIo>)> {
        let uar = &self.doorbells.uar;
        let page = uar.page_addr();
        let mut gpu = self.doorbells.gpu.lock();
        if gpu.is_none() {
            let len = crate::placement::host_page_size();
            // SAFETY: the UAR page rdma-core mapped; it stays mapped while `doorbells` (which the
            // mapping is kept beside and every QP holds) lives.
            let m = unsafe { MappedIo::register(ctx, self.pe, page, len) }.map_err(|e| Error::Nic {
                op: "map the UAR page into the GPU",
                device: self.dev.name().to_string(),
                what: format!(
                    "{e}. The NVIDIA driver maps a NIC's doorbell page into a GPU only with \
                     NVreg_RegistryDwords=\"PeerMappingOverride=1;\" or as root (without it the call \
                     fails, CUDA_ERROR_NOT_PERMITTED in NVSHMEM and DeepEP reports); the CPU-assisted \
                     doorbell (IBGDA_DOORBELL=cpu) needs no driver setting"
                ),
            })?;
            *gpu = Some(Arc::new(m));
        }
        let m = gpu.as_ref().expect("mapped above").clone();
        Ok((m.device_ptr() + (uar.reg_addr() - page), m))
    }
}

impl Nic for Mlx5Nic {
    fn backend(&self) -> Backend {
        Backend::Mlx5
    }

    fn name(&self) -> String {
        format!("{} port {}", self.dev.name(), self.port)
    }

    fn address(&self) -> NicAddress {
        NicAddress::Port(self.dev.address())
    }

    unsafe fn register(&self, addr: u64, len: u64, access: u32) -> Result<MemoryKey> {
        let dmabuf = dmabuf_for(self.cuda(), self.pe, addr, len);
        let arg = dmabuf.as_ref().ok().map(|(fd, offset)| (fd.as_raw_fd(), *offset));
        // SAFETY: this function's contract; the dma-buf covers the range rounded out to pages.
        let mr = unsafe { self.dev.register_memory(addr, len as usize, access, arg) }.map_err(|mut e| {
            if let Err(why) = &dmabuf {
                e.what = format!("{} (no dma-buf: {why})", e.what);
            }
            e
        })?;
        let key = MemoryKey {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            addr,
            len,
        };
        self.regions.lock().push(mr);
        Ok(key)
    }

    fn create_qp(&self, log_depth: u32, home: QueueHome<'_>) -> Result<Arc<dyn NicQp>> {
        if !(2..=15).contains(&log_depth) || (1u64 << log_depth) > MAX_SQ_DEPTH as u64 {
            return Err(Error::Nic {
                op: "CREATE_QP",
                device: self.dev.name().to_string(),
                what: format!("a send queue of 2^{log_depth} WQEBBs (4..={MAX_SQ_DEPTH})"),
            });
        }
        let (queues_host, dbr_host) = match home {
            QueueHome::Device => (None, None),
            QueueHome::HostDoorbell(c, _) => (None, Some(c)),
            QueueHome::Host(c, _) => (Some(c), Some(c)),
        };
        let sq = self.buffer((1usize << log_depth) * WQEBB_BYTES, queues_host, 0)?;
        let dbrs = self.buffer(DBR_BYTES, dbr_host, 0)?;
        let cq = self.buffer(CQE_BYTES, queues_host, 0xff)?;
        let (sq_umem, dbr_umem, cq_umem) = (self.umem(&sq)?, self.umem(&dbrs)?, self.umem(&cq)?);
        let uar = &self.doorbells.uar;
        let (cq_obj, cqn) = self.dev.create_cq(&CqSpec {
            log_cq_size: 0,
            uar_page: uar.page_id(),
            c_eqn: self.dev.eqn(),
            cq_umem_id: cq_umem.id(),
            cq_umem_offset: 0,
            dbr_umem_id: dbr_umem.id(),
            dbr_offset: CQ_DBR_OFFSET,
            collapsed: true,
        })?;
        let (qp_obj, qpn) = self.dev.create_qp(&QpSpec {
            pd: self.dev.pdn(),
            uar_page: uar.page_id(),
            log_sq_size: log_depth,
            cqn_snd: cqn,
            cqn_rcv: cqn,
            wq_umem_id: sq_umem.id(),
            wq_umem_offset: 0,
            dbr_umem_id: dbr_umem.id(),
            dbr_offset: 0,
            user_index: 0,
        })?;
        // GPU posters ring through the UAR page mapped into the GPU; everyone else from the CPU.
        let (doorbell, mapped) = match (home, self.cuda()) {
            (QueueHome::Device, Some(ctx)) => {
                let (d, m) = self.gpu_doorbell(ctx)?;
                (d, Some(m))
            }
            _ => (uar.reg_addr(), None),
        };
        let host = match (dbrs.host_ptr::<u8>(), sq.host_ptr::<u8>()) {
            (Some(dbr), sq_host) => Some(HostQueues {
                sq: sq_host,
                dbr,
                uar: uar.page_addr() as *mut u8,
                cqe: cq.host_ptr::<u8>(),
            }),
            (None, _) => None,
        };
        Ok(Arc::new(Mlx5Qp {
            qp: qp_obj,
            _cq: cq_obj,
            _umems: [sq_umem, dbr_umem, cq_umem],
            queues: QpQueues {
                qpn,
                log_depth,
                sq: sq.addr(),
                dbr: dbrs.addr(),
                doorbell,
                cq: cq.addr(),
                host,
            },
            _buffers: [sq, dbrs, cq],
            _mapped: mapped,
            _doorbells: self.doorbells.clone(),
            dev: self.dev.clone(),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One DEVX RC QP with its CQ and buffers. Fields drop in order: the QP before its CQ, both
/// before the umems, the umems before the memory they name.
struct Mlx5Qp {
    qp: super::device::DevxHandle,
    _cq: super::device::DevxHandle,
    _umems: [Umem; 3],
    queues: QpQueues,
    _buffers: [Region; 3],
    _mapped: Option<Arc<MappedIo>>,
    _doorbells: Arc<Doorbells>,
    dev: Arc<Mlx5Device>,
}

// SAFETY: the raw pointers in `queues.host` name memory this QP owns (`_buffers`) or the UAR page
// it keeps mapped (`_doorbells`); the QP itself only reads them.
unsafe impl Send for Mlx5Qp {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mlx5Qp {}

impl NicQp for Mlx5Qp {
    fn qpn(&self) -> u32 {
        self.queues.qpn
    }

    fn locator(&self) -> u64 {
        0
    }

    fn connect(&self, remote: &RemoteQp) -> Result<()> {
        let NicAddress::Port(port) = remote.address else {
            return Err(NicError {
                op: "INIT2RTR",
                device: self.dev.name().to_string(),
                what: format!(
                    "QP {:#x}: the peer's QP {:#x} is on an emulated device; a ConnectX reaches real ports only",
                    self.queues.qpn, remote.qpn
                ),
            }
            .into());
        };
        Ok(self.dev.connect(&self.qp, self.queues.qpn, remote.qpn, &port)?)
    }

    fn queues(&self) -> QpQueues {
        self.queues
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

//! The emulated mlx5 device ([`crate::emu`]) behind the [`Nic`] boundary: one device with one
//! protection domain, QPs with their collapsed CQ. The device's queues live in its
//! [`Placement`] (host memory for CPU-emulated PEs, GPU memory for GPU PEs), and an engine of the
//! emulator (a CPU thread or a GPU kernel) executes them.

use super::backend::{Backend, HostQueues, MemoryKey, Nic, NicAddress, NicQp, QpQueues, QueueHome, RemoteQp};
use crate::emu::{CqMode, Device, Fabric, MemoryRegion, Placement, ProtectionDomain, QpAddress, QpStats, QueuePair};
use crate::error::{Error, Result};
use crate::transport::ibgda::{ConnectInfo, DoorbellMode, GpuIbgda, IbgdaOptions, PeIbgda};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::Arc;

/// An emulated device and its protection domain.
pub struct EmulatedNic {
    device: Device,
    pd: ProtectionDomain,
    regions: Mutex<Vec<MemoryRegion>>,
}

impl EmulatedNic {
    /// Opens PE `rank`'s device on `fabric` (device id `rank + 1`), its queues in `placement`.
    pub fn open(fabric: &Fabric, placement: Placement, rank: u32) -> Result<EmulatedNic> {
        let device = fabric.open_pe_device(placement, rank)?;
        let pd = device.alloc_pd();
        Ok(EmulatedNic {
            device,
            pd,
            regions: Mutex::new(Vec::new()),
        })
    }

    /// [`EmulatedNic::open`] with the device paced by `model` ([`Device::set_rate_model`]).
    pub fn open_modelled(
        fabric: &Fabric,
        placement: Placement,
        rank: u32,
        model: Option<crate::emu::RateModel>,
    ) -> Result<EmulatedNic> {
        let nic = EmulatedNic::open(fabric, placement, rank)?;
        nic.device.set_rate_model(model)?;
        Ok(nic)
    }

    /// The emulated device (its fault injection and statistics).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The protection domain every registration and QP of this NIC is in.
    pub fn pd(&self) -> ProtectionDomain {
        self.pd
    }

    /// Deregisters what [`Nic::register`] returned as `key`: the key stops working at once (tests
    /// of the NIC's protection errors).
    pub fn deregister(&self, key: MemoryKey) -> Result<()> {
        let mut regions = self.regions.lock();
        let Some(i) = regions.iter().position(|r| r.key == key.lkey) else {
            return Err(Error::EmulatedDevice {
                op: "dereg_mr",
                reason: format!("key {:#x} is not registered with {}", key.lkey, self.name()),
            });
        };
        self.device.deregister(regions.swap_remove(i))
    }
}

impl Nic for EmulatedNic {
    fn backend(&self) -> Backend {
        Backend::Emulated
    }

    fn name(&self) -> String {
        format!("emulated device {}", self.device.id())
    }

    fn address(&self) -> NicAddress {
        NicAddress::Emulated {
            device: self.device.id(),
        }
    }

    unsafe fn register(&self, addr: u64, len: u64, access: u32) -> Result<MemoryKey> {
        // SAFETY: this function's contract is the device's.
        let mr = unsafe { self.device.register(self.pd, addr, len, access) }?;
        self.regions.lock().push(mr);
        Ok(MemoryKey {
            lkey: mr.key,
            rkey: mr.key,
            addr: mr.addr,
            len: mr.len,
        })
    }

    fn create_qp(&self, log_depth: u32, home: QueueHome<'_>) -> Result<Arc<dyn NicQp>> {
        let cq = self.device.create_cq_in(0, CqMode::Collapsed, home)?;
        Ok(Arc::new(self.device.create_qp_in(self.pd, &cq, log_depth, home)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl NicQp for QueuePair {
    fn qpn(&self) -> u32 {
        QueuePair::qpn(self)
    }

    fn locator(&self) -> u64 {
        self.context_addr()
    }

    fn connect(&self, remote: &RemoteQp) -> Result<()> {
        let NicAddress::Emulated { device } = remote.address else {
            return Err(Error::EmulatedDevice {
                op: "modify_qp(RTR)",
                reason: format!(
                    "QP {:#x}: the peer's QP {:#x} is on a real NIC ({:?}); an emulated device reaches emulated ones only",
                    QueuePair::qpn(self),
                    remote.qpn,
                    remote.address
                ),
            });
        };
        self.to_init()?;
        self.to_rtr(QpAddress {
            device,
            qpn: remote.qpn,
            context: remote.locator,
        })?;
        self.to_rts()
    }

    fn queues(&self) -> QpQueues {
        let dbr = self.dbr_region().host_ptr::<u8>();
        let uar = self.uar_region().host_ptr::<u8>();
        let host = match (dbr, uar) {
            (Some(dbr), Some(uar)) => Some(HostQueues {
                sq: self.sq_region().host_ptr::<u8>(),
                dbr,
                uar,
                cqe: self.cq_region().host_ptr::<u8>(),
            }),
            _ => None,
        };
        QpQueues {
            qpn: QueuePair::qpn(self),
            log_depth: self.log_depth(),
            sq: self.sq(),
            dbr: self.dbr(),
            doorbell: self.doorbell(),
            cq: self.cq_buffer(),
            host,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- the transport's emulated view

impl PeIbgda {
    /// The emulated device, when that is the PE's NIC.
    pub fn emulated(&self) -> Option<&EmulatedNic> {
        self.nic().as_any().downcast_ref()
    }

    /// Every QP this PE posts to, as the emulated device's QPs (empty on a real NIC): what the
    /// emulator's engines service.
    pub fn emulated_qps(&self) -> Vec<QueuePair> {
        self.live_qps()
            .iter()
            .filter_map(|q| q.as_any().downcast_ref::<QueuePair>().cloned())
            .collect()
    }

    /// [`PeIbgda::qp`] as the emulated device's QP (its state, statistics and fault injection).
    pub fn emulated_qp(&self, peer: u32, index: u32) -> Option<&QueuePair> {
        self.qp(peer, index)?.as_any().downcast_ref()
    }
}

impl GpuIbgda {
    /// Engine-side counters of every QP this PE posts to (empty on a real NIC).
    pub fn qp_stats(&self) -> Result<Vec<QpStats>> {
        self.transport.emulated_qps().iter().map(|q| q.stats()).collect()
    }
}

/// Opens PE `pe`'s NIC, given the in-process fabric (see [`EmulatedIbgda::connect_with`]).
pub type OpenNic<'a> = dyn Fn(&Fabric, u32) -> Result<Box<dyn Nic>> + 'a;

/// Every PE's IBGDA transport over one emulated fabric, all in this process with host-memory
/// queues (CPU-emulated PEs and tests).
pub struct EmulatedIbgda {
    /// The fabric; its engine thread executes the work (dropped first, so the engine stops before
    /// the PEs' landing buffers and counters go).
    pub fabric: Fabric,
    /// Per PE.
    pub pes: Vec<PeIbgda>,
    /// The layout used.
    pub options: IbgdaOptions,
}

impl EmulatedIbgda {
    /// Sets up the transport between PEs whose heaps are `heaps[pe] = (base, size)` (host memory
    /// that outlives the returned value) and starts the CPU engine.
    ///
    /// # Safety
    /// Every heap range is valid memory for as long as the returned value lives.
    pub unsafe fn connect(heaps: &[(u64, u64)], options: IbgdaOptions) -> Result<EmulatedIbgda> {
        // SAFETY: this function's contract.
        unsafe {
            Self::connect_with(heaps, options, &|fabric, pe| {
                Ok(Box::new(EmulatedNic::open(fabric, Placement::Host, pe)?))
            })
        }
    }

    /// [`EmulatedIbgda::connect`] with each PE's NIC from `open(fabric, pe)` (another backend, or
    /// the emulated device on the fabric).
    ///
    /// # Safety
    /// As for [`EmulatedIbgda::connect`].
    pub unsafe fn connect_with(
        heaps: &[(u64, u64)],
        options: IbgdaOptions,
        open: &OpenNic<'_>,
    ) -> Result<EmulatedIbgda> {
        if options.doorbell == DoorbellMode::Cpu {
            return Err(Error::Config {
                name: "doorbell",
                value: "cpu".into(),
                why: "CPU-emulated PEs ring their own doorbells; the CPU-assisted doorbell is a GPU mode".into(),
            });
        }
        let n = heaps.len();
        let fabric = Fabric::new();
        let mut pes = Vec::with_capacity(n);
        for (i, &heap) in heaps.iter().enumerate() {
            let peers: Vec<bool> = (0..n).map(|j| j != i).collect();
            let nic = open(&fabric, i as u32)?;
            // SAFETY: the caller's heaps (this function's contract).
            pes.push(unsafe { PeIbgda::create(nic, Placement::Host, i as u32, heap, &peers, options, None)? });
        }
        let infos: Vec<ConnectInfo> = pes.iter().map(|p| p.local_info()).collect();
        for p in &pes {
            p.connect(&infos)?;
        }
        fabric.start_engine()?;
        Ok(EmulatedIbgda { fabric, pes, options })
    }

    /// PE `pe`'s emulated device (its fault injection and events).
    ///
    /// # Panics
    /// If there is no PE `pe`.
    pub fn device(&self, pe: usize) -> &crate::emu::Device {
        self.pes[pe]
            .emulated()
            .expect("every PE of an emulated job has an emulated NIC")
            .device()
    }

    /// The QP PE `pe` uses for its `index`-th connection to `peer`.
    pub fn qp(&self, pe: u32, peer: u32, index: u32) -> Option<&QueuePair> {
        self.pes.get(pe as usize)?.emulated_qp(peer, index)
    }
}

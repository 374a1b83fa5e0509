//! The emulated mlx5 device ([`crate::emu`]) behind the [`Nic`] boundary: one device with one
//! protection domain, QPs with their collapsed CQ. The device's queues live in its
//! [`Placement`] (host memory for CPU-emulated PEs, GPU memory for GPU PEs), and an engine of the
//! emulator (a CPU thread or a GPU kernel) executes them.

use super::backend::{Backend, HostQueues, MemoryKey, Nic, NicAddress, NicQp, QpQueues, QueueHome, RemoteQp};
use crate::emu::{CqMode, Device, Fabric, MemoryRegion, Placement, ProtectionDomain, QpAddress, QueuePair};
use crate::error::{Error, Result};
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

//! The emulated mlx5 device: a model of the parts of a ConnectX that IBGDA's data path depends on,
//! executing the very WQE bytes a real NIC would read.
//!
//! This module is its control plane, laid out like verbs: a [`Fabric`] (the wire, and the engine
//! that plays every NIC on it) opens [`Device`]s; a device has protection domains, memory regions
//! ([`MemoryRegion`]: lkey/rkey, bounds, access flags), completion queues ([`CompletionQueue`],
//! collapsed or owner-bit) and RC queue pairs ([`QueuePair`]) with the RESET → INIT → RTR → RTS
//! (→ ERR) state machine, each with a send queue, a doorbell record and a UAR page whose doorbell
//! register is ordinary memory. Every buffer a NIC would DMA lives in host memory here.
//!
//! The data plane — follow doorbells (and the DBR when a doorbell is lost), validate, execute,
//! complete — is `ibgda_device::emu`, `no_std` code that a CPU engine thread
//! ([`Fabric::start_engine`]) runs here and a GPU kernel can run later.
//!
//! Fault injection for tests: [`QueuePair::drop_next_doorbells`], [`Device::set_completion_delay`],
//! [`Device::set_paused`], and any bad key or address a test writes into a WQE.

mod device;
mod engine;
mod gpu_engine;
mod memory;

pub use device::{CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpAddress, QpStats, QueueHome, QueuePair};
pub use gpu_engine::{with_engines_halted, EngineStats, GpuEngine};
pub use ibgda_abi::emu::{access, CqMode, QpState};
pub use memory::{GpuArena, HostRegion, Placement, Region};

use crate::error::{Error, Result};
use device::{DeviceShared, QpShared};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The emulated network: every device opened on it, the connections between their QPs, and the
/// engine that executes their work.
///
/// Dropping the fabric stops the engine; queues and memory stay alive until then, so the engine
/// never touches freed memory.
pub struct Fabric {
    inner: Arc<FabricInner>,
}

pub(crate) struct FabricInner {
    devices: Mutex<Vec<Arc<DeviceShared>>>,
    qps: Mutex<Vec<Arc<QpShared>>>,
    /// Bumped whenever `qps` changes, so the engine refreshes its snapshot.
    generation: AtomicU64,
    /// Held by the engine for each pass over the QPs, and by control-plane operations that need
    /// the engine quiescent (QP reset).
    service_lock: Mutex<()>,
    next_device_id: AtomicU32,
    engine: Mutex<Option<engine::EngineThread>>,
}

impl Default for Fabric {
    fn default() -> Self {
        Self::new()
    }
}

impl Fabric {
    /// An empty fabric with no engine running.
    pub fn new() -> Fabric {
        Fabric {
            inner: Arc::new(FabricInner {
                devices: Mutex::new(Vec::new()),
                qps: Mutex::new(Vec::new()),
                generation: AtomicU64::new(0),
                service_lock: Mutex::new(()),
                next_device_id: AtomicU32::new(1),
                engine: Mutex::new(None),
            }),
        }
    }

    /// Opens a new emulated HCA on this fabric with its memory on the host (its id plays the role
    /// of a LID).
    pub fn open_device(&self) -> Device {
        self.open_device_in(Placement::Host)
            .expect("host memory allocation does not fail")
    }

    /// Opens a new emulated HCA whose queues and tables live in `placement`. QPs in GPU memory are
    /// serviced by a GPU engine ([`GpuEngine`]), not by the CPU engine.
    pub fn open_device_in(&self, placement: Placement) -> Result<Device> {
        let id = self.inner.next_device_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(DeviceShared::new(id, placement)?);
        self.inner.devices.lock().push(shared.clone());
        Ok(Device::new(shared, self.inner.clone()))
    }

    /// Starts the CPU engine thread (idempotent). It services the QPs in host memory.
    pub fn start_engine(&self) -> Result<()> {
        let mut e = self.inner.engine.lock();
        if e.is_none() {
            *e = Some(engine::EngineThread::spawn(self.inner.clone())?);
        }
        Ok(())
    }

    /// Stops the engine thread, if running, and waits for it.
    pub fn stop_engine(&self) {
        let e = self.inner.engine.lock().take();
        if let Some(e) = e {
            e.stop();
        }
    }

    /// Whether the engine thread is running.
    pub fn engine_running(&self) -> bool {
        self.inner.engine.lock().is_some()
    }

    /// One pass of the engine over every QP on the calling thread (for deterministic tests that do
    /// not start the engine thread). Returns the WQEs processed.
    pub fn service_once(&self) -> u32 {
        engine::service_pass(&self.inner, &engine::snapshot(&self.inner))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.stop_engine();
    }
}

impl FabricInner {
    pub(crate) fn register_qp(&self, qp: Arc<QpShared>) {
        self.qps.lock().push(qp);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn find_qp(&self, addr: QpAddress) -> Result<Arc<QpShared>> {
        self.qps
            .lock()
            .iter()
            .find(|q| q.device_id == addr.device && q.qpn == addr.qpn)
            .cloned()
            .ok_or_else(|| Error::EmulatedDevice {
                op: "modify_qp(RTR)",
                reason: format!("no QP {:#x} on device {} in this fabric", addr.qpn, addr.device),
            })
    }
}

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
//! complete — is `ibgda_nic_emu`, `no_std` code that a CPU engine thread
//! ([`Fabric::start_engine`]) runs here and a GPU kernel can run later.
//!
//! Fault injection for tests: [`QueuePair::drop_next_doorbells`], [`Device::set_completion_delay`],
//! [`Device::set_paused`], and any bad key or address a test writes into a WQE.

mod device;
mod engine;
mod gpu_engine;
mod model;

pub use crate::placement::QueueHome;
pub use crate::placement::{GpuArena, HostRegion, Placement, Region};
pub use device::{AsyncEvent, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpAddress, QpStats, QueuePair};
pub use gpu_engine::{with_engines_halted, EngineStats, GpuEngine};
pub use ibgda_abi::emu::{access, CqMode, QpState};
pub use model::{ModelStats, RateModel};

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
    /// Host memory of other processes mapped here (their PEs' shared windows): where a remote
    /// QP context may live.
    peer_windows: Mutex<Vec<(u64, u64, bool)>>,
}

/// Fabrics shared by the PEs of one job in this process (every in-process PE connects through
/// the same emulated network, served by one engine), by job id. Entries die with their last PE.
/// PEs in other processes have fabrics of their own and are reached through their QP addresses.
static FABRICS: Mutex<Vec<(u64, std::sync::Weak<Fabric>)>> = Mutex::new(Vec::new());

/// Device ids handed out by [`Fabric::open_device`] start here, above any PE's id (`rank + 1`).
const FIRST_ANONYMOUS_DEVICE: u32 = 1 << 20;

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
                next_device_id: AtomicU32::new(FIRST_ANONYMOUS_DEVICE),
                engine: Mutex::new(None),
                peer_windows: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The fabric of job `id` in this process, created on first use.
    pub fn for_job(id: u64) -> Arc<Fabric> {
        let mut all = FABRICS.lock();
        all.retain(|(_, w)| w.strong_count() > 0);
        if let Some(f) = all.iter().find(|(i, _)| *i == id).and_then(|(_, w)| w.upgrade()) {
            return f;
        }
        let f = Arc::new(Fabric::new());
        all.push((id, Arc::downgrade(&f)));
        f
    }

    /// Declares `[base, base + len)` as another process's memory mapped into this one (a peer
    /// PE's shared window), where QPs of this fabric may find remote QP contexts; `host_readable`
    /// when the CPU can read it (the CPU emulation's windows; not GPU memory).
    ///
    /// # Safety
    /// The range stays mapped as long as the fabric (and any engine servicing its QPs) lives.
    pub unsafe fn add_peer_window(&self, base: u64, len: u64, host_readable: bool) {
        self.inner.peer_windows.lock().push((base, len, host_readable));
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
        self.open_device_with_id(placement, id)
    }

    /// Opens the emulated HCA of PE `rank` (device id `rank + 1`, unique across the job's
    /// processes).
    pub fn open_pe_device(&self, placement: Placement, rank: u32) -> Result<Device> {
        self.open_device_with_id(placement, rank + 1)
    }

    fn open_device_with_id(&self, placement: Placement, id: u32) -> Result<Device> {
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

    /// Sleeps out the longest key lease of this fabric's devices (at least the default, which
    /// PEs in other processes use), with a margin for the GPU clock's granularity: after it, no
    /// engine warp still uses a region entry or a responder state it checked before the call.
    pub(crate) fn wait_out_key_leases(&self) {
        let longest = self
            .devices
            .lock()
            .iter()
            .map(|d| d.key_lease_ns.load(std::sync::atomic::Ordering::Acquire))
            .max()
            .unwrap_or(0)
            .max(ibgda_abi::emu::DEFAULT_KEY_LEASE_NS);
        std::thread::sleep(std::time::Duration::from_nanos(
            longest.saturating_add(longest / 4 + 10_000),
        ));
    }

    /// The context address of the remote QP `addr` names: a QP of this fabric (checked against
    /// its table), or one in a peer process's window (checked by reading its QPN there).
    pub(crate) fn resolve_qp(&self, addr: QpAddress) -> Result<u64> {
        let err = |why: String| Error::EmulatedDevice {
            op: "modify_qp(RTR)",
            reason: format!("remote QP {:#x} on device {}: {why}", addr.qpn, addr.device),
        };
        if let Some(q) = self
            .qps
            .lock()
            .iter()
            .find(|q| q.device_id == addr.device && q.qpn == addr.qpn)
        {
            if addr.context != 0 && addr.context != q.ctx_addr() {
                return Err(err(format!(
                    "context at {:#x}, but the address says {:#x}",
                    q.ctx_addr(),
                    addr.context
                )));
            }
            return Ok(q.ctx_addr());
        }
        let size = std::mem::size_of::<ibgda_abi::emu::QpContext>() as u64;
        let window = self
            .peer_windows
            .lock()
            .iter()
            .find(|&&(b, l, _)| addr.context >= b && addr.context.saturating_add(size) <= b + l)
            .copied();
        let Some((_, _, host_readable)) = window.filter(|_| addr.context.is_multiple_of(64)) else {
            return Err(err(format!(
                "not in this fabric, and its context {:#x} is in no peer window mapped here",
                addr.context
            )));
        };
        if !host_readable {
            // GPU memory of a peer process: the range check is what the host can do; the engine
            // validates the QP's state and keys on every WQE.
            return Ok(addr.context);
        }
        let ctx = addr.context as *const ibgda_abi::emu::QpContext;
        // SAFETY: inside a peer window that stays mapped (add_peer_window's contract), aligned;
        // the QPN is written once, at creation, before the address was published.
        let qpn = unsafe { std::ptr::addr_of!((*ctx).qpn).read_volatile() };
        if qpn != addr.qpn {
            return Err(err(format!("the context at {:#x} holds QP {qpn:#x}", addr.context)));
        }
        Ok(addr.context)
    }
}

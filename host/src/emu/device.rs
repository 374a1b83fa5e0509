//! Devices, protection domains, memory regions, CQs and QPs of the emulated mlx5 device.

use super::model::{ModelStats, RateModel};
use super::FabricInner;
use crate::error::{Error, Result};
use crate::placement::QueueHome;
use crate::placement::{Placement, Region};
use ibgda_abi::emu::{access, CqContext, CqMode, DeviceContext, MrEntry, QpContext, QpState, DEFAULT_KEY_LEASE_NS};
use ibgda_abi::mlx5::{CQE_BYTES, MAX_SQ_DEPTH, QP_DBR_BYTES, UAR_DOORBELL_OFFSET, UAR_PAGE_BYTES, WQEBB_BYTES};
use parking_lot::Mutex;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Memory-region table entries per device.
pub const MAX_MRS: u32 = 1024;
/// How long a QP stays idle before the engine reads its DBR to catch a lost doorbell (default).
pub const DEFAULT_DBR_RECOVERY: Duration = Duration::from_millis(1);

pub(crate) struct DeviceShared {
    pub(crate) id: u32,
    pub(crate) placement: Placement,
    ctx: Region,
    mrs: Region,
    /// Per table index: the variant of the key last handed out, and whether it is in use.
    mr_slots: Mutex<Vec<(u8, bool)>>,
    next_pd: AtomicU32,
    next_qpn: AtomicU32,
    next_cqn: AtomicU32,
    /// Every CQ created, for [`Device::async_events`], and the CQNs already raised.
    cqs: Mutex<(Vec<std::sync::Weak<CqShared>>, Vec<u32>)>,
    /// The rate model set with [`Device::set_rate_model`].
    model: Mutex<Option<RateModel>>,
    /// The key lease set with [`Device::set_key_lease`], in ns.
    pub(crate) key_lease_ns: AtomicU64,
}

impl DeviceShared {
    pub(crate) fn new(id: u32, placement: Placement) -> Result<DeviceShared> {
        let ctx = placement.for_value::<DeviceContext>()?;
        let mrs = placement.zeroed(MAX_MRS as usize * std::mem::size_of::<MrEntry>(), 64)?;
        ctx.write(
            0,
            &DeviceContext {
                mrs: mrs.addr(),
                max_mrs: MAX_MRS,
                device_id: id,
                dbr_recovery_ns: DEFAULT_DBR_RECOVERY.as_nanos() as u64,
                key_lease_ns: DEFAULT_KEY_LEASE_NS,
                ..Default::default()
            },
        )?;
        // Index 0 is never used, so no key is below 0x100 (and 0x100 itself, mlx5's invalid lkey,
        // would need variant 0, which is never handed out).
        let mut slots = vec![(0u8, false); MAX_MRS as usize];
        slots[0].1 = true;
        Ok(DeviceShared {
            id,
            placement,
            ctx,
            mrs,
            mr_slots: Mutex::new(slots),
            next_pd: AtomicU32::new(1),
            next_qpn: AtomicU32::new(0x100),
            next_cqn: AtomicU32::new(1),
            cqs: Mutex::new((Vec::new(), Vec::new())),
            model: Mutex::new(None),
            key_lease_ns: AtomicU64::new(DEFAULT_KEY_LEASE_NS),
        })
    }
}

/// An asynchronous event of the emulated device, as `ibv_get_async_event` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// An owner-bit CQ overran (`IBV_EVENT_CQ_ERR`): a completion was dropped, and the QP that
    /// produced it is in ERR.
    CqError {
        /// The CQ.
        cqn: u32,
    },
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AsyncEvent::CqError { cqn } => write!(
                f,
                "CQ {cqn:#x} overran (IBV_EVENT_CQ_ERR): a completion was dropped and the QP that produced it moved to ERR; poll the CQ (and advance its doorbell record) before more completions than it holds are outstanding"
            ),
        }
    }
}

/// One emulated HCA.
#[derive(Clone)]
pub struct Device {
    shared: Arc<DeviceShared>,
    fabric: Arc<FabricInner>,
}

/// A protection domain: MRs and QPs only work together within one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtectionDomain {
    pdn: u32,
    device: u32,
}

impl ProtectionDomain {
    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.pdn
    }
}

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// The key, used both as lkey and rkey.
    pub key: u32,
    /// First byte.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// [`access`] bits.
    pub access: u32,
    device: u32,
}

/// The address a peer needs to connect to a QP (what the bootstrap exchanges). Besides the LID
/// and QPN a real NIC needs, the emulated device needs where the QP's context lives: the
/// requester's engine plays the responder too, reading its state and memory-region table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpAddress {
    /// The device (LID).
    pub device: u32,
    /// The QP number.
    pub qpn: u32,
    /// Address of the QP's context, as the connecting side's engine sees it.
    pub context: u64,
}

impl Device {
    pub(crate) fn new(shared: Arc<DeviceShared>, fabric: Arc<FabricInner>) -> Device {
        Device { shared, fabric }
    }

    /// The device id (its LID on the fabric).
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            pdn: self.shared.next_pd.fetch_add(1, Ordering::Relaxed),
            device: self.id(),
        }
    }

    /// Registers `[addr, addr + len)` with `access` rights in `pd`.
    ///
    /// # Safety
    /// The range stays valid memory until the region is deregistered and the engine is idle (as
    /// with a real NIC, which DMAs into whatever the registration names).
    pub unsafe fn register(&self, pd: ProtectionDomain, addr: u64, len: u64, access: u32) -> Result<MemoryRegion> {
        self.register_checked(pd, addr, len, access)
    }

    fn register_checked(&self, pd: ProtectionDomain, addr: u64, len: u64, access: u32) -> Result<MemoryRegion> {
        self.check_pd(pd, "reg_mr")?;
        if len == 0 || addr.checked_add(len).is_none() || access & !access::ALL != 0 {
            return Err(Error::EmulatedDevice {
                op: "reg_mr",
                reason: format!("invalid region {addr:#x} + {len} with access {access:#x}"),
            });
        }
        let mut slots = self.shared.mr_slots.lock();
        let Some(index) = slots.iter().position(|s| !s.1) else {
            return Err(Error::EmulatedDevice {
                op: "reg_mr",
                reason: format!("all {MAX_MRS} memory regions in use"),
            });
        };
        let variant = slots[index].0.wrapping_add(1).max(1);
        slots[index] = (variant, true);
        let key = ((index as u32) << 8) | variant as u32;
        let at = index * std::mem::size_of::<MrEntry>();
        let written = self.shared.mrs.write(
            at,
            &MrEntry {
                key,
                pd: pd.pdn,
                access,
                valid: 0,
                addr,
                len,
            },
        );
        // Publish: the engine reads `valid` with acquire before the rest.
        if let Err(e) = written.and_then(|_| self.shared.mrs.store_u32(at + offset_of!(MrEntry, valid), 1)) {
            slots[index].1 = false;
            return Err(e);
        }
        Ok(MemoryRegion {
            key,
            addr,
            len,
            access,
            device: self.id(),
        })
    }

    /// Deregisters `mr`; its key stops working at once (WQEs using it fail with a protection or
    /// access error).
    pub fn deregister(&self, mr: MemoryRegion) -> Result<()> {
        let index = mr.key >> 8;
        let mut slots = self.shared.mr_slots.lock();
        let live = mr.device == self.id()
            && index > 0
            && index < MAX_MRS
            && slots[index as usize] == ((mr.key & 0xff) as u8, true);
        if !live {
            return Err(Error::EmulatedDevice {
                op: "dereg_mr",
                reason: format!("key {:#x} is not a live region of device {}", mr.key, self.id()),
            });
        }
        self.shared.mrs.store_u32(
            index as usize * std::mem::size_of::<MrEntry>() + offset_of!(MrEntry, valid),
            0,
        )?;
        // An engine warp may still hold the entry from a check within its lease: wait it out
        // before the slot can be handed out again or the caller posts anything new.
        self.fabric.wait_out_key_leases();
        slots[index as usize].1 = false;
        Ok(())
    }

    fn check_pd(&self, pd: ProtectionDomain, op: &'static str) -> Result<()> {
        if pd.device != self.id() {
            return Err(Error::EmulatedDevice {
                op,
                reason: format!("PD {} belongs to device {}, not {}", pd.pdn, pd.device, self.id()),
            });
        }
        Ok(())
    }

    /// Creates a CQ of `1 << log_size` 64-byte CQEs, initialised to 0xff (every CQE reads as
    /// `MLX5_CQE_INVALID`).
    pub fn create_cq(&self, log_size: u32, mode: CqMode) -> Result<CompletionQueue> {
        self.create_cq_in(log_size, mode, QueueHome::Device)
    }

    /// [`Device::create_cq`] with the CQE buffer and CQ doorbell record in host-mapped memory for
    /// [`QueueHome::Host`] (a CPU polls it).
    pub fn create_cq_in(&self, log_size: u32, mode: CqMode, home: QueueHome<'_>) -> Result<CompletionQueue> {
        if log_size > 22 {
            return Err(Error::EmulatedDevice {
                op: "create_cq",
                reason: format!("log_size {log_size} exceeds 22"),
            });
        }
        let entries = 1usize << log_size;
        let p = &self.shared.placement;
        let (buf, dbr) = match home {
            QueueHome::Host(cuda, pe) => {
                let buf = Region::mapped(cuda, pe, entries * CQE_BYTES)?;
                buf.fill(0xff)?;
                (buf, Region::mapped(cuda, pe, 64)?)
            }
            _ => (p.filled(entries * CQE_BYTES, 4096, 0xff)?, p.zeroed(8, 64)?),
        };
        let ctx = p.for_value::<CqContext>()?;
        let cqn = self.shared.next_cqn.fetch_add(1, Ordering::Relaxed);
        ctx.write(
            0,
            &CqContext {
                buf: buf.addr(),
                dbr: dbr.addr(),
                log_size,
                mode: mode as u32,
                cqn,
                ..Default::default()
            },
        )?;
        let shared = Arc::new(CqShared { ctx, buf, dbr, cqn });
        self.shared.cqs.lock().0.push(Arc::downgrade(&shared));
        Ok(CompletionQueue { shared })
    }

    /// Creates an RC QP in RESET with a send queue of `1 << log_depth` WQEBBs, sending
    /// completions to `cq`. Its queue, doorbell record and UAR page are in the device's memory.
    pub fn create_qp(&self, pd: ProtectionDomain, cq: &CompletionQueue, log_depth: u32) -> Result<QueuePair> {
        self.create_qp_in(pd, cq, log_depth, QueueHome::Device)
    }

    /// [`Device::create_qp`] with its queue memory where `home` says.
    pub fn create_qp_in(
        &self,
        pd: ProtectionDomain,
        cq: &CompletionQueue,
        log_depth: u32,
        home: QueueHome<'_>,
    ) -> Result<QueuePair> {
        self.check_pd(pd, "create_qp")?;
        if (1u64 << log_depth) > MAX_SQ_DEPTH as u64 {
            return Err(Error::EmulatedDevice {
                op: "create_qp",
                reason: format!(
                    "send queue of 2^{log_depth} WQEBBs exceeds the {MAX_SQ_DEPTH} the 16-bit indices allow"
                ),
            });
        }
        let p = &self.shared.placement;
        let qpn = self.shared.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        let sq_bytes = (1usize << log_depth) * WQEBB_BYTES;
        let sq = match home {
            QueueHome::Host(cuda, pe) => Region::mapped(cuda, pe, sq_bytes)?,
            _ => p.zeroed(sq_bytes, 4096)?,
        };
        let (dbr, uar) = match home {
            QueueHome::HostDoorbell(cuda, pe) | QueueHome::Host(cuda, pe) => (
                Region::mapped(cuda, pe, QP_DBR_BYTES)?,
                Region::mapped(cuda, pe, UAR_PAGE_BYTES)?,
            ),
            QueueHome::Device => (p.zeroed(QP_DBR_BYTES, 64)?, p.zeroed(UAR_PAGE_BYTES, 4096)?),
        };
        let ctx = p.for_value::<QpContext>()?;
        ctx.write(
            0,
            &QpContext {
                qpn,
                state: QpState::Reset as u32,
                pd: pd.pdn,
                log_sq_depth: log_depth,
                sq: sq.addr(),
                dbr: dbr.addr(),
                uar: uar.addr(),
                cq: cq.shared.ctx.addr(),
                device: self.shared.ctx.addr(),
                // A GPU engine reading a queue in host memory already pays the PCIe round trip a
                // NIC's fetch would; everywhere else the engine's read is local and the model
                // charges it.
                model_fetch: (!matches!(home, QueueHome::Host(..)) || p.is_host()) as u32,
                ..Default::default()
            },
        )?;
        let shared = Arc::new(QpShared {
            ctx,
            sq,
            dbr,
            uar,
            cq: cq.shared.clone(),
            qpn,
            device_id: self.id(),
            log_depth,
        });
        self.fabric.register_qp(shared.clone());
        Ok(QueuePair {
            shared,
            fabric: self.fabric.clone(),
        })
    }

    /// Where this device keeps its queues and tables.
    pub fn placement(&self) -> &Placement {
        &self.shared.placement
    }

    /// The asynchronous events raised since the last call (each once), as a verbs consumer reads
    /// them with `ibv_get_async_event`: today, overrun CQs.
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        let mut g = self.shared.cqs.lock();
        let (cqs, raised) = &mut *g;
        cqs.retain(|w| w.strong_count() > 0);
        let mut out = Vec::new();
        for cq in cqs.iter().filter_map(|w| w.upgrade()) {
            let overran = cq.ctx.load_u32(offset_of!(CqContext, overrun)).unwrap_or(0) != 0;
            if overran && !raised.contains(&cq.cqn) {
                raised.push(cq.cqn);
                out.push(AsyncEvent::CqError { cqn: cq.cqn });
            }
        }
        out
    }

    /// Pauses (or resumes) the engine for this device: while paused nothing is executed.
    pub fn set_paused(&self, paused: bool) -> Result<()> {
        self.shared
            .ctx
            .store_u32(offset_of!(DeviceContext, paused), paused as u32)
    }

    /// Holds every CQE this long after its WQE executed (a slow NIC).
    pub fn set_completion_delay(&self, delay: Duration) -> Result<()> {
        self.shared
            .ctx
            .store_u64(offset_of!(DeviceContext, completion_delay_ns), delay.as_nanos() as u64)
    }

    /// Paces this device as a NIC port of `model`'s speed (see [`RateModel`]), or as fast as the
    /// engine goes (`None`). Set it while the device is idle: the port clock restarts.
    pub fn set_rate_model(&self, model: Option<RateModel>) -> Result<()> {
        let c = &self.shared.ctx;
        c.store_u32(offset_of!(DeviceContext, model_on), 0)?;
        if let Some(m) = model {
            c.store_u64(offset_of!(DeviceContext, model_fs_per_byte), m.fs_per_byte())?;
            c.store_u64(offset_of!(DeviceContext, model_fs_per_msg), m.fs_per_msg())?;
            c.store_u64(offset_of!(DeviceContext, model_latency_ns), m.latency_ns)?;
            c.store_u64(offset_of!(DeviceContext, model_fetch_ns), m.wqe_fetch_ns)?;
            c.store_u64(offset_of!(DeviceContext, model_max_rd_atomic), m.max_rd_atomic as u64)?;
            c.store_u64(offset_of!(DeviceContext, port_free_ps), 0)?;
            c.store_u64(offset_of!(DeviceContext, port_rx_free_ps), 0)?;
            c.store_u64(offset_of!(DeviceContext, port_idle_ps), 0)?;
            c.store_u64(offset_of!(DeviceContext, model_epoch_ns), 0)?;
            c.store_u32(offset_of!(DeviceContext, model_on), 1)?;
        }
        *self.shared.model.lock() = model;
        Ok(())
    }

    /// The rate model this device runs under, if any.
    pub fn rate_model(&self) -> Option<RateModel> {
        *self.shared.model.lock()
    }

    /// What the rate model did on this device.
    pub fn model_stats(&self) -> Result<ModelStats> {
        let c = &self.shared.ctx;
        Ok(ModelStats {
            wqes: c.load_u64(offset_of!(DeviceContext, model_wqes))?,
            wait_ns: c.load_u64(offset_of!(DeviceContext, model_wait_ns))?,
            tx_booked_ps: c.load_u64(offset_of!(DeviceContext, port_free_ps))?,
            rx_booked_ps: c.load_u64(offset_of!(DeviceContext, port_rx_free_ps))?,
            tx_idle_ps: c.load_u64(offset_of!(DeviceContext, port_idle_ps))?,
        })
    }

    /// How long a QP must be idle before the engine reads its DBR to recover a lost doorbell.
    pub fn set_dbr_recovery(&self, after: Duration) -> Result<()> {
        self.shared
            .ctx
            .store_u64(offset_of!(DeviceContext, dbr_recovery_ns), after.as_nanos() as u64)
    }

    /// How long this device's GPU engine warps keep the region entries and the responder state
    /// they checked before checking them again (default [`DEFAULT_KEY_LEASE_NS`], 100 us; zero
    /// checks them in every pass). Deregistering a region, or taking a QP out of RTR/RTS, waits
    /// out the longest lease of the fabric's devices, so that no WQE posted afterwards runs on
    /// what was withdrawn: give every device of a job the same lease (PEs in other processes use
    /// the default), and change it while no key or QP is being withdrawn.
    pub fn set_key_lease(&self, lease: Duration) -> Result<()> {
        let ns = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
        // The host's copy first: a wait that starts meanwhile then waits at least as long as the
        // engine may keep a check under a raised lease.
        self.shared.key_lease_ns.store(ns, Ordering::Release);
        self.shared.ctx.store_u64(offset_of!(DeviceContext, key_lease_ns), ns)
    }
}

pub(crate) struct CqShared {
    ctx: Region,
    buf: Region,
    dbr: Region,
    cqn: u32,
}

/// A completion queue.
#[derive(Clone)]
pub struct CompletionQueue {
    shared: Arc<CqShared>,
}

impl CompletionQueue {
    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }
    /// Address of the CQE buffer (for a collapsed CQ, the one CQE pollers read).
    pub fn buffer(&self) -> u64 {
        self.shared.buf.addr()
    }
    /// Address of the CQ doorbell record (consumer index, for owner-bit CQs).
    pub fn dbr(&self) -> u64 {
        self.shared.dbr.addr()
    }
    /// Number of CQEs.
    pub fn entries(&self) -> usize {
        self.shared.buf.len() / CQE_BYTES
    }
    /// The CQE buffer.
    pub fn buffer_region(&self) -> &Region {
        &self.shared.buf
    }
    /// Whether an owner-bit CQ overflowed (CQEs were dropped).
    pub fn overrun(&self) -> Result<bool> {
        Ok(self.shared.ctx.load_u32(offset_of!(CqContext, overrun))? != 0)
    }
}

pub(crate) struct QpShared {
    ctx: Region,
    sq: Region,
    dbr: Region,
    uar: Region,
    cq: Arc<CqShared>,
    pub(crate) qpn: u32,
    pub(crate) device_id: u32,
    log_depth: u32,
}

impl QpShared {
    /// Device-side address of the context.
    pub(crate) fn ctx_addr(&self) -> u64 {
        self.ctx.addr()
    }
    /// Host pointer to the context (host placement only).
    pub(crate) fn ctx_host(&self) -> Option<*mut QpContext> {
        self.ctx.host_ptr()
    }
}

/// An RC queue pair.
#[derive(Clone)]
pub struct QueuePair {
    shared: Arc<QpShared>,
    fabric: Arc<FabricInner>,
}

/// A snapshot of a QP's engine-side state and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpStats {
    /// Current state.
    pub state: QpState,
    /// WQEBBs the engine consumed.
    pub consumed: u64,
    /// Producer index the engine knows of.
    pub posted: u64,
    /// WQEs executed successfully.
    pub wqes_executed: u64,
    /// Doorbells acted on.
    pub doorbells_seen: u64,
    /// Doorbells dropped by fault injection.
    pub doorbells_dropped: u64,
    /// Producer advances learnt from the DBR.
    pub doorbells_recovered: u64,
    /// WQEs executed in batches, one per engine lane (included in `wqes_executed`).
    pub wqes_batched: u64,
    /// Syndrome of the error that moved the QP to ERR (0 if none).
    pub error_syndrome: u8,
    /// Service passes that found WQEs waiting.
    pub busy_passes: u64,
    /// WQEBBs waiting at the start of those passes, summed: `backlog_sum / busy_passes` is the
    /// backlog the engine (or the rate model behind it) works through, near zero when the
    /// posters are the limit.
    pub backlog_sum: u64,
    /// Batches the GPU engine's warps executed on this QP, and where their time went in SM cycles
    /// (summed): load, decode, check and admit; copy the data; complete (fence, CQEs, indices).
    pub batches: u64,
    /// See `batches`.
    pub cycles_plan: u64,
    /// See `batches`.
    pub cycles_copy: u64,
    /// See `batches`.
    pub cycles_complete: u64,
    /// Retirements of those batches (one fence, CQE and consumer-index store each): on a collapsed
    /// CQ consecutive batches share one, so `batches / retirements` is the batches per fence.
    pub retirements: u64,
    /// `%globaltimer` (ns) summed over the passes that learned WQEs from a doorbell
    /// (`doorbells_seen`), when they learned them and when they ended (CQEs written).
    pub learned_ns_sum: u64,
    /// See `learned_ns_sum`.
    pub finished_ns_sum: u64,
    /// For the same passes, when the warp was ready to run its first batch and when it had
    /// retired its last WQE (`%globaltimer`, summed).
    pub ready_ns_sum: u64,
    /// See `ready_ns_sum`.
    pub retired_ns_sum: u64,
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.shared.qpn
    }
    /// What a peer needs to connect to this QP.
    pub fn address(&self) -> QpAddress {
        QpAddress {
            device: self.shared.device_id,
            qpn: self.shared.qpn,
            context: self.shared.ctx_addr(),
        }
    }
    /// log2 of the send-queue depth in WQEBBs.
    pub fn log_depth(&self) -> u32 {
        self.shared.log_depth
    }
    /// Address of the send queue.
    pub fn sq(&self) -> u64 {
        self.shared.sq.addr()
    }
    /// Address of the doorbell record.
    pub fn dbr(&self) -> u64 {
        self.shared.dbr.addr()
    }
    /// The send queue's memory.
    pub fn sq_region(&self) -> &Region {
        &self.shared.sq
    }
    /// The send CQ's CQE buffer.
    pub fn cq_region(&self) -> &Region {
        &self.shared.cq.buf
    }
    /// The doorbell record's memory.
    pub fn dbr_region(&self) -> &Region {
        &self.shared.dbr
    }
    /// Address of the doorbell register (UAR page + 0x800).
    pub fn doorbell(&self) -> u64 {
        self.shared.uar.addr() + UAR_DOORBELL_OFFSET as u64
    }
    /// The UAR page's memory.
    pub fn uar_region(&self) -> &Region {
        &self.shared.uar
    }
    /// Address of the send CQ's buffer.
    pub fn cq_buffer(&self) -> u64 {
        self.shared.cq.buf.addr()
    }
    /// Device-side address of the QP context (what an engine services).
    pub fn context_addr(&self) -> u64 {
        self.shared.ctx_addr()
    }

    /// Current state.
    pub fn state(&self) -> Result<QpState> {
        Ok(QpState::from_u32(self.shared.ctx.load_u32(offset_of!(QpContext, state))?).unwrap_or(QpState::Err))
    }

    fn transition(&self, op: &'static str, from: &[QpState], to: QpState) -> Result<()> {
        let cur = self.state()?;
        if !from.contains(&cur) {
            return Err(Error::EmulatedDevice {
                op,
                reason: format!("QP {:#x} is in {cur:?}; {op} needs {from:?}", self.qpn()),
            });
        }
        self.shared.ctx.store_u32(offset_of!(QpContext, state), to as u32)?;
        self.changed()
    }

    /// After this QP left RTR, RTS or ERR: a requester's engine warp may still count it as a
    /// ready responder from a check within its key lease, so wait that out. ERR too: the engine
    /// moves a QP there by itself (its own error, or as a responder NAKing an access), and a
    /// requester that checked it ready before keeps that for the rest of its lease.
    fn left_ready(&self, was: QpState) {
        if matches!(was, QpState::Rtr | QpState::Rts | QpState::Err) {
            self.fabric.wait_out_key_leases();
        }
    }

    /// Tells an engine that caches this QP's context between passes to reload it (the control
    /// plane changes a GPU engine's QPs only while no engine runs; the CPU engine does not cache).
    fn changed(&self) -> Result<()> {
        let at = offset_of!(QpContext, generation);
        let g = self.shared.ctx.load_u32(at)?;
        self.shared.ctx.store_u32(at, g.wrapping_add(1))
    }

    /// RESET → INIT.
    pub fn to_init(&self) -> Result<()> {
        self.transition("modify_qp(INIT)", &[QpState::Reset], QpState::Init)
    }

    /// INIT → RTR, connected to the QP at `remote` on this fabric.
    pub fn to_rtr(&self, remote: QpAddress) -> Result<()> {
        if self.state()? != QpState::Init {
            return self.transition("modify_qp(RTR)", &[QpState::Init], QpState::Rtr);
        }
        let context = self.fabric.resolve_qp(remote)?;
        self.shared.ctx.store_u64(offset_of!(QpContext, remote), context)?;
        self.transition("modify_qp(RTR)", &[QpState::Init], QpState::Rtr)
    }

    /// RTR → RTS: posted WQEs are now executed.
    pub fn to_rts(&self) -> Result<()> {
        self.transition("modify_qp(RTS)", &[QpState::Rtr], QpState::Rts)
    }

    /// Any state → ERR: outstanding and later WQEs complete with `WR_FLUSH_ERR`.
    pub fn to_error(&self) -> Result<()> {
        let was = self.state()?;
        self.shared
            .ctx
            .store_u32(offset_of!(QpContext, state), QpState::Err as u32)?;
        self.changed()?;
        self.left_ready(was);
        Ok(())
    }

    /// Any state → RESET: the send queue is emptied and the engine's indices restart at 0, as on
    /// hardware (the poster must restart its counters too). Waits for the CPU engine's current
    /// pass; a QP in GPU memory can be reset only while no GPU engine runs.
    pub fn reset(&self) -> Result<()> {
        let _quiescent = self.fabric.service_lock.lock();
        let c = &self.shared.ctx;
        let was = self.state()?;
        c.store_u32(offset_of!(QpContext, state), QpState::Reset as u32)?;
        self.left_ready(was);
        let reg = self.shared.uar.load_u64(UAR_DOORBELL_OFFSET)?;
        c.store_u64(offset_of!(QpContext, consumed), 0)?;
        c.store_u64(offset_of!(QpContext, posted), 0)?;
        c.store_u64(offset_of!(QpContext, last_doorbell), reg)?;
        c.store_u64(offset_of!(QpContext, watched_doorbell_ns), 0)?;
        c.store_u64(offset_of!(QpContext, rd_outstanding), 0)?;
        c.store_u64(offset_of!(QpContext, rd_due_ns), 0)?;
        c.store_u64(offset_of!(QpContext, remote), 0)?;
        c.store_u32(offset_of!(QpContext, error_syndrome), 0)?;
        self.shared.dbr.write_bytes(0, &[0u8; QP_DBR_BYTES])?;
        self.changed()
    }

    /// Makes the engine ignore the next `n` doorbells on this QP (the DBR still advances).
    pub fn drop_next_doorbells(&self, n: u32) -> Result<()> {
        self.shared.ctx.store_u32(offset_of!(QpContext, drop_doorbells), n)
    }

    /// A snapshot of the engine's counters for this QP.
    pub fn stats(&self) -> Result<QpStats> {
        let c = &self.shared.ctx;
        let u64_at = |off| c.load_u64(off);
        Ok(QpStats {
            state: self.state()?,
            consumed: u64_at(offset_of!(QpContext, consumed))?,
            posted: u64_at(offset_of!(QpContext, posted))?,
            wqes_executed: u64_at(offset_of!(QpContext, wqes_executed))?,
            doorbells_seen: u64_at(offset_of!(QpContext, doorbells_seen))?,
            doorbells_dropped: u64_at(offset_of!(QpContext, doorbells_dropped))?,
            doorbells_recovered: u64_at(offset_of!(QpContext, doorbells_recovered))?,
            wqes_batched: u64_at(offset_of!(QpContext, wqes_batched))?,
            error_syndrome: c.load_u32(offset_of!(QpContext, error_syndrome))? as u8,
            busy_passes: u64_at(offset_of!(QpContext, busy_passes))?,
            backlog_sum: u64_at(offset_of!(QpContext, backlog_sum))?,
            batches: u64_at(offset_of!(QpContext, batches))?,
            cycles_plan: u64_at(offset_of!(QpContext, cycles_plan))?,
            cycles_copy: u64_at(offset_of!(QpContext, cycles_copy))?,
            cycles_complete: u64_at(offset_of!(QpContext, cycles_complete))?,
            retirements: u64_at(offset_of!(QpContext, retirements))?,
            learned_ns_sum: u64_at(offset_of!(QpContext, learned_ns_sum))?,
            finished_ns_sum: u64_at(offset_of!(QpContext, finished_ns_sum))?,
            ready_ns_sum: u64_at(offset_of!(QpContext, ready_ns_sum))?,
            retired_ns_sum: u64_at(offset_of!(QpContext, retired_ns_sum))?,
        })
    }

    /// WQEBBs the engine consumed (one read, for polling).
    pub fn consumed(&self) -> Result<u64> {
        self.shared.ctx.load_u64(offset_of!(QpContext, consumed))
    }
}

//! IBGDA transport, host half: for every ordered pair of PEs, `qps_per_peer` RC QPs connected
//! RESET → INIT → RTR → RTS, each with its collapsed CQ, posting counters and landing buffer, and
//! the [`QpDescriptor`] table that kernels post through; the heaps registered as memory regions.
//!
//! Today the NIC is the emulated mlx5 device ([`crate::emu`]) with every queue in host memory, which
//! is what CPU-emulated PEs ([`crate::cpu::CpuWorld`]) use. Placing the queues in GPU memory and
//! the GPU engine come with the GPU IBGDA work.

use crate::emu::{access, CqMode, Device, Fabric, HostRegion, MemoryRegion, ProtectionDomain, QueuePair};
use crate::error::{Error, Result};
use ibgda_abi::ibgda::{qp_flags, QpCounters, QpDescriptor, LANDING_SLOT_BYTES};
use ibgda_abi::mlx5::MAX_SQ_DEPTH;

/// How the IBGDA transport is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaOptions {
    /// RC QPs per peer (a block uses QP `block % qps_per_peer`); NVSHMEM's default is 2.
    pub qps_per_peer: u32,
    /// log2 of each send queue's depth in WQEBBs (NVSHMEM's default depth is 1024).
    pub log_depth: u32,
    /// log2 of the landing slots per QP (for `g` and fetching atomics in flight at once).
    pub log_landing_slots: u32,
}

impl Default for IbgdaOptions {
    fn default() -> Self {
        IbgdaOptions {
            qps_per_peer: 2,
            log_depth: 10,
            log_landing_slots: 6,
        }
    }
}

impl IbgdaOptions {
    fn check(&self) -> Result<()> {
        let bad = |name: &'static str, value: u32, why: String| {
            Err(Error::Config {
                name,
                value: value.to_string(),
                why,
            })
        };
        if self.qps_per_peer == 0 || self.qps_per_peer > 64 {
            return bad("qps_per_peer", self.qps_per_peer, "must be 1..=64".into());
        }
        if self.log_depth < 2 || (1u64 << self.log_depth) > MAX_SQ_DEPTH as u64 {
            return bad(
                "log_depth",
                self.log_depth,
                format!("depth must be 4..={MAX_SQ_DEPTH} WQEBBs"),
            );
        }
        if self.log_landing_slots > 16 {
            return bad("log_landing_slots", self.log_landing_slots, "at most 2^16 slots".into());
        }
        Ok(())
    }
}

/// One PE's side of the transport: its device, heap registration and QP table.
pub struct PeIbgda {
    /// The PE's emulated HCA.
    pub device: Device,
    /// The protection domain of the heap and the QPs.
    pub pd: ProtectionDomain,
    /// The heap's registration (lkey/rkey).
    pub heap_mr: MemoryRegion,
    /// `n_pes * qps_per_peer` QPs (PE-major); `None` for this PE itself.
    pub qps: Vec<Option<QueuePair>>,
    descriptors: HostRegion,
    _counters: Vec<HostRegion>,
    _landing: Vec<HostRegion>,
}

impl PeIbgda {
    /// Address of the [`QpDescriptor`] table (for `DeviceState::qps`).
    pub fn descriptor_table(&self) -> u64 {
        self.descriptors.addr()
    }
}

/// Every PE's IBGDA transport over one emulated fabric.
pub struct EmulatedIbgda {
    /// The fabric; its engine thread executes the work.
    pub fabric: Fabric,
    /// Per PE.
    pub pes: Vec<PeIbgda>,
    /// The layout used.
    pub options: IbgdaOptions,
}

impl EmulatedIbgda {
    /// Sets up the transport between PEs whose heaps are `heaps[pe] = (base, size)` (host memory
    /// that outlives the returned value) and starts the engine.
    ///
    /// # Safety
    /// Every heap range is valid memory for as long as the returned value lives.
    pub unsafe fn connect(heaps: &[(u64, u64)], options: IbgdaOptions) -> Result<EmulatedIbgda> {
        options.check()?;
        let n = heaps.len();
        let k = options.qps_per_peer as usize;
        let fabric = Fabric::new();
        let mut pes = Vec::with_capacity(n);
        for &(base, size) in heaps {
            let device = fabric.open_device();
            let pd = device.alloc_pd();
            let heap_mr = device.register(pd, base, size, access::ALL)?;
            let mut qps = Vec::with_capacity(n * k);
            let mut counters = Vec::new();
            let mut landing = Vec::new();
            let descriptors = HostRegion::zeroed(n * k * std::mem::size_of::<QpDescriptor>(), 64);
            for peer in 0..n {
                for _ in 0..k {
                    if peer == pes.len() {
                        qps.push(None);
                        continue;
                    }
                    let cq = device.create_cq(0, CqMode::Collapsed)?;
                    qps.push(Some(device.create_qp(pd, &cq, options.log_depth)?));
                    counters.push(HostRegion::for_value::<QpCounters>());
                    let bytes = ((1usize << options.log_landing_slots) + 1) * LANDING_SLOT_BYTES as usize;
                    landing.push(HostRegion::zeroed(bytes, 64));
                }
            }
            // One registration per landing buffer, local write only (the NIC writes results there).
            let mut landing_keys = Vec::new();
            for l in &landing {
                landing_keys.push(device.register(pd, l.addr(), l.len() as u64, access::LOCAL_WRITE)?.key);
            }
            let mut filled = 0;
            for (slot, qp) in qps.iter().enumerate() {
                let Some(qp) = qp else { continue };
                let d = QpDescriptor {
                    qpn: qp.qpn(),
                    log_depth: options.log_depth,
                    peer: (slot / k) as u32,
                    index: (slot % k) as u32,
                    sq: qp.sq(),
                    dbr: qp.dbr(),
                    doorbell: qp.doorbell(),
                    cq: qp.cq_buffer(),
                    counters: counters[filled].addr(),
                    lkey: heap_mr.key,
                    rkey: 0, // filled once every PE has registered its heap
                    peer_heap_base: heaps[slot / k].0,
                    landing: landing[filled].addr(),
                    landing_lkey: landing_keys[filled],
                    log_landing_slots: options.log_landing_slots,
                    flags: qp_flags::GPU_DOORBELL,
                    ..Default::default()
                };
                descriptors.as_ptr::<QpDescriptor>().add(slot).write(d);
                filled += 1;
            }
            pes.push(PeIbgda {
                device,
                pd,
                heap_mr,
                qps,
                descriptors,
                _counters: counters,
                _landing: landing,
            });
        }
        // Keys and connections: QP (i → j, q) is connected to QP (j → i, q).
        for i in 0..n {
            for j in 0..n {
                for q in 0..k {
                    let (Some(a), Some(b)) = (&pes[i].qps[j * k + q], &pes[j].qps[i * k + q]) else {
                        continue;
                    };
                    a.to_init()?;
                    a.to_rtr(b.address())?;
                    a.to_rts()?;
                    let d = pes[i].descriptors.as_ptr::<QpDescriptor>().add(j * k + q);
                    (*d).rkey = pes[j].heap_mr.key;
                }
            }
        }
        fabric.start_engine()?;
        Ok(EmulatedIbgda { fabric, pes, options })
    }

    /// The QP PE `pe` uses for its `index`-th connection to `peer`.
    pub fn qp(&self, pe: u32, peer: u32, index: u32) -> Option<&QueuePair> {
        let k = self.options.qps_per_peer;
        self.pes
            .get(pe as usize)?
            .qps
            .get((peer * k + index) as usize)?
            .as_ref()
    }
}

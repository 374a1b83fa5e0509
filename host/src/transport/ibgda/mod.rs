//! IBGDA transport, host half: for every ordered pair of PEs that use it, `qps_per_peer` RC QPs
//! connected RESET → INIT → RTR → RTS, each with its collapsed CQ, posting counters and landing
//! buffer, and the [`QpDescriptor`] table that kernels post through; the heaps registered as
//! memory regions.
//!
//! The NIC is whatever [`crate::nic::Nic`] backend the PE opened; the transport only uses the
//! boundary. With the emulated device, for CPU-emulated PEs every
//! queue is in host memory and the CPU engine runs it; for GPU PEs ([`crate::Pe`]) queues,
//! doorbell records, CQs, counters and landing buffers are in GPU memory and a GPU engine per PE
//! runs them. Each PE builds its own side
//! ([`PeIbgda::create`]), publishes [`PeIbgda::local_info`] through the bootstrap, and connects
//! ([`PeIbgda::connect`]) once it has every peer's.
//!
//! With a CPU-assisted doorbell ([`DoorbellMode::Cpu`]) the GPU writes WQEs as usual but publishes
//! its producer index to a host-mapped slot; a [`CpuDoorbell`] thread writes the DBR and rings.

mod doorbell;
mod gpu;

pub(crate) use gpu::job_id;

pub use doorbell::CpuDoorbell;
pub use gpu::{GpuIbgda, SharedWindows};

use crate::error::{Error, Result};
use crate::nic::{access, MemoryKey, Nic, NicAddress, NicQp, QueueHome, RemoteQp};
use crate::placement::{Placement, Region};
use cudarc::driver::CudaContext;
use ibgda_abi::ibgda::{qp_flags, QpCounters, QpDescriptor, DUMMY_LANDING_SLOTS, LANDING_SLOT_BYTES};
use ibgda_abi::mlx5::MAX_SQ_DEPTH;
use std::sync::Arc;

/// Who rings a QP's doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DoorbellMode {
    /// The posting GPU thread writes the DBR and the doorbell register (IBGDA proper).
    #[default]
    Gpu,
    /// The GPU publishes its producer index to host-mapped memory; a CPU thread writes the DBR
    /// and rings (NVSHMEM's fallback when the UAR cannot be mapped into the GPU).
    Cpu,
    /// No GPU posting at all: CPU proxy threads ([`crate::transport::proxy`]) build the WQEs in
    /// host-memory queues (mapped into the GPU, which the GPU engine reads over PCIe), ring and
    /// poll; the proxy thread serving a channel owns its QPs (`transport::proxy`).
    Proxy,
}

/// Most IBGDA QPs to one peer (a block uses QP `block % qps_per_peer`).
pub const MAX_QPS_PER_PEER: u32 = 256;

/// How the IBGDA transport is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaOptions {
    /// RC QPs per peer (a block uses QP `block % qps_per_peer`); NVSHMEM's default is 2.
    pub qps_per_peer: u32,
    /// log2 of each send queue's depth in WQEBBs (NVSHMEM's default depth is 1024).
    pub log_depth: u32,
    /// log2 of the landing slots per QP (for `g` and fetching atomics in flight at once).
    pub log_landing_slots: u32,
    /// Who rings the doorbell.
    pub doorbell: DoorbellMode,
}

impl Default for IbgdaOptions {
    fn default() -> Self {
        IbgdaOptions {
            qps_per_peer: 2,
            log_depth: 10,
            log_landing_slots: 9,
            doorbell: DoorbellMode::Gpu,
        }
    }
}

impl IbgdaOptions {
    /// Bytes of queue memory (QP, CQ and device tables, send queues, doorbell pages, landing
    /// buffers, proxy channel tables) one PE with `n_pes - 1` NIC peers needs at most, rounded to
    /// 2 MiB: the size of the window a PE shares with peer processes, where it cannot grow.
    pub fn window_bytes(&self, n_pes: u32) -> u64 {
        let qps = n_pes as u64 * self.qps_per_peer as u64;
        let landing = ((1u64 << self.log_landing_slots) + DUMMY_LANDING_SLOTS) * LANDING_SLOT_BYTES;
        // Per QP beyond its send queue and landing slots: contexts, CQ, DBR and UAR pages at
        // 4 KiB alignment, with room to spare. Fixed: the device's key table and proxy channels.
        ((4u64 << 20) + qps * ((64u64 << self.log_depth) + landing + (64 << 10))).next_multiple_of(2 << 20)
    }

    /// Rejects layouts the device cannot have.
    pub fn check(&self) -> Result<()> {
        let bad = |name: &'static str, value: u32, why: String| {
            Err(Error::Config {
                name,
                value: value.to_string(),
                why,
            })
        };
        if self.qps_per_peer == 0 || self.qps_per_peer > MAX_QPS_PER_PEER {
            return bad(
                "qps_per_peer",
                self.qps_per_peer,
                format!("must be 1..={MAX_QPS_PER_PEER}"),
            );
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

/// What peers need from a PE to connect to it (what the bootstrap carries).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectInfo {
    /// The PE's heap base as it registered it.
    pub heap_base: u64,
    /// The heap's rkey.
    pub heap_rkey: u32,
    /// How the PE's NIC is reached (`None` for a PE without NIC peers).
    pub address: Option<NicAddress>,
    /// QPN per `(peer, index)` slot, PE-major; 0 where there is no QP.
    pub qpns: Vec<u32>,
    /// Each QP's backend-specific locator ([`NicQp::locator`]), in the same slots.
    pub locators: Vec<u64>,
}

impl ConnectInfo {
    /// What a PE with no NIC peers contributes (it takes part in the exchange all the same).
    pub fn none(heap_base: u64, n_pes: u32, options: &IbgdaOptions) -> ConnectInfo {
        let slots = n_pes as usize * options.qps_per_peer as usize;
        ConnectInfo {
            heap_base,
            heap_rkey: 0,
            address: None,
            qpns: vec![0; slots],
            locators: vec![0; slots],
        }
    }

    /// Bytes for the bootstrap.
    pub fn encode(&self) -> Vec<u8> {
        bincode::serialize(self).expect("plain data serialises")
    }

    /// Inverse of [`ConnectInfo::encode`].
    pub fn decode(b: &[u8]) -> Result<ConnectInfo> {
        let bad = |why: String| Error::EmulatedDevice {
            op: "connect",
            reason: format!("malformed connection info of {} bytes: {why}", b.len()),
        };
        let i: ConnectInfo = bincode::deserialize(b).map_err(|e| bad(e.to_string()))?;
        if i.qpns.len() != i.locators.len() {
            return Err(bad(format!("{} QPNs but {} locators", i.qpns.len(), i.locators.len())));
        }
        Ok(i)
    }
}

/// One PE's side of the transport: its NIC, heap registration, QP table and the memory kernels
/// post through. Fields drop in order: the QPs before the NIC that made them.
pub struct PeIbgda {
    /// `n_pes * qps_per_peer` QPs (PE-major); `None` for this PE and peers reached otherwise.
    qps: Vec<Option<Arc<dyn NicQp>>>,
    /// The PE's NIC.
    nic: Box<dyn Nic>,
    /// The heap's registration (lkey/rkey).
    heap_key: MemoryKey,
    /// The layout used.
    pub options: IbgdaOptions,
    me: u32,
    heap: (u64, u64),
    descriptors: Region,
    counters: Vec<Region>,
    landing: Vec<(Region, u32)>,
    doorbell_slots: Vec<Region>,
    written: parking_lot::Mutex<Vec<QpDescriptor>>,
}

impl PeIbgda {
    /// Takes PE `me`'s opened `nic`, registers its heap `(base, size)`, and creates
    /// `qps_per_peer` QPs (in RESET) toward each PE `j` with `peers[j]`; counters, landing
    /// buffers and the descriptor table go in `placement`. With [`DoorbellMode::Cpu`], `cuda`
    /// names the GPU whose memory the doorbell slots are mapped into.
    ///
    /// # Safety
    /// The heap range is valid memory for as long as the returned value (and any engine servicing
    /// its QPs, or its peers' QPs) lives.
    pub unsafe fn create(
        nic: Box<dyn Nic>,
        placement: Placement,
        me: u32,
        heap: (u64, u64),
        peers: &[bool],
        options: IbgdaOptions,
        cuda: Option<&Arc<CudaContext>>,
    ) -> Result<PeIbgda> {
        options.check()?;
        let home = match (options.doorbell, cuda) {
            (DoorbellMode::Gpu, _) | (DoorbellMode::Proxy, None) => QueueHome::Device,
            (DoorbellMode::Cpu, Some(c)) => QueueHome::HostDoorbell(c, me),
            (DoorbellMode::Proxy, Some(c)) => QueueHome::Host(c, me),
            (DoorbellMode::Cpu, None) => {
                return Err(Error::Config {
                    name: "doorbell",
                    value: "cpu".into(),
                    why: "a CPU-assisted doorbell needs a GPU to map the producer-index slots into".into(),
                })
            }
        };
        if options.doorbell == DoorbellMode::Proxy && cuda.is_none() && !placement.is_host() {
            return Err(Error::Config {
                name: "doorbell",
                value: "proxy".into(),
                why: "proxy queues in GPU memory need the GPU to map host memory into".into(),
            });
        }
        let cpu_db = match home {
            QueueHome::HostDoorbell(c, pe) => Some((c, pe)),
            _ => None,
        };
        let n = peers.len();
        let k = options.qps_per_peer as usize;
        // SAFETY: the heap outlives the transport (this function's contract).
        let heap_key = unsafe { nic.register(heap.0, heap.1, access::ALL) }?;
        let mut qps = Vec::with_capacity(n * k);
        let (mut counters, mut landing, mut doorbell_slots) = (Vec::new(), Vec::new(), Vec::new());
        for (peer, &wanted) in peers.iter().enumerate() {
            for _ in 0..k {
                if peer == me as usize || !wanted {
                    qps.push(None);
                    continue;
                }
                qps.push(Some(nic.create_qp(options.log_depth, home)?));
                counters.push(placement.for_value::<QpCounters>()?);
                let bytes =
                    ((1u64 << options.log_landing_slots) + DUMMY_LANDING_SLOTS) as usize * LANDING_SLOT_BYTES as usize;
                let buf = placement.zeroed(bytes, 64)?;
                // Local write only: the NIC writes READ and atomic results there.
                // SAFETY: `buf` lives as long as the transport (it is kept in `landing`).
                let key = unsafe { nic.register(buf.addr(), bytes as u64, access::LOCAL_WRITE) }?.lkey;
                landing.push((buf, key));
                if let Some((c, pe)) = cpu_db {
                    doorbell_slots.push(Region::mapped(c, pe, 64)?);
                }
            }
        }
        let descriptors = placement.zeroed((n * k).max(1) * std::mem::size_of::<QpDescriptor>(), 64)?;
        Ok(PeIbgda {
            nic,
            heap_key,
            qps,
            options,
            me,
            heap,
            descriptors,
            counters,
            landing,
            doorbell_slots,
            written: parking_lot::Mutex::new(vec![QpDescriptor::default(); n * k]),
        })
    }

    /// What peers need to connect to this PE.
    pub fn local_info(&self) -> ConnectInfo {
        ConnectInfo {
            heap_base: self.heap.0,
            heap_rkey: self.heap_key.rkey,
            address: Some(self.nic.address()),
            qpns: self.qps.iter().map(|q| q.as_ref().map_or(0, |q| q.qpn())).collect(),
            locators: self.qps.iter().map(|q| q.as_ref().map_or(0, |q| q.locator())).collect(),
        }
    }

    /// Connects every QP to its peer's matching QP (QP `(me → j, q)` to `(j → me, q)`), moves it
    /// to RTS and writes the descriptor table. `remote[j]` is PE `j`'s [`PeIbgda::local_info`].
    pub fn connect(&self, remote: &[ConnectInfo]) -> Result<()> {
        let k = self.options.qps_per_peer as usize;
        let mut filled = 0;
        for (slot, qp) in self.qps.iter().enumerate() {
            let Some(qp) = qp else { continue };
            let (peer, index) = (slot / k, slot % k);
            let r = remote.get(peer).ok_or_else(|| Error::EmulatedDevice {
                op: "connect",
                reason: format!("no connection info from PE {peer}"),
            })?;
            let rslot = self.me as usize * k + index;
            let rqpn = r.qpns.get(rslot).copied().unwrap_or(0);
            if rqpn == 0 {
                return Err(Error::EmulatedDevice {
                    op: "connect",
                    reason: format!(
                        "PE {} has QP {:#x} toward PE {peer}, but PE {peer} has none toward PE {} (transport choices differ)",
                        self.me,
                        qp.qpn(),
                        self.me
                    ),
                });
            }
            let address = r.address.ok_or_else(|| Error::EmulatedDevice {
                op: "connect",
                reason: format!("PE {peer} sent QP numbers but no NIC address"),
            })?;
            qp.connect(&RemoteQp {
                address,
                qpn: rqpn,
                locator: r.locators.get(rslot).copied().unwrap_or(0),
            })?;
            let q = qp.queues();
            if q.sq == 0 && self.options.doorbell != DoorbellMode::Proxy {
                return Err(Error::Config {
                    name: "IBGDA_TRANSPORT",
                    value: format!("{:?}", self.options.doorbell),
                    why: format!(
                        "PE {}'s NIC ({}) gives the device code no queues to post to: only the CPU proxy can use it (IBGDA_TRANSPORT=proxy)",
                        self.me,
                        self.nic.name()
                    ),
                });
            }
            let (landing, landing_lkey) = &self.landing[filled];
            let cpu = self.options.doorbell == DoorbellMode::Cpu;
            let d = QpDescriptor {
                qpn: q.qpn,
                log_depth: q.log_depth,
                peer: peer as u32,
                index: index as u32,
                sq: q.sq,
                dbr: q.dbr,
                doorbell: if cpu {
                    self.doorbell_slots[filled].addr()
                } else {
                    q.doorbell
                },
                cq: q.cq,
                counters: self.counters[filled].addr(),
                lkey: self.heap_key.lkey,
                rkey: r.heap_rkey,
                peer_heap_base: r.heap_base,
                landing: landing.addr(),
                landing_lkey: *landing_lkey,
                log_landing_slots: self.options.log_landing_slots,
                flags: match self.options.doorbell {
                    DoorbellMode::Gpu => qp_flags::GPU_DOORBELL,
                    DoorbellMode::Cpu => qp_flags::CPU_DOORBELL,
                    DoorbellMode::Proxy => qp_flags::PROXY,
                },
                ..Default::default()
            };
            self.descriptors.write(slot * std::mem::size_of::<QpDescriptor>(), &d)?;
            self.written.lock()[slot] = d;
            filled += 1;
        }
        Ok(())
    }

    /// The descriptors [`PeIbgda::connect`] wrote, as host copies (PE-major; `qpn == 0` where
    /// there is no QP): what a CPU proxy posts through.
    pub fn descriptors(&self) -> Vec<QpDescriptor> {
        self.written.lock().clone()
    }

    /// This PE's index.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// This PE's heap `(base, size)` as registered.
    pub fn heap(&self) -> (u64, u64) {
        self.heap
    }

    /// Address of the [`QpDescriptor`] table (for `DeviceState::qps`).
    pub fn descriptor_table(&self) -> u64 {
        self.descriptors.addr()
    }

    /// The PE's NIC.
    pub fn nic(&self) -> &dyn Nic {
        &*self.nic
    }

    /// The heap's registration.
    pub fn heap_key(&self) -> MemoryKey {
        self.heap_key
    }

    /// Every QP this PE posts to.
    pub fn live_qps(&self) -> Vec<Arc<dyn NicQp>> {
        self.qps.iter().flatten().cloned().collect()
    }

    /// For a CPU-assisted doorbell: each QP with its producer-index slot.
    pub fn doorbell_slots(&self) -> Vec<(Arc<dyn NicQp>, &Region)> {
        self.qps
            .iter()
            .flatten()
            .cloned()
            .zip(self.doorbell_slots.iter())
            .collect()
    }

    /// The QP this PE uses for its `index`-th connection to `peer`.
    pub fn qp(&self, peer: u32, index: u32) -> Option<&Arc<dyn NicQp>> {
        let k = self.options.qps_per_peer;
        self.qps.get((peer * k + index) as usize)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::Fabric;
    use crate::nic::EmulatedNic;

    #[test]
    fn connect_info_round_trips_and_rejects_garbage() {
        let i = ConnectInfo {
            heap_base: 0x7f00_0000_0000,
            heap_rkey: 0x1201,
            address: Some(NicAddress::Emulated { device: 3 }),
            qpns: vec![0, 0, 0x101, 0x102],
            locators: vec![0, 0, 0x7f00_0010_0000, 0x7f00_0010_00c0],
        };
        assert_eq!(ConnectInfo::decode(&i.encode()).unwrap(), i);
        assert!(ConnectInfo::decode(&[1, 2, 3]).is_err());
        let mut lopsided = i.clone();
        lopsided.locators.pop();
        assert!(ConnectInfo::decode(&lopsided.encode()).is_err());
    }

    #[test]
    fn a_pair_whose_choices_differ_fails_to_connect_with_both_pes_named() {
        let heaps: Vec<HostRegionPair> = (0..2).map(|_| HostRegionPair::new()).collect();
        let fabric = Fabric::new();
        let opts = IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 4,
            ..Default::default()
        };
        // PE 0 wants IBGDA to PE 1; PE 1 set up no QPs toward PE 0.
        // SAFETY: the heaps outlive the transports (dropped at the end of the test, engine never started).
        let (a, b) = unsafe {
            (
                PeIbgda::create(
                    nic(&fabric, 0),
                    Placement::Host,
                    0,
                    heaps[0].range(),
                    &[false, true],
                    opts,
                    None,
                )
                .unwrap(),
                PeIbgda::create(
                    nic(&fabric, 1),
                    Placement::Host,
                    1,
                    heaps[1].range(),
                    &[false, false],
                    opts,
                    None,
                )
                .unwrap(),
            )
        };
        let infos = [a.local_info(), b.local_info()];
        let e = a.connect(&infos).unwrap_err().to_string();
        assert!(
            e.contains("PE 0") && e.contains("PE 1") && e.contains("transport choices differ"),
            "{e}"
        );
        // With matching choices the pair connects and the descriptor names the peer's heap and key.
        let b = unsafe {
            PeIbgda::create(
                nic(&fabric, 1),
                Placement::Host,
                1,
                heaps[1].range(),
                &[true, false],
                opts,
                None,
            )
            .unwrap()
        };
        let infos = [a.local_info(), b.local_info()];
        a.connect(&infos).unwrap();
        b.connect(&infos).unwrap();
        let d = unsafe { *(a.descriptor_table() as *const QpDescriptor).add(1) };
        assert_eq!(
            (d.peer, d.rkey, d.peer_heap_base),
            (1, b.heap_key().rkey, heaps[1].range().0)
        );
        assert_eq!(d.flags, qp_flags::GPU_DOORBELL);
        assert_eq!(a.emulated_qp(1, 0).unwrap().state().unwrap(), crate::emu::QpState::Rts);
    }

    #[test]
    fn cpu_doorbells_need_a_gpu() {
        let h = HostRegionPair::new();
        let opts = IbgdaOptions {
            doorbell: DoorbellMode::Cpu,
            ..Default::default()
        };
        // SAFETY: nothing is created.
        let e = unsafe {
            PeIbgda::create(
                nic(&Fabric::new(), 0),
                Placement::Host,
                0,
                h.range(),
                &[false, true],
                opts,
                None,
            )
        };
        assert!(matches!(e, Err(Error::Config { name: "doorbell", .. })));
    }

    fn nic(fabric: &Fabric, rank: u32) -> Box<dyn Nic> {
        Box::new(EmulatedNic::open(fabric, Placement::Host, rank).unwrap())
    }

    struct HostRegionPair(crate::emu::HostRegion);
    impl HostRegionPair {
        fn new() -> Self {
            HostRegionPair(crate::emu::HostRegion::zeroed(1 << 16, 4096))
        }
        fn range(&self) -> (u64, u64) {
            (self.0.addr(), 1 << 16)
        }
    }
}

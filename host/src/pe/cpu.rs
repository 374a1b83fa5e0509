//! The CPU-emulation backend of a PE: its heap in host memory (PEs of one process) or in a shared
//! window mapped at the same address in every process of the node (one process per PE), device
//! code on CPU threads, and the emulated mlx5 device's CPU engine for NIC peers.

use super::transports::TransportPlan;
use crate::bootstrap::Bootstrap;
use crate::config::Config;
use crate::emu::{Fabric, HostRegion, Placement};
use crate::error::{Error, Result};
use crate::node::{exchange_fds, ProcessMap};
use crate::shm::{window, SharedArena};
use crate::transport::ibgda::{ConnectInfo, PeIbgda};
use crate::transport::proxy::{Proxy, ProxyChannels};
use ibgda_abi::{
    collective_scratch_bytes, error_state, DeviceState, ErrorRecord, PeerInfo, TransportKind, HEAP_RESERVED_BYTES,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Where a CPU PE's heap lives (held to keep it allocated or mapped).
#[allow(dead_code)]
enum HeapMemory {
    Host(HostRegion),
    Shared(Arc<SharedArena>),
}

pub(crate) struct CpuPe {
    // Drop order: proxy threads, then the NIC side (its QPs stay with the fabric), then the
    // fabric (its engine stops with the last PE of this process), then peers' windows, then ours.
    proxy: Option<Proxy>,
    channels: Option<Arc<ProxyChannels>>,
    ibgda: Option<PeIbgda>,
    fabric: Option<Arc<Fabric>>,
    _peer_windows: Vec<SharedArena>,
    _memory: HeapMemory,
    rank: u32,
    heap_base: u64,
    heap_size: u64,
    state: Box<DeviceState>,
    _peers: Box<[PeerInfo]>,
    error: Box<ErrorRecord>,
    claim: Box<AtomicU32>,
    /// The most CPU threads one emulated block runs (`Config::cpu_block_threads`).
    block_threads_cap: u32,
}

// SAFETY: the raw heap and table pointers are owned here and used by device code under the device
// API's synchronisation, or by the host while no launch of this PE runs.
unsafe impl Send for CpuPe {}
unsafe impl Sync for CpuPe {}

impl CpuPe {
    pub(crate) fn init(boot: &dyn Bootstrap, config: &Config, procs: &ProcessMap) -> Result<CpuPe> {
        let rank = boot.rank();
        let n = boot.size();
        if config.heap_size <= HEAP_RESERVED_BYTES {
            return Err(Error::Config {
                name: "IBGDA_SYMMETRIC_SIZE",
                value: config.heap_size.to_string(),
                why: format!("must exceed the {HEAP_RESERVED_BYTES} bytes the runtime reserves"),
            });
        }
        if let Some(j) = (0..n).find(|&j| !procs.same_node(rank, j)) {
            return Err(Error::Config {
                name: "IBGDA_DEVICE",
                value: "cpu".into(),
                why: format!(
                    "the CPU emulation runs within one machine, but PE {j} is on {} and PE {rank} on {}",
                    procs.procs[j as usize].0, procs.procs[rank as usize].0
                ),
            });
        }
        let plan = TransportPlan::agree(boot, config)?;
        if config.ibgda.doorbell == crate::transport::ibgda::DoorbellMode::Cpu && plan.any_nic && !plan.use_proxy {
            return Err(Error::Config {
                name: "IBGDA_DOORBELL",
                value: "cpu".into(),
                why: "CPU-emulated PEs ring their own doorbells; the CPU-assisted doorbell is a GPU mode".into(),
            });
        }
        let nic_options = plan.nic_options(config);
        let heap_size = config.heap_size.next_multiple_of(4096);
        let across_processes = !procs.single_process();
        let (memory, placement, peer_windows, heap_base) = if across_processes {
            let len = (heap_size + nic_options.window_bytes(n)) as usize;
            let lens = boot.allgather("init/shm-window", &(len as u64).to_le_bytes())?;
            for (j, l) in lens.iter().enumerate() {
                let theirs = u64::from_le_bytes(l[..8].try_into().expect("8 bytes"));
                if theirs != len as u64 {
                    return Err(Error::CollectiveMismatch {
                        call: "init (shared window size: IBGDA_SYMMETRIC_SIZE and the NIC layout)",
                        pe: rank,
                        mine: len.to_string(),
                        other_pe: j as u32,
                        theirs: theirs.to_string(),
                    });
                }
            }
            let (at, _) = window(config.shm_va_base, rank, len);
            let arena = Arc::new(SharedArena::create(rank, at, len)?);
            let heap_base = arena.alloc(heap_size as usize, 4096)?;
            let fds = exchange_fds(
                boot,
                procs,
                "shared window",
                Some(arena.fd()),
                config.collective_timeout,
            )?;
            let mut imported = Vec::new();
            for (j, fd) in fds.into_iter().enumerate() {
                if let Some(fd) = fd {
                    let (at, _) = window(config.shm_va_base, j as u32, len);
                    imported.push(SharedArena::import(rank, j as u32, fd, at, len)?);
                }
            }
            (
                HeapMemory::Shared(arena.clone()),
                Placement::Shared(arena),
                imported,
                heap_base,
            )
        } else {
            let h = HostRegion::zeroed(heap_size as usize, 4096);
            let base = h.addr();
            (HeapMemory::Host(h), Placement::Host, Vec::new(), base)
        };
        let scratch = collective_scratch_bytes(heap_size, config.collective_scratch);
        let bases = boot.allgather("init/heaps", &super::enc(&[heap_base, heap_size, scratch]))?;
        let mut heap_bases = Vec::with_capacity(n as usize);
        for (j, b) in bases.iter().enumerate() {
            let w: Vec<u64> = super::u64s(b).collect();
            if w[1] != heap_size {
                return Err(Error::CollectiveMismatch {
                    call: "init (heap size, IBGDA_SYMMETRIC_SIZE)",
                    pe: rank,
                    mine: heap_size.to_string(),
                    other_pe: j as u32,
                    theirs: w[1].to_string(),
                });
            }
            super::check_same_scratch(rank, scratch, j as u32, w[2])?;
            heap_bases.push(w[0]);
        }

        let (mut fabric, mut ibgda) = (None, None);
        if plan.any_nic {
            let ids = boot.allgather("ibgda/fabric", &crate::transport::ibgda::job_id().to_le_bytes())?;
            let f = Fabric::for_job(u64::from_le_bytes(ids[0][..8].try_into().expect("8 bytes")));
            for w in &peer_windows {
                // SAFETY: the windows live in this PE, which drops its fabric handle first; in a
                // process with one PE (the only case with peer windows) that stops the engine.
                unsafe { f.add_peer_window(w.base(), w.len() as u64, true) };
            }
            let mine = if plan.nic_peers.iter().any(|&p| p) {
                // SAFETY: the heap lives in this PE, which drops `ibgda` first.
                let nic = crate::nic::open_for_cpu(
                    &crate::nic::NicRequest::from_config(config),
                    &f,
                    placement.clone(),
                    rank,
                    plan.use_proxy,
                )?;
                Some(unsafe {
                    PeIbgda::create(
                        nic,
                        placement.clone(),
                        rank,
                        (heap_base, heap_size),
                        &plan.nic_peers,
                        nic_options,
                        None,
                    )?
                })
            } else {
                None
            };
            let info = mine
                .as_ref()
                .map_or_else(|| ConnectInfo::none(heap_base, n, &nic_options), |t| t.local_info());
            let all = boot.allgather("ibgda/connect", &info.encode())?;
            let infos = all.iter().map(|b| ConnectInfo::decode(b)).collect::<Result<Vec<_>>>()?;
            if let Some(t) = &mine {
                t.connect(&infos)?;
            }
            f.start_engine()?;
            ibgda = mine;
            fabric = Some(f);
        }
        let (mut proxy, mut channels) = (None, None);
        if let (true, Some(t)) = (plan.use_proxy, &ibgda) {
            let c = Arc::new(ProxyChannels::create(t, &Placement::Host, None, config.proxy)?);
            proxy = Some(Proxy::start(t, c.clone())?);
            channels = Some(c);
        }
        let nic_kind = if plan.use_proxy {
            TransportKind::Proxy
        } else {
            TransportKind::Ibgda
        };
        let peers: Box<[PeerInfo]> = (0..n as usize)
            .map(|j| {
                let direct = !plan.nic_peers[j];
                PeerInfo {
                    heap_base: if direct { heap_bases[j] } else { 0 },
                    transport: if direct { TransportKind::P2p } else { nic_kind } as u32,
                    device: u32::MAX,
                }
            })
            .collect();
        let claim = Box::new(AtomicU32::new(0));
        let error = Box::new(ErrorRecord {
            claim: claim.as_ptr() as u64,
            ..ErrorRecord::default()
        });
        let (qps, qps_per_peer) = match &ibgda {
            Some(t) if !plan.use_proxy => (t.descriptor_table(), t.options.qps_per_peer),
            _ => (0, 0),
        };
        let state = Box::new(DeviceState {
            qps,
            qps_per_peer,
            proxy: channels.as_ref().map_or(0, |c| c.table()),
            proxy_channels: channels.as_ref().map_or(0, |c| c.count()),
            ..DeviceState::new(
                rank,
                n,
                (heap_base, heap_size),
                peers.as_ptr() as u64,
                &*error as *const ErrorRecord as u64,
                config.timeout.as_nanos() as u64,
            )
            .with_scratch(scratch)
        });
        Ok(CpuPe {
            proxy,
            channels,
            ibgda,
            fabric,
            _peer_windows: peer_windows,
            _memory: memory,
            rank,
            heap_base,
            heap_size,
            state,
            _peers: peers,
            error,
            claim,
            block_threads_cap: config.cpu_block_threads,
        })
    }

    /// The CPU threads a block of a launch asking for `threads` runs: at most the configured cap,
    /// and below a warp a power of two (one narrow warp; kernels read their shape from `arch`).
    pub(crate) fn block_threads(&self, threads: u32) -> u32 {
        let t = threads.clamp(1, self.block_threads_cap.max(1));
        if t < ibgda_device::arch::MAX_WARP_SIZE && !t.is_power_of_two() {
            1 << t.ilog2()
        } else {
            t
        }
    }

    pub(crate) fn state_ptr(&self) -> u64 {
        &*self.state as *const DeviceState as u64
    }

    pub(crate) fn heap_base(&self) -> u64 {
        self.heap_base
    }

    pub(crate) fn heap_size(&self) -> u64 {
        self.heap_size
    }

    pub(crate) fn transport_kind(&self, peer: u32) -> Option<TransportKind> {
        TransportKind::from_u32(self._peers.get(peer as usize)?.transport)
    }

    /// Bytes `[off, off + out.len())` of the heap (the range was checked by the caller).
    pub(crate) fn read_bytes(&self, off: u64, out: &mut [u8]) {
        // SAFETY: inside the heap (checked by Pe); no launch of this PE is running, and a peer's
        // concurrent writes are plain bytes.
        unsafe { std::ptr::copy_nonoverlapping((self.heap_base + off) as *const u8, out.as_mut_ptr(), out.len()) }
    }

    pub(crate) fn write_bytes(&self, off: u64, data: &[u8]) {
        // SAFETY: as read_bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.heap_base + off) as *mut u8, data.len()) }
    }

    pub(crate) fn zero(&self, off: u64, len: u64) {
        // SAFETY: as read_bytes.
        unsafe { std::ptr::write_bytes((self.heap_base + off) as *mut u8, 0, len as usize) }
    }

    pub(crate) fn device_error(&self) -> Option<ErrorRecord> {
        // SAFETY: a live record, written by device code with atomics; read after the launch joined.
        let rec = unsafe { std::ptr::read_volatile(&*self.error) };
        (rec.state == error_state::WRITTEN).then_some(rec)
    }

    /// Clears the error record (the emulation survives a trap; a GPU context does not).
    pub(crate) fn clear_error(&mut self) {
        *self.error = ErrorRecord {
            claim: self.claim.as_ptr() as u64,
            ..ErrorRecord::default()
        };
        self.claim.store(0, Ordering::Release);
    }

    pub(crate) fn error_to_result(&self) -> Result<()> {
        match self.device_error() {
            Some(rec) => Err(Proxy::device_error(self.proxy.as_ref(), rec)),
            None => Ok(()),
        }
    }

    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    /// The PE's emulated NIC side, when it has NIC peers.
    pub(crate) fn nic(&self) -> Option<&PeIbgda> {
        self.ibgda.as_ref()
    }

    /// Its fabric (engine, fault injection).
    pub(crate) fn fabric(&self) -> Option<&Arc<Fabric>> {
        self.fabric.as_ref()
    }

    pub(crate) fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    pub(crate) fn proxy_channels(&self) -> Option<&ProxyChannels> {
        self.channels.as_deref()
    }

    /// Stops the proxy threads (the engine is the process's, stopped with its last PE).
    pub(crate) fn stop(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            p.stop();
        }
    }
}

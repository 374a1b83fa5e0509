//! The CPU-proxy transport: GPU threads hand 32-byte descriptors to CPU threads, which post the
//! RDMA work on the GPU's behalf. This is the classic design GPU-initiated IBGDA is measured
//! against, and the fallback where a GPU may not ring a NIC.
//!
//! Layout per PE (see `ibgda_abi::proxy` for the protocol):
//! - `channels` descriptor rings in host-mapped memory (block `b` of a kernel uses channel
//!   `b % channels`), each with GPU-side counters (ticket head, cached completion count, landing
//!   tickets), a host-mapped status block the proxy publishes (`completed`, `consumed`, `failed`)
//!   and a landing buffer in GPU memory for `g` and fetching atomics, registered with the NIC;
//! - `threads` proxy threads; thread `i` serves channels `c` with `c % threads == i`;
//! - one QP per channel and peer ([`ProxyOptions::qps_per_peer`]: as many as channels, up to 64,
//!   which channels then share), owned by the thread serving its channels, with its send queue,
//!   doorbell record, UAR page and CQ in host memory (mapped into the GPU, so the emulated NIC's
//!   GPU engine reads them over PCIe as a NIC reads host queues). A channel's descriptors to one
//!   peer go through one QP, so they stay ordered as a block's do on IBGDA; several QPs per
//!   thread let the NIC work on a thread's traffic in parallel, as UCCL-EP's proxies do.
//!
//! What makes it a good proxy (UCCL-EP and MSCCL++ practice): several threads per GPU, each with
//! its own QPs (no locks between them, several per peer); batches of up to `batch` descriptors per channel per pass;
//! one doorbell per QP per pass; selective signalling (only the last WQE of a batch asks for a
//! CQE); bounded in-flight work (a ticket waits for a free ring slot, and a descriptor whose QP is
//! full stays in the ring); threads pinned to cores (opt-out) that spin, then yield, then sleep in
//! 50 µs steps when idle.
//!
//! Failure: a proxy thread that panics or meets an error CQE marks its channels failed, so every
//! GPU wait on them ends at once with `ProxyFailed`; [`Proxy::failure`] says why. A stalled proxy
//! (see [`Proxy::set_paused`]) makes `quiet` time out, naming the channel and its counters.

mod qp;
mod verbs_qp;
mod worker;
mod wqe_qp;

use crate::error::{Error, Result};
use crate::nic::access;
use crate::placement::{Placement, Region};
use crate::transport::ibgda::{DoorbellMode, PeIbgda};
use cudarc::driver::CudaContext;
use ibgda_abi::ibgda::DUMMY_LANDING_SLOTS;
use ibgda_abi::proxy::{ProxyChannel, ProxyChannelCounters, ProxyChannelStatus, ProxyDescriptor};
use parking_lot::Mutex;
use qp::ProxyQp;
use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use worker::{ChannelState, Worker, WorkerCounters};

/// How the proxy transport is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyOptions {
    /// Proxy threads per PE (each owns the QPs of its channels).
    pub threads: u32,
    /// Descriptor rings per PE (block `b` uses ring `b % channels`).
    pub channels: u32,
    /// log2 of each ring's descriptor slots (also the bound on a channel's work in flight).
    pub log_ring_slots: u32,
    /// Most descriptors a thread takes from one channel per pass.
    pub batch: u32,
    /// log2 of each channel's landing slots (`g` and fetching atomics in flight).
    pub log_landing_slots: u32,
    /// log2 of each proxy QP's send-queue depth in WQEBBs.
    pub log_sq_depth: u32,
    /// Pin each proxy thread to its own core (skipped when there are not enough cores).
    pub pin: bool,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            threads: 2,
            channels: 8,
            log_ring_slots: 10,
            batch: 64,
            log_landing_slots: 6,
            log_sq_depth: 12,
            pin: true,
        }
    }
}

impl ProxyOptions {
    /// Rejects layouts that cannot work.
    pub fn check(&self) -> Result<()> {
        let bad = |name: &'static str, value: u32, why: &str| {
            Err(Error::Config {
                name,
                value: value.to_string(),
                why: why.into(),
            })
        };
        if self.threads == 0 || self.threads > 64 {
            return bad("proxy threads", self.threads, "must be 1..=64");
        }
        if self.channels < self.threads || self.channels > 1024 {
            return bad(
                "proxy channels",
                self.channels,
                "must be at least the number of proxy threads and at most 1024",
            );
        }
        if !(2..=20).contains(&self.log_ring_slots) {
            return bad("proxy ring slots (log2)", self.log_ring_slots, "must be 2..=20");
        }
        if self.batch == 0 {
            return bad("proxy batch", self.batch, "must be at least 1");
        }
        if self.log_landing_slots > 15 {
            return bad(
                "proxy landing slots (log2)",
                self.log_landing_slots,
                "at most 2^15 slots",
            );
        }
        if !(4..=15).contains(&self.log_sq_depth) {
            return bad("proxy send-queue depth (log2)", self.log_sq_depth, "must be 4..=15");
        }
        Ok(())
    }

    /// QPs to each peer: one per channel, at most [`MAX_QPS_PER_PEER`] (then the largest multiple
    /// of `threads` below it, so that every channel sharing QP `c % qps` is one thread's). Channel
    /// `c` posts to QP `c % qps_per_peer()`.
    pub fn qps_per_peer(&self) -> u32 {
        if self.channels <= MAX_QPS_PER_PEER {
            self.channels
        } else {
            MAX_QPS_PER_PEER / self.threads * self.threads
        }
    }

    /// The IBGDA layout of the proxy's QPs: [`Self::qps_per_peer`] per peer, in host memory.
    pub fn qp_options(&self) -> crate::transport::ibgda::IbgdaOptions {
        crate::transport::ibgda::IbgdaOptions {
            qps_per_peer: self.qps_per_peer(),
            log_depth: self.log_sq_depth,
            log_landing_slots: 0,
            doorbell: DoorbellMode::Proxy,
        }
    }
}

/// Most proxy QPs to one peer (see [`ProxyOptions::qps_per_peer`]).
pub const MAX_QPS_PER_PEER: u32 = 64;

/// One PE's channels: rings, counters, status blocks, landing buffers and the table kernels read.
pub struct ProxyChannels {
    table: Region,
    rings: Vec<Region>,
    _counters: Vec<Region>,
    statuses: Vec<Region>,
    landing: Vec<(Region, u32)>,
    options: ProxyOptions,
}

impl ProxyChannels {
    /// Creates the channels of the PE whose NIC side is `nic`: rings and status blocks in host
    /// memory (mapped into `cuda`'s GPU when given), counters, landing buffers and the table in
    /// `placement`.
    pub fn create(
        nic: &PeIbgda,
        placement: &Placement,
        cuda: Option<&Arc<CudaContext>>,
        options: ProxyOptions,
    ) -> Result<ProxyChannels> {
        options.check()?;
        let me = nic.me();
        let host = |bytes: usize| -> Result<Region> {
            match cuda {
                Some(c) => Region::mapped(c, me, bytes),
                None => Placement::Host.zeroed(bytes, 128),
            }
        };
        let n = options.channels as usize;
        let (mut rings, mut counters, mut statuses, mut landing) = (vec![], vec![], vec![], vec![]);
        let table = placement.zeroed(n * std::mem::size_of::<ProxyChannel>(), 64)?;
        for c in 0..n {
            let ring = host((1usize << options.log_ring_slots) * ProxyDescriptor::BYTES as usize)?;
            let status = host(std::mem::size_of::<ProxyChannelStatus>())?;
            let ctr = placement.for_value::<ProxyChannelCounters>()?;
            // Then the dummy targets of non-fetching atomics (`DUMMY_LANDING_SLOTS`).
            let bytes = ((1usize << options.log_landing_slots) + DUMMY_LANDING_SLOTS as usize) * 8;
            let buf = placement.zeroed(bytes, 64)?;
            // SAFETY: the buffer lives as long as the channels, which outlive the proxy threads
            // (and the engine stops before the PE's memory goes).
            let key = unsafe { nic.nic().register(buf.addr(), bytes as u64, access::LOCAL_WRITE)? }.lkey;
            table.write(
                c * std::mem::size_of::<ProxyChannel>(),
                &ProxyChannel {
                    ring: ring.addr(),
                    counters: ctr.addr(),
                    status: status.addr(),
                    landing: buf.addr(),
                    log_slots: options.log_ring_slots,
                    log_landing_slots: options.log_landing_slots,
                    index: c as u32,
                    proxy_thread: c as u32 % options.threads,
                    reserved: [0; 2],
                },
            )?;
            rings.push(ring);
            statuses.push(status);
            counters.push(ctr);
            landing.push((buf, key));
        }
        Ok(ProxyChannels {
            table,
            rings,
            _counters: counters,
            statuses,
            landing,
            options,
        })
    }

    /// Address of the channel table (for `DeviceState::proxy`).
    pub fn table(&self) -> u64 {
        self.table.addr()
    }

    /// Number of channels.
    pub fn count(&self) -> u32 {
        self.options.channels
    }

    /// `(completed, consumed)` of channel `c`, as the proxy last published them.
    pub fn progress(&self, c: usize) -> Result<(u64, u64)> {
        let s = &self.statuses[c];
        Ok((
            s.load_u64(offset_of!(ProxyChannelStatus, completed))?,
            s.load_u64(offset_of!(ProxyChannelStatus, consumed))?,
        ))
    }
}

/// What every proxy thread of a PE shares with the handle.
pub(crate) struct ProxyShared {
    stop: AtomicBool,
    paused: AtomicBool,
    /// Thread index + 1 to kill (fault injection), 0 for none.
    kill: AtomicU32,
    counters: Vec<WorkerCounters>,
    failures: Mutex<Vec<Option<String>>>,
}

/// Counters of one proxy thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyThreadStats {
    /// Descriptors taken from the rings.
    pub descriptors: u64,
    /// WQEs written.
    pub wqes: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Passes that took at least one descriptor.
    pub batches: u64,
}

/// A PE's running proxy threads. Stop (or drop) it before the channels and QPs go.
pub struct Proxy {
    pe: u32,
    shared: Arc<ProxyShared>,
    threads: Vec<Option<JoinHandle<()>>>,
    _channels: Arc<ProxyChannels>,
}

impl Proxy {
    /// Starts `options.threads` threads serving `channels` through `nic`'s QPs (connected, in
    /// proxy mode).
    pub fn start(nic: &PeIbgda, channels: Arc<ProxyChannels>) -> Result<Proxy> {
        let options = channels.options;
        if nic.options.doorbell != DoorbellMode::Proxy || nic.options.qps_per_peer != options.qps_per_peer() {
            return Err(Error::Config {
                name: "proxy",
                value: format!(
                    "{:?} with {} QPs per peer",
                    nic.options.doorbell, nic.options.qps_per_peer
                ),
                why: format!(
                    "the proxy needs the NIC side in proxy mode with {} QPs per peer",
                    options.qps_per_peer()
                ),
            });
        }
        let me = nic.me();
        let (heap_base, heap_size) = nic.heap();
        let descs = nic.descriptors();
        let k = options.threads as usize;
        let per_peer = options.qps_per_peer() as usize;
        let n_pes = descs.len() / per_peer;
        let shared = Arc::new(ProxyShared {
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            kill: AtomicU32::new(0),
            counters: (0..k).map(|_| WorkerCounters::default()).collect(),
            failures: Mutex::new(vec![None; k]),
        });
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        // Leave core 0 to the rest of the process; pin only when every proxy thread of every PE
        // on this machine can have a core of its own (a guess: PEs are numbered per node).
        let pin = options.pin && cores.len() > (me as usize + 1) * k + 1;
        let mut workers = Vec::with_capacity(k);
        for t in 0..k {
            // This thread's QPs: QP `j` to every peer for each `j` of its channels.
            let mut qps = Vec::new();
            let mut qp_of = vec![vec![None; n_pes]; per_peer];
            for (j, of_peer) in qp_of.iter_mut().enumerate().skip(t).step_by(k) {
                for (peer, slot) in of_peer.iter_mut().enumerate() {
                    let d = descs[peer * per_peer + j];
                    let Some(qp) = nic.qp(peer as u32, j as u32) else {
                        continue;
                    };
                    if d.qpn == 0 {
                        continue;
                    }
                    *slot = Some(qps.len());
                    qps.push(ProxyQp::new(qp.clone(), peer as u32, d.lkey, d.rkey, d.peer_heap_base)?);
                }
            }
            let mut qp_of_channel = Vec::new();
            let mut chans = Vec::new();
            for c in (t..options.channels as usize).step_by(k) {
                let missing = |what| Error::EmulatedDevice {
                    op: "start proxy",
                    reason: format!("PE {me} channel {c}: its {what} is not in host memory"),
                };
                let (landing, key) = &channels.landing[c];
                chans.push(ChannelState::new(
                    c as u32,
                    channels.rings[c]
                        .host_ptr::<AtomicU64>()
                        .ok_or_else(|| missing("ring"))?,
                    (1u64 << options.log_ring_slots) - 1,
                    channels.statuses[c]
                        .host_ptr::<ProxyChannelStatus>()
                        .ok_or_else(|| missing("status"))?,
                    landing.addr(),
                    1u64 << options.log_landing_slots,
                    *key,
                ));
                qp_of_channel.push(qp_of[c % per_peer].clone());
            }
            workers.push(Worker {
                index: t as u32,
                pe: me,
                channels: chans,
                qp_of_channel,
                qps,
                heap_base,
                heap_size,
                batch: options.batch,
                shared: shared.clone(),
            });
        }
        let mut threads = Vec::with_capacity(k);
        for (t, mut w) in workers.into_iter().enumerate() {
            let core = pin.then(|| cores[1 + (me as usize * k + t) % (cores.len() - 1)]);
            let shared = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("ibgda-proxy-{me}.{t}"))
                .spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()));
                    let why = match result {
                        Ok(Ok(())) => return,
                        Ok(Err(e)) => e,
                        Err(p) => ibgda_device::arch::panic_message(p.as_ref()),
                    };
                    tracing::error!(pe = w.pe, thread = t, "proxy thread failed: {why}");
                    shared.failures.lock()[t] = Some(why);
                    for ch in &w.channels {
                        // SAFETY: the channel's status block is live host memory (the proxy
                        // handle keeps the channels alive until this thread is joined).
                        unsafe {
                            AtomicU32::from_ptr(std::ptr::addr_of!((*ch.status).failed) as *mut u32)
                                .store(t as u32 + 1, Ordering::Release)
                        };
                    }
                })
                .map_err(|e| Error::EmulatedDevice {
                    op: "start proxy",
                    reason: format!("PE {me}: cannot spawn proxy thread {t}: {e}"),
                })?;
            threads.push(Some(h));
        }
        Ok(Proxy {
            pe: me,
            shared,
            threads,
            _channels: channels,
        })
    }

    /// Stops and joins every thread.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for h in self.threads.iter_mut().filter_map(Option::take) {
            let _ = h.join();
        }
    }

    /// Why a proxy thread died, if one did: `(thread, reason)`.
    pub fn failure(&self) -> Option<(u32, String)> {
        self.shared
            .failures
            .lock()
            .iter()
            .enumerate()
            .find_map(|(t, f)| f.clone().map(|f| (t as u32, f)))
    }

    /// The error for a device record: [`Error::ProxyFailed`] with the dead thread's reason when the
    /// record says a proxy failed and this proxy knows why, else [`Error::Device`].
    pub fn device_error(proxy: Option<&Proxy>, record: ibgda_abi::ErrorRecord) -> Error {
        if record.kind == ibgda_abi::ErrorKind::ProxyFailed as u32 {
            if let Some((thread, reason)) = proxy.and_then(|p| p.failure()) {
                return Error::ProxyFailed {
                    record: Box::new(record),
                    thread,
                    reason,
                };
            }
        }
        Error::Device(Box::new(record))
    }

    /// Stalls (or resumes) every proxy thread, for fault injection: nothing is taken from the
    /// rings while paused.
    pub fn set_paused(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Release);
    }

    /// Makes proxy thread `thread` die (panic) at its next pass, for fault injection.
    pub fn kill_thread(&self, thread: u32) {
        self.shared.kill.store(thread + 1, Ordering::Release);
    }

    /// Counters of every thread.
    pub fn stats(&self) -> Vec<ProxyThreadStats> {
        self.shared
            .counters
            .iter()
            .map(|c| ProxyThreadStats {
                descriptors: c.descriptors.load(Ordering::Relaxed),
                wqes: c.wqes.load(Ordering::Relaxed),
                doorbells: c.doorbells.load(Ordering::Relaxed),
                batches: c.batches.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The PE this proxy serves.
    pub fn pe(&self) -> u32 {
        self.pe
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::{ProxyOptions, MAX_QPS_PER_PEER};

    /// Every channel's QP belongs to the thread that serves the channel (the QPs need no lock),
    /// there are never more than 64 per peer, and each channel gets its own when there are few.
    #[test]
    fn each_channel_posts_to_a_qp_its_own_thread_owns() {
        for threads in 1..=64u32 {
            for channels in (threads..=1024).step_by(7).chain([threads, 64, 65, 1024]) {
                if channels < threads {
                    continue;
                }
                let o = ProxyOptions {
                    threads,
                    channels,
                    ..ProxyOptions::default()
                };
                o.check().unwrap();
                let per_peer = o.qps_per_peer();
                assert!(
                    (1..=MAX_QPS_PER_PEER).contains(&per_peer),
                    "{threads} threads, {channels} channels"
                );
                if channels <= MAX_QPS_PER_PEER {
                    assert_eq!(per_peer, channels);
                }
                for c in 0..channels {
                    assert_eq!(
                        (c % per_peer) % threads,
                        c % threads,
                        "{threads}/{channels}: channel {c}"
                    );
                }
            }
        }
    }
}

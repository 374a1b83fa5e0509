//! One proxy thread: drains its channels' rings in batches, turns descriptors into WQEs on its own
//! QP to each peer, rings once per QP per pass, polls completions and publishes per-channel
//! completion counts.

use super::qp::ProxyQp;
use super::ProxyShared;
use crossbeam_utils::CachePadded;
use ibgda_abi::mlx5::MAX_MESSAGE_BYTES;
use ibgda_abi::proxy::{amo, op, ProxyChannelStatus, ProxyDescriptor, NO_LANDING};
use ibgda_device::ibgda::AtomicOp;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Passes with nothing to do before the thread starts yielding, then sleeping.
const SPIN_PASSES: u32 = 1 << 14;
const YIELD_PASSES: u32 = 1 << 16;
const IDLE_SLEEP: Duration = Duration::from_micros(50);

/// Work of one channel that is posted but not yet known complete.
struct Pending {
    /// The channel's `completed` may become this once this entry (and all before it) are done.
    ticket_end: u64,
    /// Index into the worker's QPs.
    qp: usize,
    /// The QP's producer index after this batch.
    wqe_end: u64,
    /// Whether this is the last entry of its batch (only then is `ticket_end` complete).
    last: bool,
}

pub(super) struct ChannelState {
    pub index: u32,
    /// Host pointer to the ring.
    pub ring: *const AtomicU64,
    pub mask: u64,
    pub status: *const ProxyChannelStatus,
    /// Device address of the landing buffer, its slot count and lkey.
    pub landing: u64,
    pub landing_slots: u64,
    pub landing_lkey: u32,
    pub next: u64,
    pub completed: u64,
    pending: VecDeque<Pending>,
}

// SAFETY: host-mapped memory kept alive by the proxy's channel set for the thread's life.
unsafe impl Send for ChannelState {}

impl ChannelState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: u32,
        ring: *const AtomicU64,
        mask: u64,
        status: *const ProxyChannelStatus,
        landing: u64,
        landing_slots: u64,
        landing_lkey: u32,
    ) -> ChannelState {
        ChannelState {
            index,
            ring,
            mask,
            status,
            landing,
            landing_slots,
            landing_lkey,
            next: 0,
            completed: 0,
            pending: VecDeque::new(),
        }
    }

    fn word(&self, ticket: u64, w: usize) -> *const AtomicU64 {
        // SAFETY: inside the ring (`mask` + 1 descriptors of 4 words).
        unsafe { self.ring.add(((ticket & self.mask) * 4) as usize + w) }
    }

    /// The descriptor of ticket `next`, if the GPU has published it.
    fn peek(&self) -> Option<ProxyDescriptor> {
        ibgda_device::proxy_ring::peek(self, self.next)
    }

    /// Release-stores `v` into the status word at byte `offset` (a `u64` field), without ever
    /// forming a reference to memory the GPU reads concurrently.
    fn publish(&self, offset: usize, v: u64) {
        // SAFETY: the status block is live host memory; `offset` names an 8-aligned u64 field.
        unsafe { AtomicU64::from_ptr((self.status as *mut u8).add(offset) as *mut u64).store(v, Ordering::Release) };
    }
}

impl ibgda_device::proxy_ring::RingReader for ChannelState {
    fn slots(&self) -> u64 {
        self.mask + 1
    }
    fn header(&self, slot: u64) -> u64 {
        // SAFETY: ring memory is live; the GPU publishes the header with a release store after
        // the body.
        unsafe { (*self.word(slot, 0)).load(Ordering::Acquire) }
    }
    fn body(&self, slot: u64) -> (u64, u64, u64) {
        // SAFETY: as above; ordered after the header by its acquire.
        unsafe {
            (
                (*self.word(slot, 1)).load(Ordering::Relaxed),
                (*self.word(slot, 2)).load(Ordering::Relaxed),
                (*self.word(slot, 3)).load(Ordering::Relaxed),
            )
        }
    }
}

/// Per-thread counters, read by [`super::Proxy::stats`].
#[derive(Default)]
pub(super) struct WorkerCounters {
    pub descriptors: CachePadded<AtomicU64>,
    pub wqes: AtomicU64,
    pub doorbells: AtomicU64,
    pub batches: AtomicU64,
}

pub(super) struct Worker {
    pub index: u32,
    pub pe: u32,
    pub channels: Vec<ChannelState>,
    /// Per channel (as `channels`), per peer PE: the index in `qps` of the QP the channel posts
    /// to; `None` for PEs this proxy does not reach.
    pub qp_of_channel: Vec<Vec<Option<usize>>>,
    pub qps: Vec<ProxyQp>,
    pub heap_base: u64,
    pub heap_size: u64,
    pub batch: u32,
    pub shared: Arc<ProxyShared>,
}

impl Worker {
    /// Runs until told to stop; an error names what went wrong (and the thread's channels are
    /// marked failed by the caller).
    pub fn run(&mut self) -> std::result::Result<(), String> {
        let mut idle = 0u32;
        let mut touched = vec![false; self.qps.len()];
        // IBGDA_PROXY_TRACE=1: a status line every second (where a stalled pipeline stands).
        let trace = std::env::var_os("IBGDA_PROXY_TRACE").is_some();
        let mut last_trace = std::time::Instant::now();
        loop {
            if trace && last_trace.elapsed() >= Duration::from_secs(1) {
                last_trace = std::time::Instant::now();
                self.trace();
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.shared.paused.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            if self.shared.kill.load(Ordering::Acquire) == self.index + 1 {
                panic!(
                    "proxy thread {} of PE {} killed by fault injection",
                    self.index, self.pe
                );
            }
            let mut took = 0u64;
            for c in 0..self.channels.len() {
                took += self.drain(c, &mut touched)?;
            }
            for (q, t) in touched.iter_mut().enumerate() {
                if std::mem::take(t) {
                    self.qps[q].ring()?;
                }
            }
            let mut busy = false;
            for q in &mut self.qps {
                if q.busy() {
                    q.poll()?;
                    busy |= q.busy();
                }
            }
            for ch in &mut self.channels {
                let mut done = None;
                while let Some(p) = ch.pending.front() {
                    if self.qps[p.qp].cons() < p.wqe_end {
                        break;
                    }
                    if p.last {
                        done = Some(p.ticket_end);
                    }
                    ch.pending.pop_front();
                }
                if let Some(t) = done {
                    ch.completed = t;
                    ch.publish(std::mem::offset_of!(ProxyChannelStatus, completed), t);
                }
                busy |= !ch.pending.is_empty();
            }
            let c = &self.shared.counters[self.index as usize];
            if took > 0 {
                c.descriptors.fetch_add(took, Ordering::Relaxed);
                c.batches.fetch_add(1, Ordering::Relaxed);
                c.wqes.store(self.qps.iter().map(|q| q.wqes()).sum(), Ordering::Relaxed);
                c.doorbells
                    .store(self.qps.iter().map(|q| q.doorbells()).sum(), Ordering::Relaxed);
            }
            if took > 0 || busy {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_PASSES {
                std::hint::spin_loop();
            } else if idle < YIELD_PASSES {
                std::thread::yield_now();
            } else {
                std::thread::sleep(IDLE_SLEEP);
            }
        }
    }

    fn trace(&self) {
        let chans: Vec<String> = self
            .channels
            .iter()
            .map(|c| {
                // SAFETY: the ring is live; a racy read is what a trace wants.
                let head = unsafe { (*c.word(c.next, 0)).load(Ordering::Acquire) };
                format!(
                    "ch{} next {} completed {} pending {} slot-stamp {:#x}",
                    c.index,
                    c.next,
                    c.completed,
                    c.pending.len(),
                    head as u32
                )
            })
            .collect();
        let qps: Vec<String> = self
            .qps
            .iter()
            .map(|q| format!("pe{} prod {} rung {} cons {}", q.peer, q.prod(), q.rung(), q.cons()))
            .collect();
        eprintln!(
            "proxy {}.{}: {} | {}",
            self.pe,
            self.index,
            chans.join("; "),
            qps.join("; ")
        );
    }

    /// Takes up to `batch` descriptors from channel `c` and writes their WQEs; returns how many.
    /// Stops early (leaving the descriptor in the ring) when its QP has no room.
    fn drain(&mut self, c: usize, touched: &mut [bool]) -> std::result::Result<u64, String> {
        let mut n = 0u64;
        let mut last_qp = None;
        while n < self.batch as u64 {
            let Some(d) = self.channels[c].peek() else { break };
            let peer = d.peer();
            let q = self.qp_of_channel[c]
                .get(peer as usize)
                .copied()
                .flatten()
                .ok_or_else(|| self.bad(c, &d, format!("PE {peer} is not reached through this proxy")))?;
            if !self.post(c, q, &d)? {
                break;
            }
            self.channels[c].next += 1;
            n += 1;
            if last_qp != Some(q) {
                if let Some(prev) = last_qp {
                    self.note_pending(c, prev, false);
                }
                last_qp = Some(q);
            }
            touched[q] = true;
        }
        if let Some(q) = last_qp {
            self.note_pending(c, q, true);
            let ch = &self.channels[c];
            ch.publish(std::mem::offset_of!(ProxyChannelStatus, consumed), ch.next);
        }
        Ok(n)
    }

    fn note_pending(&mut self, c: usize, q: usize, last: bool) {
        let ticket_end = self.channels[c].next;
        let wqe_end = self.qps[q].prod();
        let pending = &mut self.channels[c].pending;
        // Entries of one batch share `ticket_end`; an earlier entry for the same QP is covered.
        if let Some(back) = pending.back_mut() {
            if back.qp == q && !back.last {
                back.wqe_end = wqe_end;
                back.last = last;
                back.ticket_end = ticket_end;
                return;
            }
        }
        pending.push_back(Pending {
            ticket_end,
            qp: q,
            wqe_end,
            last,
        });
    }

    fn bad(&self, c: usize, d: &ProxyDescriptor, why: String) -> String {
        format!(
            "proxy thread {} of PE {}: malformed descriptor on channel {} (ticket {}, op {}, aux {:#x}): {why}",
            self.index, self.pe, self.channels[c].index, self.channels[c].next, d.op, d.aux
        )
    }

    fn local(&self, c: usize, d: &ProxyDescriptor, off: u64, len: u64) -> std::result::Result<u64, String> {
        if off >= self.heap_size || len > self.heap_size - off {
            return Err(self.bad(
                c,
                d,
                format!("local range {off:#x}+{len} is outside the {}-byte heap", self.heap_size),
            ));
        }
        Ok(self.heap_base + off)
    }

    /// Where the result of `d` (whose target is `raddr`) lands.
    fn landing(&self, c: usize, d: &ProxyDescriptor, raddr: u64) -> std::result::Result<u64, String> {
        let ch = &self.channels[c];
        if d.landing == NO_LANDING {
            // A dummy slot past the real ones, picked by the target word.
            return Ok(ch.landing + ibgda_abi::ibgda::dummy_landing_slot(ch.landing_slots, raddr) * 8);
        }
        if d.landing as u64 >= ch.landing_slots {
            return Err(self.bad(c, d, format!("landing slot {} of {}", d.landing, ch.landing_slots)));
        }
        Ok(ch.landing + d.landing as u64 * 8)
    }

    /// Writes the WQEs of one descriptor on QP `q`; `false` when they do not fit yet.
    fn post(&mut self, c: usize, q: usize, d: &ProxyDescriptor) -> std::result::Result<bool, String> {
        let raddr = self.qps[q].peer_heap_base + d.offset();
        let lkey = self.qps[q].lkey;
        match d.op {
            op::PUT | op::GET => {
                let laddr = self.local(c, d, d.a, d.b)?;
                let wqes = d.b.div_ceil(MAX_MESSAGE_BYTES).max(1);
                if !self.qps[q].fits(wqes) {
                    return Ok(false);
                }
                let mut off = 0;
                while off < d.b {
                    let len = (d.b - off).min(MAX_MESSAGE_BYTES);
                    self.qps[q].rdma(d.op == op::GET, laddr + off, lkey, raddr + off, len as u32);
                    off += len;
                }
            }
            op::P => {
                let len = d.aux as usize;
                if !(1..=8).contains(&len) {
                    return Err(self.bad(c, d, format!("p of {len} bytes")));
                }
                if !self.qps[q].fits(self.qps[q].inline_slots(len)) {
                    return Ok(false);
                }
                self.qps[q].inline_write(raddr, &d.a.to_le_bytes()[..len]);
            }
            op::G => {
                let len = d.aux as u32;
                if !(1..=8).contains(&len) {
                    return Err(self.bad(c, d, format!("g of {len} bytes")));
                }
                let slot = self.landing(c, d, raddr)?;
                if !self.qps[q].fits(1) {
                    return Ok(false);
                }
                let lkey = self.channels[c].landing_lkey;
                self.qps[q].rdma(true, slot, lkey, raddr, len);
            }
            op::AMO => {
                let width = if d.aux & amo::WIDE != 0 { 8 } else { 4 };
                let a = d.a;
                let amo_op = match d.aux & amo::KIND_MASK {
                    amo::ADD => AtomicOp::add(width, a),
                    amo::COMPARE_SWAP => AtomicOp::compare_swap(width, d.b, a),
                    amo::SWAP => AtomicOp::swap(width, a),
                    amo::AND => AtomicOp::and(width, a),
                    amo::OR => AtomicOp::or(width, a),
                    amo::XOR => AtomicOp::xor(width, a),
                    amo::FETCH => AtomicOp::fetch(width),
                    k => return Err(self.bad(c, d, format!("atomic kind {k}"))),
                };
                let slot = self.landing(c, d, raddr)?;
                if !self.qps[q].fits(self.qps[q].atomic_slots(&amo_op)) {
                    return Ok(false);
                }
                let lkey = self.channels[c].landing_lkey;
                self.qps[q].atomic(amo_op, slot, lkey, raddr)?;
            }
            other => return Err(self.bad(c, d, format!("unknown op {other}"))),
        }
        Ok(true)
    }
}

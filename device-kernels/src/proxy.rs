//! The device half of the CPU-proxy transport: GPU threads write 32-byte descriptors into a
//! host-mapped ring and wait for the completion count a proxy thread publishes.
//!
//! Protocol (one [`ProxyChannel`] per group of blocks):
//! 1. reserve ticket `t` with one atomic add on the channel's `head` (GPU memory);
//! 2. flow control: slot `t % slots` is free once `completed > t - slots`; the largest `completed`
//!    any thread saw is cached in GPU memory, so PCIe is read only when the ring looks full;
//! 3. write the descriptor's last three words, then its header word (stamp = `t + 1`, op) with a
//!    system-scope release store: the proxy polls the stamp, so a half-written slot is never taken;
//! 4. `wait(t + 1)` / `quiet` poll the host-mapped `completed` count. A dead proxy thread sets
//!    `failed`, which turns every wait into an immediate `ProxyFailed` error; a stalled one runs
//!    into the PE's timeout, reported with the channel, counter, expected and observed values.
//!
//! Ordering: a channel's descriptors are executed in ticket order on one QP per peer, so two
//! operations of one thread to one peer are delivered in issue order (put_signal's signal after
//! its data; `fence` needs no wait).

use crate::arch;
use crate::fail::{report, Failure};
use crate::ibgda::Reporter;
use ibgda_abi::proxy::{ProxyChannel, ProxyChannelCounters, ProxyChannelStatus, ProxyDescriptor};
use ibgda_abi::{ErrorKind, WaitKind};

/// A handle on one proxy channel.
#[derive(Clone, Copy)]
pub struct Channel {
    ring: u64,
    counters: *mut ProxyChannelCounters,
    status: *const ProxyChannelStatus,
    landing: u64,
    log_slots: u32,
    log_landing_slots: u32,
    index: u32,
    rep: Reporter,
}

// SAFETY: like `ibgda::Qp`: the handle names memory every thread of the PE shares through atomics.
unsafe impl Send for Channel {}
unsafe impl Sync for Channel {}

impl Channel {
    /// A handle on the channel described by `desc`.
    ///
    /// # Safety
    /// `desc` points at a live channel the host runtime filled; its ring, counters, status and
    /// landing buffer live for as long as the handle is used.
    #[inline(always)]
    pub(crate) unsafe fn new(desc: *const ProxyChannel, rep: Reporter) -> Channel {
        let d = &*desc;
        Channel {
            ring: d.ring,
            counters: d.counters as *mut ProxyChannelCounters,
            status: d.status as *const ProxyChannelStatus,
            landing: d.landing,
            log_slots: d.log_slots,
            log_landing_slots: d.log_landing_slots,
            index: d.index,
            rep,
        }
    }

    /// The channel's index (what errors name in their `qp` field).
    #[inline(always)]
    pub fn index(&self) -> u32 {
        self.index
    }

    #[inline(always)]
    fn completed(&self) -> u64 {
        // SAFETY: status live (constructor contract); the proxy publishes it with a release store.
        unsafe { arch::load_acquire_sys_u64(core::ptr::addr_of!((*self.status).completed)) }
    }

    /// Queues one descriptor; returns the ticket count that covers it (what [`Channel::wait`] takes).
    #[inline(always)]
    pub(crate) fn post(&self, peer: u32, op: u8, aux: u8, landing: u16, target: u64, a: u64, b: u64) -> u64 {
        let slots = 1u64 << self.log_slots;
        // SAFETY: counters live; every access to them is atomic.
        let t = unsafe { arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*self.counters).head), 1) };
        // SAFETY: as above.
        let seen = unsafe { arch::load_relaxed_sys_u64(core::ptr::addr_of!((*self.counters).completed_seen)) };
        if t >= seen + slots {
            let mut w = Deadline::new(self, peer);
            loop {
                let c = self.completed();
                // SAFETY: as above.
                unsafe { arch::atomic_max_acq_rel_sys_u64(core::ptr::addr_of_mut!((*self.counters).completed_seen), c) };
                if t < c + slots {
                    break;
                }
                w.tick(WaitKind::ProxyRingSlot, t + 1 - slots, c);
            }
        }
        let slot = self.ring + (t & (slots - 1)) * ProxyDescriptor::BYTES;
        // SAFETY: the slot is ours until the proxy consumes it (flow control above); host-mapped
        // memory, 8-byte aligned words. The header goes last, released at system scope, so the
        // proxy that sees its stamp sees the other words.
        unsafe {
            arch::store_relaxed_sys_u64((slot + 8) as *mut u64, target);
            arch::store_relaxed_sys_u64((slot + 16) as *mut u64, a);
            arch::store_relaxed_sys_u64((slot + 24) as *mut u64, b);
            arch::store_release_sys_u64(
                slot as *mut u64,
                ProxyDescriptor::header_word(ProxyDescriptor::stamp_of(t), op, aux, landing),
            );
        }
        t + 1
    }

    /// Waits until the proxy has completed every ticket below `end` (`peer` is named in a timeout).
    #[inline(always)]
    pub(crate) fn wait(&self, end: u64, peer: u32) {
        let mut c = self.completed();
        if c >= end {
            return;
        }
        let mut w = Deadline::new(self, peer);
        loop {
            w.tick(WaitKind::ProxyCompletion, end, c);
            c = self.completed();
            if c >= end {
                return;
            }
        }
    }

    /// Completes every descriptor queued on this channel so far.
    #[inline(always)]
    pub(crate) fn quiet(&self) {
        // SAFETY: counters live.
        let head = unsafe { arch::load_acquire_sys_u64(core::ptr::addr_of!((*self.counters).head)) };
        self.wait(head, ibgda_abi::NONE);
    }

    /// Takes a landing slot for a fetching operation (in order; waits while all are in use).
    #[inline(always)]
    pub(crate) fn take_landing_slot(&self, peer: u32) -> u64 {
        let n = 1u64 << self.log_landing_slots;
        // SAFETY: counters live.
        let ticket =
            unsafe { arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*self.counters).landing_head), 1) };
        let mut w = Deadline::new(self, peer);
        loop {
            // SAFETY: as above.
            let tail = unsafe { arch::load_acquire_sys_u64(core::ptr::addr_of!((*self.counters).landing_tail)) };
            if ticket < tail + n {
                return ticket;
            }
            w.tick(WaitKind::LandingSlot, ticket + 1 - n, tail);
        }
    }

    /// The slot index (what the descriptor carries) and address of landing `ticket`.
    #[inline(always)]
    pub(crate) fn landing_slot(&self, ticket: u64) -> (u16, u64) {
        let i = ticket & ((1u64 << self.log_landing_slots) - 1);
        (i as u16, self.landing + i * 8)
    }

    /// Releases landing `ticket`, in ticket order.
    #[inline(always)]
    pub(crate) fn release_landing_slot(&self, ticket: u64, peer: u32) {
        // SAFETY: counters live.
        let tail = unsafe { core::ptr::addr_of_mut!((*self.counters).landing_tail) };
        let mut w = Deadline::new(self, peer);
        loop {
            // SAFETY: as above.
            let seen = unsafe { arch::atomic_cas_acq_rel_sys_u64(tail, ticket, ticket + 1) };
            if seen == ticket {
                return;
            }
            w.tick(WaitKind::LandingSlot, ticket, seen);
        }
    }
}

/// A bounded wait on a channel: past the PE's timeout a `Timeout` naming PE, peer, channel,
/// counter, expected, observed and elapsed time; a dead proxy at once a `ProxyFailed`.
struct Deadline {
    status: *const ProxyChannelStatus,
    channel: u32,
    peer: u32,
    rep: Reporter,
    start: u64,
    spins: u32,
}

impl Deadline {
    #[inline(always)]
    fn new(ch: &Channel, peer: u32) -> Deadline {
        Deadline {
            status: ch.status,
            channel: ch.index,
            peer,
            rep: ch.rep,
            start: 0,
            spins: 0,
        }
    }

    #[inline(always)]
    fn tick(&mut self, kind: WaitKind, expected: u64, observed: u64) {
        if self.start == 0 {
            self.start = arch::global_timer_ns();
        }
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 0x1f == 0 {
            // SAFETY: status live (constructor contract).
            let failed = unsafe { arch::load_acquire_sys_u32(core::ptr::addr_of!((*self.status).failed)) };
            let elapsed = arch::global_timer_ns().wrapping_sub(self.start);
            if failed != 0 || elapsed > self.rep.timeout_ns {
                give_up(
                    kind as u32,
                    failed,
                    expected,
                    observed,
                    elapsed,
                    self.peer,
                    self.channel,
                    self.status as u64,
                    self.rep.error,
                    self.rep.my_pe,
                );
            }
        }
        arch::nanosleep(32);
    }
}

/// Reports a dead proxy or an expired wait (scalars only: no stack frame on the hot path).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn give_up(
    kind: u32,
    failed: u32,
    expected: u64,
    observed: u64,
    elapsed: u64,
    peer: u32,
    channel: u32,
    status: u64,
    error: u64,
    my_pe: u32,
) -> ! {
    let mut f = Failure::new(if failed != 0 {
        ErrorKind::ProxyFailed
    } else {
        ErrorKind::Timeout
    });
    f.peer = peer;
    f.qp = channel;
    f.detail = if failed != 0 { failed - 1 } else { kind };
    f.address = status;
    f.expected = expected;
    f.observed = observed;
    f.elapsed_ns = elapsed;
    report(error, my_pe, f)
}

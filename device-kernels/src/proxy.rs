//! The device half of the CPU-proxy transport: GPU threads write 32-byte descriptors into a
//! host-mapped ring and wait for the completion count a proxy thread publishes.
//!
//! Protocol (one [`ProxyChannel`] per group of blocks):
//! 1. reserve ticket `t` with one atomic add on the channel's `head` (GPU memory);
//! 2. flow control: slot `t % slots` is free once `completed > t - slots`; the largest `completed`
//!    any thread saw is kept in GPU memory, and only one thread per channel at a time (the
//!    poll-lock holder) reads the host-mapped status over PCIe to advance it;
//! 3. write the descriptor's last three words, then its header word (stamp = `t + 1`, op) with a
//!    system-scope release store: the proxy polls the stamp, so a half-written slot is never taken;
//! 4. `wait(t + 1)` / `quiet` poll the host-mapped `completed` count. A dead proxy thread sets
//!    `failed`, which turns every wait into an immediate `ProxyFailed` error; a stalled one runs
//!    into the PE's timeout, reported with the channel, counter, expected and observed values.
//!
//! Ordering: a channel's descriptors are posted in ticket order on one QP per peer. An atomic
//! (put_signal's signal) executes after everything posted before it on its QP, so a signal lands
//! after its data; WRITEs may be placed in any order among themselves (as RC allows, and as the
//! emulated NIC's batches do), so `fence` waits for the channel's completions.

use crate::arch;
use crate::deadline::Spin;
use crate::fail::{report, Failure};
use crate::ibgda::Reporter;
use ibgda_abi::proxy::{ProxyChannel, ProxyChannelCounters, ProxyChannelStatus, ProxyDescriptor};
use ibgda_abi::{ErrorKind, WaitKind};

/// A handle on one proxy channel: the table entry and where to report. The work is done by
/// out-of-line functions taking scalars only, so the three transports' paths do not all inline
/// into every call site of a kernel (a kernel with many atomics would spill) and no handle is ever
/// passed by reference (which would put it in local memory).
#[derive(Clone, Copy)]
pub struct Channel {
    desc: u64,
    rep: Reporter,
}

// SAFETY: like `ibgda::Qp`: the handle names memory every thread of the PE shares through atomics.
unsafe impl Send for Channel {}
// SAFETY: as for `Send` above: the handle is plain addresses and scalars, and every shared word is accessed atomically.
unsafe impl Sync for Channel {}

impl Channel {
    /// A handle on the channel described by `desc`.
    ///
    /// # Safety
    /// `desc` points at a live channel the host runtime filled; its ring, counters, status and
    /// landing buffer live for as long as the handle is used.
    #[inline(always)]
    pub(crate) unsafe fn new(desc: *const ProxyChannel, rep: Reporter) -> Channel {
        Channel { desc: desc as u64, rep }
    }

    /// The channel's index (what errors name in their `qp` field).
    #[inline(always)]
    pub fn index(&self) -> u32 {
        // SAFETY: live (constructor contract).
        unsafe { (*(self.desc as *const ProxyChannel)).index }
    }

    /// Queues one descriptor; returns the ticket count that covers it (what [`Channel::wait`] takes).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post(&self, peer: u32, op: u8, aux: u8, landing: u16, target: u64, a: u64, b: u64) -> u64 {
        let r = self.rep;
        // SAFETY: a live channel (constructor contract).
        unsafe {
            post(
                self.desc,
                r.error,
                r.my_pe,
                r.op,
                r.timeout_ns,
                peer,
                op,
                aux,
                landing,
                target,
                a,
                b,
            )
        }
    }

    /// Waits until the proxy has completed every ticket below `end` (`peer` is named in a timeout).
    #[inline(always)]
    pub(crate) fn wait(&self, end: u64, peer: u32) {
        let r = self.rep;
        // SAFETY: as above.
        unsafe { wait(self.desc, r.error, r.my_pe, r.op, r.timeout_ns, end, peer) }
    }

    /// Completes every descriptor queued on this channel so far.
    #[inline(always)]
    pub(crate) fn quiet(&self) {
        let r = self.rep;
        // SAFETY: as above.
        unsafe { quiet(self.desc, r.error, r.my_pe, r.op, r.timeout_ns) }
    }

    /// Queues a fetching operation (`g`, fetching atomic) with a landing slot, waits for it and
    /// returns the `width`-byte value that landed.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch(&self, peer: u32, op: u8, aux: u8, target: u64, a: u64, b: u64, width: u32) -> u64 {
        let r = self.rep;
        // SAFETY: as above.
        unsafe {
            fetch(
                self.desc,
                r.error,
                r.my_pe,
                r.op,
                r.timeout_ns,
                peer,
                op,
                aux,
                target,
                a,
                b,
                width,
            )
        }
    }
}

#[inline(always)]
fn counters(desc: u64) -> *mut ProxyChannelCounters {
    // SAFETY: callers pass a live channel.
    unsafe { (*(desc as *const ProxyChannel)).counters as *mut ProxyChannelCounters }
}

#[inline(always)]
fn status(desc: u64) -> *const ProxyChannelStatus {
    // SAFETY: callers pass a live channel.
    unsafe { (*(desc as *const ProxyChannel)).status as *const ProxyChannelStatus }
}

/// The completion count as GPU threads last learnt it (GPU memory).
#[inline(always)]
fn completed(desc: u64) -> u64 {
    // SAFETY: counters live (callers pass a live channel).
    unsafe { arch::load_acquire_sys_u64(core::ptr::addr_of!((*counters(desc)).completed_seen)) }
}

/// One thread at a time reads the proxy's host-mapped status over PCIe and publishes it in GPU
/// memory (`completed_seen`, `failed_seen`); a thread that finds the lock taken leaves it to the
/// holder. Returns the completion count known afterwards.
#[inline(always)]
fn refresh(desc: u64) -> u64 {
    let ctr = counters(desc);
    // SAFETY: counters and status live (callers pass a live channel); atomics throughout.
    unsafe {
        let lock = core::ptr::addr_of_mut!((*ctr).poll_lock);
        // Look before the CAS: most waiters find the lock held and should not contend for it.
        if arch::load_relaxed_sys_u32(lock) == 0 && arch::atomic_cas_acq_rel_sys_u32(lock, 0, 1) == 0 {
            let st = status(desc);
            let c = arch::load_acquire_sys_u64(core::ptr::addr_of!((*st).completed));
            let f = arch::load_acquire_sys_u32(core::ptr::addr_of!((*st).failed));
            arch::atomic_max_acq_rel_sys_u64(core::ptr::addr_of_mut!((*ctr).completed_seen), c);
            if f != 0 {
                arch::store_release_sys_u32(core::ptr::addr_of_mut!((*ctr).failed_seen), f);
            }
            arch::store_release_sys_u32(lock, 0);
        }
    }
    completed(desc)
}

/// # Safety
/// `desc` is a live channel.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn post(
    desc: u64,
    error: u64,
    my_pe: u32,
    op_code: u32,
    timeout_ns: u64,
    peer: u32,
    op: u8,
    aux: u8,
    landing: u16,
    target: u64,
    a: u64,
    b: u64,
) -> u64 {
    // `DeviceRing` relies on `desc` being a live channel: this function's contract.
    let mut w = Deadline::new(desc, error, my_pe, op_code, timeout_ns, peer);
    crate::proxy_ring::post(
        &DeviceRing(desc),
        |need, seen| w.tick(WaitKind::ProxyRingSlot, need, seen),
        op,
        aux,
        landing,
        target,
        a,
        b,
    )
}

/// A channel's ring as GPU threads post to it: the ticket counter and the completion count in
/// GPU memory, the descriptors in host-mapped memory, system-scope atomics with the orderings
/// [`crate::proxy_ring::RingWriter`] names.
struct DeviceRing(u64);

impl crate::proxy_ring::RingWriter for DeviceRing {
    #[inline(always)]
    fn slots(&self) -> u64 {
        // SAFETY: a live channel (the posting functions' contract).
        1u64 << unsafe { (*(self.0 as *const ProxyChannel)).log_slots }
    }
    #[inline(always)]
    fn claim(&self) -> u64 {
        // SAFETY: live counters, accessed only atomically.
        unsafe { arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*counters(self.0)).head), 1) }
    }
    #[inline(always)]
    fn completed(&self) -> u64 {
        // The GPU-memory copy of the count.
        completed(self.0)
    }
    #[inline(always)]
    fn refresh(&self) -> u64 {
        // The host-mapped count over PCIe, one thread at a time.
        refresh(self.0)
    }
    #[inline(always)]
    fn write_body(&self, slot: u64, target: u64, a: u64, b: u64) {
        let s = self.slot(slot);
        // SAFETY: the slot is ours until the proxy consumes it (flow control in `post`);
        // host-mapped memory, 8-byte aligned words.
        unsafe {
            arch::store_relaxed_sys_u64((s + 8) as *mut u64, target);
            arch::store_relaxed_sys_u64((s + 16) as *mut u64, a);
            arch::store_relaxed_sys_u64((s + 24) as *mut u64, b);
        }
    }
    #[inline(always)]
    fn publish_header(&self, slot: u64, header: u64) {
        // SAFETY: as above; released at system scope, so the proxy that sees the stamp sees the
        // body.
        unsafe { arch::store_release_sys_u64(self.slot(slot) as *mut u64, header) }
    }
}

impl DeviceRing {
    #[inline(always)]
    fn slot(&self, slot: u64) -> u64 {
        // SAFETY: a live channel.
        unsafe { (*(self.0 as *const ProxyChannel)).ring + slot * ProxyDescriptor::BYTES }
    }
}

/// # Safety
/// `desc` is a live channel.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn wait(desc: u64, error: u64, my_pe: u32, op_code: u32, timeout_ns: u64, end: u64, peer: u32) {
    let mut c = completed(desc);
    if c >= end {
        return;
    }
    let mut w = Deadline::new(desc, error, my_pe, op_code, timeout_ns, peer);
    loop {
        c = refresh(desc);
        if c >= end {
            return;
        }
        w.tick(WaitKind::ProxyCompletion, end, c);
    }
}

/// # Safety
/// `desc` is a live channel.
#[inline(never)]
unsafe fn quiet(desc: u64, error: u64, my_pe: u32, op_code: u32, timeout_ns: u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let head = arch::load_acquire_sys_u64(core::ptr::addr_of!((*counters(desc)).head));
        wait(desc, error, my_pe, op_code, timeout_ns, head, ibgda_abi::NONE)
    }
}

/// Takes a landing slot (tickets in order; waits while all are in use), queues the operation
/// pointing at it, waits for it, reads the value and releases the slot in ticket order.
///
/// # Safety
/// `desc` is a live channel.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn fetch(
    desc: u64,
    error: u64,
    my_pe: u32,
    op_code: u32,
    timeout_ns: u64,
    peer: u32,
    op: u8,
    aux: u8,
    target: u64,
    a: u64,
    b: u64,
    width: u32,
) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let d = &*(desc as *const ProxyChannel);
        let ctr = counters(desc);
        let n = 1u64 << d.log_landing_slots;
        let tail = core::ptr::addr_of_mut!((*ctr).landing_tail);
        let mut w = Deadline::new(desc, error, my_pe, op_code, timeout_ns, peer);
        let tickets = crate::landing::RawTickets::new(core::ptr::addr_of_mut!((*ctr).landing_head), tail);
        let ticket = crate::landing::take(&tickets, n, |need, seen| w.tick(WaitKind::LandingSlot, need, seen));
        let i = ticket & (n - 1);
        let addr = d.landing + i * 8;
        let end = post(
            desc, error, my_pe, op_code, timeout_ns, peer, op, aux, i as u16, target, a, b,
        );
        wait(desc, error, my_pe, op_code, timeout_ns, end, peer);
        // Our landing slot, written by the NIC before the completion we waited for.
        let v = if width == 8 {
            core::ptr::read_volatile(addr as *const u64)
        } else {
            core::ptr::read_volatile(addr as *const u32) as u64
        };
        let mut w = Deadline::new(desc, error, my_pe, op_code, timeout_ns, peer);
        crate::landing::release(&tickets, ticket, |t, seen| w.tick(WaitKind::LandingSlot, t, seen));
        v
    }
}

/// A bounded wait on a channel: past the PE's timeout a `Timeout` naming PE, peer, channel,
/// counter, expected, observed and elapsed time; a dead proxy at once a `ProxyFailed`.
struct Deadline {
    desc: u64,
    peer: u32,
    error: u64,
    my_pe: u32,
    op_code: u32,
    spin: Spin,
}

impl Deadline {
    #[inline(always)]
    fn new(desc: u64, error: u64, my_pe: u32, op_code: u32, timeout_ns: u64, peer: u32) -> Deadline {
        Deadline {
            desc,
            peer,
            error,
            my_pe,
            op_code,
            // Every 32 polls: a dead proxy is noticed within microseconds.
            spin: Spin::new(timeout_ns).checking_every(32, 0),
        }
    }

    #[inline(always)]
    fn tick(&mut self, kind: WaitKind, expected: u64, observed: u64) {
        if let Some(elapsed) = self.spin.checkpoint() {
            // SAFETY: counters live (the waits' contract); the poll-lock holder copies `failed`.
            let failed = unsafe { arch::load_acquire_sys_u32(core::ptr::addr_of!((*counters(self.desc)).failed_seen)) };
            if failed != 0 || self.spin.expired(elapsed) {
                let st = status(self.desc);
                // SAFETY: as above.
                let channel = unsafe { (*(self.desc as *const ProxyChannel)).index };
                give_up(
                    kind as u32,
                    failed,
                    expected,
                    observed,
                    elapsed,
                    self.peer,
                    channel,
                    st as u64,
                    self.error,
                    self.my_pe,
                    self.op_code,
                );
            }
        }
        // Every poll of a channel reads host memory over PCIe: leave the link to the others.
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
    op_code: u32,
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
    f.op = op_code;
    report(error, my_pe, f)
}

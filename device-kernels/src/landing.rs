//! Landing-slot tickets: a ring of `slots` result slots (for `g` and fetching atomics) handed out
//! in ticket order and released in ticket order, so a slot is reused only after the thread that
//! held it has read its value. Shared by the IBGDA QPs and the proxy channels, and written against
//! [`TicketCounters`] so that the loom model (`tests/tests/loom_landing.rs`) runs this very code.

use crate::arch;

/// The two counters of a landing ring as the ticket protocol touches them. Each method names the
/// ordering the protocol needs; the device implementation ([`RawTickets`]) uses system-scope
/// atomics with exactly those orderings.
pub trait TicketCounters {
    /// `head += n` (relaxed), returning the previous value: the first of the caller's `n`
    /// consecutive tickets.
    fn take_tickets(&self, n: u64) -> u64;
    /// `tail`, with acquire ordering: every ticket below it was released, and the release
    /// happened after its holder's last read of its slot.
    fn released(&self) -> u64;
    /// Moves `tail` from `from` to `to` if it holds `from` (acquire-release; the release orders
    /// the caller's reads of its slots before their reuse); returns the value it held.
    fn release_if(&self, from: u64, to: u64) -> u64;
}

/// Takes the next ticket and waits until its slot is free (`ticket < tail + slots`); `wait(needed,
/// observed)` runs between polls and bounds the wait.
#[inline(always)]
pub fn take<C: TicketCounters>(c: &C, slots: u64, wait: impl FnMut(u64, u64)) -> u64 {
    take_n(c, 1, slots, wait)
}

/// Takes the next `n` consecutive tickets (`n <= slots`) and waits until all their slots are free;
/// returns the first. One counter update for a group of threads (a warp) instead of one each.
#[inline(always)]
pub fn take_n<C: TicketCounters>(c: &C, n: u64, slots: u64, mut wait: impl FnMut(u64, u64)) -> u64 {
    let first = c.take_tickets(n);
    loop {
        let t = c.released();
        if first + n <= t + slots {
            return first;
        }
        wait(first + n - slots, t);
    }
}

/// Releases `ticket`'s slot once every earlier ticket has been released; `wait(ticket, observed)`
/// runs between attempts. `ticket` came from [`take`] on the same counters and is released once.
#[inline(always)]
pub fn release<C: TicketCounters>(c: &C, ticket: u64, wait: impl FnMut(u64, u64)) {
    release_n(c, ticket, 1, wait)
}

/// Releases the `n` tickets from `first` (taken together with [`take_n`], every holder done with
/// its slot) once every earlier ticket has been released.
#[inline(always)]
pub fn release_n<C: TicketCounters>(c: &C, first: u64, n: u64, mut wait: impl FnMut(u64, u64)) {
    loop {
        let seen = c.release_if(first, first + n);
        if seen == first {
            return;
        }
        wait(first, seen);
    }
}

/// The device's landing counters: two words of a QP's or channel's counter block.
pub(crate) struct RawTickets {
    head: *mut u64,
    tail: *mut u64,
}

impl RawTickets {
    /// # Safety
    /// `head` and `tail` are live, 8-byte aligned counters that every user accesses only
    /// atomically, for as long as the handle is used.
    #[inline(always)]
    pub(crate) unsafe fn new(head: *mut u64, tail: *mut u64) -> RawTickets {
        RawTickets { head, tail }
    }
}

impl TicketCounters for RawTickets {
    #[inline(always)]
    fn take_tickets(&self, n: u64) -> u64 {
        // SAFETY: a live counter accessed only atomically (`new`'s contract).
        unsafe { arch::atomic_add_relaxed_sys_u64(self.head, n) }
    }
    #[inline(always)]
    fn released(&self) -> u64 {
        // SAFETY: as above.
        unsafe { arch::load_acquire_sys_u64(self.tail) }
    }
    #[inline(always)]
    fn release_if(&self, from: u64, to: u64) -> u64 {
        // SAFETY: as above.
        unsafe { arch::atomic_cas_acq_rel_sys_u64(self.tail, from, to) }
    }
}

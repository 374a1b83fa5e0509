//! Landing-slot tickets: a ring of `slots` result slots (for `g` and fetching atomics) handed out
//! in ticket order and released in ticket order, so a slot is reused only after the thread that
//! held it has read its value. Shared by the IBGDA QPs and the proxy channels.

use crate::arch;

/// Takes the next ticket and waits until its slot is free (`ticket < tail + slots`); `wait(needed,
/// observed)` runs between polls and bounds the wait.
///
/// # Safety
/// `head` and `tail` are live counters that every user accesses only atomically.
#[inline(always)]
pub(crate) unsafe fn take(head: *mut u64, tail: *const u64, slots: u64, mut wait: impl FnMut(u64, u64)) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let ticket = arch::atomic_add_relaxed_sys_u64(head, 1);
        loop {
            let t = arch::load_acquire_sys_u64(tail);
            if ticket < t + slots {
                return ticket;
            }
            wait(ticket + 1 - slots, t);
        }
    }
}

/// Releases `ticket`'s slot once every earlier ticket has been released; `wait(ticket, observed)`
/// runs between attempts.
///
/// # Safety
/// As [`take`]; `ticket` came from [`take`] on the same counters and is released once.
#[inline(always)]
pub(crate) unsafe fn release(tail: *mut u64, ticket: u64, mut wait: impl FnMut(u64, u64)) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        loop {
            let seen = arch::atomic_cas_acq_rel_sys_u64(tail, ticket, ticket + 1);
            if seen == ticket {
                return;
            }
            wait(ticket, seen);
        }
    }
}

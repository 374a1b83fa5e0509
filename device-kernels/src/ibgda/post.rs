//! The posting protocol of one send queue, written once against [`PostQueue`] so the device, the
//! CPU emulation and the loom model (`tests/tests/loom_post.rs`) all run the same steps:
//!
//! 1. **reserve**: `base = resv_head.fetch_add(n)`; wait until the ring has room
//!    (`base + n - cons_idx <= depth`), making progress (ring, poll) while waiting;
//! 2. the caller writes its WQEs into `[base, base + n)`;
//! 3. **submit**: mark the range ready strictly in reservation order (`ready_head` CAS chain, which
//!    also publishes the WQE stores), then ring the doorbell unless a later poster will;
//! 4. **ring**: one compare-and-swap on the ring state (`prod << 1 | RINGING`) publishes `new` and,
//!    when nobody was ringing, makes this poster the ringer: it stores the DBR (release) and writes
//!    the 8-byte doorbell, then hands the role back with a second compare-and-swap that succeeds
//!    only if nothing was published meanwhile (else it rings that too). Only the ringer writes DBR
//!    and doorbell, so their values never go backwards; nobody waits for the role.
//!
//! An uncontended post is a chain of six dependent steps (reserve; room, with the look at the
//! newest reservation in flight beside it; ready; publish; DBR and doorbell; hand back); each
//! costs a round trip to L2 or beyond, which is what a post costs on the GPU.

/// Doorbells are batched: a poster that is not the last reserver rings only when its range
/// crosses a multiple of this many WQEBBs (NVSHMEM's `NUM_REQUESTS_IN_BATCH` default).
pub const DOORBELL_BATCH: u64 = 32;

/// The shared state of one send queue, as the posting protocol touches it. Each method names the
/// ordering it must provide.
pub trait PostQueue {
    /// Send-queue depth in WQEBBs (a power of two).
    fn depth(&self) -> u64;
    /// `resv_head.fetch_add(n)` (relaxed is enough: slots are published by the ready chain).
    fn reserve(&self, n: u64) -> u64;
    /// `resv_head` now (relaxed).
    fn resv_head(&self) -> u64;
    /// `ready_head` now (acquire: the WQEs below it are then visible to this thread).
    fn ready_head(&self) -> u64;
    /// `cons_idx` now (acquire).
    fn cons_idx(&self) -> u64;
    /// `ready_head.compare_exchange(from, to)` with release (publishes this thread's WQE stores)
    /// and acquire (so a later ringer publishes everyone's); `Err(current)` on failure.
    fn advance_ready(&self, from: u64, to: u64) -> Result<(), u64>;
    /// The ring state now (`prod << 1 | RINGING`, acquire).
    fn ring_state(&self) -> u64;
    /// `ring_state.compare_exchange(from, to)` with acquire and release (a ringer then publishes
    /// the WQEs of every poster whose index it rings); `Err(current)` on failure.
    fn swap_ring_state(&self, from: u64, to: u64) -> Result<(), u64>;
    /// Stores `htobe32(pi)` to the send DBR with release semantics.
    fn write_dbr(&self, pi: u16);
    /// Orders the DBR store before, then writes the 8-byte doorbell for producer index `prod`.
    fn ring_doorbell(&self, prod: u64);
    /// Reads the CQ, publishes what it completed in `cons_idx` (release) and returns the index
    /// just past the last completed WQE it saw (0 when the CQ shows none). Never returns with an
    /// error CQE unreported.
    fn poll_completions(&self) -> u64;
}

/// The bit of the ring state that says a poster is ringing.
pub use ibgda_abi::ibgda::RINGING;

/// What a waiting step is waiting for (mirrors [`ibgda_abi::WaitKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Room in the ring.
    SendQueueSlot,
    /// Earlier posters to mark their ranges ready.
    ReadyChain,
    /// Completions up to an index.
    Completion,
}

/// Called on every iteration of a waiting loop: checks the deadline (and reports and traps past
/// it) on the device, yields in a model checker.
pub trait Waiter {
    /// One more iteration of a wait for `what`: the loop needs `expected` and saw `observed`.
    fn spin(&mut self, what: Waiting, expected: u64, observed: u64);
}

/// Reserves `n` consecutive WQEBBs and waits until the ring has room for them. Returns `base`
/// and whether the reservation was the newest (`resv_head == base + n`) when looked at, right
/// after it was taken: that load is in flight with the room check's instead of costing a round
/// trip of its own after the WQE is written. A later look could only see more reservations, so
/// an early `true` costs at most a doorbell and a CQE too many ([`submit`], [`wants_completion`]),
/// and a `false` stays true: the later reserver submits after this one and rings.
#[inline(always)]
pub fn reserve<Q: PostQueue, W: Waiter>(q: &Q, w: &mut W, n: u64) -> (u64, bool) {
    let base = q.reserve(n);
    let newest = q.resv_head() == base + n;
    let need = (base + n).saturating_sub(q.depth());
    loop {
        let cons = q.cons_idx();
        if cons >= need {
            return (base, newest);
        }
        // The slots we need may belong to WQEs that are written but not yet rung (their posters
        // left the doorbell to a later reserver, possibly us): ring everything ready, then poll.
        ring(q, w, q.ready_head());
        q.poll_completions();
        w.spin(Waiting::SendQueueSlot, need, cons);
    }
}

/// Every WQEBB index that is a multiple of this many gets its WQE signalled, so completions
/// arrive at least this often: a quarter of a `depth`-WQEBB ring, at most [`DOORBELL_BATCH`].
#[inline(always)]
pub const fn completion_interval(depth: u64) -> u64 {
    let quarter = depth / 4;
    if quarter == 0 {
        1
    } else if quarter < DOORBELL_BATCH {
        quarter
    } else {
        DOORBELL_BATCH
    }
}

/// Selective completion: whether the WQE at `[base, base + n)` of a `depth`-WQEBB ring asks for a
/// CQE. It does when the poster will wait for it (`force`), when it covers a multiple of
/// [`completion_interval`] (so a poster waiting for ring room sees completions within a quarter
/// ring), and when it is the `newest` reserved so far (`resv_head == base + n` when reserved: the
/// newest WQE of an idle queue, which `quiet` waits for, always completes, and its poster also
/// rings, see [`submit`]). Completing a signalled WQE completes every earlier one (in-order
/// execution).
#[inline(always)]
pub const fn wants_completion(depth: u64, base: u64, n: u64, force: bool, newest: bool) -> bool {
    let every = completion_interval(depth);
    force || newest || base / every != (base + n) / every
}

/// Marks `[base, base + n)` ready (after the caller wrote its WQEs) and rings the doorbell if this
/// poster was the `newest` reserver when it looked (unless it `defer`s: it posts again at once and
/// rings then), crosses a batch boundary, or `force` is set. Returns whether it rang.
///
/// A poster that saw a later reservation leaves the ring to that poster, who submits after it (the
/// ready chain is in reservation order) and rings or leaves it to a later one in turn; the last
/// reserver always rings. One that saw none rings even if a reservation came since: a doorbell
/// too many costs a store, one too few a hang.
#[inline(always)]
pub fn submit<Q: PostQueue, W: Waiter>(
    q: &Q,
    w: &mut W,
    base: u64,
    n: u64,
    force: bool,
    defer: bool,
    newest: bool,
) -> bool {
    let new = base + n;
    loop {
        match q.advance_ready(base, new) {
            Ok(()) => break,
            Err(current) => w.spin(Waiting::ReadyChain, base, current),
        }
    }
    let crosses_batch = base / DOORBELL_BATCH != new / DOORBELL_BATCH || n >= DOORBELL_BATCH;
    if force || crosses_batch || (!defer && newest) {
        // On an uncontended queue the last ring published exactly `base` and is over: the guess
        // saves loading the ring state first.
        ring_guessing(q, new, base << 1);
        true
    } else {
        false
    }
}

/// Makes sure the doorbell gets rung for producer index `new` (every WQEBB below `new` must be
/// ready), by this thread or by the one ringing now. Never waits: a poster that finds another
/// ringing only publishes `new`, which the ringer then rings before it hands the role back.
#[inline(always)]
pub fn ring<Q: PostQueue, W: Waiter>(q: &Q, _w: &mut W, new: u64) {
    ring_from(q, new, q.ring_state(), true)
}

/// [`ring`] starting from `guess`, what the ring state probably holds: a wrong guess costs one
/// failed compare-and-swap, a right one saves loading the state first.
#[inline(always)]
fn ring_guessing<Q: PostQueue>(q: &Q, new: u64, guess: u64) {
    ring_from(q, new, guess, false)
}

/// [`ring`] from `cur`, the ring state as loaded (`observed`) or guessed.
#[inline(always)]
fn ring_from<Q: PostQueue>(q: &Q, new: u64, mut cur: u64, mut observed: bool) {
    loop {
        if cur >> 1 >= new {
            // Published already (by a ringer, or before a ringer took the role: either way it is
            // rung before the role is handed back); a guess that says so is checked first.
            if observed {
                return;
            }
            (cur, observed) = (q.ring_state(), true);
            continue;
        }
        match q.swap_ring_state(cur, new << 1 | RINGING) {
            Ok(()) if cur & RINGING == 0 => break,
            // Another poster is ringing: it will see `new` when it hands the role back.
            Ok(()) => return,
            Err(seen) => (cur, observed) = (seen, true),
        }
    }
    // This poster is the ringer. Ring, then hand the role back unless more was published.
    let mut target = new;
    loop {
        q.write_dbr(target as u16);
        q.ring_doorbell(target);
        match q.swap_ring_state(target << 1 | RINGING, target << 1) {
            Ok(()) => return,
            Err(seen) => target = seen >> 1,
        }
    }
}

/// Waits until every WQEBB below `idx` has completed, making sure that what is ready below `idx`
/// gets rung. It never rings past `ready_head`: slots above it may still be being written by
/// their posters, who ring them (or leave them to a later poster) once ready.
#[inline(always)]
pub fn wait_completed<Q: PostQueue, W: Waiter>(q: &Q, w: &mut W, idx: u64) {
    if q.cons_idx() >= idx {
        return;
    }
    let mut rung = 0;
    loop {
        // Once `idx` itself is rung (the usual first pass: the caller's own WQEs are ready),
        // the poll loop reads only the CQ.
        if rung < idx {
            let target = idx.min(q.ready_head());
            if target > rung {
                ring(q, w, target);
                rung = target;
            }
        }
        if q.poll_completions() >= idx {
            return;
        }
        // Another poller may have seen the completion first (and the CQ moved on since).
        let cons = q.cons_idx();
        if cons >= idx {
            return;
        }
        w.spin(Waiting::Completion, idx, cons);
    }
}

/// `quiet` on one QP: completes everything marked ready so far.
#[inline(always)]
pub fn quiet<Q: PostQueue, W: Waiter>(q: &Q, w: &mut W) {
    let ready = q.ready_head();
    wait_completed(q, w, ready);
}

/// The 64-bit index just past the WQE whose 16-bit `wqe_counter` a CQE reports, given a producer
/// index `prod` at or past it (NVSHMEM's wrap rule; sound while fewer than 65536 WQEBBs are
/// outstanding, which [`ibgda_abi::mlx5::MAX_SQ_DEPTH`] guarantees).
#[inline(always)]
pub const fn completed_index(prod: u64, wqe_counter: u16) -> u64 {
    let done16 = wqe_counter.wrapping_add(1);
    prod - ((prod as u16).wrapping_sub(done16) as u64)
}

#[cfg(test)]
mod tests {
    use super::{completed_index, completion_interval, wants_completion};

    #[test]
    fn selective_completion_signals_boundaries_the_newest_and_forced_wqes() {
        assert_eq!(completion_interval(1024), 32);
        // 100 one-WQEBB WQEs, none the newest when written: only those ending on a multiple of 32.
        let mut signalled = [0u64; 8];
        let mut k = 0;
        for b in (0..100).filter(|&b| wants_completion(1024, b, 1, false, false)) {
            signalled[k] = b;
            k += 1;
        }
        assert_eq!(signalled[..k], [31, 63, 95]);
        assert!(wants_completion(1024, 99, 1, false, true), "the newest");
        assert!(wants_completion(1024, 40, 1, true, false), "awaited");
        // A 3-WQEBB WQE straddling 64 covers it.
        assert!(wants_completion(1024, 62, 3, false, false));
        // Small rings signal at least every quarter ring; tiny ones every WQE.
        assert_eq!(completion_interval(8), 2);
        assert_eq!((0..8).filter(|&b| wants_completion(8, b, 1, false, false)).count(), 4);
        assert!((0..8).all(|b| wants_completion(4, b, 1, false, false)));
    }

    #[test]
    fn completion_index_wraps_16_bits() {
        assert_eq!(completed_index(10, 9), 10);
        assert_eq!(completed_index(10, 4), 5);
        assert_eq!(completed_index(0x1_0003, 0xffff), 0x1_0000);
        assert_eq!(completed_index(0x1_0003, 0x0001), 0x1_0002);
        assert_eq!(completed_index(0x5_fff0, 0xffef), 0x5_fff0);
        // 32768 outstanding: the furthest a CQE can lag behind the producer.
        assert_eq!(completed_index(0x2_8000, 0x7fff), 0x2_8000);
        assert_eq!(completed_index(0x2_8000, 0xffff), 0x2_0000);
    }
}

//! Exhaustive interleavings (loom) of the landing-slot ticket protocol
//! (`ibgda_device::landing::{take, release}`, the very code the device runs for `g` and fetching
//! atomics on IBGDA QPs and proxy channels) with 2 and 3 threads sharing fewer slots than threads,
//! so slots are reused. Each thread takes a ticket, writes its slot (the NIC landing its value),
//! reads it back and releases. Checked:
//! - a slot is never written while its previous holder may still read it (loom's `UnsafeCell`
//!   tracking reports the race) and every thread reads back its own value;
//! - tickets are released in order: once every thread returns, the tail counts them all.
//!
//! The same model with the tail read `Relaxed` instead of `Acquire` (a deliberately broken
//! ordering) must fail: that is what shows the model can see the bug it guards against.

use ibgda_device::landing::{release, take, TicketCounters};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;

struct Tickets {
    head: AtomicU64,
    tail: AtomicU64,
    slots: Vec<UnsafeCell<u64>>,
    /// The ordering of `released`: `Acquire` as the device does, `Relaxed` for the broken variant.
    released_ordering: Ordering,
}

impl TicketCounters for Tickets {
    fn take_tickets(&self, n: u64) -> u64 {
        self.head.fetch_add(n, Ordering::Relaxed)
    }
    fn released(&self) -> u64 {
        self.tail.load(self.released_ordering)
    }
    fn release_if(&self, from: u64, to: u64) -> u64 {
        match self
            .tail
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(v) | Err(v) => v,
        }
    }
}

fn model(threads: u64, slots: usize, released_ordering: Ordering) {
    let t = Arc::new(Tickets {
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
        slots: (0..slots).map(|_| UnsafeCell::new(u64::MAX)).collect(),
        released_ordering,
    });
    let handles: Vec<_> = (0..threads)
        .map(|me| {
            let t = t.clone();
            loom::thread::spawn(move || {
                let n = t.slots.len() as u64;
                let ticket = take(&*t, n, |_, _| loom::thread::yield_now());
                let slot = &t.slots[(ticket % n) as usize];
                // The NIC lands the value, then the holder reads it.
                slot.with_mut(|p| unsafe { *p = me });
                let seen = slot.with(|p| unsafe { *p });
                assert_eq!(
                    seen,
                    me,
                    "thread {me} read another thread's value from slot {}",
                    ticket % n
                );
                release(&*t, ticket, |_, _| loom::thread::yield_now());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        t.tail.load(Ordering::Acquire),
        threads,
        "every ticket released, in order"
    );
    assert_eq!(t.head.load(Ordering::Relaxed), threads);
}

fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.max_branches = 50_000;
    b
}

#[test]
fn two_threads_share_one_landing_slot() {
    builder(2).check(|| model(2, 1, Ordering::Acquire));
}

#[test]
fn three_threads_share_two_landing_slots() {
    builder(1).check(|| model(3, 2, Ordering::Acquire));
}

#[test]
#[should_panic(expected = "Causality violation")]
fn a_relaxed_tail_read_lets_a_slot_be_reused_too_early() {
    builder(2).check(|| model(2, 1, Ordering::Relaxed));
}

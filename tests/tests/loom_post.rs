//! Exhaustive interleavings (loom) of the IBGDA posting protocol (`ibgda_device::ibgda::post`,
//! the very code the device runs, with the device's orderings in every `PostQueue` method) with 2
//! and 3 posting threads and a ring smaller than the work (so it wraps). The NIC is modelled where
//! it acts: every DBR store first reads the WQE slots it exposes, and completion polling retires
//! what the DBR covers. Checked:
//! - no doorbell exposes an unwritten WQE (the NIC's read of a slot would race the poster's write,
//!   which loom's `UnsafeCell` tracking reports, and the tag check would fail);
//! - the DBR and the producer index never go backwards;
//! - no WQE is lost: once every poster returns, the DBR covers every reserved WQEBB.

use ibgda_device::ibgda::post::{self, PostQueue, Waiter, Waiting};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use loom::sync::Arc;

struct Queue {
    resv: AtomicU64,
    ready: AtomicU64,
    /// `prod << 1 | RINGING`.
    ring: AtomicU64,
    cons: AtomicU64,
    dbr: AtomicU32,
    doorbells: AtomicU32,
    /// What the NIC has seen exposed (written only by the ringer).
    exposed: AtomicU64,
    slots: Vec<UnsafeCell<u64>>,
    /// The deliberately broken variant: `advance_ready` without release ordering.
    broken_publish: bool,
    /// The deliberately broken variant: the ringer hands the role back with a plain store,
    /// without looking for an index published while it rang.
    broken_handback: bool,
    /// The deliberately broken variant: the ring state reads as everything published, so a
    /// poster that rings what it deferred believes it rung already.
    broken_published: bool,
}

impl Queue {
    fn new(depth: usize) -> Queue {
        Queue {
            resv: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            ring: AtomicU64::new(0),
            cons: AtomicU64::new(0),
            dbr: AtomicU32::new(0),
            doorbells: AtomicU32::new(0),
            exposed: AtomicU64::new(0),
            slots: (0..depth).map(|_| UnsafeCell::new(0)).collect(),
            broken_publish: false,
            broken_handback: false,
            broken_published: false,
        }
    }
}

impl PostQueue for Queue {
    fn depth(&self) -> u64 {
        self.slots.len() as u64
    }
    fn reserve(&self, n: u64) -> u64 {
        self.resv.fetch_add(n, Relaxed)
    }
    fn resv_head(&self) -> u64 {
        self.resv.load(Relaxed)
    }
    fn ready_head(&self) -> u64 {
        self.ready.load(Acquire)
    }
    fn cons_idx(&self) -> u64 {
        self.cons.load(Acquire)
    }
    fn advance_ready(&self, from: u64, to: u64) -> Result<(), u64> {
        // The device's `atom.acq_rel.sys.cas`; the broken variant drops the release that
        // publishes the poster's WQE to whoever rings.
        let success = if self.broken_publish { Acquire } else { AcqRel };
        self.ready.compare_exchange(from, to, success, Acquire).map(|_| ())
    }
    fn ring_state(&self) -> u64 {
        if self.broken_published {
            return u64::MAX - 1;
        }
        self.ring.load(Acquire)
    }
    fn swap_ring_state(&self, from: u64, to: u64) -> Result<(), u64> {
        // The device's `atom.acq_rel.gpu.cas`; the broken variant's hand-back is a blind store.
        if self.broken_handback && from & post::RINGING != 0 && to & post::RINGING == 0 {
            self.ring.store(to, Release);
            return Ok(());
        }
        self.ring.compare_exchange(from, to, AcqRel, Acquire).map(|_| ())
    }
    fn write_dbr(&self, pi: u16) {
        // The NIC will fetch [exposed, pi) once it sees this value: those WQEs must be written
        // and visible now. Reading a slot a poster is still writing is a race loom reports.
        let from = self.exposed.load(Relaxed);
        assert!(pi as u64 >= from, "DBR went backwards: {pi} after {from}");
        let depth = self.slots.len();
        for idx in from..pi as u64 {
            let tag = self.slots[idx as usize % depth].with(|p| unsafe { *p });
            assert_eq!(tag, idx + 1, "the doorbell exposes an unwritten WQE at {idx}");
        }
        self.exposed.store(pi as u64, Relaxed);
        self.dbr.store(pi as u32, Release)
    }
    fn ring_doorbell(&self, _prod: u64) {
        self.doorbells.fetch_add(1, Release);
    }
    fn poll_completions(&self) -> u64 {
        // The NIC completes everything the DBR exposed.
        let pi = self.dbr.load(Acquire) as u64;
        self.cons.fetch_max(pi, Release);
        pi
    }
}

struct Yield;
impl Waiter for Yield {
    fn spin(&mut self, _what: Waiting, _expected: u64, _observed: u64) {
        loom::thread::yield_now();
    }
}

/// `posters` threads post one 1-WQEBB WQE each into a `depth`-deep ring.
fn model(posters: u64, depth: usize) {
    model_with(posters, depth, false)
}

fn model_with(posters: u64, depth: usize, broken_publish: bool) {
    model_broken(posters, depth, broken_publish, false)
}

fn model_broken(posters: u64, depth: usize, broken_publish: bool, broken_handback: bool) {
    model_full(
        posters,
        depth,
        false,
        Queue {
            broken_publish,
            broken_handback,
            ..Queue::new(depth)
        },
    )
}

/// The model with `q`; with `defer_first` the first thread defers its ring (as a poster that
/// posts again at once does) and then rings everything marked ready itself, as `flush` does.
fn model_full(posters: u64, depth: usize, defer_first: bool, q: Queue) {
    let q = Arc::new(q);
    let handles: Vec<_> = (0..posters)
        .map(|t| {
            let q = q.clone();
            loom::thread::spawn(move || {
                let mut w = Yield;
                let (base, newest) = post::reserve(&*q, &mut w, 1);
                q.slots[base as usize % depth].with_mut(|p| unsafe { *p = base + 1 });
                let defer = defer_first && t == 0;
                post::submit(&*q, &mut w, base, 1, false, defer, newest);
                if defer {
                    post::ring(&*q, &mut w, q.ready_head());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // No lost WQE: every reservation is covered by the producer index and the DBR.
    assert_eq!(
        q.ring.load(Acquire),
        posters << 1,
        "lost a WQE: not all published, or left ringing"
    );
    assert_eq!(
        q.dbr.load(Acquire) as u64,
        posters,
        "lost a WQE: the DBR does not cover it"
    );
    assert!(q.doorbells.load(Acquire) >= 1);
}

#[test]
fn two_posters_wrapping_a_one_slot_ring() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 50_000;
    b.check(|| model(2, 1));
}

#[test]
fn three_posters_wrapping_a_two_slot_ring() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.max_branches = 50_000;
    b.check(|| model(3, 2));
}

/// Two posters that both fit in the ring ring concurrently: a poster that finds another ringing
/// leaves its index to the ringer, who must ring it before handing the role back.
#[test]
fn two_concurrent_ringers_lose_no_doorbell() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(|| model(2, 4));
}

/// The model finds the bug it guards against: a poster that advances the ready chain without
/// release lets the ringer expose its WQE before the write is visible.
#[test]
#[should_panic(expected = "Causality violation")]
fn publishing_without_release_is_caught() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 50_000;
    b.check(|| model_with(2, 4, true));
}

/// The model finds a lost doorbell: a ringer that hands the role back without looking strands an
/// index published while it rang.
#[test]
#[should_panic(expected = "lost a WQE")]
fn a_blind_handback_loses_a_doorbell() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(|| model_broken(2, 4, false, true));
}

/// A poster that defers its ring and then rings what it marked ready itself (as `flush` does)
/// loses nothing, whoever holds the ring role when it looks.
#[test]
fn a_deferred_ring_is_rung_by_its_poster_or_the_ringer() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(|| model_full(2, 4, true, Queue::new(4)));
}

/// The model finds a deferred doorbell lost: a poster that believes its index published without
/// looking at the ring state never rings what it deferred.
#[test]
#[should_panic(expected = "lost a WQE")]
fn believing_a_deferred_index_published_loses_it() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(|| {
        model_full(
            2,
            4,
            true,
            Queue {
                broken_published: true,
                ..Queue::new(4)
            },
        )
    });
}

//! Exhaustive interleavings (loom) of the proxy descriptor ring (`ibgda_device::proxy_ring`: the
//! GPU threads' `post` and the proxy thread's `peek`, the very code both ends run, with their
//! orderings), with 2 and 3 posting threads on a ring of fewer slots than descriptors, so slots
//! are reused across laps under flow control. The descriptor bodies are modelled as plain memory,
//! so a read or write the protocol does not order is a race loom reports. Checked:
//! - the proxy never reads a body before its poster finished it, and a poster never rewrites a
//!   slot the proxy may still be reading (lap stamps and flow control);
//! - every descriptor is read exactly once, whole, in ticket order.
//!
//! Two deliberately broken variants must fail: a header published without release, and the
//! completion count read without acquire.

use ibgda_device::proxy_ring::{peek, post, RingReader, RingWriter};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;

#[derive(Clone, Copy, Default)]
struct Broken {
    header_relaxed: bool,
    completed_relaxed: bool,
}

struct Ring {
    head: AtomicU64,
    completed: AtomicU64,
    headers: Vec<AtomicU64>,
    bodies: Vec<UnsafeCell<(u64, u64, u64)>>,
    broken: Broken,
}

impl RingWriter for Ring {
    fn slots(&self) -> u64 {
        self.headers.len() as u64
    }
    fn claim(&self) -> u64 {
        self.head.fetch_add(1, Ordering::Relaxed)
    }
    fn completed(&self) -> u64 {
        let o = if self.broken.completed_relaxed {
            Ordering::Relaxed
        } else {
            Ordering::Acquire
        };
        self.completed.load(o)
    }
    fn write_body(&self, slot: u64, target: u64, a: u64, b: u64) {
        self.bodies[slot as usize].with_mut(|p| unsafe { *p = (target, a, b) });
    }
    fn publish_header(&self, slot: u64, header: u64) {
        let o = if self.broken.header_relaxed {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        self.headers[slot as usize].store(header, o);
    }
}

impl RingReader for Ring {
    fn slots(&self) -> u64 {
        self.headers.len() as u64
    }
    fn header(&self, slot: u64) -> u64 {
        self.headers[slot as usize].load(Ordering::Acquire)
    }
    fn body(&self, slot: u64) -> (u64, u64, u64) {
        self.bodies[slot as usize].with(|p| unsafe { *p })
    }
}

fn model(posters: u64, slots: usize, broken: Broken) {
    let ring = Arc::new(Ring {
        head: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        headers: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        bodies: (0..slots).map(|_| UnsafeCell::new((0, 0, 0))).collect(),
        broken,
    });
    let handles: Vec<_> = (0..posters)
        .map(|me| {
            let r = ring.clone();
            loom::thread::spawn(move || {
                post(&*r, |_, _| loom::thread::yield_now(), 1, 0, 0, me * 10, me, me * 100);
            })
        })
        .collect();
    // The proxy: descriptors in ticket order, each whole, completion published after its read.
    let mut seen = Vec::new();
    for next in 0..posters {
        let d = loop {
            if let Some(d) = peek(&*ring, next) {
                break d;
            }
            loom::thread::yield_now();
        };
        assert_eq!(
            (d.target, d.b),
            (d.a * 10, d.a * 100),
            "descriptor {next} read half-written"
        );
        seen.push(d.a);
        ring.completed.store(next + 1, Ordering::Release);
    }
    for h in handles {
        h.join().unwrap();
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..posters).collect::<Vec<_>>(), "every descriptor exactly once");
}

fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.max_branches = 50_000;
    b
}

#[test]
fn two_posters_share_a_one_slot_ring() {
    builder(1).check(|| model(2, 1, Broken::default()));
}

#[test]
fn three_posters_share_a_two_slot_ring() {
    builder(1).check(|| model(3, 2, Broken::default()));
}

#[test]
#[should_panic(expected = "Causality violation")]
fn a_header_published_without_release_is_caught() {
    builder(1).check(|| {
        model(
            2,
            1,
            Broken {
                header_relaxed: true,
                ..Broken::default()
            },
        )
    });
}

#[test]
#[should_panic(expected = "Causality violation")]
fn a_completion_count_read_without_acquire_is_caught() {
    builder(1).check(|| {
        model(
            2,
            1,
            Broken {
                completed_relaxed: true,
                ..Broken::default()
            },
        )
    });
}

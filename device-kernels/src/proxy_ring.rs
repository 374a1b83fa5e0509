//! The proxy descriptor ring's publish protocol, written once for both ends: GPU threads post
//! descriptors ([`post`], run by the device API) and a proxy thread on the CPU reads them
//! ([`peek`], run by the host's proxy worker). Each end reaches the ring through a small trait
//! whose methods name their ordering, so the loom model (`tests/tests/loom_proxy_ring.rs`) runs
//! this very code with the same orderings.
//!
//! The protocol: a poster takes ticket `t` (`head += 1`), waits until the proxy has completed
//! every descriptor of the slot's previous lap (`t < completed + slots`, acquire: the proxy's
//! reads of that slot happened before), writes the body words, then publishes the header with
//! the lap stamp `t + 1` by a release store. The proxy reads descriptor `next` only once its
//! header carries `next`'s stamp (acquire: the body is then complete), and publishes how many it
//! completed with a release store.

use ibgda_abi::proxy::ProxyDescriptor;

/// A poster's view of a channel's ring.
pub trait RingWriter {
    /// Descriptors in the ring (a power of two).
    fn slots(&self) -> u64;
    /// `head += 1` (relaxed), returning the caller's ticket.
    fn claim(&self) -> u64;
    /// Descriptors the proxy has completed, as last learnt (acquire: the proxy's reads of their
    /// slots happened before).
    fn completed(&self) -> u64;
    /// [`RingWriter::completed`] after asking the proxy again (the ring looked full).
    fn refresh(&self) -> u64 {
        self.completed()
    }
    /// Stores words 1..4 (target, a, b) of `slot` (relaxed: the header's release publishes them).
    fn write_body(&self, slot: u64, target: u64, a: u64, b: u64);
    /// Stores word 0 of `slot` with release ordering.
    fn publish_header(&self, slot: u64, header: u64);
}

/// Posts one descriptor and returns the ticket count just past it (what a waiter for its
/// completion waits for). `wait(needed, observed)` runs while the ring is full and bounds the
/// wait.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn post<R: RingWriter>(
    r: &R,
    mut wait: impl FnMut(u64, u64),
    op: u8,
    aux: u8,
    landing: u16,
    target: u64,
    a: u64,
    b: u64,
) -> u64 {
    let slots = r.slots();
    let t = r.claim();
    if t >= r.completed() + slots {
        loop {
            let c = r.refresh();
            if t < c + slots {
                break;
            }
            wait(t + 1 - slots, c);
        }
    }
    let slot = t & (slots - 1);
    r.write_body(slot, target, a, b);
    r.publish_header(
        slot,
        ProxyDescriptor::header_word(ProxyDescriptor::stamp_of(t), op, aux, landing),
    );
    t + 1
}

/// The proxy's view of a channel's ring.
pub trait RingReader {
    /// Descriptors in the ring (a power of two).
    fn slots(&self) -> u64;
    /// Word 0 of `slot`, with acquire ordering.
    fn header(&self, slot: u64) -> u64;
    /// Words 1..4 of `slot` (relaxed: ordered after the header by its acquire).
    fn body(&self, slot: u64) -> (u64, u64, u64);
}

/// Descriptor `ticket`, if its poster has published it (its header carries the ticket's stamp).
#[inline(always)]
pub fn peek<R: RingReader>(r: &R, ticket: u64) -> Option<ProxyDescriptor> {
    let slot = ticket & (r.slots() - 1);
    let header = r.header(slot);
    if header as u32 != ProxyDescriptor::stamp_of(ticket) {
        return None;
    }
    let (target, a, b) = r.body(slot);
    Some(ProxyDescriptor {
        stamp: header as u32,
        op: (header >> 32) as u8,
        aux: (header >> 40) as u8,
        landing: (header >> 48) as u16,
        target,
        a,
        b,
    })
}

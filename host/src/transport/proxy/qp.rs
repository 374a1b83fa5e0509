//! A proxy thread's QP to one peer: mlx5 WQEs written straight into a host-memory send queue
//! ([`WqeQp`], the emulated device or a ConnectX), or work requests posted through standard verbs
//! ([`VerbsPoster`], any other RDMA device). The worker sees one interface; counts are in the
//! QP's own slots (WQEBBs or work requests).

use super::verbs_qp::VerbsPoster;
use super::wqe_qp::WqeQp;
use crate::error::Result;
use crate::nic::NicQp;
use ibgda_device::ibgda::wqe::AtomicOp;
use std::sync::Arc;

enum Sink {
    Wqe(WqeQp),
    Verbs(VerbsPoster),
}

/// A proxy thread's QP to `peer`, with the keys and address its descriptors need.
pub(crate) struct ProxyQp {
    sink: Sink,
    pub(crate) peer: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) peer_heap_base: u64,
}

macro_rules! each {
    ($self:expr, $q:ident => $e:expr) => {
        match &$self.sink {
            Sink::Wqe($q) => $e,
            Sink::Verbs($q) => $e,
        }
    };
    (mut $self:expr, $q:ident => $e:expr) => {
        match &mut $self.sink {
            Sink::Wqe($q) => $e,
            Sink::Verbs($q) => $e,
        }
    };
}

impl ProxyQp {
    /// A poster on `qp` to `peer`: through verbs for a verbs QP, else by writing WQEs into its
    /// host-memory queues (which it must have).
    pub(crate) fn new(qp: Arc<dyn NicQp>, peer: u32, lkey: u32, rkey: u32, peer_heap_base: u64) -> Result<ProxyQp> {
        let sink = match VerbsPoster::new(qp.clone(), peer) {
            Some(v) => Sink::Verbs(v),
            None => Sink::Wqe(WqeQp::new(qp, peer, rkey)?),
        };
        Ok(ProxyQp {
            sink,
            peer,
            lkey,
            rkey,
            peer_heap_base,
        })
    }

    /// Whether `slots` more fit.
    pub(crate) fn fits(&self, slots: u64) -> bool {
        each!(self, q => q.fits(slots))
    }
    /// Slots an inline write of `len` bytes takes.
    pub(crate) fn inline_slots(&self, len: usize) -> u64 {
        match &self.sink {
            Sink::Wqe(_) => WqeQp::inline_slots(len),
            Sink::Verbs(_) => 1,
        }
    }
    /// Slots an atomic takes.
    pub(crate) fn atomic_slots(&self, op: &AtomicOp) -> u64 {
        match &self.sink {
            Sink::Wqe(_) => WqeQp::atomic_slots(op),
            Sink::Verbs(_) => 1,
        }
    }
    /// The slot index past everything queued.
    pub(crate) fn prod(&self) -> u64 {
        each!(self, q => q.prod())
    }
    /// The producer index last rung.
    pub(crate) fn rung(&self) -> u64 {
        each!(self, q => q.rung())
    }
    /// Every slot below this has completed.
    pub(crate) fn cons(&self) -> u64 {
        each!(self, q => q.cons)
    }
    /// Whether anything rung has not completed.
    pub(crate) fn busy(&self) -> bool {
        each!(self, q => q.busy())
    }
    /// WQEs (work requests) queued so far.
    pub(crate) fn wqes(&self) -> u64 {
        each!(self, q => q.wqes)
    }
    /// Doorbells rung (chains posted) so far.
    pub(crate) fn doorbells(&self) -> u64 {
        each!(self, q => q.doorbells)
    }
    /// Queues an RDMA WRITE (`read == false`) or READ of `len` bytes to `raddr`.
    pub(crate) fn rdma(&mut self, read: bool, laddr: u64, lkey: u32, raddr: u64, len: u32) {
        let rkey = self.rkey;
        match &mut self.sink {
            Sink::Wqe(q) => q.rdma(read, laddr, lkey, raddr, len),
            Sink::Verbs(q) => q.rdma(read, laddr, lkey, raddr, rkey, len),
        }
    }
    /// Queues an inline write of `data` (at most 8 bytes).
    pub(crate) fn inline_write(&mut self, raddr: u64, data: &[u8]) {
        let rkey = self.rkey;
        match &mut self.sink {
            Sink::Wqe(q) => q.inline_write(raddr, data),
            Sink::Verbs(q) => q.inline_write(raddr, rkey, data),
        }
    }
    /// Queues an atomic whose previous value lands at `laddr`.
    pub(crate) fn atomic(
        &mut self,
        op: AtomicOp,
        laddr: u64,
        lkey: u32,
        raddr: u64,
    ) -> std::result::Result<(), String> {
        let rkey = self.rkey;
        match &mut self.sink {
            Sink::Wqe(q) => {
                q.atomic(op, laddr, lkey, raddr);
                Ok(())
            }
            Sink::Verbs(q) => q.atomic(op, laddr, lkey, raddr, rkey),
        }
    }
    /// Hands everything queued to the NIC.
    pub(crate) fn ring(&mut self) -> std::result::Result<(), String> {
        match &mut self.sink {
            Sink::Wqe(q) => {
                q.ring();
                Ok(())
            }
            Sink::Verbs(q) => q.ring(),
        }
    }
    /// Reads completions; returns `cons`.
    pub(crate) fn poll(&mut self) -> std::result::Result<u64, String> {
        each!(mut self, q => q.poll())
    }
}

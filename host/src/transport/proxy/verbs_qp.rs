//! A proxy thread's verbs QP: work requests gathered per pass and handed to `ibv_post_send` as one
//! chain whose last request is signalled; `ibv_poll_cq` tells how far the QP has completed (a
//! signalled completion covers every request before it, as on any RC QP).

use crate::nic::verbs::ffi::{
    IbvSendWr, IbvSge, IbvWc, IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_WC_SUCCESS, IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
};
use crate::nic::verbs::VerbsQp;
use crate::nic::NicQp;
use ibgda_device::ibgda::wqe::AtomicOp;
use std::sync::Arc;

/// One queued request: the work request, its one scatter entry and, for an inline write, the bytes
/// it carries (the entry points at them when the chain is posted).
struct Request {
    wr: IbvSendWr,
    sge: IbvSge,
    inline: [u8; 8],
}

/// A single-producer poster on a verbs RC QP.
pub(crate) struct VerbsPoster {
    qp: Arc<dyn NicQp>,
    peer: u32,
    depth: u64,
    prod: u64,
    rung: u64,
    pub(crate) cons: u64,
    queued: Vec<Request>,
    wc: Vec<IbvWc>,
    pub(crate) doorbells: u64,
    pub(crate) wqes: u64,
}

// SAFETY: the raw pointers inside queued requests are set and used only within `ring`, on the
// owning proxy thread; between calls the vector holds plain values.
unsafe impl Send for VerbsPoster {}

impl VerbsPoster {
    /// A poster on `qp`, which must be a [`VerbsQp`], to `peer`.
    pub(crate) fn new(qp: Arc<dyn NicQp>, peer: u32) -> Option<VerbsPoster> {
        let depth = qp.as_any().downcast_ref::<VerbsQp>()?.depth() as u64;
        Some(VerbsPoster {
            qp,
            peer,
            depth,
            prod: 0,
            rung: 0,
            cons: 0,
            queued: Vec::new(),
            wc: vec![IbvWc::default(); 16],
            doorbells: 0,
            wqes: 0,
        })
    }

    fn verbs(&self) -> &VerbsQp {
        self.qp.as_any().downcast_ref().expect("checked in new")
    }

    pub(crate) fn fits(&self, requests: u64) -> bool {
        self.prod - self.cons + requests <= self.depth
    }

    pub(crate) fn prod(&self) -> u64 {
        self.prod
    }

    pub(crate) fn rung(&self) -> u64 {
        self.rung
    }

    pub(crate) fn busy(&self) -> bool {
        self.cons < self.rung
    }

    fn push(&mut self, mut wr: IbvSendWr, sge: IbvSge, inline: [u8; 8]) {
        self.prod += 1;
        self.wqes += 1;
        wr.wr_id = self.prod;
        self.queued.push(Request { wr, sge, inline });
    }

    /// Queues an RDMA WRITE (`read == false`) or READ of `len` bytes.
    pub(crate) fn rdma(&mut self, read: bool, laddr: u64, lkey: u32, raddr: u64, rkey: u32, len: u32) {
        let op = if read { IBV_WR_RDMA_READ } else { IBV_WR_RDMA_WRITE };
        let sge = IbvSge {
            addr: laddr,
            length: len,
            lkey,
        };
        self.push(IbvSendWr::rdma(op, std::ptr::null_mut(), raddr, rkey, 0), sge, [0; 8]);
    }

    /// Queues an inline RDMA WRITE of `data` (at most 8 bytes).
    pub(crate) fn inline_write(&mut self, raddr: u64, rkey: u32, data: &[u8]) {
        let mut inline = [0u8; 8];
        inline[..data.len()].copy_from_slice(data);
        let sge = IbvSge {
            addr: 0,
            length: data.len() as u32,
            lkey: 0,
        };
        self.push(
            IbvSendWr::rdma(IBV_WR_RDMA_WRITE, std::ptr::null_mut(), raddr, rkey, IBV_SEND_INLINE),
            sge,
            inline,
        );
    }

    /// Queues an atomic whose previous value lands at `laddr`. Standard verbs have two atomics,
    /// 8-byte fetch-and-add and compare-and-swap; the rest (4-byte operands, swap, and, or, xor)
    /// need an mlx5 NIC's masked atomics, and are refused with a message saying so.
    pub(crate) fn atomic(&mut self, op: AtomicOp, laddr: u64, lkey: u32, raddr: u64, rkey: u32) -> Result<(), String> {
        if !self.verbs().atomics() {
            return Err(format!(
                "the verbs proxy to PE {} cannot perform {op:?}: {} reports no atomics (atomic_cap IBV_ATOMIC_NONE)",
                self.peer,
                self.verbs().device_name()
            ));
        }
        let (code, compare_add, swap) = match op {
            AtomicOp::FetchAdd64 { add } | AtomicOp::MaskedFetchAdd64 { add, boundary: 0 } => {
                (IBV_WR_ATOMIC_FETCH_AND_ADD, add, 0)
            }
            AtomicOp::CompareSwap64 { compare, swap } => (IBV_WR_ATOMIC_CMP_AND_SWP, compare, swap),
            other => {
                return Err(format!(
                    "the verbs proxy to PE {} cannot perform {other:?}: standard verbs atomics are 8-byte fetch-and-add and compare-and-swap only (4-byte, swap, and, or and xor need an mlx5 NIC: IBGDA_NIC=mlx5 or the emulated device)",
                    self.peer
                ))
            }
        };
        let sge = IbvSge {
            addr: laddr,
            length: 8,
            lkey,
        };
        self.push(
            IbvSendWr::atomic(code, std::ptr::null_mut(), raddr, rkey, compare_add, swap, 0),
            sge,
            [0; 8],
        );
        Ok(())
    }

    /// Posts everything queued as one chain, the last request signalled. Every request's `wr_id`
    /// is the count of requests up to and including it, so a completion (the signalled last one,
    /// or any that failed) says exactly how far the QP has got.
    pub(crate) fn ring(&mut self) -> Result<(), String> {
        let n = self.queued.len();
        if n == 0 {
            return Ok(());
        }
        // The chain is linked through raw pointers only, made from one base pointer, so that no
        // later borrow of the vector invalidates the links the provider follows.
        let base: *mut Request = self.queued.as_mut_ptr();
        // SAFETY: every `base.add(i)` with `i < n` is an element of the vector, which is neither
        // resized nor borrowed again until the post below returns; the writes go through raw
        // field pointers.
        unsafe {
            for i in 0..n {
                let r = base.add(i);
                let sge = &raw mut (*r).sge;
                if (*r).wr.send_flags & IBV_SEND_INLINE != 0 {
                    (*sge).addr = (&raw const (*r).inline) as u64;
                }
                (*r).wr.sg_list = sge;
                (*r).wr.next = if i + 1 < n {
                    &raw mut (*base.add(i + 1)).wr
                } else {
                    std::ptr::null_mut()
                };
            }
            (*base.add(n - 1)).wr.send_flags |= IBV_SEND_SIGNALED;
        }
        // SAFETY: a well-formed chain of `n` requests (linked above); their scatter entries and
        // inline bytes live in the vector until the call returns (verbs reads them during the
        // call), and the data they name is registered memory the proxy keeps alive until the
        // requests complete.
        let posted = unsafe { self.verbs().post(&raw mut (*base).wr) };
        self.queued.clear();
        posted.map_err(|e| format!("{e} ({n} requests in the chain)"))?;
        self.rung = self.prod;
        self.doorbells += 1;
        Ok(())
    }

    /// Reads completions and advances `cons`; an error completion is returned as a description
    /// naming the QP, the peer and the status.
    pub(crate) fn poll(&mut self) -> Result<u64, String> {
        let mut wc = std::mem::take(&mut self.wc);
        let got = self.verbs().poll(&mut wc);
        let result = got.and_then(|n| {
            for w in &wc[..n] {
                if w.status != IBV_WC_SUCCESS {
                    return Err(format!(
                        "error completion on verbs QP {:#x} of {} to PE {}: status {} (vendor error {:#x}) for request {} of the QP",
                        self.qp.qpn(),
                        self.verbs().device_name(),
                        self.peer,
                        w.status,
                        w.vendor_err,
                        w.wr_id
                    ));
                }
                self.cons = self.cons.max(w.wr_id);
            }
            Ok(self.cons)
        });
        self.wc = wc;
        result
    }
}

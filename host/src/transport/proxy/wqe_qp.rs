//! A proxy thread's mlx5 QP (the emulated device's or a ConnectX's, its queues in host memory):
//! one producer (the thread), so no reservation atomics, no ready chain and no doorbell lock: WQEs
//! go straight into the send queue, the last one of a batch is made to ask for a CQE, and one DBR
//! write and one doorbell cover the batch.

use crate::error::{Error, Result};
use crate::nic::NicQp;
use ibgda_abi::mlx5::{
    self, fm_ce_se, opcode, wqe_ds, Completion, CqeTail, CQE_SYNDROME_OFFSET, CQE_TAIL_OFFSET, SND_DBR_OFFSET,
    UAR_DOORBELL_OFFSET,
};
use ibgda_device::ibgda::post::completed_index;
use ibgda_device::ibgda::wqe::{self, AtomicOp, SendQueue};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Byte of the ctrl segment that holds `fm_ce_se`.
const CTRL_FM_CE_SE_BYTE: u64 = 11;

/// A single-producer poster on one RC QP whose queues are in host memory.
pub(crate) struct WqeQp {
    // Keeps the queue memory alive.
    _qp: Arc<dyn NicQp>,
    pub(crate) peer: u32,
    sq: SendQueue,
    depth: u64,
    qpn: u32,
    dbr: *const AtomicU32,
    doorbell: *const AtomicU64,
    cqe: *const u8,
    /// Next WQEBB to write.
    prod: u64,
    /// Producer index last rung.
    rung: u64,
    /// Every WQEBB below this has completed.
    pub(crate) cons: u64,
    /// First WQEBB and size of the newest WQE, while it does not ask for a CQE yet.
    unsignalled: Option<(u64, u32)>,
    rkey: u32,
    pub(crate) doorbells: u64,
    pub(crate) wqes: u64,
}

// SAFETY: the raw pointers name host memory kept alive by `qp`; only the owning proxy thread uses
// the poster, and the NIC-shared words are accessed atomically.
unsafe impl Send for WqeQp {}

impl WqeQp {
    /// A poster on `qp` (whose SQ, DBR, UAR page and CQ must be host-accessible) to `peer`.
    pub(crate) fn new(qp: Arc<dyn NicQp>, peer: u32, rkey: u32) -> Result<WqeQp> {
        let queues = qp.queues();
        let missing = |what| Error::Config {
            name: "IBGDA_TRANSPORT",
            value: "proxy".into(),
            why: format!(
                "the proxy's QP {:#x} to PE {peer} has its {what} outside host memory",
                queues.qpn
            ),
        };
        let host = queues.host.ok_or_else(|| missing("doorbell record and UAR page"))?;
        let sq = host.sq.ok_or_else(|| missing("send queue"))?;
        let cqe = host.cqe.ok_or_else(|| missing("CQ"))?;
        let (dbr, uar) = (host.dbr, host.uar);
        let depth = 1u64 << queues.log_depth;
        // SAFETY: offsets inside the 8-byte DBR and the 4 KiB UAR page, aligned for their width.
        let (dbr, doorbell) = unsafe {
            (
                dbr.add(SND_DBR_OFFSET) as *const AtomicU32,
                uar.add(UAR_DOORBELL_OFFSET) as *const AtomicU64,
            )
        };
        Ok(WqeQp {
            peer,
            sq: SendQueue {
                base: sq as u64,
                mask: depth - 1,
            },
            depth,
            qpn: queues.qpn,
            dbr,
            doorbell,
            cqe,
            prod: 0,
            rung: 0,
            cons: 0,
            unsignalled: None,
            rkey,
            doorbells: 0,
            wqes: 0,
            _qp: qp,
        })
    }

    /// Whether `wqebbs` more fit, keeping one WQEBB for the NOP a batch may need at its end.
    pub(crate) fn fits(&self, wqebbs: u64) -> bool {
        self.prod - self.cons + wqebbs < self.depth
    }

    /// The WQEBB index past everything written.
    pub(crate) fn prod(&self) -> u64 {
        self.prod
    }

    /// The producer index last rung.
    pub(crate) fn rung(&self) -> u64 {
        self.rung
    }

    /// Whether anything rung has not completed.
    pub(crate) fn busy(&self) -> bool {
        self.cons < self.rung
    }

    fn push(&mut self, wqebbs: u32, build: impl FnOnce(&SendQueue, u64)) {
        debug_assert!(self.fits(wqebbs as u64));
        let i = self.prod;
        build(&self.sq, i);
        self.unsignalled = Some((i, wqebbs));
        self.prod += wqebbs as u64;
        self.wqes += 1;
    }

    /// Queues an RDMA WRITE (`read == false`) or READ of `len` bytes.
    pub(crate) fn rdma(&mut self, read: bool, laddr: u64, lkey: u32, raddr: u64, len: u32) {
        let code = if read { opcode::RDMA_READ } else { opcode::RDMA_WRITE };
        let (qpn, rkey) = (self.qpn, self.rkey);
        self.push(1, |sq, i| {
            // SAFETY: `[i, i+1)` is free (checked by the caller with `fits`) and only this thread
            // writes the queue.
            unsafe {
                sq.write(i, 0, wqe::ctrl(i as u16, code, 0, qpn, 0, wqe_ds::RDMA, 0));
                sq.write(i, 1, wqe::raddr(raddr, rkey));
                sq.write(i, 2, wqe::data(len, lkey, laddr));
            }
        });
    }

    /// WQEBBs of an inline WRITE of `len` bytes.
    pub(crate) fn inline_slots(len: usize) -> u64 {
        wqe_ds::wqebbs(wqe_ds::inline_write(len as u32)) as u64
    }

    /// Queues an inline RDMA WRITE of `data`.
    pub(crate) fn inline_write(&mut self, raddr: u64, data: &[u8]) {
        let ds = wqe_ds::inline_write(data.len() as u32);
        let (qpn, rkey) = (self.qpn, self.rkey);
        self.push(wqe_ds::wqebbs(ds), |sq, i| {
            // SAFETY: as in `rdma`.
            unsafe {
                sq.write(i, 0, wqe::ctrl(i as u16, opcode::RDMA_WRITE, 0, qpn, 0, ds, 0));
                sq.write(i, 1, wqe::raddr(raddr, rkey));
                for c in 0..(ds as u32 - 2) {
                    sq.write(i, 2 + c, wqe::inline_chunk(data, c as usize));
                }
            }
        });
    }

    /// WQEBBs of `op`.
    pub(crate) fn atomic_slots(op: &AtomicOp) -> u64 {
        wqe_ds::wqebbs(op.encoding().2) as u64
    }

    /// Queues an atomic on `raddr` whose previous value lands at `laddr` (key `lkey`).
    pub(crate) fn atomic(&mut self, op: AtomicOp, laddr: u64, lkey: u32, raddr: u64) {
        let (qpn, rkey) = (self.qpn, self.rkey);
        self.push(wqe_ds::wqebbs(op.encoding().2), |sq, i| {
            // SAFETY: as in `rdma`.
            unsafe { sq.write_atomic(i, &op, qpn, 0, raddr, rkey, laddr, lkey) }
        });
    }

    /// Makes the newest WQE ask for a CQE (a CQE names a WQE's first WQEBB, so a WQE of several
    /// WQEBBs gets a signalled NOP after it), then writes the DBR and rings once for everything
    /// queued since the last ring.
    pub(crate) fn ring(&mut self) {
        if self.prod == self.rung {
            return;
        }
        match self.unsignalled.take() {
            Some((i, 1)) => {
                let byte = (self.sq.segment(i, 0) as u64 + CTRL_FM_CE_SE_BYTE) as *mut u8;
                // SAFETY: the ctrl segment of our newest WQE, not yet rung (the NIC does not read
                // it before the doorbell below).
                unsafe { byte.write_volatile(byte.read_volatile() | fm_ce_se::CQ_UPDATE) };
            }
            Some(_) => {
                let i = self.prod;
                let qpn = self.qpn;
                // SAFETY: `fits` kept one WQEBB free for this NOP.
                unsafe {
                    self.sq.write(
                        i,
                        0,
                        wqe::ctrl(i as u16, opcode::NOP, 0, qpn, fm_ce_se::CQ_UPDATE, wqe_ds::NOP, 0),
                    )
                };
                self.prod += 1;
            }
            None => {}
        }
        let pi = self.prod as u16;
        // The WQEs (plain stores) before the DBR, the DBR before the doorbell, and the doorbell
        // pushed out at once (a BlueFlame UAR is write-combining), as rdma-core does.
        fence(Ordering::Release);
        crate::nic::mmio::before_device_store();
        // SAFETY: live memory (see `new`): the DBR in memory, the doorbell in the UAR page; each
        // an aligned word written with one store.
        unsafe {
            (*self.dbr).store(mlx5::dbr_word(pi), Ordering::Release);
            crate::nic::mmio::before_device_store();
            (*self.doorbell).store(mlx5::doorbell_word(pi, self.qpn), Ordering::Release);
        }
        crate::nic::mmio::flush_device_stores();
        self.rung = self.prod;
        self.doorbells += 1;
    }

    /// Reads the collapsed CQ and advances `cons`; an error CQE is returned as a description naming
    /// the QP, the peer, the WQE index, the opcode and the syndrome.
    pub(crate) fn poll(&mut self) -> std::result::Result<u64, String> {
        // SAFETY: the CQE's last 8 bytes, published by the NIC with one store.
        let raw = unsafe { (*(self.cqe.add(CQE_TAIL_OFFSET) as *const AtomicU64)).load(Ordering::Acquire) };
        let tail = CqeTail::from_raw(raw);
        match tail.completion() {
            Completion::None => {}
            Completion::Done { wqe_counter } => {
                self.cons = self.cons.max(completed_index(self.rung, wqe_counter));
            }
            Completion::Error {
                wqe_counter,
                wqe_opcode,
            } => {
                // SAFETY: inside the live CQE.
                let syndrome = unsafe { self.cqe.add(CQE_SYNDROME_OFFSET).read_volatile() };
                return Err(format!(
                    "error completion on QP {:#x} to PE {}: syndrome {syndrome:#04x} {} for WQE index {wqe_counter} (opcode {wqe_opcode:#04x})",
                    self.qpn,
                    self.peer,
                    mlx5::syndrome::name(syndrome),
                ));
            }
            Completion::Unexpected { opcode } => {
                return Err(format!(
                    "unexpected CQE opcode {opcode:#x} on QP {:#x} to PE {}",
                    self.qpn, self.peer
                ));
            }
        }
        Ok(self.cons)
    }
}

//! The posting protocol's view of a [`Qp`] ([`Sq`]): the counters, DBR and doorbell at the
//! queue's scope, CQ polling with error CQEs reported, and the device waiter that bounds every
//! wait of the protocol.

use super::post::{self, PostQueue, Waiter, Waiting};
use super::Qp;
use crate::arch;
use crate::deadline::Spin;
use crate::fail::{report, Failure};
use ibgda_abi::mlx5::{self, Completion, CqeTail, CQE_SYNDROME_OFFSET, CQE_TAIL_OFFSET, SND_DBR_OFFSET};
use ibgda_abi::{ErrorKind, WaitKind};

/// Reports an error CQE. Scalars only: a reference to the handle would force it into local memory.
#[cold]
#[inline(never)]
fn completion_error(cq: u64, raw_tail: u64, peer: u32, qpn: u32, error: u64, my_pe: u32, op: u32) -> ! {
    let tail = CqeTail::from_raw(raw_tail);
    // SAFETY: the CQE is live; the syndrome byte is stable once the error CQE is visible.
    let syndrome = unsafe { core::ptr::read_volatile((cq + CQE_SYNDROME_OFFSET as u64) as *const u8) };
    let mut f = Failure::new(ErrorKind::CompletionError);
    f.peer = peer;
    f.qp = qpn;
    f.address = cq;
    (f.detail, f.observed) = match tail.completion() {
        Completion::Error { wqe_opcode, .. } => (syndrome as u32, wqe_opcode as u64),
        _ => (0x100 | tail.opcode() as u32, (tail.sop_drop_qpn >> 24) as u64),
    };
    f.expected = tail.wqe_counter as u64;
    f.op = op;
    report(error, my_pe, f)
}

/// The posting protocol's view of a [`Qp`]: crate-private, so that safe code outside the crate
/// cannot drive the raw steps (reserve, mark ready, ring) out of order.
///
/// Scope: with the GPU's own doorbell, the send queue, its counters, the DBR and the doorbell
/// register are in this GPU's memory (or a UAR page mapped into it), written by this GPU's threads
/// and read by the NIC after the doorbell; every read-modify-write and fence of the protocol is
/// then at GPU scope, as NVSHMEM's GPU-memory queues are (`st.release.gpu` for DBR and doorbell,
/// `__threadfence()` before them). System scope costs a round trip beyond the GPU on every one of
/// the ~9 ordered steps of a post. The CPU-assisted doorbell keeps system scope: a CPU thread reads
/// what the GPU publishes.
#[derive(Clone, Copy)]
pub(crate) struct Sq<'a> {
    qp: &'a Qp,
    /// The DBR's and the doorbell register's addresses, loaded when the view is made.
    dbr: u64,
    doorbell: u64,
}

impl<'a> Sq<'a> {
    /// The posting view of `qp`. The DBR's and the doorbell's addresses are loaded now, through
    /// the read-only path and in flight together with whatever the post does first: loaded when
    /// the ring needed them, they came after the ready mark's acquire (which leaves the L1
    /// without them), two more dependent round trips before the doorbell. Loaded here, not in the
    /// handle, so a kernel that keeps a handle across its loop does not hold them in registers.
    #[inline(always)]
    pub(crate) fn new(qp: &'a Qp) -> Sq<'a> {
        const {
            assert!(
                core::mem::offset_of!(ibgda_abi::ibgda::QpDescriptor, dbr) == 24
                    && core::mem::offset_of!(ibgda_abi::ibgda::QpDescriptor, doorbell) == 32
            )
        };
        let w = qp.desc_ptr() as *const [u64; 2];
        // SAFETY: the descriptor is live, 64-byte aligned and not written while kernels run
        // (the handle's constructor contract).
        let (a, b) = unsafe {
            (
                arch::load_readonly_v2_u64(w.add(1)),
                arch::load_readonly_v2_u64(w.add(2)),
            )
        };
        Sq {
            qp,
            dbr: a[1],
            doorbell: b[0],
        }
    }
}

/// The address of a field of the queue's counters.
macro_rules! counter {
    ($sq:expr, $f:ident) => {
        // SAFETY: the counters are live for the handle's lifetime (constructor contract); this
        // only computes a field's address.
        unsafe { core::ptr::addr_of_mut!((*$sq.qp.ctr()).$f) }
    };
}

/// One protocol step at the queue's scope: the GPU-scope wrapper or the system-scope one.
macro_rules! scoped {
    ($sq:expr, $gpu:ident, $sys:ident ( $($arg:expr),* )) => {
        if $sq.qp.gpu_scope {
            arch::$gpu($($arg),*)
        } else {
            arch::$sys($($arg),*)
        }
    };
}

impl Sq<'_> {
    /// `*p.compare_exchange(from, to)` with acquire and release at the queue's scope;
    /// `Err(current)` on failure.
    #[inline(always)]
    fn cas(&self, p: *mut u64, from: u64, to: u64) -> Result<(), u64> {
        // SAFETY: `p` is one of the queue's counters, live for the handle's lifetime (constructor
        // contract); every access to them is atomic.
        let seen = unsafe {
            scoped!(
                self,
                atomic_cas_acq_rel_gpu_u64,
                atomic_cas_acq_rel_sys_u64(p, from, to)
            )
        };
        if seen == from {
            Ok(())
        } else {
            Err(seen)
        }
    }
}

impl PostQueue for Sq<'_> {
    #[inline(always)]
    fn depth(&self) -> u64 {
        self.qp.sq.mask + 1
    }
    #[inline(always)]
    fn reserve(&self, n: u64) -> u64 {
        let p = counter!(self, resv_head);
        // SAFETY: counters live (constructor contract); every access to them is atomic.
        unsafe { scoped!(self, atomic_add_relaxed_gpu_u64, atomic_add_relaxed_sys_u64(p, n)) }
    }
    #[inline(always)]
    fn resv_head(&self) -> u64 {
        // SAFETY: as above.
        unsafe { arch::load_relaxed_sys_u64(core::ptr::addr_of!((*self.qp.ctr()).resv_head)) }
    }
    #[inline(always)]
    fn ready_head(&self) -> u64 {
        let p = counter!(self, ready_head);
        // SAFETY: as above.
        unsafe { scoped!(self, load_acquire_gpu_u64, load_acquire_sys_u64(p)) }
    }
    #[inline(always)]
    fn cons_idx(&self) -> u64 {
        let p = counter!(self, cons_idx);
        // SAFETY: as above.
        unsafe { scoped!(self, load_acquire_gpu_u64, load_acquire_sys_u64(p)) }
    }
    #[inline(always)]
    fn advance_ready(&self, from: u64, to: u64) -> Result<(), u64> {
        // The WQE was written with plain (weak) stores; the acq_rel CAS releases them to whoever
        // acquires `ready_head` (the ringer), at the queue's scope (the NIC reads them only after
        // the ringer's doorbell, which releases them again at that scope).
        self.cas(counter!(self, ready_head), from, to)
    }
    #[inline(always)]
    fn ring_state(&self) -> u64 {
        let p = counter!(self, ring_state);
        // SAFETY: as above.
        unsafe { scoped!(self, load_acquire_gpu_u64, load_acquire_sys_u64(p)) }
    }
    #[inline(always)]
    fn swap_ring_state(&self, from: u64, to: u64) -> Result<(), u64> {
        self.cas(counter!(self, ring_state), from, to)
    }
    #[inline(always)]
    fn write_dbr(&self, pi: u16) {
        if self.qp.cpu_doorbell {
            // CPU-assisted: the doorbell thread writes the DBR when it rings.
            return;
        }
        let dbr = (self.dbr + SND_DBR_OFFSET as u64) as *mut u32;
        // SAFETY: the DBR is live; the NIC reads it, so the store is atomic and releases the WQEs.
        unsafe {
            scoped!(
                self,
                store_release_gpu_u32,
                store_release_sys_u32(dbr, mlx5::dbr_word(pi))
            )
        }
    }
    #[inline(always)]
    fn ring_doorbell(&self, prod: u64) {
        if self.qp.cpu_doorbell {
            // CPU-assisted: publish the 64-bit producer index (only the ringer stores it, so
            // successive stores only grow) to the host-mapped slot; a CPU thread writes DBR and
            // doorbell. A store, not an atomic: GPU atomics on host memory are not atomic over
            // PCIe without native host atomics.
            // SAFETY: the slot is live; system-scope release so the CPU that reads the slot sees
            // the WQEs.
            unsafe { arch::store_release_sys_u64(self.doorbell as *mut u64, prod) };
            return;
        }
        let bell = self.doorbell as *mut u64;
        let word = mlx5::doorbell_word(prod as u16, self.qp.qpn);
        // A release store orders every earlier access of this thread (the DBR store among them)
        // before it: no separate fence (it cost a second one).
        // SAFETY: the doorbell register is live, 8-byte aligned; one 8-byte store as rdma-core does.
        unsafe { scoped!(self, store_release_gpu_u64, store_release_sys_u64(bell, word)) }
    }
    #[inline(always)]
    fn poll_completions(&self) -> u64 {
        let cq = self.qp.desc().cq;
        // SAFETY: the CQE is live; its last 8 bytes are published by the NIC with one store.
        let tail =
            CqeTail::from_raw(unsafe { arch::load_acquire_sys_u64((cq + CQE_TAIL_OFFSET as u64) as *const u64) });
        match tail.completion() {
            Completion::None => 0,
            Completion::Done { wqe_counter } => {
                // Rung before the NIC read it, so published before this CQE was written: the
                // ring state read after the CQE covers the completed WQE.
                let prod = self.ring_state() >> 1;
                let done = post::completed_index(prod, wqe_counter);
                let p = counter!(self, cons_idx);
                // Fire and forget: this poller goes on with `done`, others read `cons_idx`.
                // SAFETY: counters live.
                unsafe { scoped!(self, red_max_release_gpu_u64, red_max_release_sys_u64(p, done)) };
                done
            }
            Completion::Error { .. } | Completion::Unexpected { .. } => completion_error(
                cq,
                tail.to_raw(),
                self.qp.peer,
                self.qp.qpn,
                self.qp.rep.error,
                self.qp.rep.my_pe,
                self.qp.rep.op,
            ),
        }
    }
}

/// The device [`Waiter`]: bounded by the PE's timeout, measured with `%globaltimer`; past it, a
/// `Timeout` record naming the PE, peer, QP, counter, expected and observed index, and a trap.
pub(super) struct Deadline {
    qp: Qp,
    spin: Spin,
}

impl Deadline {
    /// The waiter of `qp`'s waits, bounded by its PE's timeout.
    #[inline(always)]
    pub(super) fn of(qp: &Qp) -> Deadline {
        Deadline {
            qp: *qp,
            spin: Spin::new(qp.rep.timeout_ns).checking_every(64, 64),
        }
    }

    #[inline(always)]
    fn tick(&mut self, kind: WaitKind, expected: u64, observed: u64) {
        if let Some(elapsed) = self.spin.tick() {
            let q = &self.qp;
            expired(
                kind as u32,
                expected,
                observed,
                elapsed,
                q.peer,
                q.qpn,
                q.desc().cq,
                q.rep.error,
                q.rep.my_pe,
                q.rep.op,
            );
        }
    }

    #[inline(always)]
    pub(super) fn landing(&mut self, expected: u64, observed: u64) {
        self.tick(WaitKind::LandingSlot, expected, observed)
    }
}

impl Waiter for Deadline {
    #[inline(always)]
    fn spin(&mut self, what: Waiting, expected: u64, observed: u64) {
        let kind = match what {
            Waiting::SendQueueSlot => WaitKind::SendQueueSlot,
            Waiting::ReadyChain => WaitKind::ReadyChain,
            Waiting::Completion => WaitKind::Quiet,
        };
        self.tick(kind, expected, observed)
    }
}

/// Reports an expired wait (scalars only, like [`completion_error`]).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn expired(
    kind: u32,
    expected: u64,
    observed: u64,
    elapsed: u64,
    peer: u32,
    qpn: u32,
    cq: u64,
    error: u64,
    my_pe: u32,
    op: u32,
) -> ! {
    let mut f = Failure::new(ErrorKind::Timeout);
    f.peer = peer;
    f.qp = qpn;
    f.detail = kind;
    f.address = cq;
    f.expected = expected;
    f.observed = observed;
    f.elapsed_ns = elapsed;
    f.op = op;
    report(error, my_pe, f)
}

//! Ordering and synchronisation: `quiet`, `fence`, `barrier_all`, `sync_all`, and the barrier
//! every team's shares.

use super::teams::Members;
use super::{Route, Shmem};
use crate::arch;
use crate::deadline::Spin;
use crate::fail::Failure;
use crate::ibgda::AtomicOp;
use ibgda_abi::proxy::amo;
use ibgda_abi::Op;
use ibgda_abi::{ErrorKind, TransportKind, WaitKind};

impl Shmem {
    // ---------------------------------------------------------------- ordering

    /// Completes every put, atomic and signal this thread issued: afterwards they are visible to
    /// every PE. P2P: a system-scope fence. IBGDA: rings and waits for completion on this block's QP
    /// to every IBGDA peer (cost grows with the number of such peers, as in NVSHMEM). Proxy: waits
    /// until the proxy has completed everything queued on this block's channel.
    #[inline(always)]
    pub fn quiet(&self) {
        let sh = &self.at(Op::Quiet);
        arch::fence_sc_sys();
        sh.proxy_quiet();
        if !sh.qps.is_null() {
            for pe in 0..sh.n_pes {
                // SAFETY: `peers` has `n_pes` entries (host contract).
                if unsafe { (*sh.peers.add(pe as usize)).transport } == TransportKind::Ibgda as u32 {
                    sh.qp(pe).quiet();
                }
            }
        }
    }

    /// [`Shmem::quiet`] over every queue of this PE, whichever block or [`Shmem::keyed`] handle
    /// issued to it: afterwards everything issued on any QP or proxy channel before the call
    /// (and known to this block: a barrier, or release and acquire) is visible to every PE. Called
    /// by every thread of the block; the threads share the queues between them and leave together.
    #[inline(always)]
    pub fn quiet_all_block(&self) {
        let sh = &self.at(Op::Quiet);
        arch::sync_threads();
        let (tid, nt) = (arch::thread_rank_in_block(), arch::block_size());
        // At least one key (`queue_keys` is never 0), so thread 0's quiet also orders the block's
        // P2P stores when the PE has no queues.
        let mut key = tid;
        while key < sh.queue_keys() {
            sh.keyed(key).quiet();
            key += nt;
        }
        arch::sync_threads();
    }

    /// Orders this thread's puts, atomics and signals to each PE: those issued before are delivered
    /// before those issued after. With IBGDA peers this is a [`Shmem::quiet`] (the quiet also
    /// orders them against P2P stores). With proxy peers it waits for this block's channel: its
    /// descriptors go to one QP per peer, but a NIC (the emulated one batches them) may place the
    /// data of consecutive RDMA WRITEs in any order until a fence, and the proxy is not told where
    /// the fences are.
    #[inline(always)]
    pub fn fence(&self) {
        let sh = &self.at(Op::Fence);
        if sh.qps.is_null() {
            arch::fence_acq_rel_sys();
            sh.proxy_quiet();
        } else {
            sh.quiet();
        }
    }

    /// A barrier across all PEs, called by exactly one thread per PE; completes this thread's
    /// outstanding operations first (as `quiet`). In a kernel of several threads use
    /// [`Shmem::barrier_all_block`] from one block, after that block has synchronised with the rest.
    #[inline(always)]
    pub fn barrier_all(&self) {
        let sh = &self.at(Op::BarrierAll);
        sh.barrier_members(&sh.world(), true);
    }

    /// [`Shmem::barrier_all`] for a whole block: every thread of the block calls it; thread 0 takes
    /// part in the cross-PE barrier, and the block leaves together.
    #[inline(always)]
    pub fn barrier_all_block(&self) {
        let sh = &self.at(Op::BarrierAllBlock);
        sh.barrier_members_block(&sh.world(), true);
    }

    /// Waits until every PE has called it (NVSHMEM's `sync_all`): [`Shmem::barrier_all`] without
    /// its `quiet`, so it orders the PEs' progress, not the data their earlier puts carry (those
    /// need a `quiet` of their own before it, or `barrier_all`). One thread per PE calls it.
    #[inline(always)]
    pub fn sync_all(&self) {
        let sh = &self.at(Op::SyncAll);
        sh.barrier_members(&sh.world(), false);
    }

    /// [`Shmem::sync_all`] for a whole block: every thread of one block per PE calls it.
    #[inline(always)]
    pub fn sync_all_block(&self) {
        let sh = &self.at(Op::SyncAllBlock);
        sh.barrier_members_block(&sh.world(), false);
    }

    /// The barrier of `m` (the world or a team), by one thread of each member: with `quiet`, this
    /// thread's operations complete first. Each member adds 1 to every member's arrivals word and
    /// waits until its own has counted every member for each barrier it entered.
    #[inline(always)]
    pub(crate) fn barrier_members(&self, m: &Members, quiet: bool) {
        if quiet {
            self.quiet();
        } else {
            // This thread's earlier stores before its arrival, as a barrier's users expect of
            // shared memory (the release atomic orders the P2P ones; the NIC and proxy are not
            // covered: that is the `quiet` a sync leaves out).
            arch::fence_acq_rel_sys();
        }
        // SAFETY: `m`'s words are in this PE's heap header (`Shmem::world`, `Shmem::members_of`);
        // only this PE's barrier thread of the team touches its epoch.
        let epoch = unsafe {
            let next = arch::load_relaxed_sys_u64(m.epoch) + 1;
            arch::store_relaxed_sys_u64(m.epoch, next);
            next
        };
        for j in 0..m.n {
            let pe = m.pe(j);
            match self.route(m.arrivals as u64, 8, pe) {
                // SAFETY: the peer's heap header, in its heap (checked).
                Route::Direct(t) => unsafe {
                    arch::atomic_add_release_sys_u64(t as *mut u64, 1);
                },
                // SAFETY: the result lands in the QP's dummy landing slot, which no thread reads.
                Route::Nic(qp, r) => unsafe {
                    qp.post_atomic(
                        AtomicOp::add(8, 1),
                        qp.dummy_landing(r),
                        qp.landing_lkey(),
                        r,
                        qp.heap_rkey(),
                        true,
                    );
                },
                Route::Proxy(ch, off) => {
                    self.proxy_atomic(&ch, pe, off, amo::ADD, 8, 1, 0, false);
                }
            }
        }
        let need = epoch * m.n as u64;
        // A clock read and a back-off at every poll: a barrier waits for other PEs' kernels.
        let mut deadline = Spin::new(self.timeout_ns).checking_every(1, 64);
        loop {
            // SAFETY: our own heap header.
            let seen = unsafe { arch::load_acquire_sys_u64(m.arrivals) };
            if seen >= need {
                return;
            }
            if let Some(elapsed) = deadline.tick() {
                let mut f = Failure::new(ErrorKind::Timeout);
                f.detail = WaitKind::Barrier as u32;
                f.address = m.arrivals as u64;
                f.expected = need;
                f.observed = seen;
                f.elapsed_ns = elapsed;
                f.size = m.team;
                self.fail(f);
            }
        }
    }

    /// [`Shmem::barrier_members`] by a whole block: thread 0 takes part, the block leaves together.
    #[inline(always)]
    pub(crate) fn barrier_members_block(&self, m: &Members, quiet: bool) {
        arch::sync_threads();
        if arch::thread_rank_in_block() == 0 {
            self.barrier_members(m, quiet);
        }
        arch::sync_threads();
    }
}

//! The device half of the IBGDA transport: GPU threads build mlx5 WQEs in the send queue, update
//! the doorbell record, ring the doorbell and poll the collapsed CQ themselves.
//!
//! [`Qp`] is the public QP-handle API (for kernels that manage their own queues, and for tests);
//! [`Shmem`](crate::Shmem) uses it for every peer whose transport is IBGDA. The protocol steps are
//! in [`post`], the segment encoders in [`wqe`].
//!
//! Completion model: every post sets `CQ_UPDATE` on its last WQE (a WQE spanning several WQEBBs is
//! followed by a signalled NOP, because a CQE names only a WQE's first WQEBB). Polling reads the
//! last 8 bytes of the one CQE with an acquire load; an error CQE is never skipped: it is decoded
//! (syndrome, QPN, WQE index, opcode) and reported as a `CompletionError`, then the thread traps.

pub mod post;
mod queue;
pub mod wqe;

use crate::arch;
use crate::fail::{report, Failure};
use ibgda_abi::ibgda::{qp_flags, QpCounters, QpDescriptor, LANDING_SLOT_BYTES};
use ibgda_abi::mlx5::{fm_ce_se, opcode, wqe_ds, MAX_INLINE_BYTES};
use ibgda_abi::ErrorKind;
use post::PostQueue;
use queue::Deadline;
pub(crate) use queue::Sq;
pub use wqe::AtomicOp;
use wqe::SendQueue;

/// Where a failure is reported: the PE's error record and identity.
#[derive(Clone, Copy)]
pub(crate) struct Reporter {
    pub error: u64,
    pub my_pe: u32,
    pub timeout_ns: u64,
    /// The device-API call the operation belongs to ([`ibgda_abi::Op`] as `u32`; 0 for a raw QP).
    pub op: u32,
}

/// The RDMA operations with a local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rdma {
    /// RDMA WRITE: local → remote.
    Write,
    /// RDMA WRITE with immediate data.
    WriteImm(u32),
    /// RDMA READ: remote → local.
    Read,
}

/// When a post rings the doorbell (see [`post::submit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ring {
    /// Now (the poster waits for the WQE, or a caller asked).
    Now,
    /// When this poster is the newest reserver or crosses a doorbell batch.
    Auto,
    /// Only when it crosses a doorbell batch: the same thread posts again at once and rings then.
    Defer,
}

impl Ring {
    #[inline(always)]
    fn from_force(force: bool) -> Ring {
        if force {
            Ring::Now
        } else {
            Ring::Auto
        }
    }
}

/// A handle on one RC QP for posting from device code.
///
/// Every `post_*` reserves WQEBBs, writes the WQE, marks it ready in order and rings the doorbell
/// (batched: see [`post::submit`]); it returns the WQEBB index just past the WQE, which
/// [`Qp::wait`] takes. Buffers are given with their keys: the caller is responsible for lkeys and
/// rkeys (the NIC checks them and answers a wrong one with an error CQE).
#[derive(Clone, Copy)]
pub struct Qp {
    desc: *const QpDescriptor,
    counters: *mut QpCounters,
    sq: SendQueue,
    qpn: u32,
    peer: u32,
    cpu_doorbell: bool,
    /// The posting protocol runs at GPU scope: the queue, its counters, DBR and doorbell are in
    /// this GPU's memory and only this GPU's threads and the NIC read them (see [`Sq`]).
    gpu_scope: bool,
    rep: Reporter,
}

// SAFETY: a handle names queue memory shared by every thread that posts to the QP (that is the
// point of it); every shared word is accessed with system-scope atomics or under the posting
// protocol, so handing a copy to another (CPU stand-in) thread is what GPU threads do anyway.
unsafe impl Send for Qp {}
// SAFETY: as for `Send` above: the handle is plain addresses and scalars, and every shared word is accessed atomically.
unsafe impl Sync for Qp {}

/// The descriptor's fields the handle keeps, loaded through the read-only path (four 16-byte
/// loads in flight at once, where field-by-field loads were dependent round trips before the
/// QPN could be checked and the queue found). The DBR's and the doorbell's addresses are loaded
/// by each post ([`Sq::new`]).
///
/// # Safety
/// `p` is a live descriptor the host wrote before any kernel ran and does not write while one runs
/// (the table's contract), 64-byte aligned.
#[inline(always)]
unsafe fn load_posting_fields(p: *const QpDescriptor) -> PostingFields {
    const {
        assert!(
            core::mem::offset_of!(QpDescriptor, qpn) == 0
                && core::mem::offset_of!(QpDescriptor, log_depth) == 4
                && core::mem::offset_of!(QpDescriptor, peer) == 8
                && core::mem::offset_of!(QpDescriptor, sq) == 16
                && core::mem::offset_of!(QpDescriptor, counters) == 48
                && core::mem::offset_of!(QpDescriptor, flags) == 88
        )
    };
    let w = p as *const [u64; 2];
    // SAFETY: this function's `# Safety` contract: 128 readable bytes, aligned, not written while
    // the kernel runs.
    let [id, queue, ctr, flags] = unsafe {
        [
            arch::load_readonly_v2_u64(w),
            arch::load_readonly_v2_u64(w.add(1)),
            arch::load_readonly_v2_u64(w.add(3)),
            arch::load_readonly_v2_u64(w.add(5)),
        ]
    };
    PostingFields {
        qpn: id[0] as u32,
        log_depth: (id[0] >> 32) as u32,
        peer: id[1] as u32,
        sq: queue[0],
        counters: ctr[0],
        flags: flags[1] as u32,
    }
}

/// See [`load_posting_fields`].
#[derive(Clone, Copy)]
struct PostingFields {
    qpn: u32,
    log_depth: u32,
    peer: u32,
    sq: u64,
    counters: u64,
    flags: u32,
}

impl Qp {
    /// A handle on the QP described by `desc`.
    ///
    /// # Safety
    /// `desc` points at a live descriptor that the host runtime wrote before the kernel started
    /// and does not write while it runs (the handle copies fields of it); if filled, its queue, DBR,
    /// doorbell, CQ and counters live for as long as the handle is used, and a handle of an
    /// unfilled entry (QPN 0) is never used to post. `error` is the PE's error record (or 0).
    #[inline(always)]
    pub unsafe fn from_descriptor(desc: *const QpDescriptor, error: u64, my_pe: u32, timeout_ns: u64) -> Qp {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe {
            let d = load_posting_fields(desc);
            Qp {
                desc,
                counters: d.counters as *mut QpCounters,
                sq: SendQueue {
                    base: d.sq,
                    mask: (1u64 << d.log_depth) - 1,
                },
                qpn: d.qpn,
                peer: d.peer,
                cpu_doorbell: d.flags & qp_flags::CPU_DOORBELL != 0,
                gpu_scope: d.flags & (qp_flags::CPU_DOORBELL | qp_flags::PROXY) == 0,
                rep: Reporter {
                    error,
                    my_pe,
                    timeout_ns,
                    op: 0,
                },
            }
        }
    }

    #[inline(always)]
    pub(crate) unsafe fn with_reporter(desc: *const QpDescriptor, rep: Reporter) -> Qp {
        // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
        unsafe { Self::from_descriptor(desc, rep.error, rep.my_pe, rep.timeout_ns) }
    }

    /// The descriptor's address (the posting view loads from it).
    #[inline(always)]
    pub(crate) fn desc_ptr(&self) -> *const QpDescriptor {
        self.desc
    }

    #[inline(always)]
    pub(crate) fn desc(&self) -> &QpDescriptor {
        // SAFETY: live for the handle's lifetime (constructor contract).
        unsafe { &*self.desc }
    }

    /// The QP number.
    #[inline(always)]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// The peer PE.
    #[inline(always)]
    pub fn peer(&self) -> u32 {
        self.peer
    }
    /// lkey of this PE's symmetric heap.
    #[inline(always)]
    pub fn heap_lkey(&self) -> u32 {
        self.desc().lkey
    }
    /// rkey of the peer's symmetric heap.
    #[inline(always)]
    pub fn heap_rkey(&self) -> u32 {
        self.desc().rkey
    }
    /// The peer's address of heap offset `offset`.
    #[inline(always)]
    pub fn remote_addr(&self, offset: u64) -> u64 {
        self.desc().peer_heap_base + offset
    }
    /// The counters (diagnostics and tests).
    #[inline(always)]
    pub fn counters(&self) -> QpCounters {
        let c = self.counters;
        // SAFETY: live (constructor contract); every field is read with an atomic load, as every
        // writer writes it atomically. The fields are read one by one: a diagnostic snapshot.
        unsafe {
            QpCounters {
                resv_head: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).resv_head)),
                ready_head: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).ready_head)),
                ring_state: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).ring_state)),
                cons_idx: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).cons_idx)),
                landing_head: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).landing_head)),
                landing_tail: arch::load_relaxed_sys_u64(core::ptr::addr_of!((*c).landing_tail)),
                _pad0: 0,
                _pad1: [0; 9],
            }
        }
    }

    #[inline(always)]
    fn deadline(&self) -> Deadline {
        Deadline::of(self)
    }

    #[inline(always)]
    fn ctr(&self) -> *mut QpCounters {
        self.counters
    }

    /// Reserves `wqebbs` (plus a trailing NOP when the WQE spans several), lets `write` fill the
    /// WQE at the returned index, and submits. Returns the index past everything posted.
    ///
    /// Warp aggregation: the lanes of a warp that post WQEs of the same size to this QP together
    /// take one reservation (the lowest lane reserves for all; each lane writes its own WQE at
    /// `first + rank * n`) and one submit (the lowest lane marks the whole range ready and rings
    /// once), as NVSHMEM does. The CPU emulation runs this with real warps (`IBGDA_CPU_BLOCK_THREADS`).
    #[inline(always)]
    fn post_with(&self, wqebbs: u32, ring: Ring, write: impl FnOnce(u64, u8)) -> u64 {
        let force_ring = ring == Ring::Now;
        // The posting view first: its loads (the DBR's and doorbell's addresses) are then in
        // flight while the group forms and reserves.
        let sq = Sq::new(self);
        let trailing_nop = wqebbs > 1;
        let n = wqebbs as u64 + trailing_nop as u64;
        let mut w = self.deadline();
        // Counters are 128-byte aligned, so the size fits in the key's low bits.
        // SAFETY: here and in every masked collective below, the masks are `active_mask()`'s, which
        // holds this lane and only lanes executing this same code, or a subset that every member
        // computed alike; each member makes the same sequence of calls.
        let mut group = unsafe { arch::match_any_u64(arch::active_mask(), self.counters as u64 | n) };
        let depth = self.sq.mask + 1;
        if n * group.count_ones() as u64 > depth - post::completion_interval(depth) {
            // A reservation waits for completions of the WQEs a ring's depth before its end, and
            // only signalled WQEs complete (one per completion interval, see
            // `post::wants_completion`). One no longer than depth minus an interval always has a
            // signalled WQE of earlier posters to wait for; a longer group reservation could be
            // waiting for a completion only its own, not yet written, WQEs would bring. So past
            // that every lane reserves for itself. All lanes of the group see the same size, so
            // they agree.
            group = 1 << arch::lane_id();
        }
        let leader = group.trailing_zeros();
        let size = group.count_ones() as u64;
        let rank = (group & arch::lanemask_lt()).count_ones() as u64;
        // If any lane forces a ring, the group's submit does. Every lane of the group must reach
        // the match (a `.sync` collective), so it comes before the lane's own flag.
        // SAFETY: as above.
        let forced = unsafe { arch::match_any_u64(group, force_ring as u64) } != group || force_ring;
        // The group defers its ring only when every lane does (each posts again at once).
        let defer = ring == Ring::Defer;
        // SAFETY: as above.
        let deferred = unsafe { arch::match_any_u64(group, defer as u64) } == group && defer;
        let mut reserved = 0;
        let reserving = if arch::mutant(arch::Mutant::WrongReservingLane) {
            size - 1
        } else {
            0
        };
        if rank == reserving {
            // The index and whether the group's reservation was the newest when its reserver
            // looked (see `post::reserve`), in one word: an index never reaches 2^63.
            let (first, newest) = post::reserve(&sq, &mut w, n * size);
            reserved = first << 1 | newest as u64;
        }
        // SAFETY: as above.
        let reserved = unsafe { broadcast_u64(group, reserved, leader) };
        let (first, newest) = (reserved >> 1, reserved & 1 != 0);
        let base = first + rank * n;
        // Selective completion (see `post::wants_completion`): only the group's last WQE can be
        // the newest.
        let last = if post::wants_completion(self.sq.mask + 1, base, n, force_ring, newest && rank + 1 == size) {
            fm_ce_se::CQ_UPDATE
        } else {
            0
        };
        let fm = if trailing_nop { 0 } else { last };
        write(base, fm);
        if trailing_nop {
            let i = base + wqebbs as u64;
            // SAFETY: reserved above.
            unsafe {
                self.sq.write(
                    i,
                    0,
                    wqe::ctrl(i as u16, opcode::NOP, 0, self.qpn, last, wqe_ds::NOP, 0),
                )
            };
        }
        // Every lane's WQE is written (and, by the barrier's ordering, visible to the leader, whose
        // ready-chain CAS then releases them all).
        // SAFETY: as above.
        unsafe { arch::sync_lanes(group) };
        // The lowest lane submits.
        if rank == 0 {
            post::submit(&sq, &mut w, first, n * size, forced, deferred, newest);
        }
        // No lane may ring or wait on its index before the group's range is marked ready.
        // SAFETY: as above.
        unsafe { arch::sync_lanes(group) };
        base + n
    }

    /// Posts an RDMA WRITE, WRITE_IMM or READ of `len` bytes between local `laddr` (key `lkey`) and
    /// remote `raddr` (key `rkey`). `force_ring` rings the doorbell now instead of leaving it to a
    /// later poster.
    ///
    /// # Safety
    /// The NIC reads (WRITE) or writes (READ) `laddr..laddr+len` in this GPU's memory after the
    /// call returns, until the WQE completes (a [`Qp::wait`] on the returned index, or
    /// [`Qp::quiet`]): until then nothing else may write it (WRITE) or access it (READ). The keys
    /// are checked by the NIC, which completes a bad one with an error CQE, not a wild access.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_rdma(
        &self,
        op: Rdma,
        laddr: u64,
        lkey: u32,
        raddr: u64,
        rkey: u32,
        len: u32,
        force_ring: bool,
    ) -> u64 {
        // SAFETY: this function's contract.
        unsafe { self.post_rdma_ring(op, laddr, lkey, raddr, rkey, len, Ring::from_force(force_ring)) }
    }

    /// [`Qp::post_rdma`] with the doorbell policy spelled out: [`Ring::Defer`] leaves the ring to
    /// this thread's next post (a put's data before its signal: one doorbell for both).
    ///
    /// # Safety
    /// As [`Qp::post_rdma`]; with [`Ring::Defer`], this thread posts to this QP again at once.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_rdma_ring(
        &self,
        op: Rdma,
        laddr: u64,
        lkey: u32,
        raddr: u64,
        rkey: u32,
        len: u32,
        ring: Ring,
    ) -> u64 {
        let (code, imm) = match op {
            Rdma::Write => (opcode::RDMA_WRITE, 0),
            Rdma::WriteImm(imm) => (opcode::RDMA_WRITE_IMM, imm),
            Rdma::Read => (opcode::RDMA_READ, 0),
        };
        let qpn = self.qpn;
        let sq = self.sq;
        self.post_with(1, ring, |i, fm| {
            // SAFETY: `[i, i+1)` is reserved by this thread.
            unsafe {
                sq.write_rdma(i, code, imm, qpn, fm, raddr, rkey, len, laddr, lkey);
            }
        })
    }

    /// Posts an RDMA WRITE of `len` bytes (local `laddr`, key `lkey`, to remote `raddr`) and then
    /// an atomic on remote `sig` whose previous value lands in the QP's dummy landing slot: a put
    /// with its signal, in one reservation (one reserve, one ready mark, one doorbell for both,
    /// where two posts take two of each). The atomic executes after the WRITE (RC order on one
    /// QP), so the signal is never seen before the data.
    ///
    /// # Safety
    /// As [`Qp::post_rdma`] for the WRITE; `len` is at most the NIC's message size.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_write_then_atomic(
        &self,
        laddr: u64,
        lkey: u32,
        raddr: u64,
        len: u32,
        op: AtomicOp,
        sig: u64,
        force_ring: bool,
    ) -> u64 {
        let (qpn, sq, rkey) = (self.qpn, self.sq, self.heap_rkey());
        let (landing, landing_lkey) = (self.dummy_landing(sig), self.landing_lkey());
        let atomic_wqebbs = wqe_ds::wqebbs(op.encoding().2);
        // Several WQEBBs: `post_with` adds the trailing NOP that carries the completion, so both
        // WQEs here ask for none (`_fm` is 0).
        self.post_with(1 + atomic_wqebbs, Ring::from_force(force_ring), |i, _fm| {
            // SAFETY: `[i, i + 1 + atomic_wqebbs)` is reserved by this thread.
            unsafe {
                sq.write_rdma(i, opcode::RDMA_WRITE, 0, qpn, 0, raddr, rkey, len, laddr, lkey);
                sq.write_atomic(i + 1, &op, qpn, 0, sig, rkey, landing, landing_lkey);
            }
        })
    }

    /// Posts an RDMA WRITE carrying `data` inline (at most [`MAX_INLINE_BYTES`]; longer data is
    /// the caller's bug and is truncated to that bound, which the NIC then delivers).
    #[inline(always)]
    pub fn post_inline_write(&self, raddr: u64, rkey: u32, data: &[u8], force_ring: bool) -> u64 {
        let data = if data.len() as u32 > MAX_INLINE_BYTES {
            &data[..MAX_INLINE_BYTES as usize]
        } else {
            data
        };
        let ds = wqe_ds::inline_write(data.len() as u32);
        let qpn = self.qpn;
        let sq = self.sq;
        self.post_with(wqe_ds::wqebbs(ds), Ring::from_force(force_ring), |i, fm| {
            // SAFETY: the WQE's WQEBBs are reserved by this thread.
            unsafe {
                sq.write(i, 0, wqe::ctrl(i as u16, opcode::RDMA_WRITE, 0, qpn, fm, ds, 0));
                sq.write(i, 1, wqe::raddr(raddr, rkey));
                let mut c = 0;
                while 2 + c < ds as u32 {
                    sq.write(i, 2 + c, wqe::inline_chunk(data, c as usize));
                    c += 1;
                }
            }
        })
    }

    /// Posts an RDMA WRITE of `value` to remote `raddr` (key `rkey`) inline, as NVSHMEM's `p`
    /// does: the lanes of a warp that call it together on this QP with consecutive addresses in
    /// lane order (lane `l + 1` writes the word after lane `l`'s, with the same key) share one
    /// one-WQEBB WQE of up to 28 bytes (three 8-byte values, seven 4-byte, eight smaller), so a
    /// warp writing 32 consecutive words posts 11 WQEs instead of 32. Any other lane posts its
    /// own. Every lane returns after the WQEs of its group are reserved and marked ready, so a
    /// later `quiet` or post by any of them follows them. The emulated NIC's batch path stores
    /// each aligned value of a combined WQE with one access of its width (its one-at-a-time path
    /// copies bytes, for a lone `p` too).
    #[inline(always)]
    pub fn post_inline_value<T: crate::Word>(&self, raddr: u64, rkey: u32, value: T) {
        let size = core::mem::size_of::<T>() as u32;
        let bits = crate::memory::word_bits(value);
        let mask = arch::active_mask();
        if mask & mask.wrapping_sub(1) == 0 {
            self.post_inline_write(raddr, rkey, &bits.to_le_bytes()[..size as usize], false);
            return;
        }
        // Values one WQE carries: what fits in one WQEBB, at most eight (the gather's shuffles).
        let per = (wqe::ONE_WQEBB_INLINE_BYTES / size).min(8);
        let lane = arch::lane_id();
        // SAFETY: every collective below is over `group`, the lanes of `mask` (the lanes in this
        // call together) that post to this QP; each of them makes the same sequence of calls, and
        // every source lane named is in `group`.
        unsafe {
            // The top bit keeps this key apart from the posting protocol's (the counters' address,
            // with sizes in its low bits) and the value's size apart from other widths', should
            // lanes elsewhere share the mask (the CPU emulation's `activemask` gathers lanes at
            // any call site; a GPU's, only lanes at this instruction). Addresses are below 2^56.
            let group = arch::match_any_u64(mask, self.counters as u64 | 1 << 63 | (size as u64) << 56);
            let below = group & arch::lanemask_lt();
            let prev = if below == 0 { lane } else { 31 - below.leading_zeros() };
            let prev_addr = broadcast_u64(group, raddr, prev);
            let prev_key = arch::shfl_idx_masked_u32(group, rkey, prev);
            let adjacent =
                prev_addr.wrapping_add(size as u64) == raddr || arch::mutant(arch::Mutant::CombinedAcrossGaps);
            let joins = below != 0 && prev_key == rkey && adjacent;
            // Runs of consecutive values, cut every `per` lanes into WQEs, each led by its first lane.
            let run_starts = arch::ballot_masked(group, !joins);
            let start = 31 - (run_starts & (below | 1 << lane)).leading_zeros();
            let pos = (below & !((1u32 << start) - 1)).count_ones();
            let leaders = arch::ballot_masked(group, pos.is_multiple_of(per));
            if leaders == group {
                // Nothing to combine: every lane posts its own (aggregated into one reservation).
                self.post_inline_write(raddr, rkey, &bits.to_le_bytes()[..size as usize], false);
                return;
            }
            let higher = group & !(below | 1 << lane);
            let next = leaders & higher;
            // The lanes after this one in its WQE (meaningful in a leader).
            let members = if next == 0 {
                higher
            } else {
                higher & ((1u32 << next.trailing_zeros()) - 1)
            };
            let mut payload = [0u64; 4];
            payload[0] = bits;
            let (mut rest, mut src) = (members, lane);
            let mut j = 1;
            while j < per {
                if rest != 0 {
                    src = rest.trailing_zeros();
                    rest &= rest - 1;
                }
                let v = if size <= 4 {
                    arch::shfl_idx_masked_u32(group, bits as u32, src) as u64
                } else {
                    broadcast_u64(group, bits, src)
                };
                if j <= members.count_ones() {
                    // Values never straddle a word: every offset is a multiple of their size.
                    let at = j * size;
                    payload[(at / 8) as usize] |= v << (8 * (at % 8));
                }
                j += 1;
            }
            if leaders >> lane & 1 != 0 {
                self.post_inline_payload(raddr, rkey, &payload, (1 + members.count_ones()) * size);
            }
            arch::sync_lanes(group);
        }
    }

    /// Posts a one-WQEBB inline RDMA WRITE of the first `len` bytes of `payload`.
    #[inline(always)]
    fn post_inline_payload(&self, raddr: u64, rkey: u32, payload: &[u64; 4], len: u32) -> u64 {
        let ds = wqe_ds::inline_write(len);
        let qpn = self.qpn;
        let sq = self.sq;
        self.post_with(1, Ring::Auto, |i, fm| {
            // SAFETY: the WQE's WQEBB is reserved by this thread.
            unsafe {
                sq.write(i, 0, wqe::ctrl(i as u16, opcode::RDMA_WRITE, 0, qpn, fm, ds, 0));
                sq.write(i, 1, wqe::raddr(raddr, rkey));
                sq.write(i, 2, wqe::inline_words(payload, len, 0));
                if ds > 3 {
                    sq.write(i, 3, wqe::inline_words(payload, len, 1));
                }
            }
        })
    }

    /// Posts an atomic on remote `raddr`; the previous value lands at local `laddr` (key `lkey`,
    /// `op.width()` bytes).
    ///
    /// # Safety
    /// The NIC writes `laddr..laddr+op.width()` after the call returns, until the WQE completes:
    /// until then nothing else may access it.
    #[inline(always)]
    pub unsafe fn post_atomic(
        &self,
        op: AtomicOp,
        laddr: u64,
        lkey: u32,
        raddr: u64,
        rkey: u32,
        force_ring: bool,
    ) -> u64 {
        let qpn = self.qpn;
        let sq = self.sq;
        self.post_with(
            wqe_ds::wqebbs(op.encoding().2),
            Ring::from_force(force_ring),
            |i, fm| {
                // SAFETY: the WQE's WQEBBs are reserved by this thread.
                unsafe { sq.write_atomic(i, &op, qpn, fm, raddr, rkey, laddr, lkey) }
            },
        )
    }

    /// Posts a WQE given as raw 16-byte segments: `build(index)` returns the segments (ctrl first)
    /// for the WQE at 16-bit `index` and how many of them to write. For tests, and for WQEs this
    /// module has no encoder for. `wqebbs` must cover the segments; the WQE is signalled only if
    /// its own ctrl segment asks for it (a trailing signalled NOP follows multi-WQEBB WQEs).
    ///
    /// # Safety
    /// Whatever local memory the segments name, the NIC may read or write until the WQE completes,
    /// as for [`Qp::post_rdma`].
    #[inline(always)]
    pub unsafe fn post_raw(
        &self,
        wqebbs: u32,
        force_ring: bool,
        build: impl FnOnce(u16) -> ([wqe::Segment; 16], usize),
    ) -> u64 {
        let sq = self.sq;
        self.post_with(wqebbs, Ring::from_force(force_ring), |i, _fm| {
            let (segs, n) = build(i as u16);
            let mut j = 0;
            while j < n && j < 16 && j < wqebbs as usize * 4 {
                // SAFETY: the WQE's WQEBBs are reserved by this thread.
                unsafe { sq.write(i, j as u32, segs[j]) };
                j += 1;
            }
        })
    }

    /// Posts a NOP (useful to flush a completion through).
    #[inline(always)]
    pub fn post_nop(&self, force_ring: bool) -> u64 {
        let qpn = self.qpn;
        let sq = self.sq;
        self.post_with(1, Ring::from_force(force_ring), |i, fm| {
            // SAFETY: reserved by this thread.
            unsafe { sq.write(i, 0, wqe::ctrl(i as u16, opcode::NOP, 0, qpn, fm, wqe_ds::NOP, 0)) };
        })
    }

    /// Waits until every WQE below `index` has completed (rings first). An error CQE or the
    /// timeout reports an attributed error and traps.
    #[inline(always)]
    pub fn wait(&self, index: u64) {
        let q = Sq::new(self);
        let reserved = q.resv_head();
        if index > reserved {
            // Ringing or waiting past the reservations would have the NIC read slots nobody owns.
            let mut f = Failure::new(ErrorKind::UnreservedIndex);
            f.qp = self.qpn;
            f.observed = index;
            f.expected = reserved;
            f.op = self.rep.op;
            report(self.rep.error, self.rep.my_pe, f);
        }
        post::wait_completed(&q, &mut self.deadline(), index)
    }

    /// Completes everything posted to this QP so far.
    #[inline(always)]
    pub fn quiet(&self) {
        post::quiet(&Sq::new(self), &mut self.deadline())
    }

    /// A sequentially consistent fence at the scope the NIC observes this QP's posts at: GPU scope
    /// for a GPU-doorbell queue in GPU memory, system scope otherwise (see [`Sq`]). Orders the
    /// calling thread's earlier accesses, and those it synchronised with, before its next post.
    #[inline(always)]
    pub fn fence_for_nic(&self) {
        if self.gpu_scope {
            arch::fence_sc_gpu()
        } else {
            arch::fence_sc_sys()
        }
    }

    /// Rings the doorbell for everything marked ready.
    #[inline(always)]
    pub fn flush(&self) {
        let q = Sq::new(self);
        post::ring(&q, &mut self.deadline(), q.ready_head())
    }

    // ------------------------------------------------------------ landing slots

    /// Takes a landing slot (in order; waits while all are in use). The lanes of a warp that take
    /// slots of this QP together take consecutive tickets with one counter update (the lowest lane
    /// for all), as posts are aggregated; every lane of the group later calls
    /// [`Qp::release_landing_slot`] with its ticket, once.
    #[inline(always)]
    pub(crate) fn take_landing_slot(&self) -> LandingTicket {
        let n = 1u64 << self.desc().log_landing_slots;
        let mut w = self.deadline();
        // SAFETY: every lane of `active_mask()` executes this same call (the masked collectives'
        // contract, as in `post_with`).
        let mut group = unsafe { arch::match_any_u64(arch::active_mask(), self.counters as u64) };
        if group.count_ones() as u64 > n {
            // More lanes than slots: each takes its own, so none waits for slots its own group holds.
            group = 1 << arch::lane_id();
        }
        let leader = group.trailing_zeros();
        let size = group.count_ones() as u64;
        let rank = (group & arch::lanemask_lt()).count_ones() as u64;
        let mut first = 0;
        if rank == 0 {
            first = crate::landing::take_n(&self.tickets(), size, n, |need, seen| w.landing(need, seen));
        }
        // SAFETY: as above.
        let first = unsafe { broadcast_u64(group, first, leader) };
        LandingTicket {
            ticket: first + rank,
            first,
            group,
        }
    }

    /// The landing ring's ticket counters.
    #[inline(always)]
    fn tickets(&self) -> crate::landing::RawTickets {
        // SAFETY: counters live (constructor contract); every access to them is atomic.
        unsafe {
            crate::landing::RawTickets::new(
                core::ptr::addr_of_mut!((*self.ctr()).landing_head),
                core::ptr::addr_of_mut!((*self.ctr()).landing_tail),
            )
        }
    }

    /// Address of the landing slot of `ticket`.
    #[inline(always)]
    pub(crate) fn landing_addr(&self, ticket: u64) -> u64 {
        let d = self.desc();
        d.landing + (ticket & ((1u64 << d.log_landing_slots) - 1)) * LANDING_SLOT_BYTES
    }

    /// The dummy landing slot a non-fetching atomic on the peer's word at `raddr` points at
    /// ([`ibgda_abi::ibgda::dummy_landing_slot`]).
    #[inline(always)]
    pub(crate) fn dummy_landing(&self, raddr: u64) -> u64 {
        let d = self.desc();
        d.landing + ibgda_abi::ibgda::dummy_landing_slot(1u64 << d.log_landing_slots, raddr) * LANDING_SLOT_BYTES
    }

    /// lkey of the landing buffer.
    #[inline(always)]
    pub(crate) fn landing_lkey(&self) -> u32 {
        self.desc().landing_lkey
    }

    /// Releases `t`'s slot, in ticket order: the group that took its tickets together releases
    /// them together (its lowest lane, once every lane of the group has called this, having read
    /// its slot).
    #[inline(always)]
    pub(crate) fn release_landing_slot(&self, t: LandingTicket) {
        // Every lane of the group has read its slot (the barrier orders those reads before the
        // leader's release).
        // SAFETY: every lane of `t.group` took its ticket in the same group and calls this once.
        unsafe { arch::sync_lanes(t.group) };
        if t.ticket == t.first {
            let mut w = self.deadline();
            crate::landing::release_n(&self.tickets(), t.first, t.group.count_ones() as u64, |t, seen| {
                w.landing(t, seen)
            });
        }
    }
}

/// A landing slot's ticket, with the group of lanes that took theirs together (see
/// [`Qp::take_landing_slot`]).
#[derive(Clone, Copy)]
pub(crate) struct LandingTicket {
    /// This lane's ticket.
    pub ticket: u64,
    /// The group's first ticket.
    first: u64,
    /// The lanes of the group.
    group: u32,
}

/// `v` of lane `leader`, in every lane of `group` (a 64-bit masked shuffle).
///
/// # Safety
/// Every lane of `group` calls it (a `.sync` collective), `leader` among them.
#[inline(always)]
unsafe fn broadcast_u64(group: u32, v: u64, leader: u32) -> u64 {
    // SAFETY: this function's contract.
    unsafe {
        (arch::shfl_idx_masked_u32(group, v as u32, leader) as u64)
            | ((arch::shfl_idx_masked_u32(group, (v >> 32) as u32, leader) as u64) << 32)
    }
}

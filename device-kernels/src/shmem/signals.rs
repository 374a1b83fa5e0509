//! Signals: `signal_op`, `put_signal` (data then signal, never reordered), `signal_fetch`,
//! `signal_wait_until`.

use super::{scoped_entry_points, Route, Scope, Shmem};
use crate::arch;
use crate::deadline::Spin;
use crate::fail::Failure;
use crate::ibgda::{AtomicOp, Qp};
use crate::memory::AtomicWord;
use ibgda_abi::mlx5::MAX_MESSAGE_BYTES;
use ibgda_abi::proxy::amo;
use ibgda_abi::Op;
use ibgda_abi::{Cmp, ErrorKind, SignalOp, WaitKind};

impl Shmem {
    // ---------------------------------------------------------------- signals

    /// Applies `op` with `value` to the signal word `sig` on `pe`, ordered after every write this
    /// thread issued to `pe` before (release semantics; over IBGDA, the same QP).
    #[inline(always)]
    pub fn signal_op(&self, sig: *mut u64, value: u64, op: SignalOp, pe: u32) {
        let sh = &self.at(Op::SignalOp);
        match sh.atomic_route(sig, pe) {
            Route::Direct(t) => signal_direct(t, value, op),
            Route::Nic(qp, r) => {
                signal_nic(&qp, r, value, op);
            }
            Route::Proxy(ch, off) => {
                sh.proxy_atomic(&ch, pe, off, signal_amo(op), 8, value, 0, false);
            }
        }
    }

    /// # Safety
    /// As [`Shmem::put_signal_nbi`] (and [`Shmem::put_signal`] when `blocking`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn put_signal_scoped<T: Copy>(
        &self,
        scope: Scope,
        dst: *mut T,
        src: *const T,
        count: usize,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        pe: u32,
        blocking: bool,
    ) {
        // Check the signal before moving any data, so a bad signal address writes nothing.
        let sig_route = self.atomic_route(sig, pe);
        let bytes = count * core::mem::size_of::<T>();
        if let (Scope::Thread, Route::Nic(qs, sig_raddr)) = (scope, sig_route) {
            if bytes > 0 && bytes as u64 <= MAX_MESSAGE_BYTES {
                if let Route::Nic(qp, raddr) = self.route(dst as u64, bytes as u64, pe) {
                    if qp.qpn() == qs.qpn() {
                        // One thread's put and signal on one QP: both WQEs in one post.
                        let lkey = self.registered(&qp, src as u64, bytes as u64, pe);
                        // SAFETY: the caller's contract covers `src` (this function's `# Safety`);
                        // a WRITE of at most one message.
                        let end = unsafe {
                            qp.post_write_then_atomic(
                                src as u64,
                                lkey,
                                raddr,
                                bytes as u32,
                                signal_amo_op(value, op),
                                sig_raddr,
                                blocking,
                            )
                        };
                        if blocking {
                            // RC completes in order: the signal's completion covers the data's.
                            qp.wait(end);
                        }
                        return;
                    }
                }
            }
        }
        // SAFETY: the caller's contract covers `src` (this function's `# Safety`).
        unsafe { self.put_scoped_before_signal(scope, dst, src, count, pe) };
        scope.sync();
        let (rank, _) = scope.rank_and_size();
        if rank == 0 {
            if scope != Scope::Thread {
                // Make the other threads' stores (ordered before ours by the barrier) visible to
                // the system before the signal.
                arch::fence_sc_sys();
            }
            // Re-derived rather than kept across the put: a route held that long ends up in local
            // memory on nvptx.
            match self.atomic_route(sig, pe) {
                Route::Direct(t) => signal_direct(t, value, op),
                Route::Nic(qp, r) => {
                    let end = signal_nic(&qp, r, value, op);
                    if blocking {
                        // RC completes in order: the signal's completion covers the data's.
                        qp.wait(end);
                    }
                }
                Route::Proxy(ch, off) => {
                    // Same channel as the data, so the proxy posts it after the data on one QP.
                    self.proxy_atomic(&ch, pe, off, signal_amo(op), 8, value, 0, false);
                    if blocking {
                        ch.quiet();
                    }
                }
            }
        }
    }

    scoped_entry_points! {
        put_signal_scoped(dst: *mut T, src: *const T, count: usize, sig: *mut u64, value: u64, op: SignalOp, pe: u32);
        safety: "As [`Shmem::put`] for `src`.";
        nbi_safety: "As [`Shmem::put_nbi`] for `src`.";
        /// Puts `count` elements to `dst` on `pe`, then updates the signal word `sig` on `pe` with
        /// `op`/`value`; the signal is never visible before the data.
        put_signal = PutSignal;
        /// Non-blocking [`Shmem::put_signal`].
        put_signal_nbi = PutSignalNbi;
        put_signal_warp = PutSignalWarp, put_signal_nbi_warp = PutSignalNbiWarp,
        put_signal_block = PutSignalBlock, put_signal_nbi_block = PutSignalNbiBlock;
    }

    /// Reads the local signal word `sig` (acquire).
    #[inline(always)]
    pub fn signal_fetch(&self, sig: *const u64) -> u64 {
        let sh = &self.at(Op::SignalFetch);
        let t = sh.local_word(sig);
        // SAFETY: checked in-heap and aligned.
        unsafe { arch::load_acquire_sys_u64(t) }
    }

    /// Waits until the local signal word `sig` satisfies `cmp` against `value`; returns the value
    /// that satisfied it. Past the timeout: a `Timeout` error naming this PE, the signal's address,
    /// the comparison target and the last value seen.
    #[inline(always)]
    pub fn signal_wait_until(&self, sig: *const u64, cmp: Cmp, value: u64) -> u64 {
        let sh = &self.at(Op::SignalWaitUntil);
        sh.signal_wait_until_from(sig, cmp, value, ibgda_abi::NONE)
    }

    /// [`Shmem::signal_wait_until`] for a signal that PE `peer` updates: a timeout names `peer`
    /// as the PE that was waited on, so a stuck or dead peer is attributed.
    #[inline(always)]
    pub fn signal_wait_until_from(&self, sig: *const u64, cmp: Cmp, value: u64, peer: u32) -> u64 {
        let sh = &self.at(Op::SignalWaitUntil);
        let t = sh.local_word(sig);
        let mut deadline = Spin::new(sh.timeout_ns);
        loop {
            // SAFETY: checked in-heap and aligned.
            let v = unsafe { arch::load_acquire_sys_u64(t) };
            if cmp.holds(v, value) {
                return v;
            }
            if let Some(elapsed) = deadline.tick() {
                sh.wait_expired(WaitKind::Signal, cmp, sig as u64, value, v, peer, elapsed);
            }
        }
    }

    /// Waits until the local symmetric word `ivar` satisfies `cmp` against `value` and returns the
    /// value that did (NVSHMEM's `wait_until`; signed types compare as signed). The poll is an
    /// acquire load, so what the writer made visible before its store is visible after the wait.
    /// Past the timeout: a `Timeout` error naming this PE, the word, the target and the last value
    /// seen.
    #[inline(always)]
    pub fn wait_until<T: AtomicWord>(&self, ivar: *const T, cmp: Cmp, value: T) -> T {
        let sh = &self.at(Op::WaitUntil);
        let t = sh.local_word(ivar);
        let target = value.order_key();
        let mut deadline = Spin::new(sh.timeout_ns);
        loop {
            // SAFETY: checked in-heap and aligned.
            let v = unsafe { T::load_acquire(t) };
            if cmp.holds(v.order_key(), target) {
                return v;
            }
            if let Some(elapsed) = deadline.tick() {
                sh.wait_expired(
                    WaitKind::WaitUntil,
                    cmp,
                    ivar as u64,
                    value.to_bits(),
                    v.to_bits(),
                    ibgda_abi::NONE,
                    elapsed,
                );
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn wait_expired(
        &self,
        kind: WaitKind,
        cmp: Cmp,
        addr: u64,
        expected: u64,
        observed: u64,
        peer: u32,
        elapsed: u64,
    ) -> ! {
        let detail = kind as u32 | ((cmp as u32) << 8);
        let (error, my_pe, op) = self.blame();
        wait_expired(error, my_pe, op, detail, addr, expected, observed, peer, elapsed)
    }
}

/// Reports an expired wait (scalars only, as every cold report path).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn wait_expired(
    error: u64,
    my_pe: u32,
    op: u32,
    detail: u32,
    addr: u64,
    expected: u64,
    observed: u64,
    peer: u32,
    elapsed: u64,
) -> ! {
    let mut f = Failure::new(ErrorKind::Timeout);
    f.detail = detail;
    f.peer = peer;
    f.address = addr;
    f.expected = expected;
    f.observed = observed;
    f.elapsed_ns = elapsed;
    f.op = op;
    crate::fail::report(error, my_pe, f)
}

#[inline(always)]
fn signal_direct(t: u64, value: u64, op: SignalOp) {
    // SAFETY: callers pass a checked, aligned in-heap signal word.
    unsafe {
        match op {
            SignalOp::Set => arch::store_release_sys_u64(t as *mut u64, value),
            SignalOp::Add => {
                arch::atomic_add_release_sys_u64(t as *mut u64, value);
            }
        }
    }
}

/// The proxy atomic that applies a signal update.
#[inline(always)]
fn signal_amo(op: SignalOp) -> u8 {
    match op {
        SignalOp::Set => amo::SWAP,
        SignalOp::Add => amo::ADD,
    }
}

/// Posts the signal update as an atomic WQE (after the data, on the same QP); returns its end index.
#[inline(always)]
fn signal_nic(qp: &Qp, raddr: u64, value: u64, op: SignalOp) -> u64 {
    let amo = signal_amo_op(value, op);
    // SAFETY: the result lands in the QP's dummy landing slot, which no thread reads.
    unsafe {
        qp.post_atomic(
            amo,
            qp.dummy_landing(raddr),
            qp.landing_lkey(),
            raddr,
            qp.heap_rkey(),
            false,
        )
    }
}

/// The atomic WQE that applies a signal update.
#[inline(always)]
fn signal_amo_op(value: u64, op: SignalOp) -> AtomicOp {
    match op {
        SignalOp::Set => AtomicOp::swap(8, value),
        SignalOp::Add => AtomicOp::add(8, value),
    }
}

//! Remote atomics on `u32`, `u64`, `i32`, `i64`: arithmetic, swaps and the bitwise `and`, `or`,
//! `xor` (over a NIC, masked compare-and-swaps and a carry-less masked fetch-and-add, as a
//! ConnectX's extended atomics do them).

use super::{Route, Shmem};
use crate::ibgda::AtomicOp;
use crate::memory::AtomicWord;
use ibgda_abi::proxy::amo;
use ibgda_abi::Op;

impl Shmem {
    // ---------------------------------------------------------------- atomics

    #[inline(always)]
    pub(super) fn atomic_route<T: AtomicWord>(&self, dst: *const T, pe: u32) -> Route {
        self.check_aligned(dst as u64, T::BYTES, pe);
        self.route(dst as u64, T::BYTES as u64, pe)
    }

    /// A local word of this PE's heap (signals are waited on locally).
    #[inline(always)]
    pub(super) fn local_word<T: AtomicWord>(&self, p: *const T) -> *mut T {
        self.check_aligned(p as u64, T::BYTES, self.my_pe);
        (self.heap_base + self.heap_offset(p as u64, T::BYTES as u64, self.my_pe)) as *mut T
    }

    /// Atomically adds `value` to symmetric `dst` on `pe`; returns the previous value.
    #[inline(always)]
    pub fn atomic_fetch_add<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) -> T {
        let sh = &self.at(Op::AtomicFetchAdd);
        match sh.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::fetch_add(t as *mut T, value) },
            Route::Nic(qp, r) => {
                T::from_bits(sh.nic_atomic(&qp, r, AtomicOp::add(T::BYTES as u32, value.to_bits()), true))
            }
            Route::Proxy(ch, off) => {
                T::from_bits(sh.proxy_atomic(&ch, pe, off, amo::ADD, T::BYTES, value.to_bits(), 0, true))
            }
        }
    }
    /// Atomically adds 1 to symmetric `dst` on `pe`; returns the value before (NVSHMEM's
    /// `atomic_fetch_inc`).
    #[inline(always)]
    pub fn atomic_fetch_inc<T: AtomicWord>(&self, dst: *mut T, pe: u32) -> T {
        self.at(Op::AtomicFetchInc).atomic_fetch_add(dst, T::from_bits(1), pe)
    }

    /// Atomically adds 1 to symmetric `dst` on `pe` (NVSHMEM's `atomic_inc`; complete after
    /// [`Shmem::quiet`]).
    #[inline(always)]
    pub fn atomic_inc<T: AtomicWord>(&self, dst: *mut T, pe: u32) {
        self.at(Op::AtomicInc).atomic_add(dst, T::from_bits(1), pe)
    }

    /// Atomically adds `value` to symmetric `dst` on `pe` (complete after [`Shmem::quiet`]).
    #[inline(always)]
    pub fn atomic_add<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) {
        let sh = &self.at(Op::AtomicAdd);
        match sh.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe {
                T::fetch_add(t as *mut T, value);
            },
            Route::Nic(qp, r) => {
                sh.nic_atomic(&qp, r, AtomicOp::add(T::BYTES as u32, value.to_bits()), false);
            }
            Route::Proxy(ch, off) => {
                sh.proxy_atomic(&ch, pe, off, amo::ADD, T::BYTES, value.to_bits(), 0, false);
            }
        }
    }
    /// Atomically replaces `dst` on `pe` with `value` if it equals `cond`; returns the previous value.
    #[inline(always)]
    pub fn atomic_compare_swap<T: AtomicWord>(&self, dst: *mut T, cond: T, value: T, pe: u32) -> T {
        let sh = &self.at(Op::AtomicCompareSwap);
        match sh.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::compare_swap(t as *mut T, cond, value) },
            Route::Nic(qp, r) => {
                let op = AtomicOp::compare_swap(T::BYTES as u32, cond.to_bits(), value.to_bits());
                T::from_bits(sh.nic_atomic(&qp, r, op, true))
            }
            Route::Proxy(ch, off) => T::from_bits(sh.proxy_atomic(
                &ch,
                pe,
                off,
                amo::COMPARE_SWAP,
                T::BYTES,
                value.to_bits(),
                cond.to_bits(),
                true,
            )),
        }
    }
    /// Atomically replaces `dst` on `pe` with `value`; returns the previous value.
    #[inline(always)]
    pub fn atomic_swap<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) -> T {
        let sh = &self.at(Op::AtomicSwap);
        match sh.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::swap(t as *mut T, value) },
            Route::Nic(qp, r) => {
                T::from_bits(sh.nic_atomic(&qp, r, AtomicOp::swap(T::BYTES as u32, value.to_bits()), true))
            }
            Route::Proxy(ch, off) => {
                T::from_bits(sh.proxy_atomic(&ch, pe, off, amo::SWAP, T::BYTES, value.to_bits(), 0, true))
            }
        }
    }
    /// Atomically loads `src` on `pe`.
    #[inline(always)]
    pub fn atomic_fetch<T: AtomicWord>(&self, src: *const T, pe: u32) -> T {
        let sh = &self.at(Op::AtomicFetch);
        match sh.atomic_route(src, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::load(t as *const T) },
            Route::Nic(qp, r) => T::from_bits(sh.nic_atomic(&qp, r, AtomicOp::fetch(T::BYTES as u32), true)),
            Route::Proxy(ch, off) => T::from_bits(sh.proxy_atomic(&ch, pe, off, amo::FETCH, T::BYTES, 0, 0, true)),
        }
    }
    /// Atomically stores `value` to `dst` on `pe` (complete after [`Shmem::quiet`]).
    #[inline(always)]
    pub fn atomic_set<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) {
        let sh = &self.at(Op::AtomicSet);
        match sh.atomic_route(dst, pe) {
            // SAFETY: checked in-heap and aligned.
            Route::Direct(t) => unsafe { T::store(t as *mut T, value) },
            Route::Nic(qp, r) => {
                sh.nic_atomic(&qp, r, AtomicOp::swap(T::BYTES as u32, value.to_bits()), false);
            }
            Route::Proxy(ch, off) => {
                sh.proxy_atomic(&ch, pe, off, amo::SWAP, T::BYTES, value.to_bits(), 0, false);
            }
        }
    }

    bitwise_atomics! {
        /// Atomically ands `value` into `dst` on `pe`; returns the previous value.
        atomic_fetch_and = AtomicFetchAnd,
        /// Atomically ands `value` into `dst` on `pe` (complete after [`Shmem::quiet`]).
        atomic_and = AtomicAnd, fetch_and, and, AND;
        /// Atomically ors `value` into `dst` on `pe`; returns the previous value.
        atomic_fetch_or = AtomicFetchOr,
        /// Atomically ors `value` into `dst` on `pe` (complete after [`Shmem::quiet`]).
        atomic_or = AtomicOr, fetch_or, or, OR;
        /// Atomically exclusive-ors `value` into `dst` on `pe`; returns the previous value.
        atomic_fetch_xor = AtomicFetchXor,
        /// Atomically exclusive-ors `value` into `dst` on `pe` (complete after [`Shmem::quiet`]).
        atomic_xor = AtomicXor, fetch_xor, xor, XOR;
    }
}

/// The fetching and non-fetching entry points of each bitwise atomic: P2P through the word's own
/// atomic, a NIC through [`AtomicOp`]'s masked form, the proxy through its `amo` kind.
macro_rules! bitwise_atomics {
    ($(
        $(#[$fdoc:meta])* $fetching:ident = $fop:ident,
        $(#[$doc:meta])* $plain:ident = $op:ident, $word:ident, $nic:ident, $amo:ident;
    )*) => {$(
        $(#[$fdoc])*
        #[inline(always)]
        pub fn $fetching<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) -> T {
            let word = |p, v| {
                // SAFETY: `bitwise` calls this only on the checked, aligned local address.
                unsafe { T::$word(p, v) }
            };
            self.at(Op::$fop).bitwise(dst, value, pe, true, word, AtomicOp::$nic, amo::$amo)
        }
        $(#[$doc])*
        #[inline(always)]
        pub fn $plain<T: AtomicWord>(&self, dst: *mut T, value: T, pe: u32) {
            let word = |p, v| {
                // SAFETY: as above.
                unsafe { T::$word(p, v) }
            };
            self.at(Op::$op).bitwise(dst, value, pe, false, word, AtomicOp::$nic, amo::$amo);
        }
    )*};
}
use bitwise_atomics;

impl Shmem {
    /// A bitwise atomic on a handle already [`Shmem::at`] its call.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn bitwise<T: AtomicWord>(
        &self,
        dst: *mut T,
        value: T,
        pe: u32,
        fetch: bool,
        word: impl FnOnce(*mut T, T) -> T,
        nic: impl FnOnce(u32, u64) -> AtomicOp,
        kind: u8,
    ) -> T {
        match self.atomic_route(dst, pe) {
            // Checked in-heap and aligned: what `word` (the word's own atomic) needs.
            Route::Direct(t) => word(t as *mut T, value),
            Route::Nic(qp, r) => T::from_bits(self.nic_atomic(&qp, r, nic(T::BYTES as u32, value.to_bits()), fetch)),
            Route::Proxy(ch, off) => {
                T::from_bits(self.proxy_atomic(&ch, pe, off, kind, T::BYTES, value.to_bits(), 0, fetch))
            }
        }
    }
}

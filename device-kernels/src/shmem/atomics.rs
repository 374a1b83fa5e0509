//! Remote atomics on `u32`, `u64`, `i32`, `i64`.

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
}

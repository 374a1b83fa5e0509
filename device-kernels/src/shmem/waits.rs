//! Point-to-point synchronisation on arrays of local words, as OpenSHMEM 1.5 and NVSHMEM define
//! `test`, `wait_until_all` / `_any` / `_some` and `test_all` / `_any` / `_some`: a receiver that expects
//! several signals (an MoE rank waiting for every expert's count, or taking whichever arrives
//! first) waits on all of them in one call.
//!
//! Each poll is an acquire load, so what a writer made visible before its store is visible after
//! the wait returns. `status` (optional: null includes every word) excludes the words whose entry
//! is not 0, as OpenSHMEM's. The words' range is checked once (in the heap, aligned), before the
//! first poll. Every wait ends at the PE's timeout with a `Timeout` error naming the call, the word
//! it last polled, the target and the value it saw (`in wait_until_all: timeout ... in
//! wait_until(word at ...)`: the record is `wait_until`'s, the call named first).

use super::Shmem;
use crate::arch;
use crate::deadline::Spin;
use crate::memory::AtomicWord;
use ibgda_abi::{Cmp, HeapHeader, Op, WaitKind};

impl Shmem {
    /// Whether the local symmetric word `ivar` satisfies `cmp` against `value` now (NVSHMEM's
    /// `test`): one acquire load, no wait.
    #[inline(always)]
    pub fn test<T: AtomicWord>(&self, ivar: *const T, cmp: Cmp, value: T) -> bool {
        let sh = &self.at(Op::Test);
        let t = sh.local_word(ivar);
        // SAFETY: checked in-heap and aligned.
        let v = unsafe { T::load_acquire(t) };
        cmp.holds(v.order_key(), value.order_key())
    }

    /// Waits until every included word of `ivars[..n]` satisfies `cmp` against `value` (NVSHMEM's
    /// `wait_until_all`). Returns at once when `n` is 0 or `status` excludes every word.
    ///
    /// # Safety
    /// `status` is null or points to `n` readable `i32`s that do not change during the call.
    #[inline(always)]
    pub unsafe fn wait_until_all<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) {
        let sh = &self.at(Op::WaitUntilAll);
        let words = sh.local_words(ivars, n);
        let target = value.order_key();
        let mut deadline = Spin::new(sh.timeout_ns);
        for i in 0..n {
            // SAFETY: this function's contract.
            if !unsafe { included(status, i) } {
                continue;
            }
            let w = words.wrapping_add(i);
            loop {
                // SAFETY: `w` is one of the checked words.
                let v = unsafe { T::load_acquire(w) };
                if cmp.holds(v.order_key(), target) {
                    break;
                }
                sh.tick_or_expire(&mut deadline, cmp, w as u64, value.to_bits(), v.to_bits());
            }
        }
    }

    /// Waits until some included word of `ivars[..n]` satisfies `cmp` against `value` and returns
    /// its index (NVSHMEM's `wait_until_any`). Each call on this PE starts polling one word further
    /// than the last, so a series of calls returns every word that stays satisfied, not only the
    /// lowest (OpenSHMEM 1.5's rule). Returns `usize::MAX` at once when `n` is 0 or `status`
    /// excludes every word.
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all`].
    #[inline(always)]
    pub unsafe fn wait_until_any<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) -> usize {
        let sh = &self.at(Op::WaitUntilAny);
        let words = sh.local_words(ivars, n);
        let mut deadline = sh.multi_word_deadline(n);
        let start = sh.next_any_start(n);
        loop {
            // SAFETY: this function's contract; `words` are checked.
            let pass = unsafe { any_pass(words, n, status, start, cmp, value) };
            match pass {
                Pass::Found(i) => return i,
                Pass::NoneIncluded => return usize::MAX,
                Pass::NotYet { addr, seen } => sh.tick_or_expire(&mut deadline, cmp, addr, value.to_bits(), seen),
            }
        }
    }

    /// Waits until at least one included word of `ivars[..n]` satisfies `cmp` against `value`, then
    /// writes the indices of every included word that did at that pass, ascending, to `indices`
    /// and returns how many (NVSHMEM's `wait_until_some`). Returns 0 at once when `n` is 0 or
    /// `status` excludes every word.
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all`]; `indices` has room for `n` writable `usize`s.
    #[inline(always)]
    pub unsafe fn wait_until_some<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) -> usize {
        let sh = &self.at(Op::WaitUntilSome);
        let words = sh.local_words(ivars, n);
        let mut deadline = sh.multi_word_deadline(n);
        loop {
            // SAFETY: this function's contract; `words` are checked.
            let pass = unsafe { some_pass(words, n, indices, status, cmp, value) };
            match pass {
                Pass::Found(found) => return found,
                Pass::NoneIncluded => return 0,
                Pass::NotYet { addr, seen } => sh.tick_or_expire(&mut deadline, cmp, addr, value.to_bits(), seen),
            }
        }
    }

    /// Whether every included word of `ivars[..n]` satisfies `cmp` against `value` now (NVSHMEM's
    /// `test_all`): one acquire load a word, up to the first that does not. True when `n` is 0
    /// or `status` excludes every word.
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all`].
    #[inline(always)]
    pub unsafe fn test_all<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) -> bool {
        let sh = &self.at(Op::TestAll);
        let words = sh.local_words(ivars, n);
        (0..n).all(|i| {
            // SAFETY: this function's contract; `words` are checked.
            unsafe {
                !included(status, i) || cmp.holds(T::load_acquire(words.wrapping_add(i)).order_key(), value.order_key())
            }
        })
    }

    /// The index of an included word of `ivars[..n]` that satisfies `cmp` against `value` now, or
    /// `usize::MAX` (NVSHMEM's `test_any`). Each call on this PE starts one word further than the
    /// last `test_any` or `wait_until_any`, as [`Shmem::wait_until_any`].
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all`].
    #[inline(always)]
    pub unsafe fn test_any<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) -> usize {
        let sh = &self.at(Op::TestAny);
        let words = sh.local_words(ivars, n);
        let start = sh.next_any_start(n);
        // SAFETY: this function's contract; `words` are checked.
        match unsafe { any_pass(words, n, status, start, cmp, value) } {
            Pass::Found(i) => i,
            _ => usize::MAX,
        }
    }

    /// Writes the indices of the included words of `ivars[..n]` that satisfy `cmp` against `value`
    /// now, ascending, to `indices` and returns how many (NVSHMEM's `test_some`; 0 when none).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_some`].
    #[inline(always)]
    pub unsafe fn test_some<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        value: T,
    ) -> usize {
        let sh = &self.at(Op::TestSome);
        let words = sh.local_words(ivars, n);
        // SAFETY: this function's contract; `words` are checked.
        match unsafe { some_pass(words, n, indices, status, cmp, value) } {
            Pass::Found(found) => found,
            _ => 0,
        }
    }

    /// Where this call's pass over `n` words starts: the PE's next `any` start (see
    /// [`HeapHeader::wait_any_start`]).
    #[inline(always)]
    fn next_any_start(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let hdr = self.heap_base as *mut HeapHeader;
        // SAFETY: the runtime's heap header sits at offset 0 of this PE's heap; the word is this
        // PE's threads' only (a relaxed add: any interleaving of calls is fair).
        let k = unsafe { arch::atomic_add_relaxed_sys_u64(core::ptr::addr_of_mut!((*hdr).wait_any_start), 1) };
        (k % n as u64) as usize
    }

    /// `ivars[..n]` as checked local words: in this PE's heap and aligned to their width, or the
    /// call's `OutsideHeap` or `MisalignedAtomic` error before any poll.
    #[inline(always)]
    fn local_words<T: AtomicWord>(&self, ivars: *const T, n: usize) -> *const T {
        if n == 0 {
            return ivars;
        }
        self.check_aligned(ivars as u64, T::BYTES, self.my_pe);
        let bytes = (n as u64).saturating_mul(T::BYTES as u64);
        (self.heap_base + self.heap_offset(ivars as u64, bytes, self.my_pe)) as *const T
    }

    /// The deadline of a wait that polls `n` words a pass: it reads the clock about every 256
    /// polls of a word, not every 256 passes.
    #[inline(always)]
    fn multi_word_deadline(&self, n: usize) -> Spin {
        let passes = (256 / n.max(1)).max(1) as u32;
        Spin::new(self.timeout_ns).checking_every(1 << (31 - passes.leading_zeros()), 32)
    }

    /// One failed pass of a multi-word wait: the deadline's tick, or its `Timeout` error naming
    /// the word polled last.
    #[inline(always)]
    fn tick_or_expire(&self, deadline: &mut Spin, cmp: Cmp, addr: u64, expected: u64, observed: u64) {
        if let Some(elapsed) = deadline.tick() {
            self.wait_expired(
                WaitKind::WaitUntil,
                cmp,
                addr,
                expected,
                observed,
                ibgda_abi::NONE,
                elapsed,
            );
        }
    }
}

/// Whether word `i` takes part: `status` is null or its entry `i` is 0.
///
/// # Safety
/// `status` is null or has at least `i + 1` readable entries.
#[inline(always)]
unsafe fn included(status: *const i32, i: usize) -> bool {
    // SAFETY: this function's contract.
    status.is_null() || unsafe { status.add(i).read() } == 0
}

/// What one pass over the words found.
enum Pass {
    /// `any`: the index that satisfied; `some`: how many did.
    Found(usize),
    /// `status` excludes every word (or there are none).
    NoneIncluded,
    /// No included word satisfied: the last one polled and its value's bits.
    NotYet { addr: u64, seen: u64 },
}

/// One pass of `any` over the checked `words[..n]` from `start` (wrapping): the first included word
/// that satisfies.
///
/// # Safety
/// `words[..n]` are checked local words; `status` is null or has `n` entries.
#[inline(always)]
unsafe fn any_pass<T: AtomicWord>(
    words: *const T,
    n: usize,
    status: *const i32,
    start: usize,
    cmp: Cmp,
    value: T,
) -> Pass {
    let mut pass = Pass::NoneIncluded;
    for k in 0..n {
        let i = (start + k) % n;
        // SAFETY: this function's contract.
        if !unsafe { included(status, i) } {
            continue;
        }
        let w = words.wrapping_add(i);
        // SAFETY: `w` is one of the checked words.
        let v = unsafe { T::load_acquire(w) };
        if cmp.holds(v.order_key(), value.order_key()) {
            return Pass::Found(i);
        }
        pass = Pass::NotYet {
            addr: w as u64,
            seen: v.to_bits(),
        };
    }
    pass
}

/// One pass of `some` over the checked `words[..n]`: every included word that satisfies, its index
/// written to `indices`.
///
/// # Safety
/// As [`any_pass`]; `indices` has room for `n` writable `usize`s.
#[inline(always)]
unsafe fn some_pass<T: AtomicWord>(
    words: *const T,
    n: usize,
    indices: *mut usize,
    status: *const i32,
    cmp: Cmp,
    value: T,
) -> Pass {
    let (mut found, mut pass) = (0, Pass::NoneIncluded);
    for i in 0..n {
        // SAFETY: this function's contract.
        if !unsafe { included(status, i) } {
            continue;
        }
        let w = words.wrapping_add(i);
        // SAFETY: `w` is one of the checked words.
        let v = unsafe { T::load_acquire(w) };
        if cmp.holds(v.order_key(), value.order_key()) {
            // SAFETY: this function's contract: room for `n` indices, `found < n`.
            unsafe { indices.add(found).write(i) };
            found += 1;
        } else {
            pass = Pass::NotYet {
                addr: w as u64,
                seen: v.to_bits(),
            };
        }
    }
    if found > 0 {
        Pass::Found(found)
    } else {
        pass
    }
}

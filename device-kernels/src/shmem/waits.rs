//! Point-to-point synchronisation on arrays of local words, as OpenSHMEM 1.5 and NVSHMEM define
//! `test`, `wait_until_all` / `_any` / `_some` and `test_all` / `_any` / `_some`, each also in a
//! `_vector` form that compares word `i` against its own `values[i]`: a receiver that expects
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilAll)
                .all_with(ivars, n, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::wait_until_all`] with word `i` compared against `values[i]` (OpenSHMEM 1.5's and
    /// NVSHMEM's `wait_until_all_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all`]; `values` points to `n` readable values that do not change
    /// during the call (local memory, any device memory).
    #[inline(always)]
    pub unsafe fn wait_until_all_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilAllVector)
                .all_with(ivars, n, status, cmp, Targets::Each(values))
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilAny)
                .any_with(ivars, n, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::wait_until_any`] with word `i` compared against `values[i]` (`wait_until_any_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all_vector`].
    #[inline(always)]
    pub unsafe fn wait_until_any_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) -> usize {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilAnyVector)
                .any_with(ivars, n, status, cmp, Targets::Each(values))
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilSome)
                .some_with(ivars, n, indices, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::wait_until_some`] with word `i` compared against `values[i]` (`wait_until_some_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_some`] and [`Shmem::wait_until_all_vector`].
    #[inline(always)]
    pub unsafe fn wait_until_some_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) -> usize {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::WaitUntilSomeVector)
                .some_with(ivars, n, indices, status, cmp, Targets::Each(values))
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestAll)
                .test_all_with(ivars, n, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::test_all`] with word `i` compared against `values[i]` (`test_all_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all_vector`].
    #[inline(always)]
    pub unsafe fn test_all_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) -> bool {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestAllVector)
                .test_all_with(ivars, n, status, cmp, Targets::Each(values))
        }
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestAny)
                .test_any_with(ivars, n, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::test_any`] with word `i` compared against `values[i]` (`test_any_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all_vector`].
    #[inline(always)]
    pub unsafe fn test_any_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) -> usize {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestAnyVector)
                .test_any_with(ivars, n, status, cmp, Targets::Each(values))
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
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestSome)
                .test_some_with(ivars, n, indices, status, cmp, Targets::One(value))
        }
    }

    /// [`Shmem::test_some`] with word `i` compared against `values[i]` (`test_some_vector`).
    ///
    /// # Safety
    /// As [`Shmem::wait_until_some_vector`].
    #[inline(always)]
    pub unsafe fn test_some_vector<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        values: *const T,
    ) -> usize {
        // SAFETY: this function's contract.
        unsafe {
            self.at(Op::TestSomeVector)
                .test_some_with(ivars, n, indices, status, cmp, Targets::Each(values))
        }
    }

    /// The `all` wait's body on a handle already [`Shmem::at`] its call.
    ///
    /// # Safety
    /// As [`Shmem::wait_until_all_vector`] (`targets` holds `n` values or one).
    #[inline(always)]
    unsafe fn all_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) {
        let words = self.local_words(ivars, n);
        let mut deadline = Spin::new(self.timeout_ns);
        for i in 0..n {
            // SAFETY: this function's contract.
            if !unsafe { included(status, i) } {
                continue;
            }
            let w = words.wrapping_add(i);
            // SAFETY: this function's contract.
            let value = unsafe { targets.at(i) };
            loop {
                // SAFETY: `w` is one of the checked words.
                let v = unsafe { T::load_acquire(w) };
                if cmp.holds(v.order_key(), value.order_key()) {
                    break;
                }
                self.tick_or_expire(&mut deadline, cmp, w as u64, value.to_bits(), v.to_bits());
            }
        }
    }

    /// The `any` wait's body (see [`Shmem::all_with`]).
    ///
    /// # Safety
    /// As [`Shmem::all_with`].
    #[inline(always)]
    unsafe fn any_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) -> usize {
        let words = self.local_words(ivars, n);
        let mut deadline = self.multi_word_deadline(n);
        let start = self.next_any_start(n);
        loop {
            // SAFETY: this function's contract; `words` are checked.
            match unsafe { any_pass(words, n, status, start, cmp, targets) } {
                Pass::Found(i) => return i,
                Pass::NoneIncluded => return usize::MAX,
                Pass::NotYet { addr, target, seen } => self.tick_or_expire(&mut deadline, cmp, addr, target, seen),
            }
        }
    }

    /// The `some` wait's body (see [`Shmem::all_with`]).
    ///
    /// # Safety
    /// As [`Shmem::all_with`]; `indices` has room for `n` writable `usize`s.
    #[inline(always)]
    unsafe fn some_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) -> usize {
        let words = self.local_words(ivars, n);
        let mut deadline = self.multi_word_deadline(n);
        loop {
            // SAFETY: this function's contract; `words` are checked.
            match unsafe { some_pass(words, n, indices, status, cmp, targets) } {
                Pass::Found(found) => return found,
                Pass::NoneIncluded => return 0,
                Pass::NotYet { addr, target, seen } => self.tick_or_expire(&mut deadline, cmp, addr, target, seen),
            }
        }
    }

    /// The `test_all` body (see [`Shmem::all_with`]).
    ///
    /// # Safety
    /// As [`Shmem::all_with`].
    #[inline(always)]
    unsafe fn test_all_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) -> bool {
        let words = self.local_words(ivars, n);
        (0..n).all(|i| {
            // SAFETY: this function's contract; `words` are checked.
            unsafe {
                !included(status, i)
                    || cmp.holds(
                        T::load_acquire(words.wrapping_add(i)).order_key(),
                        targets.at(i).order_key(),
                    )
            }
        })
    }

    /// The `test_any` body (see [`Shmem::all_with`]).
    ///
    /// # Safety
    /// As [`Shmem::all_with`].
    #[inline(always)]
    unsafe fn test_any_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) -> usize {
        let words = self.local_words(ivars, n);
        let start = self.next_any_start(n);
        // SAFETY: this function's contract; `words` are checked.
        match unsafe { any_pass(words, n, status, start, cmp, targets) } {
            Pass::Found(i) => i,
            _ => usize::MAX,
        }
    }

    /// The `test_some` body (see [`Shmem::all_with`]).
    ///
    /// # Safety
    /// As [`Shmem::some_with`].
    #[inline(always)]
    unsafe fn test_some_with<T: AtomicWord>(
        &self,
        ivars: *const T,
        n: usize,
        indices: *mut usize,
        status: *const i32,
        cmp: Cmp,
        targets: Targets<T>,
    ) -> usize {
        let words = self.local_words(ivars, n);
        // SAFETY: this function's contract; `words` are checked.
        match unsafe { some_pass(words, n, indices, status, cmp, targets) } {
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

/// What each word is compared against: one value for all, or word `i` against `values[i]`
/// (the `_vector` forms).
#[derive(Clone, Copy)]
enum Targets<T> {
    One(T),
    Each(*const T),
}

impl<T: AtomicWord> Targets<T> {
    /// Word `i`'s target.
    ///
    /// # Safety
    /// For `Each`, `values[i]` is readable.
    #[inline(always)]
    unsafe fn at(self, i: usize) -> T {
        match self {
            Targets::One(v) => v,
            // SAFETY: this function's contract.
            Targets::Each(values) => unsafe { values.add(i).read() },
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
    /// No included word satisfied: the last one polled, its target's bits and its value's.
    NotYet { addr: u64, target: u64, seen: u64 },
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
    targets: Targets<T>,
) -> Pass {
    let mut pass = Pass::NoneIncluded;
    for k in 0..n {
        let i = (start + k) % n;
        // SAFETY: this function's contract.
        if !unsafe { included(status, i) } {
            continue;
        }
        let w = words.wrapping_add(i);
        // SAFETY: `w` is one of the checked words; `targets` holds `n` values or one.
        let (v, value) = unsafe { (T::load_acquire(w), targets.at(i)) };
        if cmp.holds(v.order_key(), value.order_key()) {
            return Pass::Found(i);
        }
        pass = Pass::NotYet {
            addr: w as u64,
            target: value.to_bits(),
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
    targets: Targets<T>,
) -> Pass {
    let (mut found, mut pass) = (0, Pass::NoneIncluded);
    for i in 0..n {
        // SAFETY: this function's contract.
        if !unsafe { included(status, i) } {
            continue;
        }
        let w = words.wrapping_add(i);
        // SAFETY: `w` is one of the checked words; `targets` holds `n` values or one.
        let (v, value) = unsafe { (T::load_acquire(w), targets.at(i)) };
        if cmp.holds(v.order_key(), value.order_key()) {
            // SAFETY: this function's contract: room for `n` indices, `found < n`.
            unsafe { indices.add(found).write(i) };
            found += 1;
        } else {
            pass = Pass::NotYet {
                addr: w as u64,
                target: value.to_bits(),
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

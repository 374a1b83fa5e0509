//! Reductions over every PE, as NVSHMEM's `<type>_<op>_reduce_block` (`sum`, `prod`, `min`, `max`,
//! `and`, `or`, `xor`): one block on each PE calls the same reduction with the same arguments,
//! and when it returns `dst[i]` on every PE holds the reduction of all PEs' `src[i]`. The result is
//! the same bits on every PE: each element is reduced by one PE, in PE order, then sent to the
//! rest.
//!
//! How: the array goes in rounds of what the runtime's collective scratch holds
//! (`IBGDA_COLLECTIVE_SCRATCH`; a round takes `n_pes * (scratch / size_of::<T>() / n_pes)`
//! elements, each PE a piece of a `1 / n_pes` of them). In a
//! round each PE owns one piece of it: every PE puts its `src` piece `j` into PE `j`'s scratch
//! (a reduce-scatter), a barrier, PE `j` reduces its piece into its own `dst` and puts it from
//! there into every other PE's `dst` (an all-gather), a barrier. Each PE sends and receives about
//! twice the array whatever the PE count, and the puts are the device API's own (NVLink, the NIC
//! or the proxy, as each peer is reached).
//!
//! The rules are the other collectives' ([`super::collectives`]): they synchronise at their end
//! (and between rounds); `dst` must not be accessed by anyone else on any PE during the call;
//! `src` and `dst` are symmetric and either the same array (in place) or apart; no other block of
//! the PE may run a collective or barrier meanwhile. A `count` of 0 only synchronises.

use super::teams::Members;
use super::Shmem;
use crate::arch;
use crate::fail::Failure;
use ibgda_abi::{ErrorKind, Op, Team};

mod sealed {
    pub trait Sealed {}
}

/// An element type the arithmetic reductions combine (`sum`, `prod`, `min`, `max`): every
/// integer type (sums and products wrap, as NVSHMEM's do in two's complement) and `f32`, `f64`
/// (`min` and `max` take a number over a NaN, IEEE 754's minNum and maxNum).
pub trait ReduceElement: Copy + sealed::Sealed {
    /// `a + b`.
    fn sum(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn prod(a: Self, b: Self) -> Self;
    /// The smaller.
    fn min(a: Self, b: Self) -> Self;
    /// The larger.
    fn max(a: Self, b: Self) -> Self;
}

/// An element type the bitwise reductions combine (`and`, `or`, `xor`): the integer types.
pub trait BitwiseElement: ReduceElement {
    /// `a & b`.
    fn and(a: Self, b: Self) -> Self;
    /// `a | b`.
    fn or(a: Self, b: Self) -> Self;
    /// `a ^ b`.
    fn xor(a: Self, b: Self) -> Self;
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl ReduceElement for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
        }
        impl BitwiseElement for $t {
            #[inline(always)]
            fn and(a: Self, b: Self) -> Self { a & b }
            #[inline(always)]
            fn or(a: Self, b: Self) -> Self { a | b }
            #[inline(always)]
            fn xor(a: Self, b: Self) -> Self { a ^ b }
        }
    )*};
}
integers!(u8, u16, u32, u64, i8, i16, i32, i64);

macro_rules! floats {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl ReduceElement for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { <$t>::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { <$t>::max(a, b) }
        }
    )*};
}
floats!(f32, f64);

/// The reduction entry points, each a thin wrapper naming its call and combining function: the
/// world's, and the team's.
macro_rules! reductions {
    ($($(#[$doc:meta])* $name:ident = $op:ident, $team_name:ident = $team_op:ident, $bound:ident::$f:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// Every thread of exactly one block on every PE calls it with the same `count` (the
        /// barrier's contract, [`Shmem::barrier_all_block`]); `src..src + count` and
        /// `dst..dst + count` are symmetric, readable and writable, and either the same array or
        /// apart; nothing else accesses `dst` on any PE during the call (see the module).
        #[inline(always)]
        pub unsafe fn $name<T: $bound>(&self, dst: *mut T, src: *const T, count: usize) {
            let sh = &self.at(Op::$op);
            // SAFETY: this function's contract is the implementation's.
            unsafe { sh.reduce_block_with(&sh.world(), dst, src, count, T::$f) }
        }

        #[doc = concat!("[`Shmem::", stringify!($name), "`] over the members of `team` (NVSHMEM's \
                         reductions with a team): every member's `dst` ends with the members' `src` \
                         reduced, folded in team order.")]
        ///
        /// # Safety
        #[doc = concat!("As [`Shmem::", stringify!($name), "`], over the team's members (one block on each).")]
        #[inline(always)]
        pub unsafe fn $team_name<T: $bound>(&self, team: Team, dst: *mut T, src: *const T, count: usize) {
            let sh = &self.at(Op::$team_op);
            // SAFETY: this function's contract is the implementation's.
            unsafe { sh.reduce_block_with(&sh.members_of(team), dst, src, count, T::$f) }
        }
    )*};
}

impl Shmem {
    reductions! {
        /// `dst[i] = src[i]` summed over every PE (integers wrap).
        sum_reduce_block = SumReduceBlock, team_sum_reduce_block = TeamSumReduceBlock, ReduceElement::sum;
        /// `dst[i] = src[i]` multiplied over every PE (integers wrap).
        prod_reduce_block = ProdReduceBlock, team_prod_reduce_block = TeamProdReduceBlock, ReduceElement::prod;
        /// `dst[i] =` the smallest `src[i]` of every PE.
        min_reduce_block = MinReduceBlock, team_min_reduce_block = TeamMinReduceBlock, ReduceElement::min;
        /// `dst[i] =` the largest `src[i]` of every PE.
        max_reduce_block = MaxReduceBlock, team_max_reduce_block = TeamMaxReduceBlock, ReduceElement::max;
        /// `dst[i] = src[i]` of every PE, bitwise and.
        and_reduce_block = AndReduceBlock, team_and_reduce_block = TeamAndReduceBlock, BitwiseElement::and;
        /// `dst[i] = src[i]` of every PE, bitwise or.
        or_reduce_block = OrReduceBlock, team_or_reduce_block = TeamOrReduceBlock, BitwiseElement::or;
        /// `dst[i] = src[i]` of every PE, bitwise exclusive or.
        xor_reduce_block = XorReduceBlock, team_xor_reduce_block = TeamXorReduceBlock, BitwiseElement::xor;
    }

    /// The reductions' body over `m` (the world or a team) on a handle already [`Shmem::at`] its
    /// call: rounds of a reduce-scatter into `m`'s scratch and an all-gather into `dst` (see the
    /// module).
    ///
    /// Inlined on the GPU, where a call would pass the handle through local memory; out of line
    /// on the host, where an unoptimised build of a kernel that calls several reductions would
    /// otherwise keep every copy's locals in one frame of an emulated thread's stack.
    ///
    /// # Safety
    /// As [`Shmem::sum_reduce_block`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    #[cfg_attr(not(target_arch = "nvptx64"), inline(never))]
    unsafe fn reduce_block_with<T: Copy>(
        &self,
        m: &Members,
        dst: *mut T,
        src: *const T,
        count: usize,
        f: impl Fn(T, T) -> T,
    ) {
        let (me, n) = (m.me as usize, m.n as usize);
        let size = core::mem::size_of::<T>();
        // Elements of each PE's piece in a round: its PEs' shares of it fill the scratch.
        let per_pe = m.scratch_bytes as usize / size / n;
        if count > 0 {
            // Both arrays in the heap before anything moves: this PE writes `dst` itself, and the
            // puts would check each piece only as it goes.
            let bytes = (count as u64).saturating_mul(size as u64);
            self.heap_offset(src as u64, bytes, self.my_pe);
            self.heap_offset(dst as u64, bytes, self.my_pe);
        }
        if count > 0 && per_pe == 0 {
            let mut f = Failure::new(ErrorKind::ScratchTooSmall);
            f.address = m.scratch;
            f.size = m.scratch_bytes;
            f.expected = (n * size) as u64;
            self.fail(f);
        }
        let scratch = m.scratch as *mut T;
        let (tid, threads) = (arch::thread_rank_in_block() as usize, arch::block_size() as usize);
        let mut done = 0;
        loop {
            let chunk = (count - done).min(per_pe * n);
            let piece = chunk.div_ceil(n);
            // Piece `j` of this round: elements `done + j * piece ..`, `len(j)` of them.
            let len = |j: usize| chunk.saturating_sub(j * piece).min(piece);
            // Reduce-scatter: piece `j` of this PE's `src` to slot `me` of PE `j`'s scratch, each PE
            // starting at the next one (no PE's link takes every first put at once).
            for k in 0..if chunk > 0 { n } else { 0 } {
                let j = (me + k) % n;
                if len(j) > 0 {
                    // SAFETY: this function's contract; the scratch holds `n * piece` elements
                    // (`piece <= per_pe`), the device API checks the rest.
                    unsafe {
                        self.put_nbi_block(
                            scratch.wrapping_add(me * piece),
                            src.wrapping_add(done + j * piece),
                            len(j),
                            m.pe(j as u32),
                        )
                    };
                }
            }
            // Every PE's shares landed in the scratch (the barrier's quiet and its acquire), and
            // every PE's reads of `src` for this round are done (so `dst` may be `src`).
            self.barrier_members_block(m, true);
            let (mine, at) = (len(me), done + me * piece);
            let mut i = tid;
            while i < mine {
                // SAFETY: slot `k` of the scratch holds PE `k`'s share of this PE's piece (written
                // before the barrier, by the round's puts); `dst + at + i` is in the array.
                unsafe {
                    let mut acc = scratch.wrapping_add(i).read();
                    for k in 1..n {
                        acc = f(acc, scratch.wrapping_add(k * piece + i).read());
                    }
                    dst.wrapping_add(at + i).write(acc);
                }
                i += threads;
            }
            // The block's reduced piece before the thread that puts it reads it.
            arch::sync_threads();
            // All-gather: the piece from this PE's `dst` (symmetric) to every other PE's.
            for k in 1..if mine > 0 { n } else { 0 } {
                // SAFETY: this function's contract; the device API checks the range and the PE.
                unsafe {
                    self.put_nbi_block(
                        dst.wrapping_add(at),
                        dst.wrapping_add(at),
                        mine,
                        m.pe(((me + k) % n) as u32),
                    )
                };
            }
            // Every piece landed everywhere, and every PE is done with the scratch before the next
            // round (or the next collective) writes it.
            self.barrier_members_block(m, true);
            done += chunk;
            if done >= count {
                break;
            }
        }
    }
}

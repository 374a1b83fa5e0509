//! The batch rules: which consecutive WQEs a warp's lanes may execute at once ([`batch_len`],
//! decided by the lanes together in [`batch_len_lanes`]), and where WQEs start among a batch's
//! WQEBBs ([`wqe_starts`]).

use super::batch::LanePlan;
use ibgda_device::arch;

/// Where WQEs start among `avail` consecutive WQEBBs (bit `l`: lane `l`'s WQEBB is a WQE's first),
/// given the lanes whose WQEBB, read as a first one, claims two (`two`): the first WQEBB starts a
/// WQE, and each WQE's WQEBBs follow it. Every lane computes the same mask from the same ballot.
#[inline(always)]
pub fn wqe_starts(two: u32, avail: u32) -> u32 {
    if two == 0 {
        // No WQEBB claims two (the usual batch): every lane starts a WQE, without the serial
        // walk below (a dependent step per lane, a few hundred cycles for a full warp).
        return if avail >= 32 { u32::MAX } else { (1u32 << avail) - 1 };
    }
    let mut starts = 0u32;
    let mut l = 0;
    while l < avail && l < 32 {
        starts |= 1 << l;
        l += if two >> l & 1 != 0 { 2 } else { 1 };
    }
    starts
}

/// How many of `plans[..n]` (consecutive WQEs from the consumer index, one per lane) a warp may
/// execute at once: the longest prefix of batchable WQEs (one-WQEBB WRITEs, READs, atomics and
/// NOPs, every check passed) such that
/// - a WQE with a fence mode comes first or not at all (the batch ends before it, so everything
///   before it has executed when it starts: the fence bit waits for the QP's earlier READs and
///   atomics, and the batch that it starts begins with a system-scope fence);
/// - no WRITE or READ follows an atomic (the lanes execute a batch's data first, then its atomics,
///   so an atomic is never overtaken by a later WRITE and always follows the data posted before
///   it: a signal after its data);
/// - no destination overlaps another WQE's destination or an earlier one's source (an atomic's
///   destination is where its result lands, its source the word it updates). Atomics on the same
///   word are allowed, and so are their results landing in one place (non-fetching atomics on one
///   word share a dummy result slot): the lanes execute them one after another in WQE order.
///
/// Executing such a prefix concurrently leaves memory exactly as executing it in order would. What
/// a concurrent observer may see is weaker than strict order: the WRITEs and READs of one batch
/// take effect in no particular order among themselves, which is what NVSHMEM promises for puts
/// and gets until a `fence` or `quiet` (both wait for completions on this transport). Anything else
/// (a multi-WQEBB WQE, a failing check) ends the batch and goes through the one-at-a-time path,
/// which also produces the exact error CQE.
pub fn batch_len(plans: &[LanePlan], n: usize) -> usize {
    let n = n.min(plans.len());
    let overlaps = |a: u64, alen: u32, b: u64, blen: u32| a < b + blen as u64 && b < a + alen as u64;
    let mut k = 0;
    let mut atomic_before = false;
    'wqes: while k < n {
        let p = &plans[k];
        if !p.batchable || (k > 0 && p.fenced) || (atomic_before && p.moves_data()) {
            break;
        }
        let mut j = 0;
        while j < k {
            let q = &plans[j];
            // A WQE that moves nothing (a NOP, a two-WQEBB WQE's second half) touches no byte.
            if q.len == 0 || p.len == 0 {
                j += 1;
                continue;
            }
            if (overlaps(p.dst, p.len, q.dst, q.len) && !same_word_atomics(p, q))
                || (p.src != 0 && overlaps(p.src, p.len, q.dst, q.len))
                || (q.src != 0 && overlaps(p.dst, p.len, q.src, q.len))
            {
                // An overlap ends the batch like any other rule (the halves check below too).
                break 'wqes;
            }
            j += 1;
        }
        atomic_before |= p.atomic.is_some();
        k += 1;
    }
    // Never between a two-WQEBB WQE's halves.
    if k > 0 && plans[k - 1].wide {
        k -= 1;
    }
    k
}

/// Two atomics on one word (8-byte granule): the lanes run them in WQE order, so where their
/// results land may coincide.
fn same_word_atomics(p: &LanePlan, q: &LanePlan) -> bool {
    p.atomic.is_some() && q.atomic.is_some() && p.src >> 3 == q.src >> 3
}

/// [`batch_len`] computed by the lanes of a warp together, each holding its own plan (lanes at
/// or beyond `avail` hold none). The usual case is decided in a few warp instructions
/// ([`disjoint_at_a_glance`]); otherwise lane `j` checks its WQE against every earlier lane's
/// through shuffles and the first lane that may not join ends the batch. Returns the same `k` in
/// every lane; every lane must call it. Tested against [`batch_len`] on random plans, both ways
/// (`tests/tests/emu_batch_rules.rs`).
pub fn batch_len_lanes(plan: &LanePlan, lane: u32, avail: u32) -> u32 {
    // A WRITE or READ after an atomic, or a fenced WQE after the first, ends the batch too.
    let atomics = arch::ballot(lane < avail && plan.batchable && plan.atomic.is_some());
    let after_atomic = atomics != 0 && lane > atomics.trailing_zeros();
    let bad = arch::ballot(
        lane >= avail || !plan.batchable || (lane > 0 && plan.fenced) || (after_atomic && plan.moves_data()),
    );
    let k0 = if bad == 0 {
        avail.min(32)
    } else {
        bad.trailing_zeros().min(avail)
    };
    if k0 < 2 || (k0 > PAIRWISE_UP_TO && disjoint_at_a_glance(plan, lane, k0)) {
        return whole_wqes(plan, k0);
    }
    let overlaps = |a: u64, alen: u32, b: u64, blen: u32| a < b + blen as u64 && b < a + alen as u64;
    let mut stop = lane >= k0;
    // Only WQEs that move bytes can be overlapped, and the last of them need not be compared
    // with the lanes after it in turn: a `put_signal`'s WRITE, atomic, second half and NOP take
    // one round of shuffles instead of three.
    let movers = arch::ballot(lane < k0 && plan.len != 0);
    let mut others = movers & !(1u32 << (31 - movers.leading_zeros().min(31)));
    while others != 0 {
        let j = others.trailing_zeros();
        others &= others - 1;
        let (dst, src, len) = (
            arch::shfl_idx_u64(plan.dst, j),
            arch::shfl_idx_u64(plan.src, j),
            arch::shfl_idx_u32(plan.len, j),
        );
        let other_atomic = atomics >> j & 1 != 0;
        let same_word = plan.atomic.is_some() && other_atomic && plan.src >> 3 == src >> 3;
        if j < lane
            && plan.len != 0
            && ((overlaps(plan.dst, plan.len, dst, len) && !same_word)
                || (plan.src != 0 && overlaps(plan.src, plan.len, dst, len))
                || (src != 0 && overlaps(plan.dst, plan.len, src, len)))
        {
            stop = true;
        }
    }
    let stops = arch::ballot(stop);
    let k = if stops == 0 { k0 } else { stops.trailing_zeros().min(k0) };
    whole_wqes(plan, k)
}

/// Batches of at most this many WQEBBs (a `put_signal`'s WRITE, atomic and NOP; a lone fetching
/// atomic) skip [`disjoint_at_a_glance`] and compare their few pairs at once: the glance's
/// granule search, `match.any` and span reductions cost more than `k - 1` rounds of shuffles,
/// and such a batch's mixed local and remote addresses rarely pass it anyway.
const PAIRWISE_UP_TO: u32 = 4;

/// `k`, less one when lane `k - 1` holds a two-WQEBB WQE whose second half is outside the first
/// `k` lanes (a batch never splits a WQE). Every lane must call it.
#[inline(always)]
fn whole_wqes(plan: &LanePlan, k: u32) -> u32 {
    let wide = arch::ballot(plan.wide);
    if k > 0 && wide >> (k - 1) & 1 != 0 {
        k - 1
    } else {
        k
    }
}

/// Whether the first `k` lanes' WQEs (all batchable) are certainly free of overlaps, decided
/// without comparing pairs: the destinations form a few runs that rise lane after lane, apart
/// from each other ([`ascending_runs_apart`]), or else each fits in an aligned granule of its own
/// ([`destinations_apart`]); and the sources' span misses the destinations' span. `false` means
/// "compare the pairs", never "they overlap".
fn disjoint_at_a_glance(plan: &LanePlan, lane: u32, k: u32) -> bool {
    // NOPs (nothing to overlap) and lanes outside the batch take no part.
    let mine = lane < k && plan.len > 0;
    let (lo, hi) = if mine {
        (plan.dst, plan.dst + plan.len as u64 - 1)
    } else {
        (0, 0)
    };
    if !ascending_runs_apart(mine, lane, k, lo, hi) && !destinations_apart(mine, lane, lo, hi) {
        return false;
    }
    // The spans of the sources and of the destinations (inline data has no source: a batch of
    // inline WRITEs, `p`s, is decided here).
    let has_src = mine && plan.src != 0;
    if arch::ballot(has_src) == 0 {
        return true;
    }
    let mut span = [
        if mine { plan.dst } else { u64::MAX },
        if mine { hi } else { 0 },
        if has_src { plan.src } else { u64::MAX },
        if has_src { plan.src + plan.len as u64 - 1 } else { 0 },
    ];
    let mut off = 16;
    while off > 0 {
        let other = [
            arch::shfl_idx_u64(span[0], lane ^ off),
            arch::shfl_idx_u64(span[1], lane ^ off),
            arch::shfl_idx_u64(span[2], lane ^ off),
            arch::shfl_idx_u64(span[3], lane ^ off),
        ];
        span = [
            span[0].min(other[0]),
            span[1].max(other[1]),
            span[2].min(other[2]),
            span[3].max(other[3]),
        ];
        off /= 2;
    }
    span[3] < span[0] || span[1] < span[2]
}

/// Most runs [`ascending_runs_apart`] compares pair by pair; a batch of more takes the granules.
const MOST_RUNS: u32 = 8;

/// Whether the first `k` lanes' destinations `lo..=hi` (every one of them `mine`) are apart
/// because they rise lane after lane, each past the previous one's end, or because they form a
/// few runs of back-to-back destinations whose spans miss each other (the usual batch: each
/// poster's consecutive WQEs, a warp's `p`s combined or not, whatever their lengths, in the order
/// the posters reserved). Decided with a shuffle per lane and four per pair of runs, where
/// granules fail such a batch (24-byte WRITEs share every granule that holds them). Every lane
/// must call it.
fn ascending_runs_apart(mine: bool, lane: u32, k: u32, lo: u64, hi: u64) -> bool {
    let prev_hi = arch::shfl_idx_u64(hi, lane.saturating_sub(1));
    if arch::ballot(lane >= k || mine) != u32::MAX {
        return false;
    }
    if arch::ballot(lane < k && lane > 0 && lo <= prev_hi) == 0 {
        // Rising throughout: every destination past the one before it.
        return true;
    }
    // Runs of back-to-back destinations: a run's span then holds its bytes and nothing else (a
    // run that only rose could jump past another poster's WQEs and hold them in its span).
    let starts = arch::ballot(lane < k && (lane == 0 || lo != prev_hi.wrapping_add(1)));
    if starts.count_ones() > MOST_RUNS {
        return false;
    }
    // A run's span: its first lane's start to its last lane's end (the lane before the next run).
    let later = if lane >= 31 {
        0
    } else {
        starts & (u32::MAX << (lane + 1))
    };
    let last = if later == 0 { k - 1 } else { later.trailing_zeros() - 1 };
    let run_hi = arch::shfl_idx_u64(hi, last);
    let leads = starts >> lane & 1 != 0;
    let mut meet = false;
    let mut rest = starts;
    while rest != 0 {
        let other = rest.trailing_zeros();
        rest &= rest - 1;
        let (other_lo, other_hi) = (arch::shfl_idx_u64(lo, other), arch::shfl_idx_u64(run_hi, other));
        meet |= leads && other != lane && lo <= other_hi && other_lo <= run_hi;
    }
    arch::ballot(meet) == 0
}

/// Whether the destinations `lo..=hi` of the lanes holding one (`mine`) each fit in one aligned
/// granule of a size common to them (8 B for `p`-sized WRITEs, 4 KiB for page-sized ones, ...)
/// and no two lanes share a granule (one `match.any`). Every lane must call it.
fn destinations_apart(mine: bool, lane: u32, lo: u64, hi: u64) -> bool {
    // Granules of 8 B, 64 B, 512 B, 4 KiB, then every 16x up to 4 GiB.
    let mut g = 3;
    while arch::ballot(!mine || lo >> g == hi >> g) != u32::MAX {
        g += if g < 12 { 3 } else { 4 };
        if g > 32 {
            return false;
        }
    }
    // Lanes outside the batch match nothing: their keys are distinct and above any granule.
    let key = if mine { lo >> g } else { u64::MAX - lane as u64 };
    // Granules that rise from lane to lane are distinct without a `match.any`, which costs more
    // than the rest of the glance. Any other order (a lane outside the batch between two inside
    // fails it) matches.
    let before = arch::shfl_idx_u64(key, lane.saturating_sub(1));
    let rising = arch::ballot(!mine || lane == 0 || before < key) == u32::MAX;
    if !rising {
        // SAFETY: every lane of the warp reaches this call (this function's callers are called
        // by every lane, and `rising` is the same in every lane).
        let peers = unsafe { arch::match_any_u64(u32::MAX, key) };
        if arch::ballot(mine && peers != 1 << lane) != 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod batch_rules {
    use super::{batch_len, wqe_starts};

    #[test]
    fn wqe_starts_walks_two_wqebb_wqes_and_takes_every_lane_without_them() {
        // The walk, one WQE after another.
        let walk = |two: u32, avail: u32| {
            let (mut starts, mut l) = (0u32, 0);
            while l < avail.min(32) {
                starts |= 1 << l;
                l += if two >> l & 1 != 0 { 2 } else { 1 };
            }
            starts
        };
        let mut x = 0x9e37_79b9u32;
        for avail in 0..=32 {
            assert_eq!(wqe_starts(0, avail), walk(0, avail), "no two-WQEBB WQE, {avail} lanes");
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let two = x & x.rotate_left(7); // sparse, as two-WQEBB WQEs are
                assert_eq!(wqe_starts(two, avail), walk(two, avail), "two {two:#x}, {avail} lanes");
            }
        }
        assert_eq!(
            wqe_starts(0b10, 4),
            0b1011,
            "lane 1's WQE takes lane 2; lane 3 starts the next"
        );
        assert_eq!(wqe_starts(0, 32), u32::MAX);
    }
    use crate::batch::LanePlan;

    fn write(dst: u64, src: u64, len: u32) -> LanePlan {
        LanePlan {
            batchable: true,
            dst,
            src,
            len,
            inline_offset: if src == 0 { 36 } else { 0 },
            ..LanePlan::default()
        }
    }

    #[test]
    fn a_batch_is_the_prefix_of_disjoint_batchable_writes() {
        let plans = [
            write(0, 1000, 8),
            write(8, 1008, 8),
            write(16, 0, 4),
            write(100, 2000, 64),
        ];
        assert_eq!(batch_len(&plans, 4), 4);
        assert_eq!(batch_len(&plans, 2), 2, "never beyond n");
        let mut stop = plans;
        stop[2].batchable = false;
        assert_eq!(
            batch_len(&stop, 4),
            2,
            "a READ, atomic, failing or multi-WQEBB WQE ends it"
        );
    }

    fn add(result: u64, target: u64) -> LanePlan {
        LanePlan {
            batchable: true,
            dst: result,
            src: target,
            len: 8,
            atomic: Some(ibgda_device::ibgda::AtomicOp::add(8, 1)),
            ..LanePlan::default()
        }
    }

    #[test]
    fn a_fence_only_starts_a_batch_and_no_data_follows_an_atomic() {
        let fenced = LanePlan {
            fenced: true,
            ..write(64, 1064, 8)
        };
        assert_eq!(
            batch_len(&[write(0, 1000, 8), fenced], 2),
            1,
            "a fence mid-batch ends it"
        );
        assert_eq!(batch_len(&[fenced, write(0, 1000, 8)], 2), 2, "a fence may start one");
        // Data, then atomics (a put, then its signal), then a NOP: one batch.
        let nop = LanePlan {
            batchable: true,
            ..LanePlan::default()
        };
        assert_eq!(batch_len(&[write(0, 1000, 8), add(2000, 3000), nop], 3), 3);
        // A WRITE after an atomic waits for the next batch.
        assert_eq!(batch_len(&[add(2000, 3000), write(0, 1000, 8)], 2), 1);
        // Atomics on one word share a batch (the lanes run them in WQE order); one whose result
        // lands on another's target does not.
        assert_eq!(batch_len(&[add(2000, 3000), add(2008, 3000)], 2), 2);
        assert_eq!(batch_len(&[add(2000, 3000), add(3000, 4000)], 2), 1);
        // Non-fetching atomics on one word share a dummy result slot: still one batch, run in
        // WQE order. On different words, a shared result slot would leave its last value to the
        // race between them: the batch ends.
        assert_eq!(batch_len(&[add(2000, 3000), add(2000, 3000), add(2000, 3004)], 3), 3);
        assert_eq!(batch_len(&[add(2000, 3000), add(2000, 3008)], 2), 1);
    }

    #[test]
    fn overlaps_end_the_batch_so_order_is_kept() {
        // The same word written twice: the second must land after the first.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(0, 1008, 8)], 2), 1);
        // Partial overlap of destinations.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(4, 1008, 8)], 2), 1);
        // A later WRITE reading what an earlier one writes (a loopback QP).
        assert_eq!(batch_len(&[write(0, 1000, 8), write(64, 4, 8)], 2), 1);
        // An earlier WRITE reading what a later one overwrites.
        assert_eq!(batch_len(&[write(0, 64, 8), write(60, 0, 8)], 2), 1);
        // Adjacent ranges do not overlap.
        assert_eq!(batch_len(&[write(0, 1000, 8), write(8, 1008, 8)], 2), 2);
    }
}

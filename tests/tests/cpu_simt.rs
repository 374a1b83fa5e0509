//! The CPU emulation's warps and blocks (`ibgda_device::arch` on the host): every collective is
//! checked against what the PTX instruction computes, on full, narrow and partial warps, with
//! lanes that exit early and a lane that traps.

use ibgda_device::arch;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Runs `body` on one block of `threads` threads; panics with the block's first panic.
fn block(threads: u32, body: impl Fn() + Sync) {
    if let Some((t, m)) = arch::run_block(0, 1, threads, &body) {
        panic!("thread {t}: {m}");
    }
}

#[test]
fn shape_and_lane_numbering_follow_the_block() {
    for (threads, width) in [(1u32, 1u32), (2, 2), (8, 8), (32, 32), (64, 32), (40, 32)] {
        let seen = Mutex::new(Vec::new());
        block(threads, || {
            seen.lock().unwrap().push((
                arch::thread_idx_x(),
                arch::lane_id(),
                arch::warp_size(),
                arch::block_dim_x(),
                arch::lanemask_lt(),
            ))
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen.len(), threads as usize);
        for (t, (tid, lane, w, dim, lt)) in seen.into_iter().enumerate() {
            assert_eq!((tid, lane, w, dim), (t as u32, t as u32 % width, width, threads));
            assert_eq!(lt, (1u32 << lane) - 1);
        }
    }
}

#[test]
fn ballot_shfl_redux_and_match_compute_what_ptx_does() {
    block(64, || {
        let lane = arch::lane_id();
        let warp = arch::thread_idx_x() / 32;
        // ballot: bit i is lane i's predicate.
        assert_eq!(arch::ballot(lane.is_multiple_of(3)), 0x4924_9249);
        // shfl: every lane reads lane 7's value, then a rotation.
        assert_eq!(arch::shfl_idx_u32(lane * 10 + warp, 7), 70 + warp);
        assert_eq!(arch::shfl_idx_u32(lane, (lane + 1) % 32), (lane + 1) % 32);
        let wide = ((lane as u64) << 40) | 0xdead_beef;
        assert_eq!(arch::shfl_idx_u64(wide, 31), (31u64 << 40) | 0xdead_beef);
        // redux: every lane gets the warp's wrapping sum.
        assert_eq!(arch::redux_add_u32(lane + 100 * warp), 496 + 3200 * warp);
        assert_eq!(arch::redux_add_u32(u32::MAX / 16), (u32::MAX / 16).wrapping_mul(32));
        // match_any over the even lanes only: the odd lanes sit it out.
        if lane.is_multiple_of(2) {
            // SAFETY: every even lane, and only they, make these two calls.
            let m = unsafe { arch::match_any_u64(0x5555_5555, (lane % 8) as u64) };
            assert_eq!(m, 0x0101_0101 << (lane % 8), "lane {lane}");
            assert_eq!(unsafe { arch::shfl_idx_masked_u32(0x5555_5555, lane, 4) }, 4);
        }
        arch::sync_warp();
    });
}

#[test]
fn narrow_warps_are_whole_warps_of_their_width() {
    block(8, || {
        assert_eq!(arch::ballot(true), 0xff);
        assert_eq!(arch::shfl_idx_u32(arch::lane_id(), 3), 3);
        // A source lane past the width wraps, as the shuffle's 0x1f clamp does on a full warp.
        assert_eq!(arch::shfl_idx_u32(arch::lane_id(), 9), 1);
    });
}

#[test]
fn a_partial_warp_has_only_its_lanes() {
    // 40 threads: warp 0 full, warp 1 of 8 lanes.
    block(40, || {
        let b = arch::ballot(true);
        if arch::thread_idx_x() < 32 {
            assert_eq!(b, u32::MAX);
        } else {
            assert_eq!(b, 0xff);
        }
    });
}

#[test]
fn lanes_that_returned_count_as_arrived() {
    block(32, || {
        if arch::lane_id() >= 20 {
            return;
        }
        // The 12 exited lanes neither vote nor hold the barrier.
        assert_eq!(arch::ballot(true), 0x000f_ffff);
        arch::sync_warp();
        arch::sync_threads();
    });
}

#[test]
fn sync_threads_orders_the_whole_block_and_reduces_or() {
    let counter = AtomicU32::new(0);
    block(96, || {
        for round in 1..=20u32 {
            counter.fetch_add(1, Ordering::Relaxed);
            let any = arch::sync_threads_or(arch::thread_idx_x() == round);
            // Everyone's increment of this round happened before anyone left the barrier.
            assert!(counter.load(Ordering::Relaxed) >= round * 96);
            assert!(any, "thread {round} voted true in round {round}");
            let none = arch::sync_threads_or(false);
            assert!(!none);
        }
    });
    assert_eq!(counter.load(Ordering::Relaxed), 20 * 96);
}

#[test]
fn lanes_arriving_together_at_activemask_form_one_group_that_agrees() {
    let sizes = Mutex::new(Vec::new());
    block(32, || {
        for _ in 0..50 {
            arch::sync_warp();
            let group = arch::active_mask();
            assert!(group & (1 << arch::lane_id()) != 0, "a lane is in its own group");
            // Every member saw the same mask: match_any over the group on the mask is the group.
            // SAFETY: the group is the lanes that met at the same activemask, all of which call.
            assert_eq!(unsafe { arch::match_any_u64(group, group as u64) }, group);
            if arch::lane_id() == group.trailing_zeros() {
                sizes.lock().unwrap().push(group.count_ones());
            }
        }
    });
    let sizes = sizes.into_inner().unwrap();
    assert_eq!(
        sizes.iter().sum::<u32>(),
        50 * 32,
        "every lane is in exactly one group per round"
    );
    // After a sync_warp the lanes come together: most rounds form groups wider than one lane.
    let wide = sizes.iter().filter(|&&s| s > 1).count();
    assert!(wide * 2 >= 50, "groups: {sizes:?}");
}

/// Lanes at two `activemask` call sites are diverged on a GPU (two instructions): the emulation
/// never puts them in one group, however close together they arrive, while lanes at one site
/// still come together.
#[test]
fn lanes_at_two_activemask_sites_never_share_a_group() {
    let sizes = Mutex::new(Vec::new());
    block(32, || {
        let odd = arch::lane_id() % 2 == 1;
        for _ in 0..20 {
            arch::sync_warp();
            // Two call sites on purpose: the branches are the same code at two places.
            #[allow(clippy::if_same_then_else)]
            let group = if odd { arch::active_mask() } else { arch::active_mask() };
            let same_parity = if odd { 0xaaaa_aaaau32 } else { 0x5555_5555 };
            assert_eq!(
                group & !same_parity,
                0,
                "lane {} grouped with the other site: {group:#x}",
                arch::lane_id()
            );
            assert!(group & (1 << arch::lane_id()) != 0, "a lane is in its own group");
            if arch::lane_id() == group.trailing_zeros() {
                sizes.lock().unwrap().push(group.count_ones());
            }
        }
    });
    let sizes = sizes.into_inner().unwrap();
    assert_eq!(
        sizes.iter().sum::<u32>(),
        20 * 32,
        "every lane is in exactly one group per round"
    );
    assert!(
        sizes.iter().any(|&s| s > 1),
        "lanes at one site never came together: {sizes:?}"
    );
}

#[test]
fn warp_aggregated_reservation_hands_every_lane_a_distinct_slot() {
    // The shape `Qp::post_with` uses: group by key, the lowest lane reserves for the group, the
    // others read its base through a masked shuffle and add their rank.
    let next = AtomicU64::new(0);
    let taken = Mutex::new(Vec::new());
    block(64, || {
        for i in 0..30u64 {
            let key = (arch::thread_idx_x() as u64 + i) % 3;
            // SAFETY (the three masked calls): every lane of the group makes the same calls.
            let group = unsafe { arch::match_any_u64(arch::active_mask(), key) };
            let rank = (group & arch::lanemask_lt()).count_ones() as u64;
            let mut first = 0u64;
            if rank == 0 {
                first = next.fetch_add(group.count_ones() as u64, Ordering::Relaxed);
            }
            let first = unsafe { arch::shfl_idx_masked_u32(group, first as u32, group.trailing_zeros()) } as u64;
            taken.lock().unwrap().push(first + rank);
            unsafe { arch::sync_lanes(group) };
        }
    });
    let mut taken = taken.into_inner().unwrap();
    taken.sort();
    assert_eq!(taken, (0..64 * 30).collect::<Vec<u64>>());
}

#[test]
fn a_trapping_lane_is_reported_once_and_its_block_unwinds() {
    let reached = AtomicU32::new(0);
    let r = arch::run_block(3, 4, 64, &|| {
        if arch::thread_idx_x() == 37 {
            panic!("lane 37 traps");
        }
        // Everyone else waits for lane 37 at a barrier it never reaches.
        arch::sync_threads();
        reached.fetch_add(1, Ordering::Relaxed);
    });
    let (t, m) = r.expect("the trap is reported");
    assert_eq!((t, m.as_str()), (37, "lane 37 traps"));
    // Either the barrier completed without 37 (it exited) or the block aborted: nobody hangs.
    assert!(reached.load(Ordering::Relaxed) <= 63);
}

#[test]
fn a_collective_naming_a_lane_outside_its_mask_is_refused_clearly() {
    let r = arch::run_block(0, 1, 32, &|| {
        if arch::lane_id() == 5 {
            // SAFETY: deliberately broken (lane 5 is not in the mask): the emulation must refuse it.
            unsafe { arch::sync_lanes(0b1) };
        }
    });
    let (t, m) = r.expect("refused");
    assert_eq!(t, 5);
    assert!(m.contains("sync_lanes with mask 0x1 called by lane 5"), "{m}");
}

//! A warp's `p`s over IBGDA share WQEs when the lanes write consecutive elements (NVSHMEM's `p`
//! combining), in every width, and land exactly: each thread's element holds its last value and
//! no element between them is touched. Lanes that do not write consecutive elements in lane
//! order, or post through different QPs, each post their own WQE. `Mutant::CombinedAcrossGaps`
//! (a lane joins the previous lane's WQE whatever its address) must fail the check.
//!
//! Its own test binary, because the mutant switch is process-wide.

use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::arch::{self, Mutant};
use ibgda_kernels::{p_lane_slot, p_lane_value};
use ibgda_tests::group::{Link, PeGroup};
use std::time::Duration;

const THREADS: u32 = 64;
const ROUNDS: u32 = 6;
const FILL: u8 = 0xee;

/// WQEs executed on PE 0's QPs to PE 1 so far.
fn wqes(w: &PeGroup) -> u64 {
    let (ib, _) = w.pe(0).emulated_nic().expect("IBGDA peers");
    (0..2)
        .map(|i| ib.emulated_qp(1, i).expect("QP").stats().unwrap().wqes_executed)
        .sum()
}

/// Runs `ibgda_test_p_lanes` for one width and pattern; returns the WQEs it took and whether
/// PE 1's elements are exactly what the threads wrote last (and nothing else changed).
fn run(w: &mut PeGroup, size: u32, pattern: u32) -> (u64, Result<(), String>) {
    let elems = (p_lane_slot(THREADS - 1, 2) + 32) as usize;
    let dst = w.malloc::<u8>(elems * size as usize).unwrap();
    w.write(1, &dst, 0, &vec![FILL; elems * size as usize]).unwrap();
    let before = wqes(w);
    let wr = &*w;
    wr.launch_grid(1, THREADS, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_test_p_lanes(st, wr.ptr(0, &dst).unwrap() as *mut u8, size, pattern, ROUNDS, 1);
        }
    })
    .unwrap();
    let took = wqes(w) - before;
    let got = w.read(1, &dst, 0, elems * size as usize).unwrap();
    let mut want = vec![FILL; got.len()];
    for t in 0..THREADS {
        let at = (p_lane_slot(t, pattern) * size) as usize;
        let v = p_lane_value(t, ROUNDS - 1).to_le_bytes();
        want[at..at + size as usize].copy_from_slice(&v[..size as usize]);
    }
    w.free(&dst).unwrap();
    let check = if got == want {
        Ok(())
    } else {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        Err(format!("{size}-byte p, pattern {pattern}: first wrong byte {first}"))
    };
    (took, check)
}

#[test]
fn a_warps_consecutive_ps_share_wqes_and_every_value_lands_whole() {
    let options = IbgdaOptions {
        qps_per_peer: 2,
        log_depth: 6,
        ..Default::default()
    };
    let mut w = PeGroup::cpu(2, 1 << 20, Duration::from_secs(20), Link::Ibgda(options)).unwrap();
    let ps = (THREADS * ROUNDS) as u64;
    for size in [1u32, 2, 4, 8] {
        for pattern in 0..4 {
            let (took, check) = run(&mut w, size, pattern);
            check.unwrap();
            match pattern {
                // Consecutive: 3 to 8 values a WQE when the lanes meet (they do after a
                // `sync_warp`, bar slow threads on a loaded machine, which only split a group).
                0 => assert!(took < ps, "{size}-byte p, consecutive: {took} WQEs for {ps} p's"),
                // Runs of at most five.
                2 => assert!(took < ps, "{size}-byte p, gaps: {took} WQEs for {ps} p's"),
                // Descending addresses, or neighbours on different QPs: nothing combines.
                _ => assert_eq!(took, ps, "{size}-byte p, pattern {pattern}"),
            }
        }
    }

    // SAFETY: this test binary runs nothing else; the broken run writes only its own world.
    unsafe { arch::set_mutant(Mutant::CombinedAcrossGaps, true) };
    let (_, broken) = run(&mut w, 8, 2);
    // SAFETY: as above.
    unsafe { arch::set_mutant(Mutant::CombinedAcrossGaps, false) };
    assert!(broken.is_err(), "the check must catch lanes combined across a gap");
    run(&mut w, 8, 2).1.unwrap();
}

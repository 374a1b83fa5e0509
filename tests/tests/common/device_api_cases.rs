// The device-API cases shared by every CPU transport. Included by `cpu_device_api.rs` (P2P) and
// `cpu_ibgda_device_api.rs` (IBGDA on the emulated mlx5 device), each of which defines
// `world_with(n_pes, heap_size, timeout)`.

use ibgda::abi::{ErrorKind, WaitKind};
use ibgda::Error;
use ibgda_tests::group::GroupBuffer;
use ibgda_kernels::{fault, scope};
use ibgda_tests::random_bytes;
use std::time::Duration;

fn world(n: u32) -> PeGroup {
    world_with(n, 4 << 20, Duration::from_secs(20))
}

/// The grid each scope's cases run on: whole warps of 32 CPU threads (thread scope too, so that
/// the lanes of a warp post together and IBGDA's warp-aggregated posting runs), and blocks of two
/// warps.
fn grid_for(sc: u32) -> (u32, u32) {
    match sc {
        scope::THREAD => (2, 32),
        _ => (2, 64),
    }
}

#[test]
fn put_and_get_every_scope_and_alignment_match_byte_for_byte() {
    for n_pes in [2u32, 3] {
        for sc in [scope::THREAD, scope::WARP, scope::BLOCK] {
            let (blocks, threads) = grid_for(sc);
            for nbi in [0u32, 1] {
                let mut w = world(n_pes);
                let bytes = 100_003usize; // odd length: chunks start at every alignment
                let src = w.malloc::<u8>(bytes).unwrap();
                let dst = w.malloc::<u8>(bytes).unwrap();
                let got = w.malloc::<u8>(bytes).unwrap();
                for pe in 0..n_pes {
                    w.write(pe, &src, 0, &random_bytes(pe as u64 * 7 + sc as u64, bytes))
                        .unwrap();
                }
                let (s, d, g) = (src.clone(), dst.clone(), got.clone());
                let wr = &w;
                wr.launch_grid(blocks, threads, |pe, st| unsafe {
                    let next = (pe + 1) % n_pes;
                    ibgda_kernels::ibgda_test_put(
                        st,
                        sc,
                        nbi,
                        wr.ptr(pe, &d).unwrap() as *mut u8,
                        wr.ptr(pe, &s).unwrap() as *const u8,
                        bytes as u64,
                        next,
                    );
                })
                .unwrap();
                wr.launch_grid(blocks, threads, |pe, st| unsafe {
                    let prev = (pe + n_pes - 1) % n_pes;
                    ibgda_kernels::ibgda_test_get(
                        st,
                        sc,
                        nbi,
                        wr.ptr(pe, &g).unwrap() as *mut u8,
                        wr.ptr(pe, &s).unwrap() as *const u8,
                        bytes as u64,
                        prev,
                    );
                })
                .unwrap();
                for pe in 0..n_pes {
                    let prev = (pe + n_pes - 1) % n_pes;
                    let want = random_bytes(prev as u64 * 7 + sc as u64, bytes);
                    assert_eq!(
                        w.read(pe, &dst, 0, bytes).unwrap(),
                        want,
                        "put: pe {pe} scope {sc} nbi {nbi}"
                    );
                    assert_eq!(
                        w.read(pe, &got, 0, bytes).unwrap(),
                        want,
                        "get: pe {pe} scope {sc} nbi {nbi}"
                    );
                }
            }
        }
    }
}

#[test]
fn atomics_from_many_threads_are_exact() {
    atomics_are_exact(8, 1, 200);
}

#[test]
fn atomics_from_whole_warps_are_exact() {
    // Two warps of 32 lanes: every lane's atomic is posted by a warp-aggregated group.
    atomics_are_exact(2, 32, 12);
}

fn atomics_are_exact(grid_blocks: u32, threads: u32, iters: u32) {
    let mut w = world(2);
    let issuers = grid_blocks * threads;
    let words = w.malloc::<u64>(6 + issuers as usize).unwrap();
    let tickets = w.malloc::<u64>(issuers as usize).unwrap();
    let wr = &w;
    // Only PE 0 issues, targeting PE 1.
    wr.launch_grid(grid_blocks, threads, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_test_atomics(
                st,
                wr.ptr(0, &words).unwrap() as *mut u64,
                wr.ptr(0, &tickets).unwrap() as *mut u64,
                1,
                iters,
            );
        }
    })
    .unwrap();
    let v = w.read(1, &words, 0, 6).unwrap();
    let total = (issuers * iters) as u64;
    assert_eq!(v[0], total, "u64 fetch_add");
    assert_eq!(v[1] & 0xffff_ffff, total, "u32 add");
    assert_eq!(v[1] >> 32, 0, "u32 add must not carry into the next word");
    assert_eq!(v[2], total, "compare_swap increments");
    assert_eq!(v[3] as i64, -(total as i64), "i64 add of -1 (and no p/g mismatch)");
    // swap: the final value plus everything swapped out is every id 1..=issuers and the initial 0.
    let ids: u64 = (1..=issuers as u64).fold(0, |a, b| a ^ b);
    assert_eq!(v[4] ^ v[5], ids, "swap returned every value exactly once");
    let mut t = w.read(0, &tickets, 0, issuers as usize).unwrap();
    t.sort();
    t.dedup();
    assert_eq!(t.len(), issuers as usize, "fetch_add returned distinct tickets");
    assert!(t.iter().all(|&x| x < total));
    let pg = w.read(1, &words, 6, issuers as usize).unwrap();
    assert_eq!(
        pg,
        (0..issuers as u64).map(|i| i * 3 + 1).collect::<Vec<_>>(),
        "p landed on PE 1"
    );
}

#[test]
fn barrier_all_orders_every_pe_round_after_round() {
    for n in [2u32, 4] {
        let mut w = world(n);
        let slots = w.malloc::<u64>(n as usize).unwrap();
        let errors = w.malloc::<u64>(1).unwrap();
        let wr = &w;
        wr.launch(1, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_barrier(
                st,
                wr.ptr(pe, &slots).unwrap() as *mut u64,
                wr.ptr(pe, &errors).unwrap() as *mut u64,
                100,
            );
        })
        .unwrap();
        for pe in 0..n {
            assert_eq!(
                w.read(pe, &errors, 0, 1).unwrap()[0],
                0,
                "pe {pe} saw a slot not yet written after a barrier"
            );
            assert_eq!(w.read(pe, &slots, 0, n as usize).unwrap(), vec![100; n as usize]);
        }
    }
}

#[test]
fn put_signal_ring_delivers_data_before_signal() {
    let n = 3u32;
    let mut w = world(n);
    let bytes = 65_537usize;
    let (src, dst, fetched) = (
        w.malloc::<u8>(bytes).unwrap(),
        w.malloc::<u8>(bytes).unwrap(),
        w.malloc::<u8>(bytes).unwrap(),
    );
    let sig = w.malloc::<u64>(1).unwrap();
    for pe in 0..n {
        w.write(pe, &src, 0, &random_bytes(100 + pe as u64, bytes)).unwrap();
    }
    let wr = &w;
    wr.launch(4, |pe, st| unsafe {
        ibgda_kernels::ibgda_test_put_signal(
            st,
            wr.ptr(pe, &dst).unwrap() as *mut u8,
            wr.ptr(pe, &src).unwrap() as *const u8,
            wr.ptr(pe, &fetched).unwrap() as *mut u8,
            bytes as u64,
            wr.ptr(pe, &sig).unwrap() as *mut u64,
        );
    })
    .unwrap();
    for pe in 0..n {
        let want = random_bytes(100 + ((pe + n - 1) % n) as u64, bytes);
        assert_eq!(w.read(pe, &dst, 0, bytes).unwrap(), want);
        assert_eq!(w.read(pe, &fetched, 0, bytes).unwrap(), want);
        assert_eq!(w.read(pe, &sig, 0, 1).unwrap()[0], 4, "one signal add per block");
    }
}

#[test]
fn a_signal_on_a_keyed_queue_lands_after_every_blocks_rows_without_a_quiet() {
    // Many small puts from four blocks on one key, then one signal from whichever block finishes
    // last: the signal must never be seen before all the rows (the queues deliver in order).
    let n = 3u32;
    for (round, key) in [(0u64, 0u32), (1, 5)] {
        let mut w = world(n);
        let bytes = 48 * 1024 + 7;
        let (src, dst, seen) = (
            w.malloc::<u8>(bytes).unwrap(),
            w.malloc::<u8>(bytes).unwrap(),
            w.malloc::<u8>(bytes).unwrap(),
        );
        let (sig, tickets) = (w.malloc::<u64>(1).unwrap(), w.malloc::<u64>(1).unwrap());
        for pe in 0..n {
            w.write(pe, &src, 0, &random_bytes(400 + 10 * round + pe as u64, bytes)).unwrap();
        }
        let wr = &w;
        wr.launch(4, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_keyed_rows_then_signal(
                st,
                wr.ptr(pe, &dst).unwrap() as *mut u8,
                wr.ptr(pe, &src).unwrap() as *const u8,
                bytes as u64,
                512,
                key,
                wr.ptr(pe, &seen).unwrap() as *mut u8,
                wr.ptr(pe, &sig).unwrap() as *mut u64,
                wr.ptr(pe, &tickets).unwrap() as *mut u64,
            );
        })
        .unwrap();
        for pe in 0..n {
            let want = random_bytes(400 + 10 * round + ((pe + n - 1) % n) as u64, bytes);
            let got = w.read(pe, &seen, 0, bytes).unwrap();
            let first_bad = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(first_bad, None, "PE {pe}, key {key}: data not yet there when the signal was");
            assert_eq!(w.read(pe, &sig, 0, 1).unwrap()[0], 1);
        }
    }
}

#[test]
fn put_bulk_from_one_thread_per_block_delivers_every_byte() {
    let n = 3u32;
    let mut w = world(n);
    let bytes = (1 << 20) + 13;
    let (src, dst) = (w.malloc::<u8>(bytes).unwrap(), w.malloc::<u8>(bytes).unwrap());
    for pe in 0..n {
        w.write(pe, &src, 0, &random_bytes(300 + pe as u64, bytes)).unwrap();
    }
    let wr = &w;
    wr.launch(5, |pe, st| unsafe {
        ibgda_kernels::ibgda_test_put_bulk(
            st,
            wr.ptr(pe, &dst).unwrap() as *mut u8,
            wr.ptr(pe, &src).unwrap() as *const u8,
            bytes as u64,
        );
    })
    .unwrap();
    for pe in 0..n {
        let from = (pe + n - 1) % n;
        assert_eq!(w.read(pe, &dst, 0, bytes).unwrap(), random_bytes(300 + from as u64, bytes), "PE {pe}");
    }
}

/// Runs one fault kernel on PE 0 (PE 1 idle) and returns the error plus whether any heap changed.
fn fault(mode: u32, timeout: Duration, at: impl Fn(&PeGroup, &GroupBuffer<u64>) -> u64) -> (Error, bool) {
    let mut w = world_with(2, 1 << 20, timeout);
    let buf = w.malloc::<u64>(16).unwrap();
    for pe in 0..2 {
        w.write(pe, &buf, 0, &[0x5a5a_5a5a_5a5a_5a5a; 16]).unwrap();
    }
    let before: Vec<Vec<u8>> = (0..2).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
    let addr = at(&w, &buf);
    let e = w
        .launch(1, |pe, st| unsafe {
            if pe == 0 {
                ibgda_kernels::ibgda_test_fault(st, mode, addr as *mut u8, 1);
            }
        })
        .unwrap_err();
    let changed = (0..2).any(|pe| w.heap_snapshot(pe).unwrap() != before[pe as usize]);
    (e, changed)
}

#[test]
fn invalid_pe_is_reported_and_writes_nothing() {
    let (e, changed) = fault(fault::INVALID_PE, Duration::from_secs(5), |w, b| w.ptr(0, b).unwrap());
    assert_eq!(e.device_kind(), Some(ErrorKind::InvalidPe), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!((r.pe, r.observed, r.expected), (0, 2, 2));
    assert!(e.to_string().contains("invalid PE 2 (n_pes = 2)"), "{e}");
    assert!(!changed);
}

#[test]
fn address_outside_heap_is_reported_and_writes_nothing() {
    let (e, changed) = fault(fault::OUTSIDE_HEAP, Duration::from_secs(5), |w, b| {
        w.ptr(0, b).unwrap() - b.offset() + w.heap_size() - 8
    });
    assert_eq!(e.device_kind(), Some(ErrorKind::OutsideHeap), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!((r.peer, r.size, r.expected), (1, 64, 1 << 20));
    assert!(e.to_string().contains("outside the symmetric heap"), "{e}");
    assert!(!changed);
}

#[test]
fn address_below_heap_is_reported() {
    let (e, changed) = fault(fault::BELOW_HEAP, Duration::from_secs(5), |w, b| {
        w.ptr(0, b).unwrap() - b.offset() - 64
    });
    assert_eq!(e.device_kind(), Some(ErrorKind::OutsideHeap), "{e}");
    assert!(!changed);
}

#[test]
fn misaligned_atomic_is_reported_and_writes_nothing() {
    let (e, changed) = fault(fault::MISALIGNED_ATOMIC, Duration::from_secs(5), |w, b| {
        w.ptr(0, b).unwrap()
    });
    assert_eq!(e.device_kind(), Some(ErrorKind::MisalignedAtomic), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!((r.size, r.address % 8, r.peer), (8, 4, 1));
    assert!(e.to_string().contains("misaligned 8-byte atomic"), "{e}");
    assert!(!changed);
}

#[test]
fn signal_wait_times_out_with_attribution() {
    let (e, changed) = fault(fault::SIGNAL_TIMEOUT, Duration::from_millis(200), |w, b| {
        w.ptr(0, b).unwrap()
    });
    assert_eq!(e.device_kind(), Some(ErrorKind::Timeout), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!(r.detail & 0xff, WaitKind::Signal as u32);
    assert_eq!((r.pe, r.expected, r.observed), (0, u64::MAX, 0x5a5a_5a5a_5a5a_5a5a));
    assert!(r.elapsed_ns >= 200_000_000, "{}", r.elapsed_ns);
    let s = e.to_string();
    assert!(
        s.contains("timeout on PE 0 after") && s.contains("signal_wait_until"),
        "{s}"
    );
    assert!(!changed);
}

#[test]
fn wait_until_compares_signed_words_as_signed_and_times_out_with_attribution() {
    let (e, changed) = fault(fault::WAIT_UNTIL_TIMEOUT, Duration::from_millis(200), |w, b| {
        w.ptr(0, b).unwrap()
    });
    assert_eq!(e.device_kind(), Some(ErrorKind::Timeout), "{e}");
    let r = e.device_record().unwrap();
    assert_eq!(r.detail & 0xff, WaitKind::WaitUntil as u32);
    assert_eq!((r.pe, r.expected, r.observed), (0, -5i64 as u64, 0x5a5a_5a5a_5a5a_5a5a));
    assert!(r.elapsed_ns >= 200_000_000, "{}", r.elapsed_ns);
    let s = e.to_string();
    assert!(s.contains("timeout on PE 0 after") && s.contains("wait_until(word at"), "{s}");
    assert!(!changed);
}

#[test]
fn p_and_wait_until_ping_pong_completes_every_round() {
    let mut w = world(2);
    let flag = w.malloc::<u64>(1).unwrap();
    let iters = 300u32;
    let wr = &w;
    wr.launch(1, |pe, st| unsafe {
        ibgda_kernels::ibgda_p_pingpong(st, wr.ptr(pe, &flag).unwrap() as *mut u64, 1 - pe, iters);
    })
    .unwrap();
    for pe in 0..2 {
        assert_eq!(w.read(pe, &flag, 0, 1).unwrap()[0], iters as u64, "PE {pe}");
    }
}

#[test]
fn barrier_with_a_missing_pe_times_out_naming_arrivals() {
    let mut w = world_with(2, 1 << 20, Duration::from_millis(200));
    let slots = w.malloc::<u64>(2).unwrap();
    let errors = w.malloc::<u64>(1).unwrap();
    let wr = &w;
    let e = wr
        .launch(1, |pe, st| unsafe {
            if pe == 0 {
                ibgda_kernels::ibgda_test_barrier(
                    st,
                    wr.ptr(0, &slots).unwrap() as *mut u64,
                    wr.ptr(0, &errors).unwrap() as *mut u64,
                    1,
                );
            }
        })
        .unwrap_err();
    let r = e.device_record().expect("device error");
    assert_eq!(r.detail, WaitKind::Barrier as u32);
    assert_eq!((r.expected, r.observed), (2, 1), "PE 0 arrived at itself only");
    assert!(e.to_string().contains("barrier_all"), "{e}");
}

#[test]
fn abi_mismatch_is_refused() {
    let w = world(1);
    let st = w.pe(0).state();
    let mut bad = unsafe { *st };
    bad.version += 1;
    let e = w
        .launch(1, |_, _| unsafe {
            ibgda_kernels::ibgda_p_rate(&bad, std::ptr::null_mut(), 0, 0, 1);
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::AbiMismatch), "{e}");
    assert!(e.to_string().contains("ABI mismatch"), "{e}");
}

#[test]
fn host_side_bad_inputs_are_clear_errors() {
    let mut w = world_with(2, 64 << 10, Duration::from_secs(1));
    let a = w.malloc::<u8>(1000).unwrap();
    assert!(matches!(w.malloc::<u8>(1 << 20), Err(Error::HeapExhausted { requested, .. }) if requested == 1 << 20));
    assert!(matches!(w.free_offset(a.offset() + 8), Err(Error::ForeignFree { .. })));
    assert!(matches!(
        w.pe(0).read(a.on(1), 0, 1),
        Err(Error::ForeignBuffer { pe: 0, .. })
    ));
    assert!(matches!(w.read(0, &a, 990, 20), Err(Error::OutOfBounds { .. })));
    w.free(&a).unwrap();
    assert!(matches!(w.free(&a), Err(Error::ForeignFree { .. })));
}

/// What the collective `which` leaves in PE `pe`'s `dst` (`share` bytes a PE), from every PE's
/// `src` contents `data` and `dst`'s `fill` before the call.
fn collective_result(which: u32, data: &[Vec<u8>], pe: usize, share: usize, root: usize, fill: u8) -> Vec<u8> {
    use ibgda_kernels::collective;
    let n = data.len();
    match which {
        collective::ALLTOALL => (0..n).flat_map(|j| data[j][pe * share..(pe + 1) * share].to_vec()).collect(),
        collective::BROADCAST => {
            let mut v = data[root][..share].to_vec();
            v.resize(n * share, fill);
            v
        }
        _ => (0..n).flat_map(|j| data[j][..share].to_vec()).collect(),
    }
}

#[test]
fn collectives_deliver_every_pes_share_to_every_pe() {
    use ibgda_kernels::collective;
    for n_pes in [2u32, 3, 4] {
        let n = n_pes as usize;
        let mut w = world(n_pes);
        // Bytes and 8-byte words (an element offset taken as a byte offset would show), an odd
        // count so the shares start at every alignment, and none at all (moves nothing).
        for (width, count) in [(1usize, 1_001usize), (8, 125), (8, 0)] {
            let share = width * count;
            let src = w.malloc::<u8>((n * share).max(8)).unwrap();
            let dst = w.malloc::<u8>((n * share).max(8)).unwrap();
            for which in [collective::ALLTOALL, collective::BROADCAST, collective::FCOLLECT] {
                // Twice each (the second call into the same `dst`, after the host's barrier
                // between the launches), with the root moving.
                for round in 0..2u32 {
                    let root = (round + n_pes - 1) % n_pes;
                    let seed = |pe: u32| 7_000 + width as u64 * 1_000 + which as u64 * 100 + round as u64 * 10 + pe as u64;
                    let data: Vec<Vec<u8>> = (0..n_pes).map(|pe| random_bytes(seed(pe), n * share)).collect();
                    for pe in 0..n_pes {
                        w.write(pe, &src, 0, &data[pe as usize]).unwrap();
                        w.write(pe, &dst, 0, &vec![0xee; n * share]).unwrap();
                    }
                    let (s, d) = (src.clone(), dst.clone());
                    let wr = &w;
                    // Two blocks: block 1 returns at once (one block a PE calls a collective).
                    wr.launch_grid(2, 64, |pe, st| unsafe {
                        ibgda_kernels::ibgda_test_collective(
                            st,
                            which,
                            width as u32,
                            wr.ptr(pe, &d).unwrap() as *mut u8,
                            wr.ptr(pe, &s).unwrap() as *const u8,
                            count as u64,
                            root,
                        );
                    })
                    .unwrap();
                    for pe in 0..n {
                        let want = collective_result(which, &data, pe, share, root as usize, 0xee);
                        assert!(
                            w.read(pe as u32, &dst, 0, n * share).unwrap() == want,
                            "collective {which}, {n_pes} PEs, {count} elements of {width} bytes, round {round}: \
                             PE {pe}'s dst differs"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_collective_past_the_heap_or_with_no_such_root_is_reported_by_name() {
    use ibgda_kernels::collective;
    let mut w = world_with(2, 1 << 20, Duration::from_secs(5));
    let buf = w.malloc::<u8>(64).unwrap();
    let before: Vec<Vec<u8>> = (0..2).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
    // Every PE's first share starts 32 bytes before the end of its heap and is 64 bytes long.
    let wr = &w;
    let e = wr
        .launch(1, |pe, st| unsafe {
            let end = wr.ptr(pe, &buf).unwrap() - buf.offset() + wr.heap_size();
            let src = wr.ptr(pe, &buf).unwrap();
            ibgda_kernels::ibgda_test_collective(
                st,
                collective::ALLTOALL,
                1,
                (end - 32 - 64 * pe as u64) as *mut u8,
                src as *const u8,
                64,
                0,
            );
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::OutsideHeap), "{e}");
    assert!(e.to_string().contains("alltoall_block"), "{e}");
    assert!((0..2).all(|pe| w.heap_snapshot(pe).unwrap() == before[pe as usize]));
    // A device error ends the job: the next case in a fresh one.
    let w = world_with(2, 1 << 20, Duration::from_secs(5));
    let e = w
        .launch(1, |_, st| unsafe {
            ibgda_kernels::ibgda_test_collective(st, collective::BROADCAST, 1, core::ptr::null_mut(), core::ptr::null(), 8, 2);
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::InvalidPe), "{e}");
    assert!(e.to_string().contains("broadcast_block"), "{e}");
}

include!("reduce_model.rs");
include!("bitwise_model.rs");
include!("team_cases.rs");
include!("waits_cases.rs");

#[test]
fn reductions_leave_every_pes_fold_in_every_pe() {
    use ibgda_kernels::reduce::{self, ty};
    let arith = [reduce::SUM, reduce::PROD, reduce::MIN, reduce::MAX];
    let every = [reduce::SUM, reduce::PROD, reduce::MIN, reduce::MAX, reduce::AND, reduce::OR, reduce::XOR];
    for n_pes in [2u32, 3, 4] {
        let n = n_pes as usize;
        let mut w = world(n_pes);
        // The world's 4 MiB heaps keep 64 KiB of scratch: 40,003 i32 take three rounds (about
        // 16,384 elements a round at any PE count); 1,001 bytes start each PE's piece at every
        // alignment; 1 and 5 elements leave some PEs no piece (5 on 4 PEs: 2, 2, 1, 0); 0
        // elements only synchronise.
        let cases: Vec<(u32, &[u32], usize)> = vec![
            (ty::U8, &every, 1_001),
            (ty::I32, &every, 40_003),
            (ty::U64, &[reduce::XOR, reduce::SUM], 3_001),
            (ty::F32, &arith, 2_049),
            (ty::F64, &[reduce::SUM, reduce::MAX], 20_001),
            (ty::U64, &[reduce::SUM, reduce::MIN], 1),
            (ty::U8, &[reduce::MAX, reduce::XOR], 5),
            (ty::I32, &[reduce::SUM], 0),
        ];
        let most = 40_003 * 8;
        let src = w.malloc::<u8>(most).unwrap();
        let dst = w.malloc::<u8>(most).unwrap();
        for (case, &(ty, ops, count)) in cases.iter().enumerate() {
            for &op in ops {
                // In place (dst = src) on odd cases' last op, apart otherwise.
                let in_place = case % 2 == 1 && count > 0 && op == *ops.last().unwrap();
                let inputs = reduce_inputs(ty, n, count, 900 + case as u64 * 10 + op as u64);
                let bytes = inputs[0].len();
                for pe in 0..n_pes {
                    w.write(pe, &src, 0, &inputs[pe as usize]).unwrap();
                    if !in_place {
                        w.write(pe, &dst, 0, &vec![0xee; bytes.max(8)]).unwrap();
                    }
                }
                let (s, d) = (src.clone(), if in_place { src.clone() } else { dst.clone() });
                let wr = &w;
                // Two blocks: block 1 returns at once (one block a PE calls a reduction).
                wr.launch_grid(2, 64, |pe, st| unsafe {
                    ibgda_kernels::ibgda_test_reduce(
                        st,
                        op,
                        ty,
                        wr.ptr(pe, &d).unwrap() as *mut u8,
                        wr.ptr(pe, &s).unwrap() as *const u8,
                        count as u64,
                    );
                })
                .unwrap();
                let want = if count == 0 { vec![0xee; 8] } else { reduce_expected(op, ty, &inputs) };
                for pe in 0..n_pes {
                    let got = w.read(pe, &d, 0, want.len()).unwrap();
                    assert!(
                        got == want,
                        "reduction {op} of type {ty}, {n_pes} PEs, {count} elements (in place: {in_place}): PE {pe}'s dst differs \
                         at byte {:?}",
                        got.iter().zip(&want).position(|(a, b)| a != b)
                    );
                }
            }
        }
    }
}

#[test]
fn a_reduction_past_the_heap_is_reported_by_name_and_writes_nothing() {
    use ibgda_kernels::reduce::{self, ty};
    let mut w = world_with(2, 1 << 20, Duration::from_secs(5));
    let buf = w.malloc::<u8>(64).unwrap();
    let before: Vec<Vec<u8>> = (0..2).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
    let wr = &w;
    // `dst`'s last 8 of 64 bytes lie past the heap, on every PE.
    let e = wr
        .launch(1, |pe, st| unsafe {
            let end = wr.ptr(pe, &buf).unwrap() - buf.offset() + wr.heap_size();
            ibgda_kernels::ibgda_test_reduce(
                st,
                reduce::MAX,
                ty::U64,
                (end - 56) as *mut u8,
                wr.ptr(pe, &buf).unwrap() as *const u8,
                8,
            );
        })
        .unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::OutsideHeap), "{e}");
    assert!(e.to_string().contains("max_reduce_block"), "{e}");
    assert!((0..2).all(|pe| w.heap_snapshot(pe).unwrap() == before[pe as usize]));
}

#[test]
fn bitwise_atomics_are_exact_and_ordered_from_a_whole_block() {
    for n_pes in [2u32, 3] {
        let mut w = world(n_pes);
        let words = w.malloc::<u64>(6).unwrap();
        let olds = w.malloc::<u64>(3 * 64).unwrap();
        for pe in 0..n_pes {
            w.write(pe, &words, 0, &bitwise_initial()).unwrap();
        }
        // Every PE's 64 threads at its next PE's words (over the transport under test).
        let wr = &w;
        wr.launch_grid(1, 64, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_bitwise(
                st,
                wr.ptr(pe, &words).unwrap() as *mut u64,
                wr.ptr(pe, &olds).unwrap() as *mut u64,
                (pe + 1) % n_pes,
            );
        })
        .unwrap();
        for pe in 0..n_pes {
            let prev = (pe + n_pes - 1) % n_pes;
            let got = w.read(pe, &words, 0, 6).unwrap();
            let seen = w.read(prev, &olds, 0, 3 * 64).unwrap();
            if let Err(e) = check_bitwise(64, &got, &seen) {
                panic!("{n_pes} PEs, PE {prev}'s atomics at PE {pe}: {e}");
            }
        }
    }
}

#[test]
fn strided_puts_and_gets_move_every_element_and_only_those() {
    let n_pes = 3u32;
    let mut w = world(n_pes);
    let words = 4_096usize;
    let (a, b) = (w.malloc::<u64>(words).unwrap(), w.malloc::<u64>(words).unwrap());
    let fill = |pe: u32, i: usize| (pe as u64 + 1) << 40 | i as u64;
    // (get, u64, dst stride, src stride, count): strides of 1 (contiguous), 3 and 7, a zero source
    // stride (one value everywhere), 1,000 elements, u32 elements.
    for &(get, wide, ds, ss, count) in &[
        (0u32, 1u32, 1usize, 1usize, 37usize),
        (0, 1, 3, 7, 500),
        (0, 1, 7, 0, 300),
        (0, 0, 5, 2, 1_000),
        (1, 1, 1, 1, 37),
        (1, 1, 7, 3, 500),
        (1, 0, 2, 5, 700),
        (0, 1, 1, 1, 0),
    ] {
        for pe in 0..n_pes {
            w.write(pe, &a, 0, &(0..words).map(|i| fill(pe, i)).collect::<Vec<_>>()).unwrap();
            w.write(pe, &b, 0, &vec![UNTOUCHED_WORD; words]).unwrap();
        }
        let wr = &w;
        // Each PE's target is the next PE: iput from its `a` into the next PE's `b`; iget from the
        // next PE's `a` into its own `b`.
        wr.launch(1, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_strided(
                st,
                get,
                wide,
                wr.ptr(pe, &b).unwrap() as *mut u8,
                wr.ptr(pe, &a).unwrap() as *const u8,
                ds as u64,
                ss as u64,
                count as u64,
                (pe + 1) % n_pes,
            );
        })
        .unwrap();
        for pe in 0..n_pes {
            // The PE whose `b` was written, and whose `a` was read.
            let (holder, source) = if get == 1 { (pe, (pe + 1) % n_pes) } else { ((pe + 1) % n_pes, pe) };
            let src_words: Vec<u64> = (0..words).map(|i| fill(source, i)).collect();
            let mut want = vec![UNTOUCHED_WORD; words];
            if wide == 1 {
                for i in 0..count {
                    want[i * ds] = src_words[i * ss];
                }
            } else {
                let (src32, want32): (&[u32], &mut [u32]) = (bytemuck::cast_slice(&src_words), bytemuck::cast_slice_mut(&mut want));
                for i in 0..count {
                    want32[i * ds] = src32[i * ss];
                }
            }
            let got = w.read(holder, &b, 0, words).unwrap();
            assert!(
                got == want,
                "get {get}, wide {wide}, strides {ds}/{ss}, {count} elements: PE {holder}'s b differs at word {:?}",
                got.iter().zip(&want).position(|(x, y)| x != y)
            );
        }
    }
    // A span that runs past the heap's end (its first ten elements inside) is refused before any
    // element moves.
    // (get, stride, count): 11 elements 2 apart from 20 words before the heap's end; two
    // elements `usize::MAX` apart (the span overflows: it must not wrap to a small one).
    for (get, stride, count) in [(0u32, 2u64, 11u64), (1, 2, 11), (0, u64::MAX, 2), (1, u64::MAX, 2)] {
        // A fresh job each: only a PE's first device error is kept.
        let mut w = world(n_pes);
        let (a, b) = (w.malloc::<u64>(words).unwrap(), w.malloc::<u64>(words).unwrap());
        let before: Vec<Vec<u8>> = (0..n_pes).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
        let wr = &w;
        let e = wr
            .launch(1, |pe, st| unsafe {
                let end = wr.ptr(pe, &b).unwrap() - b.offset() + wr.heap_size();
                let (near_end, local) = (end - 8 * 20, wr.ptr(pe, &a).unwrap());
                let (d, s) = if get == 0 { (near_end, local) } else { (local, near_end) };
                if pe == 0 {
                    ibgda_kernels::ibgda_test_strided(st, get, 1, d as *mut u8, s as *const u8, stride, stride, count, 1);
                }
            })
            .unwrap_err();
        assert_eq!(e.device_kind(), Some(ErrorKind::OutsideHeap), "{e}");
        assert!(e.to_string().contains(if get == 0 { "in iput:" } else { "in iget:" }), "{e}");
        assert!((0..n_pes).all(|pe| w.heap_snapshot(pe).unwrap() == before[pe as usize]), "nothing moved");
    }
}

const UNTOUCHED_WORD: u64 = 0xdddd_dddd_dddd_dddd;

#[test]
fn atomic_increments_count_every_thread_once() {
    for n_pes in [2u32, 3] {
        let mut w = world(n_pes);
        let word = w.malloc::<u64>(2).unwrap();
        let threads = 2 * 64;
        let out = w.malloc::<u64>(threads).unwrap();
        let wr = &w;
        // Every PE's threads increment PE 1's words.
        wr.launch_grid(2, 64, |pe, st| unsafe {
            ibgda_kernels::ibgda_test_inc(st, wr.ptr(pe, &word).unwrap() as *mut u64, wr.ptr(pe, &out).unwrap() as *mut u64, 1);
        })
        .unwrap();
        let total = threads as u64 * n_pes as u64;
        assert_eq!(w.read(1, &word, 0, 2).unwrap(), vec![total, total], "{n_pes} PEs");
        let mut fetched: Vec<u64> = (0..n_pes).flat_map(|pe| w.read(pe, &out, 0, threads).unwrap()).collect();
        fetched.sort_unstable();
        assert_eq!(fetched, (0..total).collect::<Vec<_>>(), "each value fetched once");
    }
}


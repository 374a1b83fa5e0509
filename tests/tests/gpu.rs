//! The device API's data path on real GPUs: puts and gets at every scope, atomics, barriers and
//! signals, random mixed traffic against a host model, stream-ordered puts, bulk puts and a
//! warp's combined `p`s; two PEs (one per GPU, or both on one GPU), over whichever transport
//! `IBGDA_TRANSPORT` selects (P2P by default; `ibgda` runs every test through the emulated mlx5
//! device's GPU engine, `IBGDA_DOORBELL=cpu` with CPU-assisted doorbells). Each test prints
//! "skipped: no CUDA device" without a GPU, and fails instead when `IBGDA_REQUIRE_GPU=1`. Faults:
//! `gpu_faults.rs`; module loading: `gpu_modules.rs`; collectives, reductions, teams and
//! multi-word waits: `gpu/collectives.rs`.

use ibgda::abi::TransportKind;
use ibgda::{run_in_process, Error, KernelArg};
use ibgda_kernels::scope;
use ibgda_tests::{gpu_config, gpu_or_skip, grid, launch_bundled as launch, random_bytes};
use rand::{Rng, SeedableRng};

/// The collectives, reductions, teams and multi-word waits on a GPU.
#[path = "gpu/collectives.rs"]
mod collectives;

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_put_get_every_scope_byte_for_byte() {
    if !gpu_or_skip("gpu_put_get_every_scope_byte_for_byte", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let n = pe.n_pes();
        let bytes = 8 * 1024 * 1024 + 13;
        let src = pe.malloc::<u8>(bytes)?;
        let dst = pe.malloc::<u8>(bytes)?;
        let got = pe.malloc::<u8>(bytes)?;
        let me = pe.my_pe();
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        for sc in [scope::THREAD, scope::WARP, scope::BLOCK] {
            for nbi in [0u32, 1] {
                let seed = 1000 + sc as u64 * 10 + nbi as u64;
                pe.write(&src, 0, &random_bytes(seed + me as u64, bytes))?;
                pe.barrier()?;
                let st = pe.state_ptr();
                let (d, s, g) = (pe.ptr(&dst)?, pe.ptr(&src)?, pe.ptr(&got)?);
                let nb = bytes as u64;
                launch(
                    pe,
                    "ibgda_test_put",
                    grid(64, 256),
                    &[
                        st.into(),
                        sc.into(),
                        nbi.into(),
                        d.into(),
                        s.into(),
                        nb.into(),
                        next.into(),
                    ],
                )?;
                pe.barrier()?;
                launch(
                    pe,
                    "ibgda_test_get",
                    grid(64, 256),
                    &[
                        st.into(),
                        sc.into(),
                        nbi.into(),
                        g.into(),
                        s.into(),
                        nb.into(),
                        prev.into(),
                    ],
                )?;
                pe.barrier()?;
                let want = random_bytes(seed + prev as u64, bytes);
                assert!(
                    pe.read(&dst, 0, bytes)? == want,
                    "put mismatch: PE {me} scope {sc} nbi {nbi}"
                );
                assert!(
                    pe.read(&got, 0, bytes)? == want,
                    "get mismatch: PE {me} scope {sc} nbi {nbi}"
                );
                pe.barrier()?;
            }
        }
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_atomics_from_thousands_of_threads_are_exact() {
    if !gpu_or_skip("gpu_atomics_from_thousands_of_threads_are_exact", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        // Every thread's compare-and-swap loops contend on two words: O(threads^2) attempts,
        // each a NIC round trip over IBGDA or the proxy, so those transports get fewer contenders.
        let nic = matches!(
            pe.transport_to(1 - pe.my_pe()),
            Some(TransportKind::Ibgda | TransportKind::Proxy)
        );
        let (blocks, threads, iters) = if nic {
            (4u32, 64u32, 4u32)
        } else {
            (32u32, 256u32, 16u32)
        };
        let nthreads = (blocks * threads) as usize;
        let words = pe.malloc::<u64>(6 + nthreads)?;
        let tickets = pe.malloc::<u64>(nthreads)?;
        pe.barrier()?;
        let peer = 1 - pe.my_pe();
        let (st, w, t) = (pe.state_ptr(), pe.ptr(&words)?, pe.ptr(&tickets)?);
        launch(
            pe,
            "ibgda_test_atomics",
            grid(blocks, threads),
            &[st.into(), w.into(), t.into(), peer.into(), iters.into()],
        )?;
        pe.barrier()?;
        // Each PE was the target of the other's atomics.
        let v = pe.read(&words, 0, 6)?;
        let total = nthreads as u64 * iters as u64;
        assert_eq!(v[0], total, "u64 fetch_add");
        assert_eq!(v[1], total, "u32 add, no carry into the upper half");
        assert_eq!(v[2], total, "compare_swap increments");
        assert_eq!(
            v[3] as i64,
            -(total as i64),
            "i64 add -1 (and every p/g round trip matched)"
        );
        let ids: u64 = (1..=nthreads as u64).fold(0, |a, b| a ^ b);
        assert_eq!(v[4] ^ v[5], ids, "swap handed out every value exactly once");
        let pg = pe.read(&words, 6, nthreads)?;
        assert!(pg.iter().enumerate().all(|(i, &x)| x == i as u64 * 3 + 1), "p values");
        let mut tk = pe.read(&tickets, 0, nthreads)?;
        tk.sort();
        tk.dedup();
        assert_eq!(tk.len(), nthreads, "fetch_add tickets are distinct");
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_barrier_and_put_signal_ring() {
    if !gpu_or_skip("gpu_barrier_and_put_signal_ring", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let n = pe.n_pes() as usize;
        let slots = pe.malloc::<u64>(n)?;
        let errors = pe.malloc::<u64>(1)?;
        let (st, sl, er, rounds) = (pe.state_ptr(), pe.ptr(&slots)?, pe.ptr(&errors)?, 1000u32);
        launch(
            pe,
            "ibgda_test_barrier",
            grid(1, 1),
            &[st.into(), sl.into(), er.into(), rounds.into()],
        )?;
        pe.synchronize()?;
        assert_eq!(pe.read(&errors, 0, 1)?[0], 0, "a slot was stale after barrier_all");
        assert_eq!(pe.read(&slots, 0, n)?, vec![rounds as u64; n]);

        let bytes = 4 * 1024 * 1024 + 7;
        let (src, dst, fetched, sig) = (
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u64>(1)?,
        );
        let me = pe.my_pe();
        pe.write(&src, 0, &random_bytes(77 + me as u64, bytes))?;
        pe.barrier()?;
        let (d, s, f, g, nb) = (
            pe.ptr(&dst)?,
            pe.ptr(&src)?,
            pe.ptr(&fetched)?,
            pe.ptr(&sig)?,
            bytes as u64,
        );
        launch(
            pe,
            "ibgda_test_put_signal",
            grid(8, 512),
            &[st.into(), d.into(), s.into(), f.into(), nb.into(), g.into()],
        )?;
        pe.barrier()?;
        let prev = (me + pe.n_pes() - 1) % pe.n_pes();
        let want = random_bytes(77 + prev as u64, bytes);
        assert!(pe.read(&dst, 0, bytes)? == want, "put_signal data");
        assert!(pe.read(&fetched, 0, bytes)? == want, "get after signal");
        assert_eq!(pe.read(&sig, 0, 1)?[0], 8);
        Ok(())
    })
    .unwrap();
}

include!("common/bitwise_model.rs");

/// The bitwise atomics from 64 threads of each PE to the other's words: the final words and
/// that each word's fetched old values form one order of the threads' operations.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_bitwise_atomics_are_exact_and_ordered() {
    if !gpu_or_skip("gpu_bitwise_atomics_are_exact_and_ordered", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (words, olds) = (pe.malloc::<u64>(6)?, pe.malloc::<u64>(3 * 64)?);
        pe.write(&words, 0, &bitwise_initial())?;
        pe.barrier()?;
        let peer = 1 - pe.my_pe();
        let args = [
            pe.state_ptr().into(),
            pe.ptr(&words)?.into(),
            pe.ptr(&olds)?.into(),
            peer.into(),
        ];
        launch(pe, "ibgda_test_bitwise", grid(1, 64), &args)?;
        pe.synchronize()?;
        pe.barrier()?;
        // This PE's words took the peer's atomics, and its olds are what its own atomics saw at
        // the peer's words: `check_bitwise` checks the two apart (the final words against the
        // threads' effect, the olds for one order), so each PE checks both halves it holds.
        let got = pe.read(&words, 0, 6)?;
        let mine = pe.read(&olds, 0, 3 * 64)?;
        pe.barrier()?;
        if let Err(e) = check_bitwise(64, &got, &mine) {
            panic!("PE {}: {e}", pe.my_pe());
        }
        Ok(())
    })
    .unwrap();
}

/// Strided puts and gets and the atomic increments on a GPU (two PEs): 500 `u64`s put 7 apart
/// from a source 3 apart and got back 5 apart, and 512 threads of each PE incrementing PE 1's
/// words, checked against the host's values.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_strided_rma_and_increments_are_exact() {
    if !gpu_or_skip("gpu_strided_rma_and_increments_are_exact", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, peer) = (pe.my_pe(), 1 - pe.my_pe());
        let words = 4_096usize;
        let (a, b) = (pe.malloc::<u64>(words)?, pe.malloc::<u64>(words)?);
        let fill = |w: u32, i: usize| (w as u64 + 1) << 40 | i as u64;
        const UNTOUCHED: u64 = 0xdddd_dddd_dddd_dddd;
        let strided = |get: u32, ds: u64, ss: u64, count: u64| -> ibgda::Result<()> {
            pe.write(&a, 0, &(0..words).map(|i| fill(me, i)).collect::<Vec<_>>())?;
            pe.write(&b, 0, &vec![UNTOUCHED; words])?;
            pe.barrier()?;
            let args = [
                pe.state_ptr().into(),
                get.into(),
                1u32.into(),
                pe.ptr(&b)?.into(),
                pe.ptr(&a)?.into(),
                ds.into(),
                ss.into(),
                count.into(),
                peer.into(),
            ];
            launch(pe, "ibgda_test_strided", grid(1, 32), &args)?;
            pe.synchronize()?;
            pe.barrier()
        };
        strided(0, 7, 3, 500)?;
        let got = pe.read(&b, 0, words)?;
        let want: Vec<u64> = (0..words)
            .map(|j| {
                if j % 7 == 0 && j / 7 < 500 {
                    fill(peer, j / 7 * 3)
                } else {
                    UNTOUCHED
                }
            })
            .collect();
        assert!(got == want, "PE {me}: the peer's iput");
        strided(1, 5, 3, 500)?;
        let got = pe.read(&b, 0, words)?;
        let want: Vec<u64> = (0..words)
            .map(|j| {
                if j % 5 == 0 && j / 5 < 500 {
                    fill(peer, j / 5 * 3)
                } else {
                    UNTOUCHED
                }
            })
            .collect();
        assert!(got == want, "PE {me}: the iget from the peer");
        let (word, out) = (pe.malloc::<u64>(2)?, pe.malloc::<u64>(512)?);
        pe.write(&out, 0, &[u64::MAX; 512])?;
        pe.barrier()?;
        let args = [
            pe.state_ptr().into(),
            pe.ptr(&word)?.into(),
            pe.ptr(&out)?.into(),
            1u32.into(),
        ];
        launch(pe, "ibgda_test_inc", grid(2, 256), &args)?;
        pe.synchronize()?;
        pe.barrier()?;
        if me == 1 {
            assert_eq!(pe.read(&word, 0, 2)?, vec![1024, 1024], "every increment counted");
        }
        let mut fetched = pe.read(&out, 0, 512)?;
        fetched.sort_unstable();
        fetched.dedup();
        assert_eq!(fetched.len(), 512, "PE {me}: every thread fetched a value of its own");
        assert!(
            fetched.iter().all(|&v| v < 1024),
            "PE {me}: a fetched value past the count (or none written)"
        );
        Ok(())
    })
    .unwrap();
}

/// Random puts, gets, atomics and fetching atomics from 8192 threads (8 each, 65,536 operations a
/// launch) in both directions, checked byte for byte against a host model, over several launches:
/// over IBGDA that is ~33,000 WQEs per QP per launch, so the 16-bit WQE counters wrap (checked).
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_random_traffic_matches_a_host_model() {
    if !gpu_or_skip("gpu_random_traffic_matches_a_host_model", 1) {
        return;
    }
    const BLOCKS: u32 = 64;
    const THREADS: u32 = 128;
    const PER: usize = 8;
    const SLOT: usize = 64;
    const SRC: usize = 1 << 20;
    const COUNTERS: usize = 256;
    const ROUNDS: u64 = 3;
    let n_threads = (BLOCKS * THREADS) as usize;
    let n_ops = n_threads * PER;
    // Two QPs per peer (NVSHMEM's default), so that each QP carries more than 65,536 WQEs over the
    // rounds and wraps its 16-bit WQE counter (the check at the end); the job-sized default would
    // spread them over 32.
    let mut config = gpu_config();
    config.qps_per_peer_auto = false;
    config.ibgda.qps_per_peer = 2;
    run_in_process(2, config, |pe| {
        ibgda_bundled::load(pe)?;
        let me = pe.my_pe();
        let peer = 1 - me;
        let ops = pe.malloc::<u64>(n_ops * 4)?;
        let src = pe.malloc::<u8>(SRC)?;
        let dst = pe.malloc::<u8>(n_ops * SLOT)?;
        let got = pe.malloc::<u8>(n_ops * SLOT)?;
        let counters = pe.malloc::<u64>(COUNTERS)?;
        let fetched = pe.malloc::<u64>(n_ops)?;
        for round in 0..ROUNDS {
            // Each PE's program and source data, reproducible by the other PE for checking.
            let program = |pe_id: u32| {
                let mut r = rand::rngs::StdRng::seed_from_u64(round * 1000 + pe_id as u64);
                let src: Vec<u8> = (0..SRC).map(|_| r.random()).collect();
                let mut table = Vec::with_capacity(n_ops * 4);
                for op in 0..n_ops {
                    let kind = r.random_range(0..4u64);
                    let len = r.random_range(1..=SLOT as u64);
                    let a = r.random_range(0..(SRC - SLOT) as u64);
                    let (a, b, c) = match kind {
                        0 | 1 => (a, (op * SLOT) as u64, 0),
                        2 => (0, r.random_range(0..COUNTERS as u64), r.random_range(1..1000u64)),
                        _ => (
                            op as u64,
                            r.random_range(0..COUNTERS as u64),
                            r.random_range(1..1000u64),
                        ),
                    };
                    table.extend([kind | len << 8, a, b, c]);
                }
                (src, table)
            };
            let (my_src, my_ops) = program(me);
            let (peer_src, peer_ops) = program(peer);
            pe.write(&ops, 0, &my_ops)?;
            pe.write(&src, 0, &my_src)?;
            pe.write(&dst, 0, &vec![0u8; n_ops * SLOT])?;
            pe.write(&got, 0, &vec![0u8; n_ops * SLOT])?;
            pe.write(&counters, 0, &[0u64; COUNTERS])?;
            pe.barrier()?;
            let args: [KernelArg; 9] = [
                pe.state_ptr().into(),
                pe.ptr(&ops)?.into(),
                (PER as u32).into(),
                pe.ptr(&src)?.into(),
                pe.ptr(&dst)?.into(),
                pe.ptr(&got)?.into(),
                pe.ptr(&counters)?.into(),
                pe.ptr(&fetched)?.into(),
                peer.into(),
            ];
            launch(pe, "ibgda_test_random_ops", grid(BLOCKS, THREADS), &args)?;
            pe.barrier()?;
            // Model: what the peer's program did to us, and what ours fetched.
            let (dst_now, got_now) = (pe.read(&dst, 0, n_ops * SLOT)?, pe.read(&got, 0, n_ops * SLOT)?);
            let mut want_dst = vec![0u8; n_ops * SLOT];
            let mut want_counters = [0u64; COUNTERS];
            for op in peer_ops.chunks_exact(4) {
                let (kind, len) = (op[0] & 0xff, (op[0] >> 8) as usize);
                match kind {
                    0 => want_dst[op[2] as usize..][..len].copy_from_slice(&peer_src[op[1] as usize..][..len]),
                    2 | 3 => want_counters[op[2] as usize] += op[3],
                    _ => {}
                }
            }
            assert!(
                dst_now == want_dst,
                "PE {me} round {round}: put data differs from the model"
            );
            let mut want_got = vec![0u8; n_ops * SLOT];
            for op in my_ops.chunks_exact(4) {
                if op[0] & 0xff == 1 {
                    let len = (op[0] >> 8) as usize;
                    want_got[op[2] as usize..][..len].copy_from_slice(&peer_src[op[1] as usize..][..len]);
                }
            }
            assert!(
                got_now == want_got,
                "PE {me} round {round}: get data differs from the model"
            );
            assert_eq!(
                pe.read(&counters, 0, COUNTERS)?,
                want_counters.to_vec(),
                "PE {me} round {round}: atomic sums"
            );
            // Fetched values: distinct per counter and below the final value (every add is > 0).
            let fetched_now = pe.read(&fetched, 0, n_ops)?;
            let mut seen = std::collections::HashSet::new();
            for op in my_ops.chunks_exact(4).filter(|op| op[0] & 0xff == 3) {
                let old = fetched_now[op[1] as usize];
                let fin = peer_counters_final(&my_ops, op[2]);
                assert!(old < fin, "PE {me}: fetched {old} >= final {fin} of counter {}", op[2]);
                assert!(
                    seen.insert((op[2], old)),
                    "PE {me}: two fetch_adds saw {old} on counter {}",
                    op[2]
                );
            }
            pe.barrier()?;
        }
        if pe.transport_to(peer) == Some(TransportKind::Ibgda) {
            let stats = pe.gpu()?.ibgda().expect("IBGDA transport").qp_stats()?;
            eprintln!("PE {me} QPs after {ROUNDS} rounds: {stats:?}");
            assert!(
                stats.iter().all(|s| s.consumed > 65_536 && s.consumed == s.posted),
                "every QP wrapped its 16-bit WQE counter and drained: {stats:?}"
            );
        }
        if pe.transport_to(peer) == Some(TransportKind::Proxy) {
            let stats = pe.gpu()?.ibgda().and_then(|g| g.proxy()).expect("proxy").stats();
            eprintln!("PE {me} proxy threads after {ROUNDS} rounds: {stats:?}");
            let taken: u64 = stats.iter().map(|s| s.descriptors).sum();
            assert!(
                taken >= ROUNDS * n_ops as u64,
                "every operation went through the proxy: {taken} descriptors for {} operations",
                ROUNDS * n_ops as u64
            );
        }
        Ok(())
    })
    .unwrap();
}

/// The final value of counter `c` on the peer: the sum of our adds to it.
fn peer_counters_final(my_ops: &[u64], c: u64) -> u64 {
    my_ops
        .chunks_exact(4)
        .filter(|op| op[0] & 0xff >= 2 && op[2] == c)
        .map(|op| op[3])
        .sum()
}

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_put_on_stream_copies_to_the_peer_and_refuses_bad_inputs() {
    if !gpu_or_skip("gpu_put_on_stream_copies_to_the_peer_and_refuses_bad_inputs", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, peer) = (pe.my_pe(), 1 - pe.my_pe());
        let bytes = (8 << 20) + 13;
        let src = pe.malloc::<u8>(bytes)?;
        let dst = pe.malloc::<u8>(bytes)?;
        pe.write(&src, 0, &random_bytes(700 + me as u64, bytes))?;
        pe.barrier()?;
        let r = pe.put_on_stream(&dst, 5, &src, 3, bytes - 8, peer);
        if pe.transport_to(peer) == Some(TransportKind::P2p) {
            r?;
            pe.synchronize()?;
            pe.barrier()?;
            let got = pe.read(&dst, 0, bytes)?;
            let sent = random_bytes(700 + peer as u64, bytes);
            assert_eq!(&got[5..bytes - 3], &sent[3..bytes - 5], "PE {me}");
            assert!(got[..5].iter().all(|&b| b == 0) && got[bytes - 3..].iter().all(|&b| b == 0));
        } else {
            assert!(
                matches!(r, Err(Error::PeerUnreachable { peer: p, .. }) if p == peer),
                "{r:?}"
            );
            pe.barrier()?;
        }
        let n = pe.n_pes();
        assert!(matches!(pe.put_on_stream(&dst, 0, &src, 0, 8, n), Err(Error::InvalidPe { pe: p, .. }) if p == n));
        assert!(matches!(
            pe.put_on_stream(&dst, 1, &src, 0, bytes, peer),
            Err(Error::OutOfBounds {
                call: "put_on_stream",
                ..
            })
        ));
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_put_bulk_from_one_thread_per_block_delivers_every_byte() {
    if !gpu_or_skip("gpu_put_bulk_from_one_thread_per_block_delivers_every_byte", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let bytes = (8 << 20) + 13;
        let src = pe.malloc::<u8>(bytes)?;
        let dst = pe.malloc::<u8>(bytes)?;
        pe.write(&src, 0, &random_bytes(900 + me as u64, bytes))?;
        pe.barrier()?;
        let args: [KernelArg; 4] = [
            pe.state_ptr().into(),
            pe.ptr(&dst)?.into(),
            pe.ptr(&src)?.into(),
            (bytes as u64).into(),
        ];
        launch(pe, "ibgda_test_put_bulk", grid(7, 128), &args)?;
        pe.barrier()?;
        let from = (me + n - 1) % n;
        assert_eq!(
            pe.read(&dst, 0, bytes)?,
            random_bytes(900 + from as u64, bytes),
            "PE {me}"
        );
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_p_to_consecutive_words_shares_wqes_and_every_value_lands_whole() {
    if !gpu_or_skip("gpu_p_to_consecutive_words_shares_wqes_and_every_value_lands_whole", 1) {
        return;
    }
    use ibgda_kernels::{p_lane_slot, p_lane_value};
    const THREADS: u32 = 512;
    const ROUNDS: u32 = 8;
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let elems = (p_lane_slot(THREADS - 1, 2) + 32) as usize;
        let dst = pe.malloc::<u8>(elems * 8)?;
        let over_nic = pe.transport_to(next) == Some(TransportKind::Ibgda);
        // QPs per peer (two PEs: every QP of this PE goes to the other).
        let qps = match pe.gpu()?.ibgda() {
            Some(g) if over_nic => g.qp_stats()?.len(),
            _ => 0,
        };
        // WQEs this PE's QPs executed so far, once the engine's pass has published them.
        let wqes = |pe: &ibgda::Pe| -> ibgda::Result<u64> {
            let read = || -> ibgda::Result<u64> {
                let stats = pe.gpu()?.ibgda().expect("IBGDA transport").qp_stats()?;
                Ok(stats.iter().map(|s| s.wqes_executed).sum())
            };
            let mut last = read()?;
            for _ in 0..100 {
                std::thread::sleep(std::time::Duration::from_millis(2));
                let now = read()?;
                if now == last {
                    break;
                }
                last = now;
            }
            Ok(last)
        };
        for size in [1u32, 2, 4, 8] {
            for pattern in 0..4u32 {
                pe.write(&dst, 0, &vec![0xeeu8; elems * 8])?;
                pe.barrier()?;
                let before = if over_nic { wqes(pe)? } else { 0 };
                let args: [KernelArg; 6] = [
                    pe.state_ptr().into(),
                    pe.ptr(&dst)?.into(),
                    size.into(),
                    pattern.into(),
                    ROUNDS.into(),
                    next.into(),
                ];
                launch(pe, "ibgda_test_p_lanes", grid(2, THREADS / 2), &args)?;
                pe.barrier()?;
                let mut want = vec![0xeeu8; elems * 8];
                for t in 0..THREADS {
                    let at = (p_lane_slot(t, pattern) * size) as usize;
                    let v = p_lane_value(t, ROUNDS - 1).to_le_bytes();
                    want[at..at + size as usize].copy_from_slice(&v[..size as usize]);
                }
                assert!(
                    pe.read(&dst, 0, elems * 8)? == want,
                    "PE {me}: {size}-byte p's from PE {prev}, pattern {pattern}"
                );
                if over_nic {
                    let (took, ps) = (wqes(pe)? - before, (THREADS * ROUNDS) as u64);
                    eprintln!("PE {me}: {size}-byte p, pattern {pattern}: {took} WQEs for {ps} p's");
                    match pattern {
                        // A warp's lanes meet at the p after a warp barrier: 3 to 8 values a WQE.
                        0 => assert!(took * 2 <= ps, "PE {me}: {size}-byte p, consecutive: {took} WQEs"),
                        2 => assert!(took < ps, "PE {me}: {size}-byte p, gaps: {took} WQEs"),
                        // Descending addresses; or keys 0 and 1 on two QPs (one QP per peer
                        // would put both keys on it, and its lanes would combine).
                        1 => assert_eq!(took, ps, "PE {me}: {size}-byte p, descending"),
                        _ if qps >= 2 => assert_eq!(took, ps, "PE {me}: {size}-byte p, two keyed QPs"),
                        _ => assert!(took <= ps, "PE {me}: {size}-byte p, one QP"),
                    }
                }
                pe.barrier()?;
            }
        }
        Ok(())
    })
    .unwrap();
}

//! The device API's collectives, reductions, teams and multi-word waits on real GPUs (a module of
//! `gpu.rs`, same layouts and rules): every PE's result checked against the host's.

use ibgda::run_in_process;
use ibgda_tests::{gpu_config, gpu_or_skip, grid, launch_bundled as launch, random_bytes};

include!("../common/reduce_model.rs");

/// The collectives (`alltoall_block`, `broadcast_block`, `fcollect_block`) by one block a PE,
/// shares of 1 MiB and a few bytes or words, each twice into the same `dst` with the root moving,
/// checked byte for byte on every PE.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_collectives_deliver_every_pes_share_to_every_pe() {
    if !gpu_or_skip("gpu_collectives_deliver_every_pes_share_to_every_pe", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, n_pes) = (pe.my_pe(), pe.n_pes());
        let n = n_pes as usize;
        for (width, count) in [(1usize, (1usize << 20) + 3), (8, (1 << 17) + 3)] {
            let share = width * count;
            let (src, dst) = (pe.malloc::<u8>(n * share)?, pe.malloc::<u8>(n * share)?);
            let seed = |which: u32, round: u32, p: u32| {
                9_000 + width as u64 * 1_000 + which as u64 * 100 + round as u64 * 10 + p as u64
            };
            for which in [
                ibgda_kernels::collective::ALLTOALL,
                ibgda_kernels::collective::BROADCAST,
                ibgda_kernels::collective::FCOLLECT,
            ] {
                for round in 0..2u32 {
                    let root = (round + n_pes - 1) % n_pes;
                    pe.write(&src, 0, &random_bytes(seed(which, round, me), n * share))?;
                    pe.write(&dst, 0, &vec![0xeeu8; n * share])?;
                    pe.barrier()?;
                    let (st, d, s) = (pe.state_ptr(), pe.ptr(&dst)?, pe.ptr(&src)?);
                    launch(
                        pe,
                        "ibgda_test_collective",
                        // 256 threads: the kernel's registers allow no more in a block.
                        grid(2, 256),
                        &[
                            st.into(),
                            which.into(),
                            (width as u32).into(),
                            d.into(),
                            s.into(),
                            (count as u64).into(),
                            root.into(),
                        ],
                    )?;
                    pe.synchronize()?;
                    let data: Vec<Vec<u8>> = (0..n_pes)
                        .map(|p| random_bytes(seed(which, round, p), n * share))
                        .collect();
                    let me = me as usize;
                    let want: Vec<u8> = match which {
                        ibgda_kernels::collective::ALLTOALL => (0..n)
                            .flat_map(|j| data[j][me * share..(me + 1) * share].to_vec())
                            .collect(),
                        ibgda_kernels::collective::BROADCAST => {
                            let mut v = data[root as usize][..share].to_vec();
                            v.resize(n * share, 0xee);
                            v
                        }
                        _ => (0..n).flat_map(|j| data[j][..share].to_vec()).collect(),
                    };
                    assert!(
                        pe.read(&dst, 0, n * share)? == want,
                        "collective {which}, {width}-byte elements, round {round}: PE {me}'s dst differs"
                    );
                    pe.barrier()?;
                }
            }
        }
        Ok(())
    })
    .unwrap();
}

/// The reductions by one block a PE: 4 MiB and 12 bytes of `i32` (five rounds of the default 1 MiB scratch),
/// `f64` sums (bit for bit: each element is folded in PE order), bytes, and a `u64` minimum in
/// place, checked on every PE against the host's fold.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_reductions_leave_every_pes_fold_in_every_pe() {
    if !gpu_or_skip("gpu_reductions_leave_every_pes_fold_in_every_pe", 1) {
        return;
    }
    use ibgda_kernels::reduce::{self, ty};
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let (me, n) = (pe.my_pe(), pe.n_pes() as usize);
        let cases = [
            (ty::I32, reduce::SUM, (1usize << 20) + 3, false),
            (ty::I32, reduce::MAX, (1 << 20) + 3, false),
            (ty::F64, reduce::SUM, (1 << 17) + 3, false),
            (ty::U8, reduce::XOR, 1_001, false),
            (ty::U64, reduce::MIN, 4_099, true),
        ];
        let (src, dst) = (pe.malloc::<u8>(8 << 20)?, pe.malloc::<u8>(8 << 20)?);
        for (case, &(ty, op, count, in_place)) in cases.iter().enumerate() {
            let inputs = reduce_inputs(ty, n, count, 5_000 + case as u64);
            pe.write(&src, 0, &inputs[me as usize])?;
            pe.write(&dst, 0, &vec![0xeeu8; inputs[0].len()])?;
            pe.barrier()?;
            let d = if in_place { pe.ptr(&src)? } else { pe.ptr(&dst)? };
            let args = [
                pe.state_ptr().into(),
                op.into(),
                ty.into(),
                d.into(),
                pe.ptr(&src)?.into(),
                (count as u64).into(),
            ];
            launch(pe, "ibgda_test_reduce", grid(2, 256), &args)?;
            pe.synchronize()?;
            let got = pe.read(if in_place { &src } else { &dst }, 0, inputs[0].len())?;
            assert!(
                got == reduce_expected(op, ty, &inputs),
                "reduction {op} of type {ty}, {count} elements (in place: {in_place}): PE {me}'s dst differs"
            );
            pe.barrier()?;
        }
        Ok(())
    })
    .unwrap();
}

/// Teams on a GPU (two PEs): each PE's one-PE team and the pair as a team of its own; a sum over
/// the PE's own team then over the pair with nothing between (each team's own scratch), an
/// all-to-all and a barrier over the pair, checked against the host's values.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_teams_reduce_exchange_and_synchronise_their_members() {
    if !gpu_or_skip("gpu_teams_reduce_exchange_and_synchronise_their_members", 1) {
        return;
    }
    use ibgda_kernels::team as mode;
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let me = pe.my_pe();
        let world = pe.team_world();
        let singles = [
            pe.team_split_strided(world, 0, 1, 1)?,
            pe.team_split_strided(world, 1, 1, 1)?,
        ];
        let pair = pe.team_split_strided(world, 0, 1, 2)?;
        let count = (1usize << 18) + 3;
        let (src, dst) = (pe.malloc::<u64>(2 * count)?, pe.malloc::<u64>(2 * count)?);
        let value =
            |w: u32, i: usize| ((w as u64 + 1) * 0x1_0000_0001) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        pe.write(&src, 0, &(0..2 * count).map(|i| value(me, i)).collect::<Vec<_>>())?;
        let run = |m: u32, t: ibgda::abi::Team, o: ibgda::abi::Team, n: usize, root: u32| -> ibgda::Result<()> {
            pe.barrier()?;
            let args = [
                pe.state_ptr().into(),
                m.into(),
                t.to_bits().into(),
                o.to_bits().into(),
                pe.ptr(&dst)?.into(),
                pe.ptr(&src)?.into(),
                (n as u64).into(),
                root.into(),
            ];
            let kernel = if m == mode::BARRIER {
                "ibgda_test_team_sync"
            } else {
                "ibgda_test_team"
            };
            launch(pe, kernel, grid(2, 256), &args)?;
            pe.synchronize()
        };
        run(mode::TWO_TEAMS, singles[me as usize], pair, count, 0)?;
        let sum: Vec<u64> = (0..count).map(|i| value(0, i).wrapping_add(value(1, i))).collect();
        assert!(
            pe.read(&dst, count, count)? == sum,
            "PE {me}: the pair's sum of each PE's own"
        );
        run(mode::ALLTOALL, pair, pair, count, 0)?;
        let want: Vec<u64> = (0..2 * count)
            .map(|x| value((x / count) as u32, me as usize * count + x % count))
            .collect();
        assert!(pe.read(&dst, 0, 2 * count)? == want, "PE {me}: the pair's all-to-all");
        pe.write(&dst, 0, &[0u64; 16])?;
        run(mode::BARRIER, pair, pair, 0, 5)?;
        assert_eq!(
            pe.read(&dst, 3, 5)?,
            vec![1u64; 5],
            "PE {me}: the predecessor's word after each barrier"
        );
        pe.barrier()?;
        pe.team_destroy(pair)?;
        Ok(())
    })
    .unwrap();
}

/// The `_vector` waits on a GPU (two PEs): PE 0 waits for all of 40 words, each for its own
/// value (`i + 1`) that PE 1 sets, then for any one of them (only word 29 set).
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_vector_waits_see_each_words_own_value() {
    if !gpu_or_skip("gpu_vector_waits_see_each_words_own_value", 1) {
        return;
    }
    use ibgda_kernels::waits;
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let n = 40usize;
        let (ivars, values, out) = (pe.malloc::<u64>(n)?, pe.malloc::<u64>(n)?, pe.malloc::<u64>(n + 1)?);
        pe.write(&values, 0, &(1..=n as u64).collect::<Vec<_>>())?;
        for (mode, mask, want) in [(waits::ALL, (1u64 << n) - 1, n as u64), (waits::ANY, 1 << 29, 29)] {
            pe.write(&ivars, 0, &vec![0u64; n])?;
            pe.barrier()?;
            let args = [
                pe.state_ptr().into(),
                mode.into(),
                pe.ptr(&ivars)?.into(),
                (n as u64).into(),
                0u64.into(),
                pe.ptr(&out)?.into(),
                pe.ptr(&values)?.into(),
                mask.into(),
            ];
            launch(pe, "ibgda_test_waits_vector", grid(1, 32), &args)?;
            pe.synchronize()?;
            if pe.my_pe() == 0 {
                assert_eq!(pe.read(&out, 0, 1)?[0], want, "mode {mode}");
            }
            pe.barrier()?;
        }
        Ok(())
    })
    .unwrap();
}

/// The multi-word waits on a GPU: `wait_until_all` while the other PE sets every included word
/// (two excluded words never set), `wait_until_any` returning the one word it sets, and
/// `wait_until_some` listing words set before the launch.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_multi_word_waits_see_the_peers_words() {
    if !gpu_or_skip("gpu_multi_word_waits_see_the_peers_words", 1) {
        return;
    }
    use ibgda_kernels::waits;
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let n = 40usize;
        let (ivars, status, out) = (pe.malloc::<u64>(n)?, pe.malloc::<i32>(n)?, pe.malloc::<u64>(n + 1)?);
        let excluded: Vec<i32> = (0..n).map(|i| (i == 5 || i == 6) as i32).collect();
        pe.write(&status, 0, &excluded)?;
        let all_but_5_6 = ((1u64 << n) - 1) & !(1 << 5 | 1 << 6);
        for (mode, set_before, mask, want) in [
            (waits::ALL, vec![], all_but_5_6, vec![38u64]),
            (waits::ANY, vec![], 1 << 22, vec![22]),
            (waits::SOME, vec![3usize, 17, 39], 0, vec![3, 3, 17, 39]),
        ] {
            let words: Vec<u64> = (0..n).map(|i| if set_before.contains(&i) { 5 } else { 0 }).collect();
            pe.write(&ivars, 0, &words)?;
            pe.barrier()?;
            let st = if mode == waits::ALL { pe.ptr(&status)? } else { 0 };
            let args = [
                pe.state_ptr().into(),
                mode.into(),
                pe.ptr(&ivars)?.into(),
                (n as u64).into(),
                st.into(),
                pe.ptr(&out)?.into(),
                5u64.into(),
                mask.into(),
            ];
            launch(pe, "ibgda_test_waits", grid(1, 32), &args)?;
            pe.synchronize()?;
            pe.barrier()?;
            if pe.my_pe() == 0 {
                let got = pe.read(&out, 0, want.len())?;
                assert_eq!(got, want, "mode {mode}");
                if mode == waits::ALL {
                    let w = pe.read(&ivars, 0, n)?;
                    assert!((0..n).all(|i| w[i] == if i == 5 || i == 6 { 0 } else { 5 }), "{w:?}");
                }
            }
            pe.barrier()?;
        }
        Ok(())
    })
    .unwrap();
}

// Team cases shared by every CPU transport (included by `device_api_cases.rs`).

use ibgda::abi::Team;
use ibgda_kernels::team as team_mode;

/// Runs `ibgda_test_team` (or `_sync`, as `mode` needs) on every PE with `team` / `other` chosen per PE.
#[allow(clippy::too_many_arguments)]
fn run_team(
    w: &PeGroup,
    mode: u32,
    team_of: impl Fn(u32) -> (Team, Team) + Sync,
    dst: &GroupBuffer<u64>,
    src: &GroupBuffer<u64>,
    count: usize,
    root: u32,
) -> ibgda::Result<()> {
    let sync = matches!(mode, team_mode::BARRIER | team_mode::SYNC | team_mode::INFO | team_mode::BARRIER_ANYWAY);
    w.launch_grid(2, 64, |pe, st| unsafe {
        let (t, o) = team_of(pe);
        let kernel = if sync { ibgda_kernels::ibgda_test_team_sync } else { ibgda_kernels::ibgda_test_team };
        kernel(
            st,
            mode,
            t.to_bits(),
            o.to_bits(),
            w.ptr(pe, dst).unwrap() as *mut u64,
            w.ptr(pe, src).unwrap() as *const u64,
            count as u64,
            root,
        );
    })
}

/// World PE `w`'s source word `i`: distinct across PEs and words.
fn team_src(w: u32, i: usize) -> u64 {
    ((w as u64 + 1) * 0x1_0000_0001) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

const UNTOUCHED: u64 = 0xeeee_eeee_eeee_eeee;

#[test]
fn teams_run_collectives_over_their_members_in_team_order() {
    let mut w = world(4);
    let world_team = w.pe(0).team_world();
    let odd = w.team_split_strided(world_team, 1, 2, 2).unwrap(); // world PEs 1, 3
    let upper = w.team_split_strided(world_team, 1, 1, 3).unwrap(); // 1, 2, 3
    let upper_tail = w.team_split_strided(upper, 1, 1, 2).unwrap(); // upper's 1, 2: world 2, 3
    assert_eq!((upper_tail.start(), upper_tail.stride(), upper_tail.size()), (2, 1, 2));
    assert_eq!(w.pe(2).teams(), vec![odd, upper, upper_tail]);
    // 3 words, and 20,001 (three rounds of the 64 KiB scratch the 4 MiB heaps keep).
    let most = 20_001 * 4;
    let src = w.malloc::<u64>(most).unwrap();
    let dst = w.malloc::<u64>(most).unwrap();
    for pe in 0..4 {
        w.write(pe, &src, 0, &(0..most).map(|i| team_src(pe, i)).collect::<Vec<_>>()).unwrap();
    }
    for team in [world_team, odd, upper, upper_tail] {
        let n = team.size() as usize;
        let members: Vec<u32> = (0..team.size()).map(|j| team.world_pe(j).unwrap()).collect();
        for (mode, count) in [
            (team_mode::ALLTOALL, 3),
            (team_mode::BROADCAST, 3),
            (team_mode::FCOLLECT, 3),
            (team_mode::SUM, 3),
            (team_mode::SUM, 20_001),
        ] {
            let root = team.size() - 1;
            for pe in 0..4 {
                w.write(pe, &dst, 0, &vec![UNTOUCHED; most]).unwrap();
            }
            run_team(&w, mode, |_| (team, team), &dst, &src, count, root).unwrap();
            for pe in 0..4u32 {
                let got = w.read(pe, &dst, 0, n * count).unwrap();
                let want: Vec<u64> = match team.pe_of(pe) {
                    None => vec![UNTOUCHED; n * count],
                    Some(me) => match mode {
                        team_mode::ALLTOALL => (0..n * count)
                            .map(|x| team_src(members[x / count], me as usize * count + x % count))
                            .collect(),
                        team_mode::BROADCAST => (0..n * count)
                            .map(|x| if x < count { team_src(members[root as usize], x) } else { UNTOUCHED })
                            .collect(),
                        team_mode::FCOLLECT => (0..n * count).map(|x| team_src(members[x / count], x % count)).collect(),
                        _ => (0..n * count)
                            .map(|x| {
                                if x < count {
                                    members.iter().fold(0u64, |a, &m| a.wrapping_add(team_src(m, x)))
                                } else {
                                    UNTOUCHED
                                }
                            })
                            .collect(),
                    },
                };
                assert!(
                    got == want,
                    "mode {mode}, team {team:?} (members {members:?}), {count} words: world PE {pe}'s dst differs at word {:?}",
                    got.iter().zip(&want).position(|(a, b)| a != b)
                );
            }
        }
    }
    // What each PE learns of a team from the handle alone.
    run_team(&w, team_mode::INFO, |_| (odd, upper), &dst, &src, 0, 1).unwrap();
    for pe in 0..4u32 {
        let got = w.read(pe, &dst, 0, 4).unwrap();
        let none = u64::MAX;
        let want = match pe {
            1 => [0, 2, 3, 0],
            3 => [1, 2, 3, 2],
            2 => [none, 2, 3, 1],
            _ => [none, 2, 3, none],
        };
        assert_eq!(got, want, "world PE {pe}");
    }
}

#[test]
fn overlapping_teams_reduce_back_to_back_on_scratches_of_their_own() {
    // A 2 x 2 grid: each PE sums over its row, then over its column from that, with nothing
    // between: a PE done with its row may start its column while its column peer still reduces
    // its own row (with one scratch for both teams it would overwrite that peer's shares).
    let mut w = world(4);
    let world_team = w.pe(0).team_world();
    let rows = [w.team_split_strided(world_team, 0, 1, 2).unwrap(), w.team_split_strided(world_team, 2, 1, 2).unwrap()];
    let cols = [w.team_split_strided(world_team, 0, 2, 2).unwrap(), w.team_split_strided(world_team, 1, 2, 2).unwrap()];
    let count = 20_001;
    let src = w.malloc::<u64>(count).unwrap();
    let dst = w.malloc::<u64>(2 * count).unwrap();
    for round in 0..10u64 {
        for pe in 0..4 {
            w.write(pe, &src, 0, &(0..count).map(|i| team_src(pe, i) ^ round).collect::<Vec<_>>()).unwrap();
        }
        run_team(&w, team_mode::TWO_TEAMS, |pe| (rows[pe as usize / 2], cols[pe as usize % 2]), &dst, &src, count, 0).unwrap();
        let want: Vec<u64> = (0..count).map(|i| (0..4).fold(0u64, |a, pe| a.wrapping_add(team_src(pe, i) ^ round))).collect();
        for pe in 0..4 {
            let got = w.read(pe, &dst, count, count).unwrap();
            assert!(got == want, "round {round}: PE {pe}'s grid sum differs at {:?}", got.iter().zip(&want).position(|(a, b)| a != b));
        }
    }
}

#[test]
fn a_team_barrier_delivers_its_members_puts_and_a_team_sync_waits_for_every_member() {
    let mut w = world(4);
    let world_team = w.pe(0).team_world();
    let odd = w.team_split_strided(world_team, 1, 2, 2).unwrap();
    let upper = w.team_split_strided(world_team, 1, 1, 3).unwrap();
    let dst = w.malloc::<u64>(16).unwrap();
    let src = w.malloc::<u64>(1).unwrap();
    let rounds = 5u32;
    for team in [odd, upper, world_team] {
        let n = team.size() as usize;
        for pe in 0..4 {
            w.write(pe, &dst, 0, &[0u64; 16]).unwrap();
        }
        run_team(&w, team_mode::BARRIER, |_| (team, team), &dst, &src, 0, rounds).unwrap();
        for pe in 0..4u32 {
            let got = w.read(pe, &dst, n + 1, rounds as usize).unwrap();
            let want = if team.pe_of(pe).is_some() { vec![1u64; rounds as usize] } else { vec![0; rounds as usize] };
            assert_eq!(got, want, "barrier of team {team:?}: world PE {pe}'s count of its predecessor's word per round");
        }
        for pe in 0..4 {
            w.write(pe, &dst, 0, &[0u64; 16]).unwrap();
        }
        run_team(&w, team_mode::SYNC, |_| (team, team), &dst, &src, 0, rounds).unwrap();
        let first = team.world_pe(0).unwrap();
        let got = w.read(first, &dst, 1, rounds as usize).unwrap();
        let want: Vec<u64> = (1..=rounds as u64).map(|r| r * n as u64).collect();
        assert_eq!(got, want, "sync of team {team:?}: what team PE 0 saw after each round");
    }
}

#[test]
fn team_misuse_is_reported_by_name_and_moves_nothing() {
    let mut w = world_with(4, 4 << 20, Duration::from_secs(5));
    let world_team = w.pe(0).team_world();
    let odd = w.team_split_strided(world_team, 1, 2, 2).unwrap();
    let dst = w.malloc::<u64>(64).unwrap();
    let src = w.malloc::<u64>(64).unwrap();
    // A PE outside the team calls its barrier: NotInTeam there, the members pass theirs.
    let e = run_team(&w, team_mode::BARRIER_ANYWAY, |_| (odd, odd), &dst, &src, 0, 0).unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::NotInTeam), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("team_barrier_block") && msg.contains("not a member"), "{msg}");
    // The PEs' errors stay with the PEs that made them: start again.
    drop(w);
    let mut w = world_with(4, 4 << 20, Duration::from_secs(5));
    let odd = w.team_split_strided(world_team, 1, 2, 2).unwrap();
    let dst = w.malloc::<u64>(64).unwrap();
    let src = w.malloc::<u64>(64).unwrap();
    w.team_destroy(odd).unwrap();
    assert!(w.pe(1).teams().is_empty());
    let before: Vec<Vec<u8>> = (0..4).map(|pe| w.heap_snapshot(pe).unwrap()).collect();
    // A destroyed team's handle.
    let e = run_team(&w, team_mode::SUM, |_| (odd, odd), &dst, &src, 8, 0).unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::InvalidTeam), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("team_sum_reduce_block") && msg.contains("slot is free"), "{msg}");
    assert!((0..4).all(|pe| w.heap_snapshot(pe).unwrap() == before[pe as usize]), "nothing moved");

    // Host-side: bad shapes, disagreement, the world, a destroyed team, every slot in use.
    let mut w = world_with(4, 4 << 20, Duration::from_secs(5));
    let msg = |e: ibgda::Error| e.to_string();
    let e = w.team_split_strided(world_team, 0, 1, 0).unwrap_err();
    assert!(msg(e).contains("size 0 and stride 1 must both be at least 1"), "size 0");
    let e = w.team_split_strided(world_team, 1, 2, 3).unwrap_err();
    assert!(msg(e).contains("parent PE 5"), "past the parent");
    let per_pe = w.each_mut(|pe| {
        let start = if pe.my_pe() == 2 { 1 } else { 0 };
        pe.team_split_strided(world_team, start, 1, 2)
    });
    assert!(per_pe.iter().all(|r| matches!(r, Err(Error::CollectiveMismatch { .. }))), "{per_pe:?}");
    // One PE refuses (its size is 0): it says why, the others that it refused, and none waits.
    let per_pe = w.each_mut(|pe| pe.team_split_strided(world_team, 0, 1, if pe.my_pe() == 1 { 0 } else { 2 }));
    for (pe, r) in per_pe.iter().enumerate() {
        let text = r.as_ref().unwrap_err().to_string();
        assert!(text.contains(if pe == 1 { "must both be at least 1" } else { "PE 1" }), "PE {pe}: {text}");
    }
    assert!(w.pe(0).teams().is_empty(), "no team made");
    let e = w.team_destroy(world_team).unwrap_err();
    assert!(msg(e).contains("world team cannot be destroyed"));
    let mut made = Vec::new();
    for k in 0..ibgda::abi::MAX_TEAMS as u32 - 1 {
        made.push(w.team_split_strided(world_team, k % 4, 1, 1).unwrap());
    }
    let e = w.team_split_strided(world_team, 0, 1, 1).unwrap_err();
    assert!(msg(e).contains("slots are in use"), "every slot");
    w.team_destroy(made[7]).unwrap();
    let e = w.team_destroy(made[7]).unwrap_err();
    assert!(msg(e).contains("not held"), "destroyed twice");
    // The freed slot is taken again, and the new team works.
    let again = w.team_split_strided(world_team, 0, 3, 2).unwrap();
    assert_eq!(again.slot(), made[7].slot());
    assert_ne!(again.generation(), made[7].generation());
    let dst = w.malloc::<u64>(8).unwrap();
    let src = w.malloc::<u64>(8).unwrap();
    for pe in 0..4 {
        w.write(pe, &src, 0, &[pe as u64 + 1; 8]).unwrap();
    }
    run_team(&w, team_mode::SUM, |_| (again, again), &dst, &src, 8, 0).unwrap();
    for pe in [0, 3] {
        assert_eq!(w.read(pe, &dst, 0, 8).unwrap(), vec![1 + 4; 8], "world PEs 0 and 3");
    }
}

#[test]
fn a_slot_used_again_starts_clean_and_refuses_the_old_handle() {
    let mut w = world_with(4, 4 << 20, Duration::from_secs(5));
    let world_team = w.pe(0).team_world();
    let dst = w.malloc::<u64>(16).unwrap();
    let src = w.malloc::<u64>(16).unwrap();
    let three = w.team_split_strided(world_team, 0, 1, 3).unwrap();
    run_team(&w, team_mode::BARRIER, |_| (three, three), &dst, &src, 0, 5).unwrap();
    w.team_destroy(three).unwrap();
    // The same slot, two members: its arrivals and epoch start from 0 again, so each barrier
    // still waits for both.
    let two = w.team_split_strided(world_team, 1, 1, 2).unwrap();
    assert_eq!(two.slot(), three.slot());
    for pe in 0..4 {
        w.write(pe, &dst, 0, &[0u64; 16]).unwrap();
    }
    run_team(&w, team_mode::BARRIER, |_| (two, two), &dst, &src, 0, 5).unwrap();
    for pe in [1, 2] {
        assert_eq!(w.read(pe, &dst, 3, 5).unwrap(), vec![1u64; 5], "world PE {pe}");
    }
    // A team of the very shape of a destroyed one gets a new handle; the old one is refused.
    w.team_destroy(two).unwrap();
    let same_shape = w.team_split_strided(world_team, 1, 1, 2).unwrap();
    assert_ne!(same_shape, two);
    let e = run_team(&w, team_mode::SUM, |_| (two, two), &dst, &src, 4, 0).unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::InvalidTeam), "{e}");
    assert!(e.to_string().contains(&format!("its slot holds team {:#x}", same_shape.to_bits())), "{e}");
}

#[test]
fn a_split_of_a_strided_parent_composes_its_strides_and_a_non_member_moves_nothing() {
    let mut w = world_with(6, 4 << 20, Duration::from_secs(5));
    let world_team = w.pe(0).team_world();
    let even = w.team_split_strided(world_team, 0, 2, 3).unwrap(); // 0, 2, 4
    let ends = w.team_split_strided(even, 0, 2, 2).unwrap(); // even's 0 and 2: world 0, 4
    assert_eq!((ends.start(), ends.stride(), ends.size()), (0, 4, 2));
    let tail = w.team_split_strided(even, 1, 1, 2).unwrap(); // even's 1, 2: world 2, 4
    assert_eq!((tail.start(), tail.stride(), tail.size()), (2, 2, 2));
    let dst = w.malloc::<u64>(8).unwrap();
    let src = w.malloc::<u64>(8).unwrap();
    for pe in 0..6 {
        w.write(pe, &src, 0, &[1u64 << (8 * pe); 8]).unwrap();
        w.write(pe, &dst, 0, &[UNTOUCHED; 8]).unwrap();
    }
    for (team, want) in [(ends, 1u64 | 1 << 32), (tail, 1 << 16 | 1 << 32)] {
        run_team(&w, team_mode::SUM, |_| (team, team), &dst, &src, 8, 0).unwrap();
        for pe in 0..6 {
            let got = w.read(pe, &dst, 0, 8).unwrap();
            let member = team.pe_of(pe).is_some();
            if member {
                assert_eq!(got, vec![want; 8], "team {team:?}, world PE {pe}");
            }
        }
    }
    // Every PE calls a reduction of `ends`: PEs 1, 2, 3 and 5 are refused, and their heaps keep
    // every byte.
    let outside = [1u32, 2, 3, 5];
    let before: Vec<Vec<u8>> = outside.iter().map(|&pe| w.heap_snapshot(pe).unwrap()).collect();
    let e = run_team(&w, team_mode::SUM_ANYWAY, |_| (ends, ends), &dst, &src, 8, 0).unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::NotInTeam), "{e}");
    assert!(e.to_string().contains("team_sum_reduce_block"), "{e}");
    for (k, &pe) in outside.iter().enumerate() {
        assert!(w.heap_snapshot(pe).unwrap() == before[k], "world PE {pe}'s heap changed");
        assert_eq!(w.device_error(pe).map(|r| r.kind), Some(ErrorKind::NotInTeam as u32), "world PE {pe}");
    }
}

//! The GPU test suite's kernels for the calls over several PEs at once: collectives, reductions,
//! teams (their collectives, barriers and syncs) and the multi-word waits.

use ibgda_abi::{Cmp, DeviceState};
use ibgda_device::{arch, Shmem};

/// A team argument of the team test kernels: bits that name no team at all become a world-slot
/// handle of the wrong size, so the device API's own check reports them.
#[inline(always)]
fn team_arg(sh: &Shmem, bits: u64) -> ibgda_abi::Team {
    match ibgda_abi::Team::from_bits(bits) {
        Some(t) => t,
        None => ibgda_abi::Team::strided(0, 0, 1, sh.n_pes() + 1).unwrap_or(sh.team_world()),
    }
}

ibgda_device::kernel! {
    /// Test: the collective `which` (a [`crate::collective`] value) by block 0 of every PE, on
    /// symmetric `dst` from `src`, `count` elements of `width` bytes (1 or 8) a PE (`root` for a
    /// broadcast); the other blocks return at once. `dst` holds `n_pes * count` elements, `src` as
    /// the collective reads.
    pub fn ibgda_test_collective(state: *const DeviceState, which: u32, width: u32, dst: *mut u8, src: *const u8, count: u64, root: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends;
        // one block a PE calls the collective (its contract).
        unsafe {
            if arch::block_idx_x() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let n = count as usize;
            let (d8, s8) = (dst as *mut u64, src as *const u64);
            match (which, width == 8) {
                (crate::collective::ALLTOALL, false) => sh.alltoall_block(dst, src, n),
                (crate::collective::ALLTOALL, true) => sh.alltoall_block(d8, s8, n),
                (crate::collective::BROADCAST, false) => sh.broadcast_block(dst, src, n, root),
                (crate::collective::BROADCAST, true) => sh.broadcast_block(d8, s8, n, root),
                (_, false) => sh.fcollect_block(dst, src, n),
                (_, true) => sh.fcollect_block(d8, s8, n),
            }
        }
    }

    /// Test: the reduction `op` (a [`crate::reduce`] value) of `count` elements of type `ty` (a
    /// [`crate::reduce::ty`] value) from every PE's `src` into every PE's `dst`, by block 0 of
    /// every PE (the other blocks return). A bitwise `op` on a float type does nothing.
    pub fn ibgda_test_reduce(state: *const DeviceState, op: u32, ty: u32, dst: *mut u8, src: *const u8, count: u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name, alive until the kernel ends;
        // one block a PE calls the reduction (its contract).
        unsafe {
            use crate::reduce;
            if arch::block_idx_x() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let n = count as usize;
            macro_rules! arith {
                ($t:ty) => {{
                    let (d, s) = (dst as *mut $t, src as *const $t);
                    match op {
                        reduce::SUM => sh.sum_reduce_block(d, s, n),
                        reduce::PROD => sh.prod_reduce_block(d, s, n),
                        reduce::MIN => sh.min_reduce_block(d, s, n),
                        reduce::MAX => sh.max_reduce_block(d, s, n),
                        _ => {}
                    }
                }};
            }
            macro_rules! bitwise {
                ($t:ty) => {{
                    let (d, s) = (dst as *mut $t, src as *const $t);
                    match op {
                        reduce::AND => sh.and_reduce_block(d, s, n),
                        reduce::OR => sh.or_reduce_block(d, s, n),
                        reduce::XOR => sh.xor_reduce_block(d, s, n),
                        _ => arith!($t),
                    }
                }};
            }
            match ty {
                reduce::ty::U8 => bitwise!(u8),
                reduce::ty::I32 => bitwise!(i32),
                reduce::ty::U64 => bitwise!(u64),
                reduce::ty::F32 => arith!(f32),
                _ => arith!(f64),
            }
        }
    }

    /// Test: the team collectives (`ALLTOALL`, `BROADCAST`, `FCOLLECT`, `SUM`, `TWO_TEAMS`,
    /// `SUM_ANYWAY` of [`crate::team`]), with `team` and `other` team handles (their bits) on `count` `u64`s of
    /// `dst` and `src`, by block 0 of every member (the other blocks and PEs return).
    pub fn ibgda_test_team(state: *const DeviceState, mode: u32, team: u64, other: u64, dst: *mut u64, src: *const u64, count: u64, root: u32) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a symmetric buffer of the size its mode needs, alive until the kernel
        // ends; one block a PE makes the collective calls (their contract).
        unsafe {
            use crate::team as mode_of;
            if arch::block_idx_x() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let (t, o) = (team_arg(&sh, team), team_arg(&sh, other));
            if sh.team_my_pe(t).is_none() && mode != mode_of::SUM_ANYWAY {
                return;
            }
            let n = count as usize;
            match mode {
                mode_of::ALLTOALL => sh.team_alltoall_block(t, dst, src, n),
                mode_of::BROADCAST => sh.team_broadcast_block(t, dst, src, n, root),
                mode_of::FCOLLECT => sh.team_fcollect_block(t, dst, src, n),
                mode_of::SUM | mode_of::TWO_TEAMS | mode_of::SUM_ANYWAY => {
                    // One call in a loop, not two inlined: the kernel stays within its registers.
                    let mut step = 0;
                    while step < 2 {
                        let (team, d, s) = if step == 0 { (t, dst, src) } else { (o, dst.add(n), dst as *const u64) };
                        if step == 1 && (mode != mode_of::TWO_TEAMS || sh.team_my_pe(o).is_none()) {
                            break;
                        }
                        sh.team_sum_reduce_block(team, d, s, n);
                        step += 1;
                    }
                }
                _ => {}
            }
        }
    }

    /// Test: a team's barrier and sync and what a handle tells (`BARRIER`, `SYNC`, `INFO`,
    /// `BARRIER_ANYWAY` of [`crate::team`]), arguments as [`ibgda_test_team`]'s.
    pub fn ibgda_test_team_sync(state: *const DeviceState, mode: u32, team: u64, other: u64, dst: *mut u64, src: *const u64, count: u64, root: u32) {
        // SAFETY: as `ibgda_test_team`.
        unsafe {
            use crate::team as mode_of;
            let _ = (src, count);
            if arch::block_idx_x() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let (t, o) = (team_arg(&sh, team), team_arg(&sh, other));
            let tid = arch::thread_rank_in_block();
            let me = sh.team_my_pe(t);
            match mode {
                mode_of::INFO => {
                    if tid == 0 {
                        *dst = me.map_or(u64::MAX, u64::from);
                        *dst.add(1) = sh.team_n_pes(t) as u64;
                        *dst.add(2) = t.world_pe(root).map_or(u64::MAX, u64::from);
                        *dst.add(3) = sh.team_my_pe(o).map_or(u64::MAX, u64::from);
                    }
                    return;
                }
                mode_of::BARRIER_ANYWAY => {
                    sh.team_barrier_block(t);
                    return;
                }
                _ => {}
            }
            let Some(me) = me else { return };
            let size = sh.team_n_pes(t);
            match mode {
                mode_of::BARRIER => {
                    for round in 1..=root as u64 {
                        if tid == 0 {
                            let next = sh.team_world_pe(t, (me + 1) % size);
                            sh.p(dst.add(me as usize), round, next);
                        }
                        sh.team_barrier_block(t);
                        if tid == 0 {
                            let held = (0..size as usize).filter(|&j| core::ptr::read_volatile(dst.add(j)) == round).count();
                            *dst.add(size as usize + round as usize) = held as u64;
                        }
                        // Every member's look before the next round's puts.
                        sh.team_barrier_block(t);
                    }
                }
                mode_of::SYNC => {
                    let first = sh.team_world_pe(t, 0);
                    for round in 1..=root as u64 {
                        if tid == 0 {
                            sh.atomic_add(dst, 1u64, first);
                            sh.quiet();
                        }
                        sh.team_sync_block(t);
                        if tid == 0 && me == 0 {
                            *dst.add(round as usize) = sh.atomic_fetch(dst, first);
                        }
                        sh.team_sync_block(t);
                    }
                }
                _ => {}
            }
        }
    }

    /// Test: the multi-word waits. Thread 0 of block 0 of PE 0 runs the call `mode` (a
    /// [`crate::waits`] value) on its `ivars[..n]` with `status` (null: every word) for `>= value`,
    /// and writes what it returned to `out[0]` (`test` and `test_all`: 1 or 0, `test` of `ivars[0]`; `wait_until_all`:
    /// how many included words are at the target when it returned), `wait_until_some`'s indices
    /// to `out[1..]`. Thread 0 of every other PE sets PE 0's `ivars[i]` to `value`, for
    /// each bit `i` of `set_mask`, in ascending order, and completes them.
    pub fn ibgda_test_waits(state: *const DeviceState, mode: u32, ivars: *mut u64, n: u64, status: *const i32, out: *mut u64, value: u64, set_mask: u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name (`status` null or `n` entries,
        // `out` `n + 1` words), alive until the kernel ends.
        unsafe {
            if arch::block_idx_x() != 0 || arch::thread_rank_in_block() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let n = n as usize;
            if sh.my_pe() == 0 {
                let r = match mode {
                    crate::waits::TEST => sh.test(ivars, Cmp::Ge, value) as usize,
                    crate::waits::ALL => {
                        sh.wait_until_all(ivars, n, status, Cmp::Ge, value);
                        // How many included words are at the target now (all of them, or the
                        // wait returned too soon).
                        (0..n)
                            .filter(|&i| (status.is_null() || status.add(i).read() == 0) && ivars.add(i).read_volatile() >= value)
                            .count()
                    }
                    crate::waits::ANY => sh.wait_until_any(ivars, n, status, Cmp::Ge, value),
                    crate::waits::TEST_ALL => sh.test_all(ivars, n, status, Cmp::Ge, value) as usize,
                    crate::waits::TEST_ANY => sh.test_any(ivars, n, status, Cmp::Ge, value),
                    crate::waits::TEST_SOME => sh.test_some(ivars, n, out.add(1) as *mut usize, status, Cmp::Ge, value),
                    _ => sh.wait_until_some(ivars, n, out.add(1) as *mut usize, status, Cmp::Ge, value),
                };
                out.write(r as u64);
            } else {
                for i in 0..64 {
                    if set_mask >> i & 1 != 0 {
                        sh.atomic_set(ivars.add(i), value, 0);
                    }
                }
                sh.quiet();
            }
        }
    }

    /// Test: the `_vector` waits. Thread 0 of block 0 of PE 0 runs the `_vector` form of `mode` (a
    /// [`crate::waits`] value but `TEST`) on its `ivars[..n]` with `status`, each word compared
    /// for equality with `values[i]`, and writes its result to `out[0]` (`wait_until_all`: how
    /// many included words equal their value when it returned), the `some` forms' indices to
    /// `out[1..]`. Thread 0 of every other PE sets PE 0's `ivars[i]` to `i + 1` for each bit `i`
    /// of `set_mask`, ascending, and completes them.
    pub fn ibgda_test_waits_vector(state: *const DeviceState, mode: u32, ivars: *mut u64, n: u64, status: *const i32, out: *mut u64, values: *const u64, set_mask: u64) {
        // SAFETY: the launch contract (`kernel!`): `state` is this PE's live device state and every
        // pointer argument a buffer of the size its parameters name (`status` null or `n` entries,
        // `values` `n`, `out` `n + 1` words), alive until the kernel ends.
        unsafe {
            use crate::waits;
            if arch::block_idx_x() != 0 || arch::thread_rank_in_block() != 0 {
                return;
            }
            let sh = Shmem::attach(state);
            let n = n as usize;
            if sh.my_pe() == 0 {
                let indices = out.add(1) as *mut usize;
                let r = match mode {
                    waits::ALL => {
                        sh.wait_until_all_vector(ivars, n, status, Cmp::Eq, values);
                        (0..n)
                            .filter(|&i| (status.is_null() || status.add(i).read() == 0) && ivars.add(i).read_volatile() == values.add(i).read())
                            .count()
                    }
                    waits::ANY => sh.wait_until_any_vector(ivars, n, status, Cmp::Eq, values),
                    waits::TEST_ALL => sh.test_all_vector(ivars, n, status, Cmp::Eq, values) as usize,
                    waits::TEST_ANY => sh.test_any_vector(ivars, n, status, Cmp::Eq, values),
                    waits::TEST_SOME => sh.test_some_vector(ivars, n, indices, status, Cmp::Eq, values),
                    _ => sh.wait_until_some_vector(ivars, n, indices, status, Cmp::Eq, values),
                };
                out.write(r as u64);
            } else {
                for i in 0..64 {
                    if set_mask >> i & 1 != 0 {
                        sh.atomic_set(ivars.add(i), i as u64 + 1, 0);
                    }
                }
                sh.quiet();
            }
        }
    }
}

//! Collectives over every PE, as OpenSHMEM 1.5 and NVSHMEM define `alltoallmem`, `broadcastmem`
//! and `fcollectmem`: one block on each PE calls the same collective with the same arguments,
//! the block moves this PE's share with block puts (each PE starts with a different target, so
//! no PE's inbound link takes every sender's first message at once), and the call ends with
//! [`Shmem::barrier_all_block`], whose quiet and barrier mean that when it returns every PE's
//! data has landed in `dst` on every PE and `src` may be reused.
//!
//! Like OpenSHMEM's, they synchronise at their end only: `dst` on every PE must not be read or
//! written by anyone else from the moment any PE enters the call until it returns there (two
//! calls into the same `dst` need a barrier between a PE's reads of the first result and the
//! next call), and `src` must not overlap `dst` (an in-place all-to-all would send words a peer
//! has already overwritten). `src` is symmetric, as NVSHMEM asks: over NVLink any device memory
//! would do, but a NIC or the proxy reads only registered memory (the heap). Every put checks its
//! symmetric address and the PE, so an array that runs past the heap is reported as an error of
//! the collective (its name, the PE, the address), nothing written past the heap. A `count` of 0
//! moves nothing and still synchronises.
//!
//! The barrier they end with counts one arrival per PE ([`Shmem::barrier_all`]), so while a
//! collective runs no other block of the PE may call a collective or a barrier (of any team); its quiet
//! completes the calling block's queues, which are the ones its puts used (other blocks' puts
//! need their own `quiet`, or [`Shmem::quiet_all_block`]).

use super::teams::Members;
use super::Shmem;
use crate::fail::Failure;
use ibgda_abi::{ErrorKind, Op, Team};

impl Shmem {
    /// All-to-all exchange: this PE's `src[j * count..(j + 1) * count]` goes to
    /// `dst[me * count..(me + 1) * count]` on PE `j`, for every PE `j` (itself included), where
    /// `me` is [`Shmem::my_pe`]. `src` and `dst` hold `n_pes * count` elements each.
    ///
    /// # Safety
    /// Every thread of exactly one block on every PE calls it with the same `count` (the
    /// barrier's contract, [`Shmem::barrier_all_block`]); `src..src + n_pes * count` is readable
    /// symmetric memory that does not overlap `dst`; `dst` is a symmetric address that nothing
    /// else accesses on any PE during the call (see the module).
    #[inline(always)]
    pub unsafe fn alltoall_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize) {
        let sh = &self.at(Op::AlltoallBlock);
        // SAFETY: this function's contract.
        unsafe { sh.alltoall_members(&sh.world(), dst, src, count) }
    }

    /// [`Shmem::alltoall_block`] over `team` (NVSHMEM's `alltoallmem(team, ..)`): piece `j` goes
    /// to the team's PE `j`, `dst` and `src` hold `team_n_pes * count` elements.
    ///
    /// # Safety
    /// As [`Shmem::alltoall_block`], over the team's members (one block on each).
    #[inline(always)]
    pub unsafe fn team_alltoall_block<T: Copy>(&self, team: Team, dst: *mut T, src: *const T, count: usize) {
        let sh = &self.at(Op::TeamAlltoallBlock);
        // SAFETY: this function's contract.
        unsafe { sh.alltoall_members(&sh.members_of(team), dst, src, count) }
    }

    /// Broadcast: `src[..count]` on PE `root` goes to `dst[..count]` on every PE, `root`
    /// included (OpenSHMEM 1.5's rule); the other PEs' `src` is not read.
    ///
    /// # Safety
    /// As [`Shmem::alltoall_block`], with the same `root` on every PE; on `root`,
    /// `src..src + count` is readable symmetric memory that does not
    /// overlap `dst`.
    #[inline(always)]
    pub unsafe fn broadcast_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize, root: u32) {
        let sh = &self.at(Op::BroadcastBlock);
        // SAFETY: this function's contract.
        unsafe { sh.broadcast_members(&sh.world(), dst, src, count, root) }
    }

    /// [`Shmem::broadcast_block`] over `team`, from the team's PE `root`.
    ///
    /// # Safety
    /// As [`Shmem::broadcast_block`], over the team's members.
    #[inline(always)]
    pub unsafe fn team_broadcast_block<T: Copy>(
        &self,
        team: Team,
        dst: *mut T,
        src: *const T,
        count: usize,
        root: u32,
    ) {
        let sh = &self.at(Op::TeamBroadcastBlock);
        // SAFETY: this function's contract.
        unsafe { sh.broadcast_members(&sh.members_of(team), dst, src, count, root) }
    }

    /// Concatenation (`fcollect`): this PE's `src[..count]` goes to
    /// `dst[me * count..(me + 1) * count]` on every PE, itself included, so every `dst` ends as
    /// all PEs' `src` in PE order. `dst` holds `n_pes * count` elements.
    ///
    /// # Safety
    /// As [`Shmem::alltoall_block`]; `src..src + count` is readable symmetric memory that does not
    /// overlap `dst`.
    #[inline(always)]
    pub unsafe fn fcollect_block<T: Copy>(&self, dst: *mut T, src: *const T, count: usize) {
        let sh = &self.at(Op::FcollectBlock);
        // SAFETY: this function's contract.
        unsafe { sh.fcollect_members(&sh.world(), dst, src, count) }
    }

    /// [`Shmem::fcollect_block`] over `team`: `dst` ends as the members' `src` in team order.
    ///
    /// # Safety
    /// As [`Shmem::fcollect_block`], over the team's members.
    #[inline(always)]
    pub unsafe fn team_fcollect_block<T: Copy>(&self, team: Team, dst: *mut T, src: *const T, count: usize) {
        let sh = &self.at(Op::TeamFcollectBlock);
        // SAFETY: this function's contract.
        unsafe { sh.fcollect_members(&sh.members_of(team), dst, src, count) }
    }

    /// The all-to-all over `m`, on a handle already [`Shmem::at`] its call.
    ///
    /// # Safety
    /// As [`Shmem::alltoall_block`], over `m`.
    #[inline(always)]
    unsafe fn alltoall_members<T: Copy>(&self, m: &Members, dst: *mut T, src: *const T, count: usize) {
        let (me, n) = (m.me, m.n);
        for k in 0..if count > 0 { n } else { 0 } {
            let j = (me + k) % n;
            // SAFETY: this function's contract; the device API checks `dst`'s range and the PE.
            unsafe {
                self.put_nbi_block(
                    dst.wrapping_add(me as usize * count),
                    src.wrapping_add(j as usize * count),
                    count,
                    m.pe(j),
                )
            };
        }
        self.barrier_members_block(m, true);
    }

    /// The broadcast over `m` from its member `root`.
    ///
    /// # Safety
    /// As [`Shmem::broadcast_block`], over `m`.
    #[inline(always)]
    unsafe fn broadcast_members<T: Copy>(&self, m: &Members, dst: *mut T, src: *const T, count: usize, root: u32) {
        let (me, n) = (m.me, m.n);
        // A `root` that is no member is reported on every PE (each calls with the same `root`).
        if root >= n {
            let mut f = Failure::new(ErrorKind::InvalidPe);
            f.peer = root;
            f.observed = root as u64;
            f.expected = n as u64;
            // A team's root is a team PE: the record names the team.
            f.size = m.team;
            self.fail(f);
        }
        if me == root && count > 0 {
            for k in 0..n {
                // SAFETY: this function's contract; the device API checks `dst`'s range.
                unsafe { self.put_nbi_block(dst, src, count, m.pe((me + k) % n)) };
            }
        }
        self.barrier_members_block(m, true);
    }

    /// The concatenation over `m`.
    ///
    /// # Safety
    /// As [`Shmem::fcollect_block`], over `m`.
    #[inline(always)]
    unsafe fn fcollect_members<T: Copy>(&self, m: &Members, dst: *mut T, src: *const T, count: usize) {
        let (me, n) = (m.me, m.n);
        for k in 0..if count > 0 { n } else { 0 } {
            // SAFETY: this function's contract; the device API checks `dst`'s range.
            unsafe { self.put_nbi_block(dst.wrapping_add(me as usize * count), src, count, m.pe((me + k) % n)) };
        }
        self.barrier_members_block(m, true);
    }
}

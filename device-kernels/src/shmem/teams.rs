//! Teams (OpenSHMEM 1.5's and NVSHMEM's): barriers, collectives and reductions over a strided
//! subset of the PEs, with PEs numbered within the team.
//!
//! The host makes a team with `Pe::team_split_strided` (collective over every PE) and passes the
//! [`Team`] to kernels as a `u64` ([`Team::to_bits`], [`Team::from_bits`]). Every team call
//! checks the handle against the slot the runtime keeps for it in this PE's heap header (a
//! handle of a destroyed team, or one never made on this PE, is `InvalidTeam`) and that this PE
//! is a member (`NotInTeam`), before anything moves. Each team has its own barrier words and its
//! own collective scratch, so members of two teams may run one team's collective while the other
//! team's runs elsewhere (a PE finished with its row team's reduction may start its column
//! team's while a row peer is still in the first). Within one team the world's rules hold: one
//! block (or one thread, for the thread-scope barrier and sync) per member at a time, and the
//! members call the same collectives in the same order. One PE runs one collective or barrier at
//! a time, whatever its team, as with the world (two blocks of a PE in collectives of two teams at
//! once are not tested, so not promised).
//!
//! Differences from NVSHMEM: `Pe::team_split_strided` and `Pe::team_destroy` are collective over
//! every PE of the world, not the parent's (the slot and the scratch are then the same on every
//! PE), and PEs outside the new team get its handle rather than `NVSHMEM_TEAM_INVALID`
//! ([`Shmem::team_my_pe`] is `None` there); [`Shmem::team_my_pe`], [`Shmem::team_n_pes`] and
//! [`Team::translate`] read the handle alone, with no check that the runtime holds it; there is no
//! `team_split_2d` and no predefined `TEAM_SHARED` or `TEAM_NODE`. Each team's scratch comes
//! from the heap (`IBGDA_COLLECTIVE_SCRATCH` bytes, as the world's).
//!
//! Team PEs are the team's own numbering: `root` of [`Shmem::team_broadcast_block`], the `j` of an
//! all-to-all's pieces and the order of a collect are team PEs 0, 1, ...; the puts go to the
//! world PEs [`Team::world_pe`] names.

use super::Shmem;
use crate::arch;
use crate::fail::Failure;
use ibgda_abi::{ErrorKind, HeapHeader, Op, Team, MAX_TEAMS};

/// Who takes part in a barrier or collective, as this PE sees it: the world, or a team it checked.
#[derive(Clone, Copy)]
pub(crate) struct Members {
    /// This PE's index among them.
    pub me: u32,
    /// How many they are.
    pub n: u32,
    start: u32,
    stride: u32,
    /// The barrier's words in this PE's heap header (the same offsets in every heap).
    pub arrivals: *mut u64,
    pub epoch: *mut u64,
    /// The collective scratch in this PE's heap, and its bytes.
    pub scratch: u64,
    pub scratch_bytes: u64,
    /// The team's handle bits for error records (0: the world).
    pub team: u64,
}

impl Members {
    /// The world PE of member `j`.
    #[inline(always)]
    pub fn pe(&self, j: u32) -> u32 {
        self.start + j * self.stride
    }
}

impl Shmem {
    /// Every PE, in world order, with the world's barrier words and scratch.
    #[inline(always)]
    pub(crate) fn world(&self) -> Members {
        let hdr = self.heap_base as *mut HeapHeader;
        Members {
            me: self.my_pe,
            n: self.n_pes,
            start: 0,
            stride: 1,
            // SAFETY: (address computations only) the runtime's header is at offset 0 of the heap.
            arrivals: unsafe { core::ptr::addr_of_mut!((*hdr).barrier_arrivals) },
            // SAFETY: as above.
            epoch: unsafe { core::ptr::addr_of_mut!((*hdr).barrier_epoch) },
            scratch: self.scratch,
            scratch_bytes: self.scratch_bytes,
            team: 0,
        }
    }

    /// `team` as this PE sees it, after checking that the runtime holds it here and that this PE
    /// is a member (the handle's errors name the call this handle is [`Shmem::at`]).
    #[inline(always)]
    pub(crate) fn members_of(&self, team: Team) -> Members {
        let bits = team.to_bits();
        let slot = team.slot() as usize;
        let world = Team::world(self.n_pes);
        if slot == 0 {
            if Some(team) != world {
                self.team_failure(ErrorKind::InvalidTeam, bits, world.map_or(0, Team::to_bits));
            }
            return self.world();
        }
        let hdr = self.heap_base as *mut HeapHeader;
        // SAFETY: the header's team slots are at offset 0 of this PE's heap; `slot < MAX_TEAMS`
        // (a `Team` holds no other). The host writes a slot only between kernels.
        let (held, scratch, scratch_bytes, w) = unsafe {
            let w = core::ptr::addr_of_mut!((*hdr).teams[slot]);
            (
                arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*w).team)),
                arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*w).scratch)),
                arch::load_relaxed_sys_u64(core::ptr::addr_of_mut!((*w).scratch_bytes)),
                w,
            )
        };
        if held != bits {
            self.team_failure(ErrorKind::InvalidTeam, bits, held);
        }
        let me = match team.pe_of(self.my_pe) {
            Some(me) => me,
            None => self.team_failure(ErrorKind::NotInTeam, bits, self.my_pe as u64),
        };
        Members {
            me,
            n: team.size(),
            start: team.start(),
            stride: team.stride(),
            // SAFETY: (address computations only) within the slot checked above.
            arrivals: unsafe { core::ptr::addr_of_mut!((*w).arrivals) },
            // SAFETY: as above.
            epoch: unsafe { core::ptr::addr_of_mut!((*w).epoch) },
            scratch,
            scratch_bytes,
            team: bits,
        }
    }

    #[inline(always)]
    fn team_failure(&self, kind: ErrorKind, bits: u64, expected: u64) -> ! {
        let mut f = Failure::new(kind);
        f.observed = bits;
        f.expected = expected;
        self.fail(f)
    }

    /// The team of every PE (NVSHMEM's `NVSHMEM_TEAM_WORLD`).
    #[inline(always)]
    pub fn team_world(&self) -> Team {
        match Team::world(self.n_pes) {
            Some(t) => t,
            // The host refuses worlds a handle cannot name, so no kernel gets here.
            None => arch::trap(),
        }
    }

    /// This PE's index in `team`, or `None` when it is not a member (NVSHMEM's `team_my_pe`,
    /// which returns -1 then). From the handle alone: no check that the runtime holds it.
    #[inline(always)]
    pub fn team_my_pe(&self, team: Team) -> Option<u32> {
        team.pe_of(self.my_pe)
    }

    /// How many PEs `team` has (NVSHMEM's `team_n_pes`).
    #[inline(always)]
    pub fn team_n_pes(&self, team: Team) -> u32 {
        team.size()
    }

    /// The world PE of `team`'s PE `team_pe`, for the device API's other calls, which take world
    /// PEs (`InvalidPe`, naming the team's size, when the team has no such PE).
    #[inline(always)]
    pub fn team_world_pe(&self, team: Team, team_pe: u32) -> u32 {
        match team.world_pe(team_pe) {
            Some(pe) => pe,
            None => {
                let mut f = Failure::new(ErrorKind::InvalidPe);
                f.peer = team_pe;
                f.observed = team_pe as u64;
                f.expected = team.size() as u64;
                f.size = team.to_bits();
                self.at(Op::TeamWorldPe).fail(f)
            }
        }
    }

    /// A barrier over `team` by one thread of each member (NVSHMEM's `barrier(team)`): this
    /// thread's operations complete first (a `quiet`), then it waits until every member arrived.
    #[inline(always)]
    pub fn team_barrier(&self, team: Team) {
        let sh = &self.at(Op::TeamBarrier);
        sh.barrier_members(&sh.members_of(team), true);
    }

    /// [`Shmem::team_barrier`] by every thread of one block of each member.
    #[inline(always)]
    pub fn team_barrier_block(&self, team: Team) {
        let sh = &self.at(Op::TeamBarrierBlock);
        let m = sh.members_of(team);
        sh.barrier_members_block(&m, true);
    }

    /// Waits until every member of `team` has called it (NVSHMEM's `team_sync`): the barrier
    /// without its `quiet` (see [`Shmem::sync_all`]). One thread of each member calls it.
    #[inline(always)]
    pub fn team_sync(&self, team: Team) {
        let sh = &self.at(Op::TeamSync);
        sh.barrier_members(&sh.members_of(team), false);
    }

    /// [`Shmem::team_sync`] by every thread of one block of each member.
    #[inline(always)]
    pub fn team_sync_block(&self, team: Team) {
        let sh = &self.at(Op::TeamSyncBlock);
        let m = sh.members_of(team);
        sh.barrier_members_block(&m, false);
    }
}

const _: () = assert!(MAX_TEAMS <= 256, "a handle keeps its slot in 8 bits");

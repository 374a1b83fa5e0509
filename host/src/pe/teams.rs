//! Teams on the host: [`Pe::team_split_strided`] makes one (collective over every PE), gives it a
//! slot of the heap header and a collective scratch of its own, and [`Pe::team_destroy`] gives
//! both back. Kernels get the [`Team`] handle as a `u64` and call the device API's `team_*`
//! functions with it.

use super::{enc, u64s, Backend, Pe};
use crate::error::{Error, Result};
use ibgda_abi::team::{TeamWords, MAX_TEAM_PES};
use ibgda_abi::{collective_scratch_bytes, HeapHeader, Team, MAX_TEAMS};

/// A team this PE holds: its handle and where its scratch is (heap offset; `None` without one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldTeam {
    team: Team,
    scratch: Option<u64>,
}

/// The heap offset of slot `slot`'s words in the header.
fn slot_offset(slot: u32) -> u64 {
    (std::mem::offset_of!(HeapHeader, teams) + slot as usize * std::mem::size_of::<TeamWords>()) as u64
}

impl Pe {
    /// The team of every PE (NVSHMEM's `NVSHMEM_TEAM_WORLD`): slot 0, PEs `0..n_pes` in order.
    pub fn team_world(&self) -> Team {
        Team::world(self.n_pes).expect("init refuses more PEs than a team handle names")
    }

    /// The teams this PE holds besides the world, by slot.
    pub fn teams(&self) -> Vec<Team> {
        self.teams.iter().flatten().map(|h| h.team).collect()
    }

    /// Makes the team of `size` PEs of `parent` from its PE `start`, `stride` apart (NVSHMEM's
    /// `team_split_strided`): parent PEs `start`, `start + stride`, ... become the new team's PEs
    /// 0, 1, .... Returns the handle kernels pass to the device API's `team_*` calls (as
    /// [`Team::to_bits`]); PEs outside the team get it too, and [`Team::pe_of`] tells them they
    /// are not members (a device team call from such a PE is `NotInTeam`).
    ///
    /// Collective over **every PE of the world**, members or not, with the same arguments (a
    /// difference from NVSHMEM, where only the parent's PEs call): the team's slot and its
    /// collective scratch (the size `IBGDA_COLLECTIVE_SCRATCH` gives the world's) are the same on
    /// every PE. Call it between kernels. At most [`MAX_TEAMS`] teams at once, the world included;
    /// [`Pe::team_destroy`] frees one. Errors name the PE and what was wrong: a parent this PE does
    /// not hold, `size` or `stride` 0, a member past the parent, every slot in use, a heap with no
    /// room for the scratch, PEs passing different arguments.
    pub fn team_split_strided(&mut self, parent: Team, start: u32, stride: u32, size: u32) -> Result<Team> {
        const CALL: &str = "team_split_strided";
        let local = self.plan_split(parent, start, stride, size);
        // Every PE learns every other's verdict and arguments before any acts: a PE that refuses
        // the call does not leave the others waiting in a later collective.
        let bits = local.as_ref().map_or(u64::MAX, |t| t.to_bits());
        let all = self.bootstrap.allgather(
            CALL,
            &enc(&[
                local.is_ok() as u64,
                parent.to_bits(),
                start as u64,
                stride as u64,
                size as u64,
                bits,
            ]),
        )?;
        let team = local?;
        let mine = format!(
            "parent {:#x}, start {start}, stride {stride}, size {size}",
            parent.to_bits()
        );
        for (j, b) in all.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            let theirs = format!("parent {:#x}, start {}, stride {}, size {}", w[1], w[2], w[3], w[4]);
            if theirs != mine {
                return Err(Error::CollectiveMismatch {
                    call: "team_split_strided (arguments)",
                    pe: self.rank,
                    mine,
                    other_pe: j as u32,
                    theirs,
                });
            }
            if w[0] == 0 {
                return Err(self.team_error(CALL, format!("PE {j} refused the same call (its own error says why)")));
            }
            if w[5] != bits {
                return Err(Error::CollectiveMismatch {
                    call: "team_split_strided (the free slot: the PEs' team histories differ)",
                    pe: self.rank,
                    mine: format!("{bits:#x}"),
                    other_pe: j as u32,
                    theirs: format!("{:#x}", w[5]),
                });
            }
        }
        let slot = team.slot();
        let bytes = collective_scratch_bytes(self.heap_size(), self.config.collective_scratch);
        let scratch = match bytes {
            0 => None,
            b => Some(self.malloc::<u8>(b as usize)?.offset()),
        };
        let words = TeamWords {
            scratch: scratch.map_or(0, |o| self.heap_base() + o),
            scratch_bytes: if scratch.is_some() { bytes } else { 0 },
            team: team.to_bits(),
            ..TeamWords::default()
        };
        let wrote = self.write_slot(slot, &words);
        // No member's kernel may use the team before every member's slot is written (a peer's
        // barrier adds to this PE's arrivals word), and a PE whose write failed undoes the call on
        // every PE.
        let all = self.bootstrap.allgather(CALL, &enc(&[wrote.is_ok() as u64]))?;
        if let Some(j) = all.iter().position(|b| u64s(b).next() != Some(1)) {
            let _ = self.write_slot(slot, &TeamWords::default());
            if let Some(o) = scratch {
                self.free_offset(o)?;
            }
            wrote?;
            return Err(self.team_error(
                CALL,
                format!("PE {j} could not write the team's slot (its own error says why)"),
            ));
        }
        self.teams[slot as usize] = Some(HeldTeam { team, scratch });
        self.generations[slot as usize] = team.generation().wrapping_add(1);
        tracing::debug!(
            pe = self.rank,
            slot,
            start = team.start(),
            stride = team.stride(),
            size,
            "team made"
        );
        Ok(team)
    }

    /// What this PE alone decides of a split: the handle, or why not.
    fn plan_split(&self, parent: Team, start: u32, stride: u32, size: u32) -> Result<Team> {
        const CALL: &str = "team_split_strided";
        self.check_held(CALL, parent)?;
        if size == 0 || stride == 0 {
            return Err(self.team_error(CALL, format!("size {size} and stride {stride} must both be at least 1")));
        }
        let last = start as u64 + (size as u64 - 1) * stride as u64;
        if last >= parent.size() as u64 {
            return Err(self.team_error(
                CALL,
                format!(
                    "its last member would be parent PE {last} (start {start}, stride {stride}, size {size}), past the parent's {} PEs",
                    parent.size()
                ),
            ));
        }
        let Some(slot) = (1..MAX_TEAMS).find(|&s| self.teams[s].is_none()) else {
            return Err(self.team_error(
                CALL,
                format!(
                    "all {} team slots are in use (at most {MAX_TEAMS} teams with the world): destroy one first",
                    MAX_TEAMS - 1
                ),
            ));
        };
        let world_start = parent.world_pe(start).expect("start <= last < parent size");
        // One member needs no stride; keep the handle the same whatever stride was passed.
        let world_stride = if size == 1 { 1 } else { parent.stride() * stride };
        Team::strided(slot as u32, world_start, world_stride, size)
            .map(|t| t.with_generation(self.generations[slot]))
            .ok_or_else(|| {
                self.team_error(
                    CALL,
                    format!("world PEs {world_start} + {world_stride} * i (i < {size}) exceed the PEs a handle names"),
                )
            })
    }

    /// Gives back `team`'s slot and scratch (NVSHMEM's `team_destroy`). Collective over every PE,
    /// with the same team, after every kernel that uses it (it waits for this PE's work first): a
    /// kernel given the handle afterwards gets `InvalidTeam`, even once a team of the same shape
    /// holds the slot again. The world cannot be destroyed.
    pub fn team_destroy(&mut self, team: Team) -> Result<()> {
        const CALL: &str = "team_destroy";
        let local = if team.slot() == 0 {
            Err(self.team_error(CALL, "the world team cannot be destroyed".into()))
        } else {
            self.check_held(CALL, team).and_then(|()| self.synchronize())
        };
        let all = self
            .bootstrap
            .allgather(CALL, &enc(&[local.is_ok() as u64, team.to_bits()]))?;
        local?;
        for (j, b) in all.iter().enumerate() {
            let w: Vec<u64> = u64s(b).collect();
            if w[1] != team.to_bits() {
                return Err(Error::CollectiveMismatch {
                    call: CALL,
                    pe: self.rank,
                    mine: format!("{:#x}", team.to_bits()),
                    other_pe: j as u32,
                    theirs: format!("{:#x}", w[1]),
                });
            }
            if w[0] == 0 {
                return Err(self.team_error(CALL, format!("PE {j} refused the same call (its own error says why)")));
            }
        }
        let slot = team.slot();
        let cleared = self.write_slot(slot, &TeamWords::default());
        let held = self.teams[slot as usize].take();
        if let Some(o) = held.and_then(|h| h.scratch) {
            self.free_offset(o)?;
        }
        cleared?;
        self.bootstrap.barrier(CALL)
    }

    fn team_error(&self, call: &'static str, why: String) -> Error {
        Error::Team {
            call,
            pe: self.rank,
            why,
        }
    }

    /// `Ok` when `team` is the world or a team this PE holds.
    fn check_held(&self, call: &'static str, team: Team) -> Result<()> {
        let held = match team.slot() {
            0 => Some(team) == Team::world(self.n_pes),
            s => self.teams[s as usize].is_some_and(|h| h.team == team),
        };
        if held {
            return Ok(());
        }
        Err(Error::Team {
            call,
            pe: self.rank,
            why: format!(
                "team {:#x} (slot {}, world PEs {} + {} * i for i < {}) is not held by this PE: destroyed, or from another run",
                team.to_bits(),
                team.slot(),
                team.start(),
                team.stride(),
                team.size()
            ),
        })
    }

    fn write_slot(&self, slot: u32, words: &TeamWords) -> Result<()> {
        let w = [
            words.arrivals,
            words.epoch,
            words.scratch,
            words.scratch_bytes,
            words.team,
            0,
            0,
            0,
        ];
        const _: () = assert!(std::mem::size_of::<TeamWords>() == 64);
        let bytes = enc(&w);
        match &self.backend {
            Backend::Gpu(g) => g.write_bytes(slot_offset(slot), &bytes),
            Backend::Cpu(c) => {
                c.write_bytes(slot_offset(slot), &bytes);
                Ok(())
            }
        }
    }
}

/// The world's size must fit a handle (checked at init).
pub(crate) fn check_world_size(rank: u32, n_pes: u32) -> Result<()> {
    if n_pes <= MAX_TEAM_PES {
        return Ok(());
    }
    Err(Error::Team {
        call: "init",
        pe: rank,
        why: format!("{n_pes} PEs are more than a team handle names ({MAX_TEAM_PES})"),
    })
}

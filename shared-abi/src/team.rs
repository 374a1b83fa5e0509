//! Teams: ordered subsets of the world's PEs that collectives and barriers run over, as
//! OpenSHMEM 1.5's and NVSHMEM's teams. A team is the world PEs `start`, `start + stride`, ...
//! (`size` of them); its PE `i` is world PE `start + i * stride`.
//!
//! The host makes teams (`Pe::team_split_strided`, collective over every PE) and passes the
//! [`Team`] handle to kernels as one `u64`. Each team owns a slot of the heap header
//! ([`TeamWords`]): its barrier's arrivals and epoch, where its collective scratch is, and the
//! handle itself, so a kernel given a handle the runtime does not hold (destroyed, or never made
//! on this PE) is told so instead of synchronising on another team's words. Slot 0 is the world.

/// Most teams a PE holds at once, the world included (NVSHMEM's default `NVSHMEM_MAX_TEAMS`).
pub const MAX_TEAMS: usize = 32;

/// Largest PE count a team handle can name (each field is 16 bits).
pub const MAX_TEAM_PES: u32 = 1 << 16;

/// A team handle: `start`, `stride` and `size` in world PEs, and the header slot the runtime gave
/// it, packed in one `u64` so a kernel takes it as a plain argument.
///
/// Bits 0..16 `start`, 16..32 `stride - 1`, 32..48 `size - 1`, 48..56 the slot, 56..64 the
/// slot's generation (how many teams the slot held before, modulo 256), so the handle of a
/// destroyed team is told from a later team of the same shape in the same slot.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Team(u64);

impl Team {
    /// The world of `n_pes` PEs (slot 0), or `None` when `n_pes` is 0 or more than
    /// [`MAX_TEAM_PES`].
    pub const fn world(n_pes: u32) -> Option<Team> {
        Team::strided(0, 0, 1, n_pes)
    }

    /// The team of `size` world PEs from `start`, `stride` apart, in header slot `slot`, or `None`
    /// when a field is out of range (`size` or `stride` 0, a PE past [`MAX_TEAM_PES`], `slot` not
    /// below [`MAX_TEAMS`]).
    pub const fn strided(slot: u32, start: u32, stride: u32, size: u32) -> Option<Team> {
        if size == 0 || stride == 0 || slot as usize >= MAX_TEAMS || start >= MAX_TEAM_PES {
            return None;
        }
        if stride > MAX_TEAM_PES || size > MAX_TEAM_PES {
            return None;
        }
        // The last member must be a PE a handle can name.
        let last = start as u64 + (size as u64 - 1) * stride as u64;
        if last >= MAX_TEAM_PES as u64 {
            return None;
        }
        Some(Team(
            start as u64 | ((stride - 1) as u64) << 16 | ((size - 1) as u64) << 32 | (slot as u64) << 48,
        ))
    }

    /// The handle as the `u64` a kernel is passed.
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// A handle from its bits, or `None` when they name no well-formed team (the device checks
    /// too that the runtime holds it).
    pub const fn from_bits(bits: u64) -> Option<Team> {
        let t = Team(bits);
        if t.slot() as usize >= MAX_TEAMS {
            return None;
        }
        match Team::strided(t.slot(), t.start(), t.stride(), t.size()) {
            Some(_) => Some(t),
            None => None,
        }
    }

    /// This team with the slot generation `generation` (see the type's bits).
    pub const fn with_generation(self, generation: u8) -> Team {
        Team(self.0 & !(0xff << 56) | (generation as u64) << 56)
    }

    /// The slot's generation this handle was made in.
    pub const fn generation(self) -> u8 {
        (self.0 >> 56) as u8
    }

    /// The header slot.
    pub const fn slot(self) -> u32 {
        (self.0 >> 48 & 0xff) as u32
    }

    /// The first member, in world PEs.
    pub const fn start(self) -> u32 {
        (self.0 & 0xffff) as u32
    }

    /// The distance between members, in world PEs (at least 1).
    pub const fn stride(self) -> u32 {
        (self.0 >> 16 & 0xffff) as u32 + 1
    }

    /// The number of members (at least 1).
    pub const fn size(self) -> u32 {
        (self.0 >> 32 & 0xffff) as u32 + 1
    }

    /// World PE `world_pe`'s index in the team, or `None` when it is not a member.
    pub const fn pe_of(self, world_pe: u32) -> Option<u32> {
        if world_pe < self.start() {
            return None;
        }
        let d = world_pe - self.start();
        if !d.is_multiple_of(self.stride()) || d / self.stride() >= self.size() {
            return None;
        }
        Some(d / self.stride())
    }

    /// The world PE of the team's PE `team_pe`, or `None` when the team has no such PE.
    pub const fn world_pe(self, team_pe: u32) -> Option<u32> {
        if team_pe >= self.size() {
            return None;
        }
        Some(self.start() + team_pe * self.stride())
    }

    /// `team_pe` of this team as a PE of `to` (NVSHMEM's `team_translate_pe`), or `None` when it
    /// is no PE of this team or not a member of `to`.
    pub const fn translate(self, team_pe: u32, to: Team) -> Option<u32> {
        match self.world_pe(team_pe) {
            Some(w) => to.pe_of(w),
            None => None,
        }
    }
}

/// One team's words in a PE's heap header ([`crate::HeapHeader::teams`]), at the same offset on
/// every PE. Slot 0 (the world) keeps its barrier in the header's own `barrier_arrivals` and
/// `barrier_epoch` and its scratch in the device state; its entry here is unused. Unlike the
/// world's, a team's arrivals and epoch share a line (32 slots of two lines would not fit the
/// header): the barrier thread's epoch store may meet peers' adds, which costs time, not
/// correctness.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeamWords {
    /// Barrier arrivals at this PE: every member adds 1 here (with a release atomic) per barrier.
    pub arrivals: u64,
    /// How many barriers of the team this PE has entered; touched only by its barrier thread.
    pub epoch: u64,
    /// The team's collective scratch in this PE's heap (a device address; the same heap offset on
    /// every PE), and its bytes.
    pub scratch: u64,
    /// Bytes of `scratch`.
    pub scratch_bytes: u64,
    /// The handle's bits while the slot holds a team, 0 when it is free (no handle of a slot above
    /// 0 is 0).
    pub team: u64,
    /// Padding to a line.
    pub _pad: [u64; 3],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_bad_teams_are_refused() {
        let t = Team::strided(5, 3, 4, 7).unwrap();
        assert_eq!((t.slot(), t.start(), t.stride(), t.size()), (5, 3, 4, 7));
        assert_eq!(Team::from_bits(t.to_bits()), Some(t));
        let w = Team::world(8).unwrap();
        assert_eq!((w.slot(), w.start(), w.stride(), w.size()), (0, 0, 1, 8));
        assert_eq!(Team::strided(1, 0, 1, 0), None, "size 0");
        assert_eq!(Team::strided(1, 0, 0, 2), None, "stride 0");
        assert_eq!(Team::strided(MAX_TEAMS as u32, 0, 1, 2), None, "slot");
        assert_eq!(Team::strided(1, 65_535, 1, 2), None, "last member past 16 bits");
        assert_eq!(Team::world(0), None);
        assert_eq!(Team::from_bits(u64::MAX), None);
        let later = t.with_generation(3);
        assert_eq!((later.generation(), later.slot(), later.size()), (3, 5, 7));
        assert_ne!(later, t);
        assert_eq!(Team::from_bits(later.to_bits()), Some(later));
        assert_eq!(Team::from_bits(t.to_bits() | 0x40 << 48), None, "slot 64");
    }

    #[test]
    fn membership_and_translation() {
        // World PEs 1, 3, 5.
        let odd = Team::strided(1, 1, 2, 3).unwrap();
        let want = [None, Some(0), None, Some(1), None, Some(2), None];
        for (w, want) in want.into_iter().enumerate() {
            assert_eq!(odd.pe_of(w as u32), want, "world PE {w}");
        }
        assert_eq!(odd.world_pe(2), Some(5));
        assert_eq!(odd.world_pe(3), None);
        // World PEs 3, 4, 5, 6.
        let upper = Team::strided(2, 3, 1, 4).unwrap();
        assert_eq!(odd.translate(1, upper), Some(0));
        assert_eq!(odd.translate(2, upper), Some(2));
        assert_eq!(odd.translate(0, upper), None);
        assert_eq!(odd.translate(3, upper), None);
    }

    #[test]
    fn words_are_one_line() {
        assert_eq!(core::mem::size_of::<TeamWords>(), 64);
        assert_eq!(core::mem::offset_of!(TeamWords, arrivals), 0);
        assert_eq!(core::mem::offset_of!(TeamWords, team), 32);
    }
}

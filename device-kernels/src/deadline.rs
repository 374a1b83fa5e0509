//! The clock of a device wait: how often a spinning thread reads the time, when it backs off, and
//! when it gives up.

use crate::arch;

/// Spins between two reads of the clock. A wait that succeeds within them never reads it (the
/// clock read costs more than a poll of a word in L2), so the timeout runs from the first check.
const SPINS_PER_CHECK: u32 = 0x100;

/// One wait's deadline: call [`Spin::tick`] after every poll that found the condition false.
pub(crate) struct Spin {
    timeout_ns: u64,
    start: u64,
    spins: u32,
}

impl Spin {
    #[inline(always)]
    pub(crate) const fn new(timeout_ns: u64) -> Spin {
        Spin {
            timeout_ns,
            start: 0,
            spins: 0,
        }
    }

    /// Counts one failed poll; `Some(elapsed_ns)` once the wait has lasted longer than its timeout.
    /// Backs off briefly at every clock check, so a long wait leaves the SM to other warps.
    #[inline(always)]
    pub(crate) fn tick(&mut self) -> Option<u64> {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CHECK) {
            return None;
        }
        let now = arch::global_timer_ns();
        if self.start == 0 {
            self.start = now;
            return None;
        }
        let elapsed = now.wrapping_sub(self.start);
        if elapsed > self.timeout_ns {
            return Some(elapsed);
        }
        arch::nanosleep(32);
        None
    }
}

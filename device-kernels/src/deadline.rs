//! The clock of every device wait: how often a spinning thread reads the time, how it backs off,
//! and when it gives up. Each wait (signal, `wait_until`, barrier, IBGDA queue and completion,
//! landing slot, proxy ring and completion, bulk-copy stage) counts its failed polls on one
//! [`Spin`] and reports its own attributed error when [`Spin::tick`] says the time is up.

use crate::arch;

/// One wait's deadline: call [`Spin::tick`] (or [`Spin::checkpoint`]) after every poll that found
/// the condition false.
pub(crate) struct Spin {
    timeout_ns: u64,
    start: u64,
    spins: u32,
    period: u32,
    backoff_ns: u32,
}

impl Spin {
    /// A deadline `timeout_ns` away that reads the clock every 256 failed polls and backs off 32 ns
    /// there. A wait that succeeds within the first 256 polls never reads the clock (a clock read
    /// costs more than a poll of a word in L2), so the time runs from the first clock read.
    #[inline(always)]
    pub(crate) const fn new(timeout_ns: u64) -> Spin {
        Spin {
            timeout_ns,
            start: 0,
            spins: 0,
            period: 256,
            backoff_ns: 32,
        }
    }

    /// Reads the clock every `polls` failed polls (a power of two) instead: waits whose polls are
    /// expensive (PCIe, atomics) or that must notice a dead peer sooner.
    #[inline(always)]
    pub(crate) const fn checking_every(mut self, polls: u32, backoff_ns: u32) -> Spin {
        self.period = polls;
        self.backoff_ns = backoff_ns;
        self
    }

    /// Counts one failed poll. At every clock read (every `period` polls) returns the time waited
    /// so far and backs off; `None` between clock reads.
    #[inline(always)]
    pub(crate) fn checkpoint(&mut self) -> Option<u64> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & (self.period - 1) != 0 {
            return None;
        }
        let now = arch::global_timer_ns();
        if self.start == 0 {
            // 0 marks "not started" (the GPU's clock is never 0; the host's starts there).
            self.start = now.max(1);
        }
        arch::nanosleep(self.backoff_ns);
        Some(now.wrapping_sub(self.start))
    }

    /// Whether `elapsed` (from [`Spin::checkpoint`]) is past the timeout.
    #[inline(always)]
    pub(crate) fn expired(&self, elapsed: u64) -> bool {
        elapsed > self.timeout_ns
    }

    /// Counts one failed poll; `Some(elapsed_ns)` once the wait has lasted longer than its timeout.
    #[inline(always)]
    pub(crate) fn tick(&mut self) -> Option<u64> {
        self.checkpoint().filter(|&e| self.expired(e))
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::Spin;

    #[test]
    fn reads_the_clock_only_at_checkpoints_and_expires_after_the_timeout() {
        let t0 = std::time::Instant::now();
        let mut s = Spin::new(2_000_000).checking_every(4, 0);
        let checkpoints: std::vec::Vec<bool> = (0..8).map(|_| s.checkpoint().is_some()).collect();
        assert_eq!(checkpoints, [false, false, false, true, false, false, false, true]);
        while s.tick().is_none() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "never expired");
        }
        assert!(t0.elapsed() >= std::time::Duration::from_millis(2));
    }
}

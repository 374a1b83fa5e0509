//! Bootstraps: how PEs find each other and exchange connection data before any kernel runs.
//!
//! [`ThreadBootstrap`] connects the PEs of one process (a thread per PE). Multi-process
//! bootstraps (torchrun/Slurm environment over TCP, MPI) implement the same trait.

mod thread;

pub use thread::ThreadBootstrap;

use crate::error::Result;

/// The collectives the runtime needs during setup and for host-side synchronisation.
pub trait Bootstrap: Send + Sync {
    /// This PE's index.
    fn rank(&self) -> u32;
    /// Number of PEs.
    fn size(&self) -> u32;
    /// Every PE contributes `mine`; every PE receives all contributions, indexed by rank.
    /// `call` names the collective in errors.
    fn allgather(&self, call: &'static str, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every PE has called it.
    fn barrier(&self, call: &'static str) -> Result<()> {
        self.allgather(call, &[]).map(|_| ())
    }
    /// Tells the other PEs this one has failed, so their collectives return an error instead of
    /// waiting for the timeout.
    fn abort(&self);
}

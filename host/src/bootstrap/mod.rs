//! Bootstraps: how PEs find each other and exchange connection data before any kernel runs.
//!
//! - [`ThreadBootstrap`]: the PEs of one process (a thread per PE; tests, `run_in_process`).
//! - [`TcpBootstrap`]: one process per PE, configured from the variables torchrun, Slurm and
//!   `ibgda-run` set ([`LaunchEnv`]).
//!
//! Every collective carries its name (and, across processes, a sequence number): PEs that call
//! different collectives get [`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch) on
//! every PE, naming both calls and PEs.

mod launch_env;
mod tcp;
mod thread;

pub use launch_env::{first_host, LaunchEnv};
pub use tcp::TcpBootstrap;
pub use thread::ThreadBootstrap;

use crate::error::Result;

/// The collectives the runtime needs during setup and for host-side synchronisation.
pub trait Bootstrap: Send + Sync {
    /// This PE's index.
    fn rank(&self) -> u32;
    /// Number of PEs.
    fn size(&self) -> u32;
    /// Every PE contributes `mine`; every PE receives all contributions, indexed by rank.
    /// `call` names the collective; PEs calling differently named collectives get
    /// `CollectiveMismatch`.
    fn allgather(&self, call: &'static str, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every PE has called it.
    fn barrier(&self, call: &'static str) -> Result<()> {
        self.allgather(call, &[]).map(|_| ())
    }
    /// Tells the other PEs this one has failed, so their collectives return an error instead of
    /// waiting for the timeout.
    fn abort(&self);
    /// A PE known to have failed (exited, been killed, or aborted), without waiting for a
    /// collective: lets a PE whose device wait timed out name the peer that caused it.
    fn failed_peer(&self) -> Option<u32> {
        None
    }
    /// `(local rank, local world size)` when the launcher said which processes share a node.
    fn local_rank(&self) -> Option<(u32, u32)> {
        None
    }
}

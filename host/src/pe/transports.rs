//! Which peers a PE reaches through the NIC, agreed by every PE: a pair uses the NIC when either
//! side asks for it; one job uses it either GPU-initiated (IBGDA) or through CPU proxies.

use crate::bootstrap::Bootstrap;
use crate::config::{Config, PeerTransport};
use crate::error::{Error, Result};
use crate::transport::ibgda::IbgdaOptions;

pub(crate) struct TransportPlan {
    /// NIC peers are reached through the proxy (else GPU-initiated IBGDA).
    pub use_proxy: bool,
    /// Per peer: reached through the NIC.
    pub nic_peers: Vec<bool>,
    /// Some pair of PEs in the job uses the NIC (every PE then takes part in the NIC setup).
    pub any_nic: bool,
}

impl TransportPlan {
    /// Collective.
    pub fn agree(boot: &dyn Bootstrap, config: &Config) -> Result<TransportPlan> {
        let rank = boot.rank();
        let n = boot.size();
        let wants: Vec<u64> = (0..n)
            .map(|j| match config.transport_to(j) {
                _ if j == rank => 0,
                PeerTransport::Ibgda => 1,
                PeerTransport::Proxy => 2,
                PeerTransport::Auto | PeerTransport::P2p => 0,
            })
            .collect();
        let all_wants: Vec<Vec<u64>> = boot
            .allgather("init/transports", &super::enc(&wants))?
            .iter()
            .map(|b| super::u64s(b).collect())
            .collect();
        if let Some(j) = all_wants.iter().position(|w| w.len() != n as usize) {
            return Err(Error::CollectiveMismatch {
                call: "init (transports: world size)",
                pe: rank,
                mine: n.to_string(),
                other_pe: j as u32,
                theirs: all_wants[j].len().to_string(),
            });
        }
        let asked = |k: u64| all_wants.iter().position(|w| w.contains(&k));
        let use_proxy = match (asked(1), asked(2)) {
            (Some(a), Some(b)) => {
                return Err(Error::Config {
                    name: "transport",
                    value: format!("PE {a} asks for ibgda, PE {b} for proxy"),
                    why: "one job reaches its NIC peers either GPU-initiated or through the proxy, not both".into(),
                })
            }
            (_, p) => p.is_some(),
        };
        let pair = |i: usize, j: usize| i != j && (all_wants[i][j] != 0 || all_wants[j][i] != 0);
        let nic_peers = (0..n as usize).map(|j| pair(rank as usize, j)).collect();
        let any_nic = (0..n as usize).any(|i| (0..n as usize).any(|j| pair(i, j)));
        Ok(TransportPlan {
            use_proxy,
            nic_peers,
            any_nic,
        })
    }

    /// The QP layout of the NIC side.
    pub fn nic_options(&self, config: &Config) -> IbgdaOptions {
        if self.use_proxy {
            config.proxy.qp_options()
        } else {
            config.ibgda
        }
    }
}

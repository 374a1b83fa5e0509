//! The emulated device's rate model, host side: the parameters of the ConnectX port the engine
//! stands for (`ibgda_nic_emu::model` paces the engine with them), their ConnectX-7
//! defaults, and their environment variables. Sources for every default:
//! `docs/nic-rate-model-sources.md`.

use crate::error::{Error, Result};

/// A NIC port's speed, as the emulated device models it: every WQE takes port time (the larger
/// of its bytes over the link rate and one message slot), its data lands one `latency_ns` after
/// its transmission ends (two for a READ or an atomic), and WQEs in queues the NIC would fetch by
/// DMA pay `wqe_fetch_ns` first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateModel {
    /// Link rate per port, Gb/s (`IBGDA_NIC_LINK_GBPS`).
    pub link_gbps: f64,
    /// Message-rate ceiling of the NIC, millions of messages per second (`IBGDA_NIC_MSG_RATE`).
    pub msg_rate_mps: f64,
    /// One-way latency of NIC and wire, ns (`IBGDA_NIC_LATENCY_NS`).
    pub latency_ns: u64,
    /// PCIe round trip of a WQE fetch by DMA, ns (`IBGDA_NIC_WQE_FETCH_NS`).
    pub wqe_fetch_ns: u64,
    /// RDMA READs and atomics a QP may have outstanding at once (its `max_rd_atomic`, bounded by
    /// the device's `max_qp_rd_atom`); 0 for no limit (`IBGDA_NIC_MAX_RD_ATOMIC`). The engine
    /// ends a batch at the READ or atomic past it, so each such group pays its own round trip.
    /// Atomics have no rate of their own: each takes a message slot like any WQE (NVIDIA publishes
    /// no separate ConnectX-7 atomic rate), its result bytes on the receiver, and a round trip.
    pub max_rd_atomic: u32,
}

impl RateModel {
    /// A ConnectX-7 port: 400 Gb/s (NVIDIA's CX-7 manual), 330 M messages/s (the CX-7
    /// datasheet's lower figure), 600 ns one way (ConnectX-6's "sub-600ns"; no CX-7 figure was
    /// found), a 600 ns WQE fetch (a measured 64-byte PCIe read round trip, 572 ns) and 16
    /// READs or atomics outstanding per QP (mlx5's `max_qp_rd_atom`, `1 << log_max_ra_req_qp`).
    pub const CONNECTX7: RateModel = RateModel {
        link_gbps: 400.0,
        msg_rate_mps: 330.0,
        latency_ns: 600,
        wqe_fetch_ns: 600,
        max_rd_atomic: 16,
    };

    /// The model `IBGDA_NIC_MODEL` asks for: `off` (or unset: `default`), `cx7`, each parameter
    /// then overridable by its own variable.
    pub fn from_env(default: Option<RateModel>) -> Result<Option<RateModel>> {
        let bad = |name: &'static str, value: String, why: &str| Error::Config {
            name,
            value,
            why: why.into(),
        };
        let mut m = match std::env::var("IBGDA_NIC_MODEL").ok().as_deref() {
            None | Some("") => default,
            Some("off") => None,
            Some("cx7") => Some(RateModel::CONNECTX7),
            Some(v) => return Err(bad("IBGDA_NIC_MODEL", v.into(), "expected `off` or `cx7`")),
        };
        if let Some(m) = m.as_mut() {
            let positive = |name: &'static str| -> Result<Option<f64>> {
                match std::env::var(name) {
                    Err(_) => Ok(None),
                    Ok(v) => match v.parse::<f64>() {
                        Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                        _ => Err(bad(name, v, "expected a positive number")),
                    },
                }
            };
            if let Some(x) = positive("IBGDA_NIC_LINK_GBPS")? {
                m.link_gbps = x;
            }
            if let Some(x) = positive("IBGDA_NIC_MSG_RATE")? {
                m.msg_rate_mps = x;
            }
            if let Ok(v) = std::env::var("IBGDA_NIC_MAX_RD_ATOMIC") {
                m.max_rd_atomic = v
                    .parse()
                    .map_err(|_| bad("IBGDA_NIC_MAX_RD_ATOMIC", v.clone(), "expected a count (0: no limit)"))?;
            }
            for (name, field) in [
                ("IBGDA_NIC_LATENCY_NS", &mut m.latency_ns),
                ("IBGDA_NIC_WQE_FETCH_NS", &mut m.wqe_fetch_ns),
            ] {
                if let Ok(v) = std::env::var(name) {
                    *field = v
                        .parse()
                        .map_err(|_| bad(name, v.clone(), "expected whole nanoseconds"))?;
                }
            }
        }
        Ok(m)
    }

    /// Link time per byte, femtoseconds.
    pub fn fs_per_byte(&self) -> u64 {
        (8.0e6 / self.link_gbps).round() as u64
    }

    /// Port time per message, femtoseconds.
    pub fn fs_per_msg(&self) -> u64 {
        (1.0e9 / self.msg_rate_mps).round() as u64
    }

    /// The message size (bytes) above which the link, not the message rate, limits the port.
    pub fn link_bound_above(&self) -> u64 {
        self.fs_per_msg() / self.fs_per_byte().max(1)
    }
}

impl std::fmt::Display for RateModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} Gb/s, {} M msg/s, {} ns one way, {} ns WQE fetch, {} READs/atomics outstanding per QP",
            self.link_gbps, self.msg_rate_mps, self.latency_ns, self.wqe_fetch_ns, self.max_rd_atomic
        )
    }
}

/// What the model did on one device since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// WQEs it paced.
    pub wqes: u64,
    /// Nanoseconds engine threads waited on it (summed over threads).
    pub wait_ns: u64,
    /// The transmitter's clock: picoseconds from the device's model epoch up to which it is
    /// booked (0: never used). Only this device's engine books it.
    pub tx_booked_ps: u64,
    /// The receiver's clock (READ responses and atomic results for this device's requests), as
    /// `tx_booked_ps`.
    pub rx_booked_ps: u64,
    /// Idle picoseconds the transmitter's clock jumped over, each time a booking raised an idle
    /// clock to its ready time: between two readings, the advance of `tx_booked_ps` minus the
    /// advance of this is the port time booked. Jumps are where a slow engine can leave the
    /// modelled port idle (a booking made late, with WQEs fetched before the jump, queues after
    /// it instead of filling the gap).
    pub tx_idle_ps: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectx7_in_engine_units() {
        let m = RateModel::CONNECTX7;
        // 400 Gb/s is 50 bytes per ns: 20 ps a byte.
        assert_eq!(m.fs_per_byte(), 20_000);
        // 330 M messages/s: 3.03 ns each.
        assert_eq!(m.fs_per_msg(), 3_030_303);
        // Below ~151 bytes a message is bound by the message rate.
        assert_eq!(m.link_bound_above(), 151);
    }
}

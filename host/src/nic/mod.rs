//! NIC backends behind one boundary ([`backend`]): the transports hold a [`Nic`] and its
//! [`NicQp`]s and never name a backend. [`emulated`] wraps the emulated mlx5 device
//! ([`crate::emu`]); [`mlx5`] drives a ConnectX through rdma-core's DEVX interface, loaded at run
//! time ([`rdma_core`]); [`verbs`] drives any RDMA device through standard verbs for the CPU proxy;
//! [`probe`] decides per GPU which one (and which doorbell path) a job uses, and
//! [`open_for_gpu`]/[`open_for_cpu`] open it at init.

pub mod backend;
mod device_list;
pub mod emulated;
pub mod mlx5;
pub mod mmio;
pub mod probe;
pub mod rdma_core;
pub mod verbs;

pub use backend::{
    access, Backend, HostQueues, LinkLayer, MemoryKey, Nic, NicAddress, NicQp, PortAddress, QpQueues, QueueHome,
    RemoteQp,
};
pub use emulated::EmulatedNic;
pub use probe::{probe, probe_with, Affinity, GpuPlan, Mode, NicChoice, Probe};
pub use rdma_core::{RdmaCore, RdmaDevice};

use crate::emu::Fabric;
use crate::error::Result;
use crate::placement::Placement;
use std::sync::Arc;

/// What a GPU PE asks of the NIC layer at init (from [`crate::Config`]).
#[derive(Clone, Debug, Default)]
pub struct NicRequest {
    /// `IBGDA_NIC`.
    pub choice: NicChoice,
    /// `IBGDA_HCA`: the RDMA device, or the first mlx5 one.
    pub hca: Option<String>,
    /// `IBGDA_IB_PORT`.
    pub port: u8,
    /// `IBGDA_GID_INDEX`.
    pub gid_index: u8,
    /// `IBGDA_NIC_MODEL`: the emulated device's rate model (ignored by real NICs).
    pub model: Option<crate::emu::RateModel>,
}

impl NicRequest {
    /// The request a configuration makes.
    pub fn from_config(c: &crate::Config) -> NicRequest {
        NicRequest {
            choice: c.nic,
            hca: c.hca.clone(),
            port: c.ib_port,
            gid_index: c.gid_index,
            model: c.nic_model,
        }
    }
}

/// Opens PE `me`'s NIC as `req` asks, its queues in `placement`: a ConnectX through DEVX
/// ([`mlx5::Mlx5Nic`]) for `mlx5`, and for `auto` when one opens (else, for the proxy, any RDMA
/// device through verbs when one opens); any RDMA device through
/// standard verbs ([`verbs::VerbsNic`]) for `verbs` (the CPU proxy only: `proxy`); else the
/// emulated device on `fabric`, saying once per process why. `gpu_doorbell` is whether the PE's
/// posters want to ring the doorbell themselves; on a ConnectX whose UAR page the driver will not
/// map into the GPU it comes back `false` (the CPU-assisted doorbell then serves the PE, as
/// NVSHMEM falls back).
pub fn open_for_gpu(
    req: &NicRequest,
    fabric: &Fabric,
    placement: Placement,
    me: u32,
    proxy: bool,
    gpu_doorbell: &mut bool,
) -> Result<Box<dyn Nic>> {
    if req.choice == NicChoice::Verbs {
        return open_verbs(req, placement, me, proxy);
    }
    if req.choice != NicChoice::Emu {
        let (verbs, libmlx5) = libraries();
        // Without IBGDA_HCA, the mlx5 device nearest this PE's GPU.
        let nearest = match (&req.hca, &placement) {
            (None, Placement::Gpu(a)) => probe::nearest_mlx5(&verbs, &libmlx5, a.context().ordinal()),
            _ => None,
        };
        let opened = open_mlx5(req, req.hca.as_deref().or(nearest.as_deref()), placement.clone(), me);
        match opened {
            Ok(nic) => {
                if *gpu_doorbell {
                    if let Err(e) = nic.map_gpu_doorbell() {
                        say_once(&format!(
                            "PE {me}: {e}; this PE rings its doorbells from the CPU (CPU-assisted IBGDA)"
                        ));
                        *gpu_doorbell = false;
                    }
                }
                return Ok(Box::new(nic));
            }
            Err(e) if req.choice == NicChoice::Mlx5 => return Err(e),
            Err(e) => {
                let short = |e: &crate::Error| match e {
                    crate::Error::Nic { op, what, .. } => format!("{op}: {what}"),
                    other => other.to_string(),
                };
                let mut why = short(&e);
                // No ConnectX, but the proxy can drive any RDMA device through verbs.
                if proxy {
                    match open_verbs(req, placement.clone(), me, proxy) {
                        Ok(nic) => return Ok(nic),
                        Err(v) => why = format!("{why}; verbs: {}", short(&v)),
                    }
                }
                say_once(&format!(
                    "PE {me}: no ConnectX to drive ({why}); peers behind a NIC use the emulated mlx5 device (IBGDA_NIC=emu skips the search; ibgda-probe shows what this node has)"
                ))
            }
        }
    }
    Ok(Box::new(EmulatedNic::open_modelled(fabric, placement, me, req.model)?))
}

/// A GPU range's dma-buf for a NIC: dma-bufs cover whole host pages, so the export is the range
/// rounded out to pages, and the registration names where `addr` falls in it. `Err` says why
/// there is none (host memory, or an export the driver refuses).
pub(crate) fn dmabuf_for(
    ctx: Option<&Arc<cudarc::driver::CudaContext>>,
    pe: u32,
    addr: u64,
    len: u64,
) -> std::result::Result<(std::os::fd::OwnedFd, u64), String> {
    let Some(ctx) = ctx else {
        return Err("host memory".into());
    };
    let page = crate::placement::host_page_size() as u64;
    let start = addr & !(page - 1);
    let end = (addr + len).next_multiple_of(page);
    crate::cuda::dmabuf_fd(ctx, pe, start, end - start)
        .map(|fd| (fd, addr - start))
        .map_err(|e| e.to_string())
}

/// Prints `msg` on stderr the first time this process has something to say about its NIC.
fn say_once(msg: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("ibgda: {msg}"));
    tracing::info!("{msg}");
}

/// Opens PE `me`'s NIC for a CPU-emulated PE (host memory throughout): the emulated device for
/// `auto` and `emu` (the CPU emulation's point), a ConnectX for `mlx5`, any RDMA device for
/// `verbs` (the CPU proxy only: `proxy`).
pub fn open_for_cpu(
    req: &NicRequest,
    fabric: &Fabric,
    placement: Placement,
    me: u32,
    proxy: bool,
) -> Result<Box<dyn Nic>> {
    match req.choice {
        NicChoice::Auto | NicChoice::Emu => Ok(Box::new(EmulatedNic::open_modelled(fabric, placement, me, req.model)?)),
        NicChoice::Verbs => open_verbs(req, placement, me, proxy),
        NicChoice::Mlx5 => Ok(Box::new(open_mlx5(req, req.hca.as_deref(), placement, me)?)),
    }
}

/// A ConnectX through DEVX: device `hca` (or the first mlx5 one) on the request's port.
fn open_mlx5(req: &NicRequest, hca: Option<&str>, placement: Placement, me: u32) -> Result<mlx5::Mlx5Nic> {
    let (verbs, libmlx5) = libraries();
    let lib = Arc::new(mlx5::Mlx5Lib::load(&verbs, &libmlx5)?);
    mlx5::Mlx5Nic::open(lib, hca, req.port, req.gid_index, placement, me)
}

fn libraries() -> (String, String) {
    (
        std::env::var("IBGDA_LIBIBVERBS").unwrap_or_else(|_| rdma_core::LIBIBVERBS.into()),
        std::env::var("IBGDA_LIBMLX5").unwrap_or_else(|_| rdma_core::LIBMLX5.into()),
    )
}

fn open_verbs(req: &NicRequest, placement: Placement, me: u32, proxy: bool) -> Result<Box<dyn Nic>> {
    if !proxy {
        return Err(crate::Error::Config {
            name: "IBGDA_NIC",
            value: "verbs".into(),
            why: "a verbs NIC serves the CPU proxy only (IBGDA_TRANSPORT=proxy): GPU-posted work needs an mlx5 NIC"
                .into(),
        });
    }
    let lib = Arc::new(verbs::VerbsLib::load(&libraries().0)?);
    Ok(Box::new(verbs::VerbsNic::open(
        lib,
        req.hca.as_deref(),
        req.port,
        req.gid_index,
        placement,
        me,
    )?))
}

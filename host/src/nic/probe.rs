//! The capability probe (`ibgda-probe`): the node's RDMA devices and GPUs, where they sit on
//! PCIe, and for each GPU which way it would reach a peer behind a NIC, and why.
//!
//! The mlx5 backend's control plane exists ([`super::mlx5`]) and the probe uses it: for the mlx5
//! NIC a GPU would use, it opens the device with DEVX (PD, port, EQ) and reports whether that
//! works and why not. The data path over it is not wired into the transports yet, and the verbs
//! proxy is not written, so peers behind a NIC are still served by the emulated mlx5 device
//! whatever the node has; the probe says so, so that a user on a ConnectX host sees what is there
//! and what is missing rather than a silent fallback.

use super::mlx5::{LinkLayer, Mlx5Device, Mlx5Lib};
use super::rdma_core::{RdmaCore, RdmaDevice, LIBIBVERBS, LIBMLX5};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `IBGDA_NIC`: which NIC backend serves peers behind a NIC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NicChoice {
    /// A ConnectX through DEVX when one opens, else the emulated device.
    #[default]
    Auto,
    /// The emulated mlx5 device.
    Emu,
    /// A ConnectX through mlx5 DEVX (an error when none opens).
    Mlx5,
    /// Any RDMA device through a CPU proxy on `ibv_post_send` (`IBGDA_TRANSPORT=proxy`).
    Verbs,
}

impl std::str::FromStr for NicChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<NicChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(NicChoice::Auto),
            "emu" => Ok(NicChoice::Emu),
            "mlx5" => Ok(NicChoice::Mlx5),
            "verbs" => Ok(NicChoice::Verbs),
            _ => Err(Error::Config {
                name: "IBGDA_NIC",
                value: s.into(),
                why: "expected auto, emu, mlx5 or verbs".into(),
            }),
        }
    }
}

/// How a GPU reaches peers behind a NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// GPU-built WQEs, GPU-rung doorbell on a ConnectX.
    GpuDoorbell,
    /// GPU-built WQEs, CPU-rung doorbell on a ConnectX.
    CpuDoorbell,
    /// CPU proxy over ordinary verbs.
    VerbsProxy,
    /// The emulated mlx5 device.
    Emulated,
}

/// How close two PCI devices are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Affinity {
    /// Below one PCIe switch (nvidia-smi's PIX/PXB).
    SameSwitch,
    /// Below one root complex (PHB).
    SameRootComplex,
    /// Across root complexes or sockets (NODE/SYS).
    CrossRootComplex,
}

/// One RDMA device.
#[derive(Clone, Debug)]
pub struct NicInfo {
    /// rdma-core's view.
    pub device: RdmaDevice,
    /// Its PCI address, from sysfs.
    pub pci: Option<String>,
}

/// One GPU.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Its name.
    pub name: String,
    /// Its PCI address (`dddd:bb:dd.0`).
    pub pci: Option<String>,
}

/// The decision for one GPU.
#[derive(Clone, Debug)]
pub struct GpuPlan {
    /// The GPU.
    pub gpu: GpuInfo,
    /// The nearest RDMA device and how near.
    pub nearest: Option<(String, Option<Affinity>)>,
    /// What it will use.
    pub mode: Mode,
    /// Why.
    pub why: String,
}

/// What the probe found.
#[derive(Clone, Debug)]
pub struct Probe {
    /// `IBGDA_NIC`.
    pub choice: NicChoice,
    /// rdma-core loaded (with libmlx5 or not), or why not.
    pub rdma_core: std::result::Result<bool, String>,
    /// The RDMA devices.
    pub nics: Vec<NicInfo>,
    /// For each mlx5 device: what a DEVX open found, or the step that failed.
    pub devx: BTreeMap<String, std::result::Result<String, String>>,
    /// The GPUs, or why none could be listed.
    pub gpus: std::result::Result<Vec<GpuInfo>, String>,
    /// One plan per GPU.
    pub plans: Vec<GpuPlan>,
    /// The node's way to peers behind a NIC without regard to GPU placement (the first RDMA
    /// device), and why: what a node without a listed GPU (the CPU emulation) uses.
    pub node: (Mode, String),
}

/// The sysfs directory of PCI device `addr`, resolved (its path names every bridge above it).
fn pci_path(sysfs: &Path, addr: &str) -> Option<PathBuf> {
    std::fs::canonicalize(sysfs.join("bus/pci/devices").join(addr)).ok()
}

/// How near two resolved sysfs PCI paths are: the bridges they share below the root complex.
pub fn affinity(a: &Path, b: &Path) -> Affinity {
    let (ca, cb): (Vec<_>, Vec<_>) = (a.components().collect(), b.components().collect());
    let shared = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    // /sys/devices/pci0000:00/<root port>/<switch ports...>/<device>
    let root = ca
        .iter()
        .position(|c| c.as_os_str().to_string_lossy().starts_with("pci"))
        .unwrap_or(usize::MAX);
    if root == usize::MAX || shared <= root {
        Affinity::CrossRootComplex
    } else if shared <= root + 2 {
        // Only the root complex, or one root port, in common.
        Affinity::SameRootComplex
    } else {
        Affinity::SameSwitch
    }
}

fn nic_pci(sysfs: &Path, name: &str) -> Option<String> {
    let dev = std::fs::canonicalize(sysfs.join("class/infiniband").join(name).join("device")).ok()?;
    dev.file_name().map(|f| f.to_string_lossy().into_owned())
}

fn gpus() -> std::result::Result<Vec<GpuInfo>, String> {
    use cudarc::driver::{result, sys};
    if !crate::cuda::driver_available() {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    result::init().map_err(|e| format!("cuInit: {e}"))?;
    let n = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
    (0..n)
        .map(|i| {
            let dev = result::device::get(i).map_err(|e| format!("cuDeviceGet({i}): {e}"))?;
            let name = result::device::get_name(dev).unwrap_or_else(|_| "?".into());
            let attr = |a| {
                // SAFETY: a valid device and attribute.
                unsafe { result::device::get_attribute(dev, a) }.ok()
            };
            let pci = match (
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
            ) {
                (Some(d), Some(b), Some(s)) => Some(format!("{d:04x}:{b:02x}:{s:02x}.0")),
                _ => None,
            };
            Ok(GpuInfo {
                ordinal: i as usize,
                name,
                pci,
            })
        })
        .collect()
}

/// Probes this node: rdma-core from `libibverbs` and `libmlx5` (library names or paths), RDMA
/// devices and GPU PCI placement from `sysfs` (normally `/sys`), a DEVX open of each mlx5 device,
/// and decides per GPU under `choice`.
pub fn probe_with(choice: NicChoice, libibverbs: &str, libmlx5: &str, sysfs: &Path) -> Probe {
    let core = RdmaCore::load_with(libibverbs, libmlx5);
    let nics: Vec<NicInfo> = match &core {
        Ok(c) => c
            .devices()
            .into_iter()
            .map(|d| NicInfo {
                pci: nic_pci(sysfs, &d.name),
                device: d,
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let devx = devx_checks(choice, libibverbs, libmlx5, &nics);
    let gpus = gpus();
    let plans = match &gpus {
        Ok(list) => list
            .iter()
            .map(|g| {
                let gpath = g.pci.as_deref().and_then(|a| pci_path(sysfs, a));
                let nearest = nics
                    .iter()
                    .map(|n| {
                        let aff = match (&gpath, n.pci.as_deref().and_then(|a| pci_path(sysfs, a))) {
                            (Some(a), Some(b)) => Some(affinity(a, &b)),
                            _ => None,
                        };
                        (n.device.name.clone(), aff)
                    })
                    .min_by_key(|(_, a)| a.unwrap_or(Affinity::CrossRootComplex));
                let (mut mode, mut why) = decide(choice, &core, &nics, &devx, nearest.as_ref());
                if mode == Mode::GpuDoorbell {
                    let nic = nearest.as_ref().map(|n| n.0.as_str()).unwrap_or_default();
                    match gpu_maps_uar(libibverbs, libmlx5, nic, g.ordinal) {
                        Ok(()) => why = format!("{why}: the UAR page maps into this GPU, so the GPU rings"),
                        Err(UarCheck::Refused(e)) => {
                            mode = Mode::CpuDoorbell;
                            why = format!(
                                "{why}: but the driver will not map {nic}'s UAR page into this GPU ({e}); \
                                 NVreg_RegistryDwords=\"PeerMappingOverride=1;\" (or root) would allow the GPU \
                                 doorbell: the CPU-assisted doorbell serves this GPU"
                            );
                        }
                        Err(UarCheck::Step(e)) => {
                            mode = Mode::CpuDoorbell;
                            why = format!(
                                "{why}: but checking the GPU doorbell failed before the mapping ({e}): the \
                                 CPU-assisted doorbell serves this GPU until that is resolved"
                            );
                        }
                    }
                }
                GpuPlan {
                    gpu: g.clone(),
                    nearest,
                    mode,
                    why,
                }
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let first = nics.first().map(|n| (n.device.name.clone(), None));
    let node = decide(choice, &core, &nics, &devx, first.as_ref());
    Probe {
        choice,
        node,
        devx,
        rdma_core: core.map(|c| c.has_mlx5dv()),
        nics,
        gpus,
        plans,
    }
}

/// [`probe_with`] on this machine: `IBGDA_LIBIBVERBS` (else `libibverbs.so.1`),
/// `IBGDA_LIBMLX5` (else `libmlx5.so.1`) and `/sys`.
pub fn probe(choice: NicChoice) -> Probe {
    let verbs = std::env::var("IBGDA_LIBIBVERBS").unwrap_or_else(|_| LIBIBVERBS.into());
    let mlx5 = std::env::var("IBGDA_LIBMLX5").unwrap_or_else(|_| LIBMLX5.into());
    probe_with(choice, &verbs, &mlx5, Path::new("/sys"))
}

/// Why a GPU doorbell check failed: the driver refused the mapping, or a step before it failed.
enum UarCheck {
    Refused(String),
    Step(String),
}

/// The mlx5 device nearest GPU `ordinal` on the PCIe tree (`None` when rdma-core, the GPU's or
/// every NIC's PCIe address cannot be found): what a PE opens when `IBGDA_HCA` names none, so that
/// each GPU uses the NIC under its own switch, as NVSHMEM maps PEs to NICs.
pub fn nearest_mlx5(libibverbs: &str, libmlx5: &str, ordinal: usize) -> Option<String> {
    let sysfs = Path::new("/sys");
    let core = RdmaCore::load_with(libibverbs, libmlx5).ok()?;
    let gpu = gpus().ok()?.into_iter().find(|g| g.ordinal == ordinal)?;
    let gpath = pci_path(sysfs, gpu.pci.as_deref()?)?;
    core.devices()
        .into_iter()
        .filter(|d| d.mlx5 == Some(true))
        .filter_map(|d| {
            let p = pci_path(sysfs, &nic_pci(sysfs, &d.name)?)?;
            Some((affinity(&gpath, &p), d.name))
        })
        .min()
        .map(|(_, name)| name)
}

/// Whether GPU `ordinal` can map a doorbell UAR page of mlx5 device `nic` (what a GPU-rung
/// doorbell needs): opens the device with DEVX, allocates a UAR and tries the mapping.
fn gpu_maps_uar(libibverbs: &str, libmlx5: &str, nic: &str, ordinal: usize) -> std::result::Result<(), UarCheck> {
    let step = |e: String| UarCheck::Step(e);
    let lib = Arc::new(Mlx5Lib::load(libibverbs, libmlx5).map_err(|e| step(e.to_string()))?);
    let (port, gid) = probe_port();
    let dev = Mlx5Device::open(lib, Some(nic), port, gid).map_err(|e| step(e.to_string()))?;
    let uar = dev.alloc_uar().map_err(|e| step(e.to_string()))?;
    let ctx =
        cudarc::driver::CudaContext::new(ordinal).map_err(|e| step(format!("CUDA context on GPU {ordinal}: {e}")))?;
    let len = crate::placement::host_page_size();
    // SAFETY: the UAR page rdma-core mapped; it stays mapped until `uar` drops, after the mapping.
    let mapped = unsafe { crate::cuda::MappedIo::register(&ctx, 0, uar.page_addr(), len) };
    mapped.map(drop).map_err(|e| match e {
        Error::Cuda { source, .. } => UarCheck::Refused(format!("cuMemHostRegister(IOMEMORY): {source:?}")),
        other => UarCheck::Step(other.to_string()),
    })
}

/// The port and GID index init would use (`IBGDA_IB_PORT`, `IBGDA_GID_INDEX`).
fn probe_port() -> (u8, u8) {
    let get = |name, default| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    (get("IBGDA_IB_PORT", 1), get("IBGDA_GID_INDEX", 3))
}

/// Opens every mlx5 device with DEVX on port 1 and closes it again: `Ok` with what it found, or
/// the step that failed. Skipped under `IBGDA_NIC=emu`.
fn devx_checks(
    choice: NicChoice,
    libibverbs: &str,
    libmlx5: &str,
    nics: &[NicInfo],
) -> BTreeMap<String, std::result::Result<String, String>> {
    let mut out = BTreeMap::new();
    if choice == NicChoice::Emu || !nics.iter().any(|n| n.device.mlx5 == Some(true)) {
        return out;
    }
    let lib = match Mlx5Lib::load(libibverbs, libmlx5) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            for n in nics.iter().filter(|n| n.device.mlx5 == Some(true)) {
                out.insert(n.device.name.clone(), Err(e.to_string()));
            }
            return out;
        }
    };
    for n in nics.iter().filter(|n| n.device.mlx5 == Some(true)) {
        let (port, gid) = probe_port();
        let r = Mlx5Device::open(lib.clone(), Some(&n.device.name), port, gid)
            .map(|d| {
                let a = d.address();
                let link = match a.link_layer {
                    LinkLayer::InfiniBand => format!("InfiniBand LID {}", a.lid),
                    LinkLayer::Ethernet => "RoCE".to_string(),
                };
                format!("port {port} active, {link}, pdn {:#x}, EQ {}", d.pdn(), d.eqn())
            })
            .map_err(|e| e.to_string());
        out.insert(n.device.name.clone(), r);
    }
    out
}

fn decide(
    choice: NicChoice,
    core: &std::result::Result<RdmaCore, String>,
    nics: &[NicInfo],
    devx: &BTreeMap<String, std::result::Result<String, String>>,
    nearest: Option<&(String, Option<Affinity>)>,
) -> (Mode, String) {
    if choice == NicChoice::Emu {
        return (Mode::Emulated, "IBGDA_NIC=emu".into());
    }
    match core {
        Err(why) => (
            Mode::Emulated,
            format!("rdma-core not found ({why}): install libibverbs1 (and rdma-core) for a real NIC"),
        ),
        Ok(_) if nics.is_empty() => (
            Mode::Emulated,
            "rdma-core found, but this node has no RDMA device".into(),
        ),
        Ok(_) => {
            let (name, aff) = nearest.cloned().unwrap_or_default();
            let kind = nics
                .iter()
                .find(|n| n.device.name == name)
                .map(|n| match n.device.mlx5 {
                    Some(true) => "mlx5",
                    Some(false) => "not mlx5",
                    None => "mlx5 unknown: libmlx5 not found",
                })
                .unwrap_or("?");
            let aff = aff.map_or("PCIe placement unknown".to_string(), |a| format!("{a:?}"));
            match devx.get(&name) {
                Some(Ok(found)) => (
                    Mode::GpuDoorbell,
                    format!(
                        "nearest NIC {name} ({kind}, {aff}): DEVX opens ({found}): IBGDA on it, the GPU ringing the \
                         doorbell when the driver maps the UAR page into the GPU (PeerMappingOverride=1), else the \
                         CPU-assisted doorbell"
                    ),
                ),
                Some(Err(why)) => (
                    Mode::VerbsProxy,
                    format!(
                        "nearest NIC {name} ({kind}, {aff}): {why}; the CPU proxy over verbs serves it \
                         (IBGDA_TRANSPORT=proxy); GPU-initiated modes need DEVX and use the emulated device"
                    ),
                ),
                None => (
                    Mode::VerbsProxy,
                    format!(
                        "nearest NIC {name} ({kind}, {aff}): the CPU proxy over verbs serves it (IBGDA_TRANSPORT=proxy); \
                         GPU-initiated modes need an mlx5 NIC and use the emulated device"
                    ),
                ),
            }
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "IBGDA_NIC={:?}", self.choice)?;
        match &self.rdma_core {
            Ok(mlx5) => writeln!(
                f,
                "rdma-core: loaded ({})",
                if *mlx5 { "with libmlx5" } else { "no libmlx5" }
            )?,
            Err(why) => writeln!(f, "rdma-core: not available: {why}")?,
        }
        if self.nics.is_empty() {
            writeln!(f, "RDMA devices: none")?;
        }
        for n in &self.nics {
            writeln!(
                f,
                "RDMA device {}: PCI {}, mlx5 {}",
                n.device.name,
                n.pci.as_deref().unwrap_or("unknown"),
                n.device.mlx5.map_or("unknown".into(), |m| m.to_string())
            )?;
        }
        for (name, r) in &self.devx {
            match r {
                Ok(found) => writeln!(f, "DEVX on {name}: opens: {found}")?,
                Err(why) => writeln!(f, "DEVX on {name}: {why}")?,
            }
        }
        match &self.gpus {
            Err(why) => writeln!(f, "GPUs: none listed: {why}")?,
            Ok(g) if g.is_empty() => writeln!(f, "GPUs: none")?,
            Ok(_) => {}
        }
        writeln!(f, "peers behind a NIC: {:?}: {}", self.node.0, self.node.1)?;
        for p in &self.plans {
            writeln!(
                f,
                "GPU {} ({}, PCI {}): {:?}: {}",
                p.gpu.ordinal,
                p.gpu.name,
                p.gpu.pci.as_deref().unwrap_or("unknown"),
                p.mode,
                p.why
            )?;
        }
        write!(
            f,
            "Same-node peers use P2P (NVLink/PCIe loads and stores) unless IBGDA_TRANSPORT says otherwise."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_counts_the_bridges_two_devices_share() {
        let p = |s: &str| PathBuf::from(s);
        let gpu = p("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0");
        let nic_same_switch = p("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0");
        let nic_same_root = p("/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0");
        let nic_other = p("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        assert_eq!(affinity(&gpu, &nic_same_switch), Affinity::SameSwitch);
        assert_eq!(affinity(&gpu, &nic_same_root), Affinity::SameRootComplex);
        assert_eq!(affinity(&gpu, &nic_other), Affinity::CrossRootComplex);
    }

    #[test]
    fn missing_rdma_core_is_named_and_means_the_emulated_device() {
        let p = probe_with(
            NicChoice::Auto,
            "/nonexistent/libibverbs.so.1",
            LIBMLX5,
            Path::new("/nonexistent"),
        );
        let why = p.rdma_core.as_ref().unwrap_err();
        assert!(why.contains("/nonexistent/libibverbs.so.1"), "{why}");
        assert!(p.nics.is_empty());
        assert_eq!(p.node.0, Mode::Emulated);
        assert!(p.node.1.contains("rdma-core not found"), "{}", p.node.1);
        assert!(p
            .plans
            .iter()
            .all(|g| g.mode == Mode::Emulated && g.why.contains("rdma-core not found")));
        assert!(p.to_string().contains("rdma-core: not available"), "{p}");
    }

    #[test]
    fn the_system_rdma_core_loads_and_lists_its_devices() {
        // CI installs libibverbs (scripts/setup-toolchain.sh); its machines have no RDMA device.
        let p = probe_with(NicChoice::Auto, LIBIBVERBS, LIBMLX5, Path::new("/sys"));
        assert!(p.rdma_core.is_ok(), "{p}");
        assert_eq!(p.node.0, Mode::Emulated);
        if p.nics.is_empty() {
            assert!(p.node.1.contains("no RDMA device"), "{}", p.node.1);
        } else {
            assert!(p.node.1.contains("nearest NIC"), "{}", p.node.1);
        }
        let emu = probe_with(NicChoice::Emu, LIBIBVERBS, LIBMLX5, Path::new("/sys"));
        assert_eq!(emu.node, (Mode::Emulated, "IBGDA_NIC=emu".to_string()));
        for g in &p.plans {
            assert_eq!(g.mode, Mode::Emulated);
            if p.nics.is_empty() {
                assert!(g.why.contains("no RDMA device"), "{}", g.why);
            } else {
                assert!(g.why.contains("nearest NIC"), "{}", g.why);
            }
        }
    }

    #[test]
    fn ibgda_nic_parses_every_backend_and_names_the_choices() {
        assert_eq!("auto".parse::<NicChoice>().unwrap(), NicChoice::Auto);
        assert_eq!("EMU".parse::<NicChoice>().unwrap(), NicChoice::Emu);
        assert_eq!("mlx5".parse::<NicChoice>().unwrap(), NicChoice::Mlx5);
        assert_eq!("Verbs".parse::<NicChoice>().unwrap(), NicChoice::Verbs);
        assert!("x"
            .parse::<NicChoice>()
            .unwrap_err()
            .to_string()
            .contains("expected auto"));
    }
}

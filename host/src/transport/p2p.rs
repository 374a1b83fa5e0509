//! P2P transport, host half: decide which peers are load/store reachable and describe them in the
//! peer table. The heap itself is mapped for every participating GPU by `VmmHeap::new` (CUDA VMM
//! access descriptors), so a peer's heap base is directly usable by this GPU's kernels.

use crate::cuda;
use crate::error::{Error, Result};
use cudarc::driver::CudaContext;
use ibgda_abi::{PeerInfo, TransportKind};
use std::sync::Arc;

/// Checks that this PE's GPU can reach every peer's GPU and returns the distinct device ordinals
/// that must be granted access to this PE's heap.
pub fn check_reachable(pe: u32, ctx: &Arc<CudaContext>, peer_devices: &[usize]) -> Result<Vec<usize>> {
    let mut devices = Vec::new();
    for (peer, &d) in peer_devices.iter().enumerate() {
        if d == ctx.ordinal() {
            continue;
        }
        let other = CudaContext::new(d).map_err(cuda::cuda_err("cuDevicePrimaryCtxRetain", pe))?;
        if !cuda::can_access_peer(pe, ctx, &other)? || !cuda::can_access_peer(pe, &other, ctx)? {
            return Err(Error::PeerUnreachable {
                pe,
                device: ctx.ordinal(),
                peer: peer as u32,
                peer_device: d,
            });
        }
        devices.push(d);
    }
    devices.sort();
    devices.dedup();
    Ok(devices)
}

/// The peer-table entry for a load/store-reachable peer.
pub fn peer_entry(heap_base: u64, device: usize) -> PeerInfo {
    PeerInfo {
        heap_base,
        transport: TransportKind::P2p as u32,
        device: device as u32,
    }
}

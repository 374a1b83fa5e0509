//! Transports' host halves: what each sets up so the device API can reach a peer.
//!
//! - [`p2p`]: peers whose heaps this GPU can load from and store to (NVLink or PCIe peer access).
//! - [`ibgda`]: peers reached through RC queue pairs on an mlx5 NIC (today the emulated device),
//!   posted to by GPU threads themselves.
//! - [`proxy`]: the same QPs posted to by CPU proxy threads, which GPU threads hand descriptors.

pub mod ibgda;
pub mod p2p;
pub mod proxy;

//! Transports' host halves: what each sets up so the device API can reach a peer.
//!
//! - [`p2p`]: peers whose heaps this GPU can load from and store to (NVLink or PCIe peer access).

pub mod p2p;

//! The mlx5 DEVX backend: what talks to a ConnectX through rdma-core's direct verbs, loaded at
//! run time. [`prm`] builds the PRM command mailboxes (CREATE_CQ, CREATE_QP, the RC transitions),
//! golden-tested against the kernel's `mlx5_ifc.h`; [`device`] takes the control-plane steps
//! NVSHMEM's IBGDA takes (open with DEVX, PD, port address, EQ, UARs, umem registration, CQ and QP
//! creation and connection), each failure naming its step, device and errno. CI runs those steps
//! against a stand-in rdma-core (`host/tests/mlx5_standin.rs`); no ConnectX has run them yet.

pub mod device;
pub mod ffi;
pub mod nic;
pub mod prm;

pub use device::{LinkLayer, Mlx5Device, Mlx5Lib, NicError, PortAddress};
pub use nic::Mlx5Nic;

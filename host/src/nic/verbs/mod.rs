//! The verbs proxy's NIC: any RDMA device through standard verbs (another vendor's NIC, EFA,
//! soft-RoCE, or a ConnectX without DEVX), for the CPU proxy only.

pub mod ffi;

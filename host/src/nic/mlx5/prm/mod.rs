//! The mlx5 PRM commands the DEVX backend sends (`mlx5dv_devx_obj_create` / `_modify`): CREATE_CQ
//! and CREATE_QP with their contexts, and the RST2INIT, INIT2RTR and RTR2RTS transitions of an RC
//! QP, built as the device reads them.
//!
//! A PRM layout is a sequence of big-endian 32-bit words; a field is a run of bits counted from
//! the layout's first bit (bit 0 is the most significant bit of word 0), as the kernel's
//! `include/linux/mlx5/mlx5_ifc.h` declares it (one `u8` per bit). Every [`Field`] here is checked
//! against that header by `host/tests/mlx5_prm_layout.rs`, which compiles a C program against it
//! and compares offset and width field by field. The few fields the kernel header leaves reserved
//! (the umem ids and offsets only userspace DEVX uses) are placed as rdma-core's
//! `providers/mlx5/mlx5_ifc.h` declares them, and the test checks that each lies inside the
//! reserved gap between the kernel header's neighbouring fields.
//!
//! Which fields are set, and to what, follows NVSHMEM's IBGDA transport (its CQ and QP creation
//! and its RST2INIT, INIT2RTR and RTR2RTS steps): collapsed, overrun-ignoring CQs and RC QPs whose
//! WQ, DBR and CQ buffers are umem objects.
//!
//! [`mailbox`] is the bit-field buffer (MLX5_SET / MLX5_GET), [`layout`] the field tables and
//! enumeration values checked against the header, [`commands`] the typed builders.

pub mod commands;
pub mod layout;
pub mod mailbox;

pub use commands::*;
pub use layout::*;
pub use mailbox::{Field, Mailbox, PrmError};

//! The mlx5 DEVX backend: what talks to a ConnectX through rdma-core's direct verbs. Today its PRM
//! command layer ([`prm`]): the CREATE_CQ, CREATE_QP and QP-transition mailboxes the backend sends
//! with `mlx5dv_devx_obj_create` / `_modify`, golden-tested against the kernel's `mlx5_ifc.h`.

pub mod prm;

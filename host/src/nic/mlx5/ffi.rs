//! The rdma-core entry points and structs the mlx5 DEVX backend uses, loaded at run time. Every
//! function type is checked against `infiniband/verbs.h` and `infiniband/mlx5dv.h`, and every
//! struct's size and field offsets, by `host/tests/rdma_core_ffi.rs` (a C program compiled with
//! `-Werror`).
// Each item mirrors the C declaration of the same name, which documents it; the fields are the C
// fields.
#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// `struct ibv_device` (opaque).
#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}
/// `struct ibv_context` (opaque here).
#[repr(C)]
pub struct IbvContext {
    _opaque: [u8; 0],
}
/// `struct ibv_pd` (opaque here).
#[repr(C)]
pub struct IbvPd {
    _opaque: [u8; 0],
}
/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}
/// `struct ibv_ah` (opaque here).
#[repr(C)]
pub struct IbvAh {
    _opaque: [u8; 0],
}
/// `struct mlx5dv_ah`.
#[repr(C)]
pub struct Mlx5dvAh {
    pub av: *mut u8,
    pub comp_mask: u64,
}
/// Byte offset of `rmac[6]` in `struct mlx5_wqe_av`.
pub const MLX5_WQE_AV_RMAC: usize = 20;
/// `MLX5DV_OBJ_AH`.
pub const MLX5DV_OBJ_AH: u64 = 1 << 5;
/// `struct mlx5dv_devx_obj` (opaque).
#[repr(C)]
pub struct DevxObj {
    _opaque: [u8; 0],
}

/// `struct mlx5dv_context_attr`.
#[repr(C)]
#[derive(Default)]
pub struct Mlx5dvContextAttr {
    pub flags: u32,
    pub comp_mask: u64,
}

/// `struct mlx5dv_pd`.
#[repr(C)]
#[derive(Default)]
pub struct Mlx5dvPd {
    pub pdn: u32,
    pub comp_mask: u64,
}

/// One `{in, out}` pair of `struct mlx5dv_obj`.
#[repr(C)]
pub struct ObjPair {
    pub inp: *mut c_void,
    pub out: *mut c_void,
}

/// `struct mlx5dv_obj`: qp, cq, srq, rwq, dm, ah, pd (in that order).
#[repr(C)]
pub struct Mlx5dvObj {
    pub qp: ObjPair,
    pub cq: ObjPair,
    pub srq: ObjPair,
    pub rwq: ObjPair,
    pub dm: ObjPair,
    pub ah: ObjPair,
    pub pd: ObjPair,
}

/// `struct mlx5dv_devx_uar`.
#[repr(C)]
pub struct Mlx5dvDevxUar {
    pub reg_addr: *mut c_void,
    pub base_addr: *mut c_void,
    pub page_id: u32,
    pub mmap_off: i64,
    pub comp_mask: u64,
}

/// `struct mlx5dv_devx_umem`.
#[repr(C)]
pub struct Mlx5dvDevxUmem {
    pub umem_id: u32,
}

/// `struct mlx5dv_devx_umem_in`.
#[repr(C)]
pub struct Mlx5dvDevxUmemIn {
    pub addr: *mut c_void,
    pub size: usize,
    pub access: u32,
    pub pgsz_bitmap: u64,
    pub comp_mask: u64,
    pub dmabuf_fd: c_int,
}

/// `struct ibv_port_attr` (the exported `ibv_query_port` fills its older prefix, which holds
/// every field read here; the rest stays zeroed).
#[repr(C)]
#[derive(Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `MLX5DV_CONTEXT_FLAGS_DEVX`.
pub const MLX5DV_CONTEXT_FLAGS_DEVX: u32 = 1;
/// `MLX5DV_OBJ_PD`.
pub const MLX5DV_OBJ_PD: u64 = 1 << 6;
/// `MLX5DV_UAR_ALLOC_TYPE_BF`.
pub const MLX5DV_UAR_ALLOC_TYPE_BF: u32 = 0;
/// `MLX5DV_UAR_ALLOC_TYPE_NC`.
pub const MLX5DV_UAR_ALLOC_TYPE_NC: u32 = 1;
/// `MLX5DV_UMEM_MASK_DMABUF`.
pub const MLX5DV_UMEM_MASK_DMABUF: u64 = 1;
/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice;
pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut IbvDevice);
pub type GetDeviceName = unsafe extern "C" fn(*mut IbvDevice) -> *const c_char;
pub type CloseDevice = unsafe extern "C" fn(*mut IbvContext) -> c_int;
pub type QueryPort = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int;
pub type QueryGid = unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut [u8; 16]) -> c_int;
pub type AllocPd = unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd;
pub type DeallocPd = unsafe extern "C" fn(*mut IbvPd) -> c_int;
pub type Mlx5dvIsSupported = unsafe extern "C" fn(*mut IbvDevice) -> bool;
pub type Mlx5dvOpenDevice = unsafe extern "C" fn(*mut IbvDevice, *mut Mlx5dvContextAttr) -> *mut IbvContext;
pub type Mlx5dvInitObj = unsafe extern "C" fn(*mut Mlx5dvObj, u64) -> c_int;
pub type DevxQueryEqn = unsafe extern "C" fn(*mut IbvContext, u32, *mut u32) -> c_int;
pub type DevxAllocUar = unsafe extern "C" fn(*mut IbvContext, u32) -> *mut Mlx5dvDevxUar;
pub type DevxFreeUar = unsafe extern "C" fn(*mut Mlx5dvDevxUar);
pub type DevxUmemReg = unsafe extern "C" fn(*mut IbvContext, *mut c_void, usize, u32) -> *mut Mlx5dvDevxUmem;
pub type DevxUmemRegEx = unsafe extern "C" fn(*mut IbvContext, *mut Mlx5dvDevxUmemIn) -> *mut Mlx5dvDevxUmem;
pub type DevxUmemDereg = unsafe extern "C" fn(*mut Mlx5dvDevxUmem) -> c_int;
pub type DevxObjCreate =
    unsafe extern "C" fn(*mut IbvContext, *const c_void, usize, *mut c_void, usize) -> *mut DevxObj;
pub type DevxObjModify = unsafe extern "C" fn(*mut DevxObj, *const c_void, usize, *mut c_void, usize) -> c_int;
pub type DevxObjDestroy = unsafe extern "C" fn(*mut DevxObj) -> c_int;
pub type RegMr = unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr;
pub type RegDmabufMr = unsafe extern "C" fn(*mut IbvPd, u64, usize, u64, c_int, c_int) -> *mut IbvMr;
pub type DeregMr = unsafe extern "C" fn(*mut IbvMr) -> c_int;
pub type CreateAh = unsafe extern "C" fn(*mut IbvPd, *mut crate::nic::verbs::ffi::IbvAhAttr) -> *mut IbvAh;
pub type DestroyAh = unsafe extern "C" fn(*mut IbvAh) -> c_int;

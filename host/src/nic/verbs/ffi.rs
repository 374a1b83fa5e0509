//! The standard verbs entry points and structs the verbs proxy uses, loaded at run time. Every
//! function type, struct size, field offset and constant here is checked against
//! `infiniband/verbs.h` by `host/tests/rdma_core_ffi.rs`. `ibv_post_send` and `ibv_poll_cq` are
//! inline functions in the header that call through the context's operation table; the offsets
//! of those two table entries are checked the same way.
// Each item mirrors the C declaration of the same name, which documents it; the fields are the C
// fields.
#![allow(missing_docs)]

pub use crate::nic::mlx5::ffi::{IbvContext, IbvDevice, IbvMr, IbvPd, IbvPortAttr};
use std::ffi::{c_int, c_void};

/// `struct ibv_cq`: only its context (the first field) is read.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// `struct ibv_qp`: the prefix up to `qp_num`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    pub fw_ver: [u8; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl Default for IbvDeviceAttr {
    fn default() -> Self {
        // SAFETY: plain integers, for which all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route` (8-aligned: its `union ibv_gid` holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`. `wr` is the union of `rdma {remote_addr, rkey}` and `atomic
/// {remote_addr, compare_add, swap, rkey}`: `remote_addr` first in both, then the atomic's
/// operands, with `rdma.rkey` overlapping `compare_add`'s low half (see [`IbvSendWr::rdma`] and
/// [`IbvSendWr::atomic`]). The tail (`qp_type`, `bind_mw`/`tso`) is unused and zero.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    /// The `wr` union as words: `[remote_addr, compare_add | rdma.rkey, swap, atomic.rkey]`.
    pub wr: [u64; 4],
    pub tail: [u64; 7],
}

impl IbvSendWr {
    /// An RDMA WRITE or READ (`opcode`) of the scatter list at `sge` to `remote_addr`/`rkey`.
    pub fn rdma(opcode: u32, sge: *mut IbvSge, remote_addr: u64, rkey: u32, send_flags: u32) -> IbvSendWr {
        IbvSendWr {
            opcode,
            send_flags,
            sg_list: sge,
            num_sge: 1,
            wr: [remote_addr, rkey as u64, 0, 0],
            ..IbvSendWr::zeroed()
        }
    }

    /// An 8-byte atomic (`IBV_WR_ATOMIC_FETCH_AND_ADD` with `compare_add` the addend, or
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`) whose old value lands at `sge`.
    pub fn atomic(
        opcode: u32,
        sge: *mut IbvSge,
        remote_addr: u64,
        rkey: u32,
        compare_add: u64,
        swap: u64,
        send_flags: u32,
    ) -> IbvSendWr {
        IbvSendWr {
            opcode,
            send_flags,
            sg_list: sge,
            num_sge: 1,
            wr: [remote_addr, compare_add, swap, rkey as u64],
            ..IbvSendWr::zeroed()
        }
    }

    fn zeroed() -> IbvSendWr {
        IbvSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: [0; 4],
            tail: [0; 7],
        }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// Byte offset of `ops.poll_cq` in `struct ibv_context`.
pub const CONTEXT_OPS_POLL_CQ: usize = 96;
/// Byte offset of `ops.post_send` in `struct ibv_context`.
pub const CONTEXT_OPS_POST_SEND: usize = 208;

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_SEND_INLINE: u32 = 8;
pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_ATOMIC_NONE: u32 = 0;

pub type OpenDevice = unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext;
pub type QueryDevice = unsafe extern "C" fn(*mut IbvContext, *mut IbvDeviceAttr) -> c_int;
pub type CreateCq = unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCq;
pub type DestroyCq = unsafe extern "C" fn(*mut IbvCq) -> c_int;
pub type CreateQp = unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp;
pub type DestroyQp = unsafe extern "C" fn(*mut IbvQp) -> c_int;
pub type ModifyQp = unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int;
/// `ops.post_send`.
pub type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
/// `ops.poll_cq`.
pub type PollCq = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;

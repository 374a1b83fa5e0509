//! The PRM layouts the backend fills or reads, field by field as the kernel's `mlx5_ifc.h`
//! declares them, with what `host/tests/mlx5_prm_layout.rs` checks each against; and the opcodes
//! and enumeration values we set.

use super::mailbox::Field;

/// Declares one PRM layout: its C struct name (`mlx5_ifc_<name>_bits`), its size in bits, and its
/// fields with the C member path each is checked against. `reserved(prev, next)` marks a field
/// the kernel header leaves reserved: the check is that it lies after `prev` and before `next`.
macro_rules! layout {
    ($(#[$doc:meta])* $name:ident, $bits:expr, {
        $( $field:ident = $c:literal $(reserved($prev:literal, $next:literal))? @ ($at:expr, $w:expr); )*
    }) => {
        $(#[$doc])*
        pub mod $name {
            use super::{Field, FieldCheck};
            /// The layout's size in bits.
            pub const BITS: u32 = $bits;
            $(
                #[doc = concat!("`", $c, "`")]
                pub const $field: Field = Field::new($at, $w);
            )*
            /// Every field with what the layout test compares it against.
            pub const CHECKS: &[FieldCheck] = &[
                $( FieldCheck {
                    layout: stringify!($name),
                    c_member: $c,
                    field: $field,
                    reserved_between: layout!(@gap $($prev, $next)?),
                }, )*
            ];
        }
    };
    (@gap $prev:literal, $next:literal) => { Some(($prev, $next)) };
    (@gap) => { None };
}

/// One field and how `host/tests/mlx5_prm_layout.rs` checks it against `mlx5_ifc.h`.
#[derive(Clone, Copy, Debug)]
pub struct FieldCheck {
    /// The layout (`mlx5_ifc_<layout>_bits`).
    pub layout: &'static str,
    /// The C member path (`primary_address_path.rlid`).
    pub c_member: &'static str,
    /// Our offset and width.
    pub field: Field,
    /// For a field the kernel header leaves reserved: the declared members it lies between (it
    /// must start at or after the end of the first and end at or before the start of the second;
    /// `""` as the second means the end of the layout).
    pub reserved_between: Option<(&'static str, &'static str)>,
}

layout!(
    /// The command header every input starts with.
    cmd_in, 0x40, {
        OPCODE = "opcode" @ (0x00, 0x10);
        OP_MOD = "op_mod" @ (0x30, 0x10);
    }
);

layout!(
    /// The output header: status (0 = OK) and syndrome.
    cmd_out, 0x40, {
        STATUS = "status" @ (0x00, 0x08);
        SYNDROME = "syndrome" @ (0x20, 0x20);
    }
);

layout!(
    /// Completion queue context.
    cqc, 0x200, {
        STATUS = "status" @ (0x00, 0x04);
        DBR_UMEM_VALID = "dbr_umem_valid" @ (0x06, 0x01);
        CQE_SZ = "cqe_sz" @ (0x08, 0x03);
        CC = "cc" @ (0x0b, 0x01);
        OI = "oi" @ (0x0e, 0x01);
        ST = "st" @ (0x14, 0x04);
        DBR_UMEM_ID = "dbr_umem_id" reserved("cqe_compression_layout", "page_offset") @ (0x20, 0x20);
        PAGE_OFFSET = "page_offset" @ (0x54, 0x06);
        LOG_CQ_SIZE = "log_cq_size" @ (0x63, 0x05);
        UAR_PAGE = "uar_page" @ (0x68, 0x18);
        C_EQN = "c_eqn_or_apu_element" @ (0xa0, 0x20);
        LOG_PAGE_SIZE = "log_page_size" @ (0xc3, 0x05);
        DBR_ADDR = "dbr_addr" @ (0x1c0, 0x40);
    }
);

layout!(
    /// CREATE_CQ input.
    create_cq_in, 0x880, {
        OPCODE = "opcode" @ (0x00, 0x10);
        CQ_CONTEXT = "cq_context" @ (0x80, 0x200);
        CQ_UMEM_OFFSET = "cq_umem_offset" reserved("cq_context", "cq_umem_valid") @ (0x280, 0x40);
        CQ_UMEM_ID = "cq_umem_id" reserved("cq_context", "cq_umem_valid") @ (0x2c0, 0x20);
        CQ_UMEM_VALID = "cq_umem_valid" @ (0x2e0, 0x01);
    }
);

layout!(
    /// CREATE_CQ output.
    create_cq_out, 0x80, {
        CQN = "cqn" @ (0x48, 0x18);
    }
);

layout!(
    /// Address path (primary or secondary) of a QP context.
    ads, 0x160, {
        PKEY_INDEX = "pkey_index" @ (0x10, 0x10);
        GRH = "grh" @ (0x28, 0x01);
        RLID = "rlid" @ (0x30, 0x10);
        ACK_TIMEOUT = "ack_timeout" @ (0x40, 0x05);
        SRC_ADDR_INDEX = "src_addr_index" @ (0x48, 0x08);
        HOP_LIMIT = "hop_limit" @ (0x58, 0x08);
        TCLASS = "tclass" @ (0x64, 0x08);
        RGID_RIP = "rgid_rip" @ (0x80, 0x80);
        DSCP = "dscp" @ (0x10a, 0x06);
        UDP_SPORT = "udp_sport" @ (0x110, 0x10);
        ETH_PRIO = "eth_prio" @ (0x121, 0x03);
        SL = "sl" @ (0x124, 0x04);
        VHCA_PORT_NUM = "vhca_port_num" @ (0x128, 0x08);
        RMAC_47_32 = "rmac_47_32" @ (0x130, 0x10);
        RMAC_31_0 = "rmac_31_0" @ (0x140, 0x20);
    }
);

layout!(
    /// QP context.
    qpc, 0x740, {
        STATE = "state" @ (0x00, 0x04);
        ST = "st" @ (0x08, 0x08);
        PM_STATE = "pm_state" @ (0x13, 0x02);
        PD = "pd" @ (0x28, 0x18);
        MTU = "mtu" @ (0x40, 0x03);
        LOG_MSG_MAX = "log_msg_max" @ (0x43, 0x05);
        LOG_RQ_SIZE = "log_rq_size" @ (0x49, 0x04);
        NO_SQ = "no_sq" @ (0x50, 0x01);
        LOG_SQ_SIZE = "log_sq_size" @ (0x51, 0x04);
        COUNTER_SET_ID = "counter_set_id" @ (0x60, 0x08);
        UAR_PAGE = "uar_page" @ (0x68, 0x18);
        USER_INDEX = "user_index" @ (0x88, 0x18);
        LOG_PAGE_SIZE = "log_page_size" @ (0xa3, 0x05);
        REMOTE_QPN = "remote_qpn" @ (0xa8, 0x18);
        PRIMARY_ADDRESS_PATH = "primary_address_path" @ (0xc0, 0x160);
        LOG_ACK_REQ_FREQ = "log_ack_req_freq" @ (0x380, 0x04);
        LOG_SRA_MAX = "log_sra_max" @ (0x388, 0x03);
        RETRY_COUNT = "retry_count" @ (0x38d, 0x03);
        RNR_RETRY = "rnr_retry" @ (0x390, 0x03);
        NEXT_SEND_PSN = "next_send_psn" @ (0x3c8, 0x18);
        CQN_SND = "cqn_snd" @ (0x3e8, 0x18);
        LOG_RRA_MAX = "log_rra_max" @ (0x488, 0x03);
        ATOMIC_MODE = "atomic_mode" @ (0x48c, 0x04);
        RRE = "rre" @ (0x490, 0x01);
        RWE = "rwe" @ (0x491, 0x01);
        RAE = "rae" @ (0x492, 0x01);
        PAGE_OFFSET = "page_offset" @ (0x494, 0x06);
        MIN_RNR_NAK = "min_rnr_nak" @ (0x4a3, 0x05);
        NEXT_RCV_PSN = "next_rcv_psn" @ (0x4a8, 0x18);
        CQN_RCV = "cqn_rcv" @ (0x4e8, 0x18);
        DBR_ADDR = "dbr_addr" @ (0x500, 0x40);
        RQ_TYPE = "rq_type" @ (0x565, 0x03);
        SRQN_RMPN_XRQN = "srqn_rmpn_xrqn" @ (0x568, 0x18);
        CS_REQ = "cs_req" @ (0x630, 0x08);
        CS_RES = "cs_res" @ (0x638, 0x08);
        DBR_UMEM_VALID = "dbr_umem_valid" @ (0x683, 0x01);
        DBR_UMEM_ID = "dbr_umem_id" reserved("dbr_umem_valid", "") @ (0x720, 0x20);
    }
);

layout!(
    /// CREATE_QP input.
    create_qp_in, 0x880, {
        OPCODE = "opcode" @ (0x00, 0x10);
        OPT_PARAM_MASK = "opt_param_mask" @ (0x80, 0x20);
        QPC = "qpc" @ (0xc0, 0x740);
        WQ_UMEM_OFFSET = "wq_umem_offset" reserved("qpc", "wq_umem_valid") @ (0x800, 0x40);
        WQ_UMEM_ID = "wq_umem_id" reserved("qpc", "wq_umem_valid") @ (0x840, 0x20);
        WQ_UMEM_VALID = "wq_umem_valid" @ (0x860, 0x01);
    }
);

layout!(
    /// CREATE_QP output.
    create_qp_out, 0x80, {
        QPN = "qpn" @ (0x48, 0x18);
    }
);

layout!(
    /// RST2INIT_QP, INIT2RTR_QP and RTR2RTS_QP inputs share this shape (checked for each).
    modify_qp_in, 0x880, {
        OPCODE = "opcode" @ (0x00, 0x10);
        QPN = "qpn" @ (0x48, 0x18);
        OPT_PARAM_MASK = "opt_param_mask" @ (0x80, 0x20);
        QPC = "qpc" @ (0xc0, 0x740);
    }
);

/// The C structs `modify_qp_in` is checked against.
pub const MODIFY_QP_LAYOUTS: [&str; 3] = ["rst2init_qp_in", "init2rtr_qp_in", "rtr2rts_qp_in"];

/// Command opcodes (`MLX5_CMD_OP_*`).
pub mod opcode {
    /// `MLX5_CMD_OP_CREATE_CQ`.
    pub const CREATE_CQ: u16 = 0x400;
    /// `MLX5_CMD_OP_CREATE_QP`.
    pub const CREATE_QP: u16 = 0x500;
    /// `MLX5_CMD_OP_RST2INIT_QP`.
    pub const RST2INIT_QP: u16 = 0x502;
    /// `MLX5_CMD_OP_INIT2RTR_QP`.
    pub const INIT2RTR_QP: u16 = 0x503;
    /// `MLX5_CMD_OP_RTR2RTS_QP`.
    pub const RTR2RTS_QP: u16 = 0x504;
}

/// Every layout's checks, for the layout test.
pub fn all_checks() -> Vec<FieldCheck> {
    [
        cmd_in::CHECKS,
        cmd_out::CHECKS,
        cqc::CHECKS,
        create_cq_in::CHECKS,
        create_cq_out::CHECKS,
        ads::CHECKS,
        qpc::CHECKS,
        create_qp_in::CHECKS,
        create_qp_out::CHECKS,
        modify_qp_in::CHECKS,
    ]
    .concat()
}

/// Values of the PRM's enumerations that we set.
pub mod value {
    /// `cqc.cqe_sz`: 64-byte CQEs (`MLX5_CQE_SIZE_64B`).
    pub const CQE_SIZE_64: u64 = 0;
    /// `qpc.st`: reliable connection.
    pub const QP_ST_RC: u64 = 0x0;
    /// `qpc.pm_state`: migrated (no alternate path).
    pub const PM_STATE_MIGRATED: u64 = 0x3;
    /// `qpc.rq_type`: a zero-length receive queue (the kernel driver's `MLX5_ZERO_LEN_RQ`).
    pub const RQ_TYPE_ZERO_SIZE: u64 = 0x3;
    /// `qpc.atomic_mode`: atomics on up to 8 bytes, as IBGDA sets it.
    pub const ATOMIC_MODE_UP_TO_8B: u64 = 0x3;
}

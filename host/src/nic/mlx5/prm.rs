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

use std::fmt;

/// A field of a PRM layout: `bits` bits starting `at` bits from the layout's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Bit offset from the start of the layout (bit 0 = MSB of the first big-endian word).
    pub at: u32,
    /// Width in bits.
    pub bits: u32,
}

impl Field {
    const fn new(at: u32, bits: u32) -> Field {
        Field { at, bits }
    }

    /// The field of a sub-layout placed `base` bits into an outer one.
    pub const fn within(self, base: u32) -> Field {
        Field {
            at: base + self.at,
            bits: self.bits,
        }
    }
}

/// A value that does not fit its field, or a field outside the buffer: a bug in the caller's
/// parameters, never silently truncated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrmError {
    /// The command being built.
    pub command: &'static str,
    /// The field's name.
    pub field: &'static str,
    /// What was wrong.
    pub why: String,
}

impl fmt::Display for PrmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mlx5 {}: field {}: {}", self.command, self.field, self.why)
    }
}

impl std::error::Error for PrmError {}

/// A command mailbox being built (or an output being read): big-endian words.
#[derive(Clone, PartialEq, Eq)]
pub struct Mailbox {
    command: &'static str,
    words: Vec<u32>,
}

impl fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [", self.command)?;
        for (i, w) in self.words.iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            write!(f, "{w:08x}")?;
        }
        write!(f, "]")
    }
}

impl Mailbox {
    /// A zeroed mailbox of `bits` bits (a multiple of 32) for `command`.
    pub fn new(command: &'static str, bits: u32) -> Mailbox {
        assert!(bits.is_multiple_of(32), "PRM layouts are whole words");
        Mailbox {
            command,
            words: vec![0; (bits / 32) as usize],
        }
    }

    /// A mailbox holding `bytes` as the device wrote them (an output).
    pub fn from_bytes(command: &'static str, bytes: &[u8]) -> Mailbox {
        Mailbox {
            command,
            words: bytes
                .chunks(4)
                .map(|c| {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    u32::from_be_bytes(w)
                })
                .collect(),
        }
    }

    fn check(&self, name: &'static str, f: Field) -> Result<(), PrmError> {
        let fits_words = f.bits <= 32 && f.at / 32 == (f.at + f.bits - 1) / 32;
        let whole_words = f.at.is_multiple_of(32) && f.bits.is_multiple_of(32) && f.bits <= 64;
        if f.bits == 0 || !(fits_words || whole_words) {
            return Err(self.error(name, format!("{f:?} is neither inside one word nor whole words")));
        }
        if (f.at + f.bits).div_ceil(32) as usize > self.words.len() {
            return Err(self.error(name, format!("{f:?} is past the {}-bit layout", self.words.len() * 32)));
        }
        Ok(())
    }

    fn error(&self, field: &'static str, why: String) -> PrmError {
        PrmError {
            command: self.command,
            field,
            why,
        }
    }

    /// Sets field `name` (`f`) to `v`; a value wider than the field is an error.
    pub fn set(&mut self, name: &'static str, f: Field, v: u64) -> Result<&mut Mailbox, PrmError> {
        self.check(name, f)?;
        if f.bits < 64 && v >> f.bits != 0 {
            return Err(self.error(name, format!("{v:#x} does not fit in {} bits", f.bits)));
        }
        let w = (f.at / 32) as usize;
        if f.bits > 32 {
            // Whole words, most significant first (MLX5_SET64).
            self.words[w] = (v >> 32) as u32;
            self.words[w + 1] = v as u32;
        } else {
            let shift = 32 - (f.at % 32) - f.bits;
            let mask = (((1u64 << f.bits) - 1) as u32) << shift;
            self.words[w] = (self.words[w] & !mask) | ((v as u32) << shift);
        }
        Ok(self)
    }

    /// Writes `bytes` over a byte-aligned field of exactly that many bytes (GIDs).
    pub fn set_bytes(&mut self, name: &'static str, f: Field, bytes: &[u8]) -> Result<&mut Mailbox, PrmError> {
        if !f.at.is_multiple_of(8) || f.bits != bytes.len() as u32 * 8 {
            return Err(self.error(name, format!("{f:?} is not {} whole bytes", bytes.len())));
        }
        if (f.at + f.bits).div_ceil(32) as usize > self.words.len() {
            return Err(self.error(name, format!("{f:?} is past the layout")));
        }
        for (i, b) in bytes.iter().enumerate() {
            let bit = f.at + 8 * i as u32;
            let (w, shift) = ((bit / 32) as usize, 24 - bit % 32);
            self.words[w] = (self.words[w] & !(0xff << shift)) | ((*b as u32) << shift);
        }
        Ok(self)
    }

    /// Reads field `f`.
    pub fn get(&self, f: Field) -> u64 {
        let w = (f.at / 32) as usize;
        if f.bits > 32 {
            ((self.words[w] as u64) << 32) | self.words[w + 1] as u64
        } else {
            let shift = 32 - (f.at % 32) - f.bits;
            ((self.words[w] >> shift) as u64) & ((1u64 << f.bits) - 1)
        }
    }

    /// The mailbox as the device reads it.
    pub fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    /// The command's name.
    pub fn command(&self) -> &'static str {
        self.command
    }
}

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
    /// Umem pages are 4 KiB multiples: `log_page_size` counts from the adapter's 4 KiB page.
    pub const ADAPTER_PAGE_SHIFT: u32 = 12;
}

/// A CQ whose buffer and doorbell record are umem objects (in GPU memory for IBGDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqSpec {
    /// log2 of the number of 64-byte CQEs.
    pub log_cq_size: u32,
    /// A UAR page for the CQ's (unused) arm doorbell.
    pub uar_page: u32,
    /// The completion event queue (`mlx5dv_devx_query_eqn`).
    pub c_eqn: u32,
    /// The umem holding the CQE ring, and the ring's offset in it.
    pub cq_umem_id: u32,
    /// Offset of the ring in its umem.
    pub cq_umem_offset: u64,
    /// The umem holding the doorbell record, and the record's offset in it.
    pub dbr_umem_id: u32,
    /// Offset of the doorbell record in its umem (8-byte aligned).
    pub dbr_offset: u64,
    /// Collapsed CQ (every CQE in slot 0) and overrun ignored: what IBGDA's send CQs use.
    pub collapsed: bool,
}

fn fail(command: &'static str, field: &'static str, why: String) -> PrmError {
    PrmError { command, field, why }
}

/// The CREATE_CQ input for `cq`.
pub fn create_cq(cq: &CqSpec) -> Result<Mailbox, PrmError> {
    const C: &str = "CREATE_CQ";
    if cq.log_cq_size > 24 {
        return Err(fail(C, "log_cq_size", format!("{} is above 24", cq.log_cq_size)));
    }
    if !cq.dbr_offset.is_multiple_of(8) {
        return Err(fail(
            C,
            "dbr_addr",
            format!("offset {:#x} is not 8-byte aligned", cq.dbr_offset),
        ));
    }
    let base = create_cq_in::CQ_CONTEXT.at;
    let mut m = Mailbox::new(C, create_cq_in::BITS);
    m.set("opcode", create_cq_in::OPCODE, opcode::CREATE_CQ as u64)?
        .set("cq_umem_offset", create_cq_in::CQ_UMEM_OFFSET, cq.cq_umem_offset)?
        .set("cq_umem_id", create_cq_in::CQ_UMEM_ID, cq.cq_umem_id as u64)?
        .set("cq_umem_valid", create_cq_in::CQ_UMEM_VALID, 1)?
        .set("cqe_sz", cqc::CQE_SZ.within(base), value::CQE_SIZE_64)?
        .set("cc", cqc::CC.within(base), cq.collapsed as u64)?
        .set("oi", cqc::OI.within(base), cq.collapsed as u64)?
        .set("log_cq_size", cqc::LOG_CQ_SIZE.within(base), cq.log_cq_size as u64)?
        .set("uar_page", cqc::UAR_PAGE.within(base), cq.uar_page as u64)?
        .set("c_eqn", cqc::C_EQN.within(base), cq.c_eqn as u64)?
        .set("log_page_size", cqc::LOG_PAGE_SIZE.within(base), 0)?
        .set("dbr_umem_valid", cqc::DBR_UMEM_VALID.within(base), 1)?
        .set("dbr_umem_id", cqc::DBR_UMEM_ID.within(base), cq.dbr_umem_id as u64)?
        .set("dbr_addr", cqc::DBR_ADDR.within(base), cq.dbr_offset)?;
    Ok(m)
}

/// An RC QP with a send queue only, whose WQ and doorbell record are umem objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSpec {
    /// Protection domain number (`mlx5dv_init_obj` of the PD).
    pub pd: u32,
    /// The UAR page whose doorbell register the QP is rung through.
    pub uar_page: u32,
    /// log2 of the send queue's 64-byte WQEBBs.
    pub log_sq_size: u32,
    /// The send CQ.
    pub cqn_snd: u32,
    /// The receive CQ (required by the PRM even without a receive queue).
    pub cqn_rcv: u32,
    /// The umem holding the WQ, and its offset.
    pub wq_umem_id: u32,
    /// Offset of the WQ in its umem.
    pub wq_umem_offset: u64,
    /// The umem holding the doorbell record, and the record's offset.
    pub dbr_umem_id: u32,
    /// Offset of the doorbell record in its umem (8-byte aligned).
    pub dbr_offset: u64,
    /// A user index reported in CQEs.
    pub user_index: u32,
}

/// The CREATE_QP input for `qp`.
pub fn create_qp(qp: &QpSpec) -> Result<Mailbox, PrmError> {
    const C: &str = "CREATE_QP";
    if qp.log_sq_size > 15 {
        return Err(fail(C, "log_sq_size", format!("{} is above 15", qp.log_sq_size)));
    }
    if !qp.dbr_offset.is_multiple_of(8) {
        return Err(fail(
            C,
            "dbr_addr",
            format!("offset {:#x} is not 8-byte aligned", qp.dbr_offset),
        ));
    }
    let q = create_qp_in::QPC.at;
    let mut m = Mailbox::new(C, create_qp_in::BITS);
    m.set("opcode", create_qp_in::OPCODE, opcode::CREATE_QP as u64)?
        .set("wq_umem_offset", create_qp_in::WQ_UMEM_OFFSET, qp.wq_umem_offset)?
        .set("wq_umem_id", create_qp_in::WQ_UMEM_ID, qp.wq_umem_id as u64)?
        .set("wq_umem_valid", create_qp_in::WQ_UMEM_VALID, 1)?
        .set("st", qpc::ST.within(q), value::QP_ST_RC)?
        .set("pm_state", qpc::PM_STATE.within(q), value::PM_STATE_MIGRATED)?
        .set("pd", qpc::PD.within(q), qp.pd as u64)?
        .set("uar_page", qpc::UAR_PAGE.within(q), qp.uar_page as u64)?
        .set("rq_type", qpc::RQ_TYPE.within(q), value::RQ_TYPE_ZERO_SIZE)?
        .set("log_sq_size", qpc::LOG_SQ_SIZE.within(q), qp.log_sq_size as u64)?
        .set("cqn_snd", qpc::CQN_SND.within(q), qp.cqn_snd as u64)?
        .set("cqn_rcv", qpc::CQN_RCV.within(q), qp.cqn_rcv as u64)?
        .set("user_index", qpc::USER_INDEX.within(q), qp.user_index as u64)?
        .set("dbr_umem_valid", qpc::DBR_UMEM_VALID.within(q), 1)?
        .set("dbr_umem_id", qpc::DBR_UMEM_ID.within(q), qp.dbr_umem_id as u64)?
        .set("dbr_addr", qpc::DBR_ADDR.within(q), qp.dbr_offset)?;
    Ok(m)
}

fn modify(command: &'static str, op: u16, qpn: u32) -> Result<Mailbox, PrmError> {
    let mut m = Mailbox::new(command, modify_qp_in::BITS);
    m.set("opcode", modify_qp_in::OPCODE, op as u64)?
        .set("qpn", modify_qp_in::QPN, qpn as u64)?;
    Ok(m)
}

/// RST2INIT of RC QP `qpn` on `port`: remote read, write and 8-byte atomics allowed.
pub fn rst2init(qpn: u32, port: u8) -> Result<Mailbox, PrmError> {
    let q = modify_qp_in::QPC.at;
    let a = qpc::PRIMARY_ADDRESS_PATH.at + q;
    let mut m = modify("RST2INIT_QP", opcode::RST2INIT_QP, qpn)?;
    m.set("pm_state", qpc::PM_STATE.within(q), value::PM_STATE_MIGRATED)?
        .set("rwe", qpc::RWE.within(q), 1)?
        .set("rre", qpc::RRE.within(q), 1)?
        .set("rae", qpc::RAE.within(q), 1)?
        .set("atomic_mode", qpc::ATOMIC_MODE.within(q), value::ATOMIC_MODE_UP_TO_8B)?
        .set("vhca_port_num", ads::VHCA_PORT_NUM.within(a), port as u64)?
        .set("pkey_index", ads::PKEY_INDEX.within(a), 0)?;
    Ok(m)
}

/// How the remote QP is addressed: by LID on InfiniBand, by GID (with the local GID index) on
/// RoCE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAddress {
    /// InfiniBand: the remote port's LID and the service level.
    Lid {
        /// Remote LID.
        lid: u16,
        /// Service level.
        sl: u8,
    },
    /// RoCE v2: the remote GID, our GID index, and the traffic class.
    Gid {
        /// Remote GID.
        gid: [u8; 16],
        /// Local GID table index.
        sgid_index: u8,
        /// Traffic class (DSCP in its upper six bits).
        traffic_class: u8,
    },
}

/// What INIT2RTR needs of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrSpec {
    /// The remote QP.
    pub remote_qpn: u32,
    /// How to reach it.
    pub address: RemoteAddress,
    /// Path MTU (the IB enum: 1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// The first PSN expected from the remote.
    pub next_rcv_psn: u32,
    /// log2 of the responder's outstanding RDMA READ / atomic limit.
    pub log_rra_max: u8,
    /// Minimum RNR NAK timer (the IB enum).
    pub min_rnr_nak: u8,
}

/// INIT2RTR of RC QP `qpn` toward `rtr.remote_qpn`.
pub fn init2rtr(qpn: u32, rtr: &RtrSpec) -> Result<Mailbox, PrmError> {
    const C: &str = "INIT2RTR_QP";
    if !(1..=5).contains(&rtr.mtu) {
        return Err(fail(C, "mtu", format!("{} is not an IB MTU (1..=5)", rtr.mtu)));
    }
    let q = modify_qp_in::QPC.at;
    let a = qpc::PRIMARY_ADDRESS_PATH.at + q;
    let mut m = modify(C, opcode::INIT2RTR_QP, qpn)?;
    m.set("mtu", qpc::MTU.within(q), rtr.mtu as u64)?
        .set("log_msg_max", qpc::LOG_MSG_MAX.within(q), 30)?
        .set("remote_qpn", qpc::REMOTE_QPN.within(q), rtr.remote_qpn as u64)?
        .set("next_rcv_psn", qpc::NEXT_RCV_PSN.within(q), rtr.next_rcv_psn as u64)?
        .set("log_rra_max", qpc::LOG_RRA_MAX.within(q), rtr.log_rra_max as u64)?
        .set("min_rnr_nak", qpc::MIN_RNR_NAK.within(q), rtr.min_rnr_nak as u64)?;
    match rtr.address {
        RemoteAddress::Lid { lid, sl } => {
            m.set("rlid", ads::RLID.within(a), lid as u64)?
                .set("sl", ads::SL.within(a), sl as u64)?
                .set("grh", ads::GRH.within(a), 0)?;
        }
        RemoteAddress::Gid {
            gid,
            sgid_index,
            traffic_class,
        } => {
            m.set("grh", ads::GRH.within(a), 1)?
                .set_bytes("rgid_rip", ads::RGID_RIP.within(a), &gid)?
                .set("src_addr_index", ads::SRC_ADDR_INDEX.within(a), sgid_index as u64)?
                .set("hop_limit", ads::HOP_LIMIT.within(a), 255)?
                .set("tclass", ads::TCLASS.within(a), traffic_class as u64)?
                .set("dscp", ads::DSCP.within(a), (traffic_class >> 2) as u64)?;
        }
    }
    Ok(m)
}

/// What RTR2RTS needs: the first PSN we send and the retry policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsSpec {
    /// The first PSN we send (the remote's `next_rcv_psn`).
    pub next_send_psn: u32,
    /// log2 of our outstanding RDMA READ / atomic limit.
    pub log_sra_max: u8,
    /// Transport retries (7 = the IB maximum).
    pub retry_count: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Local ACK timeout (4.096 µs × 2^n).
    pub ack_timeout: u8,
}

impl Default for RtsSpec {
    /// NVSHMEM IBGDA's choices: PSN 0, retries 7, RNR retries 7, ACK timeout 20 (about 4 s).
    fn default() -> Self {
        RtsSpec {
            next_send_psn: 0,
            log_sra_max: 4,
            retry_count: 7,
            rnr_retry: 7,
            ack_timeout: 20,
        }
    }
}

/// RTR2RTS of RC QP `qpn`.
pub fn rtr2rts(qpn: u32, rts: &RtsSpec) -> Result<Mailbox, PrmError> {
    let q = modify_qp_in::QPC.at;
    let a = qpc::PRIMARY_ADDRESS_PATH.at + q;
    let mut m = modify("RTR2RTS_QP", opcode::RTR2RTS_QP, qpn)?;
    m.set("log_ack_req_freq", qpc::LOG_ACK_REQ_FREQ.within(q), 0)?
        .set("next_send_psn", qpc::NEXT_SEND_PSN.within(q), rts.next_send_psn as u64)?
        .set("log_sra_max", qpc::LOG_SRA_MAX.within(q), rts.log_sra_max as u64)?
        .set("retry_count", qpc::RETRY_COUNT.within(q), rts.retry_count as u64)?
        .set("rnr_retry", qpc::RNR_RETRY.within(q), rts.rnr_retry as u64)?
        .set("ack_timeout", ads::ACK_TIMEOUT.within(a), rts.ack_timeout as u64)?;
    Ok(m)
}

/// A command's outcome as its output mailbox reports it: `Ok` with the output, or the status and
/// syndrome the device returned.
pub fn check_output(command: &'static str, out: &[u8]) -> Result<Mailbox, PrmError> {
    let m = Mailbox::from_bytes(command, out);
    if out.len() < 8 {
        return Err(fail(
            command,
            "status",
            format!("output of {} bytes is shorter than its header", out.len()),
        ));
    }
    let status = m.get(cmd_out::STATUS);
    if status != 0 {
        return Err(fail(
            command,
            "status",
            format!(
                "the device refused it: status {status:#x}, syndrome {:#x}",
                m.get(cmd_out::SYNDROME)
            ),
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_where_mlx5_set_puts_them() {
        let mut m = Mailbox::new("t", 0x80);
        // opcode: the top 16 bits of word 0, big-endian.
        m.set("opcode", cmd_in::OPCODE, 0x0500).unwrap();
        assert_eq!(&m.bytes()[..4], &[0x05, 0x00, 0x00, 0x00]);
        // A 24-bit field at bit 0x48: the low 24 bits of word 2.
        m.set("qpn", modify_qp_in::QPN, 0xab_cdef).unwrap();
        assert_eq!(&m.bytes()[8..12], &[0x00, 0xab, 0xcd, 0xef]);
        // A one-bit field in the middle of a word keeps its neighbours.
        let mut c = Mailbox::new("t", cqc::BITS);
        c.set("cqe_sz", cqc::CQE_SZ, 0b101)
            .unwrap()
            .set("cc", cqc::CC, 1)
            .unwrap();
        assert_eq!(c.bytes()[1], 0b1011_0000);
        assert_eq!((c.get(cqc::CQE_SZ), c.get(cqc::CC), c.get(cqc::OI)), (0b101, 1, 0));
        // 64-bit fields: two whole words, most significant first.
        c.set("dbr_addr", cqc::DBR_ADDR, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(
            &c.bytes()[0x38..0x40],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
    }

    #[test]
    fn a_value_wider_than_its_field_is_an_error_naming_both() {
        let e = create_qp(&QpSpec {
            pd: 1 << 24,
            uar_page: 1,
            log_sq_size: 10,
            cqn_snd: 1,
            cqn_rcv: 1,
            wq_umem_id: 1,
            wq_umem_offset: 0,
            dbr_umem_id: 1,
            dbr_offset: 0,
            user_index: 0,
        })
        .unwrap_err();
        assert_eq!(e.field, "pd");
        assert!(
            e.to_string()
                .contains("mlx5 CREATE_QP: field pd: 0x1000000 does not fit in 24 bits"),
            "{e}"
        );
        let e = create_cq(&CqSpec {
            log_cq_size: 6,
            uar_page: 1,
            c_eqn: 0,
            cq_umem_id: 1,
            cq_umem_offset: 0,
            dbr_umem_id: 1,
            dbr_offset: 4,
            collapsed: true,
        })
        .unwrap_err();
        assert!(e.to_string().contains("not 8-byte aligned"), "{e}");
    }

    #[test]
    fn the_qp_commands_carry_the_connection_where_the_qpc_says() {
        let rtr = RtrSpec {
            remote_qpn: 0x12345,
            address: RemoteAddress::Gid {
                gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                sgid_index: 3,
                traffic_class: 0x68,
            },
            mtu: 5,
            next_rcv_psn: 0,
            log_rra_max: 4,
            min_rnr_nak: 12,
        };
        let m = init2rtr(0x99, &rtr).unwrap();
        let q = modify_qp_in::QPC.at;
        let a = q + qpc::PRIMARY_ADDRESS_PATH.at;
        assert_eq!(m.get(modify_qp_in::OPCODE), opcode::INIT2RTR_QP as u64);
        assert_eq!(m.get(modify_qp_in::QPN), 0x99);
        assert_eq!(m.get(qpc::REMOTE_QPN.within(q)), 0x12345);
        assert_eq!(m.get(qpc::MTU.within(q)), 5);
        assert_eq!(m.get(ads::GRH.within(a)), 1);
        assert_eq!(m.get(ads::DSCP.within(a)), 0x68 >> 2);
        let gid_at = (ads::RGID_RIP.within(a).at / 8) as usize;
        assert_eq!(
            &m.bytes()[gid_at..gid_at + 16],
            &[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        let e = init2rtr(1, &RtrSpec { mtu: 6, ..rtr }).unwrap_err();
        assert!(e.to_string().contains("not an IB MTU"), "{e}");

        let m = rtr2rts(0x99, &RtsSpec::default()).unwrap();
        assert_eq!(m.get(qpc::RETRY_COUNT.within(q)), 7);
        assert_eq!(m.get(ads::ACK_TIMEOUT.within(a)), 20);
        let m = rst2init(0x99, 1).unwrap();
        assert_eq!(
            (
                m.get(qpc::RWE.within(q)),
                m.get(qpc::RRE.within(q)),
                m.get(qpc::RAE.within(q))
            ),
            (1, 1, 1)
        );
        assert_eq!(m.get(ads::VHCA_PORT_NUM.within(a)), 1);
    }

    #[test]
    fn a_refused_command_reports_status_and_syndrome() {
        let mut out = [0u8; 16];
        out[0] = 0x03; // bad parameter
        out[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        let e = check_output("CREATE_QP", &out).unwrap_err();
        assert!(e.to_string().contains("status 0x3, syndrome 0x12345678"), "{e}");
        let mut ok = [0u8; 16];
        ok[9..12].copy_from_slice(&[0x00, 0x01, 0x02]);
        assert_eq!(check_output("CREATE_QP", &ok).unwrap().get(create_qp_out::QPN), 0x102);
    }
}

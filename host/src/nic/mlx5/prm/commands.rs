//! The typed command builders: CREATE_CQ, CREATE_QP and the RC transitions from specs, and the
//! output check every command's result goes through.

use super::layout::{ads, cmd_out, cqc, create_cq_in, create_qp_in, modify_qp_in, opcode, qpc, value};
use super::mailbox::{Mailbox, PrmError};

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
    /// RoCE v2: the remote GID, our GID index, the traffic class, the next hop's MAC and the UDP
    /// source port.
    Gid {
        /// Remote GID.
        gid: [u8; 16],
        /// Local GID table index.
        sgid_index: u8,
        /// Traffic class (DSCP in its upper six bits).
        traffic_class: u8,
        /// The Ethernet address the packets go to (DEVX does no neighbour resolution).
        rmac: [u8; 6],
        /// The RoCE v2 UDP source port (`0xc000..`).
        udp_sport: u16,
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
            rmac,
            udp_sport,
        } => {
            let mac = u64::from_be_bytes([0, 0, rmac[0], rmac[1], rmac[2], rmac[3], rmac[4], rmac[5]]);
            m.set("grh", ads::GRH.within(a), 1)?
                .set_bytes("rgid_rip", ads::RGID_RIP.within(a), &gid)?
                .set("rmac_47_32", ads::RMAC_47_32.within(a), mac >> 32)?
                .set("rmac_31_0", ads::RMAC_31_0.within(a), mac & 0xffff_ffff)?
                .set("udp_sport", ads::UDP_SPORT.within(a), udp_sport as u64)?
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
    use crate::nic::mlx5::prm::layout::create_qp_out;

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
                rmac: [0x0c, 0x42, 0xa1, 0x01, 0x02, 0x03],
                udp_sport: 0xc123,
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
        assert_eq!(m.get(ads::RMAC_47_32.within(a)), 0x0c42);
        assert_eq!(m.get(ads::RMAC_31_0.within(a)), 0xa101_0203);
        assert_eq!(m.get(ads::UDP_SPORT.within(a)), 0xc123);
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

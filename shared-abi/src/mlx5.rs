//! The mlx5 (ConnectX) data-path formats: WQE segments, CQEs, doorbell records and the doorbell
//! register, as rdma-core's `infiniband/mlx5dv.h` defines them.
//!
//! Every multi-byte field a NIC reads is big-endian; the fields here are [`Be16`]/[`Be32`]/[`Be64`]
//! so that a value can only be stored through an explicit conversion. The layouts are checked three
//! ways: `offset_of!` tests below, a test that compiles a C program against Debian's
//! `libibverbs-dev` header and compares every `sizeof`/`offsetof` (`tests/mlx5dv_header.rs`), and
//! a golden-bytes test against rdma-core's own `mlx5dv_set_ctrl_seg` / `mlx5dv_set_data_seg`.
//!
//! The same bytes are read by a real ConnectX and by ibgda's emulated device.

/// A big-endian `u16` as it sits in NIC-visible memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be16(u16);
/// A big-endian `u32` as it sits in NIC-visible memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be32(u32);
/// A big-endian `u64` as it sits in NIC-visible memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be64(u64);

macro_rules! big_endian {
    ($t:ident, $n:ty) => {
        impl $t {
            /// Encodes a native value.
            #[inline(always)]
            pub const fn new(v: $n) -> Self {
                Self(v.to_be())
            }
            /// Decodes to a native value.
            #[inline(always)]
            pub const fn get(self) -> $n {
                <$n>::from_be(self.0)
            }
            /// The raw memory representation (what a native load of these bytes returns).
            #[inline(always)]
            pub const fn to_raw(self) -> $n {
                self.0
            }
            /// Wraps a raw memory representation.
            #[inline(always)]
            pub const fn from_raw(raw: $n) -> Self {
                Self(raw)
            }
        }
        impl core::fmt::Debug for $t {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{:#x}", self.get())
            }
        }
    };
}
big_endian!(Be16, u16);
big_endian!(Be32, u32);
big_endian!(Be64, u64);

/// Size of a send WQE basic block (`MLX5_SEND_WQE_BB`): the unit of the send queue and of its
/// producer index.
pub const WQEBB_BYTES: usize = 64;
/// `MLX5_SEND_WQE_SHIFT`.
pub const WQEBB_SHIFT: u32 = 6;
/// The unit of [`CtrlSeg`]'s DS count: one 16-byte "octoword".
pub const DS_BYTES: usize = 16;
/// Largest send-queue depth (in WQEBBs) the 16-bit index arithmetic allows: the device compares
/// 16-bit counters, so at most half the 16-bit space may be outstanding.
pub const MAX_SQ_DEPTH: u32 = 32768;
/// Bytes of one UAR page (`MLX5_ADAPTER_PAGE_SIZE`).
pub const UAR_PAGE_BYTES: usize = 4096;
/// Offset of the doorbell (BlueFlame) register in a UAR page (`MLX5_BF_OFFSET`).
pub const UAR_DOORBELL_OFFSET: usize = 0x800;
/// Bytes of a QP's doorbell record: `[MLX5_RCV_DBR]` then `[MLX5_SND_DBR]`, each a [`Be32`].
pub const QP_DBR_BYTES: usize = 8;
/// Byte offset of the send counter (`MLX5_SND_DBR` = 1) in a QP doorbell record.
pub const SND_DBR_OFFSET: usize = 4;
/// Byte offset of the receive counter (`MLX5_RCV_DBR` = 0) in a QP doorbell record.
pub const RCV_DBR_OFFSET: usize = 0;
/// Byte offset of the consumer index (`MLX5_CQ_SET_CI` = 0) in a CQ doorbell record.
pub const CQ_SET_CI_OFFSET: usize = 0;
/// `MLX5_INLINE_SEG`: the flag in [`InlineSeg::byte_count`] that marks inline data.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `MLX5_INVALID_LKEY`: an lkey that terminates a scatter list.
pub const INVALID_LKEY: u32 = 0x100;
/// Size of a 64-byte CQE.
pub const CQE_BYTES: usize = 64;
/// Largest message the emulated device and our QPs accept (`log_msg_max` = 30, as NVSHMEM sets).
pub const MAX_MESSAGE_BYTES: u64 = 1 << 30;

/// Send-WQE opcodes (`MLX5_OPCODE_*`), the low byte of [`CtrlSeg::opmod_idx_opcode`].
pub mod opcode {
    /// `MLX5_OPCODE_NOP`
    pub const NOP: u8 = 0x00;
    /// `MLX5_OPCODE_RDMA_WRITE`
    pub const RDMA_WRITE: u8 = 0x08;
    /// `MLX5_OPCODE_RDMA_WRITE_IMM`
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    /// `MLX5_OPCODE_SEND`
    pub const SEND: u8 = 0x0a;
    /// `MLX5_OPCODE_RDMA_READ`
    pub const RDMA_READ: u8 = 0x10;
    /// `MLX5_OPCODE_ATOMIC_CS`: 8-byte compare-and-swap.
    pub const ATOMIC_CS: u8 = 0x11;
    /// `MLX5_OPCODE_ATOMIC_FA`: 8-byte fetch-and-add.
    pub const ATOMIC_FA: u8 = 0x12;
    /// `MLX5_OPCODE_ATOMIC_MASKED_CS`: extended (4- or 8-byte) masked compare-and-swap.
    pub const ATOMIC_MASKED_CS: u8 = 0x14;
    /// `MLX5_OPCODE_ATOMIC_MASKED_FA`: extended (4- or 8-byte) masked fetch-and-add.
    pub const ATOMIC_MASKED_FA: u8 = 0x15;
}

/// Opcode modifiers for the extended (masked) atomics: the operand size, in the top byte of
/// [`CtrlSeg::opmod_idx_opcode`].
pub mod opmod {
    /// 4-byte extended atomic.
    pub const EXT_ATOMIC_4B: u8 = 0x08;
    /// 8-byte extended atomic.
    pub const EXT_ATOMIC_8B: u8 = 0x09;
}

/// [`CtrlSeg::fm_ce_se`] bits.
pub mod fm_ce_se {
    /// `MLX5_WQE_CTRL_CQ_UPDATE`: write a CQE when this WQE completes.
    pub const CQ_UPDATE: u8 = 2 << 2;
    /// `MLX5_WQE_CTRL_SOLICITED`
    pub const SOLICITED: u8 = 1 << 1;
    /// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`
    pub const INITIATOR_SMALL_FENCE: u8 = 1 << 5;
    /// `MLX5_WQE_CTRL_FENCE`
    pub const FENCE: u8 = 4 << 5;
    /// Mask of the fence-mode field (bits 7:5).
    pub const FENCE_MODE_MASK: u8 = 0xe0;
}

/// CQE opcodes (`MLX5_CQE_*`), the high nibble of [`Cqe64::op_own`].
pub mod cqe_opcode {
    /// `MLX5_CQE_REQ`: a send WQE completed successfully.
    pub const REQ: u8 = 0;
    /// `MLX5_CQE_RESP_WR_IMM`
    pub const RESP_WR_IMM: u8 = 1;
    /// `MLX5_CQE_SIG_ERR`
    pub const SIG_ERR: u8 = 12;
    /// `MLX5_CQE_REQ_ERR`: a send WQE failed; the CQE is an [`ErrCqe`](super::ErrCqe).
    pub const REQ_ERR: u8 = 13;
    /// `MLX5_CQE_RESP_ERR`
    pub const RESP_ERR: u8 = 14;
    /// `MLX5_CQE_INVALID`: what a CQ initialised to 0xff reads as.
    pub const INVALID: u8 = 15;
}

/// `MLX5_CQE_OWNER_MASK`: bit 0 of [`Cqe64::op_own`].
pub const CQE_OWNER_MASK: u8 = 1;

/// Error syndromes (`MLX5_CQE_SYNDROME_*`), [`ErrCqe::syndrome`].
pub mod syndrome {
    /// `LOCAL_LENGTH_ERR`: a length the device cannot accept (DS or message size).
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    /// `LOCAL_QP_OP_ERR`: a malformed WQE (opcode, QPN, index, DS).
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    /// `LOCAL_PROT_ERR`: the local buffer fails its lkey (unknown key, bounds, access).
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    /// `WR_FLUSH_ERR`: the WQE was not executed because the QP is in the error state.
    pub const WR_FLUSH_ERR: u8 = 0x05;
    /// `MW_BIND_ERR`
    pub const MW_BIND_ERR: u8 = 0x06;
    /// `BAD_RESP_ERR`
    pub const BAD_RESP_ERR: u8 = 0x10;
    /// `LOCAL_ACCESS_ERR`
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    /// `REMOTE_INVAL_REQ_ERR`: the responder rejected the request (misaligned atomic, length).
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    /// `REMOTE_ACCESS_ERR`: the remote buffer fails its rkey (unknown key, bounds, access).
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    /// `REMOTE_OP_ERR`
    pub const REMOTE_OP_ERR: u8 = 0x14;
    /// `TRANSPORT_RETRY_EXC_ERR`: the responder never answered (its QP is not ready).
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    /// `RNR_RETRY_EXC_ERR`
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    /// `REMOTE_ABORTED_ERR`
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;

    /// The rdma-core name of a syndrome, for diagnostics.
    pub const fn name(s: u8) -> &'static str {
        match s {
            LOCAL_LENGTH_ERR => "LOCAL_LENGTH_ERR",
            LOCAL_QP_OP_ERR => "LOCAL_QP_OP_ERR",
            LOCAL_PROT_ERR => "LOCAL_PROT_ERR",
            WR_FLUSH_ERR => "WR_FLUSH_ERR",
            MW_BIND_ERR => "MW_BIND_ERR",
            BAD_RESP_ERR => "BAD_RESP_ERR",
            LOCAL_ACCESS_ERR => "LOCAL_ACCESS_ERR",
            REMOTE_INVAL_REQ_ERR => "REMOTE_INVAL_REQ_ERR",
            REMOTE_ACCESS_ERR => "REMOTE_ACCESS_ERR",
            REMOTE_OP_ERR => "REMOTE_OP_ERR",
            TRANSPORT_RETRY_EXC_ERR => "TRANSPORT_RETRY_EXC_ERR",
            RNR_RETRY_EXC_ERR => "RNR_RETRY_EXC_ERR",
            REMOTE_ABORTED_ERR => "REMOTE_ABORTED_ERR",
            _ => "unknown syndrome",
        }
    }
}

/// `struct mlx5_wqe_ctrl_seg`: the first 16 bytes of every send WQE.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlSeg {
    /// `opmod << 24 | (wqe_index & 0xffff) << 8 | opcode`.
    pub opmod_idx_opcode: Be32,
    /// `qpn << 8 | ds`, where `ds` is the WQE's size in 16-byte units.
    pub qpn_ds: Be32,
    /// WQE signature; 0.
    pub signature: u8,
    /// DCI stream channel; unaligned big-endian `u16`, 0 for RC.
    pub dci_stream_channel_id: [u8; 2],
    /// Fence mode, completion and solicited-event bits ([`fm_ce_se`]).
    pub fm_ce_se: u8,
    /// Immediate data for WRITE_IMM, stored as given (already big-endian by convention).
    pub imm: u32,
}

impl CtrlSeg {
    /// Encodes a ctrl segment exactly as `mlx5dv_set_ctrl_seg` does (signature 0).
    #[inline(always)]
    pub const fn new(wqe_index: u16, opcode: u8, opmod: u8, qpn: u32, fm_ce_se: u8, ds: u8, imm: u32) -> Self {
        Self {
            opmod_idx_opcode: Be32::new(((opmod as u32) << 24) | ((wqe_index as u32) << 8) | opcode as u32),
            qpn_ds: Be32::new((qpn << 8) | ds as u32),
            signature: 0,
            dci_stream_channel_id: [0; 2],
            fm_ce_se,
            imm,
        }
    }
    /// The opcode (low byte of `opmod_idx_opcode`).
    pub const fn opcode(&self) -> u8 {
        self.opmod_idx_opcode.get() as u8
    }
    /// The opcode modifier (top byte of `opmod_idx_opcode`).
    pub const fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode.get() >> 24) as u8
    }
    /// The 16-bit WQE index the WQE claims to occupy.
    pub const fn wqe_index(&self) -> u16 {
        (self.opmod_idx_opcode.get() >> 8) as u16
    }
    /// The QP number (24 bits).
    pub const fn qpn(&self) -> u32 {
        self.qpn_ds.get() >> 8
    }
    /// The WQE size in 16-byte units (6 bits are defined; the byte is returned whole).
    pub const fn ds(&self) -> u8 {
        self.qpn_ds.get() as u8
    }
}

/// The 8 bytes written to the doorbell register ([`UAR_DOORBELL_OFFSET`]): the first 8 bytes of a
/// ctrl segment, of which a NIC inspects only the WQE index (the new producer index) and the QPN.
#[inline(always)]
pub const fn doorbell_value(producer_index: u16, qpn: u32) -> [Be32; 2] {
    [Be32::new((producer_index as u32) << 8), Be32::new(qpn << 8)]
}

/// [`doorbell_value`] as the one 8-byte little-endian store every ringer makes to the doorbell
/// register (the device poster, the CPU-assisted doorbell thread and the proxy).
#[inline(always)]
pub const fn doorbell_word(producer_index: u16, qpn: u32) -> u64 {
    let [a, b] = doorbell_value(producer_index, qpn);
    (a.to_raw() as u64) | ((b.to_raw() as u64) << 32)
}

/// The send doorbell record's word ([`SND_DBR_OFFSET`]) for `producer_index`, as stored.
#[inline(always)]
pub const fn dbr_word(producer_index: u16) -> u32 {
    Be32::new(producer_index as u32).to_raw()
}

/// `struct mlx5_wqe_raddr_seg`: the remote address and key of an RDMA or atomic WQE.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaddrSeg {
    /// Remote virtual address.
    pub raddr: Be64,
    /// Remote key.
    pub rkey: Be32,
    /// 0.
    pub reserved: u32,
}

/// `struct mlx5_wqe_data_seg`: one local scatter/gather entry.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataSeg {
    /// Length in bytes (0 means 2 GiB on real hardware; the emulated device rejects it).
    pub byte_count: Be32,
    /// Local key.
    pub lkey: Be32,
    /// Local virtual address.
    pub addr: Be64,
}

impl DataSeg {
    /// Encodes a data segment exactly as `mlx5dv_set_data_seg` does.
    #[inline(always)]
    pub const fn new(length: u32, lkey: u32, addr: u64) -> Self {
        Self {
            byte_count: Be32::new(length),
            lkey: Be32::new(lkey),
            addr: Be64::new(addr),
        }
    }
}

/// `struct mlx5_wqe_inl_data_seg`: the header of inline data; the bytes follow it in the WQE,
/// padded to a 16-byte boundary.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InlineSeg {
    /// `length | INLINE_SEG`.
    pub byte_count: Be32,
}

/// `struct mlx5_wqe_atomic_seg`: operands of ATOMIC_FA (add in `swap_add`) and ATOMIC_CS.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicSeg {
    /// The value to add (FA) or to swap in (CS).
    pub swap_add: Be64,
    /// The value to compare with (CS).
    pub compare: Be64,
}

/// The atomic segment of a 4-byte masked compare-and-swap: `new = (old & !swap_mask) | (swap &
/// swap_mask)` when `(old & compare_mask) == (compare & compare_mask)`.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskedCs32Seg {
    /// Bits to swap in.
    pub swap: Be32,
    /// Value to compare with.
    pub compare: Be32,
    /// Which bits of `swap` are written.
    pub swap_mask: Be32,
    /// Which bits take part in the comparison.
    pub compare_mask: Be32,
}

/// The atomic segment of a 4-byte masked fetch-and-add: the word is split into fields at the set
/// bits of `field_boundary` (a set bit is the top bit of a field) and `add` is added field by field
/// without carries across fields; `field_boundary = !0` therefore adds bit by bit (xor).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskedFa32Seg {
    /// Value to add.
    pub add: Be32,
    /// Field boundaries (0: one 32-bit field).
    pub field_boundary: Be32,
    /// 0.
    pub reserved: [u32; 2],
}

/// The atomic segment of an 8-byte masked fetch-and-add (see [`MaskedFa32Seg`]).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskedFa64Seg {
    /// Value to add.
    pub add: Be64,
    /// Field boundaries (0: one 64-bit field).
    pub field_boundary: Be64,
}

/// The two atomic segments of an 8-byte masked compare-and-swap (32 bytes: DS count 5 in all).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskedCs64Seg {
    /// Bits to swap in.
    pub swap: Be64,
    /// Value to compare with.
    pub compare: Be64,
    /// Which bits of `swap` are written.
    pub swap_mask: Be64,
    /// Which bits take part in the comparison.
    pub compare_mask: Be64,
}

/// `struct mlx5_cqe64`, as a requester (send-side) completion uses it.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe64 {
    /// Responder and Ethernet fields (`wqe_id`, `ml_path`, `slid`, `flags_rqpn`, ...): unused by the
    /// send path, left as the device wrote them.
    pub responder: [u8; 32],
    /// `srqn_uidx`: the QP's user index.
    pub srqn_uidx: Be32,
    /// Immediate, invalidated key or pkey (responder).
    pub imm_inval_pkey: Be32,
    /// `app`
    pub app: u8,
    /// `app_op`
    pub app_op: u8,
    /// `app_info`
    pub app_info: Be16,
    /// Bytes transferred (READ and atomics report their length).
    pub byte_cnt: Be32,
    /// Completion timestamp.
    pub timestamp: Be64,
    /// The QPN in the low 24 bits.
    pub sop_drop_qpn: Be32,
    /// WQEBB index of the completed WQE (the last one when completions are collapsed).
    pub wqe_counter: Be16,
    /// `signature`
    pub signature: u8,
    /// CQE opcode in bits 7:4 ([`cqe_opcode`]), compression format 3:2, SE bit 1, owner bit 0.
    pub op_own: u8,
}

/// `struct mlx5_err_cqe`: what a [`Cqe64`] with opcode [`cqe_opcode::REQ_ERR`] holds.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrCqe {
    /// Unused by the send path.
    pub rsvd0: [u8; 32],
    /// `srqn`
    pub srqn: Be32,
    /// Reserved.
    pub rsvd1: [u8; 18],
    /// Vendor-specific syndrome.
    pub vendor_err_synd: u8,
    /// The error syndrome ([`syndrome`]).
    pub syndrome: u8,
    /// The failed WQE's opcode in the high byte, the QPN in the low 24 bits.
    pub s_wqe_opcode_qpn: Be32,
    /// WQEBB index of the failed WQE.
    pub wqe_counter: Be16,
    /// `signature`
    pub signature: u8,
    /// As in [`Cqe64::op_own`].
    pub op_own: u8,
}

/// Byte offset of the last 8 bytes of a CQE (`sop_drop_qpn`, `wqe_counter`, `signature`,
/// `op_own`): the emulated device publishes them with one release store, and pollers read them
/// with one acquire load, so a poller that sees a new `wqe_counter` sees the whole CQE.
pub const CQE_TAIL_OFFSET: usize = 56;
/// Byte offset of `wqe_counter` in a CQE.
pub const CQE_WQE_COUNTER_OFFSET: usize = 60;
/// Byte offset of `op_own` in a CQE.
pub const CQE_OP_OWN_OFFSET: usize = 63;
/// Byte offset of the syndrome in an error CQE.
pub const CQE_SYNDROME_OFFSET: usize = 55;

/// The decoded tail of a CQE (the 8 bytes at [`CQE_TAIL_OFFSET`], as one native little-endian
/// load returns them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqeTail {
    /// QPN (low 24 bits of `sop_drop_qpn`; for an error CQE the high byte is the WQE opcode).
    pub sop_drop_qpn: u32,
    /// `wqe_counter`.
    pub wqe_counter: u16,
    /// `op_own`.
    pub op_own: u8,
}

impl CqeTail {
    /// Decodes the raw 8-byte load of a CQE's last 8 bytes.
    #[inline(always)]
    pub const fn from_raw(raw: u64) -> Self {
        let bytes = raw.to_le_bytes();
        Self {
            sop_drop_qpn: u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            wqe_counter: u16::from_be_bytes([bytes[4], bytes[5]]),
            op_own: bytes[7],
        }
    }
    /// Encodes the raw 8 bytes (inverse of [`CqeTail::from_raw`], signature 0).
    #[inline(always)]
    pub const fn to_raw(self) -> u64 {
        let q = self.sop_drop_qpn.to_be_bytes();
        let w = self.wqe_counter.to_be_bytes();
        u64::from_le_bytes([q[0], q[1], q[2], q[3], w[0], w[1], 0, self.op_own])
    }
    /// The CQE opcode ([`cqe_opcode`]).
    #[inline(always)]
    pub const fn opcode(self) -> u8 {
        self.op_own >> 4
    }

    /// What a poller of a collapsed CQ learns from this tail (every poller decodes it here: the
    /// device's IBGDA QPs and the proxy's host QPs).
    #[inline(always)]
    pub const fn completion(self) -> Completion {
        match self.opcode() {
            cqe_opcode::INVALID => Completion::None,
            cqe_opcode::REQ => Completion::Done {
                wqe_counter: self.wqe_counter,
            },
            cqe_opcode::REQ_ERR => Completion::Error {
                wqe_counter: self.wqe_counter,
                wqe_opcode: (self.sop_drop_qpn >> 24) as u8,
            },
            op => Completion::Unexpected { opcode: op },
        }
    }
}

/// A decoded CQE tail ([`CqeTail::completion`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// No CQE yet (the initial all-ones tail).
    None,
    /// Every WQE up to the one with this 16-bit index completed.
    Done {
        /// The completed WQE's index.
        wqe_counter: u16,
    },
    /// The WQE with this index failed; the syndrome is at [`CQE_SYNDROME_OFFSET`].
    Error {
        /// The failed WQE's index.
        wqe_counter: u16,
        /// Its opcode.
        wqe_opcode: u8,
    },
    /// A CQE opcode a requester's CQ never holds.
    Unexpected {
        /// The CQE opcode.
        opcode: u8,
    },
}

/// WQE sizes in DS units for the WQEs ibgda builds (RC, one data segment).
pub mod wqe_ds {
    /// ctrl + raddr + data: RDMA WRITE, WRITE_IMM, READ.
    pub const RDMA: u8 = 3;
    /// ctrl + raddr + atomic + data: ATOMIC_FA/CS and the 4-byte and 8-byte-FA masked forms.
    pub const ATOMIC: u8 = 4;
    /// ctrl + raddr + two atomic segments + data: 8-byte masked CS.
    pub const MASKED_CS_64: u8 = 5;
    /// ctrl only.
    pub const NOP: u8 = 1;

    /// DS of an inline RDMA WRITE of `len` bytes: ctrl + raddr + the inline header and data,
    /// rounded up to 16 bytes.
    pub const fn inline_write(len: u32) -> u8 {
        (2 + (4 + len).div_ceil(16)) as u8
    }

    /// WQEBBs a WQE of `ds` units occupies.
    pub const fn wqebbs(ds: u8) -> u32 {
        (ds as u32 * 16).div_ceil(64)
    }
}

/// Largest inline payload the emulated device accepts and ibgda posts (the `max_inline_data`
/// NVSHMEM's IBRC asks for); 128 bytes take 11 DS, three WQEBBs.
pub const MAX_INLINE_BYTES: u32 = 128;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn segment_layouts() {
        assert_eq!((size_of::<CtrlSeg>(), align_of::<CtrlSeg>()), (16, 4));
        assert_eq!(offset_of!(CtrlSeg, opmod_idx_opcode), 0);
        assert_eq!(offset_of!(CtrlSeg, qpn_ds), 4);
        assert_eq!(offset_of!(CtrlSeg, signature), 8);
        assert_eq!(offset_of!(CtrlSeg, dci_stream_channel_id), 9);
        assert_eq!(offset_of!(CtrlSeg, fm_ce_se), 11);
        assert_eq!(offset_of!(CtrlSeg, imm), 12);
        assert_eq!((size_of::<RaddrSeg>(), align_of::<RaddrSeg>()), (16, 8));
        assert_eq!(offset_of!(RaddrSeg, rkey), 8);
        assert_eq!((size_of::<DataSeg>(), align_of::<DataSeg>()), (16, 8));
        assert_eq!(offset_of!(DataSeg, lkey), 4);
        assert_eq!(offset_of!(DataSeg, addr), 8);
        assert_eq!((size_of::<InlineSeg>(), align_of::<InlineSeg>()), (4, 4));
        assert_eq!((size_of::<AtomicSeg>(), align_of::<AtomicSeg>()), (16, 8));
        assert_eq!(offset_of!(AtomicSeg, compare), 8);
        assert_eq!(size_of::<MaskedCs32Seg>(), 16);
        assert_eq!(offset_of!(MaskedCs32Seg, swap_mask), 8);
        assert_eq!(size_of::<MaskedFa32Seg>(), 16);
        assert_eq!(size_of::<MaskedFa64Seg>(), 16);
        assert_eq!(size_of::<MaskedCs64Seg>(), 32);
        assert_eq!(offset_of!(MaskedCs64Seg, swap_mask), 16);
    }

    #[test]
    fn cqe_layouts() {
        assert_eq!((size_of::<Cqe64>(), align_of::<Cqe64>()), (64, 8));
        assert_eq!(offset_of!(Cqe64, srqn_uidx), 32);
        assert_eq!(offset_of!(Cqe64, byte_cnt), 44);
        assert_eq!(offset_of!(Cqe64, timestamp), 48);
        assert_eq!(offset_of!(Cqe64, sop_drop_qpn), CQE_TAIL_OFFSET);
        assert_eq!(offset_of!(Cqe64, wqe_counter), CQE_WQE_COUNTER_OFFSET);
        assert_eq!(offset_of!(Cqe64, op_own), CQE_OP_OWN_OFFSET);
        assert_eq!((size_of::<ErrCqe>(), align_of::<ErrCqe>()), (64, 4));
        assert_eq!(offset_of!(ErrCqe, srqn), 32);
        assert_eq!(offset_of!(ErrCqe, vendor_err_synd), 54);
        assert_eq!(offset_of!(ErrCqe, syndrome), CQE_SYNDROME_OFFSET);
        assert_eq!(offset_of!(ErrCqe, s_wqe_opcode_qpn), 56);
        assert_eq!(offset_of!(ErrCqe, wqe_counter), 60);
        assert_eq!(offset_of!(ErrCqe, op_own), 63);
    }

    #[test]
    fn ctrl_seg_fields_round_trip() {
        let c = CtrlSeg::new(
            0xbeef,
            opcode::ATOMIC_MASKED_FA,
            opmod::EXT_ATOMIC_4B,
            0xabcdef,
            fm_ce_se::CQ_UPDATE,
            4,
            7,
        );
        assert_eq!(c.opcode(), opcode::ATOMIC_MASKED_FA);
        assert_eq!(c.opmod(), opmod::EXT_ATOMIC_4B);
        assert_eq!(c.wqe_index(), 0xbeef);
        assert_eq!(c.qpn(), 0xabcdef);
        assert_eq!(c.ds(), 4);
        // Big-endian in memory: the opmod byte comes first, the opcode last.
        let raw = c.opmod_idx_opcode.to_raw().to_ne_bytes();
        assert_eq!(raw, [0x08, 0xbe, 0xef, 0x15]);
    }

    #[test]
    fn cqe_tail_round_trip() {
        let t = CqeTail {
            sop_drop_qpn: 0x0d00_1234,
            wqe_counter: 0xfffe,
            op_own: 0xd1,
        };
        assert_eq!(CqeTail::from_raw(t.to_raw()), t);
        assert_eq!(t.opcode(), cqe_opcode::REQ_ERR);
        // A CQ initialised to 0xff reads as an INVALID CQE whose counter is 0xffff.
        let init = CqeTail::from_raw(u64::MAX);
        assert_eq!((init.opcode(), init.wqe_counter), (cqe_opcode::INVALID, 0xffff));
        assert_eq!(init.completion(), Completion::None);
        assert_eq!(
            t.completion(),
            Completion::Error {
                wqe_counter: 0xfffe,
                wqe_opcode: 0x0d
            }
        );
        let ok = CqeTail {
            op_own: cqe_opcode::REQ << 4,
            ..t
        };
        assert_eq!(ok.completion(), Completion::Done { wqe_counter: 0xfffe });
        let odd = CqeTail { op_own: 0x20, ..t };
        assert_eq!(odd.completion(), Completion::Unexpected { opcode: 2 });
        // The doorbell's 8 bytes in memory order: the producer index and the QPN, each shifted
        // left by 8, big-endian.
        assert_eq!(
            doorbell_word(0x1234, 0x0abcde).to_le_bytes(),
            [0, 0x12, 0x34, 0, 0x0a, 0xbc, 0xde, 0]
        );
        assert_eq!(dbr_word(0x1234).to_le_bytes(), [0, 0, 0x12, 0x34]);
    }

    #[test]
    fn ds_and_wqebb_counts() {
        assert_eq!(wqe_ds::inline_write(1), 3);
        assert_eq!(wqe_ds::inline_write(12), 3);
        assert_eq!(wqe_ds::inline_write(13), 4);
        assert_eq!(wqe_ds::inline_write(MAX_INLINE_BYTES), 11);
        assert_eq!(wqe_ds::wqebbs(wqe_ds::RDMA), 1);
        assert_eq!(wqe_ds::wqebbs(wqe_ds::ATOMIC), 1);
        assert_eq!(wqe_ds::wqebbs(wqe_ds::MASKED_CS_64), 2);
        assert_eq!(wqe_ds::wqebbs(wqe_ds::inline_write(MAX_INLINE_BYTES)), 3);
    }
}

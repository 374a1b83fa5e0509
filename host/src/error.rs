//! The runtime's error type: every failure names the call, the PE and what was wrong.

use ibgda_abi::{ErrorKind, ErrorRecord, TransportKind, WaitKind};
use std::fmt;

/// Result alias for the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the host runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library could be loaded.
    #[error("no CUDA driver: libcuda could not be loaded (is an NVIDIA driver installed?)")]
    NoCudaDriver,
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed on PE {pe}: {source}")]
    Cuda {
        /// The driver call.
        call: &'static str,
        /// The PE that made it.
        pe: u32,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// Fewer CUDA devices than the configuration needs.
    #[error("PE {pe} needs CUDA device {device}, but only {count} device(s) are visible")]
    NoSuchDevice {
        /// The PE.
        pe: u32,
        /// The device it needed.
        device: usize,
        /// How many exist.
        count: usize,
    },
    /// Two PEs' GPUs cannot reach each other by loads and stores.
    #[error("PE {pe} (GPU {device}) cannot access PE {peer}'s GPU {peer_device} peer-to-peer")]
    PeerUnreachable {
        /// This PE.
        pe: u32,
        /// Its device.
        device: usize,
        /// The peer.
        peer: u32,
        /// The peer's device.
        peer_device: usize,
    },
    /// The multi-process rendezvous (rank 0's TCP listener) could not be set up or reached.
    #[error("bootstrap rendezvous at {addr} on PE {pe}: {why}")]
    Rendezvous {
        /// The PE.
        pe: u32,
        /// `MASTER_ADDR:MASTER_PORT`.
        addr: String,
        /// What went wrong, and what to check.
        why: String,
    },
    /// Shared memory between the processes of a node (CPU emulation) could not be set up.
    #[error("shared memory on PE {pe}: {why}")]
    SharedMemory {
        /// The PE.
        pe: u32,
        /// What failed.
        why: String,
    },
    /// A symmetric buffer used with a heap that did not allocate it, or after `free`.
    #[error("{call} on PE {pe}: the buffer is not a live allocation of this PE's heap: {why}")]
    ForeignBuffer {
        /// The call.
        call: &'static str,
        /// The PE.
        pe: u32,
        /// Whose it was, or that it was freed.
        why: String,
    },
    /// A call that needs the other kind of PE (a CUDA stream on a CPU-emulated PE, say).
    #[error("{call} on PE {pe} needs {what}")]
    WrongDevice {
        /// The call.
        call: &'static str,
        /// The PE.
        pe: u32,
        /// What it needs.
        what: &'static str,
    },
    /// A PE index out of range.
    #[error("{call}: PE {pe} is out of range (n_pes = {n_pes})")]
    InvalidPe {
        /// The call.
        call: &'static str,
        /// The bad index.
        pe: u32,
        /// Number of PEs.
        n_pes: u32,
    },
    /// The symmetric heap has no room for an allocation.
    #[error("malloc on PE {pe}: symmetric heap exhausted: {requested} bytes requested, largest free block {largest_free} of {heap_size} bytes")]
    HeapExhausted {
        /// The PE (the first that failed).
        pe: u32,
        /// Bytes requested.
        requested: u64,
        /// Largest free block.
        largest_free: u64,
        /// Total heap bytes.
        heap_size: u64,
    },
    /// `free` of something `malloc` did not return (or returned and was already freed).
    #[error("free on PE {pe}: {offset:#x} is not the start of a live symmetric allocation")]
    ForeignFree {
        /// The PE.
        pe: u32,
        /// Heap offset passed.
        offset: u64,
    },
    /// A host access to a symmetric buffer outside its bounds.
    #[error("{call} on PE {pe}: range [{offset:#x}, +{len}) lies outside the allocation of {size} bytes")]
    OutOfBounds {
        /// The call.
        call: &'static str,
        /// The PE.
        pe: u32,
        /// Offset into the buffer.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Buffer size.
        size: u64,
    },
    /// PEs disagreed in a collective call (e.g. different `malloc` sizes).
    #[error("collective {call} mismatch: PE {pe} passed {mine}, PE {other_pe} passed {theirs}")]
    CollectiveMismatch {
        /// The call.
        call: &'static str,
        /// This PE.
        pe: u32,
        /// What it passed.
        mine: String,
        /// The first PE that disagreed.
        other_pe: u32,
        /// What that PE passed.
        theirs: String,
    },
    /// A PE did not arrive at a host-side collective in time.
    #[error("bootstrap {call} on PE {pe} timed out after {elapsed_ms} ms waiting for PE(s) {missing:?}")]
    BootstrapTimeout {
        /// The collective.
        call: &'static str,
        /// This PE.
        pe: u32,
        /// PEs that never arrived.
        missing: Vec<u32>,
        /// Time waited.
        elapsed_ms: u64,
    },
    /// Another PE's thread failed, so a collective cannot complete.
    #[error("{call} on PE {pe}: PE {failed_pe} has failed and left the job (it exited, was killed, or gave up)")]
    PeerFailed {
        /// The collective.
        call: &'static str,
        /// This PE.
        pe: u32,
        /// The PE that failed.
        failed_pe: u32,
    },
    /// Loading a PTX module failed; includes the JIT log.
    #[error("loading PTX module on PE {pe} failed ({source}); JIT log:\n{log}")]
    ModuleLoad {
        /// The PE.
        pe: u32,
        /// The driver error.
        source: cudarc::driver::DriverError,
        /// The JIT compiler's error log.
        log: String,
    },
    /// A kernel reported an error through its PE's error record.
    #[error("device error on PE {}: {}", .0.pe, DisplayRecord(.0))]
    Device(Box<ErrorRecord>),
    /// A kernel's wait on a proxy channel failed because the proxy thread serving it died; `reason`
    /// is what killed the thread (an error completion, a malformed descriptor, a panic).
    #[error("device error on PE {}: {}; proxy thread {thread} failed: {reason}", .record.pe, DisplayRecord(.record))]
    ProxyFailed {
        /// The device's record (kind `ProxyFailed`, naming the channel and its counters).
        record: Box<ErrorRecord>,
        /// The proxy thread.
        thread: u32,
        /// Why it died.
        reason: String,
    },
    /// A kernel of this PE failed because another PE of this process on the same GPU (one CUDA
    /// context) hit a device error: a trap ends the context for every PE that shares it. The
    /// other PE's own report is `record`; this one is its echo.
    #[error("kernel on PE {pe} failed ({source}) because PE {} on the same GPU, whose CUDA context it shares, hit a device error: {}", .record.pe, DisplayRecord(.record))]
    SharedContextFault {
        /// This PE.
        pe: u32,
        /// The driver error this PE saw.
        source: cudarc::driver::DriverError,
        /// The device error of the PE that faulted.
        record: Box<ErrorRecord>,
    },
    /// A kernel failed without leaving an error record.
    #[error("kernel on PE {pe} failed without a device error record: {source}")]
    KernelFailed {
        /// The PE.
        pe: u32,
        /// The driver error seen at synchronisation.
        source: cudarc::driver::DriverError,
    },
    /// A launch asked for more threads per block than the kernel's register use allows.
    #[error("launch on PE {pe}: {threads} threads per block requested, but this kernel allows at most {max} ({registers} registers per thread)")]
    BlockTooLarge {
        /// The PE.
        pe: u32,
        /// Threads per block requested.
        threads: u32,
        /// The kernel's limit.
        max: u32,
        /// Registers per thread.
        registers: i32,
    },
    /// An emulated (CPU) device thread panicked without leaving an error record.
    #[error("emulated kernel thread on PE {pe}, block {block} panicked: {message}")]
    EmulatedPanic {
        /// The PE.
        pe: u32,
        /// The emulated block.
        block: u32,
        /// The panic message.
        message: String,
    },
    /// The emulated mlx5 device rejected a control-plane call.
    #[error("emulated mlx5 device: {op} failed: {reason}")]
    EmulatedDevice {
        /// The verb (`reg_mr`, `create_qp`, `modify_qp(RTR)`, ...).
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// A real NIC's control plane refused a step (rdma-core's answer, with its errno).
    #[error("NIC {device}: {op} failed: {what}")]
    Nic {
        /// The step (`ibv_reg_mr`, `CREATE_QP`, `cuMemHostRegister(IOMEMORY)`, ...).
        op: &'static str,
        /// The device.
        device: String,
        /// What went wrong.
        what: String,
    },
    /// A team call the runtime cannot make: a team that is not well formed or not held, a
    /// member past the parent team, every slot in use.
    #[error("{call} on PE {pe}: {why}")]
    Team {
        /// The call.
        call: &'static str,
        /// The PE.
        pe: u32,
        /// What was wrong.
        why: String,
    },
    /// A configuration value could not be used.
    #[error("invalid configuration {name}={value:?}: {why}")]
    Config {
        /// The setting (environment variable name).
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is rejected.
        why: String,
    },
}

/// Formats an [`ErrorRecord`] with every field that applies to its kind.
pub struct DisplayRecord<'a>(pub &'a ErrorRecord);

impl fmt::Display for DisplayRecord<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        if let Some(op) = ibgda_abi::Op::from_u32(r.op) {
            write!(f, "in {}: ", op.name())?;
        }
        let at = format!("(block {}, thread {})", r.block, r.thread);
        let peer = if r.peer == ibgda_abi::NONE {
            "none".to_string()
        } else {
            r.peer.to_string()
        };
        match ErrorKind::from_u32(r.kind) {
            Some(ErrorKind::AbiMismatch) => write!(
                f,
                "ABI mismatch: kernel built for ibgda-abi version {} / state size {}, runtime has version {} / size {} {at}",
                r.observed >> 32,
                r.observed & 0xffff_ffff,
                r.expected >> 32,
                r.expected & 0xffff_ffff
            ),
            Some(ErrorKind::InvalidPe) => match r.size {
                0 => write!(f, "invalid PE {} (n_pes = {}) {at}", r.observed, r.expected),
                team => write!(
                    f,
                    "invalid team PE {} of team {team:#x}, which has {} PEs {at}",
                    r.observed, r.expected
                ),
            },
            Some(ErrorKind::OutsideHeap) => write!(
                f,
                "address {:#x} (+{} bytes) for peer {peer} is outside the symmetric heap (heap offset {:#x}, heap size {}) {at}",
                r.address, r.size, r.observed as i64, r.expected
            ),
            Some(ErrorKind::MisalignedAtomic) => write!(
                f,
                "misaligned {}-byte atomic or p/g access at {:#x} for peer {peer} {at}",
                r.size, r.address
            ),
            Some(ErrorKind::Timeout) => {
                let what = match WaitKind::from_u32(r.detail & 0xff) {
                    Some(WaitKind::Signal) => {
                        let cmp = ["==", "!=", ">", ">=", "<", "<="].get(((r.detail >> 8) & 0xff) as usize).copied().unwrap_or("?");
                        format!("signal_wait_until(signal at {:#x} {cmp} {})", r.address, r.expected)
                    }
                    Some(WaitKind::WaitUntil) => {
                        let cmp = ["==", "!=", ">", ">=", "<", "<="].get(((r.detail >> 8) & 0xff) as usize).copied().unwrap_or("?");
                        format!("wait_until(word at {:#x} {cmp} {}, last seen {})", r.address, r.expected, r.observed)
                    }
                    Some(WaitKind::BulkCopy) => format!(
                        "bulk copy of {} bytes to peer {peer}: the stage load from {:#x} never landed ({} bytes stored)",
                        r.size, r.address, r.observed
                    ),
                    Some(WaitKind::Barrier) => match r.size {
                        0 => format!("barrier_all (arrivals word at {:#x}, needed {})", r.address, r.expected),
                        team => format!("the barrier of team {team:#x} (arrivals word at {:#x}, needed {})", r.address, r.expected),
                    },
                    Some(k @ (WaitKind::Quiet | WaitKind::SendQueueSlot)) => format!(
                        "{} on QP {:#x} to peer {peer}: {} needed {}, observed {} (CQ at {:#x})",
                        if k == WaitKind::Quiet { "quiet/completion wait" } else { "wait for a free send-queue slot" },
                        r.qp,
                        k.counter(),
                        r.expected,
                        r.observed,
                        r.address
                    ),
                    Some(k @ (WaitKind::ReadyChain | WaitKind::LandingSlot)) => format!(
                        "{} on QP {:#x} to peer {peer}: {} needed {}, observed {}",
                        if k == WaitKind::ReadyChain { "in-order ready chain" } else { "landing-slot wait" },
                        r.qp,
                        k.counter(),
                        r.expected,
                        r.observed
                    ),
                    Some(WaitKind::DoorbellLock) => format!("doorbell lock of QP {:#x} to peer {peer}", r.qp),
                    Some(k @ (WaitKind::ProxyRingSlot | WaitKind::ProxyCompletion)) => format!(
                        "{} on proxy channel {} (peer {peer}): {} needed {}, observed {} (status at {:#x})",
                        if k == WaitKind::ProxyCompletion { "quiet/completion wait" } else { "wait for a free ring slot" },
                        r.qp,
                        k.counter(),
                        r.expected,
                        r.observed,
                        r.address
                    ),
                    None => format!("unknown wait {}", r.detail),
                };
                write!(
                    f,
                    "timeout on PE {} after {:.3} ms in {what}; last observed {} (peer {peer}) {at}",
                    r.pe,
                    r.elapsed_ns as f64 / 1e6,
                    r.observed
                )
            }
            Some(ErrorKind::CompletionError) => {
                let what = if r.detail & 0x100 != 0 {
                    format!("unexpected CQE opcode {}", r.detail & 0xff)
                } else {
                    format!(
                        "syndrome {:#04x} {}",
                        r.detail,
                        ibgda_abi::mlx5::syndrome::name(r.detail as u8)
                    )
                };
                write!(
                    f,
                    "error completion on PE {} QP {:#x} (peer {peer}): {what} for WQE index {} (opcode {:#04x}) {at}",
                    r.pe, r.qp, r.expected, r.observed
                )
            }
            Some(ErrorKind::UnregisteredBuffer) => {
                let via = if r.detail == 1 {
                    format!("a proxy operation (channel {})", r.qp)
                } else {
                    format!("an IBGDA operation (QP {:#x})", r.qp)
                };
                write!(
                    f,
                    "local buffer {:#x} (+{} bytes) of {via} to peer {peer} is not registered with the NIC (only the symmetric heap is) {at}",
                    r.address, r.size
                )
            }
            Some(ErrorKind::ProxyFailed) => write!(
                f,
                "the CPU proxy thread {} serving channel {} of PE {} has died (waiting for {} to reach {}, observed {}, peer {peer}); the host error says why {at}",
                r.detail, r.qp, r.pe, WaitKind::ProxyCompletion.counter(), r.expected, r.observed
            ),
            Some(ErrorKind::UnreservedIndex) => write!(
                f,
                "wait on index {} of QP {:#x}, past every reservation ({} reserved so far): nothing was rung {at}",
                r.observed, r.qp, r.expected
            ),
            Some(ErrorKind::TransportUnavailable) => write!(
                f,
                "peer {peer} has transport {:?}, which cannot reach {:#x} (+{} bytes) {at}",
                TransportKind::from_u32(r.detail),
                r.address,
                r.size
            ),
            Some(ErrorKind::ScratchTooSmall) => write!(
                f,
                "the collective scratch at {:#x} holds {} bytes on PE {}, fewer than the {} a round needs (one element from each PE): \
                 raise IBGDA_COLLECTIVE_SCRATCH (at most a 64th of IBGDA_SYMMETRIC_SIZE is kept) {at}",
                r.address, r.size, r.pe, r.expected
            ),
            Some(ErrorKind::InvalidTeam) => {
                let team = match ibgda_abi::Team::from_bits(r.observed) {
                    Some(t) => format!(
                        "team {:#x} (slot {}, world PEs {} + {} * i for i < {})",
                        r.observed,
                        t.slot(),
                        t.start(),
                        t.stride(),
                        t.size()
                    ),
                    None => format!("{:#x}, which is no team handle", r.observed),
                };
                let slot = ibgda_abi::Team::from_bits(r.observed).map(|t| t.slot());
                let held = match (slot, r.expected) {
                    (Some(0), w) => format!("slot 0 is the world, whose handle is {w:#x}"),
                    (_, 0) => "its slot is free (destroyed, or never made on this PE)".to_string(),
                    (_, h) => format!("its slot holds team {h:#x} (a later team, or another shape)"),
                };
                write!(
                    f,
                    "PE {} was given {team}, which the runtime does not hold: {held}; pass a handle from Pe::team_split_strided \
                     or Pe::team_world of this run, before team_destroy {at}",
                    r.pe
                )
            }
            Some(ErrorKind::NotInTeam) => {
                let t = ibgda_abi::Team::from_bits(r.observed);
                write!(
                    f,
                    "PE {} is not a member of team {:#x}{}: only its members may make this call {at}",
                    r.pe,
                    r.observed,
                    t.map(|t| format!(" (world PEs {} + {} * i for i < {})", t.start(), t.stride(), t.size()))
                        .unwrap_or_default()
                )
            }
            None => write!(f, "unknown device error kind {}: {r:?}", r.kind),
        }
    }
}

impl Error {
    /// The device error record, if this is a device-reported error.
    pub fn device_record(&self) -> Option<&ErrorRecord> {
        match self {
            Error::Device(r) | Error::ProxyFailed { record: r, .. } => Some(r),
            _ => None,
        }
    }

    /// The device error kind, if this is a device-reported error.
    pub fn device_kind(&self) -> Option<ErrorKind> {
        self.device_record().and_then(|r| ErrorKind::from_u32(r.kind))
    }
}

impl From<crate::nic::mlx5::NicError> for Error {
    fn from(e: crate::nic::mlx5::NicError) -> Error {
        Error::Nic {
            op: e.op,
            device: e.device,
            what: e.what,
        }
    }
}

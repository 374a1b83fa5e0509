//! Device-side error reporting: fill the PE's host-mapped [`ErrorRecord`] (first error wins, by a
//! claim word in device memory) and trap.

use crate::arch;
use ibgda_abi::{error_state, ErrorKind, ErrorRecord};

/// What a failed check reports. Plain scalars, so the cold path takes no stack frame.
#[derive(Clone, Copy)]
pub(crate) struct Failure {
    pub kind: ErrorKind,
    pub peer: u32,
    pub qp: u32,
    pub detail: u32,
    pub address: u64,
    pub size: u64,
    pub expected: u64,
    pub observed: u64,
    pub elapsed_ns: u64,
    /// The device-API call ([`ibgda_abi::Op`] as `u32`; 0: not known).
    pub op: u32,
}

impl Failure {
    pub(crate) const fn new(kind: ErrorKind) -> Self {
        Failure {
            kind,
            peer: ibgda_abi::NONE,
            qp: ibgda_abi::NONE,
            detail: 0,
            address: 0,
            size: 0,
            expected: 0,
            observed: 0,
            elapsed_ns: 0,
            op: 0,
        }
    }
}

/// Writes `f` into the record at `record` (if no error was recorded before) and traps.
///
/// `record` is the `DeviceState::error` pointer; 0 means "no record", and the thread only traps.
#[inline(always)]
pub(crate) fn report(record: u64, pe: u32, f: Failure) -> ! {
    // Scalars, not the struct: a struct argument to a non-inlined function would give every
    // kernel a local-memory stack frame.
    report_fields(
        record,
        pe,
        f.kind as u32,
        f.peer,
        f.qp,
        f.detail,
        f.address,
        f.size,
        f.expected,
        f.observed,
        f.elapsed_ns,
        f.op,
    )
}

#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn report_fields(
    record: u64,
    pe: u32,
    kind: u32,
    peer: u32,
    qp: u32,
    detail: u32,
    address: u64,
    size: u64,
    expected: u64,
    observed: u64,
    elapsed_ns: u64,
    op: u32,
) -> ! {
    let rec = record as *mut ErrorRecord;
    if !rec.is_null() {
        // SAFETY: the host points `error` at a live, host-mapped ErrorRecord for the kernel's
        // lifetime, whose `claim` (set before any kernel ran) is 0 or a live u32 in device
        // memory; the one thread that wins the claim writes the fields with system-scope stores.
        unsafe {
            let claim = core::ptr::read_volatile(core::ptr::addr_of!((*rec).claim)) as *mut u32;
            if !claim.is_null() && arch::atomic_cas_acq_rel_sys_u32(claim, 0, 1) == 0 {
                let state = core::ptr::addr_of_mut!((*rec).state);
                arch::store_relaxed_sys_u32(state, error_state::CLAIMED);
                macro_rules! put32 {
                    ($f:ident, $v:expr) => {
                        arch::store_relaxed_sys_u32(core::ptr::addr_of_mut!((*rec).$f), $v)
                    };
                }
                macro_rules! put64 {
                    ($f:ident, $v:expr) => {
                        arch::store_relaxed_sys_u64(core::ptr::addr_of_mut!((*rec).$f), $v)
                    };
                }
                put32!(kind, kind);
                put32!(pe, pe);
                put32!(peer, peer);
                put32!(qp, qp);
                put32!(detail, detail);
                put64!(address, address);
                put64!(size, size);
                put64!(expected, expected);
                put64!(observed, observed);
                put64!(elapsed_ns, elapsed_ns);
                put32!(op, op);
                put32!(block, arch::block_idx_x());
                put32!(thread, arch::thread_rank_in_block());
                arch::fence_sc_sys();
                arch::store_release_sys_u32(state, error_state::WRITTEN);
            }
        }
    }
    arch::trap()
}

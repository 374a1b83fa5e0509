//! Atomics on the emulated NIC's warp batches: a warp executes a batch's atomics after its data,
//! atomics on one word one after another in WQE order (their fetched values and compare results
//! are exactly the sequential engine's), and the suite catches the mutant that lets them race.
//! Its own test binary: the mutant switch is process-wide.

use ibgda::emu::{access, CqMode, Fabric, HostRegion};
use ibgda_abi::mlx5::{fm_ce_se, opcode};
use ibgda_device::arch::{self, Mutant};
use ibgda_device::ibgda::{wqe, AtomicOp};

const N: u16 = 32;

/// Queues a WRITE of 8 bytes (the data), then `N` compare-and-swaps on one word of the responder
/// (WQE `i` swaps `i` for `i + 1`, landing what it found in slot `i`), rings, and runs `service`
/// on the requester QP until it consumed them. Returns the word, the fetched values, the WRITE's
/// bytes and how many WQEs were executed in batches.
fn chained_compare_swaps(service: &dyn Fn(u64)) -> (u64, Vec<u64>, u64, u64) {
    chained(service, &|i| AtomicOp::compare_swap(8, i - 1, i))
}

/// [`chained_compare_swaps`] with WQE `i` (from 1) performing `op(i)`, each WQE at the WQEBB after
/// the previous one's last.
fn chained(service: &dyn Fn(u64), op_of: &dyn Fn(u64) -> AtomicOp) -> (u64, Vec<u64>, u64, u64) {
    let fabric = Fabric::new();
    let (a, b) = (fabric.open_device(), fabric.open_device());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (local, remote) = (HostRegion::zeroed(4096, 64), HostRegion::zeroed(4096, 64));
    // SAFETY: both regions outlive the fabric's use of them (dropped after the checks below).
    let (la, rb) = unsafe {
        (
            a.register(pa, local.addr(), 4096, access::LOCAL_WRITE).unwrap(),
            b.register(pb, remote.addr(), 4096, access::REMOTE_WRITE | access::REMOTE_ATOMIC)
                .unwrap(),
        )
    };
    let cq = a.create_cq(4, CqMode::Collapsed).unwrap();
    let qa = a.create_qp(pa, &cq, 7).unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    qa.to_init().unwrap();
    qa.to_rtr(qb.address()).unwrap();
    qa.to_rts().unwrap();
    qb.to_init().unwrap();
    qb.to_rtr(qa.address()).unwrap();
    // SAFETY: host memory nothing else touches yet.
    unsafe { ((local.addr() + 2048) as *mut u64).write(0x5eed) };
    let word = remote.addr() + 1024;
    let mut wqes: Vec<Vec<[u32; 4]>> = vec![vec![
        wqe::ctrl(0, opcode::RDMA_WRITE, 0, qa.qpn(), 0, 3, 0),
        wqe::raddr(remote.addr(), rb.key),
        wqe::data(8, la.key, local.addr() + 2048),
    ]];
    let mut at = 1u16;
    for i in 1..=N {
        let op = op_of(i as u64);
        let (code, m, ds) = op.encoding();
        let fm = if i == N { fm_ce_se::CQ_UPDATE } else { 0 };
        let mut segs = vec![wqe::ctrl(at, code, m, qa.qpn(), fm, ds, 0), wqe::raddr(word, rb.key)];
        let (a, b) = op.segments();
        segs.push(a);
        segs.extend(b);
        segs.push(wqe::data(8, la.key, local.addr() + 8 * i as u64));
        at += segs.len().div_ceil(4) as u16;
        wqes.push(segs);
    }
    // Each WQE's segments from its first WQEBB on (a two-WQEBB one runs into the next slot).
    let mut slot = 0u64;
    for segs in &wqes {
        for (k, s) in segs.iter().enumerate() {
            // SAFETY: slots of the 128-WQEBB send queue nothing else writes.
            unsafe { ((qa.sq() + (slot << 6) + 16 * k as u64) as *mut [u32; 4]).write(*s) };
        }
        slot += segs.len().div_ceil(4) as u64;
    }
    let n = at;
    // SAFETY: the DBR and the doorbell register are live.
    unsafe {
        ((qa.dbr() + 4) as *mut u32).write_volatile((n as u32).to_be());
        let db = ibgda_abi::mlx5::doorbell_value(n, qa.qpn());
        (qa.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
    }
    for _ in 0..64 {
        service(qa.context_addr());
        if qa.stats().unwrap().consumed >= n as u64 {
            break;
        }
    }
    let s = qa.stats().unwrap();
    assert_eq!((s.state, s.consumed), (ibgda::emu::QpState::Rts, n as u64), "{s:?}");
    assert_eq!(s.wqes_executed, N as u64 + 1, "WQEs, not WQEBBs: {s:?}");
    // SAFETY: host memory the engine no longer writes.
    unsafe {
        let fetched = (1..=N as u64)
            .map(|i| ((local.addr() + 8 * i) as *const u64).read())
            .collect();
        (
            (word as *const u64).read(),
            fetched,
            (remote.addr() as *const u64).read(),
            s.wqes_batched,
        )
    }
}

fn sequential(qp: u64) {
    // SAFETY: a live QP context that no other engine services (the fabric's engine is not
    // started).
    unsafe { ibgda_nic_emu::service_qp(qp as *mut ibgda_abi::emu::QpContext, 128) };
}

fn warp(qp: u64) {
    let failed = arch::run_block(0, 1, 32, &|| {
        // SAFETY: as in `sequential`.
        unsafe { ibgda_nic_emu::service_qp_warp(qp as *mut ibgda_abi::emu::QpContext, 128) };
    });
    assert!(failed.is_none(), "{failed:?}");
}

#[test]
fn same_word_atomics_run_in_wqe_order_in_a_batch_and_racing_ones_are_caught() {
    let want: Vec<u64> = (0..N as u64).collect();
    for (name, service) in [("sequential", &sequential as &dyn Fn(u64)), ("warp", &warp)] {
        let (word, fetched, data, batched) = chained_compare_swaps(service);
        assert_eq!(word, N as u64, "{name}: every swap found its predecessor's value");
        assert_eq!(fetched, want, "{name}: fetched in WQE order");
        assert_eq!(data, 0x5eed, "{name}: the WRITE before them landed");
        assert_eq!(batched, N as u64 + 1, "{name}: the atomics ran on the batch path");
    }
    // The mutant: one round for every lane, so the swaps on the one word race. Some attempt must
    // fail the chain (all 32 in lane order by chance, ten times over, would be a miracle).
    // SAFETY: this test binary runs nothing else; the broken runs use their own fabrics.
    unsafe { arch::set_mutant(Mutant::UnorderedAtomics, true) };
    let caught = (0..10).any(|_| {
        let (word, fetched, _, _) = chained_compare_swaps(&warp);
        word != N as u64 || fetched != want
    });
    // SAFETY: as above.
    unsafe { arch::set_mutant(Mutant::UnorderedAtomics, false) };
    assert!(caught, "the suite must catch atomics on one word that race");
}

/// The 8-byte masked compare-and-swap (`Set` signals, swaps, and, or) spans two WQEBBs; the lanes
/// find where each WQE starts, pair the halves and run them in batches, in WQE order on one word,
/// exactly as the sequential engine does.
#[test]
fn two_wqebb_swaps_run_in_batches_in_wqe_order() {
    let want: Vec<u64> = (0..N as u64).collect();
    for (name, service) in [("sequential", &sequential as &dyn Fn(u64)), ("warp", &warp)] {
        let (word, fetched, data, batched) = chained(service, &|i| AtomicOp::swap(8, i));
        assert_eq!(word, N as u64, "{name}: the last swap's value");
        assert_eq!(fetched, want, "{name}: each swap fetched its predecessor's value");
        assert_eq!(data, 0x5eed, "{name}: the WRITE before them landed");
        assert_eq!(batched, N as u64 + 1, "{name}: every WQE on the batch path");
    }
}

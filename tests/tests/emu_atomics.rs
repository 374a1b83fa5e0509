//! Atomics on the emulated NIC's warp batches: a warp executes a batch's atomics after its data,
//! atomics on one word one after another in WQE order (their fetched values and compare results
//! are exactly the sequential engine's), and the suite catches the mutant that lets them race.
//! Its own test binary, its tests one at a time: the mutant switch is process-wide.

use ibgda::emu::{access, CqMode, Device, Fabric, HostRegion, ProtectionDomain, QueuePair};
use ibgda_abi::mlx5::{fm_ce_se, opcode};
use ibgda_device::arch::{self, Mutant};
use ibgda_device::ibgda::{wqe, AtomicOp};

const N: u16 = 32;

/// The mutant switch is process-wide: the tests of this binary run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A QP of device `a` (protection domain `pa`, a send queue of `2^log_depth` WQEBBs, a collapsed
/// CQ of 16 entries) in RTS, connected to a QP of device `b` (`pb`) in RTR.
fn connected(
    a: &Device,
    pa: ProtectionDomain,
    b: &Device,
    pb: ProtectionDomain,
    log_depth: u32,
) -> (QueuePair, QueuePair) {
    let qa = a
        .create_qp(pa, &a.create_cq(4, CqMode::Collapsed).unwrap(), log_depth)
        .unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    ibgda_tests::emu_harness::connect_rc(&qa, &qb);
    (qa, qb)
}

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
    let (qa, _qb) = connected(&a, pa, &b, pb, 7);
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
    let _one_at_a_time = serial();
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
    let _one_at_a_time = serial();
    let want: Vec<u64> = (0..N as u64).collect();
    for (name, service) in [("sequential", &sequential as &dyn Fn(u64)), ("warp", &warp)] {
        let (word, fetched, data, batched) = chained(service, &|i| AtomicOp::swap(8, i));
        assert_eq!(word, N as u64, "{name}: the last swap's value");
        assert_eq!(fetched, want, "{name}: each swap fetched its predecessor's value");
        assert_eq!(data, 0x5eed, "{name}: the WRITE before them landed");
        assert_eq!(batched, N as u64 + 1, "{name}: every WQE on the batch path");
    }
}

/// Writes WQE `i` of `qa` (the QP's `i`-th since its last reset, asking for a CQE): an RDMA WRITE
/// of 8 bytes from `src` (key `lkey`) to `raddr` (key `rkey`), then moves the DBR and rings the
/// doorbell, as a poster on the host would.
fn post_write8(qa: &QueuePair, i: u16, src: u64, lkey: u32, raddr: u64, rkey: u32) {
    let segs = [
        wqe::ctrl(i, opcode::RDMA_WRITE, 0, qa.qpn(), fm_ce_se::CQ_UPDATE, 3, 0),
        wqe::raddr(raddr, rkey),
        wqe::data(8, lkey, src),
    ];
    for (k, s) in segs.iter().enumerate() {
        // SAFETY: slot `i` of the send queue, which only this test writes.
        unsafe { ((qa.sq() + ((i as u64) << 6) + 16 * k as u64) as *mut [u32; 4]).write(*s) };
    }
    // SAFETY: the DBR and the doorbell register are live.
    unsafe {
        ((qa.dbr() + 4) as *mut u32).write_volatile((i as u32 + 1).to_be());
        let db = ibgda_abi::mlx5::doorbell_value(i + 1, qa.qpn());
        (qa.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
    }
}

/// The GPU engine's warps keep their QP's context between passes (`QpCache`): a pass reloads it
/// when the control plane has changed the QP. Here a QP is connected to B, used, reset and
/// reconnected to C between two cached passes; the second WRITE must land at C (a stale cache would
/// still write B), and a doorbell dropped on the cached path is recovered from the DBR.
#[test]
fn a_cached_qp_context_follows_the_control_plane() {
    let _one_at_a_time = serial();
    let fabric = Fabric::new();
    let (a, b, c) = (fabric.open_device(), fabric.open_device(), fabric.open_device());
    let (pa, pb, pc) = (a.alloc_pd(), b.alloc_pd(), c.alloc_pd());
    let src = HostRegion::filled(4096, 64, 0x77);
    let (at_b, at_c) = (HostRegion::zeroed(4096, 64), HostRegion::zeroed(4096, 64));
    // SAFETY: the regions outlive the fabric's use of them (dropped after the checks below).
    let (la, rb, rc) = unsafe {
        (
            a.register(pa, src.addr(), 4096, access::LOCAL_WRITE).unwrap(),
            b.register(pb, at_b.addr(), 4096, access::REMOTE_WRITE).unwrap(),
            c.register(pc, at_c.addr(), 4096, access::REMOTE_WRITE).unwrap(),
        )
    };
    let cq = a.create_cq(4, CqMode::Collapsed).unwrap();
    let qa = a.create_qp(pa, &cq, 7).unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    let qc = c.create_qp(pc, &c.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    for (q, to) in [(&qb, qa.address()), (&qc, qa.address())] {
        q.to_init().unwrap();
        q.to_rtr(to).unwrap();
    }
    let connect = |to: ibgda::emu::QpAddress| {
        qa.to_init().unwrap();
        qa.to_rtr(to).unwrap();
        qa.to_rts().unwrap();
    };
    // WQE `i` (the QP's `i`-th since its last reset) WRITEs 8 bytes to `raddr`.
    let post = |i: u16, raddr: u64, rkey: u32| post_write8(&qa, i, src.addr(), la.key, raddr, rkey);
    let cache = std::sync::Mutex::new(ibgda_nic_emu::QpCache::new());
    let pass = || {
        let failed = arch::run_block(0, 1, 32, &|| {
            let mut guard = (arch::lane_id() == 0).then(|| cache.lock().unwrap());
            let mut spare = ibgda_nic_emu::QpCache::new();
            let c = guard.as_deref_mut().unwrap_or(&mut spare);
            // SAFETY: a live QP context no other engine services; the cache is this QP's.
            unsafe { ibgda_nic_emu::service_qp_warp_cached(qa.context_addr() as *mut _, 64, c) };
        });
        assert!(failed.is_none(), "{failed:?}");
    };
    let read = |r: &HostRegion| {
        // SAFETY: host memory no engine is writing (the passes have returned).
        unsafe { (r.addr() as *const u64).read_volatile() }
    };
    connect(qb.address());
    post(0, at_b.addr(), rb.key);
    pass();
    assert_eq!(
        (read(&at_b), read(&at_c)),
        (0x7777_7777_7777_7777, 0),
        "first WRITE at B"
    );
    // A dropped doorbell on the cached path: the DBR is read once the QP was idle long enough.
    a.set_dbr_recovery(std::time::Duration::from_millis(1)).unwrap();
    qa.drop_next_doorbells(1).unwrap();
    // SAFETY: host memory nothing else writes now.
    unsafe { (at_b.addr() as *mut u64).write_volatile(0) };
    post(1, at_b.addr(), rb.key);
    let t = std::time::Instant::now();
    while read(&at_b) == 0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the DBR was never read"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        pass();
    }
    assert_eq!(qa.stats().unwrap().doorbells_recovered, 1);
    // Reset and reconnect to C between passes: the next pass must reload the context.
    qa.reset().unwrap();
    connect(qc.address());
    post(0, at_c.addr(), rc.key);
    pass();
    assert_eq!(
        read(&at_c),
        0x7777_7777_7777_7777,
        "after the reconnect the WRITE lands at C"
    );
    assert_eq!(qa.stats().unwrap().state, ibgda::emu::QpState::Rts);
}

/// The GPU engine's warps keep the key checks of their batch path from one pass to the next for a
/// lease (`DeviceContext::key_lease_ns`), so a lone WQE does not read the responder's region
/// entry and QP state over NVLink on every pass. Withdrawing either waits that lease out:
/// `deregister` (a WRITE posted after it returned fails with a remote access error), and the
/// responder leaving RTR/RTS through `to_error` or `reset` (the WRITE's retries run out), although
/// lane 0 checked both one pass before. With the mutant that keeps checks past their lease the
/// same WRITE lands, which shows the checks really are kept and that the lease is what ends them.
#[test]
fn withdrawn_keys_and_responders_fail_once_the_call_returns_though_a_warp_kept_its_check() {
    use ibgda_abi::mlx5::syndrome::{REMOTE_ACCESS_ERR, TRANSPORT_RETRY_EXC_ERR};
    use std::time::{Duration, Instant};
    let _one_at_a_time = serial();
    let lease = Duration::from_millis(300);
    for withdraw in ["deregister", "to_error", "reset"] {
        for endless in [false, true] {
            let fabric = Fabric::new();
            let (a, b) = (fabric.open_device(), fabric.open_device());
            a.set_key_lease(lease).unwrap();
            b.set_key_lease(lease).unwrap();
            let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
            let src = HostRegion::filled(4096, 64, 0x5a);
            let dst = HostRegion::zeroed(4096, 64);
            // SAFETY: the regions outlive the fabric's use of them (dropped after the checks below).
            let (la, rb) = unsafe {
                (
                    a.register(pa, src.addr(), 4096, access::LOCAL_WRITE).unwrap(),
                    b.register(pb, dst.addr(), 4096, access::REMOTE_WRITE).unwrap(),
                )
            };
            let (qa, qb) = connected(&a, pa, &b, pb, 6);
            // WQE `i` WRITEs 8 bytes to `dst + 8 i` with key `rkey`.
            let post = |i: u16, rkey: u32| post_write8(&qa, i, src.addr(), la.key, dst.addr() + 8 * i as u64, rkey);
            // One warp of 32 lanes, each keeping its own cache from pass to pass (as the engine's
            // warps do in registers).
            let caches: Vec<std::sync::Mutex<ibgda_nic_emu::QpCache>> = (0..32)
                .map(|_| std::sync::Mutex::new(ibgda_nic_emu::QpCache::new()))
                .collect();
            let pass = || {
                let failed = arch::run_block(0, 1, 32, &|| {
                    let mut c = caches[arch::lane_id() as usize].lock().unwrap();
                    // SAFETY: a live QP context no other engine services; each lane's cache is
                    // its own and this QP's.
                    unsafe { ibgda_nic_emu::service_qp_warp_cached(qa.context_addr() as *mut _, 64, &mut c) };
                });
                assert!(failed.is_none(), "{failed:?}");
            };
            let word = |i: u64| {
                // SAFETY: host memory no engine is writing (the passes have returned).
                unsafe { (dst.addr() as *const u64).add(i as usize).read_volatile() }
            };
            post(0, rb.key);
            pass();
            assert_eq!(word(0), 0x5a5a_5a5a_5a5a_5a5a, "{withdraw}: the first WRITE lands");
            let t = Instant::now();
            let want = match withdraw {
                "deregister" => {
                    b.deregister(rb).unwrap();
                    REMOTE_ACCESS_ERR
                }
                "to_error" => {
                    qb.to_error().unwrap();
                    TRANSPORT_RETRY_EXC_ERR
                }
                _ => {
                    qb.reset().unwrap();
                    TRANSPORT_RETRY_EXC_ERR
                }
            };
            assert!(
                t.elapsed() >= lease,
                "{withdraw} returned after {:?}, within the lease",
                t.elapsed()
            );
            // SAFETY: no engine pass is running (the switch is read by the engine's lanes).
            unsafe { arch::set_mutant(Mutant::EndlessKeyLease, endless) };
            post(1, rb.key);
            pass();
            // SAFETY: as above.
            unsafe { arch::set_mutant(Mutant::EndlessKeyLease, false) };
            let s = qa.stats().unwrap();
            if endless {
                assert_eq!(
                    word(1),
                    0x5a5a_5a5a_5a5a_5a5a,
                    "{withdraw}: the mutant keeps the check: the WRITE lands"
                );
                assert_eq!(s.state, ibgda::emu::QpState::Rts);
            } else {
                assert_eq!(word(1), 0, "{withdraw}: a WRITE after the withdrawal must not land");
                assert_eq!(
                    (s.state, s.error_syndrome),
                    (ibgda::emu::QpState::Err, want),
                    "{withdraw}: {s:?}"
                );
            }
        }
    }
}

//! The emulated device's lane-parallel path (what the GPU engine runs, here on warps of CPU
//! threads): whole random WQE streams (WRITEs, inline WRITEs, READs and atomics at overlapping
//! addresses, with bad keys among them) executed by a 32-lane warp and by the CPU engine's one
//! thread must leave byte-identical memory, the same QP state and syndrome, the same counts and
//! the same CQEs (grouped retirements and owner-bit CQs included); large copies shared with idle
//! warps land exactly; the rate model paces and books the warp's batches. The lanes' batch
//! decision alone is `emu_batch_rules.rs`.

use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::ibgda::{AtomicOp, Qp, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// One WQE of a random stream, by heap offsets (the same in both harnesses).
#[derive(Clone, Copy, Debug)]
enum Op {
    Write { src: u64, dst: u64, len: u32 },
    Inline { dst: u64, len: u32, seed: u8 },
    Read { dst: u64, src: u64, len: u32 },
    Add { result: u64, target: u64, add: u64 },
    BadKey { dst: u64 },
}

const HEAP: usize = 128 << 10;

fn random_stream(seed: u64, n: usize, bad: bool) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ops = Vec::new();
    // Destinations in a 2 KiB window of the peer's heap, so WRITEs overlap each other and READs
    // read what earlier WRITEs wrote; sources in PE 0's first 32 KiB.
    let dst = |rng: &mut rand::rngs::StdRng, len: u32| 40_000 + rng.random_range(0..2048 - len as u64);
    for i in 0..n {
        let op = match rng.random_range(0..20) {
            0..=9 => {
                let len = if rng.random_range(0..8) == 0 {
                    rng.random_range(257..1500)
                } else {
                    rng.random_range(1..64)
                };
                Op::Write {
                    src: rng.random_range(0..30_000),
                    dst: dst(&mut rng, len),
                    len,
                }
            }
            10..=14 => {
                let len = rng.random_range(1..=28);
                Op::Inline {
                    dst: dst(&mut rng, len),
                    len,
                    seed: rng.random(),
                }
            }
            15..=17 => {
                let len = rng.random_range(1..600);
                Op::Read {
                    dst: 32_768 + rng.random_range(0..8_000),
                    src: dst(&mut rng, len),
                    len,
                }
            }
            _ => {
                let target = 40_000 + 8 * rng.random_range(0..256);
                // Half land their result where a non-fetching atomic's does: a dummy slot picked
                // by the target word (`dummy_landing_slot`), shared by atomics on one word and,
                // 32 slots for 256 words, by some on different words.
                let result = if rng.random_range(0..2) == 0 {
                    56_000 + 8 * ibgda_abi::ibgda::dummy_landing_slot(0, target)
                } else {
                    48_000 + 8 * rng.random_range(0..64)
                };
                Op::Add {
                    result,
                    target,
                    add: rng.random(),
                }
            }
        };
        ops.push(op);
        if bad && i == n * 2 / 3 {
            ops.push(Op::BadKey { dst: dst(&mut rng, 8) });
        }
    }
    ops
}

/// Posts each of `rounds` to PE 0's QP to PE 1 while PE 0's device is paused, then releases them
/// and waits until the engine consumed them all; one poster for all (so the send queue wraps when
/// they add up to more than it holds).
fn run_rounds(h: &Harness, rounds: &[&[Op]]) {
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    let qp = h.qp(0, 1, 0);
    let (lkey, rkey) = (qp.heap_lkey(), qp.heap_rkey());
    // Every op is one WQEBB: the engine has drained a round when it consumed this many.
    let mut posted = nic_qp.stats().unwrap().consumed;
    for ops in rounds {
        h.ib.device(0).set_paused(true).unwrap();
        let r = h.run(0, || {
            post_ops(h, &qp, lkey, rkey, ops);
            qp.flush();
        });
        assert!(r.is_none(), "{r:?}");
        posted += ops.len() as u64;
        h.ib.device(0).set_paused(false).unwrap();
        let t = std::time::Instant::now();
        while nic_qp.stats().unwrap().consumed < posted {
            assert!(t.elapsed() < Duration::from_secs(60), "{:?}", nic_qp.stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Writes the WQEs of `ops` (every eighth and the last asking for a CQE).
fn post_ops(h: &Harness, qp: &Qp, lkey: u32, rkey: u32, ops: &[Op]) {
    for (i, op) in ops.iter().enumerate() {
        // Every eighth WQE asks for a CQE (the last one too).
        let ring = i % 8 == 7 || i + 1 == ops.len();
        match *op {
            Op::Write { src, dst, len } => {
                qp.test_rdma(Rdma::Write, h.addr(0, src), lkey, h.addr(1, dst), rkey, len, ring);
            }
            Op::Inline { dst, len, seed } => {
                let data: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(31) ^ seed).collect();
                qp.post_inline_write(h.addr(1, dst), rkey, &data, ring);
            }
            Op::Read { dst, src, len } => {
                qp.test_rdma(Rdma::Read, h.addr(0, dst), lkey, h.addr(1, src), rkey, len, ring);
            }
            Op::Add { result, target, add } => {
                qp.test_atomic(
                    AtomicOp::add(8, add),
                    h.addr(0, result),
                    lkey,
                    h.addr(1, target),
                    rkey,
                    ring,
                );
            }
            Op::BadKey { dst } => {
                qp.test_rdma(Rdma::Write, h.addr(0, 0), lkey, h.addr(1, dst), rkey ^ 0x100, 8, ring);
            }
        }
    }
}

fn harness() -> Harness {
    let h = Harness::new(
        2,
        HEAP,
        IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 9,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(30),
    );
    let data = ibgda_tests::random_bytes(77, 32_768);
    h.write(0, 0, &data);
    h.write(1, 40_000, &ibgda_tests::random_bytes(78, 2_048));
    h
}

/// Runs the GPU engine's kernel body on one block of `lanes` CPU threads while `body` runs;
/// returns the engine's scratch (tally and copy-job board) afterwards.
fn warp_engine(h: &Harness, lanes: u32, body: impl FnOnce()) -> Vec<u8> {
    use ibgda_abi::emu::{EngineControl, EngineTally};
    h.ib.fabric.stop_engine();
    let qps: Vec<u64> = (0..2)
        .map(|pe| h.ib.qp(pe, 1 - pe, 0).unwrap().context_addr())
        .collect();
    let mut control = Box::new(EngineControl::default());
    let scratch = ibgda::emu::HostRegion::zeroed(ibgda_abi::emu::engine_scratch_bytes(lanes.div_ceil(32)), 64);
    let (ctl, tly, table) = (
        &mut *control as *mut EngineControl as usize,
        scratch.addr() as usize,
        qps.as_ptr() as usize,
    );
    // SAFETY: the control block outlives the engine thread (joined below).
    let stop =
        unsafe { AtomicU32::from_ptr((ctl as *mut u8).add(std::mem::offset_of!(EngineControl, stop)) as *mut u32) };
    std::thread::scope(|s| {
        let engine = s.spawn(move || {
            ibgda_device::arch::run_block(0, 1, lanes, &|| {
                // SAFETY: the QP table, control block and tally outlive the block; the CPU engine
                // is stopped, so this is the only engine.
                unsafe {
                    ibgda_nic_emu::run_engine(
                        table as *const u64,
                        2,
                        ctl as *mut EngineControl,
                        tly as *mut EngineTally,
                    )
                }
            })
        });
        body();
        stop.store(1, Ordering::Release);
        assert!(engine.join().unwrap().is_none());
    });
    // SAFETY: the engine has stopped; the region is live.
    unsafe { std::slice::from_raw_parts(scratch.as_ptr::<u8>(), scratch.len()).to_vec() }
}

/// The CQE buffer of PE 0's QP to PE 1 (the whole CQ, timestamps zeroed).
fn cqes(h: &Harness) -> Vec<u8> {
    let region = h.ib.qp(0, 1, 0).unwrap().cq_region();
    let mut b = vec![0u8; region.len()];
    region.read_bytes(0, &mut b).unwrap();
    cqes_of_bytes(b)
}

fn same_outcome(seed: u64, n: usize, bad: bool) {
    same_outcome_of(&format!("seed {seed}"), &random_stream(seed, n, bad));
}

/// Runs `ops` on the sequential engine and on a warp; asserts the same QP state, heaps and CQEs;
/// returns the warp's QP statistics.
fn same_outcome_of(seed: &str, ops: &[Op]) -> ibgda::emu::QpStats {
    same_outcome_of_rounds(seed, &[ops], false)
}

/// [`same_outcome_of`] with the streams of `rounds` posted and drained one after another.
/// `remote_sq` marks the warp's send queue as one it reads over a bus, so its batches take the
/// coalesced WQEBB loads (`load_batch_words`) that host-memory queues get on a GPU.
fn same_outcome_of_rounds(seed: &str, rounds: &[&[Op]], remote_sq: bool) -> ibgda::emu::QpStats {
    let sequential = harness();
    run_rounds(&sequential, rounds);
    let lanes = harness();
    if remote_sq {
        let ctx = lanes.ib.qp(0, 1, 0).unwrap().context_addr();
        let field = ctx + std::mem::offset_of!(ibgda_abi::emu::QpContext, model_fetch) as u64;
        // SAFETY: the QP context is live host memory; no engine runs yet.
        unsafe { (field as *mut u32).write_volatile(0) };
    }
    warp_engine(&lanes, 32, || run_rounds(&lanes, rounds));
    let (a, b) = (
        sequential.ib.qp(0, 1, 0).unwrap().stats().unwrap(),
        lanes.ib.qp(0, 1, 0).unwrap().stats().unwrap(),
    );
    assert_eq!(
        (a.state, a.error_syndrome, a.consumed, a.wqes_executed),
        (b.state, b.error_syndrome, b.consumed, b.wqes_executed),
        "{seed}: {a:?} vs {b:?}"
    );
    assert!(b.wqes_batched > 0, "{seed}: the warp batched nothing: {b:?}");
    for pe in 0..2 {
        assert!(
            sequential.read(pe, 0, HEAP) == lanes.read(pe, 0, HEAP),
            "{seed}: PE {pe}'s heap differs"
        );
    }
    assert!(cqes(&sequential) == cqes(&lanes), "{seed}: the CQEs differ");
    b
}

/// Long runs of small WRITEs (what `p` and `put_nbi` traffic is) retire in groups: consecutive
/// warp batches share one fence, the latest requested CQE on the collapsed CQ and one consumer
/// index store, and the outcome is exactly the sequential engine's, with an atomic, an inline
/// WRITE every fifth WQE and WRITEs that overwrite earlier ones among them.
#[test]
fn consecutive_batches_retire_together_exactly_as_the_sequential_engine() {
    let ops: Vec<Op> = (0..400u64)
        .map(|i| match i {
            150 => Op::Add {
                result: 48_000,
                target: 40_000 + 8 * 3,
                add: 7,
            },
            _ if i % 5 == 0 => Op::Inline {
                dst: 40_000 + 8 * (i % 256),
                len: 8,
                seed: i as u8,
            },
            // Slots repeat every 256 WQEs: later batches overwrite what earlier ones wrote.
            _ => Op::Write {
                src: (i * 24) % 30_000,
                dst: 40_000 + 8 * (i % 256),
                len: 8,
            },
        })
        .collect();
    let s = same_outcome_of("grouped", &ops);
    assert_eq!(s.wqes_batched, 400, "every WQE in batches, the atomic too: {s:?}");
    assert!(
        s.batches >= 13 && s.retirements < s.batches,
        "consecutive batches shared retirements: {s:?}"
    );
    // Three rounds from one poster: the third's batches straddle the end of the 512-WQEBB ring,
    // which the warp's coalesced WQEBB loads wrap around.
    for remote_sq in [false, true] {
        let w = same_outcome_of_rounds("grouped, wrapping", &[&ops, &ops[..300], &ops], remote_sq);
        assert_eq!(w.consumed, 1100);
        assert_eq!(w.wqes_batched, 1100, "every WQE in batches, the atomics too: {w:?}");
    }
    // WRITEs the whole warp copies (over 256 bytes) end a group after their batch: the fence is
    // cheap against them, and grouping would hold their completions back.
    let large: Vec<Op> = (0..96u64)
        .map(|i| Op::Write {
            src: (i * 304) % 29_000,
            dst: 40_000 + 304 * i,
            len: 300,
        })
        .collect();
    let l = same_outcome_of("large copies", &large);
    assert_eq!(
        (l.wqes_batched, l.batches, l.retirements),
        (96, 3, 3),
        "each batch of large WRITEs retired alone: {l:?}"
    );
}

#[test]
fn a_warp_executes_random_streams_exactly_as_the_sequential_engine() {
    for seed in 0..2 {
        same_outcome(seed, 120, false);
    }
}

#[test]
fn a_warp_stops_at_a_bad_key_exactly_where_the_sequential_engine_does() {
    same_outcome(11, 90, true);
}

/// One requester QP with an owner-bit CQ of `2^cq_log` entries and `n` signalled one-WQEBB WRITEs
/// (gathered, to distinct places) in its send queue, doorbell rung; `service` (a pass of at most
/// 12 WQEs) runs until the queue is consumed or the QP failed; when `poll`, the CQ is polled as
/// rdma-core does between passes (valid when the owner bit matches the lap), so it wraps. Returns
/// every CQE polled (then the CQ buffer and the data), and the QP's end state.
fn owner_bit_run(cq_log: u32, n: u16, poll: bool, service: &dyn Fn(u64)) -> (Vec<u8>, String) {
    use ibgda::emu::{access, CqMode, Fabric, HostRegion};
    use ibgda_abi::mlx5::{fm_ce_se, opcode, wqe_ds};
    use ibgda_device::ibgda::wqe;
    let fabric = Fabric::new();
    let (a, b) = (fabric.open_device(), fabric.open_device());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (src, dst) = (HostRegion::filled(4096, 64, 0xab), HostRegion::zeroed(4096, 64));
    // SAFETY: both regions outlive the fabric's use of them (dropped after the checks below).
    let (la, rb) = unsafe {
        (
            a.register(pa, src.addr(), 4096, access::LOCAL_WRITE).unwrap(),
            b.register(pb, dst.addr(), 4096, access::REMOTE_WRITE).unwrap(),
        )
    };
    let cq = a.create_cq(cq_log, CqMode::OwnerBit).unwrap();
    let qa = a.create_qp(pa, &cq, 7).unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    ibgda_tests::emu_harness::connect_rc(&qa, &qb);
    for i in 0..n {
        let segs = [
            wqe::ctrl(i, opcode::RDMA_WRITE, 0, qa.qpn(), fm_ce_se::CQ_UPDATE, wqe_ds::RDMA, 0),
            wqe::raddr(dst.addr() + 16 * i as u64, rb.key),
            wqe::data(8 + i as u32 % 8, la.key, src.addr() + 16 * i as u64),
        ];
        for (k, s) in segs.iter().enumerate() {
            // SAFETY: slot `i` of the 128-WQEBB send queue, nothing else writes it.
            unsafe { ((qa.sq() + ((i as u64) << 6) + 16 * k as u64) as *mut [u32; 4]).write(*s) };
        }
    }
    // SAFETY: the DBR and the doorbell register are live.
    unsafe {
        ((qa.dbr() + 4) as *mut u32).write_volatile((n as u32).to_be());
        let db = ibgda_abi::mlx5::doorbell_value(n, qa.qpn());
        (qa.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
    }
    let mut polled = Vec::new();
    let mut ci = 0u32;
    for _ in 0..64 {
        service(qa.context_addr());
        if poll {
            loop {
                let at = cq.buffer() + ((ci & ((1 << cq_log) - 1)) as u64) * 64;
                // SAFETY: a live CQE of the CQ's buffer.
                let cqe = unsafe { std::slice::from_raw_parts(at as *const u8, 64) }.to_vec();
                if (cqe[63] & 1) as u32 != (ci >> cq_log) & 1 || cqe[63] >> 4 == 0xf {
                    break;
                }
                polled.extend(cqes_of_bytes(cqe));
                ci += 1;
                // SAFETY: the CQ's doorbell record (consumer index).
                unsafe { (cq.dbr() as *mut u32).write_volatile(ci.to_be()) };
            }
        }
        let s = qa.stats().unwrap();
        if s.consumed >= n as u64 || s.state != ibgda::emu::QpState::Rts {
            break;
        }
    }
    let mut b = vec![0u8; cq.buffer_region().len()];
    cq.buffer_region().read_bytes(0, &mut b).unwrap();
    polled.extend(cqes_of_bytes(b));
    // SAFETY: host memory the engine no longer writes.
    polled.extend(unsafe { std::slice::from_raw_parts(dst.as_ptr::<u8>(), 4096) });
    let s = qa.stats().unwrap();
    (
        polled,
        format!(
            "{:?} consumed {} overrun {} polled {ci}",
            s.state,
            s.consumed,
            cq.overrun().unwrap()
        ),
    )
}

/// CQE bytes with the success CQEs' timestamps zeroed.
fn cqes_of_bytes(mut b: Vec<u8>) -> Vec<u8> {
    for cqe in b.chunks_mut(64) {
        if cqe[63] >> 4 == ibgda_abi::mlx5::cqe_opcode::REQ {
            cqe[48..56].fill(0);
        }
    }
    b
}

fn sequential(qp: u64) {
    // SAFETY: a live QP context that no other engine services (the fabric's engine is not
    // started).
    unsafe { ibgda_nic_emu::service_qp(qp as *mut ibgda_abi::emu::QpContext, 12) };
}

fn warp(qp: u64) {
    let failed = ibgda_device::arch::run_block(0, 1, 32, &|| {
        // SAFETY: as in `sequential`.
        unsafe { ibgda_nic_emu::service_qp_warp(qp as *mut ibgda_abi::emu::QpContext, 12) };
    });
    assert!(failed.is_none(), "{failed:?}");
}

#[test]
fn a_warp_fills_an_owner_bit_cq_and_overruns_it_exactly_as_the_sequential_engine() {
    // 100 CQEs through a CQ of 16 polled between passes (six laps of owner bits, written by the
    // lanes in batches); 40 into 64 entries unpolled; 40 into 16 unpolled: the batch stops where
    // the CQ is full and the WQE whose CQE finds no room overruns it.
    for (cq_log, n, poll) in [(4, 100, true), (6, 40, false), (4, 40, false)] {
        let (want, want_state) = owner_bit_run(cq_log, n, poll, &sequential);
        let (got, got_state) = owner_bit_run(cq_log, n, poll, &warp);
        assert_eq!(want_state, got_state, "CQ of 2^{cq_log}, {n} WQEs");
        assert!(want == got, "CQ of 2^{cq_log}, {n} WQEs: the CQEs or the data differ");
    }
}

/// Large copies are shared: the warp servicing the QP publishes a WRITE of 64 KiB (a batch's copies
/// are shared from 64 KiB) on its job board, an idle warp may take chunks, and the bytes land
/// exactly, and so does a READ of 10 KiB after it.
#[test]
fn large_copies_are_shared_with_idle_warps_and_land_exactly() {
    let h = harness();
    let data = ibgda_tests::random_bytes(91, 64 << 10);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    // Three warps: one per QP and a spare.
    let scratch = warp_engine(&h, 96, || {
        let r = h.run(0, || {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 8 << 10),
                qp.heap_rkey(),
                64 << 10,
                false,
            );
            let end = qp.test_rdma(
                Rdma::Read,
                h.addr(0, 68 << 10),
                qp.heap_lkey(),
                h.addr(1, 8 << 10),
                qp.heap_rkey(),
                10 << 10,
                true,
            );
            qp.wait(end);
            qp.quiet();
        });
        assert!(r.is_none(), "{r:?}");
    });
    assert!(h.read(1, 8 << 10, 64 << 10) == data, "the shared WRITE");
    assert!(h.read(0, 68 << 10, 10 << 10) == data[..10 << 10], "the READ after it");
    // Warp 0 services PE 0's QP: its slot shows one published job (generation 1) of 4 chunks of
    // 16 KiB, every one claimed (a claim is a fetch-and-add, so late tries count past the end).
    let job = warp0_job(&scratch);
    assert_eq!((job.generation, job.chunks), (1, 4), "{job:?}");
    assert!(job.claims >= 4, "every chunk claimed: {job:?}");
}

/// Below 64 KiB a batch's copies are not shared: a 48 KiB WRITE is copied by the warp servicing
/// its QP alone (its job slot stays unpublished: a low-latency MoE batch of a few rows lost more
/// to the claims and helpers than it gained), and every byte lands.
#[test]
fn a_copy_below_the_sharing_threshold_stays_with_its_warp() {
    let h = harness();
    let data = ibgda_tests::random_bytes(92, 48 << 10);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let scratch = warp_engine(&h, 96, || {
        let r = h.run(0, || {
            let end = qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 8 << 10),
                qp.heap_rkey(),
                48 << 10,
                true,
            );
            qp.wait(end);
        });
        assert!(r.is_none(), "{r:?}");
    });
    assert!(h.read(1, 8 << 10, 48 << 10) == data, "the WRITE");
    let job = warp0_job(&scratch);
    assert_eq!((job.generation, job.chunks), (0, 0), "{job:?}");
}

/// A batch of large WRITEs is shared as one job: four 20 KiB WRITEs queued while the device is
/// paused run as one warp batch whose copies (two chunks each: 16 KiB and 4 KiB) the board offers
/// to the idle warp; every byte lands.
#[test]
fn a_batch_of_large_writes_is_shared_as_one_job() {
    let h = harness();
    let data = ibgda_tests::random_bytes(93, 80 << 10);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let scratch = warp_engine(&h, 96, || {
        h.ib.device(0).set_paused(true).unwrap();
        let r = h.run(0, || {
            for i in 0..4u64 {
                let off = i * 20480;
                qp.test_rdma(
                    Rdma::Write,
                    h.addr(0, off),
                    qp.heap_lkey(),
                    h.addr(1, 8192 + off),
                    qp.heap_rkey(),
                    20480,
                    i == 3,
                );
            }
            qp.flush();
        });
        assert!(r.is_none(), "{r:?}");
        h.ib.device(0).set_paused(false).unwrap();
        assert!(h.run(0, || qp.quiet()).is_none());
    });
    assert!(h.read(1, 8192, 80 << 10) == data, "the shared batch's bytes");
    let job = warp0_job(&scratch);
    assert_eq!(
        (job.generation, job.chunks, job.entries),
        (1, 8, 4),
        "one job of four copies, two chunks each: {job:?}"
    );
    assert!(job.claims >= 8, "every chunk claimed: {job:?}");
}

/// Warp 0's slot of the engine's job board (after the tally, the first 64 bytes of the scratch).
#[derive(Debug)]
struct BoardJob {
    generation: u64,
    chunks: u64,
    /// Chunk claims made, every fetch-and-add counted (late ones run past `chunks`).
    claims: u64,
    entries: u32,
}

fn warp0_job(scratch: &[u8]) -> BoardJob {
    use ibgda_abi::emu::CopyJob;
    use std::mem::offset_of;
    let slot = &scratch[64..64 + std::mem::size_of::<CopyJob>()];
    let word = |at: usize, n: usize| slot[at..at + n].iter().rev().fold(0u64, |v, &b| v << 8 | b as u64);
    let ticket = word(offset_of!(CopyJob, ticket), 8);
    BoardJob {
        generation: ticket >> 48,
        chunks: (ticket >> 24) & 0xff_ffff,
        claims: ticket & 0xff_ffff,
        entries: word(offset_of!(CopyJob, entries), 4) as u32,
    }
}

/// The rate model on the warp path (what the GPU engine runs): a batch pays one message slot per
/// WQE, as the same WQEs would one at a time, and the batches of one pass queue on the port
/// behind one latency, as a NIC pipelines a QP's messages. 64 inline WRITEs at 1,000 messages/s
/// and 500 ms one way take at least 64 + 500 ms, under the 1,064 ms that a latency per batch
/// would take at the fewest batches (the bound, 1,000 ms, leaves 436 ms for a warp of 32 CPU
/// threads on a small, busy machine), and run in warp batches.
#[test]
fn the_warp_path_paces_batches_with_the_rate_model() {
    use ibgda::emu::RateModel;
    let h = harness();
    h.ib.device(0)
        .set_rate_model(Some(RateModel {
            link_gbps: 1.0e6,
            msg_rate_mps: 0.001,
            latency_ns: 500_000_000,
            wqe_fetch_ns: 0,
            max_rd_atomic: 0,
        }))
        .unwrap();
    let qp = h.qp(0, 1, 0);
    let mut took = Duration::ZERO;
    warp_engine(&h, 32, || {
        h.ib.device(0).set_paused(true).unwrap();
        let r = h.run(0, || {
            for i in 0..64u64 {
                qp.post_inline_write(h.addr(1, 8 * i), qp.heap_rkey(), &i.to_le_bytes(), false);
            }
            qp.flush();
        });
        assert!(r.is_none(), "{r:?}");
        let t = std::time::Instant::now();
        h.ib.device(0).set_paused(false).unwrap();
        assert!(h.run(0, || qp.quiet()).is_none());
        took = t.elapsed();
    });
    for i in 0..64u64 {
        assert_eq!(h.read(1, 8 * i, 8), i.to_le_bytes());
    }
    let s = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert!(s.batches > 0 && s.batches < 64, "the WRITEs ran in warp batches: {s:?}");
    assert!(
        took >= Duration::from_millis(564),
        "{took:?} for 64 messages at 1 ms each plus 500 ms"
    );
    assert!(
        took < Duration::from_millis(1_000),
        "{took:?}: the batches waited a latency each ({s:?})"
    );
    assert!(h.ib.device(0).model_stats().unwrap().wqes >= 64);
}

/// Under the rate model a warp's batches book what they send on the requester's transmitter and
/// what comes back (READ data) on its own receiver, summed over the batch's lanes: WRITEs book
/// only the transmitter, READs the receiver for every byte they fetch. On full warps and on the
/// narrower warps the CPU emulation may run.
#[test]
fn a_warps_batches_book_the_reads_responses_on_the_receiver() {
    for lanes in [32, 8] {
        book_reads_and_writes(lanes);
    }
}

fn book_reads_and_writes(lanes: u32) {
    let h = harness();
    // 100 Gb/s: 80 ps a byte; message slots of 1 ps and no latency, so the bytes are what is booked.
    h.ib.device(0)
        .set_rate_model(Some(ibgda::emu::RateModel {
            link_gbps: 100.0,
            msg_rate_mps: 1.0e6,
            latency_ns: 0,
            wqe_fetch_ns: 0,
            max_rd_atomic: 0,
        }))
        .unwrap();
    let writes: Vec<Op> = (0..8u64)
        .map(|i| Op::Write {
            src: i * 512,
            dst: 8192 + i * 512,
            len: 512,
        })
        .collect();
    warp_engine(&h, lanes, || run_rounds(&h, &[&writes]));
    let w = h.ib.device(0).model_stats().unwrap();
    // The port clocks count from the model's epoch (an idle port is first raised to the batch's
    // fetch time), so only lower bounds are asserted.
    assert!(w.tx_booked_ps >= 8 * 512 * 80, "{lanes} lanes: {w:?}");
    assert_eq!(w.rx_booked_ps, 0, "{lanes} lanes: WRITEs bring nothing back: {w:?}");
    let reads: Vec<Op> = (0..8u64)
        .map(|i| Op::Read {
            dst: 16_384 + i * 512,
            src: 40_000 + i * 128,
            len: 128,
        })
        .collect();
    warp_engine(&h, lanes, || run_rounds(&h, &[&reads]));
    let r = h.ib.device(0).model_stats().unwrap();
    assert!(
        r.rx_booked_ps >= 8 * 128 * 80,
        "{lanes} lanes: 8 READs of 128 B come back: {r:?}"
    );
    assert_eq!(h.read(0, 16_384, 128), h.read(1, 40_000, 128));
    let b = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert!(b.wqes_batched >= 16, "{lanes} lanes: the warp batched them: {b:?}");
}

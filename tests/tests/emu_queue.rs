//! The emulated mlx5 device's queues over their life, driven by the device-side IBGDA code on
//! CPU threads: a lost doorbell recovered through the DBR, a paused engine turning `quiet` into an
//! attributed timeout, delayed completions, the QP state machine and the owner-bit CQ, the GPU
//! engine's loop on a CPU thread, and WQEs executed in batches.

use ibgda::emu::{CqMode, Fabric, QpState};
use ibgda::Error;
use ibgda_abi::mlx5::{cqe_opcode, opcode, wqe_ds, CqeTail, CQE_TAIL_OFFSET};
use ibgda_abi::{ErrorKind, WaitKind};
use ibgda_device::ibgda::{wqe, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use ibgda_tests::random_bytes;
use std::time::Duration;

fn harness(timeout: Duration) -> Harness {
    Harness::two_pes(4, timeout)
}

/// Send queues of 64 WQEBBs: room for two full batches.
fn deep_harness() -> Harness {
    Harness::two_pes(6, Duration::from_secs(10))
}

#[test]
fn a_dropped_doorbell_is_recovered_through_the_dbr() {
    let h = harness(Duration::from_secs(5));
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    nic_qp.drop_next_doorbells(1).unwrap();
    let data = random_bytes(7, 512);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        let end = qp.test_rdma(
            Rdma::Write,
            h.addr(0, 0),
            qp.heap_lkey(),
            h.addr(1, 1024),
            qp.heap_rkey(),
            512,
            true,
        );
        qp.wait(end);
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(h.read(1, 1024, 512), data);
    let s = nic_qp.stats().unwrap();
    assert_eq!(s.doorbells_dropped, 1, "{s:?}");
    assert!(s.doorbells_recovered >= 1, "{s:?}");
}

#[test]
fn a_paused_engine_makes_quiet_time_out_with_attribution() {
    let h = harness(Duration::from_millis(300));
    h.ib.device(0).set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let before = h.snapshot();
    let rec = h
        .run(0, || {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 0),
                qp.heap_rkey(),
                64,
                false,
            );
            qp.quiet();
        })
        .expect("quiet must time out");
    assert_eq!(ErrorKind::from_u32(rec.kind), Some(ErrorKind::Timeout));
    assert_eq!(WaitKind::from_u32(rec.detail), Some(WaitKind::Quiet));
    assert_eq!(
        (rec.pe, rec.peer, rec.qp, rec.expected, rec.observed),
        (0, 1, qp.qpn(), 1, 0)
    );
    assert!(rec.elapsed_ns >= 300_000_000);
    let msg = Error::Device(Box::new(rec)).to_string();
    for want in [
        "timeout on PE 0",
        &format!("QP {:#x}", qp.qpn()),
        "peer 1",
        "cons_idx needed 1, observed 0",
    ] {
        assert!(msg.contains(want), "`{want}` missing from: {msg}");
    }
    assert_eq!(h.snapshot(), before);
    // Resumed, the same WQE goes through.
    h.ib.device(0).set_paused(false).unwrap();
    h.clear_error(0);
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 0, 64), h.read(0, 0, 64));
}

#[test]
fn delayed_completions_still_complete_in_order() {
    let h = harness(Duration::from_secs(5));
    h.ib.device(0).set_completion_delay(Duration::from_millis(20)).unwrap();
    let qp = h.qp(0, 1, 0);
    let t = std::time::Instant::now();
    let r = h.run(0, || {
        qp.post_inline_write(h.addr(1, 0), qp.heap_rkey(), &[1, 2, 3, 4], false);
        qp.post_inline_write(h.addr(1, 4), qp.heap_rkey(), &[5, 6, 7, 8], false);
        qp.quiet();
    });
    assert!(r.is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(40),
        "two signalled WQEs, 20 ms each"
    );
    assert_eq!(h.read(1, 0, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn qp_state_machine_and_owner_bit_cq() {
    let fabric = Fabric::new();
    let (a, b) = (fabric.open_device(), fabric.open_device());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cq = a.create_cq(2, CqMode::OwnerBit).unwrap();
    let qa = a.create_qp(pa, &cq, 3).unwrap();
    let qb = b.create_qp(pb, &b.create_cq(0, CqMode::Collapsed).unwrap(), 3).unwrap();
    // Out-of-order transitions are refused and name the state.
    let e = qa.to_rts().unwrap_err().to_string();
    assert!(e.contains("Reset") && e.contains("modify_qp(RTS)"), "{e}");
    assert!(a.create_qp(pb, &cq, 3).is_err(), "a PD of another device");
    assert!(a.create_qp(pa, &cq, 16).is_err(), "deeper than 32768 WQEBBs");
    qa.to_init().unwrap();
    assert!(
        qa.to_rtr(ibgda::emu::QpAddress {
            device: 99,
            qpn: 1,
            ..Default::default()
        })
        .is_err(),
        "unknown peer"
    );
    qa.to_rtr(qb.address()).unwrap();
    qa.to_rts().unwrap();
    qb.to_init().unwrap();
    qb.to_rtr(qa.address()).unwrap();
    // Post NOPs by hand (the engine is not running; service it explicitly) and poll the owner-bit
    // CQ the way rdma-core does: valid iff opcode != INVALID and owner == (ci & size) != 0.
    let sq = qa.sq();
    let mut pi = 0u16;
    let mut seen = Vec::new();
    // Writes a signalled NOP at `pi` and moves `pi` past it.
    let post_nop = |pi: &mut u16| {
        let ctrl = wqe::ctrl(
            *pi,
            opcode::NOP,
            0,
            qa.qpn(),
            ibgda_abi::mlx5::fm_ce_se::CQ_UPDATE,
            wqe_ds::NOP,
            0,
        );
        // SAFETY: slot `pi % 8` of the QP's 8-WQEBB send queue.
        unsafe { ((sq + ((*pi as u64 & 7) << 6)) as *mut [u32; 4]).write(ctrl) };
        *pi += 1;
    };
    for round in 0..3u32 {
        for _ in 0..4 {
            post_nop(&mut pi);
        }
        // SAFETY: the DBR is live; then the doorbell register.
        unsafe {
            ((qa.dbr() + 4) as *mut u32).write_volatile((pi as u32).to_be());
            let db = ibgda_abi::mlx5::doorbell_value(pi, qa.qpn());
            (qa.doorbell() as *mut u64).write_volatile(db[0].to_raw() as u64 | (db[1].to_raw() as u64) << 32);
        }
        while fabric.service_once() > 0 {}
        for k in 0..4u32 {
            let ci = round * 4 + k;
            let cqe = cq.buffer() + ((ci & 3) as u64) * 64;
            // SAFETY: a live CQE.
            let t = CqeTail::from_raw(unsafe { ((cqe + CQE_TAIL_OFFSET as u64) as *const u64).read_volatile() });
            assert_eq!(t.opcode(), cqe_opcode::REQ);
            assert_eq!(t.op_own & 1 == 1, ci & 4 != 0, "owner bit of CQE {ci}");
            seen.push(t.wqe_counter);
        }
        // Consume: report the consumer index in the CQ doorbell record.
        // SAFETY: live CQ DBR.
        unsafe { (cq.dbr() as *mut u32).write_volatile(((round + 1) * 4).to_be()) };
    }
    assert_eq!(seen, (0..12).collect::<Vec<u16>>());
    assert!(!cq.overrun().unwrap());
    // Now 5 more without consuming: the 4-entry CQ overflows.
    for _ in 0..5 {
        post_nop(&mut pi);
    }
    // SAFETY: as above.
    unsafe { ((qa.dbr() + 4) as *mut u32).write_volatile((pi as u32).to_be()) };
    std::thread::sleep(Duration::from_millis(2)); // past the DBR-recovery interval: no doorbell this time
    while fabric.service_once() > 0 {}
    assert!(cq.overrun().unwrap());
    assert_eq!(qa.stats().unwrap().doorbells_recovered, 1);
    // The overrun is raised once as a CQ-error async event, and the QP whose completion was lost
    // is in ERR, as on a ConnectX.
    let events = a.async_events();
    assert_eq!(events, vec![ibgda::emu::AsyncEvent::CqError { cqn: cq.cqn() }]);
    assert!(events[0].to_string().contains("IBV_EVENT_CQ_ERR"), "{}", events[0]);
    assert!(a.async_events().is_empty(), "each event is raised once");
    assert!(b.async_events().is_empty(), "the other device saw nothing");
    assert_eq!(qa.state().unwrap(), QpState::Err);
    // Reset returns the QP to RESET with empty indices.
    qa.reset().unwrap();
    assert_eq!(
        (
            qa.state().unwrap(),
            qa.stats().unwrap().consumed,
            qa.stats().unwrap().posted
        ),
        (QpState::Reset, 0, 0)
    );
}

/// The GPU engine's body (`run_engine`) in place of the CPU engine thread, on one warp of one lane
/// and on two warps of 32 CPU-thread lanes (the GPU's shape, where WQEs run in warp-wide batches):
/// it executes what the device API posts, reports itself started, stops on request, and a
/// relaunch (as around a module load) starts from a zeroed tally while the host-visible WQE count
/// keeps adding up.
#[test]
fn the_gpu_engine_loop_runs_the_device_and_stops_on_request() {
    gpu_engine_loop(1);
}

#[test]
fn the_gpu_engine_loop_at_warp_width_batches_queued_writes_and_stays_exact() {
    gpu_engine_loop(64);
}

fn gpu_engine_loop(lanes: u32) {
    use ibgda_abi::emu::{EngineControl, EngineTally};
    use std::sync::atomic::{AtomicU32, Ordering};
    let h = deep_harness();
    h.ib.fabric.stop_engine();
    let qps: Vec<u64> = (0..2)
        .map(|pe| h.ib.qp(pe, 1 - pe, 0).unwrap().context_addr())
        .collect();
    let mut control = Box::new(EngineControl::default());
    let ctl = &mut *control as *mut EngineControl as usize;
    // The tally, then the engine's copy-job board (one slot per warp).
    let scratch = ibgda::emu::HostRegion::zeroed(ibgda_abi::emu::engine_scratch_bytes(lanes.div_ceil(32)), 64);
    let tly = scratch.addr() as usize;
    // SAFETY: the region is live and holds an `EngineTally` at its start.
    let tally_now = || unsafe { (tly as *const EngineTally).read_volatile() };
    let table = qps.as_ptr() as usize;
    // SAFETY (both helpers): the control block and tally are live boxes that outlive every
    // engine thread (each is joined before the next launch and before the boxes are read).
    let field = |offset: usize| unsafe { AtomicU32::from_ptr((ctl as *mut u8).add(offset) as *mut u32) };
    let launch = || {
        // What the host does before a launch: clear the flags, zero the tally.
        field(std::mem::offset_of!(EngineControl, stop)).store(0, Ordering::Release);
        field(std::mem::offset_of!(EngineControl, warps_started)).store(0, Ordering::Release);
        field(std::mem::offset_of!(EngineControl, warps_stopped)).store(0, Ordering::Release);
        unsafe {
            std::ptr::write_bytes(
                tly as *mut u8,
                0,
                ibgda_abi::emu::engine_scratch_bytes(lanes.div_ceil(32)),
            )
        };
        let engine = std::thread::spawn(move || {
            // One block of `lanes` CPU threads, every one running the kernel body.
            let failed = ibgda_device::arch::run_block(0, 1, lanes, &|| {
                // SAFETY: the QP table, control block and tally outlive the block (joined below);
                // no other engine runs (the CPU engine was stopped).
                unsafe {
                    ibgda_nic_emu::run_engine(
                        table as *const u64,
                        2,
                        ctl as *mut EngineControl,
                        tly as *mut EngineTally,
                    )
                }
            });
            assert!(failed.is_none(), "{failed:?}");
        });
        while field(std::mem::offset_of!(EngineControl, warps_started)).load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        engine
    };
    let stop = |engine: std::thread::JoinHandle<()>| {
        field(std::mem::offset_of!(EngineControl, stop)).store(1, Ordering::Release);
        engine.join().unwrap();
    };
    let engine = launch();
    let data = random_bytes(9, 10_000);
    h.write(0, 0, &data);
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        for k in 0..40u64 {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 20_000 + k * 10),
                qp.heap_rkey(),
                10_000 - k as u32 * 10,
                false,
            );
        }
        let end = qp.test_rdma(
            Rdma::Read,
            h.addr(0, 40_000),
            qp.heap_lkey(),
            h.addr(1, 20_390),
            qp.heap_rkey(),
            9_600,
            true,
        );
        qp.wait(end);
        qp.quiet();
    });
    assert!(r.is_none(), "{r:?}");
    // The last WRITE (k = 39) left data[..9610] at 20_390.
    assert_eq!(h.read(0, 40_000, 9_600), data[..9_600]);
    stop(engine);
    let warps = lanes.div_ceil(32);
    let c = *control;
    assert_eq!((c.warps_started, c.warps_stopped), (warps, warps));
    assert_eq!(c.wqes, 41, "{c:?}");
    assert!(c.passes > 0);
    let tally = tally_now();
    assert_eq!((tally.started, tally.stopped, tally.wqes), (warps, warps, 41));

    // Relaunched: five more WQEs; the tally counts this launch, the control block all of them.
    let engine = launch();
    let r = h.run(0, || {
        for k in 0..5u64 {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 0),
                qp.heap_lkey(),
                h.addr(1, 60_000 + k * 100),
                qp.heap_rkey(),
                100,
                false,
            );
        }
        qp.quiet();
    });
    assert!(r.is_none(), "{r:?}");
    assert_eq!(h.read(1, 60_400, 100), data[..100]);

    // Queued while the device is paused, then released at once: 48 small WRITEs to distinct
    // places, which a warp of 32 lanes executes in batches.
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    // The engine publishes its statistics at the end of its pass, after the completions `quiet`
    // waited for.
    let settled = |executed: u64| {
        let t = std::time::Instant::now();
        loop {
            let s = nic_qp.stats().unwrap();
            if s.wqes_executed >= executed {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{s:?}");
            std::thread::yield_now();
        }
    };
    let batched_before = {
        let s = settled(46);
        (s.wqes_batched, s.batches)
    };
    h.ib.device(0).set_paused(true).unwrap();
    let r = h.run(0, || {
        for i in 0..48u64 {
            qp.test_rdma(
                Rdma::Write,
                h.addr(0, 24 * i),
                qp.heap_lkey(),
                h.addr(1, 50_000 + 24 * i),
                qp.heap_rkey(),
                24,
                false,
            );
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    h.ib.device(0).set_paused(false).unwrap();
    let r = h.run(0, || qp.quiet());
    assert!(r.is_none(), "{r:?}: {:?}", nic_qp.stats());
    assert_eq!(h.read(1, 50_000, 24 * 48), data[..24 * 48]);
    let s = settled(94);
    let (batched, batches) = (s.wqes_batched - batched_before.0, s.batches - batched_before.1);
    assert_eq!(batched, 48, "every queued WRITE runs on the lane path: {s:?}");
    if lanes >= 32 {
        assert!(
            batches <= 4,
            "a 32-lane warp ran the 48 queued WRITEs in {batches} batches, not in a few warp-wide ones"
        );
    } else {
        assert_eq!(batches, 48, "a warp of one lane runs one WQE per batch");
    }
    stop(engine);
    let c = *control;
    assert_eq!((c.warps_started, c.warps_stopped), (warps, warps));
    assert_eq!(c.wqes, 94, "{c:?}");
    let tally = tally_now();
    assert_eq!((tally.started, tally.stopped, tally.wqes), (warps, warps, 53));
}

#[test]
fn queued_writes_run_in_batches_and_land_exactly() {
    let h = deep_harness();
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    let data = random_bytes(21, 4096);
    h.write(0, 0, &data);
    h.ib.device(0).set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let n = 48u64;
    let r = h.run(0, || {
        for i in 0..n {
            if i % 2 == 0 {
                // 24 bytes from PE 0's heap, to a distinct place on PE 1.
                qp.test_rdma(
                    Rdma::Write,
                    h.addr(0, 24 * i),
                    qp.heap_lkey(),
                    h.addr(1, 8192 + 24 * i),
                    qp.heap_rkey(),
                    24,
                    false,
                );
            } else {
                qp.post_inline_write(
                    h.addr(1, 8192 + 24 * i),
                    qp.heap_rkey(),
                    &data[24 * i as usize..24 * i as usize + 24],
                    false,
                );
            }
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    h.ib.device(0).set_paused(false).unwrap();
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 8192, 24 * n as usize), &data[..24 * n as usize]);
    let s = nic_qp.stats().unwrap();
    assert_eq!(s.wqes_executed, s.consumed, "{s:?}");
    assert!(
        s.wqes_batched >= 32 && s.batches * 4 <= s.wqes_batched,
        "the queued WRITEs went one at a time: {s:?}"
    );
}

#[test]
fn writes_to_one_word_are_never_batched_together_and_the_last_wins() {
    let h = deep_harness();
    let nic_qp = h.ib.qp(0, 1, 0).unwrap();
    h.ib.device(0).set_paused(true).unwrap();
    let qp = h.qp(0, 1, 0);
    let r = h.run(0, || {
        for v in 1u64..=20 {
            qp.post_inline_write(h.addr(1, 512), qp.heap_rkey(), &v.to_le_bytes(), false);
        }
        qp.flush();
    });
    assert!(r.is_none(), "{r:?}");
    h.ib.device(0).set_paused(false).unwrap();
    assert!(h.run(0, || qp.quiet()).is_none());
    assert_eq!(h.read(1, 512, 8), 20u64.to_le_bytes());
    let s = nic_qp.stats().unwrap();
    assert_eq!(
        (s.wqes_batched, s.batches),
        (20, 20),
        "overlapping WRITEs must execute in order, one at a time: {s:?}"
    );
}

#[test]
fn every_qp_has_exactly_one_engine_warp_and_neighbours_sit_on_different_blocks() {
    for (blocks, warps_per_block) in [(1u32, 1u32), (1, 8), (8, 8), (3, 5), (16, 8)] {
        let warps = blocks * warps_per_block;
        let n_qps = 3 * warps + 2;
        let mut served = vec![0u32; n_qps as usize];
        for b in 0..blocks {
            for w in 0..warps_per_block {
                let mut q = ibgda_nic_emu::first_qp_of(b, w, blocks);
                while q < n_qps {
                    served[q as usize] += 1;
                    q += warps;
                }
            }
        }
        assert!(served.iter().all(|&n| n == 1), "{blocks}x{warps_per_block}: {served:?}");
        // QPs 0..blocks (the first blocks' of a kernel) each on a block of its own.
        let firsts: std::collections::BTreeSet<u32> = (0..blocks)
            .flat_map(|b| (0..warps_per_block).map(move |w| (b, w)))
            .filter(|&(b, w)| ibgda_nic_emu::first_qp_of(b, w, blocks) < blocks)
            .map(|(b, _)| b)
            .collect();
        assert_eq!(firsts.len() as u32, blocks, "{blocks}x{warps_per_block}");
    }
}

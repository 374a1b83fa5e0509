//! Property test: random sequences of RDMA writes, reads, inline writes and atomics, posted by many
//! threads at once through the device-side IBGDA path to 2–4 emulated PEs over several QPs with
//! 8-WQEBB rings (so every ring wraps many times), compared byte for byte with a reference model.
//! A second test pushes one QP's 64-bit counters across the 16-bit wrap several times.
//!
//! What keeps the reference deterministic under concurrency: each writer thread owns its target
//! region in every peer's heap and its READ landing region in its own heap (one QP per thread, so
//! its WQEs execute in program order); READ sources are never written; each atomic word takes one
//! commutative operation only (add, xor, or, and).

use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::ibgda::{AtomicOp, Qp, Rdma};
use ibgda_tests::emu_harness::{Harness, RawPosts};
use ibgda_tests::random_bytes;
use proptest::prelude::*;
use std::time::Duration;

const HEAP: usize = 32 << 10;
const RO: u64 = 0; // read-only source data, 4 KiB
const RO_LEN: u64 = 4096;
const REGION: u64 = 1024; // per-thread write target / read landing region
const WRITES: u64 = 4096; // + thread * REGION: where thread `t` writes in every peer
const LANDING: u64 = 4096 + 8 * REGION; // + thread * REGION: where thread `t`'s READs land locally
const ATOMICS: u64 = LANDING + 8 * REGION; // 4 classes x 4 words
const RESULTS: u64 = ATOMICS + 256; // dummy fetch targets, one per thread
const THREADS_PER_PE: usize = 2;
const READ_SLICE: u64 = REGION / 4; // per peer, inside a thread's landing region

#[derive(Clone, Debug)]
enum Op {
    Write {
        peer: usize,
        src: u64,
        dst: u64,
        len: u64,
    },
    Read {
        peer: usize,
        src: u64,
        dst: u64,
        len: u64,
    },
    Inline {
        peer: usize,
        dst: u64,
        data: Vec<u8>,
    },
    Atomic {
        peer: usize,
        class: usize,
        word: u64,
        value: u64,
        fetch: bool,
    },
}

fn op(n_pes: usize) -> impl Strategy<Value = Op> {
    let peer = 0..n_pes;
    prop_oneof![
        (peer.clone(), 0..RO_LEN - 1, 0..REGION - 1, 1..512u64).prop_map(|(peer, src, dst, len)| {
            let len = len.min(RO_LEN - src).min(REGION - dst);
            Op::Write { peer, src, dst, len }
        }),
        // READs from different peers travel on different QPs and may land in any order, so each
        // peer gets its own quarter of the thread's landing region.
        (peer.clone(), 0..RO_LEN - 1, 0..READ_SLICE - 1, 1..200u64).prop_map(|(peer, src, dst, len)| {
            let len = len.min(RO_LEN - src).min(READ_SLICE - dst);
            Op::Read {
                peer,
                src,
                dst: peer as u64 * READ_SLICE + dst,
                len,
            }
        }),
        (
            peer.clone(),
            0..REGION - 128,
            proptest::collection::vec(any::<u8>(), 1..=128)
        )
            .prop_map(|(peer, dst, data)| Op::Inline { peer, dst, data }),
        (peer, 0..4usize, 0..4u64, any::<u64>(), any::<bool>()).prop_map(|(peer, class, word, value, fetch)| {
            Op::Atomic {
                peer,
                class,
                word,
                value,
                fetch,
            }
        }),
    ]
}

fn atomic_of(class: usize, value: u64) -> AtomicOp {
    match class {
        0 => AtomicOp::add(8, value),
        1 => AtomicOp::xor(8, value),
        2 => AtomicOp::or(8, value & 0x0101_0101_0101_0101),
        _ => AtomicOp::and(8, value | 0xfefe_fefe_fefe_fefe),
    }
}

/// Executes one thread's program through `qps[peer]` (the thread's QP to each peer; `None` for
/// itself, which it reaches by plain loads and stores, as the device API does).
fn run_program(h: &Harness, me: usize, t: usize, qps: &[Option<Qp>], program: &[Op]) {
    for op in program {
        match op {
            Op::Write { peer, src, dst, len } => {
                let (s, d) = (h.addr(me, RO + src), h.addr(*peer, WRITES + t as u64 * REGION + dst));
                match &qps[*peer] {
                    // The source is the read-only region.
                    Some(qp) => {
                        qp.test_rdma(Rdma::Write, s, qp.heap_lkey(), d, qp.heap_rkey(), *len as u32, false);
                    }
                    // SAFETY: in-heap, thread-owned region.
                    None => unsafe { std::ptr::copy(s as *const u8, d as *mut u8, *len as usize) },
                }
            }
            Op::Read { peer, src, dst, len } => {
                let (s, d) = (h.addr(*peer, RO + src), h.addr(me, LANDING + t as u64 * REGION + dst));
                match &qps[*peer] {
                    // The destination is this thread's own landing region, read after the final quiet.
                    Some(qp) => {
                        qp.test_rdma(Rdma::Read, d, qp.heap_lkey(), s, qp.heap_rkey(), *len as u32, false);
                    }
                    // SAFETY: in-heap; the source is read-only, the destination thread-owned.
                    None => unsafe { std::ptr::copy(s as *const u8, d as *mut u8, *len as usize) },
                }
            }
            Op::Inline { peer, dst, data } => {
                let d = h.addr(*peer, WRITES + t as u64 * REGION + dst);
                match &qps[*peer] {
                    Some(qp) => {
                        qp.post_inline_write(d, qp.heap_rkey(), data, false);
                    }
                    // SAFETY: in-heap, thread-owned region.
                    None => unsafe { std::ptr::copy(data.as_ptr(), d as *mut u8, data.len()) },
                }
            }
            Op::Atomic {
                peer,
                class,
                word,
                value,
                fetch,
            } => {
                let target = h.addr(*peer, ATOMICS + (*class as u64 * 4 + word) * 8);
                let a = atomic_of(*class, *value);
                match &qps[*peer] {
                    Some(qp) => {
                        // The result lands in this thread's own result word, read after the wait.
                        let end = qp.test_atomic(
                            a,
                            h.addr(me, RESULTS + 8 * t as u64),
                            qp.heap_lkey(),
                            target,
                            qp.heap_rkey(),
                            *fetch,
                        );
                        if *fetch {
                            qp.wait(end);
                        }
                    }
                    None => {
                        let w = unsafe { std::sync::atomic::AtomicU64::from_ptr(target as *mut u64) };
                        let mut old = w.load(std::sync::atomic::Ordering::Relaxed);
                        loop {
                            let new = ibgda_nic_emu::parse::apply_atomic(&a, old);
                            match w.compare_exchange(
                                old,
                                new,
                                std::sync::atomic::Ordering::AcqRel,
                                std::sync::atomic::Ordering::Relaxed,
                            ) {
                                Ok(_) => break,
                                Err(seen) => old = seen,
                            }
                        }
                    }
                }
            }
        }
    }
    qps.iter().flatten().for_each(|q| q.quiet());
}

/// The reference: what every heap must hold after every program ran.
fn model(initial: &[Vec<u8>], programs: &[Vec<Op>]) -> Vec<Vec<u8>> {
    let mut heaps = initial.to_vec();
    for (g, program) in programs.iter().enumerate() {
        let (me, t) = (g / THREADS_PER_PE, g);
        for op in program {
            match op {
                Op::Write { peer, src, dst, len } => {
                    let data = initial[me][(RO + src) as usize..][..*len as usize].to_vec();
                    let at = (WRITES + t as u64 * REGION + dst) as usize;
                    heaps[*peer][at..at + *len as usize].copy_from_slice(&data);
                }
                Op::Read { peer, src, dst, len } => {
                    let data = initial[*peer][(RO + src) as usize..][..*len as usize].to_vec();
                    let at = (LANDING + t as u64 * REGION + dst) as usize;
                    heaps[me][at..at + *len as usize].copy_from_slice(&data);
                }
                Op::Inline { peer, dst, data } => {
                    let at = (WRITES + t as u64 * REGION + dst) as usize;
                    heaps[*peer][at..at + data.len()].copy_from_slice(data);
                }
                Op::Atomic {
                    peer,
                    class,
                    word,
                    value,
                    ..
                } => {
                    let at = (ATOMICS + (*class as u64 * 4 + word) * 8) as usize;
                    let old = u64::from_le_bytes(heaps[*peer][at..at + 8].try_into().unwrap());
                    let new = ibgda_nic_emu::parse::apply_atomic(&atomic_of(*class, *value), old);
                    heaps[*peer][at..at + 8].copy_from_slice(&new.to_le_bytes());
                }
            }
        }
    }
    heaps
}

fn check(n_pes: usize, programs: Vec<Vec<Op>>) -> Result<(), TestCaseError> {
    let h = Harness::new(
        n_pes,
        HEAP,
        IbgdaOptions {
            qps_per_peer: THREADS_PER_PE as u32,
            log_depth: 3,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(20),
    );
    for pe in 0..n_pes {
        h.write(pe, 0, &random_bytes(1000 + pe as u64, HEAP));
    }
    // The fetch result slots are scratch: exclude them from the comparison by zeroing both sides.
    let initial = h.snapshot();
    std::thread::scope(|s| {
        for (g, program) in programs.iter().enumerate() {
            let h = &h;
            s.spawn(move || {
                let (me, t) = (g / THREADS_PER_PE, g);
                let qps: Vec<Option<Qp>> = (0..n_pes)
                    .map(|p| (p != me).then(|| h.qp(me, p, t % THREADS_PER_PE)))
                    .collect();
                run_program(h, me, t, &qps, program);
            });
        }
    });
    let want = model(&initial, &programs);
    let got = h.snapshot();
    for pe in 0..n_pes {
        let r = RESULTS as usize..RESULTS as usize + 64;
        let (mut a, mut b) = (got[pe].clone(), want[pe].clone());
        a[r.clone()].fill(0);
        b[r].fill(0);
        if a != b {
            let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
            return Err(TestCaseError::fail(format!(
                "PE {pe} differs from the model first at byte {first:#x}"
            )));
        }
    }
    Ok(())
}

fn programs(n_pes: usize) -> impl Strategy<Value = Vec<Vec<Op>>> {
    proptest::collection::vec(proptest::collection::vec(op(n_pes), 1..60), n_pes * THREADS_PER_PE)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_concurrent_traffic_matches_the_model(
        (n_pes, programs) in (2usize..=4).prop_flat_map(|n| (Just(n), programs(n)))
    ) {
        check(n_pes, programs)?;
    }
}

#[test]
fn counters_cross_the_16_bit_wrap() {
    // 3 threads share one 8-WQEBB QP and post 72,000 WQEs in all: the 64-bit counters pass 65536
    // and the 16-bit WQE index, DBR and doorbell values wrap.
    let h = Harness::new(
        2,
        HEAP,
        IbgdaOptions {
            qps_per_peer: 1,
            log_depth: 3,
            log_landing_slots: 2,
            ..Default::default()
        },
        Duration::from_secs(60),
    );
    let per_thread = 24_000u64;
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let h = &h;
            s.spawn(move || {
                let qp = h.qp(0, 1, 0);
                for i in 0..per_thread {
                    if i % 2 == 0 {
                        qp.post_inline_write(h.addr(1, 8 * t), qp.heap_rkey(), &i.to_le_bytes(), false);
                    } else {
                        // The results land in a scratch word nobody reads.
                        qp.test_atomic(
                            AtomicOp::add(8, 1),
                            h.addr(0, 64),
                            qp.heap_lkey(),
                            h.addr(1, 64 + 8 * t),
                            qp.heap_rkey(),
                            false,
                        );
                    }
                }
                qp.quiet();
            });
        }
    });
    let c = h.qp(0, 1, 0).counters();
    assert_eq!(
        (c.resv_head, c.ready_head, c.prod_idx(), c.cons_idx),
        (72_000, 72_000, 72_000, 72_000)
    );
    let stats = h.ib.qp(0, 1, 0).unwrap().stats().unwrap();
    assert_eq!((stats.consumed, stats.wqes_executed), (72_000, 72_000));
    for t in 0..3u64 {
        let last = u64::from_le_bytes(h.read(1, 8 * t, 8).try_into().unwrap());
        assert_eq!(last, per_thread - 2, "thread {t}'s last inline write");
        let adds = u64::from_le_bytes(h.read(1, 64 + 8 * t, 8).try_into().unwrap());
        assert_eq!(
            adds,
            0x5151_5151_5151_5151u64.wrapping_add(per_thread / 2),
            "thread {t}'s adds"
        );
    }
}

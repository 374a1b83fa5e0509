//! The emulated NIC's own capacity, with no poster in the way: RDMA WRITEs (or READs) are posted
//! to every QP toward the peer while PE 0's NIC is paused, then the NIC is resumed and its drain
//! timed from the host (median of `reps`). Used by `p2p_bench --engine-capacity` and `compare_bench
//! --engine-capacity` (the `engine_wqe_rate` and `engine_bw` rows).

use ibgda::{KernelArg, Pe, SymmetricBuffer};

/// One measured size.
#[derive(Clone, Copy, Debug)]
pub struct DrainPoint {
    /// RDMA READs (responder to requester) rather than WRITEs.
    pub read: bool,
    /// Bytes per WQE.
    pub bytes: u32,
    /// QPs toward the peer.
    pub qps: u32,
    /// WQEs posted to each QP.
    pub wqes_per_qp: u64,
    /// WQEs executed per second, in millions.
    pub wqe_rate_mops: f64,
    /// Bytes moved per second, in GB/s.
    pub gbps: f64,
    /// The engine's warps and blocks (SMs) on PE 0.
    pub engine_warps: u32,
    /// See `engine_warps`.
    pub engine_blocks: u32,
    /// WQEs per warp batch, and SM cycles per batch spent planning (load, decode, check, admit),
    /// copying and completing (fence, CQEs, indices), over the drains of this size.
    pub wqes_per_batch: f64,
    /// See `wqes_per_batch`.
    pub cycles_per_batch: [f64; 3],
    /// Batches that share one retirement (one fence, CQE and consumer-index store).
    pub batches_per_retirement: f64,
}

/// The engine's batch-path counters summed over `stats`: batches, WQEs batched, SM cycles
/// planning, copying and completing, retirements.
pub fn phase_totals(stats: &[ibgda::emu::QpStats]) -> [u64; 6] {
    let mut t = [0u64; 6];
    for s in stats {
        for (a, b) in t.iter_mut().zip([
            s.batches,
            s.wqes_batched,
            s.cycles_plan,
            s.cycles_copy,
            s.cycles_complete,
            s.retirements,
        ]) {
            *a += b;
        }
    }
    t
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// Measures the drain for each of `sizes` (bytes per WQE; `dst` holds 64 slots of the largest,
/// `src` one) of RDMA WRITEs from PE 0's `src` to the peer's `dst`, or (`read`) RDMA READs from
/// the peer's `src` to PE 0's `dst`. Collective: both PEs call it; the points are PE 0's (empty
/// on the other PE). The transport to the peer must be IBGDA on the emulated NIC, with send
/// queues deep enough for `4 * 256` posting threads (IBGDA_SQ_LOG_DEPTH of 12 or more).
pub fn drain_capacity(
    pe: &Pe,
    dst: &SymmetricBuffer<u8>,
    src: &SymmetricBuffer<u8>,
    sizes: &[u32],
    read: bool,
    reps: usize,
) -> ibgda::Result<Vec<DrainPoint>> {
    let me = pe.my_pe();
    let g = pe.gpu()?.ibgda().ok_or_else(|| ibgda::Error::Config {
        name: "IBGDA_TRANSPORT",
        value: "not ibgda".into(),
        why: "the engine's capacity is measured over IBGDA".into(),
    })?;
    let k = g.transport.options.qps_per_peer;
    let depth = 1u32 << g.transport.options.log_depth;
    // Blocks use QP `block % k`; each QP gets `blocks_per_qp * threads * per_thread` WQEs, one
    // batch short of the ring so no poster waits for room.
    let (threads, per_thread, blocks_per_qp) = (256u32, (depth - 64) / 256 / 4, 4u32);
    if per_thread == 0 {
        return Err(ibgda::Error::Config {
            name: "IBGDA_SQ_LOG_DEPTH",
            value: g.transport.options.log_depth.to_string(),
            why: "the engine-capacity measurement needs send queues of at least 2^12 WQEBBs".into(),
        });
    }
    let per_qp = (blocks_per_qp * threads * per_thread) as u64;
    let mut out = Vec::new();
    let phase = |g: &ibgda::transport::ibgda::GpuIbgda| g.qp_stats().map(|s| phase_totals(&s));
    for &bytes in sizes {
        let mut times = Vec::new();
        let phase_before = phase(g)?;
        for _ in 0..reps.max(1) {
            pe.barrier()?;
            if me == 0 {
                let qps = g.transport.emulated_qps();
                let emulated = g.transport.emulated().ok_or_else(|| ibgda::Error::Config {
                    name: "IBGDA_NIC",
                    value: g.transport.nic().name(),
                    why: "engine capacity is a property of the emulated NIC".into(),
                })?;
                let before: Vec<u64> = qps.iter().map(|q| q.consumed()).collect::<ibgda::Result<_>>()?;
                emulated.device().set_paused(true)?;
                let args: [KernelArg; 7] = [
                    pe.state_ptr().into(),
                    pe.ptr(dst)?.into(),
                    pe.ptr(src)?.into(),
                    bytes.into(),
                    per_thread.into(),
                    (1 - me).into(),
                    (read as u32).into(),
                ];
                let cfg = cudarc::driver::LaunchConfig {
                    grid_dim: (k * blocks_per_qp, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: ibgda_post_rdma_burst(state, dst, src, bytes, per_thread, peer, read); 64
                // slots of `bytes` fit in `dst`, `bytes` fit in `src` (this function's contract),
                // both symmetric (a READ reads the peer's `src`).
                unsafe { ibgda_bundled::launch(pe, "ibgda_post_rdma_burst", cfg, &args)? };
                pe.synchronize()?;
                let t0 = std::time::Instant::now();
                emulated.device().set_paused(false)?;
                for (q, b) in qps.iter().zip(&before) {
                    while q.consumed()? < b + per_qp {
                        if t0.elapsed() > pe.config().timeout {
                            return Err(ibgda::Error::EmulatedDevice {
                                op: "engine capacity",
                                reason: format!(
                                    "QP {:#x} did not drain {per_qp} WQEs in {:?}",
                                    q.qpn(),
                                    pe.config().timeout
                                ),
                            });
                        }
                    }
                }
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        let phase_after = phase(g)?;
        let d: Vec<f64> = phase_after
            .iter()
            .zip(phase_before)
            .map(|(a, b)| (a - b) as f64)
            .collect();
        let per_batch = |x: f64| if d[0] > 0.0 { x / d[0] } else { 0.0 };
        if me == 0 {
            eprintln!(
                "engine capacity: {bytes}-byte {} drained",
                if read { "READs" } else { "WRITEs" }
            );
            let t = median(times);
            let wqes = per_qp * k as u64;
            out.push(DrainPoint {
                read,
                bytes,
                qps: k,
                wqes_per_qp: per_qp,
                wqe_rate_mops: wqes as f64 / t / 1e6,
                gbps: wqes as f64 * bytes as f64 / t / 1e9,
                engine_warps: g.engine_warps(),
                engine_blocks: g.engine_blocks(),
                wqes_per_batch: per_batch(d[1]),
                cycles_per_batch: [per_batch(d[2]), per_batch(d[3]), per_batch(d[4])],
                batches_per_retirement: if d[5] > 0.0 { d[0] / d[5] } else { 0.0 },
            });
        }
    }
    // Leave the queues clean: complete everything (the posters' counters learn the CQEs).
    pe.barrier()?;
    Ok(out)
}

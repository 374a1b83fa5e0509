//! Where each mode waits, as rows: the emulated NIC's counters differenced around every `p` rate
//! point (backlog, time asleep on the rate model, batch fill, SM cycles per batch by phase,
//! batches per fence), and the engine's own capacity as `engine_*` rows.

use crate::rows::{emit, row, Row};
use ibgda::Pe;
use ibgda_examples::engine::DrainPoint;

/// The engine counters [`engine_evidence`] differences.
#[derive(Default)]
pub(crate) struct Evidence {
    passes: u64,
    backlog: u64,
    busy_passes_per_qp: Vec<u64>,
    model_wait_ns: u64,
    /// Batches, WQEs batched, SM cycles planning / copying / completing, retirements.
    phases: [u64; 6],
    at: Option<std::time::Instant>,
}

/// Where the posting path waits, after a `p` rate point (PE 0, emulated NIC only): the WQEBBs
/// the engine found waiting per busy pass (near zero: the engine and the modelled NIC keep up,
/// the posters are the limit; large: WQEs queue for the NIC), and the share of its time a busy
/// QP's engine warp spent waiting for the rate model (near 1: the modelled NIC is the limit, as
/// it would be on hardware; near 0 with a large backlog: the engine itself is). Each metric's name
/// starts with `prefix` (`fetch_add_` after an atomic point).
pub(crate) fn engine_evidence(
    pe: &Pe,
    mode: &str,
    prefix: &str,
    threads: u32,
    before: &mut Evidence,
    rows: &mut Vec<Row>,
) -> ibgda::Result<()> {
    let Some(g) = pe.gpu()?.ibgda() else { return Ok(()) };
    let stats = g.qp_stats()?;
    let now = std::time::Instant::now();
    let busy: Vec<u64> = stats.iter().map(|s| s.busy_passes).collect();
    let passes = busy.iter().sum::<u64>();
    let backlog = stats.iter().map(|s| s.backlog_sum).sum::<u64>();
    let wait = match g.transport.emulated() {
        Some(e) => e.device().model_stats()?.wait_ns,
        None => 0,
    };
    let busy_qps = busy
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b > before.busy_passes_per_qp.get(i).copied().unwrap_or(0))
        .count();
    let phases = ibgda_examples::engine::phase_totals(&stats);
    let dphase: Vec<f64> = phases.iter().zip(before.phases).map(|(a, b)| (a - b) as f64).collect();
    let (dp, db, dw) = (
        passes - before.passes,
        backlog - before.backlog,
        wait - before.model_wait_ns,
    );
    let elapsed = before.at.map(|t| now.duration_since(t).as_nanos() as f64);
    *before = Evidence {
        passes,
        backlog,
        busy_passes_per_qp: busy,
        model_wait_ns: wait,
        phases,
        at: Some(now),
    };
    if dp > 0 {
        rows.push(row(
            mode,
            &format!("{prefix}engine_backlog"),
            threads as f64,
            db as f64 / dp as f64,
            "WQEBBs waiting per busy pass",
        ));
        emit(rows);
    }
    if dphase[0] > 0.0 && threads > 0 {
        // Where the engine's time per warp batch goes (SM cycles; the plan includes waiting for
        // the modelled NIC), and how full its batches are.
        for (metric, value, unit) in [
            ("engine_batch_wqes", dphase[1] / dphase[0], "WQEs per warp batch"),
            ("engine_cycles_plan", dphase[2] / dphase[0], "SM cycles per batch"),
            ("engine_cycles_copy", dphase[3] / dphase[0], "SM cycles per batch"),
            ("engine_cycles_complete", dphase[4] / dphase[0], "SM cycles per batch"),
            (
                "engine_batches_per_retirement",
                dphase[0] / dphase[5].max(1.0),
                "batches per fence",
            ),
        ] {
            rows.push(row(mode, &format!("{prefix}{metric}"), threads as f64, value, unit));
            emit(rows);
        }
    }
    if let (Some(ns), true, true) = (elapsed, busy_qps > 0, pe.config().nic_model.is_some()) {
        rows.push(row(
            mode,
            &format!("{prefix}engine_model_wait_share"),
            threads as f64,
            dw as f64 / (ns * busy_qps as f64),
            "of a busy QP's engine time spent waiting for the modelled NIC",
        ));
        emit(rows);
    }
    Ok(())
}

/// The engine-capacity points as rows: WRITEs as `engine_wqe_rate` / `engine_bw` with the
/// engine's layout and where its batches spend their cycles, READs as `engine_read_*`.
pub(crate) fn capacity_rows(points: &[DrainPoint]) -> Vec<Row> {
    let mut rows = Vec::new();
    for p in points {
        // WRITEs as `engine_wqe_rate` / `engine_bw`, READs as `engine_read_*`.
        let (rate, bw) = if p.read {
            ("engine_read_wqe_rate", "engine_read_bw")
        } else {
            ("engine_wqe_rate", "engine_bw")
        };
        rows.push(row("ibgda", rate, p.bytes as f64, p.wqe_rate_mops, "Mops/s"));
        rows.push(row("ibgda", bw, p.bytes as f64, p.gbps, "GB/s"));
        if p.read {
            continue;
        }
        rows.push(row("ibgda", "engine_qps", p.bytes as f64, p.qps as f64, "QPs"));
        rows.push(row(
            "ibgda",
            "engine_warps",
            p.bytes as f64,
            p.engine_warps as f64,
            "warps",
        ));
        rows.push(row(
            "ibgda",
            "engine_sms",
            p.bytes as f64,
            p.engine_blocks as f64,
            "blocks",
        ));
        rows.push(row(
            "ibgda",
            "engine_batch_wqes",
            p.bytes as f64,
            p.wqes_per_batch,
            "WQEs per warp batch",
        ));
        rows.push(row(
            "ibgda",
            "engine_batches_per_retirement",
            p.bytes as f64,
            p.batches_per_retirement,
            "batches per fence",
        ));
        for (name, c) in ["engine_cycles_plan", "engine_cycles_copy", "engine_cycles_complete"]
            .iter()
            .zip(p.cycles_per_batch)
        {
            rows.push(row("ibgda", name, p.bytes as f64, c, "SM cycles per batch"));
        }
    }
    rows
}

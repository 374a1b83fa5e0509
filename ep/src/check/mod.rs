//! The self-check every transport and launch layout runs: random routings (including tokens
//! routed to no expert of a rank, every token to one rank, zero tokens and several experts of
//! one rank per token) through high-throughput and low-latency dispatch and combine, BF16 and
//! FP8, compared with [`crate::reference`]; and the bad inputs, which must fail with the right
//! error. Run per PE (threads or processes); every PE runs the same cases in the same order.
#![allow(clippy::needless_range_loop)]

mod ht;
mod ll;

use crate::buffer::{Buffer, BufferConfig, HtHandle};
use crate::call_arrays::LayoutArrays;
use crate::device_vec::DeviceVec;
use crate::error::{EpError, Result};
use crate::numeric::f32_to_bf16;
use crate::reference;
use ibgda::Pe;
use rand::{rngs::StdRng, Rng, SeedableRng};
/// What one case checks; the counters say how much was compared.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Cases run.
    pub cases: Vec<String>,
    /// Rows compared.
    pub rows: u64,
}

pub(crate) fn fail(case: &str, rank: u32, what: String) -> EpError {
    EpError::InvalidArgument {
        call: "self-check",
        rank,
        what: format!("{case}: {what}"),
    }
}

/// Routing: `topk_idx [tokens, topk]` for one rank.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Routing {
    /// Uniform over experts, with some `-1`s, duplicates of a rank allowed.
    Random,
    /// Every token to experts of rank 0 only.
    AllToRankZero,
    /// No expert at all.
    Nothing,
}

fn route(rng: &mut StdRng, tokens: usize, topk: usize, experts: u32, ranks: u32, how: Routing) -> Vec<i64> {
    let local = experts / ranks;
    let mut idx = vec![-1i64; tokens * topk];
    for t in 0..tokens {
        let mut used: Vec<i64> = Vec::new();
        for k in 0..topk {
            let e = match how {
                Routing::Nothing => -1,
                Routing::AllToRankZero => rng.random_range(0..local) as i64,
                Routing::Random if rng.random_range(0..8) == 0 => -1,
                Routing::Random => rng.random_range(0..experts) as i64,
            };
            // DeepEP's routers never pick an expert twice for one token.
            if e >= 0 && !used.contains(&e) {
                used.push(e);
                idx[t * topk + k] = e;
            }
        }
    }
    idx
}

fn random_bf16(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n).map(|_| f32_to_bf16(rng.random_range(-4.0f32..4.0))).collect()
}

/// The "expert" the checks apply: expert `le` multiplies by `(le + 1) / 4`.
pub(crate) fn expert_scale(le: i64) -> f32 {
    (le + 1) as f32 / 4.0
}

/// Everything a rank contributes to one case, for the reference.
pub(crate) struct RankInputs {
    pub idx: Vec<i64>,
    pub weights: Vec<f32>,
    pub x: Vec<u16>,
}

/// One case: its name, routing, dtype and shapes, and the seed every rank derives inputs from.
pub(crate) struct Case {
    pub name: String,
    pub how: Routing,
    pub fp8: bool,
    pub hidden: u32,
    pub topk: usize,
    pub experts: u32,
    pub max_tokens: u32,
    pub seed: u32,
}

impl Case {
    /// Every rank's inputs (each rank computes all of them, for the reference).
    pub fn inputs(&self, ranks: u32) -> Vec<RankInputs> {
        (0..ranks).map(|r| self.rank_inputs(r, ranks)).collect()
    }

    fn rank_inputs(&self, r: u32, ranks: u32) -> RankInputs {
        let mut rng = StdRng::seed_from_u64(self.seed as u64 * 131 + r as u64);
        let tokens = tokens_for(&mut rng, r, ranks, self.max_tokens, self.seed);
        let idx = route(&mut rng, tokens, self.topk, self.experts, ranks, self.how);
        let weights = (0..tokens * self.topk).map(|_| rng.random_range(0.0f32..1.0)).collect();
        let x = random_bf16(&mut rng, tokens * self.hidden as usize);
        RankInputs { idx, weights, x }
    }
}

/// Runs every case on this PE; every PE must call it with the same arguments.
pub fn run(pe: &mut Pe, hidden: u32, rounds: u32) -> Result<Report> {
    let mut report = Report::default();
    let ranks = pe.n_pes();
    let experts = 4 * ranks;
    let topk = 4usize;
    let max_tokens = 48u32;
    let config = BufferConfig {
        num_nvl_bytes: Buffer::ht_size_hint(ranks, max_tokens as u64, hidden, topk as u32, false),
        num_rdma_bytes: Buffer::ll_size_hint(max_tokens, hidden, ranks, experts),
        num_sms: 3,
        threads: 1024,
    };
    let mut buffer = Buffer::new(pe, config)?;
    // One block: a combine cannot both send and reduce in one launch of one block, so it runs
    // as two launches (and `set_num_sms` applies from the next call).
    buffer.set_num_sms(1)?;
    let case = Case {
        name: "ht Random bf16 on one SM".into(),
        how: Routing::Random,
        fp8: false,
        hidden,
        topk,
        experts,
        max_tokens,
        seed: 5,
    };
    report.rows += ht::ht_case(pe, &mut buffer, &case)?;
    report.cases.push(case.name);
    buffer.set_num_sms(config.num_sms)?;
    for round in 0..rounds {
        for (how, fp8) in [
            (Routing::Random, false),
            (Routing::Random, true),
            (Routing::AllToRankZero, false),
            (Routing::Nothing, true),
        ] {
            let name = format!("ht {how:?} {} round {round}", if fp8 { "fp8" } else { "bf16" });
            let case = Case {
                name,
                how,
                fp8,
                hidden,
                topk,
                experts,
                max_tokens,
                seed: 1000 * round + 7,
            };
            report.rows += ht::ht_case(pe, &mut buffer, &case)?;
            report.cases.push(case.name);
        }
        if round == 0 {
            // Between barriers: no rank's low-latency traffic may land while a rank looks.
            pe.barrier()?;
            let untouched = buffer.ll_area_is_zero(pe)?;
            pe.barrier()?;
            if !untouched {
                return Err(fail(
                    "ht round 0",
                    pe.my_pe(),
                    "the high-throughput calls wrote into the low-latency area, past the end of their own".into(),
                ));
            }
        }
        for (how, fp8) in [
            (Routing::Random, false),
            (Routing::Random, true),
            (Routing::AllToRankZero, true),
            (Routing::Nothing, false),
        ] {
            let name = format!("ll {how:?} {} round {round}", if fp8 { "fp8" } else { "bf16" });
            let case = Case {
                name,
                how,
                fp8,
                hidden,
                topk,
                experts,
                max_tokens,
                seed: 1000 * round + 11,
            };
            report.rows += ll::ll_case(pe, &buffer, &case)?;
            report.cases.push(case.name);
        }
    }
    bad_inputs(pe, &buffer, hidden, topk as u32, experts, max_tokens)?;
    report.cases.push("bad inputs".into());
    buffer.destroy(pe)?;
    Ok(report)
}

/// Tokens on rank `r` for a case: zero on the last rank every other case.
fn tokens_for(rng: &mut StdRng, r: u32, ranks: u32, max_tokens: u32, seed: u32) -> usize {
    if ranks > 1 && r == ranks - 1 && seed % 2 == 1 {
        0
    } else {
        rng.random_range(1..=max_tokens) as usize
    }
}

/// Each bad input fails with its error, on every rank, and moves nothing.
fn bad_inputs(pe: &mut Pe, buffer: &Buffer, hidden: u32, topk: u32, experts: u32, max_tokens: u32) -> Result<()> {
    let me = pe.my_pe();
    let expect = |what: &str, r: Result<crate::Geometry>, needle: &str| -> Result<()> {
        match r {
            Err(e) if e.to_string().contains(needle) => Ok(()),
            Err(e) => Err(fail("bad inputs", me, format!("{what}: wrong error: {e}"))),
            Ok(_) => Err(fail("bad inputs", me, format!("{what}: accepted"))),
        }
    };
    expect(
        "FP8 with hidden 136",
        buffer.ht_geometry("dispatch", 136, topk, experts, true),
        "multiple of 128",
    )?;
    expect(
        "top-k 17",
        buffer.ht_geometry("dispatch", hidden, 17, experts, false),
        "num_topk",
    )?;
    if pe.n_pes() > 1 {
        expect(
            "experts not a multiple of ranks",
            buffer.ht_geometry("dispatch", hidden, topk, experts + 1, false),
            "num_experts",
        )?;
    }
    expect(
        "too many low-latency tokens",
        buffer.ll_geometry(
            "low_latency_dispatch",
            max_tokens,
            max_tokens + 1,
            hidden,
            topk,
            experts,
            false,
        ),
        "more than num_max_dispatch_tokens_per_rank",
    )?;
    // An expert index out of range is reported by the layout and counted nowhere; twice on the
    // same outputs counts once (the call zeroes its counts first).
    let idx = DeviceVec::from_slice(pe, &[0i64, experts as i64, -1, -2])?;
    let lay = LayoutArrays::new(pe, 2, pe.n_pes(), experts)?;
    // SAFETY: live DeviceVecs of the sizes named (2 tokens x top-2).
    unsafe {
        buffer.layout(pe, idx.ptr(), 2, 2, experts, &lay.out())?;
        buffer.layout(pe, idx.ptr(), 2, 2, experts, &lay.out())?;
    }
    let b = lay.bad.read::<u32>(pe, 1)?[0];
    if b == 0
        || lay
            .tokens_per_expert
            .read::<u32>(pe, experts as usize)?
            .iter()
            .sum::<u32>()
            != 1
    {
        return Err(fail(
            "bad inputs",
            me,
            format!("an out-of-range expert was not flagged (bad = {b})"),
        ));
    }
    // Too many tokens for the area: every rank gets BufferTooSmall, and the buffer stays usable.
    let small = Buffer::new(
        pe,
        BufferConfig {
            num_nvl_bytes: Buffer::ht_size_hint(pe.n_pes(), 2, hidden, topk, false),
            num_rdma_bytes: 16,
            num_sms: 2,
            threads: 64,
        },
    )?;
    let tokens = 8usize;
    let idx: Vec<i64> = (0..tokens * topk as usize)
        .map(|j| if j % topk as usize == 0 { 0 } else { -1 })
        .collect();
    let (_, per_e, inr) = reference::layout(&idx, topk as usize, experts, pe.n_pes());
    let inr = DeviceVec::from_slice(pe, &inr)?;
    let per_e = DeviceVec::from_slice(pe, &per_e)?;
    let info = DeviceVec::zeroed(pe, 4 * HtHandle::info_len(pe.n_pes(), experts))?;
    let handle = HtHandle {
        info: info.ptr(),
        send_slot: 0,
        in_rank: inr.ptr(),
        tokens_per_expert: per_e.ptr(),
    };
    let g = small.ht_geometry("dispatch", hidden, topk, experts, false)?;
    // SAFETY: live DeviceVecs of the sizes named.
    let r = unsafe {
        small.ht_notify(pe, &g, tokens as u32, &handle, 0, 0)?;
        small.read_info(pe, &g, tokens as u32, &handle)
    };
    match r {
        Err(EpError::BufferTooSmall { receiver: 0, .. }) => {}
        Err(e) => return Err(fail("bad inputs", me, format!("overflow: wrong error: {e}"))),
        Ok(_) => return Err(fail("bad inputs", me, "overflow: accepted".into())),
    }
    // A cached dispatch whose handle's rows do not fit this geometry's slots (a handle from a
    // dispatch of smaller rows), or whose record is not a good one, fails on the host before
    // anything is launched: the same on every rank, from the matrix each holds.
    let (ranks, le) = (pe.n_pes(), g.local_experts);
    let mut record = vec![0i32; crate::geometry::info::len(ranks, le)];
    record[crate::geometry::info::sent(ranks, le, ranks - 1, 0)] = g.capacity as i32 + 1;
    // SAFETY: nothing is launched when the record is refused (each case expects a refusal).
    match unsafe { small.ht_notify_cached(pe, &g, &handle, &record) } {
        Err(EpError::BufferTooSmall { receiver: 0, .. }) => {}
        Err(e) => return Err(fail("bad inputs", me, format!("cached overflow: wrong error: {e}"))),
        Ok(()) => return Err(fail("bad inputs", me, "cached overflow: accepted".into())),
    }
    record[crate::geometry::info::status(ranks, le)] = 1;
    // SAFETY: as above.
    match unsafe { small.ht_notify_cached(pe, &g, &handle, &record[1..]) } {
        Err(EpError::InvalidArgument { .. }) => {}
        Err(e) => return Err(fail("bad inputs", me, format!("cached bad record: wrong error: {e}"))),
        Ok(()) => return Err(fail("bad inputs", me, "cached bad record: accepted".into())),
    }
    // An expert out of range in rank 0's topk_idx (tokens 1 and 2; token 0 of 2 fits), checked
    // by the notify on the GPU: every rank's read names rank 0 and its first bad token.
    let tokens = 3usize;
    let idx: Vec<i64> = (0..tokens * topk as usize)
        .map(|j| match (me, j / topk as usize, j % topk as usize) {
            (0, 1, 1) => experts as i64,
            (0, 2, 0) => -2,
            (_, 0 | 1, 0) => 0,
            _ => -1,
        })
        .collect();
    let (_, per_e, inr) = reference::layout(&idx, topk as usize, experts, pe.n_pes());
    let (topk_dev, inr, per_e) = (
        DeviceVec::from_slice(pe, &idx)?,
        DeviceVec::from_slice(pe, &inr)?,
        DeviceVec::from_slice(pe, &per_e)?,
    );
    let handle = HtHandle {
        in_rank: inr.ptr(),
        tokens_per_expert: per_e.ptr(),
        ..handle
    };
    // SAFETY: live DeviceVecs of the sizes named.
    let r = unsafe {
        small.ht_notify(pe, &g, tokens as u32, &handle, topk_dev.ptr(), 0)?;
        small.read_info(pe, &g, tokens as u32, &handle)
    };
    match r {
        Err(EpError::ExpertOutOfRange {
            from_rank: 0, token: 1, ..
        }) => {}
        Err(e) => return Err(fail("bad inputs", me, format!("expert out of range: wrong error: {e}"))),
        Ok(_) => return Err(fail("bad inputs", me, "expert out of range: accepted".into())),
    }
    // Then the same routing without the bad entries goes through on every rank.
    let good: Vec<i64> = idx
        .iter()
        .map(|&e| if (0..experts as i64).contains(&e) { e } else { -1 })
        .collect();
    let good = DeviceVec::from_slice(pe, &good)?;
    // Rank 0 receives tokens 0 and 1 of every rank: one row more than a limit of 2 * ranks - 1
    // (DeepEP's num_worst_tokens) stops the call on every rank, naming rank 0 and its rows.
    let rows = 2 * pe.n_pes();
    // SAFETY: as above.
    let r = unsafe {
        small.ht_notify(pe, &g, tokens as u32, &handle, good.ptr(), rows - 1)?;
        small.read_info(pe, &g, tokens as u32, &handle)
    };
    match r {
        Err(EpError::TooManyRows {
            receiver: 0,
            rows: got,
            limit,
            ..
        }) if got == rows as u64 && limit == rows - 1 => {}
        Err(e) => return Err(fail("bad inputs", me, format!("num_worst_tokens: wrong error: {e}"))),
        Ok(_) => return Err(fail("bad inputs", me, "num_worst_tokens: accepted".into())),
    }
    // Then the same call with a limit it meets goes through on every rank.
    // SAFETY: as above.
    unsafe {
        small.ht_notify(pe, &g, tokens as u32, &handle, good.ptr(), rows)?;
        small.read_info(pe, &g, tokens as u32, &handle)
    }
    .map_err(|e| fail("bad inputs", me, format!("a good notify after a bad one failed: {e}")))?;
    small.destroy(pe)?;
    Ok(())
}

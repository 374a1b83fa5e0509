//! The CPU engine: one thread that plays every NIC on a fabric, running the shared `no_std`
//! processing core (`ibgda_nic_emu::service_qp`) over all QPs, with a backoff when idle.

use super::FabricInner;
use crate::error::{Error, Result};
use crossbeam_utils::Backoff;
use ibgda_abi::emu::QpContext;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// WQEs one QP may execute per pass before the engine moves on (fairness between QPs).
const BUDGET_PER_QP: u32 = 64;

pub(crate) struct EngineThread {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The host-memory QP contexts to service, as raw addresses (the fabric keeps them alive).
pub(crate) fn snapshot(fabric: &FabricInner) -> Vec<usize> {
    fabric
        .qps
        .lock()
        .iter()
        .filter_map(|q| q.ctx_host())
        .map(|p| p as usize)
        .collect()
}

/// One pass over `qps`; returns the WQEs processed.
pub(crate) fn service_pass(fabric: &FabricInner, qps: &[usize]) -> u32 {
    let _pass = fabric.service_lock.lock();
    let mut work = 0;
    for &qp in qps {
        // SAFETY: the contexts belong to the fabric, which outlives this pass (the engine thread
        // holds an Arc to it; `service_once` borrows it); one engine services a QP at a time
        // (the pass lock).
        let done = unsafe { ibgda_nic_emu::service_qp(qp as *mut QpContext, BUDGET_PER_QP) };
        work += done.wqes + done.learned as u32;
    }
    work
}

impl EngineThread {
    pub(crate) fn spawn(fabric: Arc<FabricInner>) -> Result<EngineThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ibgda-emu-engine".into())
            .spawn(move || run(fabric, flag))
            .map_err(|e| Error::EmulatedDevice {
                op: "start_engine",
                reason: e.to_string(),
            })?;
        Ok(EngineThread { stop, thread })
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        // The engine code never panics on any input (fuzzed); a panic here is a bug worth seeing.
        if let Err(e) = self.thread.join() {
            std::panic::resume_unwind(e);
        }
    }
}

fn run(fabric: Arc<FabricInner>, stop: Arc<AtomicBool>) {
    let mut generation = u64::MAX;
    let mut qps = Vec::new();
    let backoff = Backoff::new();
    while !stop.load(Ordering::Acquire) {
        let g = fabric.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            qps = snapshot(&fabric);
        }
        if service_pass(&fabric, &qps) > 0 {
            backoff.reset();
        } else if backoff.is_completed() {
            // Idle: a short park keeps an idle engine off the CPU (CI has two cores) while a new
            // doorbell is still noticed within ~50 µs.
            std::thread::park_timeout(Duration::from_micros(50));
        } else {
            backoff.snooze();
        }
    }
}

//! The CPU-assisted doorbell: a host thread that turns the producer indices GPU posters publish
//! (one 64-bit slot per QP in host-mapped memory, raised with a system-scope release store by the
//! poster holding the QP's ringing role) into the two writes a NIC needs: the DBR (big-endian
//! 16-bit index at DBR + 4) and the 8-byte doorbell `{htobe32(pi << 8), htobe32(qpn << 8)}` at
//! UAR + 0x800, in that order. Both live in host-mapped
//! memory, where a real NIC's are (its DBR in host memory, its UAR an MMIO page the CPU writes).

use crate::error::{Error, Result};
use crate::nic::NicQp;
use crate::placement::Region;
use crossbeam_utils::Backoff;
use ibgda_abi::mlx5::{dbr_word, doorbell_word, SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

struct Watched {
    qpn: u32,
    slot: *const AtomicU64,
    dbr: *const AtomicU32,
    doorbell: *const AtomicU64,
    last: u64,
}

// SAFETY: the pointers name host-mapped memory kept alive by `_qps`/the transport for the thread's
// life (CpuDoorbell is stopped before the transport is dropped); every access is atomic.
unsafe impl Send for Watched {}

/// A running doorbell thread. Stop it (or drop it) before the QPs go away.
pub struct CpuDoorbell {
    stop: Arc<AtomicBool>,
    rung: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    _qps: Vec<Arc<dyn NicQp>>,
}

impl CpuDoorbell {
    /// Starts ringing for `qps`, each with its producer-index slot. The QPs' DBR and UAR pages
    /// must be host-mapped (created with a host doorbell).
    pub fn start(pe: u32, qps: Vec<(Arc<dyn NicQp>, &Region)>) -> Result<CpuDoorbell> {
        let mut watched = Vec::new();
        let mut keep = Vec::new();
        for (qp, slot) in qps {
            let missing = |what| Error::EmulatedDevice {
                op: "start CPU doorbell",
                reason: format!("PE {pe} QP {:#x}: its {what} is not in host memory", qp.qpn()),
            };
            let slot = slot.host_ptr::<AtomicU64>().ok_or_else(|| missing("producer slot"))?;
            let host = qp
                .queues()
                .host
                .ok_or_else(|| missing("doorbell record and UAR page"))?;
            let (dbr, uar) = (host.dbr, host.uar);
            // SAFETY: offsets inside the DBR (8 bytes) and UAR page (4 KiB), aligned for the width.
            let (dbr, doorbell) = unsafe {
                (
                    dbr.add(SND_DBR_OFFSET) as *const AtomicU32,
                    uar.add(UAR_DOORBELL_OFFSET) as *const AtomicU64,
                )
            };
            watched.push(Watched {
                qpn: qp.qpn(),
                slot,
                dbr,
                doorbell,
                last: 0,
            });
            keep.push(qp);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let rung = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), rung.clone());
        let thread = std::thread::Builder::new()
            .name(format!("ibgda-doorbell-pe{pe}"))
            .spawn(move || run(watched, s, r))
            .map_err(|e| Error::EmulatedDevice {
                op: "start CPU doorbell",
                reason: e.to_string(),
            })?;
        Ok(CpuDoorbell {
            stop,
            rung,
            thread: Some(thread),
            _qps: keep,
        })
    }

    /// Doorbells rung so far.
    pub fn rung(&self) -> u64 {
        self.rung.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for CpuDoorbell {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(mut watched: Vec<Watched>, stop: Arc<AtomicBool>, rung: Arc<AtomicU64>) {
    let backoff = Backoff::new();
    while !stop.load(Ordering::Acquire) {
        let mut work = false;
        for w in &mut watched {
            // SAFETY: live host-mapped words (see `Watched`); atomic accesses only.
            // Acquire: the GPU's release store (system scope) follows its WQE writes.
            let prod = unsafe { (*w.slot).load(Ordering::Acquire) };
            if prod <= w.last {
                continue;
            }
            let pi = prod as u16;
            // SAFETY: as above. DBR first, then the doorbell, each a release store, ordered and
            // flushed toward the device as rdma-core does.
            unsafe {
                crate::nic::mmio::before_device_store();
                (*w.dbr).store(dbr_word(pi), Ordering::Release);
                crate::nic::mmio::before_device_store();
                (*w.doorbell).store(doorbell_word(pi, w.qpn), Ordering::Release);
            }
            crate::nic::mmio::flush_device_stores();
            w.last = prod;
            work = true;
            rung.fetch_add(1, Ordering::Relaxed);
        }
        if work {
            backoff.reset();
        } else if backoff.is_completed() {
            std::thread::park_timeout(Duration::from_micros(20));
        } else {
            backoff.snooze();
        }
    }
}

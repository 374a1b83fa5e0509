//! The start of a service pass: the QP's view ([`View`]) and the producer index it learns from
//! the doorbell register (or the DBR when a doorbell was lost), loaded whole ([`learn`]) or, by a
//! GPU engine warp, through the context it keeps between passes ([`learn_cached`]).

use super::engine::{MrCache, Mrs, View};
use super::model::{Model, ModelWords};
use ibgda_abi::emu::{CqContext, CqMode, DeviceContext, QpContext, QpState};
use ibgda_abi::mlx5::{Be32, SND_DBR_OFFSET, UAR_DOORBELL_OFFSET};
use ibgda_device::arch;

/// Starts a service pass: `None` when the device is paused or the QP is not processing (RESET,
/// INIT, RTR); otherwise the pass's [`View`], after following the doorbell (or the DBR).
///
/// # Safety
/// As [`service_qp`](super::engine::service_qp).
pub unsafe fn learn(qp: *mut QpContext) -> Option<View> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let mut v = learn_static(qp);
        let reg = arch::load_acquire_sys_u64(((*qp).uar + UAR_DOORBELL_OFFSET as u64) as *const u64);
        learn_dynamic(&mut v, reg).then_some(v)
    }
}

/// What a GPU engine warp keeps of the one QP it services from one pass to the next (a ConnectX
/// caches its QP contexts too): the QP's static context and the engine-owned indices, valid while
/// the control plane has not touched the QP (its `generation` is unchanged). With it an idle pass
/// is one look at the doorbell register instead of a dozen dependent loads, and a busy pass loads
/// only what may change (pause, the QP's state, injected delays, the model's switch).
///
/// Each lane of the warp also keeps, in its own `QpCache`, the region entries and the responder's
/// readiness it checked on the batch path (`LaneKeys`), for one key lease of the device
/// ([`ibgda_abi::emu::DeviceContext::key_lease_ns`]): lane 0 decides for the warp when the lease
/// ends, and a new generation of the QP ends it at once.
#[derive(Clone, Copy, Debug)]
pub struct QpCache {
    generation: u32,
    view: Option<View>,
    pub(super) keys: LaneKeys,
}

/// What one lane keeps of its key checks between passes (see [`QpCache`]): the entries it
/// checked last and whether the responder was ready (only a ready one is remembered, so a
/// responder that becomes ready is seen at once). The lease fields are lane 0's: which QP and
/// generation the lease is for and when it started.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LaneKeys {
    pub(super) local_mr: MrCache,
    pub(super) remote_mr: MrCache,
    pub(super) remote_ready: bool,
    pub(super) lease_qp: u64,
    pub(super) lease_generation: u32,
    pub(super) lease_start_ns: u64,
}

// SAFETY: the cache holds addresses of a QP's device memory and copies of its fields, nothing
// borrowed; the `# Safety` contract of `learn_cached` lets one servicing warp use it at a time,
// and a CPU stand-in of that warp may run on any thread.
unsafe impl Send for QpCache {}

impl QpCache {
    /// An empty cache (the first pass fills it).
    pub const fn new() -> QpCache {
        QpCache {
            generation: 0,
            view: None,
            keys: LaneKeys {
                local_mr: MrCache::EMPTY,
                remote_mr: MrCache::EMPTY,
                remote_ready: false,
                lease_qp: 0,
                lease_generation: 0,
                lease_start_ns: 0,
            },
        }
    }

    /// The QP's `generation` when its context was loaded (the control plane bumps it whenever it
    /// changes the QP).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Keeps `v` (the pass's view, after it ran) for the next pass.
    pub fn keep(&mut self, v: &View) {
        if self.view.is_some_and(|c| c.qp == v.qp) {
            self.view = Some(*v);
        }
    }
}

impl Default for QpCache {
    fn default() -> Self {
        QpCache::new()
    }
}

/// [`learn`] through `cache`: the static context is loaded only when the control plane changed the
/// QP since the cache was filled. An idle QP (doorbell unchanged, nothing pending, no DBR check
/// due) returns `None` at once, having read a few fields of the cached view in place: the view
/// lives in local memory, where a copy of it is dozens of dependent accesses, too slow for a
/// look at a doorbell. `None` also when the QP is not processing (as [`learn`]). The caller hands
/// a pass's view back with [`QpCache::keep`] when the pass ends.
///
/// # Safety
/// As [`service_qp`](super::engine::service_qp); `cache` is used with this QP only by the warp that services it.
pub unsafe fn learn_cached(qp: *mut QpContext, cache: &mut QpCache) -> Option<View> {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let cached = match cache.view.as_mut() {
            Some(c) if c.qp == qp => c,
            _ => {
                let generation = arch::load_acquire_sys_u32(field!(qp, generation));
                let v = learn(qp);
                *cache = QpCache {
                    generation,
                    view: v,
                    ..QpCache::new()
                };
                return v;
            }
        };
        // An idle look is one round trip: the generation, the doorbell register and the recovery
        // interval are loaded together (relaxed: every lane acquires the producer index before it
        // reads a WQE, and a new generation is acquired below before the context is reloaded).
        let generation = arch::load_relaxed_sys_u32(field!(qp, generation));
        let reg = arch::load_relaxed_sys_u64(cached.doorbell as *const u64);
        let due = arch::load_relaxed_sys_u64(field!(cached.dev, dbr_recovery_ns));
        if generation != cache.generation {
            // The control plane changed the QP: its stores before the new generation, then the
            // context, are acquired (the fence upgrades the relaxed load).
            arch::fence_acq_rel_sys();
            let v = learn(qp);
            *cache = QpCache {
                generation,
                view: v,
                ..QpCache::new()
            };
            return v;
        }
        if reg == cached.last_doorbell
            && cached.posted == cached.consumed
            && arch::global_timer_ns().wrapping_sub(cached.last_dbr_check_ns) < due
        {
            // Idle: nothing new, and no DBR recovery check due.
            return None;
        }
        let mut v = *cached;
        if !learn_dynamic(&mut v, reg) {
            cache.view = None;
            return None;
        }
        Some(v)
    }
}

/// The part of a pass's view that only the control plane changes (queue, CQ, keys' tables, the
/// responder), and the engine-owned indices, as loaded from the QP's context.
///
/// # Safety
/// As [`service_qp`](super::engine::service_qp).
unsafe fn learn_static(qp: *mut QpContext) -> View {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let dev = (*qp).device as *const DeviceContext;
        let remote = arch::load_relaxed_sys_u64(field!(qp, remote)) as *mut QpContext;
        let cq = (*qp).cq as *mut CqContext;
        let (remote_pd, rdev) = if remote.is_null() {
            (0, core::ptr::null())
        } else {
            ((*remote).pd, (*remote).device as *const DeviceContext)
        };
        View {
            qp,
            sq: (*qp).sq,
            depth: 1u64 << (*qp).log_sq_depth,
            qpn: (*qp).qpn,
            pd: (*qp).pd,
            cq,
            cq_buf: (*cq).buf,
            cq_log: (*cq).log_size,
            cq_collapsed: (*cq).mode == CqMode::Collapsed as u32,
            // `model_fetch` is 0 exactly when this engine's own reads of the queue cross PCIe.
            sq_remote: (*qp).model_fetch == 0,
            charge_fetch: (*qp).model_fetch != 0,
            mrs: Mrs::of(dev),
            delay_ns: 0,
            dev: dev as *mut DeviceContext,
            model: Model::default(),
            remote,
            remote_ready: None,
            remote_pd,
            remote_mrs: Mrs::of(rdev),
            in_error: false,
            consumed: arch::load_relaxed_sys_u64(field!(qp, consumed)),
            posted: arch::load_relaxed_sys_u64(field!(qp, posted)),
            doorbell: (*qp).uar + UAR_DOORBELL_OFFSET as u64,
            last_doorbell: arch::load_relaxed_sys_u64(field!(qp, last_doorbell)),
            last_dbr_check_ns: arch::load_relaxed_sys_u64(field!(qp, last_dbr_check_ns)),
            executed: 0,
            batched: 0,
            backlog: 0,
            fetched_ns: 0,
            rd_outstanding: 0,
            rd_due_ns: 0,
            cqe_due_ns: 0,
            local_mr: MrCache::default(),
            remote_mr: MrCache::default(),
            key_lease_ns: 0,
            learned: false,
            from_dbr: false,
            doorbell_ns: 0,
        }
    }
}

/// The part of a pass's view that changes while the QP runs (pause, the QP's state, injected
/// delay, the rate model), then the producer index from the doorbell register's value `reg` (or the DBR,
/// when a doorbell was lost): `false` when the device is paused or the QP is not processing
/// (RESET, INIT and RTR queues are not processed; a doorbell stays latched in the register).
///
/// # Safety
/// As [`service_qp`](super::engine::service_qp), with `v` from [`learn_static`] of a live QP.
unsafe fn learn_dynamic(v: &mut View, reg: u64) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let (qp, dev) = (v.qp, v.dev);
        // The relaxed loads first, then the one acquire: all in flight together (an acquire
        // holds back only what comes after it).
        // The rate model's parameters come with them, needed or not (a pass that needs them
        // would otherwise load them after `model_on`, one more round trip). The responder's
        // state is not loaded here: it is the other GPU's memory, and the batch planner loads it
        // beside the responder's key entry (`load_responder_state`), one NVLink round trip for both.
        let paused = arch::load_relaxed_sys_u32(field!(dev, paused));
        let delay_ns = arch::load_relaxed_sys_u64(field!(dev, completion_delay_ns));
        let mut model_on = arch::load_relaxed_sys_u32(field!(dev, model_on)) != 0;
        let mut model_words = ModelWords::load(dev);
        let drops = arch::load_relaxed_sys_u32(field!(qp, drop_doorbells));
        let key_lease_ns = arch::load_relaxed_sys_u64(field!(dev, key_lease_ns));
        let watched = arch::load_relaxed_sys_u64(field!(qp, watched_doorbell));
        let watched_ns = arch::load_relaxed_sys_u64(field!(qp, watched_doorbell_ns));
        let rd_outstanding = arch::load_relaxed_sys_u64(field!(qp, rd_outstanding));
        let rd_due_ns = arch::load_relaxed_sys_u64(field!(qp, rd_due_ns));
        let state = arch::load_acquire_sys_u32(field!(qp, state));
        if paused != 0 || (state != QpState::Rts as u32 && state != QpState::Err as u32) {
            if watched_ns != 0 {
                // WQEs learned after a pause (or a state change) count from then, not from a
                // doorbell seen before it.
                arch::store_relaxed_sys_u64(field!(qp, watched_doorbell_ns), 0);
            }
            return false;
        }
        v.remote_ready = None;
        v.in_error = state == QpState::Err as u32;
        v.delay_ns = delay_ns;
        v.key_lease_ns = key_lease_ns;
        (v.executed, v.batched, v.backlog, v.fetched_ns) = (0, 0, 0, 0);
        (v.rd_outstanding, v.rd_due_ns) = (0, 0);
        (v.local_mr, v.remote_mr) = (MrCache::default(), MrCache::default());
        v.doorbell_ns = 0;
        v.model = Model::default();
        v.learned = learn_doorbell(v, reg, drops);
        v.from_dbr = false;
        if !v.learned && v.consumed == v.posted {
            let now = arch::global_timer_ns();
            if now.wrapping_sub(v.last_dbr_check_ns) >= (*dev).dbr_recovery_ns {
                v.last_dbr_check_ns = now;
                arch::store_relaxed_sys_u64(field!(qp, last_dbr_check_ns), now);
                let raw = arch::load_acquire_sys_u32(((*qp).dbr + SND_DBR_OFFSET as u64) as *const u32);
                if advance_posted(v, Be32::from_raw(raw).get() as u16) {
                    // These WQEs were learned after the switches were loaded: reload the model's
                    // (ordered after the DBR's acquire), or a WQE posted just after the model was
                    // turned on could run unpaced.
                    model_on = arch::load_relaxed_sys_u32(field!(dev, model_on)) != 0;
                    model_words = ModelWords::load(dev);
                    arch::red_add_relaxed_sys_u64(field!(qp, doorbells_recovered), 1);
                    v.learned = true;
                    v.from_dbr = true;
                    v.doorbell_ns = now;
                }
            }
        }
        // A doorbell first seen while the engine waited for this QP's previous batch to land
        // counts from then (see `QpContext::watched_doorbell`); the record is used once.
        let mut noticed_ns = 0;
        if v.learned && watched_ns != 0 {
            if !v.from_dbr && reg == watched {
                noticed_ns = watched_ns;
            }
            arch::store_relaxed_sys_u64(field!(qp, watched_doorbell_ns), 0);
        }
        v.backlog = v.posted - v.consumed;
        if v.backlog > 0 {
            v.model = Model::of_words(dev, model_on, v.charge_fetch, &model_words);
            v.fetched_ns = super::model::fetched_ns(&v.model, noticed_ns);
            if v.model.on && rd_due_ns > v.fetched_ns {
                if rd_outstanding == 0 {
                    // The previous pass ended held back until then (its window of READs and
                    // atomics was full, or a fence waited): nothing later goes before.
                    v.fetched_ns = rd_due_ns;
                } else {
                    // Its READs and atomics whose responses are not back when these WQEs are
                    // fetched: a fence here waits for them, and they count towards the limit.
                    (v.rd_outstanding, v.rd_due_ns) = (rd_outstanding, rd_due_ns);
                }
            }
        }
        true
    }
}

/// Follows the doorbell register's value `reg` (acquired by the caller: the poster's WQE and DBR
/// stores happen before its doorbell store); returns whether it exposed new WQEs. `pending` is
/// the QP's count of doorbells still to drop (fault injection), loaded by the caller.
unsafe fn learn_doorbell(v: &mut View, reg: u64, pending: u32) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let qp = v.qp;
        let raw = reg;
        if raw == v.last_doorbell {
            return false;
        }
        v.last_doorbell = raw;
        arch::store_relaxed_sys_u64(field!(qp, last_doorbell), raw);
        let bytes = raw.to_le_bytes();
        let pi = u16::from_be_bytes([bytes[1], bytes[2]]);
        let qpn = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) >> 8;
        if qpn != v.qpn {
            return false;
        }
        let drops = field!(qp, drop_doorbells);
        if pending > 0 && arch::atomic_cas_acq_rel_sys_u32(drops, pending, pending - 1) == pending {
            arch::red_add_relaxed_sys_u64(field!(qp, doorbells_dropped), 1);
            return false;
        }
        let learned = advance_posted(v, pi);
        if learned {
            arch::red_add_relaxed_sys_u64(field!(qp, doorbells_seen), 1);
            v.doorbell_ns = arch::global_timer_ns();
        }
        learned
    }
}

/// Moves `posted` forward to the 16-bit producer index `pi`; values that do not move it forward
/// by at most the queue depth (stale or bogus) are ignored.
unsafe fn advance_posted(v: &mut View, pi: u16) -> bool {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let delta = pi.wrapping_sub(v.posted as u16) as u64;
        if delta == 0 || v.posted + delta - v.consumed > v.depth {
            return false;
        }
        v.posted += delta;
        arch::store_relaxed_sys_u64(field!(v.qp, posted), v.posted);
        true
    }
}

//! The rate model: paces the emulated device as a ConnectX's port would, so that the engine (which
//! can move data far faster than one NIC port) stands for a NIC of known speed.
//!
//! Every WQE (or batch of WQEs) reserves time on a port's transmitter: `max(bytes x time per byte,
//! messages x time per message)` starting no earlier than the port is free and than the WQEs were
//! fetched (a PCIe round trip, for queues the NIC would read by DMA while the engine reads them
//! locally). Its data lands and its CQE is written one latency after its transmission ends (two for
//! a READ or an atomic: the request goes out, the response comes back). WRITE data and requests
//! use the requester's transmitter; READ responses and atomic results the requester's receiver.
//! Only the device's own clocks are booked (see [`due_ns`]). Off (the default outside comparisons), none
//! of this runs and the engine goes as fast as it can. Defaults and sources:
//! `docs/nic-rate-model-sources.md`.
//!
//! The WQEs a service pass learned are fetched once, at the pass's start ([`fetched_ns`]), so a
//! QP's batches queue on the port one after another, as a ConnectX pipelines a QP's messages,
//! rather than each paying a fetch and a latency of its own. WQEs whose doorbell rang while the
//! engine waited for the QP's previous batch to land count as fetched from when the wait first saw
//! that doorbell ([`wait_until`]), as a ConnectX fetches them while the previous ones are on the
//! wire.
//!
//! A batch with an atomic takes effect at the responder one latency after it is sent (a signal
//! after its data lands then) and completes after the round trip; an atomic's fetched result is
//! stored with its update and the CQE that makes it readable waits for the round trip.
//!
//! Simplifications, stated: a WRITE's CQE is written when the engine retires its group of
//! batches, with or after its data (a ConnectX writes it when the ACK returns, one latency
//! later); the engine waits for a batch's due time before it copies the
//! batch's data, so one QP's data lands batch after batch; the port clock is the engine's global
//! timer, in picoseconds from the first time the port was used.

use ibgda_abi::emu::{DeviceContext, QpContext};
use ibgda_device::arch;

/// A device's model parameters, read once per service pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Model {
    /// The model is on.
    pub on: bool,
    /// Link time per byte (fs).
    pub fs_per_byte: u64,
    /// Port time per message (fs).
    pub fs_per_msg: u64,
    /// One-way latency (ns).
    pub latency_ns: u64,
    /// WQE fetch (ns), already zero for QPs whose fetch is not charged.
    pub fetch_ns: u64,
    /// The engine time (ns) the port clock counts from (see [`epoch`]), read once per pass.
    pub epoch_ns: u64,
    /// READs and atomics a QP may have outstanding (0: no limit).
    pub max_rd_atomic: u64,
}

/// A device's rate-model parameters as loaded, before the pass knows whether it needs them.
#[derive(Clone, Copy, Default, Debug)]
pub struct ModelWords {
    fs_per_byte: u64,
    fs_per_msg: u64,
    latency_ns: u64,
    fetch_ns: u64,
    /// The port clock's epoch, 0 while no engine has set it (see [`epoch`]).
    epoch_ns: u64,
    max_rd_atomic: u64,
}

impl ModelWords {
    /// Loads the parameters of `dev`, relaxed and all in flight at once.
    ///
    /// # Safety
    /// `dev` is a live device context.
    #[inline(always)]
    pub unsafe fn load(dev: *mut DeviceContext) -> ModelWords {
        // SAFETY: this function's `# Safety` contract; the fields are the device's, read atomically.
        unsafe {
            ModelWords {
                fs_per_byte: arch::load_relaxed_sys_u64(field!(dev, model_fs_per_byte)),
                fs_per_msg: arch::load_relaxed_sys_u64(field!(dev, model_fs_per_msg)),
                latency_ns: arch::load_relaxed_sys_u64(field!(dev, model_latency_ns)),
                fetch_ns: arch::load_relaxed_sys_u64(field!(dev, model_fetch_ns)),
                epoch_ns: arch::load_relaxed_sys_u64(field!(dev, model_epoch_ns)),
                max_rd_atomic: arch::load_relaxed_sys_u64(field!(dev, model_max_rd_atomic)),
            }
        }
    }
}

impl Model {
    /// The model of device `dev` (whose `model_on` switch the caller loaded: `on`), with the WQE
    /// fetch charged when `charge_fetch`, from the words [`ModelWords::load`] read (a pass loads
    /// them with its other switches, so the model costs it no round trip of its own).
    ///
    /// # Safety
    /// `dev` is a live device context.
    pub unsafe fn of_words(dev: *mut DeviceContext, on: bool, charge_fetch: bool, w: &ModelWords) -> Model {
        if !on {
            return Model::default();
        }
        Model {
            on: true,
            fs_per_byte: w.fs_per_byte,
            fs_per_msg: w.fs_per_msg,
            latency_ns: w.latency_ns,
            fetch_ns: if charge_fetch { w.fetch_ns } else { 0 },
            epoch_ns: if w.epoch_ns != 0 {
                w.epoch_ns
            } else {
                // SAFETY: this function's `# Safety` contract.
                unsafe { epoch(dev, arch::global_timer_ns()) }
            },
            max_rd_atomic: w.max_rd_atomic,
        }
    }

    /// Port time of one message carrying `bytes`, in femtoseconds: its bytes at the link rate,
    /// or its message slot when that is longer (saturating: no parameter can wrap it).
    pub fn message_fs(&self, bytes: u64) -> u64 {
        bytes.saturating_mul(self.fs_per_byte).max(self.fs_per_msg)
    }

    /// Link time of `bytes` alone (a READ response), in femtoseconds (saturating).
    pub fn bytes_fs(&self, bytes: u64) -> u64 {
        bytes.saturating_mul(self.fs_per_byte)
    }
}

/// What a batch asks of the model: port time summed over its WQEs, each charged as the one
/// message it is (so a batch costs what its WQEs would one at a time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// WQEs (messages) in it.
    pub messages: u64,
    /// Femtoseconds of the requester's port: per WRITE or atomic [`Model::message_fs`] of its
    /// bytes, per READ request one message slot.
    pub sent_fs: u64,
    /// Femtoseconds of the responder's port: the READ data (and atomic results) it returns.
    pub returned_fs: u64,
    /// A READ or an atomic is among them: the data is due after a round trip.
    pub round_trip: bool,
    /// A READ is among them: its data lands at the requester after the round trip (an atomic's
    /// update lands at the responder one latency after it is sent; only its result and CQE
    /// wait for the response).
    pub reads: bool,
}

impl Demand {
    /// The demand of one WQE: `bytes` sent (WRITE), fetched (READ) or operated on (atomic).
    pub fn of(m: &Model, bytes: u64, read: bool, atomic: bool) -> Demand {
        let (sent_fs, returned_fs) = match (read, atomic) {
            (true, _) => (m.fs_per_msg, m.bytes_fs(bytes)),
            (false, true) => (m.message_fs(bytes), m.bytes_fs(bytes)),
            (false, false) => (m.message_fs(bytes), 0),
        };
        Demand {
            messages: 1,
            sent_fs,
            returned_fs,
            round_trip: read || atomic,
            reads: read,
        }
    }

    /// Adds `other` (another WQE of the same batch).
    pub fn add(&mut self, other: &Demand) {
        self.messages += other.messages;
        self.sent_fs = self.sent_fs.saturating_add(other.sent_fs);
        self.returned_fs = self.returned_fs.saturating_add(other.returned_fs);
        self.round_trip |= other.round_trip;
        self.reads |= other.reads;
    }

    /// When a batch of this demand, due (completed) at `due`, takes effect at the responder:
    /// one latency before the response a READ or an atomic waits for, so a WRITE and its signal
    /// land one latency after they are sent; a batch with a READ at `due` (its data lands at the
    /// requester).
    pub fn lands_ns(&self, m: &Model, due: u64) -> u64 {
        if self.round_trip && !self.reads {
            due.saturating_sub(m.latency_ns)
        } else {
            due
        }
    }
}

/// The engine clock (ns) `dev`'s port clock counts from: set once, by the first caller.
///
/// # Safety
/// `dev` is a live device context.
unsafe fn epoch(dev: *mut DeviceContext, now_ns: u64) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let e = field!(dev, model_epoch_ns);
        let seen = arch::load_relaxed_sys_u64(e);
        if seen != 0 {
            return seen;
        }
        // A moment before now, so no clock reading taken later maps below 0.
        let mine = now_ns.saturating_sub(1_000_000).max(1);
        match arch::atomic_cas_relaxed_sys_u64(e, 0, mine) {
            0 => mine,
            other => other,
        }
    }
}

/// What one engine thread knows of its device's port clocks from its own bookings in this pass:
/// each clock is at least where that thread's last booking on it ended (picoseconds, as the
/// clocks; 0: nothing booked yet). A clock only moves forward (`atom.max`, `atom.add`), so a
/// booking ready at or before its floor finds the port busy and needs no raise: one
/// read-modify-write instead of two, which is most bookings of a QP with a backlog (the batches
/// of a pass are all fetched at its start).
/// The one thing that lowers a clock is `set_rate_model` restarting it, which the host does only
/// while the device is idle (its contract), so no engine thread holds a floor across it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortFloor {
    /// The transmitter's (`port_free_ps`).
    pub tx_ps: u64,
    /// The receiver's (`port_rx_free_ps`).
    pub rx_ps: u64,
}

/// Reserves `ps` picoseconds of the port clock at `port` (a device's transmitter or receiver)
/// from engine time `ready_ns` on (or later, when it is busy); returns when the transfer ends, in
/// engine ns (rounded up), and the idle picoseconds the clock jumped over to reach `ready_ns` (0
/// when it was busy). One round trip: an idle clock is first raised to `ready` (its old value
/// comes back with the round trip, not waited for before the take), then `ps` is taken after
/// whatever is booked by then (every engine warp of a device books the one port; a
/// compare-and-swap loop serialized them on its round trips). No raise when `floor` (this
/// thread's knowledge of the clock, moved to the booking's end) already passes `ready`. The
/// price, stated: a booking may start later than its own `ready` when another warp raised an idle
/// clock first (the jumps are summed in `port_idle_ps`, see [`due_ns`]).
///
/// # Safety
/// `port` is a live port clock of a device whose clocks count from `epoch_ns`.
unsafe fn reserve(port: *mut u64, epoch_ns: u64, ready_ns: u64, ps: u64, floor: &mut u64) -> (u64, u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let ready_ps = ready_ns.saturating_sub(epoch_ns) * 1000;
        let (before, start) = if ready_ps <= *floor || arch::mutant(arch::Mutant::PortRaiseSkipped) {
            // The clock is past `ready` already: the take alone, which found it busy.
            let start = arch::atomic_add_relaxed_sys_u64(port, ps);
            (start, start)
        } else {
            // Same thread, same address: the add sees the max (coherence follows program order).
            let before = arch::atomic_max_relaxed_sys_u64(port, ready_ps);
            (before, arch::atomic_add_relaxed_sys_u64(port, ps))
        };
        *floor = start + ps;
        (epoch_ns + (start + ps).div_ceil(1000), ready_ps.saturating_sub(before))
    }
}

/// When (engine ns) a batch is due under `m`, its WQEs fetched at engine time `ready` (see
/// [`fetched_ns`]): reserves the requester's transmitter (`dev`'s `port_free_ps`) for what it
/// sends and, for READ data and atomic results, the requester's own receiver
/// (`port_rx_free_ps`) for what comes back.
///
/// Both clocks are `dev`'s: the engine never books a port of another device, whose engine may
/// run on another GPU with its own `%globaltimer` (two GPUs' timers differ by up to milliseconds,
/// and comparing them charged that offset to every round trip). The response shares the link's
/// receive direction with the responder's own WRITEs towards this device; each side books only its
/// own half, a stated simplification (under mixed traffic the receive side is under-charged, never
/// the sender).
///
/// # Safety
/// `dev` is a live device context.
///
/// The two bookings are made at once (both read-modify-writes in flight together, one round trip
/// to the clocks instead of two): the response is booked from `ready` plus the round trip, as if
/// its request left at `ready`. A request that queues behind others on the transmitter, or takes
/// its own few nanoseconds of port time, therefore has its response booked that much early on the
/// receiver (stated simplification, as above; the batch is never due before its request has
/// left, nor before its response has been received).
pub unsafe fn due_ns(m: &Model, dev: *mut DeviceContext, d: &Demand, ready: u64, floor: &mut PortFloor) -> u64 {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let tx = field!(dev, port_free_ps);
        let sent_ps = d.sent_fs.div_ceil(1000);
        let (end, idle_ps) = if d.returned_fs > 0 {
            // The response leaves the responder once the request arrived and is received one
            // latency later: book it on this device's receiver, in this device's clock.
            let rx = field!(dev, port_rx_free_ps);
            let back = 2 * m.latency_ns;
            let ((sent, idle), received) = reserve_both(
                (tx, ready, sent_ps),
                (rx, ready + back, d.returned_fs.div_ceil(1000)),
                m.epoch_ns,
                (&mut floor.tx_ps, &mut floor.rx_ps),
            );
            (sent.max(received - back), idle)
        } else {
            reserve(tx, m.epoch_ns, ready, sent_ps, &mut floor.tx_ps)
        };
        if idle_ps > 0 {
            // Fire and forget: the evidence of where the transmitter idled (`ModelStats`).
            arch::red_add_relaxed_sys_u64(field!(dev, port_idle_ps), idle_ps);
        }
        end + m.latency_ns * if d.round_trip { 2 } else { 1 }
    }
}

/// [`reserve`] on two port clocks at once, each `(port, ready_ns, ps)` with this thread's floor
/// for it: both raises (each only when its floor does not pass its `ready`), then both takes, so
/// the two round trips overlap. Returns when each transfer ends (engine ns), the first with the
/// idle picoseconds its clock jumped over.
///
/// # Safety
/// Both ports are live port clocks of a device whose clocks count from `epoch_ns`.
unsafe fn reserve_both(
    a: (*mut u64, u64, u64),
    b: (*mut u64, u64, u64),
    epoch_ns: u64,
    floors: (&mut u64, &mut u64),
) -> ((u64, u64), u64) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let ready_ps = |ns: u64| ns.saturating_sub(epoch_ns) * 1000;
        let skip = arch::mutant(arch::Mutant::PortRaiseSkipped);
        let raise_a = ready_ps(a.1) > *floors.0 && !skip;
        let before_a = if raise_a {
            arch::atomic_max_relaxed_sys_u64(a.0, ready_ps(a.1))
        } else {
            0
        };
        if ready_ps(b.1) > *floors.1 && !skip {
            arch::red_max_relaxed_sys_u64(b.0, ready_ps(b.1));
        }
        let start_a = arch::atomic_add_relaxed_sys_u64(a.0, a.2);
        let start_b = arch::atomic_add_relaxed_sys_u64(b.0, b.2);
        *floors.0 = start_a + a.2;
        *floors.1 = start_b + b.2;
        let idle_a = if raise_a {
            ready_ps(a.1).saturating_sub(before_a)
        } else {
            0
        };
        (
            (epoch_ns + (start_a + a.2).div_ceil(1000), idle_a),
            epoch_ns + (start_b + b.2).div_ceil(1000),
        )
    }
}

/// When (engine ns) WQEs the engine learns now are fetched: one fetch after `noticed_ns`, when
/// their doorbell was first seen (0: now). A NIC fetches the WQEs a doorbell exposes at once and
/// keeps transmitting while later ones are in flight, so a service pass takes this once for every
/// WQE it learned: its batches queue on the port one after another instead of each waiting a
/// fetch and a latency of its own. A doorbell rung while the engine waited for an earlier batch
/// to land was seen during that wait ([`wait_until`]), and counts from then.
pub fn fetched_ns(m: &Model, noticed_ns: u64) -> u64 {
    if m.on {
        let noticed = if noticed_ns != 0 {
            noticed_ns
        } else {
            arch::global_timer_ns()
        };
        noticed + m.fetch_ns
    } else {
        0
    }
}

/// What a waiting engine keeps an eye on: a QP's doorbell register, the value its pass learned
/// from, and the QP whose `watched_doorbell` fields record a new value and when it was first seen.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellWatch {
    /// The doorbell register.
    pub doorbell: *const u64,
    /// Its value when the pass read it.
    pub learned: u64,
    /// The QP (its `watched_doorbell` and `watched_doorbell_ns`).
    pub qp: *mut QpContext,
}

/// Waits (sleeping) until the global timer reaches `due`; records the wait in `dev`'s statistics
/// (with `messages` paced WQEs). Meanwhile it watches `watch`'s doorbell: a new value is recorded
/// in the QP's `watched_doorbell` with the time it was first seen (see [`fetched_ns`]), so a WQE
/// posted during the wait is not charged the rest of the wait (a ConnectX would have fetched it
/// then).
///
/// # Safety
/// `dev` is a live device context; `watch` names a live QP and its doorbell register, serviced
/// by the caller.
pub unsafe fn wait_until(dev: *mut DeviceContext, due: u64, messages: u64, watch: &DoorbellWatch) {
    // SAFETY: this function's `# Safety` contract, which its callers uphold, covers every operation in it.
    unsafe {
        let start = arch::global_timer_ns();
        let mut now = start;
        if now < due {
            let (seen_at, seen_ns_at) = (
                field!(watch.qp, watched_doorbell),
                field!(watch.qp, watched_doorbell_ns),
            );
            let mut seen = arch::load_relaxed_sys_u64(seen_at);
            let mut seen_ns = arch::load_relaxed_sys_u64(seen_ns_at);
            while now < due {
                arch::nanosleep((due - now).min(1000) as u32);
                now = arch::global_timer_ns();
                let reg = arch::load_relaxed_sys_u64(watch.doorbell);
                if reg != watch.learned && (reg != seen || seen_ns == 0) {
                    // The time read after the load that saw it (behind the branch on its
                    // value), so never before the doorbell was rung.
                    let at = arch::global_timer_ns();
                    (seen, seen_ns) = (reg, at);
                    arch::store_relaxed_sys_u64(seen_ns_at, at);
                    arch::store_relaxed_sys_u64(seen_at, reg);
                }
            }
        }
        arch::red_add_relaxed_sys_u64(field!(dev, model_wqes), messages);
        if now > start {
            arch::red_add_relaxed_sys_u64(field!(dev, model_wait_ns), now - start);
        }
    }
}

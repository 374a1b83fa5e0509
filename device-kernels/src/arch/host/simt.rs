//! Warps and blocks of CPU threads: the SIMT half of the host emulation.
//!
//! [`run_block`] runs one emulated block as `threads` CPU threads. Consecutive threads form warps
//! of [`warp_size`](super::warp_size) lanes (32, or the block's thread count when a block is
//! smaller: a narrow warp, so cheap one-thread blocks keep working); a block whose size is not a
//! multiple of the width ends with a partial warp, as on a GPU. Every warp collective is a
//! rendezvous of the lanes it names, through one mutex-and-condvar per warp:
//!
//! - `ballot`, `shfl`, `match_any`, `sync_warp`/`sync_lanes` are *exchanges*: each lane of the
//!   mask deposits a value and leaves with everyone's, once every live lane of the mask has come.
//!   The k-th exchange a lane makes with a given mask pairs with the k-th of the other lanes, as
//!   the `.sync` instructions pair on a GPU.
//! - `activemask` is a *gathering*: the lanes that arrive together at the same call site (all
//!   live lanes, or those that came within [`GATHER_WINDOW`]) get the same mask, which is what a
//!   GPU guarantees (a set of converged lanes, at one instruction, that includes the caller) and
//!   no more. Lanes at two call sites are two gatherings, as lanes at two instructions are
//!   diverged on a GPU; the site is the caller's (`#[track_caller]`), so a helper that calls it
//!   for its callers is one site for all of them.
//! - `sync_threads`/`sync_threads_or` are a block barrier over the live threads.
//!
//! Lanes that returned count as arrived (the hardware treats exited threads so). A lane that
//! panics (a device trap) aborts the block: lanes waiting in a collective unwind without a second
//! report, and the runner returns the first panic. A collective that waits longer than
//! [`COLLECTIVE_TIMEOUT`] panics naming the block, the warp, the operation and the missing lanes,
//! instead of hanging.

extern crate std;

use std::boxed::Box;
use std::cell::Cell;
use std::format;
use std::string::String;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use std::vec::Vec;

/// The widest warp, as on every NVIDIA GPU.
pub const MAX_WARP_SIZE: u32 = 32;

/// How long lanes wait for the rest of their warp at an `activemask` before the group closes.
pub const GATHER_WINDOW: Duration = Duration::from_millis(2);

/// How long a lane waits at a collective before the emulation reports the lanes that never came.
/// Longer than any device-wait timeout a test uses, so a lane stuck in a timed device wait is
/// reported by that wait, not by its warp.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a waiting lane looks for an abort or a timeout between wake-ups.
const WAKE_CHECK: Duration = Duration::from_millis(50);

/// What one CPU thread is in the emulated grid.
#[derive(Clone, Copy)]
struct Lane {
    block: *const Block,
    thread: u32,
    block_idx: u32,
    grid_dim: u32,
    block_dim: u32,
    width: u32,
}

/// A thread that no runner started (a test calling device code directly, an engine thread): a
/// block of one thread in a grid of one, with a warp of one lane.
const SOLO: Lane = Lane {
    block: core::ptr::null(),
    thread: 0,
    block_idx: 0,
    grid_dim: 1,
    block_dim: 1,
    width: 1,
};

std::thread_local! {
    static LANE: Cell<Lane> = const { Cell::new(SOLO) };
}

#[inline(always)]
fn lane() -> Lane {
    LANE.with(|l| l.get())
}

/// Sets the block index and grid size a solo thread (one not started by [`run_block`]) reports.
pub fn set_emulated_block(block_idx: u32, grid_dim: u32) {
    LANE.with(|l| {
        l.set(Lane {
            block_idx,
            grid_dim,
            ..l.get()
        })
    });
}

/// This thread's index in its block.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    lane().thread
}
/// Threads per block.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    lane().block_dim
}
/// This block's index.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    lane().block_idx
}
/// Blocks in the grid.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    lane().grid_dim
}
/// Lanes per warp in this launch: 32, or the block size for blocks smaller than that.
#[inline(always)]
pub fn warp_size() -> u32 {
    lane().width
}
/// This thread's lane in its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    let l = lane();
    l.thread % l.width
}
/// The lanes below this one.
#[inline(always)]
pub fn lanemask_lt() -> u32 {
    (1u32 << lane_id()) - 1
}

/// Every lane of this thread's warp (`-1` in a `.sync` instruction).
fn full_mask(width: u32) -> u32 {
    if width >= 32 {
        u32::MAX
    } else {
        (1u32 << width) - 1
    }
}

/// Unwinds a lane whose block was aborted by another lane's panic, without a second report.
struct Aborted;

/// One round of an exchange among the lanes of `mask`.
struct Round {
    mask: u32,
    arrived: u32,
    done: bool,
    left: u32,
    values: [u64; MAX_WARP_SIZE as usize],
}

/// The lanes that met at one `activemask`.
struct Gathering {
    /// Where `activemask` was called: only lanes at one site gather.
    site: &'static core::panic::Location<'static>,
    members: u32,
    opened: Instant,
    closed: bool,
    left: u32,
}

struct WarpState {
    live: u32,
    rounds: Vec<Round>,
    gatherings: Vec<Gathering>,
}

struct Warp {
    state: Mutex<WarpState>,
    changed: Condvar,
}

struct BarrierState {
    live: u32,
    arrived: u32,
    any: bool,
    generation: u64,
    last_any: bool,
}

/// One emulated block: its warps and its barrier.
struct Block {
    idx: u32,
    width: u32,
    warps: Box<[Warp]>,
    barrier: Mutex<BarrierState>,
    barrier_changed: Condvar,
    /// The first lane that panicked, with its message.
    aborted: Mutex<Option<(u32, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A lane that panicked while holding a warp lock has already aborted the block; its state is
    // still consistent (every update is a few assignments), so poisoning carries no information.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Block {
    fn is_aborted(&self) -> bool {
        lock(&self.aborted).is_some()
    }

    fn unwind_if_aborted(&self) {
        if self.is_aborted() {
            std::panic::resume_unwind(Box::new(Aborted));
        }
    }

    /// Waits on `cv` until `ready` holds, unwinding if the block aborts and panicking with
    /// `what()` past the collective timeout.
    fn wait_until<'a, T>(
        &self,
        cv: &Condvar,
        poll: Duration,
        mut guard: MutexGuard<'a, T>,
        mut ready: impl FnMut(&mut T) -> bool,
        what: impl Fn(&T) -> String,
    ) -> MutexGuard<'a, T> {
        let start = Instant::now();
        loop {
            // An aborted block stops at once, even where the trapping lane's exit completed the
            // collective: the data it would return is what a dead lane left.
            if self.is_aborted() {
                drop(guard);
                std::panic::resume_unwind(Box::new(Aborted));
            }
            if ready(&mut guard) {
                break;
            }
            let waited = start.elapsed();
            if waited > COLLECTIVE_TIMEOUT {
                let msg = what(&guard);
                drop(guard);
                panic!("{msg}, after {waited:?}: the emulated GPU would hang here");
            }
            guard = cv.wait_timeout(guard, poll).unwrap_or_else(|e| e.into_inner()).0;
        }
        guard
    }

    fn warp_of(&self, thread: u32) -> (&Warp, u32) {
        (&self.warps[(thread / self.width) as usize], thread % self.width)
    }
}

/// Deposits `value` in this lane's slot of an exchange among `mask` and returns every
/// participant's value with the participants (the lanes of `mask` still live when it completed).
fn exchange(op: &str, mask: u32, value: u64) -> ([u64; MAX_WARP_SIZE as usize], u32) {
    let l = lane();
    if l.block.is_null() {
        // A solo thread is a warp of one lane.
        let mut values = [0; MAX_WARP_SIZE as usize];
        values[0] = value;
        return (values, 1);
    }
    // SAFETY: `run_block` keeps the block alive until every lane thread has been joined.
    let block = unsafe { &*l.block };
    block.unwind_if_aborted();
    let (warp, me) = block.warp_of(l.thread);
    let bit = 1u32 << me;
    assert!(
        mask & bit != 0,
        "{op} with mask {mask:#x} called by lane {me} of warp {} in block {}, which the mask leaves out \
         (undefined on a GPU)",
        l.thread / l.width,
        block.idx
    );
    let mut s = lock(&warp.state);
    let idx = match s
        .rounds
        .iter()
        .position(|r| r.mask == mask && !r.done && r.arrived & bit == 0)
    {
        Some(i) => i,
        None => {
            s.rounds.push(Round {
                mask,
                arrived: 0,
                done: false,
                left: 0,
                values: [0; MAX_WARP_SIZE as usize],
            });
            s.rounds.len() - 1
        }
    };
    let round = &mut s.rounds[idx];
    round.values[me as usize] = value;
    round.arrived |= bit;
    complete_rounds(&mut s);
    warp.changed.notify_all();
    // A lane is in one round at a time, so "the done round holding my arrival and not my leaving"
    // names ours (rounds before it may have been removed since, moving its index).
    let mut s = block.wait_until(
        &warp.changed,
        WAKE_CHECK,
        s,
        |s| {
            s.rounds
                .iter()
                .any(|r| r.mask == mask && r.done && r.arrived & bit != 0 && r.left & bit == 0)
        },
        |s| {
            let missing = s
                .rounds
                .iter()
                .find(|r| r.mask == mask && !r.done && r.arrived & bit != 0)
                .map_or(0, |r| r.mask & s.live & !r.arrived);
            format!(
                "{op}: lanes {missing:#x} of warp {} in block {} never reached it (mask {mask:#x})",
                l.thread / l.width,
                block.idx
            )
        },
    );
    let i = s
        .rounds
        .iter()
        .position(|r| r.mask == mask && r.done && r.arrived & bit != 0 && r.left & bit == 0)
        .expect("the completed round we waited for");
    let r = &mut s.rounds[i];
    r.left |= bit;
    let out = (r.values, r.arrived);
    if r.left == r.arrived {
        s.rounds.remove(i);
    }
    out
}

/// Marks every round whose live lanes have all arrived as done.
fn complete_rounds(s: &mut WarpState) {
    let live = s.live;
    for r in s.rounds.iter_mut().filter(|r| !r.done) {
        if r.mask & live & !r.arrived == 0 {
            r.done = true;
        }
    }
    for g in s.gatherings.iter_mut().filter(|g| !g.closed) {
        if live & !g.members == 0 {
            g.closed = true;
        }
    }
}

/// `vote.sync.ballot` over the whole warp.
pub fn ballot(pred: bool) -> u32 {
    let (values, participants) = exchange("ballot", full_mask(warp_size()), pred as u64);
    (0..MAX_WARP_SIZE)
        .filter(|&i| participants & (1 << i) != 0 && values[i as usize] != 0)
        .fold(0, |m, i| m | (1 << i))
}

/// `vote.sync.ballot` over `mask`.
///
/// # Safety
/// As [`sync_lanes`].
pub unsafe fn ballot_masked(mask: u32, pred: bool) -> u32 {
    let (values, participants) = exchange("ballot", mask, pred as u64);
    (0..MAX_WARP_SIZE)
        .filter(|&i| participants & (1 << i) != 0 && values[i as usize] != 0)
        .fold(0, |m, i| m | (1 << i))
}

/// `redux.sync.add.u32` over the whole warp: the wrapping sum of every lane's `v`.
pub fn redux_add_u32(v: u32) -> u32 {
    let (values, participants) = exchange("redux_add", full_mask(warp_size()), v as u64);
    (0..MAX_WARP_SIZE)
        .filter(|&i| participants & (1 << i) != 0)
        .fold(0u32, |s, i| s.wrapping_add(values[i as usize] as u32))
}

/// `bar.warp.sync -1`.
pub fn sync_warp() {
    exchange("sync_warp", full_mask(warp_size()), 0);
}

/// `bar.warp.sync mask`.
///
/// # Safety
/// As on the GPU: the calling lane is in `mask` and every lane of `mask` reaches this call. (The
/// emulation panics instead of misbehaving, but the contract is the GPU's.)
pub unsafe fn sync_lanes(mask: u32) {
    exchange("sync_lanes", mask, 0);
}

fn shuffled(op: &str, mask: u32, v: u64, src_lane: u32) -> u64 {
    let (values, participants) = exchange(op, mask, v);
    let src = src_lane % warp_size();
    assert!(
        participants & (1 << src) != 0,
        "{op}: source lane {src} is not among the participating lanes {participants:#x} (undefined on a GPU)"
    );
    values[src as usize]
}

/// `shfl.sync.idx` over the whole warp.
pub fn shfl_idx_u32(v: u32, src_lane: u32) -> u32 {
    shuffled("shfl_idx", full_mask(warp_size()), v as u64, src_lane) as u32
}
/// Both halves in one exchange (two shuffles on a GPU).
pub fn shfl_idx_u64(v: u64, src_lane: u32) -> u64 {
    shuffled("shfl_idx", full_mask(warp_size()), v, src_lane)
}
/// `shfl.sync.idx` over `mask`.
///
/// # Safety
/// As [`sync_lanes`].
pub unsafe fn shfl_idx_masked_u32(mask: u32, v: u32, src_lane: u32) -> u32 {
    shuffled("shfl_idx", mask, v as u64, src_lane) as u32
}

/// `match.any.sync.b64` over `mask`: the participants whose `v` equals this lane's.
///
/// # Safety
/// As [`sync_lanes`].
pub unsafe fn match_any_u64(mask: u32, v: u64) -> u32 {
    let (values, participants) = exchange("match_any", mask, v);
    (0..MAX_WARP_SIZE)
        .filter(|&i| participants & (1 << i) != 0 && values[i as usize] == v)
        .fold(0, |m, i| m | (1 << i))
}

/// `activemask`: the lanes that meet at this call site together (see the module doc).
#[track_caller]
pub fn active_mask() -> u32 {
    let site = core::panic::Location::caller();
    let l = lane();
    if l.block.is_null() {
        return 1;
    }
    // SAFETY: as in `exchange`.
    let block = unsafe { &*l.block };
    block.unwind_if_aborted();
    let (warp, me) = block.warp_of(l.thread);
    let bit = 1u32 << me;
    let mut s = lock(&warp.state);
    let open = |g: &Gathering| !g.closed && g.site == site;
    if !s.gatherings.iter().any(open) {
        s.gatherings.push(Gathering {
            site,
            members: 0,
            opened: Instant::now(),
            closed: false,
            left: 0,
        });
    }
    let g = s.gatherings.iter_mut().find(|g| open(g)).expect("an open gathering");
    g.members |= bit;
    complete_rounds(&mut s);
    warp.changed.notify_all();
    let mine = |s: &mut WarpState| {
        s.gatherings
            .iter()
            .position(|g| g.members & bit != 0 && g.left & bit == 0)
    };
    let mut s = block.wait_until(
        &warp.changed,
        GATHER_WINDOW / 4,
        s,
        |s| {
            let i = mine(s).expect("this lane's gathering");
            let g = &mut s.gatherings[i];
            if !g.closed && g.opened.elapsed() >= GATHER_WINDOW {
                g.closed = true;
            }
            g.closed
        },
        |_| format!("activemask in block {}", block.idx),
    );
    let i = mine(&mut s).expect("this lane's gathering");
    let g = &mut s.gatherings[i];
    g.left |= bit;
    let members = g.members;
    if g.left == g.members {
        s.gatherings.remove(i);
    }
    // Other lanes may be waiting for the window of a gathering we just closed.
    warp.changed.notify_all();
    members
}

/// `bar.sync 0` over the live threads of the block, returning whether `pred` held in any.
pub fn sync_threads_or(pred: bool) -> bool {
    let l = lane();
    if l.block.is_null() {
        return pred;
    }
    // SAFETY: as in `exchange`.
    let block = unsafe { &*l.block };
    block.unwind_if_aborted();
    let mut b = lock(&block.barrier);
    b.arrived += 1;
    b.any |= pred;
    let generation = b.generation;
    release_barrier(&mut b);
    block.barrier_changed.notify_all();
    let b = block.wait_until(
        &block.barrier_changed,
        WAKE_CHECK,
        b,
        |b| b.generation != generation,
        |b| {
            format!(
                "sync_threads: {} of the {} live threads of block {} never reached it",
                b.live - b.arrived,
                b.live,
                block.idx
            )
        },
    );
    b.last_any
}

fn release_barrier(b: &mut BarrierState) {
    if b.arrived > 0 && b.arrived >= b.live {
        b.last_any = b.any;
        b.any = false;
        b.arrived = 0;
        b.generation += 1;
    }
}

/// Runs one emulated block of `threads` threads (block `block_idx` of `grid_dim`), each a CPU
/// thread calling `body`, and joins them. Returns the first panic as `(thread, message)`; the
/// other lanes of a block that panicked unwind at their next collective without a report of
/// their own.
pub fn run_block(block_idx: u32, grid_dim: u32, threads: u32, body: &(dyn Fn() + Sync)) -> Option<(u32, String)> {
    assert!(threads >= 1, "a block needs at least one thread");
    let width = threads.min(MAX_WARP_SIZE);
    assert!(
        threads >= MAX_WARP_SIZE || threads.is_power_of_two(),
        "an emulated block smaller than a warp needs a power-of-two thread count (it is one narrow warp), got {threads}"
    );
    let warps = threads.div_ceil(width);
    let block = Block {
        idx: block_idx,
        width,
        warps: (0..warps)
            .map(|w| Warp {
                state: Mutex::new(WarpState {
                    live: full_mask(threads.saturating_sub(w * width).min(width)),
                    rounds: Vec::new(),
                    gatherings: Vec::new(),
                }),
                changed: Condvar::new(),
            })
            .collect(),
        barrier: Mutex::new(BarrierState {
            live: threads,
            arrived: 0,
            any: false,
            generation: 0,
            last_any: false,
        }),
        barrier_changed: Condvar::new(),
        aborted: Mutex::new(None),
    };
    let run_lane = |thread: u32| {
        let me = Lane {
            block: &block,
            thread,
            block_idx,
            grid_dim,
            block_dim: threads,
            width,
        };
        LANE.with(|l| l.set(me));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        LANE.with(|l| l.set(SOLO));
        if let Err(payload) = outcome {
            if !payload.is::<Aborted>() {
                let mut first = lock(&block.aborted);
                if first.is_none() {
                    *first = Some((thread, panic_message(payload.as_ref())));
                }
            }
        }
        exit_lane(&block, thread);
    };
    if threads == 1 {
        run_lane(0);
    } else {
        std::thread::scope(|s| {
            for t in 0..threads {
                let run_lane = &run_lane;
                std::thread::Builder::new()
                    .name(format!("emu-block{block_idx}-t{t}"))
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || run_lane(t))
                    .expect("spawning an emulated lane thread");
            }
        });
    }
    block.aborted.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Marks `thread` as exited: collectives waiting only for it complete, and every waiter wakes (to
/// notice an abort too).
fn exit_lane(block: &Block, thread: u32) {
    let (warp, me) = block.warp_of(thread);
    let mut s = lock(&warp.state);
    s.live &= !(1 << me);
    complete_rounds(&mut s);
    drop(s);
    warp.changed.notify_all();
    let mut b = lock(&block.barrier);
    b.live -= 1;
    release_barrier(&mut b);
    drop(b);
    block.barrier_changed.notify_all();
    if block.is_aborted() {
        for w in block.warps.iter() {
            let _guard = lock(&w.state);
            w.changed.notify_all();
        }
    }
}

/// The text of a panic payload.
pub fn panic_message(e: &(dyn core::any::Any + Send)) -> String {
    e.downcast_ref::<&str>()
        .map(|s| String::from(*s))
        .or_else(|| e.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| String::from("non-string panic"))
}

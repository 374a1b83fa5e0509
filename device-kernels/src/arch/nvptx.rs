//! nvptx64 primitives: every instruction whose ordering or scope matters is spelled out in `asm!`.
//!
//! rustc 1.96 / LLVM 22 lowers `fetch_add`, `fetch_max` and `swap` on nvptx to `atom.global.*`
//! with PTX's default `.relaxed.gpu`, silently dropping the requested ordering and the system scope
//! (rust-lang/rust#136480). Anything another agent observes (a peer GPU over NVLink, the CPU, a NIC)
//! therefore goes through the wrappers below, which name `.sem` and `.scope` explicitly.
//!
//! Every `asm!` here is volatile and a compiler memory barrier (the default), except the pure
//! register reads marked `nomem`.
//!
//! # Safety (module-wide)
//! Functions taking a raw pointer require it to be a valid, suitably aligned global-memory address
//! (device memory, a peer's mapped heap, or host-mapped pinned memory) for the access width.

use core::arch::asm;

macro_rules! special_reg_u32 {
    ($(#[$m:meta])* $name:ident, $reg:literal) => {
        $(#[$m])*
        #[inline(always)]
        pub fn $name() -> u32 {
            let r: u32;
            // SAFETY: reads a special register; no memory access.
            unsafe { asm!(concat!("mov.u32 {r}, ", $reg, ";"), r = out(reg32) r, options(nomem, nostack, preserves_flags)) };
            r
        }
    };
}

special_reg_u32!(/// `%tid.x`
    thread_idx_x, "%tid.x");
special_reg_u32!(/// `%tid.y`
    thread_idx_y, "%tid.y");
special_reg_u32!(/// `%tid.z`
    thread_idx_z, "%tid.z");
special_reg_u32!(/// `%ntid.x`
    block_dim_x, "%ntid.x");
special_reg_u32!(/// `%ntid.y`
    block_dim_y, "%ntid.y");
special_reg_u32!(/// `%ntid.z`
    block_dim_z, "%ntid.z");
special_reg_u32!(/// `%ctaid.x`
    block_idx_x, "%ctaid.x");
special_reg_u32!(/// `%nctaid.x`
    grid_dim_x, "%nctaid.x");
special_reg_u32!(/// `%laneid`
    lane_id, "%laneid");

/// Threads per warp (a function so that the CPU emulation can run narrow warps; a constant here).
#[inline(always)]
pub const fn warp_size() -> u32 {
    32
}

/// An instruction without operands whose only effect is ordering or waiting (a fence, a barrier,
/// a bulk-group commit or wait), as a safe function: `$safety` says why it is safe to run anywhere
/// the callers' contracts (every lane or thread reaching a barrier) hold.
macro_rules! nullary {
    ($(#[$m:meta])* $name:ident, $instr:literal, $safety:literal) => {
        $(#[$m])*
        ///
        #[doc = concat!("Safe: ", $safety)]
        #[inline(always)]
        pub fn $name() {
            // SAFETY: no operands and no access beyond the ordering or wait it names; the doc line
            // above states what the callers guarantee.
            unsafe { asm!($instr, options(nostack)) };
        }
    };
}

/// `%globaltimer`: a nanosecond clock shared by the whole GPU.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let r: u64;
    // SAFETY: reads a special register. Volatile (no `pure`) so each call re-reads the clock.
    unsafe { asm!("mov.u64 {r}, %globaltimer;", r = out(reg64) r, options(nostack, preserves_flags)) };
    r
}

/// `%clock64`: this SM's cycle counter (for the engine's phase counters; not comparable across
/// SMs).
#[inline(always)]
pub fn clock64() -> u64 {
    let r: u64;
    // SAFETY: reads a special register. Volatile (no `pure`) so each call re-reads the clock.
    unsafe { asm!("mov.u64 {r}, %clock64;", r = out(reg64) r, options(nostack, preserves_flags)) };
    r
}

// Block barriers use the non-`.aligned` forms. Rust does not mark inline `asm!` convergent, so
// LLVM may copy a barrier into both arms of a branch on the thread index; lanes of one warp then
// reach different copies. The `.aligned` forms (`bar.sync`, `bar.red`) leave that undefined (it
// hung the block of a GPU kernel whose CPU emulation passed, `docs/known-bugs.md`); the plain
// `barrier.sync` / `barrier.red` count each thread's arrival wherever it comes from, so such a copy
// is harmless. `nvptx-builder`'s PTX lint rejects the aligned forms.
nullary!(
    /// `barrier.sync 0`: all threads of the block. Every thread of the block must reach it once
    /// per call (a block hangs otherwise); it may do so from divergent code.
    sync_threads, "barrier.sync 0;", "a barrier; callers guarantee every thread of the block reaches it."
);

/// `barrier.red.or.pred 0`: a block barrier that also returns whether `pred` held in any thread.
/// Every thread of the block must reach it (from divergent code too).
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    // SAFETY: a barrier; callers guarantee every thread of the block reaches it.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; barrier.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
             v = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// `redux.sync.add.u32` over the whole warp (sm_80 and later): the wrapping sum of every lane's
/// `v`, in every lane, in one instruction where a butterfly of shuffles takes five dependent rounds.
#[inline(always)]
pub fn redux_add_u32(v: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee all 32 lanes reach it.
    unsafe { asm!("redux.sync.add.u32 {r}, {v}, -1;", v = in(reg32) v, r = out(reg32) r, options(nostack)) };
    r
}

/// `vote.sync.ballot.b32` over the full warp: bit `i` is lane `i`'s `pred`. Every lane of the
/// warp must reach it.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee all 32 lanes reach it.
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {v}, 0; vote.sync.ballot.b32 {r}, p, -1; }}",
             v = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r
}

nullary!(
    /// `bar.warp.sync 0xffffffff`: all lanes of the warp, every one of which must reach it.
    sync_warp, "bar.warp.sync -1;", "callers guarantee all 32 lanes reach it."
);

/// `shfl.sync.idx.b32` over the full warp: lane `src_lane`'s `v`, in every lane. Every lane of
/// the warp must reach it.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src_lane: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee all 32 lanes reach it.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {l}, 0x1f, -1;", r = out(reg32) r, v = in(reg32) v, l = in(reg32) src_lane,
             options(nostack))
    };
    r
}

/// [`shfl_idx_u32`] for a `u64` (two shuffles).
#[inline(always)]
pub fn shfl_idx_u64(v: u64, src_lane: u32) -> u64 {
    let lo = shfl_idx_u32(v as u32, src_lane) as u64;
    let hi = shfl_idx_u32((v >> 32) as u32, src_lane) as u64;
    lo | (hi << 32)
}

/// `activemask.b32`: the lanes of this warp executing this instruction together.
#[inline(always)]
pub fn active_mask() -> u32 {
    let r: u32;
    // SAFETY: reads the active mask; no memory access.
    unsafe { asm!("activemask.b32 {r};", r = out(reg32) r, options(nostack)) };
    r
}

/// `%lanemask_lt`: the lanes below this one.
#[inline(always)]
pub fn lanemask_lt() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %lanemask_lt;", r = out(reg32) r, options(nomem, nostack, preserves_flags)) };
    r
}

/// `match.any.sync.b64` over `mask`: the lanes of `mask` whose `v` equals this lane's.
/// # Safety
/// The calling lane is in `mask`, and every lane of `mask` reaches this same call (PTX leaves a
/// `.sync` instruction undefined otherwise).
#[inline(always)]
pub unsafe fn match_any_u64(mask: u32, v: u64) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee every lane of `mask` reaches it.
    unsafe {
        asm!("match.any.sync.b64 {r}, {v}, {m};", r = out(reg32) r, v = in(reg64) v, m = in(reg32) mask,
             options(nostack))
    };
    r
}

/// `shfl.sync.idx.b32` over `mask`: lane `src_lane`'s `v` (which must be in `mask`).
/// # Safety
/// The calling lane is in `mask`, and every lane of `mask` reaches this same call (PTX leaves a
/// `.sync` instruction undefined otherwise).
#[inline(always)]
pub unsafe fn shfl_idx_masked_u32(mask: u32, v: u32, src_lane: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee every lane of `mask` reaches it.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {l}, 0x1f, {m};", r = out(reg32) r, v = in(reg32) v, l = in(reg32) src_lane,
             m = in(reg32) mask, options(nostack))
    };
    r
}

/// `vote.sync.ballot.b32` over `mask`: bit `i` is lane `i`'s `pred`, for the lanes of `mask`.
/// # Safety
/// The calling lane is in `mask`, and every lane of `mask` reaches this same call (PTX leaves a
/// `.sync` instruction undefined otherwise).
#[inline(always)]
pub unsafe fn ballot_masked(mask: u32, pred: bool) -> u32 {
    let r: u32;
    // SAFETY: register-only; callers guarantee every lane of `mask` reaches it.
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {v}, 0; vote.sync.ballot.b32 {r}, p, {m}; }}",
             v = in(reg32) pred as u32, r = out(reg32) r, m = in(reg32) mask, options(nostack))
    };
    r
}

/// `bar.warp.sync mask`: waits for the lanes of `mask` (memory ordering among them).
/// # Safety
/// The calling lane is in `mask`, and every lane of `mask` reaches this same call (PTX leaves a
/// `.sync` instruction undefined otherwise).
#[inline(always)]
pub unsafe fn sync_lanes(mask: u32) {
    // SAFETY: callers guarantee every lane of `mask` reaches it.
    unsafe { asm!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack)) };
}

/// `nanosleep.u32`: back off a spinning thread.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory access.
    unsafe { asm!("nanosleep.u32 {ns};", ns = in(reg32) ns, options(nostack)) };
}

nullary!(
    /// `fence.sc.sys` (= `membar.sys`, CUDA's `__threadfence_system`): orders every prior access of this
    /// thread before every later one, as seen by all agents in the system.
    fence_sc_sys, "fence.sc.sys;", "a fence."
);

nullary!(
    /// `fence.acq_rel.sys`: a lighter system-scope fence (release for prior writes, acquire for later
    /// reads).
    fence_acq_rel_sys, "fence.acq_rel.sys;", "a fence."
);

nullary!(
    /// `fence.sc.gpu` (CUDA's `__threadfence`): orders every prior access of this thread before
    /// every later one, as seen by every thread of this GPU (and a NIC reading this GPU's memory
    /// after a doorbell, as NVSHMEM's GPU-memory queues rely on).
    fence_sc_gpu, "fence.sc.gpu;", "a fence."
);

nullary!(
    /// `fence.acq_rel.gpu`: the GPU-scope form of [`fence_acq_rel_sys`].
    fence_acq_rel_gpu, "fence.acq_rel.gpu;", "a fence."
);

macro_rules! load {
    ($(#[$m:meta])* $name:ident, $ty:ty, $cls:ident, $instr:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *const $ty) -> $ty {
            let v: $ty;
            // SAFETY: the module contract (a valid, aligned address of the right state space
            // for the access) is this function's `# Safety` section, which the caller upholds.
            unsafe {
                asm!(concat!($instr, " {v}, [{p}];"), v = out($cls) v, p = in(reg64) p, options(nostack));
            }
            v
        }
    };
}

macro_rules! store {
    ($(#[$m:meta])* $name:ident, $ty:ty, $cls:ident, $instr:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) {
            // SAFETY: the module contract (a valid, aligned address of the right state space
            // for the access) is this function's `# Safety` section, which the caller upholds.
            unsafe {
                asm!(concat!($instr, " [{p}], {v};"), p = in(reg64) p, v = in($cls) v, options(nostack));
            }
        }
    };
}

load!(/// `ld.acquire.sys` of a `u64`.
    load_acquire_sys_u64, u64, reg64, "ld.acquire.sys.u64");
load!(/// `ld.acquire.sys` of a `u32`.
    load_acquire_sys_u32, u32, reg32, "ld.acquire.sys.u32");
load!(/// `ld.relaxed.sys` of a `u64` (a load that is never cached stale and never torn).
    load_relaxed_sys_u64, u64, reg64, "ld.relaxed.sys.u64");
load!(/// `ld.relaxed.sys` of a `u32`.
    load_relaxed_sys_u32, u32, reg32, "ld.relaxed.sys.u32");
store!(/// `st.release.sys` of a `u64`.
    store_release_sys_u64, u64, reg64, "st.release.sys.u64");
store!(/// `st.release.sys` of a `u32`.
    store_release_sys_u32, u32, reg32, "st.release.sys.u32");
store!(/// `st.relaxed.sys` of a `u64`.
    store_relaxed_sys_u64, u64, reg64, "st.relaxed.sys.u64");
store!(/// `st.relaxed.sys` of a `u32`.
    store_relaxed_sys_u32, u32, reg32, "st.relaxed.sys.u32");
load!(/// `ld.acquire.gpu` of a `u64`.
    load_acquire_gpu_u64, u64, reg64, "ld.acquire.gpu.u64");
load!(/// `ld.relaxed.gpu` of a `u64`.
    load_relaxed_gpu_u64, u64, reg64, "ld.relaxed.gpu.u64");
store!(/// `st.release.gpu` of a `u64`.
    store_release_gpu_u64, u64, reg64, "st.release.gpu.u64");
store!(/// `st.release.gpu` of a `u32`.
    store_release_gpu_u32, u32, reg32, "st.release.gpu.u32");
store!(/// `st.relaxed.gpu` of a `u64`.
    store_relaxed_gpu_u64, u64, reg64, "st.relaxed.gpu.u64");

/// The start of every atomic's and reduction's `asm!`: the address `{p}` converted to the global
/// window (`cvta.to.global`, free) as `g`, which the instruction then uses with `.global`. A
/// generic `atom` or `red` compiles to an atomic whose result the thread checks for a shared or
/// local address before it goes on (a round trip even for a `red`, whose old value nobody needs),
/// and a fallback loop; the module contract already promises a global address.
macro_rules! to_global {
    () => {
        "{{ .reg .b64 g; cvta.to.global.u64 g, {p}; "
    };
}

/// A reduction (`red`): a read-modify-write whose old value nobody needs.
macro_rules! red {
    ($(#[$m:meta])* $name:ident, $ty:ty, $cls:ident, $instr:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) {
            // SAFETY: the module contract (a valid, aligned global-memory address for the access)
            // is this function's `# Safety` section, which the caller upholds.
            unsafe {
                asm!(concat!(to_global!(), $instr, " [g], {v}; }}"), p = in(reg64) p, v = in($cls) v, options(nostack));
            }
        }
    };
}

red!(/// `red.relaxed.sys.add.u64`: an add whose old value nobody needs, so the thread does not
    /// wait for the round trip.
    red_add_relaxed_sys_u64, u64, reg64, "red.relaxed.sys.global.add.u64");
red!(/// `red.relaxed.sys.add.u32` (see [`red_add_relaxed_sys_u64`]).
    red_add_relaxed_sys_u32, u32, reg32, "red.relaxed.sys.global.add.u32");
red!(/// `red.relaxed.sys.max.u64` (see [`red_add_relaxed_sys_u64`]).
    red_max_relaxed_sys_u64, u64, reg64, "red.relaxed.sys.global.max.u64");
red!(/// `red.release.sys.max.u64`: a max that releases the thread's earlier accesses and does not
    /// wait for the round trip.
    red_max_release_sys_u64, u64, reg64, "red.release.sys.global.max.u64");
red!(/// `red.release.gpu.max.u64`: the GPU-scope form of [`red_max_release_sys_u64`].
    red_max_release_gpu_u64, u64, reg64, "red.release.gpu.global.max.u64");
red!(/// `red.relaxed.gpu.max.u64`: the GPU-scope form of [`red_max_relaxed_sys_u64`].
    red_max_relaxed_gpu_u64, u64, reg64, "red.relaxed.gpu.global.max.u64");

macro_rules! atom_rmw {
    ($(#[$m:meta])* $name:ident, $ty:ty, $cls:ident, $instr:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, v: $ty) -> $ty {
            let old: $ty;
            // SAFETY: the module contract (a valid, aligned global-memory address for the access:
            // `to_global!` converts it, so a shared or local address would be undefined) is this
            // function's `# Safety` section, which the caller upholds.
            unsafe {
                asm!(concat!(to_global!(), $instr, " {o}, [g], {v}; }}"), o = out($cls) old, p = in(reg64) p, v = in($cls) v, options(nostack));
            }
            old
        }
    };
}

atom_rmw!(/// `atom.acq_rel.sys.add.u64`, returning the old value.
    atomic_add_acq_rel_sys_u64, u64, reg64, "atom.acq_rel.sys.global.add.u64");
atom_rmw!(/// `atom.acq_rel.sys.add.u32`, returning the old value.
    atomic_add_acq_rel_sys_u32, u32, reg32, "atom.acq_rel.sys.global.add.u32");
atom_rmw!(/// `atom.release.sys.add.u64`, returning the old value.
    atomic_add_release_sys_u64, u64, reg64, "atom.release.sys.global.add.u64");
atom_rmw!(/// `atom.relaxed.sys.add.u64`, returning the old value.
    atomic_add_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.add.u64");
atom_rmw!(/// `atom.acquire.sys.add.u64`, returning the old value: acquires what was released to the
    /// word, without waiting (as a release would) for the thread's own earlier stores to be
    /// performed, such as its stores to a peer GPU over NVLink.
    atomic_add_acquire_sys_u64, u64, reg64, "atom.acquire.sys.global.add.u64");
atom_rmw!(/// `atom.acq_rel.sys.exch.b64`, returning the old value.
    atomic_swap_acq_rel_sys_u64, u64, reg64, "atom.acq_rel.sys.global.exch.b64");
atom_rmw!(/// `atom.acq_rel.sys.exch.b32`, returning the old value.
    atomic_swap_acq_rel_sys_u32, u32, reg32, "atom.acq_rel.sys.global.exch.b32");
atom_rmw!(/// `atom.acq_rel.sys.max.u64`, returning the old value.
    atomic_max_acq_rel_sys_u64, u64, reg64, "atom.acq_rel.sys.global.max.u64");
atom_rmw!(/// `atom.relaxed.sys.max.u64`, returning the old value.
    atomic_max_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.max.u64");
atom_rmw!(/// `atom.relaxed.sys.add.u32`, returning the old value.
    atomic_add_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.add.u32");
atom_rmw!(/// `atom.relaxed.sys.exch.b64`, returning the old value.
    atomic_swap_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.exch.b64");
atom_rmw!(/// `atom.relaxed.sys.exch.b32`, returning the old value.
    atomic_swap_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.exch.b32");
atom_rmw!(/// `atom.relaxed.sys.and.b64`, returning the old value.
    atomic_and_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.and.b64");
atom_rmw!(/// `atom.relaxed.sys.and.b32`, returning the old value.
    atomic_and_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.and.b32");
atom_rmw!(/// `atom.relaxed.sys.or.b64`, returning the old value.
    atomic_or_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.or.b64");
atom_rmw!(/// `atom.relaxed.sys.or.b32`, returning the old value.
    atomic_or_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.or.b32");
atom_rmw!(/// `atom.relaxed.sys.xor.b64`, returning the old value.
    atomic_xor_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.xor.b64");
atom_rmw!(/// `atom.relaxed.sys.xor.b32`, returning the old value.
    atomic_xor_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.xor.b32");

// GPU scope: for words only this GPU's threads (and its own engine) touch, such as the posting
// counters of a send queue in GPU memory; NVSHMEM posts to GPU-memory queues at this scope.
atom_rmw!(/// `atom.relaxed.gpu.add.u64`, returning the old value.
    atomic_add_relaxed_gpu_u64, u64, reg64, "atom.relaxed.gpu.global.add.u64");
atom_rmw!(/// `atom.acq_rel.gpu.max.u64`, returning the old value.
    atomic_max_acq_rel_gpu_u64, u64, reg64, "atom.acq_rel.gpu.global.max.u64");

macro_rules! atom_cas {
    ($(#[$m:meta])* $name:ident, $ty:ty, $cls:ident, $instr:literal) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See the module contract.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $ty, expected: $ty, new: $ty) -> $ty {
            let old: $ty;
            // SAFETY: the module contract (a valid, aligned global-memory address for the access:
            // `to_global!` converts it, so a shared or local address would be undefined) is this
            // function's `# Safety` section, which the caller upholds.
            unsafe {
                asm!(concat!(to_global!(), $instr, " {o}, [g], {e}, {n}; }}"),
                    o = out($cls) old, p = in(reg64) p, e = in($cls) expected, n = in($cls) new, options(nostack));
            }
            old
        }
    };
}

atom_cas!(/// `atom.relaxed.sys.cas.b64`: stores `new` if `*p == expected`; returns the old value.
    atomic_cas_relaxed_sys_u64, u64, reg64, "atom.relaxed.sys.global.cas.b64");
atom_cas!(/// `atom.relaxed.sys.cas.b32`: stores `new` if `*p == expected`; returns the old value.
    atomic_cas_relaxed_sys_u32, u32, reg32, "atom.relaxed.sys.global.cas.b32");
atom_cas!(/// `atom.acq_rel.sys.cas.b64`: stores `new` if `*p == expected`; returns the old value.
    atomic_cas_acq_rel_sys_u64, u64, reg64, "atom.acq_rel.sys.global.cas.b64");
atom_cas!(/// `atom.acq_rel.sys.cas.b32`: stores `new` if `*p == expected`; returns the old value.
    atomic_cas_acq_rel_sys_u32, u32, reg32, "atom.acq_rel.sys.global.cas.b32");
atom_cas!(/// `atom.acq_rel.gpu.cas.b64`: the GPU-scope form of [`atomic_cas_acq_rel_sys_u64`].
    atomic_cas_acq_rel_gpu_u64, u64, reg64, "atom.acq_rel.gpu.global.cas.b64");
atom_cas!(/// `atom.acq_rel.gpu.cas.b32`: the GPU-scope form of [`atomic_cas_acq_rel_sys_u32`].
    atomic_cas_acq_rel_gpu_u32, u32, reg32, "atom.acq_rel.gpu.global.cas.b32");

/// A 16-byte vector load from global memory.
///
/// # Safety
/// `p` is a 16-byte aligned global-memory address.
#[inline(always)]
pub unsafe fn load_v4(p: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [g]; }}",
            p = in(reg64) p, a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(nostack, readonly));
    }
    [a, b, c, d]
}

/// A 16-byte vector load from global memory for data read once: not kept in L1
/// (`L1::no_allocate`), and each miss brings 256 bytes into L2 (`L2::256B`), so a warp streaming
/// through rows finds its next sectors in L2 instead of paying a DRAM round trip per sector (an
/// SM's outstanding misses, not DRAM, bound a few SMs' copy rate).
///
/// # Safety
/// `p` is a 16-byte aligned global-memory address.
#[inline(always)]
pub unsafe fn load_v4_stream(p: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.L1::no_allocate.L2::256B.v4.u32 {{{a}, {b}, {c}, {d}}}, [g]; }}",
            p = in(reg64) p, a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(nostack, readonly));
    }
    [a, b, c, d]
}

/// `ld.volatile.global.v2.u64`: 16 bytes another agent may have written (a WQEBB a poster
/// published before the acquire that precedes this load), one transaction, not cached in L1.
///
/// # Safety
/// `p` is a 16-byte aligned global-memory address.
#[inline(always)]
pub unsafe fn load_volatile_v2_u64(p: *const [u64; 2]) -> [u64; 2] {
    let (a, b): (u64, u64);
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.volatile.global.v2.u64 {{{a}, {b}}}, [g]; }}",
            p = in(reg64) p, a = out(reg64) a, b = out(reg64) b, options(nostack, readonly, preserves_flags));
    }
    [a, b]
}

/// `ld.global.nc.v2.u64`: 16 bytes through the read-only data path (CUDA's `__ldg`), which stays
/// cached across the kernel's own stores. For tables the host wrote before the launch.
///
/// # Safety
/// `p` is a 16-byte aligned global-memory address that nothing writes while the kernel runs.
#[inline(always)]
pub unsafe fn load_readonly_v2_u64(p: *const [u64; 2]) -> [u64; 2] {
    let (a, b): (u64, u64);
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.nc.v2.u64 {{{a}, {b}}}, [g]; }}",
            p = in(reg64) p, a = out(reg64) a, b = out(reg64) b, options(nostack, readonly, preserves_flags));
    }
    [a, b]
}

/// A 16-byte vector store to global memory (local or a peer's mapped heap).
///
/// # Safety
/// `p` is a 16-byte aligned global-memory address.
#[inline(always)]
pub unsafe fn store_v4(p: *mut [u32; 4], v: [u32; 4]) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; st.global.v4.u32 [g], {{{a}, {b}, {c}, {d}}}; }}",
            p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack));
    }
}

// ------------------------------------------------------------------ Hopper bulk copies (TMA)
//
// `cp.async.bulk` moves 16-byte-aligned runs between global and shared memory on the SM's
// tensor-memory-accelerator, off the load/store pipeline. The staging area and its mbarriers live
// in one static shared-memory array declared by `bulk_staging`, which is never inlined, so a kernel
// that copies at several call sites still has one staging area.

/// Bytes of one bulk-copy stage.
pub const BULK_CHUNK_BYTES: u32 = 8192;
/// Stages in flight (loads into one while another is being stored).
pub const BULK_STAGES: u32 = 4;

/// The shared-memory address (`.shared` window) of this block's staging area: `BULK_STAGES`
/// mbarriers (8 bytes each) at offset 0, the stages of `BULK_CHUNK_BYTES` from offset 128.
#[inline(never)]
pub fn bulk_staging() -> u64 {
    let r: u64;
    // SAFETY: declares a static shared array and returns its address; no memory access.
    unsafe {
        asm!("{{ .shared .align 128 .b8 ibgda_bulk_staging[32896]; mov.u64 {r}, ibgda_bulk_staging; }}",
             r = out(reg64) r, options(nomem, nostack, preserves_flags))
    };
    r
}
const _: () = assert!(128 + BULK_STAGES * BULK_CHUNK_BYTES == 32896);

/// `mbarrier.init.shared::cta.b64 [bar], count`.
///
/// # Safety
/// `bar` is an 8-byte aligned `.shared` address no other thread is using as a barrier.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u64, count: u32) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg64) bar, c = in(reg32) count, options(nostack));
    }
}

/// `mbarrier.inval.shared::cta.b64 [bar]`: the barrier's memory may be reused.
///
/// # Safety
/// `bar` holds an initialised mbarrier nothing waits on or completes any more.
#[inline(always)]
pub unsafe fn mbarrier_inval(bar: u64) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("mbarrier.inval.shared::cta.b64 [{b}];", b = in(reg64) bar, options(nostack));
    }
}

nullary!(
    /// `fence.mbarrier_init.release.cluster`: makes initialised mbarriers visible to the async proxy
    /// (the bulk-copy unit that completes them).
    fence_mbarrier_init, "fence.mbarrier_init.release.cluster;", "a fence."
);

nullary!(
    /// `fence.proxy.async`: orders this thread's generic-proxy accesses with its bulk (async-proxy)
    /// copies, both ways.
    fence_proxy_async, "fence.proxy.async;", "a fence."
);

/// `mbarrier.arrive.expect_tx`: arrives on `bar` and tells it `bytes` more will land.
///
/// # Safety
/// `bar` is an initialised mbarrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u64, bytes: u32) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [{b}], {n}; }}",
             b = in(reg64) bar, n = in(reg32) bytes, options(nostack));
    }
}

/// `mbarrier.try_wait.parity`: whether the phase of parity `parity` of `bar` has completed (waits a
/// bounded, hardware-chosen time before saying no).
///
/// # Safety
/// `bar` is an initialised mbarrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(bar: u64, parity: u32) -> bool {
    let r: u32;
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {k}; selp.u32 {r}, 1, 0, p; }}",
             b = in(reg64) bar, k = in(reg32) parity, r = out(reg32) r, options(nostack));
    }
    r != 0
}

/// `cp.async.bulk.shared::cluster.global`: copies `bytes` from global `src` into shared `smem`,
/// completing `bytes` of `bar`'s expected transactions when they land.
///
/// # Safety
/// `src` is 16-byte aligned readable global memory, `smem` a 16-byte aligned `.shared` address with
/// `bytes` of room, `bytes` a multiple of 16, and `bar` expects them.
#[inline(always)]
pub unsafe fn bulk_load_to_shared(smem: u64, src: *const u8, bytes: u32, bar: u64) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {s}; cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [g], {n}, [{b}]; }}",
             d = in(reg64) smem, s = in(reg64) src, n = in(reg32) bytes, b = in(reg64) bar, options(nostack));
    }
}

/// `cp.async.bulk.global.shared::cta.bulk_group`: copies `bytes` from shared `smem` to global `dst`
/// (local, or a peer's mapped heap) in this thread's current bulk group.
///
/// # Safety
/// `dst` is 16-byte aligned writable global memory, `smem` a 16-byte aligned `.shared` address
/// holding `bytes` (a multiple of 16).
#[inline(always)]
pub unsafe fn bulk_store_from_shared(dst: *mut u8, smem: u64, bytes: u32) {
    // SAFETY: the module contract (a valid, aligned address of the right state space
    // for the access) is this function's `# Safety` section, which the caller upholds.
    unsafe {
        asm!("{{ .reg .u64 g; cvta.to.global.u64 g, {d}; cp.async.bulk.global.shared::cta.bulk_group [g], [{s}], {n}; }}",
             d = in(reg64) dst, s = in(reg64) smem, n = in(reg32) bytes, options(nostack));
    }
}

nullary!(
    /// `cp.async.bulk.commit_group`: closes this thread's current bulk group.
    bulk_commit_group, "cp.async.bulk.commit_group;", "no operands."
);

nullary!(
    /// `cp.async.bulk.wait_group.read 1`: every committed bulk store but the newest has read its
    /// shared source.
    bulk_wait_read_but_one, "cp.async.bulk.wait_group.read 1;", "waits on this thread's own bulk groups."
);

nullary!(
    /// `cp.async.bulk.wait_group 0`: every committed bulk store has completed its writes.
    bulk_wait_all, "cp.async.bulk.wait_group 0;", "waits on this thread's own bulk groups."
);

/// Stops the kernel; the host sees a launch failure and reads the error record.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread (and the grid).
    unsafe { asm!("trap;", options(nostack, noreturn)) }
}

//! The kernels ibgda ships: its GPU test suite ([`suite`], and [`collective_suite`] for the calls
//! over several PEs), its benchmarks ([`bench`]) and the
//! kernels that diagnose where time goes ([`diag`]). Each builds as a PTX entry (named as the
//! function, whatever its module) and, through [`ibgda_device::kernel!`], as a host function the
//! CPU emulation runs; all are re-exported here.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]

/// Values of the `scope` argument of the test kernels.
pub mod scope {
    /// Each thread is one unit.
    pub const THREAD: u32 = 0;
    /// Each warp is one unit.
    pub const WARP: u32 = 1;
    /// Each block is one unit.
    pub const BLOCK: u32 = 2;
}

/// Values of the `which` argument of [`ibgda_test_collective`].
pub mod collective {
    /// `alltoall_block`.
    pub const ALLTOALL: u32 = 0;
    /// `broadcast_block`.
    pub const BROADCAST: u32 = 1;
    /// `fcollect_block`.
    pub const FCOLLECT: u32 = 2;
}

/// Values of the `op` argument of `ibgda_test_reduce`, and of its `ty` ([`reduce::ty`]).
pub mod reduce {
    /// `sum_reduce_block`.
    pub const SUM: u32 = 0;
    /// `prod_reduce_block`.
    pub const PROD: u32 = 1;
    /// `min_reduce_block`.
    pub const MIN: u32 = 2;
    /// `max_reduce_block`.
    pub const MAX: u32 = 3;
    /// `and_reduce_block`.
    pub const AND: u32 = 4;
    /// `or_reduce_block`.
    pub const OR: u32 = 5;
    /// `xor_reduce_block`.
    pub const XOR: u32 = 6;
    /// The element types.
    pub mod ty {
        /// `u8`.
        pub const U8: u32 = 0;
        /// `i32`.
        pub const I32: u32 = 1;
        /// `u64`.
        pub const U64: u32 = 2;
        /// `f32`.
        pub const F32: u32 = 3;
        /// `f64`.
        pub const F64: u32 = 4;
    }
}

/// What thread `t` of `ibgda_test_bitwise` xors into its words: distinct, spread over every bit.
pub const fn xor_pattern(t: u64) -> u64 {
    (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Values of the `mode` argument of `ibgda_test_team` (the collectives) and `ibgda_test_team_sync`
/// (the rest); each by block 0 of every member of `team` unless it says otherwise.
pub mod team {
    /// `team_alltoall_block` of `count` words a member.
    pub const ALLTOALL: u32 = 0;
    /// `team_broadcast_block` of `count` words from team PE `root`.
    pub const BROADCAST: u32 = 1;
    /// `team_fcollect_block` of `count` words.
    pub const FCOLLECT: u32 = 2;
    /// `team_sum_reduce_block` of `count` words.
    pub const SUM: u32 = 3;
    /// `team_sum_reduce_block` over `team` into `dst`, then over `other` from `dst` into
    /// `dst + count` with no other synchronisation between (each member of both; teams whose
    /// members overlap, so one team's reduction runs while the other's does).
    pub const TWO_TEAMS: u32 = 4;
    /// For `root` rounds: each member puts the round's number into its word of the next member's
    /// `dst` (`dst[me]`, a `p`), `team_barrier_block`, then stores in `dst[size + round]` how
    /// many of its own `dst[..size]` hold the round (one: its predecessor's), and a second
    /// barrier keeps the next round's puts after every member's look.
    pub const BARRIER: u32 = 5;
    /// For `root` rounds: each member adds 1 to team PE 0's `dst[0]` and completes it (`quiet`),
    /// `team_sync_block`; team PE 0 then stores what it sees into `dst[1 + round]`, and a second
    /// `team_sync_block` keeps the next round's adds after that look.
    pub const SYNC: u32 = 6;
    /// Every PE (members or not): `dst[0] = team_my_pe` (`u64::MAX` for none), `dst[1] =
    /// team_n_pes`, `dst[2]` = the world PE of team PE `root`, `dst[3]` = this PE's index in
    /// `other` (`u64::MAX` for none).
    pub const INFO: u32 = 7;
    /// Every PE, members or not, calls `team_barrier_block` (a non-member's is `NotInTeam`).
    pub const BARRIER_ANYWAY: u32 = 8;
    /// Every PE, members or not, calls `team_sum_reduce_block` (a non-member's is `NotInTeam`).
    pub const SUM_ANYWAY: u32 = 9;
}

/// Values of the `mode` argument of `ibgda_test_waits`.
pub mod waits {
    /// `test` (of the first word).
    pub const TEST: u32 = 0;
    /// `wait_until_all`.
    pub const ALL: u32 = 1;
    /// `wait_until_any`.
    pub const ANY: u32 = 2;
    /// `wait_until_some`.
    pub const SOME: u32 = 3;
    /// `test_all`.
    pub const TEST_ALL: u32 = 4;
    /// `test_any`.
    pub const TEST_ANY: u32 = 5;
    /// `test_some`.
    pub const TEST_SOME: u32 = 6;
}

/// Values of the `mode` argument of [`ibgda_test_fault`].
pub mod fault {
    /// `put` to PE `n_pes`.
    pub const INVALID_PE: u32 = 1;
    /// `put` of 64 bytes starting 8 bytes before the end of the heap.
    pub const OUTSIDE_HEAP: u32 = 2;
    /// `atomic_fetch_add::<u64>` at `addr + 4`.
    pub const MISALIGNED_ATOMIC: u32 = 3;
    /// `signal_wait_until(addr, Eq, u64::MAX)`, which never holds.
    pub const SIGNAL_TIMEOUT: u32 = 4;
    /// `g` from an address below the heap.
    pub const BELOW_HEAP: u32 = 5;
    /// IBGDA: an RDMA WRITE of 8 bytes to `addr` on `peer` with a corrupted rkey, then quiet.
    pub const WRONG_RKEY: u32 = 6;
    /// IBGDA: an RDMA WRITE of 64 bytes ending past the peer's registered heap (the device
    /// API's own bounds check is bypassed through the raw QP handle), then quiet.
    pub const NIC_OUTSIDE_REGION: u32 = 7;
    /// `put` of 8 bytes to `addr` on `peer`, then `quiet` (with the NIC paused by the host:
    /// the quiet must time out).
    pub const PUT_QUIET: u32 = 8;
    /// `wait_until::<i64>(addr, Lt, -5)` on a word holding a positive value: never holds when the
    /// comparison is signed (and at once if it were unsigned).
    pub const WAIT_UNTIL_TIMEOUT: u32 = 9;
}

pub mod bench;
pub mod collective_suite;
pub mod diag;
pub mod suite;

pub use bench::*;
pub use collective_suite::*;
pub use diag::*;
pub use suite::*;

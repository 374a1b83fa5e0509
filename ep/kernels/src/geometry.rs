//! Where everything lives: the geometry of one call (packed into two kernel arguments) and the
//! byte layouts of the high-throughput area, the low-latency area, the signal words and the
//! workspace. Plain functions, compiled into the kernels and into the host crate, so both sides
//! compute the same offsets.

/// Channels are 128 wide for FP8 scales.
pub const FP8_BLOCK: u32 = 128;
/// The largest `num_topk` the buffers are laid out for.
pub const MAX_TOPK: u32 = 16;
/// The largest number of experts (over all ranks).
pub const MAX_EXPERTS: u32 = 1024;
/// The largest number of channels (blocks) of a high-throughput kernel.
pub const MAX_CHANNELS: u32 = 128;
/// The most warps of a high-throughput block (1024 threads).
pub const MAX_WARPS: u32 = 32;
/// Words of one notify message: token count, overflow flag, one count per local expert of the
/// destination, then the sender's row count to every rank (local experts plus ranks is at most
/// `MAX_EXPERTS + 1`, at one rank).
pub const NOTIFY_WORDS: u32 = 3 + MAX_EXPERTS;

/// The shape of one dispatch/combine call, as the kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Channels per token (`hidden`).
    pub hidden: u32,
    /// Top-k entries per token.
    pub topk: u32,
    /// Experts per rank.
    pub local_experts: u32,
    /// Slots per source rank (high-throughput) or tokens per rank (low-latency).
    pub capacity: u32,
    /// FP8 e4m3 payload with one f32 scale per 128 channels (else BF16).
    pub fp8: bool,
    /// FP8 scales rounded up to a power of two (DeepEP's `round_scale`; low-latency dispatch).
    pub round_scale: bool,
    /// Received FP8 scales as UE8M0 exponent bytes, four per `i32` (DeepEP's `use_ue8m0`; implies
    /// `round_scale`; low-latency dispatch).
    pub ue8m0: bool,
}

const fn align16(x: u64) -> u64 {
    (x + 15) & !15
}

impl Geometry {
    /// The two kernel arguments that carry the geometry.
    pub const fn pack(&self) -> (u64, u64) {
        (
            self.hidden as u64
                | ((self.topk as u64) << 32)
                | ((self.round_scale as u64) << 61)
                | ((self.ue8m0 as u64) << 62)
                | ((self.fp8 as u64) << 63),
            self.local_experts as u64 | ((self.capacity as u64) << 32),
        )
    }

    /// This geometry with a low-latency dispatch's FP8 scales rounded up to powers of two
    /// (`round`), and received as UE8M0 exponent bytes (`ue8m0`, which implies rounding).
    pub const fn with_scales(self, round: bool, ue8m0: bool) -> Geometry {
        Geometry {
            round_scale: round || ue8m0,
            ue8m0,
            ..self
        }
    }

    /// The inverse of [`Geometry::pack`].
    pub const fn unpack(g0: u64, g1: u64) -> Geometry {
        Geometry {
            hidden: g0 as u32,
            topk: ((g0 >> 32) & 0xffff) as u32,
            fp8: g0 >> 63 != 0,
            round_scale: (g0 >> 61) & 1 != 0,
            ue8m0: (g0 >> 62) & 1 != 0,
            local_experts: g1 as u32,
            capacity: (g1 >> 32) as u32,
        }
    }

    /// Bytes of one token's payload (FP8: one byte per channel; BF16: two).
    pub const fn x_bytes(&self) -> u64 {
        self.hidden as u64 * if self.fp8 { 1 } else { 2 }
    }

    /// Bytes of one token's scales (FP8 only).
    pub const fn scale_bytes(&self) -> u64 {
        if self.fp8 {
            (self.hidden / FP8_BLOCK) as u64 * 4
        } else {
            0
        }
    }

    /// Number of f32 scales per token (FP8 only).
    pub const fn scales_per_token(&self) -> u32 {
        if self.fp8 {
            self.hidden / FP8_BLOCK
        } else {
            0
        }
    }

    // ------------------------------------------------------------ high-throughput rows

    /// A dispatched row: payload, scales, then `src_token: i32`, `topk_idx: [i32; k]`,
    /// `topk_weights: [f32; k]`.
    pub const fn ht_row(&self) -> u64 {
        align16(self.x_bytes() + self.scale_bytes() + 4 + 8 * self.topk as u64)
    }

    /// Offset of the metadata in a dispatched row.
    pub const fn ht_meta(&self) -> u64 {
        self.x_bytes() + self.scale_bytes()
    }

    /// A combined row: BF16 payload, then `topk_weights: [f32; k]`, then (at
    /// [`Geometry::combine_flag`]) the number of the combine call that last delivered it, which
    /// the fused NVLink combine's reducers wait on (16 bytes).
    pub const fn combine_row(&self) -> u64 {
        self.combine_flag() + 16
    }

    /// Offset of a combined row's arrival flag (a `u64`).
    pub const fn combine_flag(&self) -> u64 {
        align16(self.hidden as u64 * 2 + 4 * self.topk as u64)
    }

    /// Bytes per slot of the high-throughput area: dispatch receive, combine receive, staging.
    pub const fn ht_slot_bytes(&self) -> u64 {
        let d = self.ht_row();
        let c = self.combine_row();
        d + c + if d > c { d } else { c }
    }

    /// Slots per source rank that an area of `area_bytes` holds for `ranks` ranks.
    pub const fn ht_capacity(&self, area_bytes: u64, ranks: u32) -> u64 {
        area_bytes / (ranks as u64 * self.ht_slot_bytes())
    }

    /// Dispatch receive row of `slot` from `src` (an offset into the area).
    pub const fn ht_dispatch_recv(&self, src: u32, slot: u32) -> u64 {
        (src as u64 * self.capacity as u64 + slot as u64) * self.ht_row()
    }

    /// Combine receive row of `slot` from `src`.
    pub const fn ht_combine_recv(&self, ranks: u32, src: u32, slot: u32) -> u64 {
        ranks as u64 * self.capacity as u64 * self.ht_row()
            + (src as u64 * self.capacity as u64 + slot as u64) * self.combine_row()
    }

    /// Staging dispatch row of `slot` for `dst` (peers reached by a NIC): rows packed as in the
    /// receive area, so one put moves a run of slots.
    pub const fn ht_stage_dispatch(&self, ranks: u32, dst: u32, slot: u32) -> u64 {
        self.ht_stage_base(ranks, dst) + slot as u64 * self.ht_row()
    }

    /// Staging combine row of `slot` for `dst`.
    pub const fn ht_stage_combine(&self, ranks: u32, dst: u32, slot: u32) -> u64 {
        self.ht_stage_base(ranks, dst) + slot as u64 * self.combine_row()
    }

    const fn ht_stage_base(&self, ranks: u32, dst: u32) -> u64 {
        let d = self.ht_row();
        let c = self.combine_row();
        let row = if d > c { d } else { c };
        ranks as u64 * self.capacity as u64 * (d + c) + dst as u64 * self.capacity as u64 * row
    }

    // ------------------------------------------------------------ low-latency messages

    /// A low-latency dispatch message: payload, scales, then `src_token: i32`, `k: i32`, 8 bytes
    /// of padding. Sized for BF16 so one area serves both dtypes.
    pub const fn ll_msg(&self) -> u64 {
        align16(self.hidden as u64 * 2 + 16)
    }

    /// Offset of the metadata in a low-latency message.
    pub const fn ll_meta(&self) -> u64 {
        self.x_bytes() + self.scale_bytes()
    }

    /// The bytes of a low-latency message that carry something: payload, scales and metadata,
    /// what a NIC sends (an FP8 message at hidden 7,168 is 7,408 of its 14,352-byte BF16-sized slot).
    pub const fn ll_sent(&self) -> u64 {
        align16(self.ll_meta() + 8)
    }
}

/// The low-latency area: two copies (by call parity) of the receive, count, flag and staging
/// regions, then the per-expert slot counters and the per-selection slot table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlLayout {
    /// Ranks.
    pub ranks: u32,
    /// Experts per rank.
    pub local_experts: u32,
    /// Tokens per rank at most (`num_max_dispatch_tokens_per_rank`).
    pub max_tokens: u32,
    /// Channels.
    pub hidden: u32,
}

impl LlLayout {
    /// The layout a low-latency call of geometry `g` on `ranks` ranks uses.
    pub const fn of(g: &Geometry, ranks: u32) -> LlLayout {
        LlLayout {
            ranks,
            local_experts: g.local_experts,
            max_tokens: g.capacity,
            hidden: g.hidden,
        }
    }

    const fn msg(&self) -> u64 {
        align16(self.hidden as u64 * 2 + 16)
    }
    const fn experts(&self) -> u64 {
        self.ranks as u64 * self.local_experts as u64
    }
    const fn dispatch_recv_bytes(&self) -> u64 {
        self.local_experts as u64 * self.ranks as u64 * self.max_tokens as u64 * self.msg()
    }
    const fn count_bytes(&self) -> u64 {
        align16(self.local_experts as u64 * self.ranks as u64 * 8)
    }
    const fn combine_recv_bytes(&self) -> u64 {
        self.max_tokens as u64 * MAX_TOPK as u64 * self.hidden as u64 * 2
    }
    const fn flag_bytes(&self) -> u64 {
        self.max_tokens as u64 * MAX_TOPK as u64 * 8
    }
    const fn dispatch_stage_bytes(&self) -> u64 {
        self.max_tokens as u64 * MAX_TOPK as u64 * self.msg()
    }
    const fn combine_stage_bytes(&self) -> u64 {
        self.local_experts as u64 * self.ranks as u64 * self.max_tokens as u64 * self.hidden as u64 * 2
    }
    const fn expert_flag_bytes(&self) -> u64 {
        align16(self.experts() * 8)
    }
    const fn parity_bytes(&self) -> u64 {
        self.dispatch_recv_bytes()
            + self.count_bytes()
            + self.combine_recv_bytes()
            + self.flag_bytes()
            + self.dispatch_stage_bytes()
            + self.combine_stage_bytes()
            + self.expert_flag_bytes()
    }

    /// Bytes of the whole area (DeepEP's `get_low_latency_rdma_size_hint`).
    pub const fn total_bytes(&self) -> u64 {
        2 * self.parity_bytes() + align16(self.experts() * 4) + align16(self.max_tokens as u64 * MAX_TOPK as u64 * 4)
    }

    // Where each region of parity `p` starts: each right after the one before it.
    const fn count_at(&self, p: u32) -> u64 {
        p as u64 * self.parity_bytes() + self.dispatch_recv_bytes()
    }
    const fn combine_recv_at(&self, p: u32) -> u64 {
        self.count_at(p) + self.count_bytes()
    }
    const fn flag_at(&self, p: u32) -> u64 {
        self.combine_recv_at(p) + self.combine_recv_bytes()
    }
    const fn dispatch_stage_at(&self, p: u32) -> u64 {
        self.flag_at(p) + self.flag_bytes()
    }
    const fn combine_stage_at(&self, p: u32) -> u64 {
        self.dispatch_stage_at(p) + self.dispatch_stage_bytes()
    }
    const fn expert_flag_at(&self, p: u32) -> u64 {
        self.combine_stage_at(p) + self.combine_stage_bytes()
    }

    /// Receive slot `slot` of local expert `le` from `src`, for call parity `p`.
    pub const fn dispatch_recv(&self, p: u32, le: u32, src: u32, slot: u32) -> u64 {
        p as u64 * self.parity_bytes()
            + ((le as u64 * self.ranks as u64 + src as u64) * self.max_tokens as u64 + slot as u64) * self.msg()
    }
    /// The count word of (local expert `le`, `src`): `(seq << 32) | tokens`.
    pub const fn count(&self, p: u32, le: u32, src: u32) -> u64 {
        self.count_at(p) + (le as u64 * self.ranks as u64 + src as u64) * 8
    }
    /// Combine receive row of (token `t`, top-k entry `k`).
    pub const fn combine_recv(&self, p: u32, t: u32, k: u32) -> u64 {
        self.combine_recv_at(p) + (t as u64 * MAX_TOPK as u64 + k as u64) * self.hidden as u64 * 2
    }
    /// Arrival flag of combine row (`t`, `k`): the call's sequence number.
    pub const fn combine_flag(&self, p: u32, t: u32, k: u32) -> u64 {
        self.flag_at(p) + (t as u64 * MAX_TOPK as u64 + k as u64) * 8
    }
    /// Staging message of selection (`t`, `k`) for peers reached by a NIC; over NVLink, that of
    /// (`t`, 0) is token `t`'s quantised message, which each selection's warp copies.
    pub const fn dispatch_stage(&self, p: u32, t: u32, k: u32) -> u64 {
        self.dispatch_stage_at(p) + (t as u64 * MAX_TOPK as u64 + k as u64) * self.msg()
    }
    /// Staging row of expert-side row `row` of local expert `le` (combine, NIC peers).
    pub const fn combine_stage(&self, p: u32, le: u32, row: u32) -> u64 {
        self.combine_stage_at(p)
            + (le as u64 * self.ranks as u64 * self.max_tokens as u64 + row as u64) * self.hidden as u64 * 2
    }
    /// Arrival flag of every combine row expert `e` (global index) sends this rank over a NIC:
    /// the call's sequence number, set after the expert's rows on the queue they went on.
    pub const fn combine_expert_flag(&self, p: u32, e: u32) -> u64 {
        self.expert_flag_at(p) + e as u64 * 8
    }
    /// Per-expert slot counters (`u32`, one per global expert).
    pub const fn slot_counters(&self) -> u64 {
        2 * self.parity_bytes()
    }
    /// Per-selection slot table (`u32`, `[max_tokens][MAX_TOPK]`).
    pub const fn slot_table(&self) -> u64 {
        2 * self.parity_bytes() + align16(self.experts() * 4)
    }
}

/// The signal words every rank owns (`u64`, in the symmetric heap), for `ranks` ranks.
pub mod sync {
    use super::{MAX_CHANNELS, NOTIFY_WORDS};
    /// `notify_sig[src]`: the high-throughput call number `src` last notified.
    pub const fn notify_sig(src: u32) -> u64 {
        src as u64
    }
    /// `notify_data[parity][src][NOTIFY_WORDS]`.
    pub const fn notify_data(ranks: u32, p: u32, src: u32) -> u64 {
        ranks as u64 + (p as u64 * ranks as u64 + src as u64) * NOTIFY_WORDS as u64
    }
    const fn after_notify(ranks: u32) -> u64 {
        ranks as u64 + 2 * ranks as u64 * NOTIFY_WORDS as u64
    }
    /// `dispatch_rows[src]`: rows `src` has delivered, cumulative.
    pub const fn dispatch_rows(ranks: u32, src: u32) -> u64 {
        after_notify(ranks) + src as u64
    }
    /// `combine_ready[src]`: the combine call number `src` is ready to receive.
    pub const fn combine_ready(ranks: u32, src: u32) -> u64 {
        after_notify(ranks) + ranks as u64 + src as u64
    }
    /// `combine_rows[src]`: combined rows `src` has delivered, cumulative.
    pub const fn combine_rows(ranks: u32, src: u32) -> u64 {
        after_notify(ranks) + 2 * ranks as u64 + src as u64
    }
    /// `dispatch_channel_rows[src][c]`: where channel (block) `c` of `src`'s dispatch put its rows
    /// for this rank, when `src` is behind a NIC or the proxy: first slot `<< 32 |` rows, written
    /// before [`dispatch_channel_done`] on the same queue.
    pub const fn dispatch_channel_rows(ranks: u32, src: u32, c: u32) -> u64 {
        after_notify(ranks) + 3 * ranks as u64 + src as u64 * MAX_CHANNELS as u64 + c as u64
    }
    /// `dispatch_channel_done[src][c]`: the dispatch call number (`work::HT_SEQ`) whose rows of
    /// channel `c` of `src` have all arrived (set after them on the channel's queue).
    pub const fn dispatch_channel_done(ranks: u32, src: u32, c: u32) -> u64 {
        dispatch_channel_rows(ranks, ranks, 0) + src as u64 * MAX_CHANNELS as u64 + c as u64
    }
    /// Number of words.
    pub const fn words(ranks: u32) -> u64 {
        dispatch_channel_done(ranks, ranks, 0)
    }
}

/// Each rank's own bookkeeping (`u64` words in the symmetric heap, used locally only).
pub mod work {
    use super::{MAX_CHANNELS, MAX_WARPS, NOTIFY_WORDS};
    /// High-throughput dispatch calls so far.
    pub const HT_SEQ: u64 = 0;
    /// High-throughput combine calls so far.
    pub const COMBINE_SEQ: u64 = 1;
    /// Low-latency dispatch calls so far.
    pub const LL_DISPATCH_SEQ: u64 = 2;
    /// Low-latency combine calls so far.
    pub const LL_COMBINE_SEQ: u64 = 3;
    /// Block-arrival counters (one per kernel that elects a last block).
    pub const DONE_NOTIFY: u64 = 4;
    /// Dispatch receive.
    pub const DONE_DISPATCH_RECV: u64 = 5;
    /// Combine reduce.
    pub const DONE_COMBINE: u64 = 6;
    /// Low-latency dispatch send.
    pub const DONE_LL_SEND: u64 = 7;
    /// Low-latency dispatch receive.
    pub const DONE_LL_RECV: u64 = 8;
    /// Low-latency combine send.
    pub const DONE_LL_COMBINE: u64 = 9;
    /// Blocks (channels) of the last high-throughput dispatch's send kernel.
    pub const DISPATCH_CHANNELS: u64 = 10;
    /// The notify's check of `topk_idx`: 0, or [`BAD_TOKEN_KEY`] less the first token seen with an
    /// expert out of range (a maximum over the blocks finds the least); the last block resets it.
    pub const NOTIFY_BAD_TOKEN: u64 = 11;
    /// See [`NOTIFY_BAD_TOKEN`].
    pub const BAD_TOKEN_KEY: u64 = 1 << 40;
    /// 1 when the last high-throughput notify was a cached one (`ep_ht_notify_cached`: the
    /// dispatch send kernel then takes its slots from the handle's `send_slot` and waits out the
    /// barrier itself), 0 after a full one.
    pub const NOTIFY_CACHED: u64 = 12;
    /// `dispatch_expected[src]`: rows expected from `src`, cumulative.
    pub const fn dispatch_expected(src: u32) -> u64 {
        16 + src as u64
    }
    /// `combine_expected[dst]`: combined rows expected from `dst`, cumulative.
    pub const fn combine_expected(ranks: u32, dst: u32) -> u64 {
        16 + ranks as u64 + dst as u64
    }
    /// `channel_count[c][dst]`, then `channel_offset[c][dst]`.
    pub const fn channel_count(ranks: u32, c: u32, dst: u32) -> u64 {
        16 + 2 * ranks as u64 + c as u64 * ranks as u64 + dst as u64
    }
    /// Slot of channel `c`'s first row to `dst`.
    pub const fn channel_offset(ranks: u32, c: u32, dst: u32) -> u64 {
        16 + 2 * ranks as u64 + (MAX_CHANNELS as u64 + c as u64) * ranks as u64 + dst as u64
    }
    /// The notify message this rank sends to `dst` (`NOTIFY_WORDS` words; the put's source).
    pub const fn notify_stage(ranks: u32, dst: u32) -> u64 {
        16 + 2 * ranks as u64 + 2 * MAX_CHANNELS as u64 * ranks as u64 + dst as u64 * NOTIFY_WORDS as u64
    }
    /// `warp_count[c * warps + w][dst]`: rows warp `w` of channel `c` sends to `dst` (a warp
    /// sends a contiguous run of its channel's slots, after the runs of the warps before it).
    pub const fn warp_count(ranks: u32, sub: u32, dst: u32) -> u64 {
        notify_stage(ranks, ranks) + sub as u64 * ranks as u64 + dst as u64
    }
    /// `warp_first[c * warps + w][dst]`: a cached dispatch's first slot of warp `w` of channel
    /// `c` to `dst` (its rows' count in [`warp_count`]), for the block's range word behind a NIC.
    pub const fn warp_first(ranks: u32, sub: u32, dst: u32) -> u64 {
        warp_count(ranks, MAX_CHANNELS * MAX_WARPS, 0) + sub as u64 * ranks as u64 + dst as u64
    }
    /// Two scratch words of block `b` (a kernel's block-wide broadcast).
    pub const fn block_scratch(ranks: u32, b: u32) -> u64 {
        warp_first(ranks, MAX_CHANNELS * MAX_WARPS, 0) + 2 * b as u64
    }
    /// Number of words.
    pub const fn words(ranks: u32) -> u64 {
        block_scratch(ranks, MAX_CHANNELS)
    }
}

/// The `i32` record a high-throughput notify writes for the host and for the handle.
pub mod info {
    /// Rows received from `src`.
    pub const fn recv_count(src: u32) -> usize {
        src as usize
    }
    /// First receive row of `src` (`ranks + 1` entries; the last is the total).
    pub const fn recv_offset(ranks: u32, src: u32) -> usize {
        ranks as usize + src as usize
    }
    /// Rows sent to `dst`.
    pub const fn send_count(ranks: u32, dst: u32) -> usize {
        2 * ranks as usize + 1 + dst as usize
    }
    /// Rows received for local expert `le` (every source).
    pub const fn expert_count(ranks: u32, le: u32) -> usize {
        3 * ranks as usize + 1 + le as usize
    }
    /// 0; or 1 + the first destination rank whose slots a sender overflowed; or, before that,
    /// -(1 + the first source rank whose `topk_idx` names an expert out of range); or, after
    /// both, `1 + ranks +` the first rank that receives more rows than [`max_recv`].
    pub const fn status(ranks: u32, local_experts: u32) -> usize {
        3 * ranks as usize + 1 + local_experts as usize
    }
    /// Rows `src` sends to `dst` in this call, for every pair (`ranks * ranks` entries): the
    /// matrix DeepEP's handle carries as prefix sums (`rank_prefix_matrix`).
    pub const fn sent(ranks: u32, local_experts: u32, src: u32, dst: u32) -> usize {
        status(ranks, local_experts) + 1 + (src * ranks + dst) as usize
    }
    /// With a negative status (`-(1 + src)`: rank `src`'s `topk_idx` names an expert out of
    /// range), a token of `src` whose entry does; else 0.
    pub const fn bad_token(ranks: u32, local_experts: u32) -> usize {
        sent(ranks, local_experts, ranks, 0)
    }
    /// The most rows a rank may receive that the notify was given (0: no limit; DeepEP's
    /// `num_worst_tokens`): with a status of `1 + ranks + d`, rank `d` receives more.
    pub const fn max_recv(ranks: u32, local_experts: u32) -> usize {
        bad_token(ranks, local_experts) + 1
    }
    /// Entries.
    pub const fn len(ranks: u32, local_experts: u32) -> usize {
        max_recv(ranks, local_experts) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's shape (hidden 7,168, top-8, 32 local experts), FP8, `capacity` tokens.
    fn deepseek_fp8(capacity: u32) -> Geometry {
        Geometry {
            hidden: 7168,
            topk: 8,
            local_experts: 32,
            capacity,
            fp8: true,
            round_scale: false,
            ue8m0: false,
        }
    }

    #[test]
    fn geometry_round_trips_through_two_words() {
        let g = deepseek_fp8(4096);
        let (a, b) = g.pack();
        assert_eq!(Geometry::unpack(a, b), g);
        for g in [
            Geometry { fp8: false, ..g },
            Geometry { round_scale: true, ..g },
            Geometry {
                round_scale: true,
                ue8m0: true,
                ..g
            },
        ] {
            let (a, b) = g.pack();
            assert_eq!(Geometry::unpack(a, b), g);
        }
    }

    #[test]
    fn rows_are_16_byte_aligned_and_hold_their_parts() {
        let g = deepseek_fp8(10);
        assert_eq!(g.ht_row() % 16, 0);
        assert!(g.ht_row() >= 7168 + 56 * 4 + 4 + 64);
        assert_eq!(g.combine_row(), 7168 * 2 + 32 + 16);
        assert_eq!(g.combine_flag(), 7168 * 2 + 32);
        // Regions do not overlap: the last dispatch row ends where combine rows begin.
        assert_eq!(g.ht_dispatch_recv(2, 0), g.ht_combine_recv(2, 0, 0));
        assert_eq!(g.ht_combine_recv(2, 2, 0), g.ht_stage_dispatch(2, 0, 0));
        assert_eq!(g.ht_stage_dispatch(2, 2, 0), 2 * 10 * g.ht_slot_bytes());
        // Both kinds of staged rows of one destination stay inside its share.
        assert!(g.ht_stage_combine(2, 0, 10) <= g.ht_stage_dispatch(2, 1, 0));
        assert!(g.ht_stage_dispatch(2, 0, 10) <= g.ht_stage_dispatch(2, 1, 0));
    }

    #[test]
    fn a_low_latency_message_sends_only_what_it_carries() {
        let g = deepseek_fp8(10);
        // FP8: 7,168 bytes, 56 scales, the 8-byte metadata; half the BF16-sized slot.
        assert_eq!(g.ll_sent(), 7168 + 56 * 4 + 16);
        assert!(g.ll_sent() <= g.ll_msg() && g.ll_sent() >= g.ll_meta() + 8);
        // BF16 fills the slot.
        let b = Geometry { fp8: false, ..g };
        assert_eq!(b.ll_sent(), b.ll_msg());
        assert_eq!(b.ll_sent() % 16, 0);
    }

    #[test]
    fn low_latency_regions_tile_the_area() {
        let l = LlLayout {
            ranks: 4,
            local_experts: 3,
            max_tokens: 5,
            hidden: 256,
        };
        assert_eq!(l.count(0, 0, 0), l.dispatch_recv(0, 3, 0, 0));
        assert_eq!(l.combine_recv(0, 0, 0), l.count(0, 0, 0) + 96);
        assert_eq!(l.dispatch_recv(1, 0, 0, 0), l.parity_bytes());
        assert!(l.slot_table() + 5 * 16 * 4 <= l.total_bytes());
        // Each region ends where the next begins (5 tokens, 16 top-k slots each).
        assert_eq!(l.combine_recv(0, 5, 0), l.combine_flag(0, 0, 0));
        assert_eq!(l.combine_flag(0, 5, 0), l.dispatch_stage(0, 0, 0));
        assert_eq!(l.dispatch_stage(0, 5, 0), l.combine_stage(0, 0, 0));
        // The combine stages end where the expert flags begin, and those end the parity.
        assert_eq!(l.combine_stage(0, 3, 0), l.combine_expert_flag(0, 0));
        assert_eq!(l.combine_expert_flag(0, 12), l.parity_bytes());
        assert_eq!(
            l.combine_expert_flag(1, 0),
            l.parity_bytes() + l.combine_expert_flag(0, 0)
        );
    }
}

/// What went wrong in a dispatch or combine call. Each message names the call and the rank.
#[derive(Debug, thiserror::Error)]
pub enum EpError {
    /// An argument the call cannot use (shape, dtype, size, alignment).
    #[error("{call} on rank {rank}: {what}")]
    InvalidArgument {
        /// The call.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// What was wrong.
        what: String,
    },
    /// `topk_idx` (of rank `from_rank`: this one, or, in a collective call that stopped on every
    /// rank, another) holds an expert outside `-1..num_experts`.
    #[error(
        "{call} on rank {rank}: {}topk_idx of token {token} names an expert outside -1..{experts}; the call \
         stopped on every rank",
        if from_rank == rank { String::new() } else { format!("rank {from_rank}'s ") }
    )]
    ExpertOutOfRange {
        /// The call.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// The rank whose `topk_idx` it is.
        from_rank: u32,
        /// A token with a bad entry.
        token: u32,
        /// Number of experts.
        experts: u32,
    },
    /// More tokens than the buffer was sized for.
    #[error(
        "{call} on rank {rank}: a rank has more tokens for rank {receiver} than the buffer holds \
         ({capacity} per source rank at this hidden size and top-k); make num_nvl_bytes at least \
         {needed} for {tokens} tokens per rank (Buffer::ht_size_hint)"
    )]
    BufferTooSmall {
        /// The call.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// The rank they were for.
        receiver: u32,
        /// Slots per source rank.
        capacity: u64,
        /// Tokens per rank the hint was computed for.
        tokens: u64,
        /// Bytes that would hold them.
        needed: u64,
    },
    /// A rank would receive more rows than the call's limit (DeepEP's `num_worst_tokens`, the
    /// rows its receive outputs are sized for); found by the count exchange, so nothing moved.
    #[error(
        "{call} on rank {rank}: {} {rows} rows, more than num_worst_tokens ({limit}); the call stopped on \
         every rank",
        if receiver == rank { "this rank receives".to_string() } else { format!("rank {receiver} receives") }
    )]
    TooManyRows {
        /// The call.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// The rank that would receive them.
        receiver: u32,
        /// Rows it would receive.
        rows: u64,
        /// The limit.
        limit: u32,
    },
    /// The runtime failed (a device error, a timeout naming the rank waited for, a dead peer).
    #[error(transparent)]
    Runtime(#[from] ibgda::Error),
}

/// `Result` with [`EpError`].
pub type Result<T> = std::result::Result<T, EpError>;

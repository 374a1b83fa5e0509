//! Shared helpers for the integration tests.

/// Whether GPU tests should run. Without a CUDA device they print "skipped: no CUDA device" and
/// pass, unless `IBGDA_REQUIRE_GPU=1`, in which case a missing GPU is a failure.
pub fn gpu_or_skip(test: &str, min_gpus: usize) -> bool {
    let require = std::env::var("IBGDA_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let count = ibgda::cuda::device_count().unwrap_or(0);
    if count >= min_gpus {
        return true;
    }
    let why = if count == 0 {
        "no CUDA device".to_string()
    } else {
        format!("{count} CUDA device(s), need {min_gpus}")
    };
    assert!(!require, "{test}: IBGDA_REQUIRE_GPU=1 but {why}");
    eprintln!("{test}: skipped: {why}");
    false
}

/// Deterministic random bytes.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random()).collect()
}

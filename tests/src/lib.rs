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

/// Config for GPU tests: two PEs, one per GPU when there are two GPUs, else both on GPU 0
/// (`IBGDA_PES_PER_GPU` overrides).
pub fn gpu_config() -> ibgda::Config {
    let mut c = ibgda::Config::from_env().expect("IBGDA_* configuration");
    if std::env::var_os("IBGDA_PES_PER_GPU").is_none() {
        c.pes_per_gpu = if ibgda::cuda::device_count().unwrap_or(0) >= 2 {
            1
        } else {
            2
        };
    }
    c.heap_size = c.heap_size.max(64 << 20);
    c
}

/// A 1-D launch configuration.
pub fn grid(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

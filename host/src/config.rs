//! Runtime configuration, read from `IBGDA_*` environment variables (all documented here and in
//! the README) and overridable in code.

use crate::error::{Error, Result};
use std::time::Duration;

/// Settings for bringing up PEs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes of symmetric heap per PE (`IBGDA_SYMMETRIC_SIZE`, accepts `K`/`M`/`G` suffixes;
    /// default 256M). Rounded up to the GPU's allocation granularity.
    pub heap_size: u64,
    /// Bound on every device-side and host-side wait (`IBGDA_TIMEOUT_MS`, default 10000).
    pub timeout: Duration,
    /// PEs placed on each GPU (`IBGDA_PES_PER_GPU`, default 1): PE `i` uses GPU
    /// `i / pes_per_gpu`. Two PEs on one GPU make multi-PE logic testable on a single-GPU machine.
    pub pes_per_gpu: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heap_size: 256 << 20,
            timeout: Duration::from_millis(10_000),
            pes_per_gpu: 1,
        }
    }
}

/// Parses sizes like `4096`, `64K`, `256M`, `1G`.
pub fn parse_size(name: &'static str, s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::Config {
            name,
            value: s.to_string(),
            why: "expected a positive size such as 4096, 64K, 256M or 1G".into(),
        })
}

impl Config {
    /// Defaults, overridden by any `IBGDA_*` variables that are set.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Ok(v) = std::env::var("IBGDA_SYMMETRIC_SIZE") {
            c.heap_size = parse_size("IBGDA_SYMMETRIC_SIZE", &v)?;
        }
        if let Ok(v) = std::env::var("IBGDA_TIMEOUT_MS") {
            let ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&m| m > 0)
                .ok_or_else(|| Error::Config {
                    name: "IBGDA_TIMEOUT_MS",
                    value: v.clone(),
                    why: "expected a positive number of milliseconds".into(),
                })?;
            c.timeout = Duration::from_millis(ms);
        }
        if let Ok(v) = std::env::var("IBGDA_PES_PER_GPU") {
            c.pes_per_gpu = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Config {
                    name: "IBGDA_PES_PER_GPU",
                    value: v.clone(),
                    why: "expected a positive integer".into(),
                })?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("X", "4096").unwrap(), 4096);
        assert_eq!(parse_size("X", "64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("X", "256m").unwrap(), 256 << 20);
        assert_eq!(parse_size("X", " 2G ").unwrap(), 2 << 30);
    }

    #[test]
    fn bad_sizes_are_rejected_with_the_variable_named() {
        for bad in ["", "0", "-1", "12Q", "G", "99999999999999999999G"] {
            let e = parse_size("IBGDA_SYMMETRIC_SIZE", bad).unwrap_err().to_string();
            assert!(e.contains("IBGDA_SYMMETRIC_SIZE"), "{bad}: {e}");
        }
    }
}

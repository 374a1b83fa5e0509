// The host's check of `ibgda_test_bitwise`, shared by the CPU cases (`device_api_cases.rs`) and
// the GPU suite (`gpu.rs`): the final words, and that the fetched old values of each word form
// one order of the threads' operations (each atomic saw every earlier one and no later one).

/// The six words before the kernel: word 1 and the `u32` at word 4 all ones, the rest 0.
fn bitwise_initial() -> Vec<u64> {
    vec![0, u64::MAX, 0, 0, u32::MAX as u64, 0]
}

/// Checks `words` (after) and `olds` (three a thread) from `threads` threads (at most 64).
fn check_bitwise(threads: usize, words: &[u64], olds: &[u64]) -> Result<(), String> {
    use ibgda_kernels::xor_pattern;
    let all: u64 = if threads == 64 { u64::MAX } else { (1u64 << threads) - 1 };
    let low: u64 = (0..threads).fold(0, |m, t| m | 1 << (t % 32));
    let xor_all = (0..threads as u64).fold(0, |x, t| x ^ xor_pattern(t));
    let want = [
        all,
        !all,
        xor_all,
        low,
        (u32::MAX as u64) & !low,
        (0..threads as u64).fold(0u32, |x, t| x ^ xor_pattern(t) as u32) as u64,
    ];
    if words != want {
        return Err(format!("final words {words:x?}, expected {want:x?}"));
    }
    // Word 0 (or): ordered by what they saw, the olds grow by one bit at a time, each the
    // previous one plus the previous thread's bit, and no thread saw its own bit.
    let mut by_seen: Vec<(u64, usize)> = (0..threads).map(|t| (olds[3 * t], t)).collect();
    by_seen.sort_by_key(|&(o, _)| o.count_ones());
    let mut acc = 0u64;
    for &(o, t) in &by_seen {
        if o != acc || o >> t & 1 != 0 {
            return Err(format!("fetch_or: thread {t} saw {o:#x}, expected {acc:#x} in some order"));
        }
        acc |= 1 << t;
    }
    // Word 1 (and): the same from all ones down.
    let mut by_seen: Vec<(u64, usize)> = (0..threads).map(|t| (olds[3 * t + 1], t)).collect();
    by_seen.sort_by_key(|&(o, _)| std::cmp::Reverse(o.count_ones()));
    let mut acc = u64::MAX;
    for &(o, t) in &by_seen {
        if o != acc || o >> t & 1 == 0 {
            return Err(format!("fetch_and: thread {t} saw {o:#x}, expected {acc:#x} in some order"));
        }
        acc &= !(1 << t);
    }
    // Word 2 (xor): from 0, each value seen is the previous one xor the previous thread's
    // pattern, every thread once.
    let mut left: Vec<usize> = (0..threads).collect();
    let mut acc = 0u64;
    while !left.is_empty() {
        let Some(i) = left.iter().position(|&t| olds[3 * t + 2] == acc) else {
            return Err(format!("fetch_xor: no thread saw {acc:#x} (left: {left:?})"));
        };
        acc ^= xor_pattern(left.swap_remove(i) as u64);
    }
    Ok(())
}

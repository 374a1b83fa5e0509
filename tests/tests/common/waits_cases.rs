// The multi-word waits (scalar and `_vector` forms), shared by every CPU transport (included by
// `device_api_cases.rs`).

/// What PE 0 compares its words against in [`run_waits`]: `ibgda_test_waits`'s one value (5, what
/// the other PEs set), or `ibgda_test_waits_vector`'s `values` (word `i` against `values[i]`; the
/// other PEs set word `i` to `i + 1`).
#[derive(Clone, Copy)]
enum Against<'a> {
    Five,
    Each(&'a GroupBuffer<u64>),
}

/// Runs the waits kernel `against` picks (`mode`, PE 0 waits on `ivars[..n]`, the other PEs set
/// the words of `set_mask`) and returns PE 0's `out` (the call's result, then the `some` forms'
/// indices).
#[allow(clippy::too_many_arguments)]
fn run_waits_against(
    w: &PeGroup,
    mode: u32,
    ivars: &GroupBuffer<u64>,
    n: usize,
    status: Option<&GroupBuffer<i32>>,
    out: &GroupBuffer<u64>,
    against: Against,
    set_mask: u64,
) -> ibgda::Result<Vec<u64>> {
    w.launch_grid(1, 32, |pe, st| unsafe {
        let (ivars, out) = (w.ptr(pe, ivars).unwrap() as *mut u64, w.ptr(pe, out).unwrap() as *mut u64);
        let status = status.map_or(core::ptr::null(), |s| w.ptr(pe, s).unwrap() as *const i32);
        match against {
            Against::Five => ibgda_kernels::ibgda_test_waits(st, mode, ivars, n as u64, status, out, 5, set_mask),
            Against::Each(values) => {
                let values = w.ptr(pe, values).unwrap() as *const u64;
                ibgda_kernels::ibgda_test_waits_vector(st, mode, ivars, n as u64, status, out, values, set_mask)
            }
        }
    })?;
    Ok(w.read(0, out, 0, n + 1).unwrap())
}

/// [`run_waits_against`] the one value.
fn run_waits(
    w: &PeGroup,
    mode: u32,
    ivars: &GroupBuffer<u64>,
    n: usize,
    status: Option<&GroupBuffer<i32>>,
    out: &GroupBuffer<u64>,
    set_mask: u64,
) -> ibgda::Result<Vec<u64>> {
    run_waits_against(w, mode, ivars, n, status, out, Against::Five, set_mask)
}

#[test]
fn multi_word_waits_return_what_openshmem_says() {
    use ibgda_kernels::waits;
    let mut w = world_with(2, 1 << 20, Duration::from_secs(20));
    let n = 40;
    let ivars = w.malloc::<u64>(n).unwrap();
    let status = w.malloc::<i32>(n).unwrap();
    let out = w.malloc::<u64>(n + 1).unwrap();
    let words = |w: &PeGroup, set: &[usize]| {
        let v: Vec<u64> = (0..n).map(|i| if set.contains(&i) { 5 } else { 0 }).collect();
        w.write(0, &ivars, 0, &v).unwrap();
    };
    let exclude = |w: &PeGroup, out_of: &[usize]| {
        let v: Vec<i32> = (0..n).map(|i| out_of.contains(&i) as i32 * 7).collect();
        w.write(0, &status, 0, &v).unwrap();
        w.write(1, &status, 0, &v).unwrap();
    };
    // Words already set: `some` lists them (ascending), `status` takes one out; `any` returns the
    // lowest included one.
    words(&w, &[3, 17, 39]);
    exclude(&w, &[]);
    assert_eq!(run_waits(&w, waits::SOME, &ivars, n, None, &out, 0).unwrap()[..4], [3, 3, 17, 39]);
    exclude(&w, &[17]);
    assert_eq!(run_waits(&w, waits::SOME, &ivars, n, Some(&status), &out, 0).unwrap()[..3], [2, 3, 39]);
    // `any` with 17 and 39 set (3 excluded): successive calls start one word further, so both
    // come up within `n` calls and nothing else ever does.
    exclude(&w, &[3]);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        seen.insert(run_waits(&w, waits::ANY, &ivars, n, Some(&status), &out, 0).unwrap()[0]);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [17, 39]);
    // Nothing included, or no words: `any` says none (usize::MAX), `some` 0, `all` returns.
    exclude(&w, &(0..n).collect::<Vec<_>>());
    assert_eq!(run_waits(&w, waits::ANY, &ivars, n, Some(&status), &out, 0).unwrap()[0], u64::MAX);
    assert_eq!(run_waits(&w, waits::SOME, &ivars, n, Some(&status), &out, 0).unwrap()[0], 0);
    run_waits(&w, waits::ALL, &ivars, n, Some(&status), &out, 0).unwrap();
    assert_eq!(run_waits(&w, waits::ANY, &ivars, 0, None, &out, 0).unwrap()[0], u64::MAX);
    // A peer sets the words while PE 0 waits: `all` returns once every included word is set
    // (words 5 and 6 are excluded and never set), `any` with the one word a peer sets.
    words(&w, &[]);
    exclude(&w, &[5, 6]);
    let all_but_5_6 = ((1u64 << n) - 1) & !(1 << 5 | 1 << 6);
    assert_eq!(run_waits(&w, waits::ALL, &ivars, n, Some(&status), &out, all_but_5_6).unwrap()[0], 38);
    let got = w.read(0, &ivars, 0, n).unwrap();
    assert!((0..n).all(|i| got[i] == if i == 5 || i == 6 { 0 } else { 5 }), "{got:?}");
    words(&w, &[]);
    assert_eq!(run_waits(&w, waits::ANY, &ivars, n, None, &out, 1 << 22).unwrap()[0], 22);
    // The `test_*` forms take one look: with 3, 17 and 39 set (5 excluded), `all` fails and
    // passes once every included word is set, `any` comes up with each set word over `n` calls
    // and none when nothing is set, `some` lists them.
    words(&w, &[3, 17, 39]);
    exclude(&w, &[5]);
    assert_eq!(run_waits(&w, waits::TEST_ALL, &ivars, n, Some(&status), &out, 0).unwrap()[0], 0);
    assert_eq!(run_waits(&w, waits::TEST_SOME, &ivars, n, Some(&status), &out, 0).unwrap()[..4], [3, 3, 17, 39]);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        seen.insert(run_waits(&w, waits::TEST_ANY, &ivars, n, Some(&status), &out, 0).unwrap()[0]);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [3, 17, 39]);
    words(&w, &(0..n).filter(|&i| i != 5).collect::<Vec<_>>());
    assert_eq!(run_waits(&w, waits::TEST_ALL, &ivars, n, Some(&status), &out, 0).unwrap()[0], 1);
    words(&w, &[]);
    assert_eq!(run_waits(&w, waits::TEST_ANY, &ivars, n, Some(&status), &out, 0).unwrap()[0], u64::MAX);
    assert_eq!(run_waits(&w, waits::TEST_SOME, &ivars, n, Some(&status), &out, 0).unwrap()[0], 0);
    // `test` of word 0: below the target, then at it.
    words(&w, &[]);
    assert_eq!(run_waits(&w, waits::TEST, &ivars, n, None, &out, 0).unwrap()[0], 0);
    words(&w, &[0]);
    assert_eq!(run_waits(&w, waits::TEST, &ivars, n, None, &out, 0).unwrap()[0], 1);
}

#[test]
fn a_multi_word_wait_that_never_ends_names_the_call_and_the_word() {
    use ibgda_kernels::waits;
    let mut w = world_with(2, 1 << 20, Duration::from_millis(300));
    let n = 8;
    let ivars = w.malloc::<u64>(n).unwrap();
    let out = w.malloc::<u64>(n + 1).unwrap();
    // Every word but 6 set by the peer: `all` waits on word 6 until its timeout.
    let e = run_waits(&w, waits::ALL, &ivars, n, None, &out, 0xff & !(1 << 6)).unwrap_err();
    assert_eq!(e.device_kind(), Some(ErrorKind::Timeout), "{e}");
    let word6 = w.ptr(0, &ivars).unwrap() + 6 * 8;
    let text = e.to_string();
    assert!(
        text.contains("in wait_until_all:") && text.contains(&format!("{word6:#x} >= 5, last seen 0")),
        "{text}"
    );
}

/// [`run_waits_against`] each word's own value in `values`.
#[allow(clippy::too_many_arguments)]
fn run_vector_waits(
    w: &PeGroup,
    mode: u32,
    ivars: &GroupBuffer<u64>,
    n: usize,
    status: Option<&GroupBuffer<i32>>,
    out: &GroupBuffer<u64>,
    values: &GroupBuffer<u64>,
    set_mask: u64,
) -> ibgda::Result<Vec<u64>> {
    run_waits_against(w, mode, ivars, n, status, out, Against::Each(values), set_mask)
}

#[test]
fn vector_waits_compare_each_word_with_its_own_value() {
    use ibgda_kernels::waits;
    let mut w = world(2);
    let n = 24usize;
    let (ivars, out) = (w.malloc::<u64>(n).unwrap(), w.malloc::<u64>(n + 1).unwrap());
    let (values, status) = (w.malloc::<u64>(n).unwrap(), w.malloc::<i32>(n).unwrap());
    // Word i's value is i + 1, what the peer sets it to; words 3 and 4 are excluded.
    w.write(0, &values, 0, &(1..=n as u64).collect::<Vec<_>>()).unwrap();
    w.write(0, &status, 0, &(0..n).map(|i| (i == 3 || i == 4) as i32).collect::<Vec<_>>()).unwrap();
    let reset = |w: &PeGroup, set: &[usize]| {
        let words: Vec<u64> = (0..n).map(|i| if set.contains(&i) { i as u64 + 1 } else { 0 }).collect();
        w.write(0, &ivars, 0, &words).unwrap();
    };
    let every = (1u64 << n) - 1;
    // All: the peer sets every included word; each returns only at its own value.
    reset(&w, &[]);
    let got = run_vector_waits(&w, waits::ALL, &ivars, n, Some(&status), &out, &values, every & !(1 << 3 | 1 << 4)).unwrap();
    assert_eq!(got[0], n as u64 - 2, "every included word at its value");
    // Any: only word 17 is set; with one value for all (word 0's) no word would match.
    reset(&w, &[]);
    assert_eq!(run_vector_waits(&w, waits::ANY, &ivars, n, None, &out, &values, 1 << 17).unwrap()[0], 17);
    // Some: words 2, 9 and 20 set before, the excluded word 3 too (not reported).
    reset(&w, &[2, 3, 9, 20]);
    let got = run_vector_waits(&w, waits::SOME, &ivars, n, Some(&status), &out, &values, 0).unwrap();
    assert_eq!(&got[..4], &[3, 2, 9, 20]);
    // The test forms look once: word 5 holds 6 (its value), word 6 holds 6 (not its 7).
    let mut words = vec![0u64; n];
    words[5] = 6;
    words[6] = 6;
    w.write(0, &ivars, 0, &words).unwrap();
    assert_eq!(run_vector_waits(&w, waits::TEST_SOME, &ivars, n, None, &out, &values, 0).unwrap()[..2], [1, 5]);
    assert_eq!(run_vector_waits(&w, waits::TEST_ANY, &ivars, n, None, &out, &values, 0).unwrap()[0], 5);
    assert_eq!(run_vector_waits(&w, waits::TEST_ALL, &ivars, n, None, &out, &values, 0).unwrap()[0], 0);
    w.write(0, &ivars, 0, &(1..=n as u64).collect::<Vec<_>>()).unwrap();
    assert_eq!(run_vector_waits(&w, waits::TEST_ALL, &ivars, n, None, &out, &values, 0).unwrap()[0], 1);
}

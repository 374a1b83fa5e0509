//! The compare benchmark's rate kernels through the proxy with its default layout, on the CPU
//! emulation: many `p`s and fetching atomics per thread, every result checked.

use ibgda::transport::proxy::ProxyOptions;
use ibgda_tests::group::{Link, PeGroup};
use std::time::Duration;

#[test]
fn p_and_fetch_add_rate_kernels_through_the_default_proxy_layout() {
    let options = ProxyOptions {
        pin: false,
        ..Default::default()
    };
    let mut w = PeGroup::cpu(2, 4 << 20, Duration::from_secs(30), Link::Proxy(options)).unwrap();
    let words = w.malloc::<u64>(64).unwrap();
    let blocks = 16u32;
    let iters = 300u32;
    let wr = &w;
    wr.launch(blocks, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_p_rate(st, wr.ptr(0, &words).unwrap() as *mut u64, 1, iters, 1);
        }
    })
    .unwrap();
    assert!(w
        .read(1, &words, 0, blocks as usize)
        .unwrap()
        .iter()
        .all(|&v| v == iters as u64 - 1));
    let wr = &w;
    wr.launch(blocks, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::bench_fetch_add(st, wr.ptr(0, &words).unwrap() as *mut u64, 1, 100);
        }
    })
    .unwrap();
    assert!(w
        .read(1, &words, 0, blocks as usize)
        .unwrap()
        .iter()
        .all(|&v| v == iters as u64 - 1 + 100));
}

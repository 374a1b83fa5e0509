//! The warp-width CPU suite catches a broken warp aggregation: with `Mutant::WrongReservingLane`
//! switched on (the group's last lane reserves, the others read the first lane's empty value),
//! a thread-scope put from whole warps over IBGDA fails; with it off, the same run is exact.
//!
//! Its own test binary, because the switch is process-wide.

use ibgda::transport::ibgda::IbgdaOptions;
use ibgda_device::arch::{self, Mutant};
use ibgda_kernels::scope;
use ibgda_tests::group::{Link, PeGroup};
use ibgda_tests::random_bytes;
use std::time::Duration;

/// PE 0 puts `bytes` to PE 1 from two warps of 32 lanes, each lane its own chunk (thread scope);
/// returns the launch's outcome and whether PE 1 got every byte.
fn warp_wide_put() -> (ibgda::Result<()>, bool) {
    let options = IbgdaOptions {
        qps_per_peer: 1,
        log_depth: 8,
        ..Default::default()
    };
    let mut w = PeGroup::cpu(2, 1 << 20, Duration::from_secs(2), Link::Ibgda(options)).unwrap();
    let bytes = 64 * 1000;
    let (src, dst) = (w.malloc::<u8>(bytes).unwrap(), w.malloc::<u8>(bytes).unwrap());
    w.write(0, &src, 0, &random_bytes(41, bytes)).unwrap();
    let wr = &w;
    let r = wr.launch_grid(2, 32, |pe, st| unsafe {
        if pe == 0 {
            ibgda_kernels::ibgda_test_put(
                st,
                scope::THREAD,
                1,
                wr.ptr(0, &dst).unwrap() as *mut u8,
                wr.ptr(0, &src).unwrap() as *const u8,
                bytes as u64,
                1,
            );
        }
    });
    let exact = w.read(1, &dst, 0, bytes).unwrap() == random_bytes(41, bytes);
    (r, exact)
}

#[test]
fn wrong_reserving_lane_fails_the_warp_wide_put_and_the_real_code_passes() {
    let (ok, exact) = warp_wide_put();
    ok.expect("the real code");
    assert!(exact, "the real code delivers every byte");

    // SAFETY: this test binary runs nothing else; the broken run writes only its own world.
    unsafe { arch::set_mutant(Mutant::WrongReservingLane, true) };
    let (broken, exact) = warp_wide_put();
    // SAFETY: as above.
    unsafe { arch::set_mutant(Mutant::WrongReservingLane, false) };
    assert!(
        broken.is_err() || !exact,
        "the suite must catch a warp aggregation whose last lane reserves"
    );
    if let Err(e) = broken {
        // The failure is attributed, not a hang: a bounded device wait names what it waited for.
        let s = e.to_string();
        assert!(s.contains("PE 0"), "{s}");
    }
}

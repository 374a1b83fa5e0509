//! Shared helpers for the integration tests.

pub mod group;

/// Whether a GPU test can run here. GPU tests are `#[ignore]`d, so a plain `cargo test` lists
/// them as ignored (never as passed); run them with `--include-ignored`, where without enough
/// CUDA devices they print "skipped: ..." and return, unless `IBGDA_REQUIRE_GPU=1`, in which
/// case a missing GPU is a failure.
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

/// Two (or more) PEs with host-memory heaps, connected by IBGDA over the emulated mlx5 device,
/// without a kernel launcher: tests drive `ibgda_device::ibgda::Qp` directly from threads that
/// stand in for GPU threads.
pub mod emu_harness {
    use ibgda::emu::{HostRegion, QueuePair};
    use ibgda::nic::emulated::EmulatedIbgda;
    use ibgda::transport::ibgda::IbgdaOptions;
    use ibgda_abi::ibgda::QpDescriptor;
    use ibgda_abi::{error_state, ErrorRecord};
    use ibgda_device::ibgda::Qp;
    use std::time::Duration;

    /// Connects two emulated QPs as an RC pair: `requester` to RTS (it sends) and `responder` to
    /// RTR (it only responds).
    pub fn connect_rc(requester: &QueuePair, responder: &QueuePair) {
        requester.to_init().unwrap();
        requester.to_rtr(responder.address()).unwrap();
        requester.to_rts().unwrap();
        responder.to_init().unwrap();
        responder.to_rtr(requester.address()).unwrap();
    }

    /// The PEs, their transport and their error records.
    pub struct Harness {
        // Dropped first: the engine stops before the heaps go away.
        /// The transport (fabric, devices, QPs).
        pub ib: EmulatedIbgda,
        /// Each PE's heap.
        pub heaps: Vec<HostRegion>,
        errors: Vec<HostRegion>,
        /// Each error record's claim word (device code claims a record there, never on the
        /// record itself).
        claims: Vec<HostRegion>,
        /// Device-side wait bound.
        pub timeout: Duration,
    }

    /// The heap size of [`Harness::two_pes`].
    pub const TWO_PES_HEAP: usize = 64 << 10;

    impl Harness {
        /// Two PEs with 64 KiB heaps, one QP per peer with `2^log_depth`-WQEBB send queues and 4
        /// landing slots: what the emulated-device tests use.
        pub fn two_pes(log_depth: u32, timeout: Duration) -> Harness {
            Harness::new(
                2,
                TWO_PES_HEAP,
                IbgdaOptions {
                    qps_per_peer: 1,
                    log_depth,
                    log_landing_slots: 2,
                    ..Default::default()
                },
                timeout,
            )
        }

        /// `n` PEs with `heap` bytes each (PE `i`'s heap filled with `0x50 + i`).
        pub fn new(n: usize, heap: usize, options: IbgdaOptions, timeout: Duration) -> Harness {
            let heaps: Vec<HostRegion> = (0..n).map(|i| HostRegion::filled(heap, 4096, 0x50 + i as u8)).collect();
            let ranges: Vec<(u64, u64)> = heaps.iter().map(|h| (h.addr(), heap as u64)).collect();
            // SAFETY: the heaps live in the harness, which drops `ib` first.
            let ib = unsafe { EmulatedIbgda::connect(&ranges, options) }.expect("connect");
            let errors = (0..n).map(|_| HostRegion::for_value::<ErrorRecord>()).collect();
            let claims = (0..n).map(|_| HostRegion::for_value::<u32>()).collect();
            let h = Harness {
                ib,
                heaps,
                errors,
                claims,
                timeout,
            };
            for pe in 0..n {
                h.clear_error(pe);
            }
            h
        }

        /// The device-side handle of PE `pe`'s `index`-th QP to `peer`.
        pub fn qp(&self, pe: usize, peer: usize, index: usize) -> Qp {
            let k = self.ib.options.qps_per_peer as usize;
            let table = self.ib.pes[pe].descriptor_table() as *const QpDescriptor;
            // SAFETY: the table and everything it names live as long as the harness.
            unsafe {
                Qp::from_descriptor(
                    table.add(peer * k + index),
                    self.errors[pe].addr(),
                    pe as u32,
                    self.timeout.as_nanos() as u64,
                )
            }
        }

        /// Address of byte `off` of PE `pe`'s heap.
        pub fn addr(&self, pe: usize, off: u64) -> u64 {
            self.heaps[pe].addr() + off
        }

        /// A copy of every heap.
        pub fn snapshot(&self) -> Vec<Vec<u8>> {
            // SAFETY: plain bytes; the engine is idle when tests snapshot.
            self.heaps
                .iter()
                .map(|h| unsafe { std::slice::from_raw_parts(h.as_ptr::<u8>(), h.len()).to_vec() })
                .collect()
        }

        /// Bytes `[off, off + len)` of PE `pe`'s heap.
        pub fn read(&self, pe: usize, off: u64, len: usize) -> Vec<u8> {
            // SAFETY: in the heap (callers pass in-range offsets).
            unsafe { std::slice::from_raw_parts((self.heaps[pe].addr() + off) as *const u8, len).to_vec() }
        }

        /// Writes `data` at `off` of PE `pe`'s heap (while no operation is in flight).
        pub fn write(&self, pe: usize, off: u64, data: &[u8]) {
            assert!(off as usize + data.len() <= self.heaps[pe].len());
            // SAFETY: in range; nothing in flight.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), (self.heaps[pe].addr() + off) as *mut u8, data.len())
            };
        }

        /// Runs `f` on a fresh thread (a stand-in GPU thread of PE `pe`). Returns PE `pe`'s error
        /// record if the code trapped, `None` if it returned.
        pub fn run(&self, pe: usize, f: impl FnOnce() + Send) -> Option<ErrorRecord> {
            let trapped = std::thread::scope(|s| {
                s.spawn(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err())
                    .join()
                    .unwrap()
            });
            // SAFETY: a live record, written with atomics by the trapping thread, which has exited.
            let rec = unsafe { std::ptr::read_volatile(self.errors[pe].as_ptr::<ErrorRecord>()) };
            assert_eq!(
                trapped,
                rec.state == error_state::WRITTEN,
                "a trap always leaves a record: {rec:?}"
            );
            trapped.then_some(rec)
        }

        /// Clears PE `pe`'s error record (and its claim word).
        pub fn clear_error(&self, pe: usize) {
            let claim = self.claims[pe].as_ptr::<u32>();
            // SAFETY: no device code is running; both are live, aligned and ours.
            unsafe {
                claim.write(0);
                self.errors[pe].as_ptr::<ErrorRecord>().write(ErrorRecord {
                    claim: claim as u64,
                    ..ErrorRecord::default()
                })
            };
        }
    }

    /// The raw posts on test buffers (for tests that drive a `Qp` directly): every local range a test names is its own part of a harness
    /// heap, which nothing else touches while the NIC works on it (each test waits or quiets before
    /// reading it), which is the contract of `Qp::post_rdma`, `post_atomic` and `post_raw`.
    pub trait RawPosts {
        #[allow(clippy::too_many_arguments)]
        fn test_rdma(
            &self,
            op: ibgda_device::ibgda::Rdma,
            laddr: u64,
            lkey: u32,
            raddr: u64,
            rkey: u32,
            len: u32,
            ring: bool,
        ) -> u64;
        fn test_atomic(
            &self,
            op: ibgda_device::ibgda::AtomicOp,
            laddr: u64,
            lkey: u32,
            raddr: u64,
            rkey: u32,
            ring: bool,
        ) -> u64;
        fn test_raw(
            &self,
            wqebbs: u32,
            ring: bool,
            build: impl FnOnce(u16) -> ([ibgda_device::ibgda::wqe::Segment; 16], usize),
        ) -> u64;
    }

    impl RawPosts for Qp {
        fn test_rdma(
            &self,
            op: ibgda_device::ibgda::Rdma,
            laddr: u64,
            lkey: u32,
            raddr: u64,
            rkey: u32,
            len: u32,
            ring: bool,
        ) -> u64 {
            // SAFETY: see the trait.
            unsafe { self.post_rdma(op, laddr, lkey, raddr, rkey, len, ring) }
        }
        fn test_atomic(
            &self,
            op: ibgda_device::ibgda::AtomicOp,
            laddr: u64,
            lkey: u32,
            raddr: u64,
            rkey: u32,
            ring: bool,
        ) -> u64 {
            // SAFETY: see the trait.
            unsafe { self.post_atomic(op, laddr, lkey, raddr, rkey, ring) }
        }
        fn test_raw(
            &self,
            wqebbs: u32,
            ring: bool,
            build: impl FnOnce(u16) -> ([ibgda_device::ibgda::wqe::Segment; 16], usize),
        ) -> u64 {
            // SAFETY: see the trait.
            unsafe { self.post_raw(wqebbs, ring, build) }
        }
    }
}

/// Launches bundled kernel `name` on GPU PE `pe` (loaded with `ibgda_bundled::load`), for the GPU
/// suites: each of their calls passes exactly the argument list its kernel declares, with buffers
/// that outlive the kernel.
pub fn launch_bundled(
    pe: &ibgda::Pe,
    name: &str,
    cfg: cudarc::driver::LaunchConfig,
    args: &[ibgda::KernelArg],
) -> ibgda::Result<()> {
    // SAFETY: the callers' contract above.
    unsafe { ibgda_bundled::launch(pe, name, cfg, args) }
}

//! One PE's part of the multi-process device-API suite: started N times by `ibgda-run` (or with
//! torchrun's variables set by hand) by `tests/tests/multiprocess.rs`, on the CPU emulation or
//! GPUs, over whatever `IBGDA_TRANSPORT` says. Prints `CASE <name> OK` per passed case; any
//! failure prints `FAILED: <error>` and exits 1.
//!
//! `mp_suite device-api` runs the data-path cases; the failure cases are `die-mid-kernel`,
//! `mismatch`, and `expect-init-error`.

use ibgda::{Config, Error, Grid, Pe};
use ibgda_kernels::{
    fault, ibgda_test_atomics, ibgda_test_barrier, ibgda_test_fault, ibgda_test_get, ibgda_test_put,
    ibgda_test_put_signal, scope,
};
use ibgda_tests::random_bytes;

fn device_api(pe: &mut Pe) -> ibgda::Result<()> {
    let module = pe.load_module(ibgda_bundled::PTX)?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    println!(
        "PE {me} ({}): transport to PE {next}: {:?}",
        if pe.is_gpu() { "GPU" } else { "CPU emulation" },
        pe.transport_to(next)
    );

    // put and get at every scope, blocking and not, odd length (every alignment).
    let bytes = 100_003usize;
    let src = pe.malloc::<u8>(bytes)?;
    let dst = pe.malloc::<u8>(bytes)?;
    let got = pe.malloc::<u8>(bytes)?;
    for sc in [scope::THREAD, scope::WARP, scope::BLOCK] {
        for nbi in [0u32, 1] {
            pe.write(&src, 0, &random_bytes(me as u64 * 7 + sc as u64, bytes))?;
            pe.barrier()?;
            // SAFETY: live buffers of `bytes` bytes, alive past the synchronize.
            unsafe {
                pe.launch(
                    &module,
                    ibgda_test_put::Kernel,
                    Grid::new(5, 128),
                    (
                        pe.state(),
                        sc,
                        nbi,
                        pe.mut_ptr(&dst)?,
                        pe.const_ptr(&src)?,
                        bytes as u64,
                        next,
                    ),
                )?;
            }
            pe.barrier()?;
            // SAFETY: as above.
            unsafe {
                pe.launch(
                    &module,
                    ibgda_test_get::Kernel,
                    Grid::new(5, 128),
                    (
                        pe.state(),
                        sc,
                        nbi,
                        pe.mut_ptr(&got)?,
                        pe.const_ptr(&src)?,
                        bytes as u64,
                        prev,
                    ),
                )?;
            }
            pe.barrier()?;
            let want = random_bytes(prev as u64 * 7 + sc as u64, bytes);
            check(pe.read(&dst, 0, bytes)? == want, &format!("put scope {sc} nbi {nbi}"))?;
            check(pe.read(&got, 0, bytes)? == want, &format!("get scope {sc} nbi {nbi}"))?;
        }
    }
    println!("CASE put_get_every_scope OK (PE {me})");

    // Atomics from several blocks of PE 0 into PE 1, exact.
    let blocks = 8u32;
    let iters = 100u32;
    let words = pe.malloc::<u64>(6 + blocks as usize)?;
    let tickets = pe.malloc::<u64>(blocks as usize)?;
    pe.barrier()?;
    if me == 0 {
        // SAFETY: live buffers sized for `blocks`.
        unsafe {
            pe.launch(
                &module,
                ibgda_test_atomics::Kernel,
                Grid::new(blocks, 1),
                (pe.state(), pe.mut_ptr(&words)?, pe.mut_ptr(&tickets)?, 1, iters),
            )?;
        }
    }
    pe.barrier()?;
    if me == 1 {
        let v = pe.read(&words, 0, 6)?;
        let total = (blocks * iters) as u64;
        check(v[0] == total, &format!("u64 fetch_add: {} != {total}", v[0]))?;
        check(v[2] == total, &format!("compare_swap: {} != {total}", v[2]))?;
        let pg = pe.read(&words, 6, blocks as usize)?;
        check(
            pg == (0..blocks as u64).map(|i| i * 3 + 1).collect::<Vec<_>>(),
            "p landed",
        )?;
    }
    println!("CASE atomics OK (PE {me})");

    // Device-side barrier with p: every slot holds the round after each barrier.
    let slots = pe.malloc::<u64>(n as usize)?;
    let errors = pe.malloc::<u64>(1)?;
    pe.barrier()?;
    // SAFETY: live buffers sized for n PEs.
    unsafe {
        pe.launch(
            &module,
            ibgda_test_barrier::Kernel,
            Grid::new(1, 1),
            (pe.state(), pe.mut_ptr(&slots)?, pe.mut_ptr(&errors)?, 20),
        )?;
    }
    pe.synchronize()?;
    check(pe.read(&errors, 0, 1)?[0] == 0, "barrier slots")?;
    println!("CASE barrier OK (PE {me})");

    // put_signal ring.
    let sig = pe.malloc::<u64>(1)?;
    pe.write(&src, 0, &random_bytes(1000 + me as u64, bytes))?;
    pe.barrier()?;
    // SAFETY: live buffers.
    unsafe {
        pe.launch(
            &module,
            ibgda_test_put_signal::Kernel,
            Grid::new(4, 128),
            (
                pe.state(),
                pe.mut_ptr(&dst)?,
                pe.const_ptr(&src)?,
                pe.mut_ptr(&got)?,
                bytes as u64,
                pe.mut_ptr(&sig)?,
            ),
        )?;
    }
    pe.barrier()?;
    let want = random_bytes(1000 + prev as u64, bytes);
    check(pe.read(&dst, 0, bytes)? == want, "put_signal data")?;
    check(pe.read(&got, 0, bytes)? == want, "put_signal get")?;
    println!("CASE put_signal_ring OK (PE {me})");

    // A device fault on one PE: attributed, and nothing written anywhere (CPU emulation only:
    // a GPU context does not survive a trap).
    if !pe.is_gpu() {
        let target = pe.malloc::<u64>(8)?;
        pe.barrier()?;
        let before = pe.heap_snapshot()?;
        pe.barrier()?;
        if me == 0 {
            // SAFETY: a live buffer; the kernel's fault is the point.
            let e = unsafe {
                pe.launch(
                    &module,
                    ibgda_test_fault::Kernel,
                    Grid::new(1, 1),
                    (pe.state(), fault::INVALID_PE, pe.mut_ptr(&target)? as *mut u8, 1),
                )
            }
            .unwrap_err();
            check(
                matches!(&e, Error::Device(r) if r.pe == 0 && r.peer == n),
                &format!("invalid PE fault attributed: {e}"),
            )?;
            pe.clear_device_error()?;
        }
        pe.barrier()?;
        check(pe.heap_snapshot()? == before, "a fault wrote nothing")?;
        println!("CASE fault_invalid_pe OK (PE {me})");
    }

    // Buffers are tied to their heap and their lifetime.
    let gone = pe.malloc::<u64>(4)?;
    let copy = gone;
    pe.free(gone)?;
    check(
        matches!(pe.read(&copy, 0, 1), Err(Error::ForeignBuffer { .. })),
        "use after free is an error",
    )?;
    println!("CASE buffer_after_free OK (PE {me})");
    Ok(())
}

fn check(ok: bool, what: &str) -> ibgda::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Config {
            name: "mp_suite",
            value: what.into(),
            why: "check failed".into(),
        })
    }
}

/// PE 1 dies (SIGKILL to itself) while PE 0 waits in a kernel for its signal: PE 0 must report
/// `PeerFailed` naming PE 1, within its device timeout.
fn die_mid_kernel(pe: &mut Pe) -> ibgda::Result<()> {
    let module = pe.load_module(ibgda_bundled::PTX)?;
    let sig = pe.malloc::<u64>(1)?;
    pe.barrier()?;
    if pe.my_pe() == 1 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        println!("PE 1: killing myself");
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).ok();
        unreachable!("SIGKILL");
    }
    let t = std::time::Instant::now();
    // SAFETY: a live buffer; the wait never holds and times out.
    let r = unsafe {
        pe.launch(
            &module,
            ibgda_test_fault::Kernel,
            Grid::new(1, 1),
            (pe.state(), fault::SIGNAL_TIMEOUT, pe.mut_ptr(&sig)? as *mut u8, 1),
        )
    }
    .and_then(|_| pe.synchronize())
    .and_then(|_| pe.barrier());
    match r {
        Err(e @ Error::PeerFailed { failed_pe: 1, .. }) => {
            println!("SURVIVOR PE 0 after {:.1} s: {e}", t.elapsed().as_secs_f64());
            Ok(())
        }
        other => Err(Error::Config {
            name: "die-mid-kernel",
            value: format!("{other:?}"),
            why: "expected PeerFailed naming PE 1".into(),
        }),
    }
}

/// PE 0 calls `barrier`, every other PE `malloc`: every PE gets `CollectiveMismatch`.
fn mismatch(pe: &mut Pe) -> ibgda::Result<()> {
    let r = if pe.my_pe() == 0 {
        pe.barrier().map(|_| ())
    } else {
        pe.malloc::<u8>(64).map(|_| ())
    };
    match r {
        Err(e @ Error::CollectiveMismatch { .. }) => {
            let s = e.to_string();
            if s.contains("barrier") && s.contains("malloc") {
                println!("MISMATCH PE {}: {e}", pe.my_pe());
                return Ok(());
            }
            Err(e)
        }
        other => Err(Error::Config {
            name: "mismatch",
            value: format!("{other:?}"),
            why: "expected CollectiveMismatch naming barrier and malloc".into(),
        }),
    }
}

/// What this process's open descriptors point at, for the kinds the runtime creates (sockets for
/// the bootstrap and the fd exchange, memfds for the CPU emulation's windows). The CUDA driver's
/// own device files stay open for the life of the process and are not ours to close.
fn our_kinds_of_fds() -> Vec<String> {
    let Ok(d) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    d.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .filter(|t| t.starts_with("socket:") || t.starts_with("/memfd:"))
        .collect()
}

fn main() {
    let case = std::env::args().nth(1).unwrap_or_else(|| "device-api".into());
    // On a GPU, the driver opens descriptors of its own (sockets among them) with the first
    // context and keeps them: count from after that, so what remains is ours.
    let gpu = std::env::var("IBGDA_DEVICE").is_ok_and(|d| d == "gpu");
    if gpu && ibgda::cuda::device_count().unwrap_or(0) > 0 {
        let _ctx = cudarc::driver::CudaContext::new(0);
    }
    let fds_before = our_kinds_of_fds().len();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    };
    let pe = Pe::from_env(config);
    if case == "expect-init-error" {
        match pe {
            Err(e) => {
                println!("INIT ERROR: {e}");
                std::process::exit(0);
            }
            Ok(_) => {
                println!("FAILED: init succeeded");
                std::process::exit(1);
            }
        }
    }
    let mut pe = match pe {
        Ok(pe) => pe,
        Err(e) => {
            println!("FAILED: init: {e}");
            std::process::exit(1);
        }
    };
    let r = match case.as_str() {
        "device-api" => device_api(&mut pe),
        "die-mid-kernel" => die_mid_kernel(&mut pe),
        "mismatch" => mismatch(&mut pe),
        other => {
            println!("FAILED: unknown case {other}");
            std::process::exit(2);
        }
    };
    match r.and_then(|_| if case == "device-api" { pe.finalize() } else { Ok(()) }) {
        // Finalize dropped the PE: its sockets, memfd and exported handles must be closed.
        Ok(()) if case == "device-api" && our_kinds_of_fds().len() > fds_before => {
            println!(
                "FAILED: socket/memfd descriptors open after finalize: {:?} ({fds_before} before init); sockets: {}",
                our_kinds_of_fds(),
                std::fs::read_to_string("/proc/net/unix").unwrap_or_default()
            );
            std::process::exit(1);
        }
        Ok(()) => println!("PE DONE OK"),
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    }
}

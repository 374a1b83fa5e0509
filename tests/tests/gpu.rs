//! The device API on real GPUs: two PEs (one per GPU, or both on one GPU), P2P transport. Each
//! test prints "skipped: no CUDA device" without a GPU, and fails instead when
//! `IBGDA_REQUIRE_GPU=1`.

use ibgda::abi::ErrorKind;
use ibgda::{run_in_process, Error, KernelArg, Pe};
use ibgda_kernels::{fault, scope};
use ibgda_tests::{gpu_config, gpu_or_skip, grid, random_bytes};

fn launch(pe: &Pe, name: &str, cfg: cudarc::driver::LaunchConfig, args: &[KernelArg]) -> ibgda::Result<()> {
    // SAFETY: each test passes exactly the argument list its kernel declares.
    unsafe { pe.launch_bundled(name, cfg, args) }
}

#[test]
fn gpu_put_get_every_scope_byte_for_byte() {
    if !gpu_or_skip("gpu_put_get_every_scope_byte_for_byte", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        let n = pe.n_pes();
        let bytes = 8 * 1024 * 1024 + 13;
        let src = pe.malloc::<u8>(bytes)?;
        let dst = pe.malloc::<u8>(bytes)?;
        let got = pe.malloc::<u8>(bytes)?;
        let me = pe.my_pe();
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        for sc in [scope::THREAD, scope::WARP, scope::BLOCK] {
            for nbi in [0u32, 1] {
                let seed = 1000 + sc as u64 * 10 + nbi as u64;
                pe.write(&src, 0, &random_bytes(seed + me as u64, bytes))?;
                pe.barrier()?;
                let st = pe.state_ptr();
                let (d, s, g) = (pe.ptr(&dst), pe.ptr(&src), pe.ptr(&got));
                let nb = bytes as u64;
                launch(
                    pe,
                    "ibgda_test_put",
                    grid(64, 256),
                    &[
                        st.into(),
                        sc.into(),
                        nbi.into(),
                        d.into(),
                        s.into(),
                        nb.into(),
                        next.into(),
                    ],
                )?;
                pe.barrier()?;
                launch(
                    pe,
                    "ibgda_test_get",
                    grid(64, 256),
                    &[
                        st.into(),
                        sc.into(),
                        nbi.into(),
                        g.into(),
                        s.into(),
                        nb.into(),
                        prev.into(),
                    ],
                )?;
                pe.barrier()?;
                let want = random_bytes(seed + prev as u64, bytes);
                assert!(
                    pe.read(&dst, 0, bytes)? == want,
                    "put mismatch: PE {me} scope {sc} nbi {nbi}"
                );
                assert!(
                    pe.read(&got, 0, bytes)? == want,
                    "get mismatch: PE {me} scope {sc} nbi {nbi}"
                );
                pe.barrier()?;
            }
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn gpu_atomics_from_thousands_of_threads_are_exact() {
    if !gpu_or_skip("gpu_atomics_from_thousands_of_threads_are_exact", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        let (blocks, threads, iters) = (32u32, 256u32, 16u32);
        let nthreads = (blocks * threads) as usize;
        let words = pe.malloc::<u64>(6 + nthreads)?;
        let tickets = pe.malloc::<u64>(nthreads)?;
        pe.barrier()?;
        let peer = 1 - pe.my_pe();
        let (st, w, t) = (pe.state_ptr(), pe.ptr(&words), pe.ptr(&tickets));
        launch(
            pe,
            "ibgda_test_atomics",
            grid(blocks, threads),
            &[st.into(), w.into(), t.into(), peer.into(), iters.into()],
        )?;
        pe.barrier()?;
        // Each PE was the target of the other's atomics.
        let v = pe.read(&words, 0, 6)?;
        let total = nthreads as u64 * iters as u64;
        assert_eq!(v[0], total, "u64 fetch_add");
        assert_eq!(v[1], total, "u32 add, no carry into the upper half");
        assert_eq!(v[2], total, "compare_swap increments");
        assert_eq!(
            v[3] as i64,
            -(total as i64),
            "i64 add -1 (and every p/g round trip matched)"
        );
        let ids: u64 = (1..=nthreads as u64).fold(0, |a, b| a ^ b);
        assert_eq!(v[4] ^ v[5], ids, "swap handed out every value exactly once");
        let pg = pe.read(&words, 6, nthreads)?;
        assert!(pg.iter().enumerate().all(|(i, &x)| x == i as u64 * 3 + 1), "p values");
        let mut tk = pe.read(&tickets, 0, nthreads)?;
        tk.sort();
        tk.dedup();
        assert_eq!(tk.len(), nthreads, "fetch_add tickets are distinct");
        Ok(())
    })
    .unwrap();
}

#[test]
fn gpu_barrier_and_put_signal_ring() {
    if !gpu_or_skip("gpu_barrier_and_put_signal_ring", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        let n = pe.n_pes() as usize;
        let slots = pe.malloc::<u64>(n)?;
        let errors = pe.malloc::<u64>(1)?;
        let (st, sl, er, rounds) = (pe.state_ptr(), pe.ptr(&slots), pe.ptr(&errors), 1000u32);
        launch(
            pe,
            "ibgda_test_barrier",
            grid(1, 1),
            &[st.into(), sl.into(), er.into(), rounds.into()],
        )?;
        pe.synchronize()?;
        assert_eq!(pe.read(&errors, 0, 1)?[0], 0, "a slot was stale after barrier_all");
        assert_eq!(pe.read(&slots, 0, n)?, vec![rounds as u64; n]);

        let bytes = 4 * 1024 * 1024 + 7;
        let (src, dst, fetched, sig) = (
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u8>(bytes)?,
            pe.malloc::<u64>(1)?,
        );
        let me = pe.my_pe();
        pe.write(&src, 0, &random_bytes(77 + me as u64, bytes))?;
        pe.barrier()?;
        let (d, s, f, g, nb) = (pe.ptr(&dst), pe.ptr(&src), pe.ptr(&fetched), pe.ptr(&sig), bytes as u64);
        launch(
            pe,
            "ibgda_test_put_signal",
            grid(8, 512),
            &[st.into(), d.into(), s.into(), f.into(), nb.into(), g.into()],
        )?;
        pe.barrier()?;
        let prev = (me + pe.n_pes() - 1) % pe.n_pes();
        let want = random_bytes(77 + prev as u64, bytes);
        assert!(pe.read(&dst, 0, bytes)? == want, "put_signal data");
        assert!(pe.read(&fetched, 0, bytes)? == want, "get after signal");
        assert_eq!(pe.read(&sig, 0, 1)?[0], 8);
        Ok(())
    })
    .unwrap();
}

#[test]
fn gpu_host_side_bad_inputs() {
    if !gpu_or_skip("gpu_host_side_bad_inputs", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        let heap = pe.config().heap_size;
        let a = pe.malloc::<u8>(1000)?;
        match pe.malloc::<u8>(heap as usize * 2) {
            Err(Error::HeapExhausted { requested, .. }) => assert_eq!(requested, heap * 2),
            other => panic!("expected HeapExhausted, got {:?}", other.map(|b| b.offset())),
        }
        // The failed malloc left the heap usable.
        let b = pe.malloc::<u8>(4096)?;
        assert!(matches!(
            pe.free_offset(a.offset() + 256),
            Err(Error::ForeignFree { .. })
        ));
        assert!(matches!(pe.read(&a, 995, 10), Err(Error::OutOfBounds { .. })));
        pe.free(b)?;
        pe.free(a)?;
        assert!(matches!(pe.free(a), Err(Error::ForeignFree { .. })));
        Ok(())
    })
    .unwrap();
}

/// Runs in a child process (a trap ends the CUDA context): PE 0 runs one fault kernel.
#[test]
#[ignore = "run by gpu_device_faults_are_attributed in a child process"]
fn gpu_fault_child() {
    let mode: u32 = std::env::var("IBGDA_FAULT_MODE")
        .expect("IBGDA_FAULT_MODE")
        .parse()
        .unwrap();
    let r = run_in_process(2, gpu_config(), |pe| {
        let buf = pe.malloc::<u64>(16)?;
        pe.barrier()?;
        if pe.my_pe() == 0 {
            let base = pe.ptr(&buf);
            let addr = match mode {
                fault::OUTSIDE_HEAP => pe.heap_base() + pe.heap_size() - 8,
                fault::BELOW_HEAP => base - buf.offset() - 64,
                _ => base,
            };
            let (st, peer) = (pe.state_ptr(), 1u32);
            launch(
                pe,
                "ibgda_test_fault",
                grid(1, 1),
                &[st.into(), mode.into(), addr.into(), peer.into()],
            )?;
            pe.synchronize()?;
        }
        Ok(())
    });
    match r {
        Err(e) => println!("FAULT-RESULT kind={:?} :: {e}", e.device_kind()),
        Ok(_) => println!("FAULT-RESULT none"),
    }
}

#[test]
fn gpu_device_faults_are_attributed() {
    if !gpu_or_skip("gpu_device_faults_are_attributed", 1) {
        return;
    }
    let cases = [
        (fault::INVALID_PE, ErrorKind::InvalidPe, "invalid PE 2 (n_pes = 2)"),
        (
            fault::OUTSIDE_HEAP,
            ErrorKind::OutsideHeap,
            "outside the symmetric heap",
        ),
        (fault::BELOW_HEAP, ErrorKind::OutsideHeap, "outside the symmetric heap"),
        (
            fault::MISALIGNED_ATOMIC,
            ErrorKind::MisalignedAtomic,
            "misaligned 8-byte atomic",
        ),
        (fault::SIGNAL_TIMEOUT, ErrorKind::Timeout, "signal_wait_until"),
    ];
    for (mode, kind, text) in cases {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "gpu_fault_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IBGDA_FAULT_MODE", mode.to_string())
            .env("IBGDA_TIMEOUT_MS", "300")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.find("FAULT-RESULT").map(|i| &l[i..]))
            .unwrap_or_else(|| {
                panic!(
                    "mode {mode}: child printed no result\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        eprintln!("mode {mode}: {line}");
        assert!(line.contains(&format!("kind=Some({kind:?})")), "mode {mode}: {line}");
        assert!(
            line.contains(text) && line.contains("device error on PE 0"),
            "mode {mode}: {line}"
        );
    }
}

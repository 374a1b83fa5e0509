//! Faults on real GPUs, each reported once and attributed (PE, peer, call, counters), none a hang:
//! bad host-side inputs, device faults (in child processes: a trap ends the CUDA context), a fault
//! on a GPU two PEs share, NIC and proxy faults, and a failed PE whose heap a peer still writes.
//! Same layouts and transports as `gpu.rs`.

use ibgda::abi::{ErrorKind, TransportKind};
use ibgda::{run_in_process, Error, KernelArg};
use ibgda_kernels::fault;
use ibgda_tests::{gpu_config, gpu_or_skip, grid, launch_bundled as launch};

#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_host_side_bad_inputs() {
    if !gpu_or_skip("gpu_host_side_bad_inputs", 1) {
        return;
    }
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
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

/// Runs `gpu_fault_child` in a child process with `IBGDA_FAULT_MODE=mode` and `env` (a trap ends
/// the CUDA context, so each fault gets its own process) and returns its `FAULT-RESULT` line.
fn fault_in_child(env: &[(&str, &str)], mode: u32, timeout_ms: &str) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.envs(env.iter().copied());
    let out = cmd
        .args([
            "gpu_fault_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IBGDA_FAULT_MODE", mode.to_string())
        .env("IBGDA_TIMEOUT_MS", timeout_ms)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find("FAULT-RESULT").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| {
            panic!(
                "mode {mode}: child printed no result\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    eprintln!("mode {mode}: {line}");
    line
}

/// Runs in a child process (a trap ends the CUDA context): PE 0 runs one fault kernel (over the
/// transport the parent's environment selects; for `PUT_QUIET` with its NIC paused, or, with
/// `IBGDA_FAULT_PROXY=stall|kill`, its proxy threads paused or proxy thread 0 killed). With
/// `IBGDA_FAULT_PEER=wait`, PE 1 runs a kernel that waits meanwhile and PE 0 enters a host
/// barrier before it synchronises (with 2 PEs on one GPU, PE 1 then sees the shared context end
/// before PE 0 sees its own error).
#[test]
#[ignore = "run by gpu_device_faults_are_attributed in a child process"]
fn gpu_fault_child() {
    let mode: u32 = std::env::var("IBGDA_FAULT_MODE")
        .expect("IBGDA_FAULT_MODE")
        .parse()
        .unwrap();
    let peer_waits = std::env::var("IBGDA_FAULT_PEER").as_deref() == Ok("wait");
    let r = run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let buf = pe.malloc::<u64>(16)?;
        pe.barrier()?;
        if pe.my_pe() == 1 && peer_waits {
            // Waits on a word nobody sets (a timeout of its own only after IBGDA_TIMEOUT_MS).
            let (st, addr, peer) = (pe.state_ptr(), pe.ptr(&buf)?, 0u32);
            launch(
                pe,
                "ibgda_test_fault",
                grid(1, 1),
                &[st.into(), fault::SIGNAL_TIMEOUT.into(), addr.into(), peer.into()],
            )?;
            pe.synchronize()?;
        }
        if pe.my_pe() == 0 {
            if mode == fault::PUT_QUIET {
                let nic = pe.gpu()?.ibgda().expect("PUT_QUIET needs IBGDA or the proxy");
                match std::env::var("IBGDA_FAULT_PROXY").as_deref() {
                    Ok("stall") => nic.proxy().expect("proxy mode").set_paused(true),
                    Ok("kill") => nic.proxy().expect("proxy mode").kill_thread(0),
                    _ => nic
                        .transport
                        .emulated()
                        .expect("the emulated NIC")
                        .device()
                        .set_paused(true)?,
                }
            }
            let base = pe.ptr(&buf)?;
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
            if peer_waits {
                pe.barrier()?;
            }
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
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
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
        let line = fault_in_child(&[], mode, "300");
        assert!(line.contains(&format!("kind=Some({kind:?})")), "mode {mode}: {line}");
        assert!(
            line.contains(text) && line.contains("device error on PE 0"),
            "mode {mode}: {line}"
        );
    }
}

/// One fault, one report, with two PEs as threads sharing one GPU (one CUDA context): PE 0's kernel
/// traps while PE 1's kernel runs and PE 0 waits in a host barrier. PE 1 sees the context end
/// first; the job still reports PE 0's own device error, over P2P and over IBGDA.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_a_fault_on_a_shared_gpu_is_reported_by_the_pe_that_faulted() {
    if !gpu_or_skip("gpu_a_fault_on_a_shared_gpu_is_reported_by_the_pe_that_faulted", 1) {
        return;
    }
    for transport in ["p2p", "ibgda"] {
        let line = fault_in_child(
            &[
                ("IBGDA_FAULT_PEER", "wait"),
                ("IBGDA_PES_PER_GPU", "2"),
                ("IBGDA_TRANSPORT", transport),
            ],
            fault::INVALID_PE,
            "5000",
        );
        assert!(
            line.contains("kind=Some(InvalidPe)") && line.contains("device error on PE 0"),
            "{transport}: {line}"
        );
        assert!(!line.contains("without a device error record"), "{transport}: {line}");
    }
}

/// On the GPU, over IBGDA: a wrong rkey and a write past the peer's registered heap come back as
/// error completions with the NIC's syndrome, and a paused NIC turns `quiet` into a timeout naming
/// the QP and its counters; none hangs or passes silently.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_ibgda_nic_faults_are_attributed() {
    if !gpu_or_skip("gpu_ibgda_nic_faults_are_attributed", 1) {
        return;
    }
    let cases = [
        (fault::WRONG_RKEY, ErrorKind::CompletionError, "REMOTE_ACCESS_ERR"),
        (
            fault::NIC_OUTSIDE_REGION,
            ErrorKind::CompletionError,
            "REMOTE_ACCESS_ERR",
        ),
        (fault::PUT_QUIET, ErrorKind::Timeout, "quiet/completion wait on QP"),
    ];
    for (mode, kind, text) in cases {
        let line = fault_in_child(&[("IBGDA_TRANSPORT", "ibgda")], mode, "500");
        assert!(line.contains(&format!("kind=Some({kind:?})")), "mode {mode}: {line}");
        assert!(line.contains(text) && line.contains("PE 0"), "mode {mode}: {line}");
    }
}

/// On the GPU, through the CPU proxy: a stalled proxy turns `quiet` into a timeout naming the
/// channel and its counters, and a dead proxy thread is reported at once (well inside the 20 s
/// timeout), with why it died; neither hangs.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_proxy_faults_are_attributed() {
    if !gpu_or_skip("gpu_proxy_faults_are_attributed", 1) {
        return;
    }
    let proxy = ("IBGDA_TRANSPORT", "proxy");
    let line = fault_in_child(&[proxy, ("IBGDA_FAULT_PROXY", "stall")], fault::PUT_QUIET, "500");
    assert!(line.contains("kind=Some(Timeout)"), "{line}");
    assert!(
        line.contains("quiet/completion wait on proxy channel 0") && line.contains("PE 0"),
        "{line}"
    );
    let t = std::time::Instant::now();
    let line = fault_in_child(&[proxy, ("IBGDA_FAULT_PROXY", "kill")], fault::PUT_QUIET, "20000");
    assert!(line.contains("kind=Some(ProxyFailed)"), "{line}");
    assert!(
        line.contains("killed by fault injection") && line.contains("has died"),
        "{line}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
}

/// A PE whose job fails must not take its heap away while a peer still writes into it: PE 1
/// fails right after a barrier while PE 0 puts into PE 1's heap for a while (directly, or through
/// PE 0's NIC engine or proxy). PE 0's kernel must complete (before the fix, PE 1's heap was
/// unmapped under it: `CUDA_ERROR_ILLEGAL_ADDRESS` on PE 0, and PE 1's own error was lost), and
/// the job's error must be PE 1's.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_a_failed_pe_keeps_its_heap_until_its_peers_stop() {
    if !gpu_or_skip("gpu_a_failed_pe_keeps_its_heap_until_its_peers_stop", 1) {
        return;
    }
    let bytes: u64 = 16 << 20;
    let pe0_kernel = std::sync::Mutex::new(None);
    let r = run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let src = pe.malloc::<u8>(bytes as usize)?;
        let dst = pe.malloc::<u8>(bytes as usize)?;
        pe.barrier()?;
        if pe.my_pe() == 1 {
            return Err(Error::Config {
                name: "test",
                value: "PE 1".into(),
                why: "fails on purpose".into(),
            });
        }
        // 32 GiB over P2P, 4 GiB through a NIC path: long enough to outlive PE 1's exit.
        let iters: u32 = if pe.transport_to(1) == Some(TransportKind::P2p) {
            64
        } else {
            8
        };
        let args: [KernelArg; 8] = [
            pe.state_ptr().into(),
            0u32.into(),
            pe.ptr(&dst)?.into(),
            pe.ptr(&src)?.into(),
            bytes.into(),
            bytes.into(),
            1u32.into(),
            iters.into(),
        ];
        launch(pe, "bench_messages", grid(32, 256), &args)?;
        *pe0_kernel.lock().unwrap() = Some(pe.synchronize().map_err(|e| e.to_string()));
        pe.barrier()
    });
    let e = r.expect_err("PE 1 failed");
    assert!(
        matches!(e, Error::Config { name: "test", .. }),
        "the job's error is PE 1's own: {e}"
    );
    assert_eq!(*pe0_kernel.lock().unwrap(), Some(Ok(())), "PE 0's kernel completed");
}

//! `ibgda::run`, the one entry point of a host program, on the CPU emulation: every PE's value
//! with its rank as threads; the body's own error type, from the PE that failed (not a peer's
//! echo of it); the runtime's errors converted into it; and one process per PE under
//! `ibgda-run` (the `ring_put` example, which uses it).

use std::process::Command;

fn config() -> ibgda::Config {
    ibgda::Config {
        device: ibgda::DeviceChoice::Cpu,
        heap_size: 1 << 20,
        collective_timeout: std::time::Duration::from_secs(60),
        ..Default::default()
    }
}

/// A user's own error type: the runtime's errors convert into it.
#[derive(Debug)]
enum AppError {
    Runtime(ibgda::Error),
    WrongSum { pe: u32, got: u64 },
}

impl From<ibgda::Error> for AppError {
    fn from(e: ibgda::Error) -> Self {
        AppError::Runtime(e)
    }
}

#[test]
fn run_as_threads_returns_every_pes_value_with_its_rank() {
    let out = ibgda::run(3, config(), |pe| -> Result<u64, AppError> {
        let buf = pe.malloc::<u64>(1)?;
        pe.write(&buf, 0, &[10 + pe.my_pe() as u64])?;
        pe.barrier()?;
        Ok(pe.read(&buf, 0, 1)?[0] * pe.n_pes() as u64)
    })
    .unwrap();
    assert_eq!(out, vec![(0, 30), (1, 33), (2, 36)]);
}

#[test]
fn run_returns_the_failing_pes_own_error_not_a_peers_echo() {
    let r = ibgda::run(2, config(), |pe| -> Result<(), AppError> {
        if pe.my_pe() == 1 {
            return Err(AppError::WrongSum { pe: 1, got: 7 });
        }
        // PE 0 waits for PE 1, which never comes: the barrier returns PeerFailed.
        pe.barrier()?;
        Ok(())
    });
    match r {
        Err(AppError::WrongSum { pe: 1, got: 7 }) => {}
        other => panic!("expected PE 1's own error, got {other:?}"),
    }
}

#[test]
fn a_runtime_error_reaches_the_caller_in_the_bodys_error_type() {
    let mut c = config();
    // A heap smaller than one page cannot be created: init fails before any body runs.
    c.heap_size = 0;
    let r = ibgda::run(2, c, |_pe| -> Result<(), AppError> { Ok(()) });
    match r {
        Err(AppError::Runtime(e)) => assert!(!e.to_string().is_empty()),
        other => panic!("expected the runtime's init error, got {other:?}"),
    }
}

#[test]
fn run_under_a_launcher_is_one_pe_per_process() {
    let dir = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mp_suite"));
    let (launcher, ring_put) = (dir.with_file_name("ibgda-run"), dir.with_file_name("ring_put"));
    for p in [&launcher, &ring_put] {
        assert!(
            p.exists(),
            "{} missing: build the workspace's binaries first (cargo test at the workspace root does)",
            p.display()
        );
    }
    let o = Command::new(&launcher)
        .args(["-n", "2", "--grace", "30"])
        .arg(&ring_put)
        .args(["--bytes", "65536", "--rounds", "2"])
        .env("IBGDA_DEVICE", "cpu")
        .env("IBGDA_TRANSPORT", "ibgda")
        .env("IBGDA_PROXY_PIN", "0")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .output()
        .expect("run ibgda-run");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    assert!(text.contains("one process per PE"), "{text}");
    for pe in 0..2 {
        assert!(
            text.contains(&format!(
                "PE {pe}: 2 rounds, 65536 bytes received and fetched per round, every byte checked: OK"
            )),
            "PE {pe} did not report its own checked result:\n{text}"
        );
    }
}

#[test]
fn block_threads_says_what_the_cpu_emulation_runs() {
    let mut c = config();
    c.cpu_block_threads = 8;
    let got = ibgda::run(1, c, |pe| -> Result<Vec<u32>, AppError> {
        Ok([1, 5, 8, 64].iter().map(|&t| pe.block_threads(t)).collect())
    })
    .unwrap();
    // At most the cap; below a warp, a power of two.
    assert_eq!(got, vec![(0, vec![1, 4, 8, 8])]);
}

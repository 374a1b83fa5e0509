//! One process per PE on the CPU emulation: the device-API suite (`mp_suite`) across 2 and 4
//! processes over P2P, IBGDA on the emulated NIC and the proxy, started by `ibgda-run` and with
//! torchrun's variables set by hand; and the failure cases: a rank killed mid-kernel, PEs
//! calling different collectives, a rank that never arrives, ranks that disagree at init, a
//! rendezvous port in use. Every run checks that nothing is left behind.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// The jobs spin CPU threads; running two at once on a 2-core machine only makes both slow.
static ONE_JOB: Mutex<()> = Mutex::new(());

fn suite() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mp_suite"))
}

fn launcher() -> PathBuf {
    let p = suite().with_file_name("ibgda-run");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (cargo test at the workspace root does)",
        p.display()
    );
    p
}

fn base_env(cmd: &mut Command, transport: &str) {
    cmd.env("IBGDA_DEVICE", "cpu")
        .env("IBGDA_TRANSPORT", transport)
        .env("IBGDA_SYMMETRIC_SIZE", "16M")
        .env("IBGDA_PROXY_PIN", "0")
        .env("IBGDA_TIMEOUT_MS", "20000")
        .env("IBGDA_COLLECTIVE_TIMEOUT_MS", "60000")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID");
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Nothing of ours outlives a job: no abstract socket bound (fd exchange), no shared-memory
/// object (our windows are memfds, which have no name at all).
fn assert_nothing_left_behind() {
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let ours: Vec<&str> = unix.lines().filter(|l| l.contains("@ibgda-")).collect();
    assert!(ours.is_empty(), "sockets left behind: {ours:?}");
    if let Ok(d) = std::fs::read_dir("/dev/shm") {
        let names: Vec<String> = d
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("ibgda"))
            .collect();
        assert!(names.is_empty(), "shared-memory objects left behind: {names:?}");
    }
}

fn run_with_launcher(n: u32, transport: &str, case: &str, extra: &[(&str, &str)]) -> Output {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(launcher());
    cmd.args(["-n", &n.to_string(), "--grace", "30"]).arg(suite()).arg(case);
    base_env(&mut cmd, transport);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run ibgda-run");
    assert_nothing_left_behind();
    o
}

/// Starts ranks by hand with torchrun's variables, `per_rank` adding each rank's own.
fn run_by_hand(world: u32, ranks: &[u32], case: &str, per_rank: impl Fn(u32, &mut Command)) -> Vec<Output> {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = ranks
        .iter()
        .map(|&r| {
            let mut cmd = Command::new(suite());
            cmd.arg(case);
            base_env(&mut cmd, "ibgda");
            cmd.env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            per_rank(r, &mut cmd);
            cmd.spawn().expect("spawn mp_suite")
        })
        .collect();
    let out = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    assert_nothing_left_behind();
    out
}

fn assert_suite_passed(o: &Output, n: u32, transport: &str) {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    assert_eq!(
        t.matches("(CPU emulation): transport to PE").count(),
        t.matches(&format!(": Some({transport})")).count(),
        "every PE reaches its peer by {transport}\n{t}"
    );
    assert_eq!(t.matches(&format!(": Some({transport})")).count(), n as usize, "{t}");
    for case in [
        "put_get_every_scope",
        "atomics",
        "barrier",
        "put_signal_ring",
        "fault_invalid_pe",
        "buffer_after_free",
    ] {
        assert_eq!(
            t.matches(&format!("CASE {case} OK")).count(),
            n as usize,
            "{case} on every PE\n{t}"
        );
    }
    assert_eq!(t.matches("PE DONE OK").count(), n as usize, "{t}");
}

#[test]
fn device_api_over_p2p_across_2_and_4_processes() {
    for n in [2, 4] {
        assert_suite_passed(&run_with_launcher(n, "p2p", "device-api", &[]), n, "P2p");
    }
}

#[test]
fn device_api_over_ibgda_across_2_and_4_processes() {
    for n in [2, 4] {
        assert_suite_passed(&run_with_launcher(n, "ibgda", "device-api", &[]), n, "Ibgda");
    }
}

#[test]
fn device_api_over_the_proxy_across_2_and_4_processes() {
    for n in [2, 4] {
        assert_suite_passed(&run_with_launcher(n, "proxy", "device-api", &[]), n, "Proxy");
    }
}

#[test]
fn device_api_with_torchrun_variables_set_by_hand() {
    let outs = run_by_hand(2, &[0, 1], "device-api", |_, _| {});
    for o in &outs {
        assert_suite_passed(o, 1, "Ibgda");
    }
}

#[test]
fn a_rank_killed_mid_kernel_is_named_by_the_survivor() {
    let o = run_with_launcher(2, "ibgda", "die-mid-kernel", &[("IBGDA_TIMEOUT_MS", "3000")]);
    let t = text(&o);
    assert!(!o.status.success(), "the job must fail\n{t}");
    assert!(
        t.contains("rank 1") && t.contains("signal 9"),
        "the launcher names the killed rank\n{t}"
    );
    assert!(
        t.contains("SURVIVOR PE 0") && t.contains("PE 1 has failed"),
        "PE 0 reports PeerFailed naming PE 1\n{t}"
    );
}

#[test]
fn different_collectives_fail_on_every_rank_naming_both() {
    let o = run_with_launcher(3, "p2p", "mismatch", &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(t.matches("MISMATCH PE").count(), 3, "{t}");
}

#[test]
fn a_rank_that_never_arrives_is_named() {
    let outs = run_by_hand(2, &[0], "expect-init-error", |_, c| {
        c.env("IBGDA_COLLECTIVE_TIMEOUT_MS", "1500");
    });
    let t = text(&outs[0]);
    assert!(outs[0].status.success(), "{t}");
    assert!(t.contains("timed out") && t.contains("[1]"), "{t}");
}

#[test]
fn ranks_that_disagree_on_heap_size_scratch_or_world_size_fail_at_init_naming_it() {
    let outs = run_by_hand(2, &[0, 1], "expect-init-error", |r, c| {
        c.env("IBGDA_SYMMETRIC_SIZE", if r == 0 { "16M" } else { "32M" });
    });
    for o in &outs {
        let t = text(o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains("IBGDA_SYMMETRIC_SIZE"), "{t}");
    }
    // The reductions' scratch, symmetric like the heap (a 64th of 16M is 256K: both fit).
    let outs = run_by_hand(2, &[0, 1], "expect-init-error", |r, c| {
        c.env("IBGDA_SYMMETRIC_SIZE", "16M");
        c.env("IBGDA_COLLECTIVE_SCRATCH", if r == 0 { "64K" } else { "128K" });
    });
    for o in &outs {
        let t = text(o);
        assert!(o.status.success(), "{t}");
        assert!(
            t.contains("IBGDA_COLLECTIVE_SCRATCH") && t.contains("65536") && t.contains("131072"),
            "{t}"
        );
    }
    let outs = run_by_hand(2, &[0, 1], "expect-init-error", |r, c| {
        if r == 1 {
            c.env("WORLD_SIZE", "3");
        }
    });
    for o in &outs {
        let t = text(o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains("WORLD_SIZE"), "{t}");
    }
}

#[test]
fn a_rendezvous_port_in_use_is_a_clear_error() {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut cmd = Command::new(suite());
    cmd.arg("expect-init-error");
    base_env(&mut cmd, "p2p");
    cmd.env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    let o = cmd.output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("already in use") && t.contains(&port.to_string()), "{t}");
}

#[test]
fn an_unreachable_rendezvous_is_a_clear_error() {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    // Rank 1 alone: nobody listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(suite());
    cmd.arg("expect-init-error");
    base_env(&mut cmd, "p2p");
    cmd.env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("IBGDA_COLLECTIVE_TIMEOUT_MS", "1000");
    let o = cmd.output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("rank 0 did not accept") && t.contains("MASTER_ADDR/MASTER_PORT"),
        "{t}"
    );
}

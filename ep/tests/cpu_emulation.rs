//! Dispatch and combine against the host reference on the CPU emulation: 2 and 4 PEs, as threads
//! and as processes, over P2P, IBGDA (emulated NIC) and the CPU proxy. The cases themselves are
//! in `ibgda_ep::check` (random routings, tokens routed nowhere, every token to one rank, zero
//! tokens, several experts of one rank per token, FP8 round-off, bad inputs).

use ibgda::{run_in_process, Config, DeviceChoice, PeerTransport};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// One case at a time: each starts a PE per thread or process, and the machine may have 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn config(t: PeerTransport) -> Config {
    let mut c = Config::default().with_transport(t);
    c.device = DeviceChoice::Cpu;
    c.timeout = Duration::from_secs(120);
    c
}

fn threads(pes: u32, t: PeerTransport) {
    threads_with(pes, config(t));
}

fn threads_with(pes: u32, c: Config) {
    let t = c.transport;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let reports = run_in_process(pes, c, |pe| Ok(ibgda_ep::check::run(pe, 256, 1))).expect("PEs came up");
    for (pe, r) in reports.into_iter().enumerate() {
        let r = r.unwrap_or_else(|e| panic!("PE {pe} over {t:?}: {e}"));
        assert_eq!(r.cases.len(), 10, "PE {pe}: {:?}", r.cases);
        // The random cases route rows to every rank.
        assert!(r.rows > 0, "PE {pe} compared no rows");
    }
}

#[test]
fn two_threads_p2p() {
    threads(2, PeerTransport::P2p);
}

#[test]
fn two_threads_ibgda() {
    threads(2, PeerTransport::Ibgda);
}

#[test]
fn two_threads_proxy() {
    threads(2, PeerTransport::Proxy);
}

#[test]
fn four_threads_p2p() {
    threads(4, PeerTransport::P2p);
}

/// Blocks of 64 CPU threads (two warps of 32 lanes, as on a GPU), so the kernels' warp-wide
/// paths run as they do there: the low-latency FP8 dispatch's eight lanes per 128-channel group
/// agreeing on the group's scale by shuffles, the warps' shares of rows and tokens.
#[test]
fn two_threads_p2p_gpu_wide_warps() {
    let mut c = config(PeerTransport::P2p);
    c.cpu_block_threads = 64;
    threads_with(2, c);
}

fn launcher() -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ep_check"));
    let run = exe.parent()?.join("ibgda-run");
    run.exists().then_some(run)
}

fn processes(n: u32, transport: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(run) = launcher() else {
        panic!(
            "ibgda-run is not built next to ep_check: run `cargo build -p ibgda --bins` first (scripts/test.sh does)"
        );
    };
    let out = Command::new(run)
        .args(["-n", &n.to_string(), env!("CARGO_BIN_EXE_ep_check"), "--rounds", "3"])
        .env("IBGDA_DEVICE", "cpu")
        .env("IBGDA_TRANSPORT", transport)
        .env("IBGDA_TIMEOUT_MS", "120000")
        .output()
        .expect("ibgda-run starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ibgda-run -n {n} ep_check over {transport}: {}\n{stdout}\n{stderr}",
        out.status
    );
    for pe in 0..n {
        assert!(
            stdout.contains(&format!("ep-check: PE {pe}/{n} (cpu emulation"))
                && stdout.matches(": ok").count() == n as usize,
            "PE {pe} did not report: {stdout}\n{stderr}"
        );
    }
}

#[test]
fn two_processes_p2p() {
    processes(2, "p2p");
}

#[test]
fn two_processes_ibgda() {
    processes(2, "ibgda");
}

#[test]
fn two_processes_proxy() {
    processes(2, "proxy");
}

#[test]
fn four_processes_p2p() {
    processes(4, "p2p");
}

/// Mixed routes in one job: PE 3 is behind the emulated NIC for everyone, the others reach each
/// other by loads and stores. PEs 0-2 then run the NIC kernels with NVLink peers among their
/// peers (the one-launch HT combine's stored-and-flagged chunks beside its WRITEs and signals).
#[test]
fn four_processes_one_behind_a_nic() {
    processes(4, "p2p,3=ibgda");
}

/// `ep_bench` on the CPU emulation across 2 processes over the emulated NIC: its result checks
/// (sampled rows against the senders', combine of all-ones rows, low-latency counts and sums)
/// pass, and it writes every row of the CSV.
#[test]
fn bench_checks_its_results_across_processes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = PathBuf::from(env!("CARGO_BIN_EXE_ep_bench"))
        .parent()
        .unwrap()
        .join("ibgda-run");
    assert!(
        run.exists(),
        "ibgda-run is not built next to ep_bench: run `cargo build -p ibgda --bins` first"
    );
    let csv = std::env::temp_dir().join(format!("ep-bench-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&csv);
    let out = Command::new(run)
        .args(["-n", "2", env!("CARGO_BIN_EXE_ep_bench")])
        .args(["--tokens", "48,96", "--hidden", "256", "--experts", "16", "--topk", "4"])
        .args(["--ll-tokens", "16", "--iters", "1", "--num-sms", "3", "--csv"])
        .arg(&csv)
        .env("IBGDA_DEVICE", "cpu")
        .env("IBGDA_TRANSPORT", "ibgda")
        .env("IBGDA_TIMEOUT_MS", "120000")
        .output()
        .expect("ibgda-run starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("every result checked"), "{stdout}");
    let rows = std::fs::read_to_string(&csv).expect("the CSV was written");
    let _ = std::fs::remove_file(&csv);
    assert_eq!(rows.lines().next(), Some("system,mode,metric,tokens,value,unit"));
    // 2 token counts x 13 high-throughput metrics + 8 low-latency ones (each call's latency and
    // bandwidth, and its send and receive halves), all from ibgda-ep/ibgda.
    let data: Vec<&str> = rows.lines().skip(1).collect();
    assert_eq!(data.len(), 34, "{rows}");
    assert!(data.iter().all(|l| l.starts_with("ibgda-ep/ibgda,")), "{rows}");
    for half in ["dispatch_send", "dispatch_recv", "combine_send", "combine_recv"] {
        assert!(
            data.iter().any(|l| l.contains(&format!(",ll,{half}_latency,16,"))),
            "{half}: {rows}"
        );
    }
    for half in [
        "dispatch_recount",
        "dispatch_notify",
        "dispatch_notify_aligned",
        "dispatch_send",
        "dispatch_recv",
        "combine_send",
        "combine_reduce",
        "dispatch_recv_only",
        "combine_reduce_only",
    ] {
        for tokens in [48, 96] {
            assert!(
                data.iter()
                    .any(|l| l.contains(&format!(",ht,{half}_latency,{tokens},"))),
                "{half}: {rows}"
            );
        }
    }
}

//! `ptx-check PTXAS FILE.ptx...`: lints each PTX module (`check_ptx`) and assembles it with
//! `ptxas -arch=sm_90`, failing on any finding, assembler error, or stack frame / spill reported by
//! ptxas.
use std::process::{exit, Command};

fn main() {
    // ptx-check FILE.ptx... (ptxas found as the builder finds it), or ptx-check PTXAS FILE.ptx...
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let ptxas = if args.first().is_some_and(|a| !a.ends_with(".ptx")) {
        args.remove(0)
    } else {
        match ibgda_nvptx_builder::find_ptxas() {
            Ok(p) => p.display().to_string(),
            Err(e) => {
                eprintln!("ptx-check: {e}");
                exit(2);
            }
        }
    };
    let files = args;
    if files.is_empty() {
        eprintln!("ptx-check: no PTX files given (was the nvptx build run?)");
        exit(2);
    }
    let mut bad = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        for finding in ibgda_nvptx_builder::check_ptx(&text) {
            eprintln!("{f}:{}: {}: {}", finding.line, finding.what, finding.text);
            bad += 1;
        }
        let out = Command::new(&ptxas)
            .args(["-arch=sm_90", "-v", "-o", "/dev/null", f])
            .output()
            .unwrap_or_else(|e| panic!("running {ptxas}: {e}"));
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            eprintln!("{f}: ptxas failed:\n{log}");
            bad += 1;
        }
        // ptxas -v prints "Function properties for NAME" and then the frame line.
        let mut function = String::new();
        let mut frames = 0;
        for l in log.lines() {
            if let Some(f) = l.split("Function properties for ").nth(1) {
                function = f.trim().to_string();
            } else if l.contains("stack frame")
                && !l.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
                && !ibgda_nvptx_builder::local_memory_allowed(&function)
            {
                frames += 1;
            }
        }
        if frames > 0 {
            eprintln!("{f}: {frames} function(s) with a stack frame or spills:\n{log}");
            bad += 1;
        }
        let entries = text.matches(".entry").count();
        println!(
            "{f}: {entries} kernels, ptxas sm_90 ok, no panic/fmt/local memory (outside {:?})",
            ibgda_nvptx_builder::LOCAL_MEMORY_ALLOWED
        );
    }
    if bad > 0 {
        eprintln!("ptx-check: {bad} problem(s)");
        exit(1);
    }
}

//! `ibgda-nvptx-builder`: compiles a `#![no_std]` Rust kernel crate to PTX from a `build.rs`.
//!
//! ```no_run
//! // build.rs of a host crate whose kernels live in ../my-kernels; the crate then embeds
//! // include_str!(concat!(env!("OUT_DIR"), "/my_kernels.ptx"))
//! ibgda_nvptx_builder::KernelCrate::new("../my-kernels").build_for_build_script();
//! ```
//!
//! The kernel crate needs no configuration of its own: the builder runs Debian's `cargo`/`rustc`
//! 1.96 with `-Zbuild-std=core` for `nvptx64-nvidia-cuda`, `-Ctarget-cpu=sm_90`,
//! `+ptx85`, `-Cpanic=immediate-abort`, fat LTO, and `llvm-bitcode-linker` with LLVM 22's tools
//! first on `PATH`; builds the crate's library as a `cdylib`; copies `<lib_name>.ptx` into
//! `OUT_DIR`; and asks cargo to rerun the build script when any source file the kernel was built
//! from changes (read from the build's own dep-info).
//!
//! When the toolchain is missing, the build fails with a message naming what is missing and the
//! command that installs it. It never substitutes stale or stub PTX.
//!
//! The toolchain is installed once per machine by [`setup_command`] (this package's
//! `setup-toolchain.sh`, found wherever cargo put the package: a path or git dependency works
//! the same): Debian's packages system-wide, `llvm-bitcode-linker` and `ptxas` into the per-user
//! [`tools_dir`]. Nothing is written into any checkout.
//!
//! Environment overrides: `IBGDA_NVPTX_CARGO` (default `/usr/bin/cargo`), `IBGDA_NVPTX_RUSTC`
//! (`/usr/bin/rustc`), `IBGDA_LLVM_BIN` (`/usr/lib/llvm-22/bin`), `IBGDA_TOOLS` (the tools
//! directory, default `${XDG_DATA_HOME:-~/.local/share}/ibgda-rs`), `IBGDA_NVPTX_LINKER` (default:
//! the tools directory's `bin/llvm-bitcode-linker`, then rustc's own `rustlib/<host>/bin`),
//! `IBGDA_PTXAS` (default: the tools directory's `bin/ptxas`, then `ptxas` on `PATH`),
//! `IBGDA_NVPTX_CPU` (`sm_90`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The command that installs the toolchain (printed in every "missing" error): this package's
/// `setup-toolchain.sh`, at its absolute path in this build (inside the ibgda-rs checkout, or
/// where cargo keeps a git dependency's sources).
pub fn setup_command() -> String {
    format!("bash {}/setup-toolchain.sh", env!("CARGO_MANIFEST_DIR"))
}

/// The per-user directory the toolchain's own tools are installed into (`bin/llvm-bitcode-linker`,
/// `bin/ptxas`): `IBGDA_TOOLS`, else `$XDG_DATA_HOME/ibgda-rs`, else `~/.local/share/ibgda-rs`.
pub fn tools_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("IBGDA_TOOLS") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("ibgda-rs"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/ibgda-rs"))
}

/// `ptxas` (to assemble PTX and report registers and spills): `IBGDA_PTXAS`, else the tools
/// directory's `bin/ptxas`, else `ptxas` on `PATH`.
pub fn find_ptxas() -> Result<PathBuf, BuildError> {
    if let Some(p) = std::env::var_os("IBGDA_PTXAS") {
        return Ok(PathBuf::from(p));
    }
    let ours = tools_dir().map(|d| d.join("bin/ptxas"));
    if let Some(p) = ours.as_ref().filter(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| BuildError::ToolchainMissing {
        what: "ptxas".into(),
        looked: ours.unwrap_or_else(|| PathBuf::from("ptxas")),
    })
}

/// Why a kernel crate could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// A toolchain component is not installed.
    ToolchainMissing {
        /// What is missing.
        what: String,
        /// Where it was looked for.
        looked: PathBuf,
    },
    /// The kernel crate's manifest does not exist.
    NoManifest(PathBuf),
    /// The nvptx build ran and failed; its stderr is included.
    CompileFailed {
        /// The crate that failed.
        crate_dir: PathBuf,
        /// Compiler output.
        stderr: String,
    },
    /// The build succeeded but produced no PTX, or PTX without any kernel entry.
    BadOutput {
        /// The file that was expected or read.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An I/O error.
    Io(std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::ToolchainMissing { what, looked } => write!(
                f,
                "nvptx toolchain incomplete: {what} not found at {}; install it with `{}` (Debian's rustc-web, cargo-web, rust-web-src and llvm-22 system-wide; llvm-bitcode-linker and ptxas into {})",
                looked.display(),
                setup_command(),
                tools_dir().map_or_else(|| "$IBGDA_TOOLS".into(), |d| d.display().to_string())
            ),
            BuildError::NoManifest(p) => write!(f, "kernel crate manifest {} does not exist", p.display()),
            BuildError::CompileFailed { crate_dir, stderr } => {
                write!(
                    f,
                    "building kernel crate {} for nvptx64 failed:\n{stderr}",
                    crate_dir.display()
                )
            }
            BuildError::BadOutput { path, reason } => write!(f, "kernel PTX {}: {reason}", path.display()),
            BuildError::Io(e) => write!(f, "i/o error while building kernels: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

impl From<std::io::Error> for BuildError {
    fn from(e: std::io::Error) -> Self {
        BuildError::Io(e)
    }
}

/// The tools an nvptx build needs, resolved and checked.
#[derive(Clone, Debug)]
pub struct Toolchain {
    /// Debian's cargo (1.96).
    pub cargo: PathBuf,
    /// Debian's rustc (1.96).
    pub rustc: PathBuf,
    /// LLVM 22's bin directory (llvm-link, opt, llc).
    pub llvm_bin: PathBuf,
    /// llvm-bitcode-linker.
    pub linker: PathBuf,
    /// The SM to compile for.
    pub cpu: String,
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

impl Toolchain {
    /// Finds the toolchain (see the crate docs for the overrides) and checks every part exists.
    pub fn locate() -> Result<Toolchain, BuildError> {
        let cargo = env_path("IBGDA_NVPTX_CARGO", "/usr/bin/cargo");
        let rustc = env_path("IBGDA_NVPTX_RUSTC", "/usr/bin/rustc");
        let llvm_bin = env_path("IBGDA_LLVM_BIN", "/usr/lib/llvm-22/bin");
        let missing = |what: &str, looked: &Path| BuildError::ToolchainMissing {
            what: what.to_string(),
            looked: looked.to_path_buf(),
        };
        if !cargo.is_file() {
            return Err(missing("Debian cargo-web (cargo 1.96)", &cargo));
        }
        if !rustc.is_file() {
            return Err(missing("Debian rustc-web (rustc 1.96)", &rustc));
        }
        for tool in ["llvm-link", "opt", "llc"] {
            let p = llvm_bin.join(tool);
            if !p.is_file() {
                return Err(missing(&format!("LLVM 22 `{tool}`"), &p));
            }
        }
        let src = Path::new("/usr/lib/rustlib/src/rust/library/core");
        if std::env::var_os("IBGDA_NVPTX_RUSTC").is_none() && !src.is_dir() {
            return Err(missing("rust-web-src (core library sources for -Zbuild-std)", src));
        }
        let linker = match std::env::var_os("IBGDA_NVPTX_LINKER") {
            Some(p) => PathBuf::from(p),
            None => {
                let ours = tools_dir().map(|d| d.join("bin/llvm-bitcode-linker"));
                let rustlib = Path::new("/usr/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-bitcode-linker");
                match ours {
                    Some(p) if p.is_file() || !rustlib.is_file() => p,
                    _ => rustlib.to_path_buf(),
                }
            }
        };
        if !linker.is_file() {
            return Err(missing("llvm-bitcode-linker", &linker));
        }
        let cpu = std::env::var("IBGDA_NVPTX_CPU").unwrap_or_else(|_| "sm_90".to_string());
        Ok(Toolchain {
            cargo,
            rustc,
            llvm_bin,
            linker: linker.canonicalize()?,
            cpu,
        })
    }
}

/// A `#![no_std]` kernel crate to build to PTX.
#[derive(Clone, Debug)]
pub struct KernelCrate {
    dir: PathBuf,
    features: Vec<String>,
    target_dir: Option<PathBuf>,
}

/// What a successful build produced.
#[derive(Clone, Debug)]
pub struct BuiltPtx {
    /// The PTX file (in `OUT_DIR` when built from a build script, else in the target dir).
    pub path: PathBuf,
    /// The crate's library name (`lib_name.ptx`).
    pub lib_name: String,
    /// Every source file the kernel was compiled from (outside the Rust library sources).
    pub sources: Vec<PathBuf>,
}

impl KernelCrate {
    /// The crate whose `Cargo.toml` is in `dir` (relative paths are relative to the current
    /// directory, which for a build script is its package's root).
    pub fn new(dir: impl AsRef<Path>) -> Self {
        KernelCrate {
            dir: dir.as_ref().to_path_buf(),
            features: Vec::new(),
            target_dir: None,
        }
    }

    /// Enables a cargo feature of the kernel crate.
    pub fn feature(mut self, f: &str) -> Self {
        self.features.push(f.to_string());
        self
    }

    /// Uses `dir` as the nvptx target directory (default: `<host target dir>/nvptx` from a build
    /// script, `<crate>/target` otherwise).
    pub fn target_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.target_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    fn lib_name(manifest: &Path) -> Result<String, BuildError> {
        let text = std::fs::read_to_string(manifest)?;
        // The [lib] name if given, else the package name; '-' becomes '_' as rustc does.
        let mut section = "";
        let (mut pkg, mut lib) = (None, None);
        for line in text.lines() {
            let l = line.trim();
            if l.starts_with('[') {
                section = l;
                continue;
            }
            if let Some(rest) = l.strip_prefix("name") {
                let v = rest
                    .trim_start()
                    .strip_prefix('=')
                    .map(|v| v.trim().trim_matches('"').to_string());
                match section {
                    "[package]" => pkg = pkg.or(v),
                    "[lib]" => lib = lib.or(v),
                    _ => {}
                }
            }
        }
        lib.or(pkg)
            .map(|n| n.replace('-', "_"))
            .ok_or_else(|| BuildError::BadOutput {
                path: manifest.to_path_buf(),
                reason: "no package name in the manifest".into(),
            })
    }

    /// Builds the crate to PTX and returns where it is. Does not print cargo directives.
    pub fn build(&self) -> Result<BuiltPtx, BuildError> {
        let tc = Toolchain::locate()?;
        let dir = self
            .dir
            .canonicalize()
            .map_err(|_| BuildError::NoManifest(self.dir.join("Cargo.toml")))?;
        let manifest = dir.join("Cargo.toml");
        if !manifest.is_file() {
            return Err(BuildError::NoManifest(manifest));
        }
        let lib_name = Self::lib_name(&manifest)?;
        let target_dir = match &self.target_dir {
            Some(d) => d.clone(),
            None => default_target_dir().unwrap_or_else(|| dir.join("target")),
        };
        let flags = [
            "-Zunstable-options".to_string(),
            "-Cpanic=immediate-abort".to_string(),
            format!("-Ctarget-cpu={}", tc.cpu),
            "-Ctarget-feature=+ptx85".to_string(),
        ];
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![tc.llvm_bin.clone()];
        paths.extend(std::env::split_paths(&path));
        let mut cmd = Command::new(&tc.cargo);
        cmd.current_dir(&dir)
            .args(["rustc", "--release", "--lib", "--crate-type", "cdylib"])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .args(["--config", "profile.release.lto=\"fat\""])
            .args(["--config", "profile.release.codegen-units=1"])
            .args(["--config", "profile.release.opt-level=3"])
            .args(["--config", "profile.release.debug=false"])
            .args(["--config", "profile.release.overflow-checks=false"])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir);
        if !self.features.is_empty() {
            cmd.args(["--features", &self.features.join(",")]);
        }
        for v in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET_DIR",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_MAKEFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "RUSTDOCFLAGS",
            "CARGO",
            "CARGO_MANIFEST_DIR",
            "CARGO_PRIMARY_PACKAGE",
            "RUSTC_LINKER",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTC", &tc.rustc)
            .env("PATH", std::env::join_paths(paths).expect("PATH"))
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", &tc.linker)
            .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
        let out = cmd.output()?;
        if !out.status.success() {
            return Err(BuildError::CompileFailed {
                crate_dir: dir,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let artifact_dir = target_dir.join("nvptx64-nvidia-cuda/release");
        let built = artifact_dir.join(format!("{lib_name}.ptx"));
        let text = std::fs::read_to_string(&built).map_err(|e| BuildError::BadOutput {
            path: built.clone(),
            reason: format!("not produced by the build ({e})"),
        })?;
        if !text.contains(".entry") {
            return Err(BuildError::BadOutput {
                path: built,
                reason:
                    "contains no kernel (.entry); kernels need #[unsafe(no_mangle)] pub unsafe extern \"gpu-kernel\" fn"
                        .into(),
            });
        }
        let sources = read_dep_info(&artifact_dir.join(format!("{lib_name}.d")));
        let dest = match std::env::var_os("OUT_DIR") {
            Some(out_dir) => {
                let d = PathBuf::from(out_dir).join(format!("{lib_name}.ptx"));
                std::fs::write(&d, &text)?;
                d
            }
            None => built,
        };
        Ok(BuiltPtx {
            path: dest,
            lib_name,
            sources,
        })
    }

    /// [`KernelCrate::build`] for a build script: prints the `rerun-if-*` directives and, on
    /// failure, stops the build with the error (which names the fix).
    pub fn build_for_build_script(&self) -> BuiltPtx {
        for v in [
            "IBGDA_NVPTX_CARGO",
            "IBGDA_NVPTX_RUSTC",
            "IBGDA_LLVM_BIN",
            "IBGDA_NVPTX_LINKER",
            "IBGDA_NVPTX_CPU",
        ] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        println!("cargo:rerun-if-changed={}", self.dir.join("Cargo.toml").display());
        println!("cargo:rerun-if-changed={}", self.dir.join("src").display());
        match self.build() {
            Ok(built) => {
                for s in &built.sources {
                    println!("cargo:rerun-if-changed={}", s.display());
                }
                built
            }
            Err(e) => {
                eprintln!("error: {e}");
                panic!("{e}");
            }
        }
    }
}

/// `<host target dir>/nvptx` derived from a build script's `OUT_DIR`
/// (`<target>/<profile>/build/<pkg>-<hash>/out`). A directory of its own, so the inner cargo never
/// waits on the outer build's lock; shared by every package, so `core` is built once.
fn default_target_dir() -> Option<PathBuf> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let target = out.ancestors().nth(4)?;
    Some(target.join("nvptx"))
}

/// Source files named by a cargo dep-info file, minus the Rust library's own sources.
fn read_dep_info(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        // Paths are space-separated, with spaces inside a path escaped as "\ ".
        let mut cur = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\\' && chars.peek() == Some(&' ') {
                cur.push(' ');
                chars.next();
            } else if c == ' ' {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            } else {
                cur.push(c);
            }
        }
        if !cur.is_empty() {
            out.push(PathBuf::from(cur));
        }
    }
    out.retain(|p| !p.starts_with("/usr/src") && !p.starts_with("/usr/lib/rustlib"));
    out.sort();
    out.dedup();
    out
}

/// Problems [`check_ptx`] finds in a PTX module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxFinding {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub what: String,
    /// The line's text.
    pub text: String,
}

/// Functions allowed a local-memory stack frame: the emulated NIC's engine (the kernel and the
/// `ibgda_nic_emu` code it calls), which gathers each WQE into a 256-byte local buffer. It
/// plays the NIC, not a user kernel, and runs on its own SMs.
pub const LOCAL_MEMORY_ALLOWED: &[&str] = &["ibgda_emu_engine", "13ibgda_nic_emu"];

/// Whether `function` (a PTX or mangled name) may use local memory.
pub fn local_memory_allowed(function: &str) -> bool {
    LOCAL_MEMORY_ALLOWED.iter().any(|a| function.contains(a))
}

/// The name a PTX line declares (`.entry NAME(` or `.func ... NAME(`), if it declares one.
fn declared_function(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let rest = t.strip_prefix(".visible ").or(Some(t)).map(|r| r.trim_start())?;
    let rest = rest.strip_prefix(".weak ").unwrap_or(rest);
    let decl = rest.strip_prefix(".entry ").or_else(|| rest.strip_prefix(".func "))?;
    // `.func (.param .b64 func_retval0) NAME(` puts the return value first.
    let decl = if decl.starts_with('(') {
        &decl[decl.find(')')? + 1..]
    } else {
        decl
    };
    decl.trim_start()
        .split(|c: char| c == '(' || c.is_whitespace())
        .next()
        .filter(|n| !n.is_empty())
}

/// Lints a PTX module: it must declare `.version` and `.target`, and must not contain panic or
/// formatting machinery (`panic`, `fmt` symbols) or local-memory stack frames (`.local`, spills),
/// except local memory in the functions [`LOCAL_MEMORY_ALLOWED`] names.
pub fn check_ptx(ptx: &str) -> Vec<PtxFinding> {
    let mut found = Vec::new();
    if !ptx.lines().any(|l| l.trim_start().starts_with(".version")) {
        found.push(PtxFinding {
            line: 0,
            what: "no .version directive".into(),
            text: String::new(),
        });
    }
    if !ptx.lines().any(|l| l.trim_start().starts_with(".target")) {
        found.push(PtxFinding {
            line: 0,
            what: "no .target directive".into(),
            text: String::new(),
        });
    }
    let mut function = "";
    for (i, l) in ptx.lines().enumerate() {
        let t = l.trim();
        if t.starts_with("//") {
            continue;
        }
        if let Some(f) = declared_function(t) {
            function = f;
        }
        let what = if t.contains("panic") {
            Some("panic machinery")
        } else if t.contains("fmt") {
            Some("core::fmt machinery")
        } else if aligned_block_barrier(t) {
            Some("aligned block barrier (use barrier.sync / barrier.red: inline asm is not convergent, so LLVM may duplicate it into divergent branches)")
        } else if (t.contains(".local") || t.contains("__local_depot")) && !local_memory_allowed(function) {
            Some("local memory (stack frame or spill)")
        } else {
            None
        };
        if let Some(w) = what {
            found.push(PtxFinding {
                line: i + 1,
                what: w.into(),
                text: t.to_string(),
            });
        }
    }
    found
}

/// Whether a PTX instruction is an `.aligned` block barrier (`bar.sync`, `bar.red`, `bar.arrive`,
/// or `barrier.*.aligned`). Those require every thread of a warp to execute the same instance,
/// which nothing guarantees for a barrier written as inline `asm!` (see `arch::sync_threads`).
/// `bar.warp.sync` is a warp barrier and allowed.
fn aligned_block_barrier(t: &str) -> bool {
    // A line may hold several statements (inline `asm!` comes as one braced line:
    // `{ .reg .pred p, q; setp...; bar.red.or.pred q, 0, p; ... }`), each perhaps guarded.
    t.split([';', '{', '}']).any(|statement| {
        let mut words = statement.split_whitespace();
        let mnemonic = match words.next() {
            Some(g) if g.starts_with('@') => words.next().unwrap_or(""),
            m => m.unwrap_or(""),
        };
        (mnemonic.starts_with("bar.") && !mnemonic.starts_with("bar.warp."))
            || (mnemonic.starts_with("barrier.") && mnemonic.contains(".aligned"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_ptx_flags_panics_fmt_and_locals() {
        let good = ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n";
        assert!(check_ptx(good).is_empty());
        let bad = ".version 8.5\n.target sm_90\n.func _ZN4core9panicking5panic17h()\n.local .align 8 .b8 __local_depot0[16];\n// fmt in a comment is fine\ncall _ZN4core3fmt5write;\n";
        let f = check_ptx(bad);
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(f[0].line, 3);
        assert_eq!(f[1].what, "local memory (stack frame or spill)");
        assert_eq!(f[2].line, 6);
        assert_eq!(check_ptx("nothing").len(), 2);
    }

    #[test]
    fn aligned_block_barriers_are_flagged() {
        for bad in [
            "bar.sync 0;",
            "@%p3 bar.sync 0;",
            "bar.red.or.pred %p2, 0, %p1;",
            "barrier.sync.aligned 0;",
            "bar.arrive 1, 64;",
        ] {
            assert!(aligned_block_barrier(bad), "{bad}");
        }
        for good in [
            "barrier.sync 0;",
            "@!%p1 barrier.sync 0;",
            "barrier.red.or.pred %p2, 0, %p1;",
            "bar.warp.sync -1;",
            "mbarrier.init.shared::cta.b64 [%rd1], 1;",
            "add.s32 %r1, %r2, 1;",
        ] {
            assert!(!aligned_block_barrier(good), "{good}");
        }
        let ptx = ".version 8.5\n.target sm_90\n.visible .entry k()\n{\n @%p1 bar.sync 0;\n barrier.sync 0;\n}\n";
        let f = check_ptx(ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].line, 5);
    }

    #[test]
    fn local_memory_is_allowed_only_in_the_emulated_nic_engine() {
        let ptx = ".version 8.5\n.target sm_90\n\
            .func (.param .b64 func_retval0) _ZN13ibgda_nic_emu6engine4take17h(\n.local .b8 __local_depot1[8];\n\
            .visible .entry ibgda_emu_engine(\n.local .b8 __local_depot2[320];\n\
            .visible .entry ibgda_put_bw_block(\n.local .b8 __local_depot3[8];\n";
        let f = check_ptx(ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].line, 8);
        assert_eq!(
            declared_function(".func (.param .b64 func_retval0) _ZN3foo(\n"),
            Some("_ZN3foo")
        );
        assert_eq!(declared_function(".visible .entry k("), Some("k"));
        assert_eq!(declared_function("ld.local.u32 %r1, [x];"), None);
    }

    #[test]
    fn dep_info_parsing_drops_library_sources_and_unescapes() {
        let dir = std::env::temp_dir().join(format!("ibgda-depinfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k.d");
        std::fs::write(
            &p,
            "/t/k.ptx: /a/src/lib.rs /usr/src/rustc-1.96.0/library/core/src/lib.rs /b/my\\ dir/x.rs\n",
        )
        .unwrap();
        let v = read_dep_info(&p);
        assert_eq!(v, vec![PathBuf::from("/a/src/lib.rs"), PathBuf::from("/b/my dir/x.rs")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lib_name_prefers_lib_section() {
        let dir = std::env::temp_dir().join(format!("ibgda-libname-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = dir.join("Cargo.toml");
        std::fs::write(&m, "[package]\nname = \"my-kern\"\n[lib]\nname = \"other_name\"\n").unwrap();
        assert_eq!(KernelCrate::lib_name(&m).unwrap(), "other_name");
        std::fs::write(&m, "[package]\nname = \"my-kern\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(KernelCrate::lib_name(&m).unwrap(), "my_kern");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_toolchain_names_the_fix() {
        let e = BuildError::ToolchainMissing {
            what: "llvm-bitcode-linker".into(),
            looked: "/nowhere".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("llvm-bitcode-linker") && s.contains("/nowhere") && s.contains("setup-toolchain.sh"),
            "{s}"
        );
        // The command names this package's script by its absolute path, wherever cargo put it.
        let cmd = setup_command();
        let script = cmd.strip_prefix("bash ").unwrap();
        assert!(Path::new(script).is_absolute() && Path::new(script).is_file(), "{cmd}");
        assert!(s.contains(&cmd), "{s}");
    }

    #[test]
    fn the_tools_directory_follows_ibgda_tools_then_xdg_then_home() {
        // One test (the variables are process-wide).
        let saved: Vec<_> = ["IBGDA_TOOLS", "XDG_DATA_HOME", "HOME"]
            .iter()
            .map(|k| (*k, std::env::var_os(k)))
            .collect();
        // SAFETY: no other test of this crate reads these variables.
        unsafe {
            std::env::set_var("IBGDA_TOOLS", "/opt/t");
            std::env::set_var("XDG_DATA_HOME", "/x");
            std::env::set_var("HOME", "/h");
        }
        assert_eq!(tools_dir(), Some(PathBuf::from("/opt/t")));
        // SAFETY: as above.
        unsafe { std::env::remove_var("IBGDA_TOOLS") };
        assert_eq!(tools_dir(), Some(PathBuf::from("/x/ibgda-rs")));
        // SAFETY: as above.
        unsafe { std::env::remove_var("XDG_DATA_HOME") };
        assert_eq!(tools_dir(), Some(PathBuf::from("/h/.local/share/ibgda-rs")));
        for (k, v) in saved {
            // SAFETY: as above.
            unsafe {
                match v {
                    Some(v) => std::env::set_var(k, v),
                    None => std::env::remove_var(k),
                }
            }
        }
    }
}

//! The stand-in rdma-core (`host/tests/standin/*.c`) built as one shared object, and its test
//! knobs: shared by the host crate's mlx5 tests and the tests crate's verbs-proxy test (each
//! includes this file with `#[path]`, beside `mlx5_ifc.rs`).
#![allow(dead_code)]

use libloading::Library;
use std::ffi::{c_char, c_long, CStr, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The stand-in is one library with global state: one scenario at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// Builds the stand-in once per test binary.
/// `IBGDA_STANDIN_SO` names a prebuilt one (the GPU machines have no kernel headers to build it).
pub fn standin() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Ok(p) = std::env::var("IBGDA_STANDIN_SO") {
            return PathBuf::from(p);
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rdma_core_standin");
        std::fs::create_dir_all(&dir).unwrap();
        let so = dir.join("librdma_core_standin.so");
        let dir_src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../host/tests/standin");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args([
                "-std=gnu11",
                "-Wall",
                "-Werror",
                "-Wno-unused-function",
                "-shared",
                "-fPIC",
                "-I",
            ])
            .arg(super::mlx5_ifc::include_dir())
            .arg("-o")
            .arg(&so)
            .arg(dir_src.join("rdma_core_standin.c"))
            .arg(dir_src.join("verbs_standin.c"))
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("no C compiler ({cc}: {e}): run scripts/setup-toolchain.sh"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        so
    })
}

/// The stand-in's test knobs.
pub struct Knobs {
    _lib: Library,
    reset: unsafe extern "C" fn(),
    set: unsafe extern "C" fn(*const c_char, c_long) -> i32,
    log: unsafe extern "C" fn() -> *const c_char,
    live: unsafe extern "C" fn() -> c_long,
}

impl Knobs {
    pub fn open() -> Knobs {
        // SAFETY: our stand-in; its constructors do nothing.
        let lib = unsafe { Library::new(standin()) }.unwrap();
        // SAFETY: the stand-in defines these with exactly these C types.
        unsafe {
            let reset = *lib.get::<unsafe extern "C" fn()>(b"standin_reset\0").unwrap();
            let set = *lib
                .get::<unsafe extern "C" fn(*const c_char, c_long) -> i32>(b"standin_set\0")
                .unwrap();
            let log = *lib
                .get::<unsafe extern "C" fn() -> *const c_char>(b"standin_log\0")
                .unwrap();
            let live = *lib
                .get::<unsafe extern "C" fn() -> c_long>(b"standin_live_objects\0")
                .unwrap();
            reset();
            Knobs {
                _lib: lib,
                reset,
                set,
                log,
                live,
            }
        }
    }
    pub fn set(&self, key: &str, v: i64) -> &Self {
        let k = CString::new(key).unwrap();
        // SAFETY: a NUL-terminated key.
        assert_eq!(unsafe { (self.set)(k.as_ptr(), v as c_long) }, 0, "unknown knob {key}");
        self
    }
    /// MRs, umems, UARs and DEVX objects made and not yet released.
    pub fn live(&self) -> i64 {
        // SAFETY: a plain getter.
        unsafe { (self.live)() }
    }
    pub fn log(&self) -> Vec<String> {
        // SAFETY: the stand-in's NUL-terminated log buffer.
        let s = unsafe { CStr::from_ptr((self.log)()) }.to_string_lossy().into_owned();
        s.lines().map(String::from).collect()
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        // SAFETY: resets the stand-in's globals.
        unsafe { (self.reset)() }
    }
}

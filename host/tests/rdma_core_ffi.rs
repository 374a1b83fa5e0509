//! Checks the rdma-core signatures `ibgda::nic::rdma_core` loads at run time against Debian's
//! `infiniband/verbs.h` and `infiniband/mlx5dv.h`: a C program assigns each function to a pointer
//! of the type the Rust side declares (spelled here in C, one line per Rust `type`), compiled with
//! `-Werror`, so a drifted signature fails to compile. A deliberately wrong signature is compiled
//! too and must fail, so the check can fail. `scripts/setup-toolchain.sh` installs the headers.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The Rust declarations, in C (host/src/nic/rdma_core.rs: GetDeviceList, FreeDeviceList,
/// GetDeviceName, Mlx5dvIsSupported).
const DECLARED: &str = r#"
typedef struct ibv_device **(*get_device_list_t)(int *num_devices);
typedef void (*free_device_list_t)(struct ibv_device **list);
typedef const char *(*get_device_name_t)(struct ibv_device *device);
typedef bool (*mlx5dv_is_supported_t)(struct ibv_device *device);
get_device_list_t get_device_list = ibv_get_device_list;
free_device_list_t free_device_list = ibv_free_device_list;
get_device_name_t get_device_name = ibv_get_device_name;
mlx5dv_is_supported_t is_supported = mlx5dv_is_supported;
"#;

fn compile(name: &str, body: &str) -> Output {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rdma_core_ffi");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let program = format!(
        "#include <stdbool.h>\n#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n{body}\nint main(void) {{ return 0; }}\n"
    );
    std::fs::write(&src, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-Wno-unused-variable", "-c", "-o"])
        .arg(dir.join(format!("{name}.o")))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` ({e}); run scripts/setup-toolchain.sh"))
}

#[test]
fn the_loaded_signatures_match_the_rdma_core_headers() {
    let out = compile("declared", DECLARED);
    assert!(
        out.status.success(),
        "a signature in host/src/nic/rdma_core.rs no longer matches rdma-core's headers (or libibverbs-dev is missing: run scripts/setup-toolchain.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_wrong_signature_is_caught() {
    let wrong = DECLARED.replace(
        "typedef const char *(*get_device_name_t)(struct ibv_device *device);",
        "typedef int (*get_device_name_t)(struct ibv_device *device);",
    );
    assert_ne!(wrong, DECLARED);
    assert!(
        !compile("wrong", &wrong).status.success(),
        "the check would not catch a drifted signature"
    );
}

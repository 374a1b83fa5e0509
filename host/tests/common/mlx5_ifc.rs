//! Where the kernel's `mlx5_ifc.h` is, for the tests that compile C against it.

use std::path::PathBuf;

/// `IBGDA_MLX5_IFC_H` when set, else the newest `/usr/src/linux-headers-*-common` copy (which
/// `scripts/setup-toolchain.sh` installs); without one, the test fails and says how to get it.
pub fn header() -> PathBuf {
    if let Ok(p) = std::env::var("IBGDA_MLX5_IFC_H") {
        return PathBuf::from(p);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("include/linux/mlx5/mlx5_ifc.h"))
        .filter(|p| p.is_file() && p.to_string_lossy().contains("-common/"))
        .collect();
    // Version order is good enough: the newest header declares the most fields.
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "no include/linux/mlx5/mlx5_ifc.h under /usr/src/linux-headers-*-common: run \
             scripts/setup-toolchain.sh (it installs Debian's linux-headers-*-common), or set \
             IBGDA_MLX5_IFC_H"
        )
    })
}

/// The directory to pass as `-I` (the header includes its neighbours).
pub fn include_dir() -> PathBuf {
    header().parent().expect("a header path has a parent").to_path_buf()
}

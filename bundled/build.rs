// Builds the bundled kernel crate (device-kernels/bundled) to PTX for `ibgda_bundled::PTX`.
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("../device-kernels/bundled").build_for_build_script();
}

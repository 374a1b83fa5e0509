// Builds the kernels the runtime embeds to PTX: the emulated NIC's GPU engine (nic-emu), and with
// the `bundled-kernels` feature this repository's test and benchmark kernels
// (device-kernels/bundled).
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("../nic-emu").build_for_build_script();
    if std::env::var_os("CARGO_FEATURE_BUNDLED_KERNELS").is_some() {
        ibgda_nvptx_builder::KernelCrate::new("../device-kernels/bundled").build_for_build_script();
    }
}

// Builds the kernels the runtime embeds to PTX: the emulated NIC's GPU engine (nic-emu) and the
// bundled test and benchmark kernels (device-kernels/bundled).
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("../nic-emu").build_for_build_script();
    ibgda_nvptx_builder::KernelCrate::new("../device-kernels/bundled").build_for_build_script();
}

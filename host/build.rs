// Builds the bundled kernels (device-kernels/bundled) to PTX and embeds them in the runtime.
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("../device-kernels/bundled").build_for_build_script();
}

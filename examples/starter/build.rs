// Builds the kernel crate to PTX for the GPU; src/main.rs embeds it from OUT_DIR.
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("kernels").build_for_build_script();
}

// The example kernel crate, compiled to PTX and embedded by src/bin/ring_put.rs.
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("kernels/ring-put").build_for_build_script();
}

// The EP kernel crate, compiled to PTX and embedded (`ibgda_ep::EP_PTX`).
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("kernels").build_for_build_script();
}

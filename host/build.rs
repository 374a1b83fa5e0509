// Builds the one kernel the runtime embeds to PTX: the emulated NIC's GPU engine (nic-emu).
fn main() {
    ibgda_nvptx_builder::KernelCrate::new("../nic-emu").build_for_build_script();
}

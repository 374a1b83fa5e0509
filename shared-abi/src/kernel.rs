//! What `ibgda_device::kernel!` tells the host about each kernel it declares: the PTX entry name,
//! the parameter list as one tuple type (so a launch with the wrong arguments does not compile),
//! and, on the host, the same code as a plain function for the CPU emulation.

/// A kernel declared with `ibgda_device::kernel!`. The macro implements it for a unit struct
/// `Kernel` in a module named after the kernel (`my_put::Kernel` for `fn my_put`), on the host
/// only; the host runtime launches it by that type on a GPU (by [`KernelFn::NAME`] in the loaded
/// PTX) or on CPU threads ([`KernelFn::run_on_host`]).
pub trait KernelFn: Copy + Send + Sync + 'static {
    /// The PTX `.entry` name.
    const NAME: &'static str;
    /// The parameters, in order, as a tuple.
    type Args: Copy;
    /// Runs the kernel body on the calling thread (one emulated block).
    ///
    /// # Safety
    /// `args` satisfy the kernel's own contract: a live device state and pointers valid for what
    /// the kernel does with them.
    unsafe fn run_on_host(args: Self::Args);
}

//! `ibgda-device`: the device half of ibgda, for CUDA kernels written in Rust.
//!
//! A kernel receives a pointer to its PE's [`DeviceState`](ibgda_abi::DeviceState) from the host
//! runtime (`ibgda`), attaches to it with [`Shmem::attach`], and then calls one-sided operations on
//! the symmetric heap of any PE, with NVSHMEM's semantics and, where sensible, its names:
//!
//! | group | calls |
//! |---|---|
//! | identity | [`Shmem::my_pe`], [`Shmem::n_pes`], [`Shmem::ptr`] |
//! | RMA | `put`, `get` at thread, warp and block scope, blocking and `_nbi`; `p`, `g`; strided `iput`, `iget` |
//! | atomics | `atomic_fetch_add`, `atomic_add`, `atomic_fetch_inc`, `atomic_inc`, `atomic_compare_swap`, `atomic_swap`, `atomic_fetch`, `atomic_set`, `atomic_fetch_and` / `_or` / `_xor`, `atomic_and` / `_or` / `_xor` |
//! | signals | `put_signal` (set or add, thread/warp/block, `_nbi`), [`Shmem::signal_wait_until`], [`Shmem::signal_fetch`] |
//! | waits | [`Shmem::wait_until`], [`Shmem::test`], [`Shmem::wait_until_all`], [`Shmem::wait_until_any`], [`Shmem::wait_until_some`], [`Shmem::test_all`], [`Shmem::test_any`], [`Shmem::test_some`], and each of the last six in a `_vector` form |
//! | ordering | [`Shmem::quiet`], [`Shmem::fence`], [`Shmem::barrier_all`], [`Shmem::barrier_all_block`], [`Shmem::sync_all`], [`Shmem::sync_all_block`] |
//! | teams | a [`Team`] from the host's `Pe::team_split_strided`: [`Shmem::team_my_pe`], [`Shmem::team_n_pes`], [`Shmem::team_world_pe`], [`Shmem::team_barrier_block`], [`Shmem::team_sync_block`], and `team_` forms of every collective and reduction |
//! | collectives | [`Shmem::alltoall_block`], [`Shmem::broadcast_block`], [`Shmem::fcollect_block`] |
//! | reductions | `sum`, `prod`, `min`, `max` ([`ReduceElement`]) and `and`, `or`, `xor` ([`BitwiseElement`]) `_reduce_block` |
//!
//! Every check that can fail (PE out of range, address outside the heap, misaligned atomic, a wait
//! past its timeout) writes an attributed [`ErrorRecord`](ibgda_abi::ErrorRecord) to host-mapped
//! memory and traps; the host turns the record into an error. Nothing is written on a failed check.
//!
//! The crate is `#![no_std]` and builds for `nvptx64-nvidia-cuda` and for the host. On the host,
//! one CPU thread stands in for one GPU thread, in warps and blocks whose collectives are real
//! rendezvous of those threads (see [`arch`]), so the same device code is tested on CPU-only
//! machines at thread, warp and block width.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(asm_experimental_arch))]
#![warn(missing_docs)]
// Every unsafe operation sits in an `unsafe` block with a `// SAFETY:` line, inside unsafe
// functions too: a function's `# Safety` contract does not silently cover its body.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod arch;
mod deadline;
mod fail;
pub mod ibgda;
pub mod landing;
mod memory;
pub mod proxy;
pub mod proxy_ring;
mod shmem;

#[doc(hidden)]
pub use ibgda_abi::kernel as abi_kernel;
pub use ibgda_abi::{Cmp, SignalOp, Team, MAX_TEAMS};
#[cfg(target_arch = "nvptx64")]
pub use memory::copy_bulk;
pub use memory::{copy_cooperative, copy_cooperative_streaming, copy_cooperative_unrolled, AtomicWord, Word};
pub use shmem::{BitwiseElement, ReduceElement, Shmem};

/// Declares kernels whose bodies also build for the host.
///
/// On nvptx each item becomes `pub unsafe extern "gpu-kernel" fn`, a PTX `.entry` of the same
/// name, or of the symbol written after its parameters (`pub fn dispatch(..) as
/// "_ZN8ibgda_ep8dispatchEv" { .. }`: a mangled C++ name, which profilers show demangled, so
/// tools that find kernels by their C++ name, as DeepEP's `bench_kineto`, find it). On the host it becomes a plain `pub unsafe fn`, which the CPU
/// emulation runs on CPU threads (one per emulated GPU thread). The kernel crate needs
/// `#![cfg_attr(target_arch = "nvptx64", feature(abi_gpu_kernel))]`.
///
/// The body is a safe context: the generated function denies `unsafe_op_in_unsafe_fn`, so the
/// kernel's own `unsafe { }` blocks say which contracts it takes on (the launcher's state, local
/// buffers, pointer arithmetic), as in any Rust code.
///
/// ```ignore
/// ibgda_device::kernel! {
///     /// Puts `bytes` from `src` to `dst` on `peer`, one block-scope put per block.
///     pub fn my_put(state: *const ibgda_abi::DeviceState, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) {
///         // SAFETY: `state` is this PE's live device state (the launch contract).
///         let sh = unsafe { ibgda_device::Shmem::attach(state) };
///         // SAFETY: `src` holds `bytes` readable bytes on this PE until the put returns.
///         unsafe { sh.put_block(dst, src, bytes as usize, peer) };
///     }
/// }
/// ```
#[macro_export]
macro_rules! kernel {
    ($( $(#[$m:meta])* pub fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(as $symbol:literal)? $body:block )*) => {
        $(
            $(#[$m])*
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = $crate::__kernel_symbol!([$($symbol)?], $name))]
            #[allow(improper_gpu_kernel_arg)]
            #[deny(unsafe_op_in_unsafe_fn)]
            pub unsafe extern "gpu-kernel" fn $name($($arg: $ty),*) $body

            $(#[$m])*
            ///
            /// # Safety
            /// The arguments are what the kernel's host launcher passes: a live device state and
            /// buffers of the sizes named.
            #[cfg(not(target_arch = "nvptx64"))]
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
            #[deny(unsafe_op_in_unsafe_fn)]
            pub unsafe fn $name($($arg: $ty),*) $body

            /// The typed host-side handle of the kernel of the same name: launch it with
            /// `Pe::launch(&module, <this module>::Kernel, grid, (args...))`.
            #[cfg(not(target_arch = "nvptx64"))]
            pub mod $name {
                #[allow(unused_imports)]
                use super::*;
                /// The kernel as a type: its PTX name, its parameter tuple and its host body.
                #[derive(Clone, Copy, Debug, Default)]
                pub struct Kernel;
                impl $crate::abi_kernel::KernelFn for Kernel {
                    const NAME: &'static str = $crate::__kernel_symbol!([$($symbol)?], $name);
                    type Args = ($($ty,)*);
                    unsafe fn run_on_host(args: Self::Args) {
                        let ($($arg,)*) = args;
                        // SAFETY: forwarded from the caller's contract.
                        unsafe { super::$name($($arg),*) }
                    }
                }
            }
        )*
    };
}

/// The PTX entry name of a [`kernel!`]: its own name, or the symbol given with `as "..."` (an
/// Itanium-mangled C++ name such as `"_ZN8ibgda_ep8dispatchEv"`, which profilers show demangled:
/// `ibgda_ep::dispatch()`).
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_symbol {
    ([], $name:ident) => {
        stringify!($name)
    };
    ([$symbol:literal], $name:ident) => {
        $symbol
    };
}

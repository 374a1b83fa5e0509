//! Typed kernel launches: a kernel declared with `ibgda_device::kernel!` is launched by its type
//! (`my_put::Kernel`) with its parameters as one tuple, checked at compile time; the same call
//! runs it from loaded PTX on a GPU PE or on CPU threads on a CPU-emulated PE.

use cudarc::driver::CudaModule;
use ibgda_abi::kernel::KernelFn;
use std::sync::Arc;

/// How many blocks of how many threads a launch runs.
///
/// On a CPU-emulated PE each block runs `threads` CPU threads, at most
/// [`Config::cpu_block_threads`](crate::Config::cpu_block_threads) (default 1: one thread per
/// block), and `shared_mem_bytes` only matters on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks (x only).
    pub blocks: u32,
    /// Threads per block (x only).
    pub threads: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl Grid {
    /// `blocks` blocks of `threads` threads, no dynamic shared memory.
    pub fn new(blocks: u32, threads: u32) -> Grid {
        Grid {
            blocks,
            threads,
            shared_mem_bytes: 0,
        }
    }

    pub(crate) fn cuda(&self) -> cudarc::driver::LaunchConfig {
        cudarc::driver::LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: self.shared_mem_bytes,
        }
    }
}

/// One scalar kernel argument for [`crate::GpuPe::launch_function`] (an untyped launch;
/// [`crate::Pe::launch`] takes the kernel's typed argument tuple). Pointers (device addresses) are
/// `U64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 64-bit unsigned integer or a device pointer.
    U64(u64),
    /// A 32-bit signed integer.
    I32(i32),
    /// A 64-bit signed integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
}

/// A kernel parameter type: how it is passed to a GPU kernel.
pub trait IntoKernelArg: Copy {
    /// The value as a launch argument.
    fn kernel_arg(self) -> KernelArg;
}

macro_rules! scalar_arg {
    ($($t:ty => $v:ident),*) => {$(
        impl IntoKernelArg for $t {
            fn kernel_arg(self) -> KernelArg {
                KernelArg::$v(self)
            }
        }
        impl From<$t> for KernelArg {
            fn from(v: $t) -> Self {
                KernelArg::$v(v)
            }
        }
    )*};
}
scalar_arg!(u32 => U32, u64 => U64, i32 => I32, i64 => I64, f32 => F32);

impl<T> IntoKernelArg for *const T {
    fn kernel_arg(self) -> KernelArg {
        KernelArg::U64(self as u64)
    }
}

impl<T> IntoKernelArg for *mut T {
    fn kernel_arg(self) -> KernelArg {
        KernelArg::U64(self as u64)
    }
}

/// A kernel's parameter tuple, flattened into launch arguments.
pub trait KernelArgs: Copy {
    /// The arguments in order.
    fn kernel_args(&self) -> Vec<KernelArg>;
}

macro_rules! tuple_args {
    ($($n:ident),*) => {
        impl<$($n: IntoKernelArg),*> KernelArgs for ($($n,)*) {
            #[allow(non_snake_case)]
            fn kernel_args(&self) -> Vec<KernelArg> {
                let ($($n,)*) = *self;
                vec![$($n.kernel_arg()),*]
            }
        }
    };
}
tuple_args!();
tuple_args!(A);
tuple_args!(A, B);
tuple_args!(A, B, C);
tuple_args!(A, B, C, D);
tuple_args!(A, B, C, D, E);
tuple_args!(A, B, C, D, E, F);
tuple_args!(A, B, C, D, E, F, G);
tuple_args!(A, B, C, D, E, F, G, H);
tuple_args!(A, B, C, D, E, F, G, H, I);
tuple_args!(A, B, C, D, E, F, G, H, I, J);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K, L);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K, L, M);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O);
tuple_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P);

/// Kernels loaded for a PE by [`crate::Pe::load_module`]: a PTX module on a GPU PE; on a
/// CPU-emulated PE the kernels are already linked into the program.
#[derive(Clone)]
pub enum Module {
    /// Loaded PTX.
    Gpu(Arc<CudaModule>),
    /// Nothing to load: kernels run as the host functions `kernel!` generated.
    Cpu,
}

/// A launch's arguments moved to emulated block threads. Raw pointers are not `Send`; the
/// launch's `# Safety` contract is what makes sharing them right.
#[derive(Clone, Copy)]
pub(crate) struct SendArgs<A>(pub(crate) A);
// SAFETY: see the type's doc: the caller of the unsafe launch vouches for the pointers.
unsafe impl<A> Send for SendArgs<A> {}
// SAFETY: as above; the threads only copy the arguments.
unsafe impl<A> Sync for SendArgs<A> {}

/// Runs `body(b)` on every thread of every block `b` of a `blocks` x `threads` grid, each thread
/// a CPU thread (a block's threads in warps whose collectives are real rendezvous, see
/// `ibgda_device::arch::run_block`), and joins them; returns the first panic as
/// `(block, message)`, the message naming the thread.
pub(crate) fn run_blocks(blocks: u32, threads: u32, body: impl Fn(u32) + Sync) -> Option<(u32, String)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..blocks)
            .map(|b| {
                let body = &body;
                s.spawn(move || {
                    ibgda_device::arch::run_block(b, blocks, threads, &|| body(b)).map(|(t, m)| {
                        if threads > 1 {
                            (b, format!("thread {t}: {m}"))
                        } else {
                            (b, m)
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("emulated block thread"))
            .next()
    })
}

/// Runs `K` on a `blocks` x `threads` grid of CPU threads ([`run_blocks`]).
///
/// # Safety
/// As `K::run_on_host`.
pub(crate) unsafe fn run_on_cpu_threads<K: KernelFn>(
    blocks: u32,
    threads: u32,
    args: K::Args,
) -> Option<(u32, String)> {
    let args = SendArgs(args);
    run_blocks(blocks, threads, |_| {
        let a = args;
        // SAFETY: forwarded from the caller.
        unsafe { K::run_on_host(a.0) }
    })
}

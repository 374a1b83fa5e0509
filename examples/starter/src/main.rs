//! The starter's host program: every PE launches `hello`, then checks what its peers wrote.
//!
//! ```text
//! cargo run --release                      # 2 PEs as threads (GPUs, or the CPU emulation)
//! ibgda-run -n 3 target/release/starter    # 3 processes, one PE each
//! ```

use ibgda::{Config, Grid};
use starter_kernels::hello;

/// The kernel crate's PTX, built by build.rs (`<lib name>.ptx` in OUT_DIR).
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/starter_kernels.ptx"));

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let blocks = 4;
    // Threads of this process unless a launcher started it (then one PE per process).
    let results = ibgda::run(2, Config::from_env()?, |pe| -> Result<String, Error> {
        let n = pe.n_pes() as usize;
        let module = pe.load_module(PTX)?;
        let counter = pe.malloc::<u64>(1)?;
        let inbox = pe.malloc::<u64>(n)?;
        pe.write(&counter, 0, &[0])?;
        pe.write(&inbox, 0, &vec![0; n])?;
        pe.barrier()?;
        // SAFETY: the arguments are hello's (checked by the type system); the pointers are live
        // symmetric buffers of this PE until the synchronize below.
        unsafe {
            pe.launch(
                &module,
                hello::Kernel,
                Grid::new(blocks, 64),
                (pe.state(), pe.mut_ptr(&counter)?, pe.mut_ptr(&inbox)?),
            )?
        };
        pe.synchronize()?;
        // Every PE's kernel has returned (and quiet made its writes land) past this barrier.
        pe.barrier()?;
        let got = pe.read(&inbox, 0, n)?;
        let want: Vec<u64> = (1..=n as u64).collect();
        if got != want {
            return Err(format!("PE {}: inbox {got:?}, expected {want:?}", pe.my_pe()).into());
        }
        if pe.my_pe() == 0 {
            let total = pe.read(&counter, 0, 1)?[0];
            if total != (n as u32 * blocks) as u64 {
                return Err(format!("PE 0: counter {total}, expected {}", n as u32 * blocks).into());
            }
        }
        Ok(format!("inbox {got:?}"))
    })?;
    for (pe, what) in results {
        println!("PE {pe}: {what}: OK");
    }
    Ok(())
}

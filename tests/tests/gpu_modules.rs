//! Loading PTX modules on real GPUs while the emulated NIC's engine runs: a module is loaded once
//! per process and GPU, and loading one does not stop the transport. Same layouts and transports
//! as `gpu.rs`.

use ibgda::{run_in_process, KernelArg};
use ibgda_kernels::scope;
use ibgda_tests::{gpu_config, gpu_or_skip, grid, random_bytes};

/// A PTX module is loaded once per process and GPU: a second load (another PE of the process, or
/// a second runtime such as a second MoE `Buffer`) shares the loaded module instead of halting the
/// GPU's NIC engines for a load, which a kernel in flight that waits on the NIC cannot survive.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_a_module_is_loaded_once_per_process_and_gpu() {
    if !gpu_or_skip("gpu_a_module_is_loaded_once_per_process_and_gpu", 1) {
        return;
    }
    let seen = run_in_process(2, gpu_config(), |pe| {
        let gpu = pe.gpu()?;
        // One PE at a time, so the second finds the first's module.
        let mut first = None;
        for turn in 0..pe.n_pes() {
            if turn == pe.my_pe() {
                first = Some(gpu.load_ptx(ibgda_bundled::PTX)?);
            }
            pe.barrier()?;
        }
        let first = first.expect("this PE's turn");
        let again = gpu.load_ptx(ibgda_bundled::PTX)?;
        assert!(
            std::sync::Arc::ptr_eq(&first, &again),
            "a second load in one PE loaded again"
        );
        Ok((gpu.context().cu_device(), std::sync::Arc::as_ptr(&first) as usize))
    })
    .unwrap();
    if seen[0].0 == seen[1].0 {
        assert_eq!(seen[0].1, seen[1].1, "two PEs on one GPU loaded the module twice");
    } else {
        assert_ne!(seen[0].1, seen[1].1, "PEs on different GPUs share no module");
    }
}

/// Loading a module needs an idle GPU context, which a running NIC engine never leaves: each PE
/// loads a module after init (the runtime halts and relaunches the engines around the load), and
/// the transport still works after.
#[test]
#[ignore = "needs a CUDA GPU: gpu-bundle/run.sh runs it (--include-ignored)"]
fn gpu_modules_load_while_the_nic_engine_runs() {
    if !gpu_or_skip("gpu_modules_load_while_the_nic_engine_runs", 1) {
        return;
    }
    let t0 = std::time::Instant::now();
    let step = |pe: u32, what: &str| eprintln!("[{:>8.3} s] PE {pe}: {what}", t0.elapsed().as_secs_f64());
    run_in_process(2, gpu_config(), |pe| {
        ibgda_bundled::load(pe)?;
        let me = pe.my_pe();
        step(me, "init done");
        let module = pe.gpu()?.load_ptx(ibgda_bundled::PTX)?;
        step(me, "module loaded");
        let f = pe.gpu()?.function(&module, "ibgda_test_put")?;
        let buf = pe.malloc::<u8>(1 << 20)?;
        let src = pe.malloc::<u8>(1 << 20)?;
        pe.write(&src, 0, &random_bytes(5 + me as u64, 1 << 20))?;
        pe.barrier()?;
        step(me, "launching");
        let args: [KernelArg; 7] = [
            pe.state_ptr().into(),
            scope::BLOCK.into(),
            0u32.into(),
            pe.ptr(&buf)?.into(),
            pe.ptr(&src)?.into(),
            (1u64 << 20).into(),
            (1 - me).into(),
        ];
        // SAFETY: ibgda_test_put(state, scope, nbi, dst, src, bytes, peer).
        unsafe { pe.gpu()?.launch_function(&f, grid(8, 256), &args)? };
        pe.barrier()?;
        step(me, "kernel done");
        assert!(pe.read(&buf, 0, 1 << 20)? == random_bytes(5 + (1 - me) as u64, 1 << 20));
        Ok(())
    })
    .unwrap();
}

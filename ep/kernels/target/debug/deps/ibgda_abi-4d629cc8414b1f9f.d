/work/main/ep/kernels/target/debug/deps/ibgda_abi-4d629cc8414b1f9f.d: /work/main/shared-abi/src/lib.rs /work/main/shared-abi/src/emu.rs /work/main/shared-abi/src/ibgda.rs /work/main/shared-abi/src/kernel.rs /work/main/shared-abi/src/mlx5.rs /work/main/shared-abi/src/proxy.rs

/work/main/ep/kernels/target/debug/deps/libibgda_abi-4d629cc8414b1f9f.rmeta: /work/main/shared-abi/src/lib.rs /work/main/shared-abi/src/emu.rs /work/main/shared-abi/src/ibgda.rs /work/main/shared-abi/src/kernel.rs /work/main/shared-abi/src/mlx5.rs /work/main/shared-abi/src/proxy.rs

/work/main/shared-abi/src/lib.rs:
/work/main/shared-abi/src/emu.rs:
/work/main/shared-abi/src/ibgda.rs:
/work/main/shared-abi/src/kernel.rs:
/work/main/shared-abi/src/mlx5.rs:
/work/main/shared-abi/src/proxy.rs:

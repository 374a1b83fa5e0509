/work/main/ep/kernels/target/debug/deps/ibgda_abi-59a6c9feb5ced57a.d: /work/main/shared-abi/src/lib.rs /work/main/shared-abi/src/emu.rs /work/main/shared-abi/src/ibgda.rs /work/main/shared-abi/src/kernel.rs /work/main/shared-abi/src/mlx5.rs /work/main/shared-abi/src/proxy.rs

/work/main/ep/kernels/target/debug/deps/libibgda_abi-59a6c9feb5ced57a.rlib: /work/main/shared-abi/src/lib.rs /work/main/shared-abi/src/emu.rs /work/main/shared-abi/src/ibgda.rs /work/main/shared-abi/src/kernel.rs /work/main/shared-abi/src/mlx5.rs /work/main/shared-abi/src/proxy.rs

/work/main/ep/kernels/target/debug/deps/libibgda_abi-59a6c9feb5ced57a.rmeta: /work/main/shared-abi/src/lib.rs /work/main/shared-abi/src/emu.rs /work/main/shared-abi/src/ibgda.rs /work/main/shared-abi/src/kernel.rs /work/main/shared-abi/src/mlx5.rs /work/main/shared-abi/src/proxy.rs

/work/main/shared-abi/src/lib.rs:
/work/main/shared-abi/src/emu.rs:
/work/main/shared-abi/src/ibgda.rs:
/work/main/shared-abi/src/kernel.rs:
/work/main/shared-abi/src/mlx5.rs:
/work/main/shared-abi/src/proxy.rs:

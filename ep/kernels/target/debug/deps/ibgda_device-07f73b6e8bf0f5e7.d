/work/main/ep/kernels/target/debug/deps/ibgda_device-07f73b6e8bf0f5e7.d: /work/main/device-kernels/src/lib.rs /work/main/device-kernels/src/arch/mod.rs /work/main/device-kernels/src/arch/host.rs /work/main/device-kernels/src/emu/mod.rs /work/main/device-kernels/src/emu/engine.rs /work/main/device-kernels/src/emu/parse.rs /work/main/device-kernels/src/emu/worker.rs /work/main/device-kernels/src/fail.rs /work/main/device-kernels/src/ibgda/mod.rs /work/main/device-kernels/src/ibgda/post.rs /work/main/device-kernels/src/ibgda/wqe.rs /work/main/device-kernels/src/landing.rs /work/main/device-kernels/src/memory.rs /work/main/device-kernels/src/proxy.rs /work/main/device-kernels/src/shmem/mod.rs /work/main/device-kernels/src/shmem/atomics.rs /work/main/device-kernels/src/shmem/ordering.rs /work/main/device-kernels/src/shmem/rma.rs /work/main/device-kernels/src/shmem/signals.rs

/work/main/ep/kernels/target/debug/deps/libibgda_device-07f73b6e8bf0f5e7.rmeta: /work/main/device-kernels/src/lib.rs /work/main/device-kernels/src/arch/mod.rs /work/main/device-kernels/src/arch/host.rs /work/main/device-kernels/src/emu/mod.rs /work/main/device-kernels/src/emu/engine.rs /work/main/device-kernels/src/emu/parse.rs /work/main/device-kernels/src/emu/worker.rs /work/main/device-kernels/src/fail.rs /work/main/device-kernels/src/ibgda/mod.rs /work/main/device-kernels/src/ibgda/post.rs /work/main/device-kernels/src/ibgda/wqe.rs /work/main/device-kernels/src/landing.rs /work/main/device-kernels/src/memory.rs /work/main/device-kernels/src/proxy.rs /work/main/device-kernels/src/shmem/mod.rs /work/main/device-kernels/src/shmem/atomics.rs /work/main/device-kernels/src/shmem/ordering.rs /work/main/device-kernels/src/shmem/rma.rs /work/main/device-kernels/src/shmem/signals.rs

/work/main/device-kernels/src/lib.rs:
/work/main/device-kernels/src/arch/mod.rs:
/work/main/device-kernels/src/arch/host.rs:
/work/main/device-kernels/src/emu/mod.rs:
/work/main/device-kernels/src/emu/engine.rs:
/work/main/device-kernels/src/emu/parse.rs:
/work/main/device-kernels/src/emu/worker.rs:
/work/main/device-kernels/src/fail.rs:
/work/main/device-kernels/src/ibgda/mod.rs:
/work/main/device-kernels/src/ibgda/post.rs:
/work/main/device-kernels/src/ibgda/wqe.rs:
/work/main/device-kernels/src/landing.rs:
/work/main/device-kernels/src/memory.rs:
/work/main/device-kernels/src/proxy.rs:
/work/main/device-kernels/src/shmem/mod.rs:
/work/main/device-kernels/src/shmem/atomics.rs:
/work/main/device-kernels/src/shmem/ordering.rs:
/work/main/device-kernels/src/shmem/rma.rs:
/work/main/device-kernels/src/shmem/signals.rs:

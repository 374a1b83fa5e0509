/work/main/ep/kernels/target/debug/deps/ibgda_ep_kernels-90d14e259926284d.d: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs

/work/main/ep/kernels/target/debug/deps/libibgda_ep_kernels-90d14e259926284d.rlib: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs

/work/main/ep/kernels/target/debug/deps/libibgda_ep_kernels-90d14e259926284d.rmeta: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs

src/lib.rs:
src/copy.rs:
src/geometry.rs:
src/numeric.rs:

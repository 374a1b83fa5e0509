/work/main/ep/kernels/target/debug/deps/ibgda_ep_kernels-55f5b8f59a84d4b6.d: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs

/work/main/ep/kernels/target/debug/deps/ibgda_ep_kernels-55f5b8f59a84d4b6: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs

src/lib.rs:
src/copy.rs:
src/geometry.rs:
src/numeric.rs:

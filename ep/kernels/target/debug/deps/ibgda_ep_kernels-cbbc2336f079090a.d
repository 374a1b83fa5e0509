/work/main/ep/kernels/target/debug/deps/ibgda_ep_kernels-cbbc2336f079090a.d: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs Cargo.toml

/work/main/ep/kernels/target/debug/deps/libibgda_ep_kernels-cbbc2336f079090a.rmeta: src/lib.rs src/copy.rs src/geometry.rs src/numeric.rs Cargo.toml

src/lib.rs:
src/copy.rs:
src/geometry.rs:
src/numeric.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR

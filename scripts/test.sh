#!/usr/bin/env bash
# The test command (README): toolchain setup, formatting, lints, every CPU test (the GPU tests
# skip without a GPU), the PTX build, and ptxas -arch=sm_90 plus a lint over every PTX we produce.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup-toolchain.sh
echo "== fmt"; cargo fmt --all --check
for d in device-kernels device-kernels/bundled nic-emu examples/kernels/ring-put ep/kernels; do (cd "$d" && cargo fmt --check); done
echo "== clippy"; cargo clippy --all-targets -q -- -D warnings
(cd device-kernels && cargo clippy -q --all-targets -- -D warnings)
(cd nic-emu && cargo clippy -q --all-targets -- -D warnings)
(cd ep/kernels && cargo clippy -q --all-targets -- -D warnings)
echo "== tests (CPU; GPU tests are listed as ignored without a device)"
# The multi-process tests start ibgda-run, a binary of the host crate, and ring_put (cargo test
# alone does not build another package's binaries).
cargo build -q -p ibgda --bins
cargo build -q -p ibgda-examples --bin ring_put
cargo test -q 2>&1 | tee /tmp/ibgda-test.log
grep -q 'test result: FAILED' /tmp/ibgda-test.log && exit 1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "== no GPU here: the GPU tests were listed as ignored above, and IBGDA_REQUIRE_GPU=1 makes one fail"
  if IBGDA_REQUIRE_GPU=1 cargo test -q -p ibgda-tests --test gpu_faults -- --include-ignored --exact gpu_host_side_bad_inputs >/dev/null 2>&1; then
    echo "a GPU test passed without a GPU under IBGDA_REQUIRE_GPU=1" >&2; exit 1
  fi
fi
echo "== device crates' unit tests on the host"; (cd device-kernels && cargo test -q); (cd nic-emu && cargo test -q); (cd ep/kernels && cargo test -q)
echo "== PTX: ptxas -arch=sm_90 and lint (no panic, fmt or local memory)"
cargo run -q -p ibgda-nvptx-builder --bin ptx-check -- target/nvptx/nvptx64-nvidia-cuda/release/*.ptx
echo "== Python package (ibgda_ep): maturin wheel, pytest on the CPU emulation"
bash scripts/python-test.sh
echo "== demo on the CPU emulation"
cargo run -q --release -p ibgda-examples --bin ring_put -- --cpu --bytes 1048576 --rounds 2
echo "== a newcomer's own crate outside the checkout (examples/starter, by path; threads and ibgda-run)"
bash scripts/new-crate-test.sh
echo "== compare_bench plots from the recorded results (PNG rendering, fonts)"
PLOTS="$(mktemp -d)"
cargo run -q --release -p ibgda-examples --bin compare_bench -- \
  --plot-from docs/gpu-results/2026-11-21-s5/compare-2gpu.csv --plots "$PLOTS"
test "$(ls "$PLOTS"/*.png | wc -l)" -ge 5
echo "== MoE dispatch/combine plots from the recorded results"
cargo run -q --release -p ibgda-examples --bin ep_plot -- docs/results/ep-2gpu.csv "$PLOTS/ep"
test "$(ls "$PLOTS"/ep/*.png | wc -l)" -eq 4

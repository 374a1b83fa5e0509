#!/usr/bin/env bash
# Builds every GPU test binary, example and PTX here (no Rust is needed on the GPU machine) and
# assembles gpu-bundle/ (git-ignored): bin/, ptx/, baselines/ and run.sh, which runs the whole GPU
# suite in one call with IBGDA_REQUIRE_GPU=1 and prints "N passed, M failed".
#   scripts/gpu-bundle.sh            # then, on the GPU machine: gpu-bundle/run.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup-toolchain.sh >/dev/null
B="$ROOT/gpu-bundle"
rm -rf "$B"; mkdir -p "$B/bin" "$B/ptx" "$B/baselines"
cargo build --release -q -p ibgda-examples --bins
cargo build --release -q -p ibgda --bins
cargo build --release -q -p ibgda-tests --bins
cargo build --release -q -p ibgda-ep --bins
cp target/release/ring_put target/release/p2p_bench target/release/compare_bench target/release/ibgda-run target/release/mp_suite target/release/ep_check target/release/ep_bench target/release/ibgda-probe "$B/bin/"
cargo test --release -q -p ibgda-tests --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/bin/test_" + m["target"]["name"])
' "$B"
cp target/nvptx/nvptx64-nvidia-cuda/release/*.ptx "$B/ptx/"
# The stand-in rdma-core (built by its own tests) for the mlx5 backend's GPU test.
cargo test --release -q -p ibgda --test mlx5_standin >/dev/null
mkdir -p "$B/lib"; cp target/tmp/rdma_core_standin/librdma_core_standin.so "$B/lib/"
SHARED="${IBGDA_SHARED:-$ROOT/../shared}"
[ -d "$SHARED/baselines" ] && cp "$SHARED/baselines/"* "$B/baselines/" || echo "gpu-bundle: no $SHARED/baselines; the NVSHMEM baseline will be skipped"
# The Python package as an abi3 wheel (installed there with pip --no-index), and its checks.
mkdir -p "$B/wheels" "$B/ep"
VENV="$ROOT/target/py-venv"; [ -x "$VENV/bin/maturin" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q "maturin>=1.5,<2"; }
(cd ep/python && "$VENV/bin/maturin" build -q --release -o "$B/wheels")
cp ep/python/tests/ep_torch_check.py ep/python/bench/bench_ep.py ep/python/bench/host_breakdown.py "$B/ep/"
cp scripts/gpu-run.sh "$B/run.sh"
# DeepEP's own test scripts against ibgda_ep (run.sh runs them when they are in the bundle).
cp scripts/deepep-tests.sh "$B/deepep-tests.sh"
if [ -n "${IBGDA_DEEPEP_SRC:-}" ] && [ -d "$IBGDA_DEEPEP_SRC/tests" ]; then
  mkdir -p "$B/deepep-tests"; cp "$IBGDA_DEEPEP_SRC"/tests/*.py "$B/deepep-tests/"
fi
chmod +x "$B/run.sh"
BINS="$(ls "$B/bin" | tr '\n' ' ')"
# The binaries stripped and packed (run.sh unpacks them): unpacked they exceed what a lent GPU
# machine's call carries (64 MiB); IBGDA_BUNDLE_PACK=0 leaves bin/ and ptx/ as they are.
if [ "${IBGDA_BUNDLE_PACK:-1}" != 0 ]; then
  strip "$B"/bin/* 2>/dev/null || true
  tar cJf "$B/bin.tar.xz" -C "$B" bin ptx && rm -rf "$B/bin" "$B/ptx"
fi
echo "gpu-bundle: $(du -sh "$B" | cut -f1) in $B: $BINS"

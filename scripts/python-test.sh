#!/usr/bin/env bash
# Builds the ibgda_ep Python package (maturin, abi3 wheel) into a virtual environment with
# PyTorch and pytest from PyPI, then runs its tests on the CPU emulation. Called by test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/target/py-venv"
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" pytest numpy torch
rm -rf "$ROOT/target/wheels"
(cd "$ROOT/ep/python" && "$VENV/bin/maturin" build -q -o "$ROOT/target/wheels")
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$ROOT"/target/wheels/ibgda_ep-*.whl
"$VENV/bin/python" -m pytest -q "$ROOT/ep/python/tests/test_ep.py"

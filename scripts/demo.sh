#!/usr/bin/env bash
# The main demo: a ring of put_signal + get, every byte checked; on GPUs when present, else on the
# CPU emulation (the same device code on CPU threads).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup-toolchain.sh >/dev/null
cargo run -q --release -p ibgda-examples --bin ring_put -- "$@"

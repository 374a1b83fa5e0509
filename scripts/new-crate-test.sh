#!/usr/bin/env bash
# A newcomer's own project, outside the checkout: copies examples/starter (a host program and its
# kernel crate) to a temporary directory, points its ibgda dependencies at this checkout by path,
# and builds and runs it with the commands its README documents only: the toolchain command,
# `cargo build`, `cargo install` of ibgda-run. On the CPU emulation: as threads over P2P, IBGDA
# and the proxy, and as 3 processes under ibgda-run. Fails on any missing line of output.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cp -r "$ROOT/examples/starter" "$TMP/my-project"
cd "$TMP/my-project"
rm -f Cargo.lock
sed -i "s#path = \"\.\./\.\./\.\./#path = \"$ROOT/#; s#path = \"\.\./\.\./#path = \"$ROOT/#" Cargo.toml kernels/Cargo.toml
if grep -q 'path = "\.\./\.\.' Cargo.toml kernels/Cargo.toml; then
  echo "new-crate-test: a relative path to the checkout is left in the copy" >&2; exit 1
fi
# The documented commands.
bash "$ROOT/nvptx-builder/setup-toolchain.sh" >/dev/null
# CI only (a user needs neither): the checkout's dependency versions and its build directory.
cp "$ROOT/Cargo.lock" .
export CARGO_TARGET_DIR="$ROOT/target"
cargo build --release -q
cargo install -q --locked --path "$ROOT/host" --bin ibgda-run --root "$TMP/tools"
test -s "$CARGO_TARGET_DIR/nvptx/nvptx64-nvidia-cuda/release/starter_kernels.ptx"
expect() { # expect OUTPUT LINE...
  local out="$1"; shift
  for line in "$@"; do
    grep -qxF "$line" <<<"$out" || { echo "new-crate-test: missing '$line' in:" >&2; echo "$out" >&2; exit 1; }
  done
}
for t in p2p ibgda proxy; do
  out="$(IBGDA_DEVICE=cpu IBGDA_TRANSPORT=$t IBGDA_PROXY_PIN=0 cargo run --release -q 2>&1)"
  expect "$out" "PE 0: inbox [1, 2]: OK" "PE 1: inbox [1, 2]: OK"
  echo "new-crate-test: threads over $t: OK"
done
out="$(IBGDA_DEVICE=cpu IBGDA_TRANSPORT=ibgda IBGDA_PROXY_PIN=0 "$TMP/tools/bin/ibgda-run" -n 3 "$CARGO_TARGET_DIR/release/starter" 2>&1)"
expect "$out" "PE 0: inbox [1, 2, 3]: OK" "PE 1: inbox [1, 2, 3]: OK" "PE 2: inbox [1, 2, 3]: OK"
echo "new-crate-test: 3 processes under ibgda-run over ibgda: OK"

#!/usr/bin/env bash
# Installs the toolchain that builds Rust kernel crates to PTX (what ibgda-nvptx-builder runs),
# idempotently, for any crate on this machine that depends on ibgda:
#   - Debian's rustc-web / cargo-web / rust-web-src 1.96 (nvptx device code needs -Zbuild-std=core,
#     which needs the library sources that only the Debian toolchain ships) and llvm-22 (apt);
#   - llvm-bitcode-linker, built from the rust sources rust-web-src installs, and ptxas 13.0 (the
#     nvidia-cuda-nvcc wheel, matching the 580 driver) into the per-user tools directory:
#     $IBGDA_TOOLS, else ${XDG_DATA_HOME:-~/.local/share}/ibgda-rs (bin/llvm-bitcode-linker,
#     bin/ptxas), where the builder looks for them.
# Nothing is written into any checkout. Nothing is downloaded from outside the package registries.
#   bash <path to ibgda-rs>/nvptx-builder/setup-toolchain.sh
set -euo pipefail
TOOLS="${IBGDA_TOOLS:-${XDG_DATA_HOME:-$HOME/.local/share}/ibgda-rs}"
mkdir -p "$TOOLS/bin"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
for p in rustc-web cargo-web rust-web-src llvm-22; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-toolchain: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
for f in /usr/bin/rustc /usr/bin/cargo /usr/lib/llvm-22/bin/llvm-link /usr/lib/llvm-22/bin/llc /usr/lib/llvm-22/bin/opt; do
  [ -x "$f" ] || { echo "setup-toolchain: $f missing after install" >&2; exit 1; }
done
/usr/bin/rustc --version | grep -q ' 1\.9[6-9]' || { echo "setup-toolchain: /usr/bin/rustc is not 1.96+: $(/usr/bin/rustc --version)" >&2; exit 1; }

# llvm-bitcode-linker: the rust tree ships its source; built once, standalone.
LINKER="$TOOLS/bin/llvm-bitcode-linker"
if [ ! -x "$LINKER" ]; then
  SRC="$(readlink -f /usr/lib/rustlib/src/rust)/src/tools/llvm-bitcode-linker"
  [ -d "$SRC" ] || SRC="$(ls -d /usr/src/rustc-*/src/tools/llvm-bitcode-linker 2>/dev/null | sort -V | tail -1)"
  [ -d "$SRC" ] || { echo "setup-toolchain: llvm-bitcode-linker sources not found (rust-web-src installed?)" >&2; exit 1; }
  B="$(mktemp -d)"
  cp -r "$SRC/." "$B/"
  # Inside the rust tree it inherits workspace settings; standalone it needs its own [workspace].
  grep -q '^\[workspace\]' "$B/Cargo.toml" || printf '\n[workspace]\n' >> "$B/Cargo.toml"
  (cd "$B" && cargo build --release -q)
  cp "$B/target/release/llvm-bitcode-linker" "$LINKER"
  rm -rf "$B"
fi
"$LINKER" --help >/dev/null

# ptxas from the nvidia-cuda-nvcc wheel (13.0.x matches the GPU machines' 580 driver): the
# builder's PTX check, and what a user runs to see a kernel's registers and spills.
PTXAS="$TOOLS/bin/ptxas"
if [ ! -x "$PTXAS" ]; then
  python3 -m pip install -q --disable-pip-version-check --target "$TOOLS/py" 'nvidia-cuda-nvcc==13.0.*'
  found="$(find "$TOOLS/py" -type f -name ptxas | head -1)"
  [ -n "$found" ] || { echo "setup-toolchain: ptxas not in the nvidia-cuda-nvcc wheel" >&2; exit 1; }
  chmod +x "$found"; ln -sf "$found" "$PTXAS"
fi
"$PTXAS" --version | tail -1

echo "setup-toolchain: ok in $TOOLS ($(/usr/bin/rustc --version); llvm $(/usr/lib/llvm-22/bin/llc --version | sed -n 's/.*LLVM version //p'))"

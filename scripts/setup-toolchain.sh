#!/usr/bin/env bash
# Installs everything ibgda-rs needs to build and test, idempotently:
#   - Debian's rustc-web / cargo-web / rust-web-src 1.96 (nvptx device code needs -Zbuild-std=core,
#     which needs the library sources that only the Debian toolchain ships here),
#   - llvm-22 (llvm-link / opt / llc that understand rustc 1.96's bitcode),
#   - llvm-bitcode-linker, built from the rust sources rust-web-src installs, into tools/bin,
#   - a C compiler and libibverbs-dev (mlx5dv.h) for the layout and golden-bytes tests,
#   - the kernel's mlx5_ifc.h (the newest linux-headers-*-common) for the PRM layout test,
#   - ptxas (the nvidia-cuda-nvcc wheel, 13.0.x) into tools/cuda, to assemble our PTX in CI.
# Nothing is downloaded from outside the package registries.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/tools"
mkdir -p "$TOOLS/bin"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
for p in rustc-web cargo-web rust-web-src llvm-22 libibverbs-dev gcc fonts-dejavu-core; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-toolchain: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi

# The kernel's mlx5 PRM header (host/tests/mlx5_prm_layout.rs): the newest headers package.
if ! ls /usr/src/linux-headers-*-common/include/linux/mlx5/mlx5_ifc.h >/dev/null 2>&1; then
  [ ${#need_apt[@]} -gt 0 ] || $SUDO apt-get update -q
  lh="$(apt-cache search --names-only '^linux-headers-[0-9.]+-[0-9]+-common$' | awk '{print $1}' | sort -V | tail -1)"
  [ -n "$lh" ] || { echo "setup-toolchain: no linux-headers-*-common package found" >&2; exit 1; }
  echo "setup-toolchain: apt-get install $lh (mlx5_ifc.h)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$lh"
fi

for f in /usr/bin/rustc /usr/bin/cargo /usr/lib/llvm-22/bin/llvm-link /usr/lib/llvm-22/bin/llc /usr/lib/llvm-22/bin/opt; do
  [ -x "$f" ] || { echo "setup-toolchain: $f missing after install" >&2; exit 1; }
done
/usr/bin/rustc --version | grep -q ' 1\.9[6-9]' || { echo "setup-toolchain: /usr/bin/rustc is not 1.96+: $(/usr/bin/rustc --version)" >&2; exit 1; }

# llvm-bitcode-linker: the rust tree ships its source; build it once (host code, so the rustup toolchain is fine).
LINKER="$TOOLS/bin/llvm-bitcode-linker"
if [ ! -x "$LINKER" ]; then
  SRC="$(readlink -f /usr/lib/rustlib/src/rust)/src/tools/llvm-bitcode-linker"
  [ -d "$SRC" ] || SRC="$(ls -d /usr/src/rustc-*/src/tools/llvm-bitcode-linker 2>/dev/null | sort -V | tail -1)"
  [ -d "$SRC" ] || { echo "setup-toolchain: llvm-bitcode-linker sources not found (rust-web-src installed?)" >&2; exit 1; }
  B="$TOOLS/build/llvm-bitcode-linker"
  rm -rf "$B"; mkdir -p "$B"; cp -r "$SRC/." "$B/"
  # Inside the rust tree it inherits workspace settings; standalone it needs its own [workspace].
  grep -q '^\[workspace\]' "$B/Cargo.toml" || printf '\n[workspace]\n' >> "$B/Cargo.toml"
  (cd "$B" && cargo build --release -q)
  cp "$B/target/release/llvm-bitcode-linker" "$LINKER"
  rm -rf "$TOOLS/build"
fi
"$LINKER" --help >/dev/null

# ptxas from the nvidia-cuda-nvcc wheel (13.0.x matches the GPU machines' 580 driver).
PTXAS="$TOOLS/cuda/bin/ptxas"
if [ ! -x "$PTXAS" ]; then
  PYDIR="$TOOLS/py"
  python3 -m pip install -q --disable-pip-version-check --target "$PYDIR" 'nvidia-cuda-nvcc==13.0.*'
  found="$(find "$PYDIR" -type f -name ptxas | head -1)"
  [ -n "$found" ] || { echo "setup-toolchain: ptxas not in the nvidia-cuda-nvcc wheel" >&2; exit 1; }
  mkdir -p "$TOOLS/cuda/bin"; ln -sf "$found" "$PTXAS"; chmod +x "$found"
fi
"$PTXAS" --version | tail -1

echo "setup-toolchain: ok ($(/usr/bin/rustc --version); llvm $(/usr/lib/llvm-22/bin/llc --version | sed -n 's/.*LLVM version //p'))"

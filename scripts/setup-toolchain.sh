#!/usr/bin/env bash
# Installs everything ibgda-rs needs to build and test, idempotently:
#   - the kernel toolchain (nvptx-builder/setup-toolchain.sh: Debian's rustc-web / cargo-web /
#     rust-web-src 1.96 and llvm-22; llvm-bitcode-linker and ptxas 13.0 into the per-user tools
#     directory, ${IBGDA_TOOLS:-${XDG_DATA_HOME:-~/.local/share}/ibgda-rs}), which is all a crate
#     that depends on ibgda needs;
#   - for this repository's tests: a C compiler and libibverbs-dev (mlx5dv.h) for the layout and
#     golden-bytes tests, the kernel's mlx5_ifc.h (the newest linux-headers-*-common) for the PRM
#     layout test, and a font for the plots.
# Nothing is written into the checkout. Nothing is downloaded from outside the package registries.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/nvptx-builder/setup-toolchain.sh"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
for p in libibverbs-dev gcc fonts-dejavu-core; do
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

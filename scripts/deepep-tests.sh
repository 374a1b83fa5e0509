#!/usr/bin/env bash
# DeepEP V1's own test scripts (tests/test_intranode.py, tests/test_low_latency.py), unmodified,
# against ibgda_ep: a `deep_ep` package made here only re-exports ibgda_ep, which is what a user
# does when they change the import. Needs GPUs, PyTorch and the ibgda_ep wheel installed (or on
# PYTHONPATH).
#   scripts/deepep-tests.sh <DeepEP tests folder> [processes]     (default 2)
# gpu-bundle.sh copies this script and, with IBGDA_DEEPEP_SRC=<a DeepEP checkout>, its tests.
set -u
TESTS="$(cd "${1:?usage: deepep-tests.sh <DeepEP tests folder> [processes]}" && pwd)"
N="${2:-2}"
SHIM="$(mktemp -d)"; trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/deep_ep"
cat > "$SHIM/deep_ep/__init__.py" <<'PY'
# `import deep_ep` resolves to ibgda_ep: DeepEP's scripts run with only the import changed.
from ibgda_ep import *  # noqa: F401,F403
from ibgda_ep import Buffer, Config, EventOverlap, topk_idx_t  # noqa: F401
PY
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
cd "$TESTS"
rc=0
for t in test_intranode test_low_latency; do
  [ -f "$t.py" ] || { echo "deepep-tests: no $t.py in $TESTS"; rc=1; continue; }
  echo "== DeepEP $t.py, $N processes"
  if MASTER_PORT=$((29500 + RANDOM % 1000)) timeout "${IBGDA_DEEPEP_TIMEOUT:-600}" python3 "$t.py" --num-processes "$N"; then
    echo "deepep-tests: $t PASSED"
  else
    echo "deepep-tests: $t FAILED"; rc=1
  fi
done
exit $rc

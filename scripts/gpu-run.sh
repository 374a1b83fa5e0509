#!/usr/bin/env bash
# The GPU suite, run on a GPU machine from the bundle gpu-bundle.sh made. Writes logs and CSVs to
# $OUT (or ./gpu-out) and ends with "N passed, M failed".
set -u
cd "$(dirname "$0")"
# gpu-bundle.sh packs the binaries and PTX (a lent machine's call carries at most 64 MiB).
[ -d bin ] || tar xJf bin.tar.xz
export IBGDA_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUTDIR="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUTDIR"
# The stand-in rdma-core the mlx5 backend's GPU test loads (no kernel headers here to build it).
[ -f lib/librdma_core_standin.so ] && export IBGDA_STANDIN_SO="$PWD/lib/librdma_core_standin.so"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $NGPU GPU(s)"
pass=0; fail=0; failed=""
ONLY="${IBGDA_ONLY:-}"   # a regex: run only the steps whose name matches
step() { # step NAME CMD...
  if [ -n "$ONLY" ] && ! [[ "$1" =~ $ONLY ]]; then return; fi
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$OUTDIR/$name.log" 2>&1; then pass=$((pass+1)); echo "PASS $name ($((SECONDS-t0)) s)"
  else fail=$((fail+1)); failed="$failed $name"; echo "FAIL $name ($((SECONDS-t0)) s)"; tail -25 "$OUTDIR/$name.log"; fi
}
T="timeout ${IBGDA_STEP_TIMEOUT:-900}"
IB="IBGDA_TRANSPORT=ibgda"
PX="IBGDA_TRANSPORT=proxy"
RATE="--rate-threads 1024,4096,16384 --rate-iters 10 --pingpong-iters 1000 --reps 3"
MP="IBGDA_DEVICE=gpu"
# The GPU suites (device API data path, faults, module loading), one PE layout and transport per
# step; gpu_fault_child runs only as the fault tests' child process.
GPU_SUITE='for t in bin/test_gpu bin/test_gpu_faults bin/test_gpu_modules; do "$t" --include-ignored --skip gpu_fault_child --test-threads=1 || exit 1; done'
# The ibgda_ep wheel, into a private site directory (no network there).
if ls wheels/ibgda_ep-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ep-site wheels/ibgda_ep-*.whl >/dev/null 2>&1 \
    && export PYTHONPATH=/tmp/ep-site${PYTHONPATH:+:$PYTHONPATH}
fi
TR="python3 -m torch.distributed.run"
# MoE dispatch/combine: the Rust self-check (threads and processes, every transport) and the
# PyTorch check under torchrun (2 ranks on one GPU: both use GPU 0).
step ep-check-1gpu-2threads env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $T ./bin/ep_check --pes 2 --rounds 2
# Two PEs sharing one GPU at full MoE size over the emulated NIC: every result checked, and the
# low-latency halves launched alone with one rank late (receive halves must leave the shared
# GPU's SMs to the late rank's send halves; `docs/known-bugs.md`, session 32).
step ep-bench-1gpu-2threads-ibgda env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $IB IBGDA_TIMEOUT_MS=5000 $T ./bin/ep_bench --pes 2 --tokens 1024 --ll-tokens 128 --iters 5
step ep-check-1gpu-2proc-p2p env CUDA_VISIBLE_DEVICES=0 $MP IBGDA_GPU=0 $T ./bin/ibgda-run -n 2 ./bin/ep_check --rounds 2
step ep-check-1gpu-2proc-ibgda env CUDA_VISIBLE_DEVICES=0 $MP IBGDA_GPU=0 $IB $T ./bin/ibgda-run -n 2 ./bin/ep_check --rounds 1
step ep-check-1gpu-2proc-proxy env CUDA_VISIBLE_DEVICES=0 $MP IBGDA_GPU=0 $PX $T ./bin/ibgda-run -n 2 ./bin/ep_check --rounds 1
step ep-torch-1gpu-2proc env CUDA_VISIBLE_DEVICES=0 IBGDA_GPU=0 $T $TR --nproc-per-node 2 ep/ep_torch_check.py
step ep-torch-1gpu-2proc-ibgda env CUDA_VISIBLE_DEVICES=0 IBGDA_GPU=0 $IB $T $TR --nproc-per-node 2 ep/ep_torch_check.py
step ep-torch-1gpu-2proc-proxy env CUDA_VISIBLE_DEVICES=0 IBGDA_GPU=0 $PX $T $TR --nproc-per-node 2 ep/ep_torch_check.py
# DeepEP's own test scripts, unmodified, with one rank (EP1) on one GPU against ibgda_ep (when the
# bundle carries them): what a user tries first on a one-GPU workstation.
if [ -d deepep-tests ]; then
  step deepep-tests-1gpu env CUDA_VISIBLE_DEVICES=0 bash deepep-tests.sh deepep-tests 1
fi
step ep-bench-1gpu-2proc env CUDA_VISIBLE_DEVICES=0 IBGDA_GPU=0 $T $TR --nproc-per-node 2 ep/bench_ep.py --systems ibgda-ep --tokens 1024,4096 --csv "$OUTDIR/ep-1gpu-2proc.csv"
# One process per PE on one GPU (each process maps the other's heap through an exported VMM fd).
step mp-suite-1gpu-2proc-p2p env CUDA_VISIBLE_DEVICES=0 $MP $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
step mp-suite-1gpu-2proc-ibgda env CUDA_VISIBLE_DEVICES=0 $MP $IB $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
step mp-suite-1gpu-2proc-ibgda-cpu-doorbell env CUDA_VISIBLE_DEVICES=0 $MP $IB IBGDA_DOORBELL=cpu $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
step mp-suite-1gpu-2proc-proxy env CUDA_VISIBLE_DEVICES=0 $MP $PX $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
step ring-put-1gpu-2proc-ibgda env CUDA_VISIBLE_DEVICES=0 $IB $T ./bin/ibgda-run -n 2 ./bin/ring_put --rounds 3 --bytes 16777216
step ring-put-1gpu-2proc-ibgda-run env CUDA_VISIBLE_DEVICES=0 $T ./bin/ibgda-run -n 2 ./bin/ring_put --rounds 5 --bytes 67108864
step ring-put-1gpu-2threads env CUDA_VISIBLE_DEVICES=0 $T ./bin/ring_put --pes 2 --rounds 5 --bytes 67108864
# The capability probe: what this node has (these machines: mlx5_core, no RDMA device) and that
# peers behind a NIC fall back to the emulated device, said in so many words.
step probe bash -c "./bin/ibgda-probe && ./bin/ibgda-probe | grep -q 'peers behind a NIC: Emulated'"
# What a NIC is given of the GPU: dma-buf exports, and the mlx5 backend's GPU placement on the
# stand-in rdma-core.
step gpu-nic-tests env CUDA_VISIBLE_DEVICES=0 $T ./bin/test_gpu_nic --include-ignored --test-threads=1
# The probe's per-GPU doorbell decision, on the stand-in rdma-core (its UAR page is ordinary memory,
# which the driver will not map as I/O memory): DEVX opens, the mapping is refused, CPU doorbell.
[ -n "${IBGDA_STANDIN_SO:-}" ] && step probe-standin bash -c "IBGDA_LIBIBVERBS=$IBGDA_STANDIN_SO IBGDA_LIBMLX5=$IBGDA_STANDIN_SO ./bin/ibgda-probe | tee /dev/stderr | grep -q '^GPU 0 .*: CpuDoorbell: .*PeerMappingOverride'"
step mp-kill-1gpu-2proc bash -c "CUDA_VISIBLE_DEVICES=0 $MP IBGDA_TIMEOUT_MS=5000 $T ./bin/ibgda-run -n 2 --grace 60 ./bin/mp_suite die-mid-kernel; grep -q 'SURVIVOR PE 0' '$OUTDIR/mp-kill-1gpu-2proc.log'"
# One GPU, two PEs on it.
step gpu-tests-1gpu-2pes env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $T sh -c "$GPU_SUITE"
step gpu-tests-1gpu-2pes-ibgda env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $IB $T sh -c "$GPU_SUITE"
step gpu-tests-1gpu-2pes-ibgda-cpu-doorbell env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $IB IBGDA_DOORBELL=cpu $T sh -c "$GPU_SUITE"
step gpu-tests-1gpu-2pes-proxy env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $PX $T sh -c "$GPU_SUITE"
step ring-put-1gpu-2pes env CUDA_VISIBLE_DEVICES=0 timeout 120 ./bin/ring_put --pes 2
step ring-put-1gpu-2pes-ibgda env CUDA_VISIBLE_DEVICES=0 $IB timeout 120 ./bin/ring_put --pes 2
step ring-put-1gpu-2pes-proxy env CUDA_VISIBLE_DEVICES=0 $PX timeout 120 ./bin/ring_put --pes 2
# One process per mode (each prints its points as `ROW` lines as it goes; compare_bench can also
# run every mode in one process: --modes p2p,ibgda,...).
compare() { # compare NAME VISIBLE_DEVICES [ENV...]
  local name=$1 dev=$2; shift 2
  local modes="${IBGDA_COMPARE_MODES:-p2p ibgda ibgda-cpu-doorbell proxy}" m runs=""
  for m in $modes; do if [ -z "$ONLY" ] || [[ "$name-$m" =~ $ONLY ]]; then runs=1; fi; done
  # A compare whose steps IBGDA_ONLY filters out leaves a CSV of its name (another step's) alone.
  [ -n "$runs" ] || return 0
  echo "mode,metric,x,value,unit" > "$OUTDIR/$name.csv"
  for m in $modes; do
    step "$name-$m" env CUDA_VISIBLE_DEVICES=$dev "$@" timeout "${IBGDA_COMPARE_TIMEOUT:-240}" ./bin/compare_bench --modes $m --proxy-threads 1,2,4,8 --engine-capacity false ${COMPARE_ARGS:-}
    grep -h "^ROW " "$OUTDIR/$name-$m.log" 2>/dev/null | cut -c5- >> "$OUTDIR/$name.csv"
  done
}
# The emulated NIC's own capacity (rate model off; 16 QPs): the engine on the blocks its QPs
# need, and on 8 (spare warps share large copies).
capacity() { # capacity NAME VISIBLE_DEVICES [ENV...]
  local name=$1 dev=$2; shift 2
  step "$name" env CUDA_VISIBLE_DEVICES=$dev "$@" bash -c "$T ./bin/compare_bench --modes ibgda --sections none --proxy-threads '' --engine-qps \${IBGDA_ENGINE_QPS:-16} --csv '$OUTDIR/$name.csv'"
}
capacity engine-capacity-1gpu 0
capacity engine-capacity-1gpu-8sms 0 IBGDA_ENGINE_BLOCKS=8
capacity engine-capacity-1gpu-32qp-8sms 0 IBGDA_ENGINE_BLOCKS=8 IBGDA_ENGINE_QPS=32
capacity engine-capacity-1gpu-64qp-16sms 0 IBGDA_ENGINE_BLOCKS=16 IBGDA_ENGINE_QPS=64
capacity engine-capacity-1gpu-64qp-32sms 0 IBGDA_ENGINE_BLOCKS=32 IBGDA_ENGINE_QPS=64
compare compare-1gpu 0
# With the rate model (compare_bench's default), 128 QPs per peer for IBGDA and 64 channels (so
# 64 QPs per peer) on 8 threads for the proxy: the most engine capacity each mode can have here
# (its backlog and model-wait rows say whether it still waits on the engine); 128-thread blocks,
# so that 4,096 issuing threads already use 32 QPs (IBGDA) or channels (proxy).
RATEMODEL="IBGDA_QPS_PER_PEER=128 IBGDA_PROXY_THREADS=8 IBGDA_PROXY_CHANNELS=64"
COMPARE_ARGS="--rate-block 128" compare compare-1gpu-ratemodel 0 $RATEMODEL
step bench-1gpu-ibgda env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $IB $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --engine-capacity --csv "$OUTDIR/bench-1gpu-ibgda.csv"
step bench-1gpu-p2p env CUDA_VISIBLE_DEVICES=0 IBGDA_PES_PER_GPU=2 $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --csv "$OUTDIR/bench-1gpu-p2p.csv"
if [ "$NGPU" -ge 2 ]; then
  step gpu-tests-2gpu env CUDA_VISIBLE_DEVICES=0,1 IBGDA_PES_PER_GPU=1 $T sh -c "$GPU_SUITE"
  step gpu-tests-2gpu-ibgda env CUDA_VISIBLE_DEVICES=0,1 IBGDA_PES_PER_GPU=1 $IB $T sh -c "$GPU_SUITE"
  step gpu-tests-2gpu-ibgda-cpu-doorbell env CUDA_VISIBLE_DEVICES=0,1 IBGDA_PES_PER_GPU=1 $IB IBGDA_DOORBELL=cpu $T sh -c "$GPU_SUITE"
  step gpu-tests-2gpu-proxy env CUDA_VISIBLE_DEVICES=0,1 IBGDA_PES_PER_GPU=1 $PX $T sh -c "$GPU_SUITE"
  step ring-put-2gpu env CUDA_VISIBLE_DEVICES=0,1 timeout 120 ./bin/ring_put --pes 2 --bytes 67108864
  step mp-suite-2gpu-2proc-p2p env CUDA_VISIBLE_DEVICES=0,1 $MP $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
  step mp-suite-2gpu-2proc-ibgda env CUDA_VISIBLE_DEVICES=0,1 $MP $IB $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
  step mp-suite-2gpu-2proc-ibgda-cpu-doorbell env CUDA_VISIBLE_DEVICES=0,1 $MP $IB IBGDA_DOORBELL=cpu $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
  step mp-suite-2gpu-2proc-proxy env CUDA_VISIBLE_DEVICES=0,1 $MP $PX $T ./bin/ibgda-run -n 2 ./bin/mp_suite device-api
  step ring-put-2gpu-2proc-ibgda-run env CUDA_VISIBLE_DEVICES=0,1 $T ./bin/ibgda-run -n 2 ./bin/ring_put --rounds 5 --bytes 67108864
  step ep-check-2gpu-2proc env CUDA_VISIBLE_DEVICES=0,1 $MP $T ./bin/ibgda-run -n 2 ./bin/ep_check --rounds 2
  step ep-torch-2gpu-torchrun env CUDA_VISIBLE_DEVICES=0,1 $T $TR --nproc-per-node 2 ep/ep_torch_check.py
  step ep-torch-2gpu-torchrun-ibgda env CUDA_VISIBLE_DEVICES=0,1 $IB $T $TR --nproc-per-node 2 ep/ep_torch_check.py
  step ep-torch-2gpu-torchrun-proxy env CUDA_VISIBLE_DEVICES=0,1 $PX $T $TR --nproc-per-node 2 ep/ep_torch_check.py
  # DeepEP's own test scripts, unmodified, against ibgda_ep (when the bundle carries them).
  if [ -d deepep-tests ]; then
    step deepep-tests-2gpu env CUDA_VISIBLE_DEVICES=0,1 bash deepep-tests.sh deepep-tests 2
  fi
  # ibgda_ep beside NCCL's all_to_all_single and DeepEP (when deep_ep is importable), one run.
  step ep-bench-2gpu env CUDA_VISIBLE_DEVICES=0,1 $T $TR --nproc-per-node 2 ep/bench_ep.py --tokens 512,1024,2048,4096 ${IBGDA_EP_BENCH_ARGS:-} --csv "$OUTDIR/ep-2gpu.csv"
  # The Rust benchmark, one process per GPU, over P2P and (the emulated NIC) IBGDA and the proxy.
  step ep-rust-bench-2gpu-p2p env CUDA_VISIBLE_DEVICES=0,1 $MP $T ./bin/ibgda-run -n 2 ./bin/ep_bench --tokens 512,1024,2048,4096 --csv "$OUTDIR/ep-2gpu-rust.csv"
  step ep-rust-bench-2gpu-ibgda env CUDA_VISIBLE_DEVICES=0,1 $MP $IB $T ./bin/ibgda-run -n 2 ./bin/ep_bench --tokens 1024 --iters 5 --csv "$OUTDIR/ep-2gpu-rust.csv"
  step ep-rust-bench-2gpu-proxy env CUDA_VISIBLE_DEVICES=0,1 $MP $PX $T ./bin/ibgda-run -n 2 ./bin/ep_bench --tokens 1024 --iters 5 --csv "$OUTDIR/ep-2gpu-rust.csv"
  # The NIC paths on the emulated device from PyTorch (what bounds them: the engine, see docs/benchmarks.md).
  step ep-bench-2gpu-ibgda env CUDA_VISIBLE_DEVICES=0,1 $IB $T $TR --nproc-per-node 2 ep/bench_ep.py --systems ibgda-ep --tokens 1024 --iters 5 --csv "$OUTDIR/ep-2gpu-ibgda.csv"
  step ep-bench-2gpu-proxy env CUDA_VISIBLE_DEVICES=0,1 $PX $T $TR --nproc-per-node 2 ep/bench_ep.py --systems ibgda-ep --tokens 1024 --iters 5 --csv "$OUTDIR/ep-2gpu-proxy.csv"
  step ring-put-2gpu-2threads env CUDA_VISIBLE_DEVICES=0,1 $T ./bin/ring_put --pes 2 --rounds 5 --bytes 67108864
  if command -v torchrun >/dev/null; then
    step ring-put-2gpu-torchrun env CUDA_VISIBLE_DEVICES=0,1 $T torchrun --nproc-per-node 2 --no-python ./bin/ring_put --rounds 5 --bytes 67108864
  fi
  step mp-kill-2gpu-2proc bash -c "CUDA_VISIBLE_DEVICES=0,1 $MP IBGDA_TIMEOUT_MS=5000 $T ./bin/ibgda-run -n 2 --grace 60 ./bin/mp_suite die-mid-kernel; grep -q 'SURVIVOR PE 0' '$OUTDIR/mp-kill-2gpu-2proc.log'"
  step ring-put-2gpu-ibgda env CUDA_VISIBLE_DEVICES=0,1 $IB timeout 120 ./bin/ring_put --pes 2 --bytes 67108864
  step ring-put-2gpu-proxy env CUDA_VISIBLE_DEVICES=0,1 $PX timeout 120 ./bin/ring_put --pes 2 --bytes 67108864
  capacity engine-capacity-2gpu 0,1
  capacity engine-capacity-2gpu-8sms 0,1 IBGDA_ENGINE_BLOCKS=8
  capacity engine-capacity-2gpu-32qp-8sms 0,1 IBGDA_ENGINE_BLOCKS=8 IBGDA_ENGINE_QPS=32
  capacity engine-capacity-2gpu-64qp-16sms 0,1 IBGDA_ENGINE_BLOCKS=16 IBGDA_ENGINE_QPS=64
  capacity engine-capacity-2gpu-64qp-32sms 0,1 IBGDA_ENGINE_BLOCKS=32 IBGDA_ENGINE_QPS=64
  compare compare-2gpu 0,1
  COMPARE_ARGS="--rate-block 128" compare compare-2gpu-ratemodel 0,1 $RATEMODEL
  step bench-2gpu-ibgda env CUDA_VISIBLE_DEVICES=0,1 $IB $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --engine-capacity --csv "$OUTDIR/bench-2gpu-ibgda.csv"
  step bench-2gpu-ibgda-8qp env CUDA_VISIBLE_DEVICES=0,1 $IB IBGDA_QPS_PER_PEER=8 $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --engine-capacity --csv "$OUTDIR/bench-2gpu-ibgda-8qp.csv"
  step bench-2gpu-ibgda-cpu-doorbell env CUDA_VISIBLE_DEVICES=0,1 $IB IBGDA_DOORBELL=cpu $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --csv "$OUTDIR/bench-2gpu-ibgda-cpu-doorbell.csv"
  step bench-2gpu-p2p env CUDA_VISIBLE_DEVICES=0,1 $T ./bin/p2p_bench --max-bytes 33554432 --blocks 32 $RATE --csv "$OUTDIR/bench-2gpu-p2p.csv"
  # Threads vs one process per GPU, same run, same file (issue 12's 3% figure).
  LAY="--max-bytes 33554432 --blocks 32 $RATE --layout-csv $OUTDIR/multiprocess-2gpu.csv"
  step layout-2gpu-threads env CUDA_VISIBLE_DEVICES=0,1 $T ./bin/p2p_bench $LAY
  step layout-2gpu-processes env CUDA_VISIBLE_DEVICES=0,1 $T ./bin/ibgda-run -n 2 ./bin/p2p_bench $LAY
  if [ -n "${IBGDA_SKIP_NVSHMEM:-}" ]; then
    echo "SKIP nvshmem baseline (IBGDA_SKIP_NVSHMEM)"
  elif [ -f baselines/nvshmem_bench.cu ] && python3 -c 'import nvidia.nvshmem' 2>/dev/null; then
    NV=$(python3 -c "import nvidia.nvshmem, os; print(list(nvidia.nvshmem.__path__)[0])")
    nvshmem_run() {
      export NVSHMEM_REMOTE_TRANSPORT=none LD_LIBRARY_PATH="$NV/lib:${LD_LIBRARY_PATH:-}"
      nvcc -O3 -rdc=true -arch=sm_90 -I"$NV/include" baselines/nvshmem_bench.cu "$NV/lib/libnvshmem_device.a" \
        -L"$NV/lib" -l:libnvshmem_host.so.3 -lcuda -o /tmp/nvb || return 1
      rm -f /tmp/uid; (/tmp/nvb 1 /tmp/uid > "$OUTDIR/nvshmem-pe1.log" 2>&1 &); timeout 300 /tmp/nvb 0 /tmp/uid
    }
    step nvshmem-baseline-2gpu nvshmem_run
    # Issue 16: our P2P figures in NVSHMEM's measurement form, then NVSHMEM's program, in one
    # step; both land in one CSV (system,metric,x,value,unit) with the ratio table in the log.
    p2p_vs_nvshmem() {
      local csv="$OUTDIR/p2p-vs-nvshmem-2gpu.csv"; rm -f "$csv"
      CUDA_VISIBLE_DEVICES=0,1 ./bin/p2p_bench --copy-variants --compare-csv "$csv" || return 1
      nvshmem_run > "$OUTDIR/nvshmem-for-compare.log" 2>&1 || return 1
      cat "$OUTDIR/nvshmem-for-compare.log"
      command -v cuobjdump >/dev/null && cuobjdump -sass -fun p_rate /tmp/nvb > "$OUTDIR/nvshmem-p_rate.sass" 2>&1
      ./bin/p2p_bench --nvshmem-log "$OUTDIR/nvshmem-for-compare.log" --compare-csv "$csv"
    }
    step p2p-vs-nvshmem-2gpu p2p_vs_nvshmem
  else
    echo "SKIP nvshmem baseline (no baselines/nvshmem_bench.cu or no nvidia-nvshmem wheel)"
  fi
else
  echo "SKIP 2-GPU steps: $NGPU GPU(s)"
fi
echo "failed:${failed:- none}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

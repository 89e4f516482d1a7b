#!/usr/bin/env bash
# One call on the GPU host: every GPU test and the GPU benchmarks, results under $OUT.
#
#   bash scripts/gpu_pass.sh            (from the repository root, on the device machine)
#
# Each step has its own time limit and the script goes on after a failure; a
# summary is printed last.  Files back (at most 8): gpu_pass.log, gpu_bench_4.json,
# gpu_bench_2.json, gpu_bench_4_node2.json, their PNGs, gpu_targets.md.
# Budget: about 8 minutes in all (STEP_SCALE=0.5 halves every limit).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none"
OUT="${OUT:-/tmp/gpu_pass_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_pass.log"
SCALE="${STEP_SCALE:-1}"
NGPU=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())" 2>/dev/null || echo 0)
MPIRUN="mpirun --allow-run-as-root --bind-to none"
declare -a SUMMARY

step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    secs=$(python3 -c "print(max(10, int($secs * $SCALE)))")
    echo "=== [$name] (limit ${secs}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 10 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    local took=$((SECONDS - t0))
    echo "=== [$name] rc=$rc ${took}s" | tee -a "$LOG"
    tail -n 25 "$LOG" | grep -E "passed|failed|FAIL|Error|OK:|wrote" | tail -n 5
    SUMMARY+=("$name: rc=$rc (${took}s)")
}

{ echo "gpu_pass on $(hostname) $(date -u +%FT%TZ), $NGPU GPUs"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader;
  python3 -c "import cupy, mpi4py; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'nccl', nccl.get_version(), 'mpi4py', mpi4py.__version__)"; } >>"$LOG" 2>&1

step "tests: device collectives, timeouts, virtual nodes" 270 \
    python3 -m pytest -q -m gpu tests/comm/test_gpu_comm.py -p no:cacheprovider
step "tests: other gpu-marked tests" 60 \
    python3 -m pytest -q -m gpu tests --ignore=tests/comm/test_gpu_comm.py -p no:cacheprovider
if [ "$NGPU" -ge 4 ]; then
    step "bench: 4 GPUs" 110 $MPIRUN -n 4 python3 benchmarks/gpu/bench_gpu.py --quick --out "$OUT/gpu_bench_4.json"
    step "bench: 4 GPUs as 2 virtual nodes" 30 env MPIML_NODE_SIZE=2 $MPIRUN -x MPIML_NODE_SIZE -n 4 \
        python3 benchmarks/gpu/bench_gpu.py --quick --ops allreduce --modes eager,graph --out "$OUT/gpu_bench_4_node2.json"
fi
if [ "$NGPU" -ge 2 ]; then
    step "bench: 2 GPUs" 70 $MPIRUN -n 2 python3 benchmarks/gpu/bench_gpu.py --quick --out "$OUT/gpu_bench_2.json"
fi
step "report" 30 python3 benchmarks/gpu/report.py "$OUT" "$OUT/gpu_bench_4.json" "$OUT/gpu_bench_2.json" \
    "$OUT/gpu_bench_4_node2.json"
cat "$OUT/gpu_targets.md" 2>/dev/null | tail -n 40
echo "=== summary"
for s in "${SUMMARY[@]}"; do echo "  $s"; done | tee -a "$LOG"

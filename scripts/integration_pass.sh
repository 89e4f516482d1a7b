#!/usr/bin/env bash
# One device call after the branches of a wave are merged: every GPU test of every package, the
# device collectives at 2 and 3 ranks, the peer-failure tests, Dask with CuPy chunks, and short
# GPU benchmarks (raw NCCL vs mpiml; the estimators against scikit-learn), on the GPUs present.
#
#   bash scripts/integration_pass.sh        (repository root, on the GPU host; results in $OUT)
#
# Each step has its own limit; steps after BUDGET seconds are skipped (the call must end in time).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
export OMP_NUM_THREADS=4 DASK_LOGGING__DISTRIBUTED=error
OUT=${OUT:-/tmp/integration_out}
BUDGET=${BUDGET:-450}
mkdir -p "$OUT/results"
LOG="$OUT/integration.log"
if ls .whl/*.whl >/dev/null 2>&1; then   # dask, distributed and their pure-Python needs
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        >>"$LOG" 2>&1 && export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
SUMMARY=()
T0=$SECONDS

step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    if [ $((SECONDS - T0 + 10)) -gt "$BUDGET" ]; then SUMMARY+=("$name: skipped (budget)"); return; fi
    local left=$((BUDGET - (SECONDS - T0)))
    [ "$secs" -gt "$left" ] && secs=$left
    echo "=== [$name] (limit ${secs}s, at $((SECONDS - T0))s)" >>"$LOG"
    local t0=$SECONDS
    timeout -k 5 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" >>"$LOG"
}

{ echo "integration pass on $(hostname), $(date -u +%FT%TZ), $NGPU GPU(s), commit $(cat .git-commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } >>"$LOG" 2>&1

step "mpiml info ($NGPU ranks)" 30 $MPIRUN -n "$NGPU" python3 -m mpiml info
GPU_TESTS=$(ls -d tests/kernels tests/cluster tests/linear_model tests/ensemble tests/decomposition \
            tests/neighbors tests/datasets tests/utils tests/test_io.py 2>/dev/null)
step "GPU tests of every package" 230 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=200 \
    --durations=15 $GPU_TESTS
step "device collectives, 2 ranks (mpi, nccl, ipc; graphs)" 45 env MPIML_TIMEOUT=60 \
    $MPIRUN -n 2 python3 tests/comm/gpu_collectives.py mpi,nccl,ipc --graph
step "device collectives, 3 ranks (nccl, ipc)" 45 env MPIML_TIMEOUT=60 \
    $MPIRUN -n 3 python3 tests/comm/gpu_collectives.py nccl,ipc --graph
step "peer stall (ipc, 2 ranks)" 25 env MPIML_TIMEOUT=3 MPIML_DEVICE_SYNC=0 \
    $MPIRUN -n 2 python3 tests/comm/gpu_timeout.py ipc stall
step "peer killed (nccl, 2 ranks)" 25 env MPIML_TIMEOUT=3 MPIML_DEVICE_SYNC=0 OMPI_MCA_orte_allowed_exit_without_sync=1 \
    $MPIRUN -n 2 python3 tests/comm/gpu_timeout.py nccl kill
step "Dask: KMeans on CuPy chunks" 60 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=55 \
    tests/dask/test_estimators.py
step "vs_nccl ($NGPU GPUs)" 60 $MPIRUN -n "$NGPU" python3 benchmarks/gpu/vs_nccl.py --rounds 2 \
    --sizes 4,1024,16384,65536,262144,1048576,4194304,67108864 --out "$OUT/results/vs_nccl_$NGPU.json"
step "bench ml linreg (GPU)" 60 python3 -m mpiml bench ml --algo linreg --device gpu --ranks "1,$NGPU" \
    --rows 2e7 --repeats 2 --out "$OUT/results" --tag gpu_h200x$NGPU
step "bench ml rf (GPU)" 60 python3 -m mpiml bench ml --algo rf --device gpu --ranks "1,$NGPU" \
    --rows 1e6 --trees 20 --depth 10 --out "$OUT/results"

{ echo "=== summary"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"
tar -C "$OUT/results" -czf "$OUT/results.tar.gz" . 2>/dev/null

#!/usr/bin/env bash
# The second device call of a wave: the GPU tests of the estimators merged after the first call
# (nearest neighbours, decompositions), the kernel fix it found, device binding under mpirun, and
# short estimator benchmarks on the GPUs present. Results under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe" OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/integration_out}
BUDGET=${BUDGET:-280}
mkdir -p "$OUT/results"
LOG="$OUT/integration2.log"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
RANKS=1; [ "$NGPU" -gt 1 ] && RANKS="1,$NGPU"
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
echo "integration pass 2 on $(hostname), $(date -u +%FT%TZ), $NGPU GPU(s), commit $(cat .git-commit 2>/dev/null)" >>"$LOG"
step "GPU tests: neighbours, decompositions, the k = 1024 float64 step" 150 python3 -m pytest -q -m gpu \
    -p no:cacheprovider --timeout=140 tests/neighbors tests/decomposition \
    "tests/cluster/test_gpu_kmeans.py::test_fused_step_matches_host"
step "mpiml.init under mpirun ($NGPU ranks)" 30 $MPIRUN -n "$NGPU" python3 -c \
    "import mpiml; from mpiml.comm import get_comm; d = mpiml.init(); c = get_comm(); print(f'rank {c.rank}: device {d}, {mpiml.device_info()[\"how\"]}')"
step "bench ml linreg (GPU)" 60 python3 -m mpiml bench ml --algo linreg --device gpu --ranks "$RANKS" \
    --rows 1e7 --repeats 2 --sklearn-rows 1e6 --out "$OUT/results" --tag gpu_h200x$NGPU
step "bench ml rf (GPU)" 60 python3 -m mpiml bench ml --algo rf --device gpu --ranks "$RANKS" \
    --rows 1e6 --trees 20 --depth 10 --sklearn-rows 2e5 --out "$OUT/results"
{ echo "=== summary"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"

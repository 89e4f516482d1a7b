#!/usr/bin/env bash
# One device call on one GPU (ranks share it): the staged-MPI benchmark (benchmarks/gpu/staged_mpi.py,
# 2 ranks), the GPU collective tests at 1 rank (every backend) and at 2 and 3 ranks sharing the GPU
# (tests/comm/test_gpu_comm.py), then the CPU tests of the pipelined schedule under this host's Open MPI.
#
#   bash benchmarks/gpu/staged_pass.sh        (repository root, on the GPU host; results in $OUT)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe" OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/staged_out}
BUDGET=${BUDGET:-285}
mkdir -p "$OUT"
LOG="$OUT/staged_pass.log"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe"
SUMMARY=()
T0=$SECONDS
step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    if [ $((SECONDS - T0 + 10)) -gt "$BUDGET" ]; then SUMMARY+=("$name: skipped (budget)"); return; fi
    local left=$((BUDGET - (SECONDS - T0)))
    [ "$secs" -gt "$left" ] && secs=$left
    echo "=== [$name] (limit ${secs}s, at $((SECONDS - T0))s)" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 5 "$secs" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" | tee -a "$LOG"
}
{ echo "staged pass on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
  ompi_info 2>/dev/null | grep -i "cuda support\|Open MPI:" | head -3; } | tee -a "$LOG"
step "staged MPI benchmark (2 ranks, one GPU)" 125 $MPIRUN -n 2 python3 benchmarks/gpu/staged_mpi.py \
    --out "$OUT/staged_mpi_h200x1.json" --budget 60
step "GPU collectives: 1 rank every backend; 2 and 3 ranks sharing the GPU" 150 python3 -m pytest -q \
    -p no:cacheprovider --timeout=140 -rs --durations=8 tests/comm/test_gpu_comm.py -k "every_backend or sharing"
step "pipelined schedule and shared-GPU agreement on the CPU (Open MPI)" 60 python3 -m pytest -q \
    -p no:cacheprovider --timeout=55 tests/comm/test_shared_gpu.py tests/comm/test_staging_pipeline.py \
    -k "not late_streams or late_streams and (2 or 3)"
{ echo "=== summary"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"

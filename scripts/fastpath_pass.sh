#!/usr/bin/env bash
# Issue 9 on the GPU host in one device call: the GPU comm tests (1-4 ranks), the peer-failure
# tests, and benchmarks/gpu/vs_nccl.py (raw CuPy-NCCL vs mpiml, eager and graph, host cost).
#
#   bash scripts/fastpath_pass.sh first   # debug pass: 4- and 3-rank tests, stall tests, quick sweep
#   bash scripts/fastpath_pass.sh final   # 1-4 rank tests, every failure test, the full sweep
#
# Writes $OUT/fastpath_<part>.log (every step's output and a summary) and the sweep's JSON/PNG.
set -u
PART=${1:-first}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/fastpath_out}
mkdir -p "$OUT"
LOG="$OUT/fastpath_$PART.log"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe"
SUMMARY=()
T0=$SECONDS

step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    echo "=== [$name] (limit ${secs}s, at $((SECONDS - T0))s)" >>"$LOG"
    local t0=$SECONDS
    timeout -k 5 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" >>"$LOG"
}

failure_test() {  # failure_test BACKEND MODE N
    local env=(MPIML_TIMEOUT=3 MPIML_DEVICE_SYNC=0)
    [ "$2" = sync ] && env=(MPIML_TIMEOUT=3 MPIML_DEVICE_SYNC=1)
    [ "$2" = kill ] && env+=(OMPI_MCA_orte_allowed_exit_without_sync=1)
    step "peer $2 ($1, $3 ranks)" 25 env "${env[@]}" $MPIRUN -n "$3" python3 tests/comm/gpu_timeout.py "$1" "$2"
}

{ echo "fastpath $PART on $(hostname), $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  nvidia-smi topo -m; python3 -c 'import cupy, mpi4py; from cupy.cuda import nccl; print("cupy", cupy.__version__, "nccl", nccl.get_version(), "mpi4py", mpi4py.__version__)'; } >>"$LOG" 2>&1

if [ "$PART" = first ]; then
    step "collectives, 4 ranks (ipc, nccl; graphs; stream-ordered)" 100 env MPIML_TIMEOUT=60 \
        $MPIRUN -n 4 python3 tests/comm/gpu_collectives.py ipc,nccl --graph
    step "collectives, 3 ranks (ipc)" 60 env MPIML_TIMEOUT=60 $MPIRUN -n 3 python3 tests/comm/gpu_collectives.py ipc
    failure_test ipc stall 4
    failure_test nccl stall 4
    step "vs_nccl quick (4 GPUs)" 90 $MPIRUN -n 4 python3 benchmarks/gpu/vs_nccl.py --rounds 2 \
        --sizes 4,4096,65536,262144,1048576,4194304,67108864 --out "$OUT/vs_nccl_4_first.json"
else
    # most important first: each step has its own limit, the whole call must end inside 300 s
    step "collectives, 4 ranks (mpi, nccl, ipc; graphs; stream-ordered)" 80 env MPIML_TIMEOUT=60 \
        $MPIRUN -n 4 python3 tests/comm/gpu_collectives.py mpi,nccl,ipc --graph
    step "vs_nccl (4 GPUs)" 120 $MPIRUN -n 4 python3 benchmarks/gpu/vs_nccl.py --rounds 3 \
        --out "$OUT/vs_nccl_4.json" --plot "$OUT/vs_nccl_4.png"
    step "collectives, 3 ranks (nccl, ipc)" 30 env MPIML_TIMEOUT=60 $MPIRUN -n 3 python3 tests/comm/gpu_collectives.py nccl,ipc --graph
    failure_test ipc stall 4
    failure_test ipc kill 4
    failure_test nccl kill 4
    step "collectives, 2 ranks (ipc, nccl)" 25 env MPIML_TIMEOUT=60 $MPIRUN -n 2 python3 tests/comm/gpu_collectives.py ipc,nccl --graph
    step "collectives, 1 rank (mpi, nccl, ipc)" 20 env MPIML_TIMEOUT=60 $MPIRUN -n 1 python3 tests/comm/gpu_collectives.py mpi,nccl,ipc
    failure_test ipc sync 3
    failure_test nccl stall 3
fi
{ echo "=== summary ($PART, $((SECONDS - T0))s)"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"
grep -E "^(allreduce|bcast) |OK|FAIL|rror|host_us|gpu_us|rank [0-9]+: |wrote" "$LOG" | grep -v "^=== " | head -150

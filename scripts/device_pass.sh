#!/usr/bin/env bash
# The whole GPU pass on the GPU host, in as few device calls as possible.
#
#   bash scripts/device_pass.sh all    # every GPU test, GPU comm benchmarks, tune/bench comm on CuPy buffers, Dask
#   bash scripts/device_pass.sh two    # tune/bench comm on 2 GPUs, Dask with CuPy frames
#   bash scripts/device_pass.sh ml     # KMeans GPU tests + mpiml bench ml
#
# Everything lands in $OUT: device_pass_<part>.log (the summary and every step's output) and
# results_<part>.tar.gz (JSON, PNG and logs, laid out as in the repository's benchmarks/results).
# Each step has its own time limit; a failing step does not stop the others.
set -u
PART=${1:-all}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none"
OUT=${OUT:-/tmp/device_pass_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
mkdir -p "$WORK/results"
LOG="$OUT/device_pass_$PART.log"
# carried wheels (dask, distributed and their pure-Python needs; heat) go on the path
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        >>"$LOG" 2>&1 && export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe"
SUMMARY=()

step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    echo "=== [$name] (limit ${secs}s)" >>"$LOG"
    local t0=$SECONDS
    timeout -k 10 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" >>"$LOG"
}

tune_and_sweep() {  # tune_and_sweep N: mpiml tune, then mpiml bench comm with that table, on N GPUs
    local n=$1
    export MPIML_TUNING_FILE="$WORK/results/gpu_tuning_h200x$n.json"
    local sweep="--ops allreduce,bcast,allgather,reduce --min-bytes 4 --max-bytes 256MiB --step 8 --rounds 3 --target-ms 3 --quiet"
    step "mpiml tune --device gpu ($n GPUs)" 75 $MPIRUN -n "$n" -x MPIML_TUNING_FILE python3 -m mpiml tune --device gpu \
        $sweep --series "nccl/*,ipc/*,mpi/native"
    step "mpiml bench comm --device gpu ($n GPUs)" 75 $MPIRUN -n "$n" -x MPIML_TUNING_FILE python3 -m mpiml bench comm \
        --device gpu $sweep --series "nccl/*,ipc/*,mpi/native" \
        --json "$WORK/results/comm_gpu_$n.json" --plot "$WORK/results/comm_gpu_$n.png"
}

{ echo "device_pass $PART on $(hostname), $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } >>"$LOG" 2>&1

if [ "$PART" = all ]; then
    # one call of under 10 minutes: every GPU test, then the GPU benchmarks
    step "mpiml info (4 ranks)" 40 $MPIRUN -n 4 python3 -m mpiml info
    step "GPU comm tests (1, 2, 4 ranks; every backend; graphs; timeouts; virtual nodes)" 150 \
        python3 -m pytest -q -m gpu tests/comm/test_gpu_comm.py -p no:cacheprovider
    step "other GPU tests (datasets, validation, model files, KMeans)" 110 \
        python3 -m pytest -q -m gpu tests/datasets tests/utils tests/test_io.py tests/cluster -p no:cacheprovider
    step "bench_gpu: raw NCCL vs mpiml paths, eager/sync/graph (4 GPUs)" 110 \
        $MPIRUN -n 4 python3 benchmarks/gpu/bench_gpu.py --quick --out "$WORK/results/gpu_bench_4.json"
    tune_and_sweep 4
    step "Dask over mpi:// with CuPy frames" 100 bash benchmarks/dask/gpu_check.sh "$WORK/results/dask_gpu"
    python3 benchmarks/gpu/report.py "$WORK/results" "$WORK/results/gpu_bench_4.json" >>"$LOG" 2>&1
elif [ "$PART" = two ]; then
    # 2 GPUs: tune and sweep on CuPy buffers (rules for 2 ranks), then Dask with CuPy frames
    tune_and_sweep 2
    step "Dask over mpi:// with CuPy frames" 120 bash benchmarks/dask/gpu_check.sh "$WORK/results/dask_gpu"
elif [ "$PART" = ml ]; then
    step "KMeans GPU tests and mpiml bench ml" 420 bash benchmarks/ml/gpu_pass.sh "$WORK/results/ml"
fi

{ echo "=== summary ($PART)"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"
tar -C "$WORK/results" -czf "$OUT/results_$PART.tar.gz" . && ls -la "$OUT"

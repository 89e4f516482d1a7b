#!/usr/bin/env bash
# The device calls of a wave on a host of one GPU, after the branches are merged (repository root,
# on the GPU host; results and logs under $OUT, at most 8 files come back: the rest is tarred).
#
#   bash scripts/integration_pass3.sh tests   every GPU test of every package (ranks share the GPU
#                                             where a test asks for several), then sparse KMeans / neighbours
#                                             at 10^6 x 10^6 (1 rank) and at 10^5 x 10^5 on 2 ranks
#   bash scripts/integration_pass3.sh dask    the Dask comm tests with CuPy frames (staged, CUDA IPC), the
#                                             applications and comm sweep over mpi:// (IPC on / off) vs tcp://,
#                                             LinearRegression and LogisticRegression at scale
#   bash scripts/integration_pass3.sh bench   Dask CuPy frames over mpi:// vs tcp://, sparse TruncatedSVD and
#                                             Ridge, dense LinearRegression / LogisticRegression / PCA at scale
#                                             against scikit-learn on the host cores
#
# Each step has its own limit; steps after BUDGET seconds are skipped so the call ends in time.
set -u
MODE=${1:-tests}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
export OMP_NUM_THREADS=4 DASK_LOGGING__DISTRIBUTED=error MPIML_TIMEOUT=120
OUT=${OUT:-/tmp/integration_out}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT/results"
LOG="$OUT/pass_$MODE.log"
if ls .whl/*.whl >/dev/null 2>&1; then   # dask, distributed and their pure-Python needs
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        >>"$LOG" 2>&1
fi
export PYTHONPATH="$PWD/src:$PWD/tests:/tmp/site"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe -x PYTHONPATH -x OMP_NUM_THREADS -x MPIML_TIMEOUT \
 -x DASK_LOGGING__DISTRIBUTED"
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

{ echo "integration pass ($MODE) on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import numpy, scipy, sklearn, cupy; print('numpy', numpy.__version__, 'scipy', scipy.__version__, \
'sklearn', sklearn.__version__, 'cupy', cupy.__version__)"; } >>"$LOG" 2>&1

if [ "$MODE" = dask ]; then
    step "Dask comm and estimator tests (CuPy frames staged and by CUDA IPC)" 120 python3 -m pytest -q \
        -p no:cacheprovider --timeout=110 -o addopts="" tests/dask/test_comm.py tests/dask/test_estimators.py
    for rep in 1 2; do for cfg in "mpi 1048576" "mpi 0" "tcp 1048576"; do set -- $cfg
        step "Dask CuPy (x + x.T).sum() over $1://, IPC from $2 B ($rep)" 60 env MPIML_DASK_IPC_BYTES=$2 \
            $MPIRUN -x MPIML_DASK_IPC_BYTES -n 4 python3 benchmarks/dask/gpu_rank.py --protocol $1 \
            benchmarks/dask/bench_apps.py --device gpu -n 8000 --chunk 2000 --repeat 5 --layouts scheduler,rows \
            --out "$OUT/results/dask_apps_${1}_ipc$2_$rep.json"
    done; done
    step "Dask comm sweep, CuPy payloads, mpi:// vs tcp://" 40 $MPIRUN -n 2 python3 benchmarks/dask/bench_comm.py \
        --device gpu --iters 30 --budget 67108864 --out "$OUT/results/dask_gpu_comm_ipc_h200x1.json"
    step "LinearRegression 1e8 x 64 (1 GPU)" 120 python3 -m mpiml bench ml --algo linreg --device gpu --ranks 1 \
        --rows 1e8 --repeats 3 --sklearn-rows 1e6 --out "$OUT/results" --tag gpu_h200x1_1e8
    step "LogisticRegression 1e7 x 128 (1 GPU)" 120 python3 -m mpiml bench ml --algo logreg --device gpu --ranks 1 \
        --rows 1e7 --repeats 2 --sklearn-rows 1e6 --out "$OUT/results" --tag gpu_h200x1_1e7
elif [ "$MODE" = tests ]; then
    step "mpiml info" 30 python3 -m mpiml info
    step "GPU tests of every package" 380 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=150 \
        --durations=25 -o addopts="" tests
    step "sparse KMeans + neighbours, 10^6 x 10^6, 1 rank" 200 $MPIRUN -n 1 python3 benchmarks/sparse/sparse_gpu.py \
        --out "$OUT/results/sparse_gpu_h200x1.json"
    step "sparse, 2 ranks sharing the GPU (scale 0.1)" 60 $MPIRUN -n 2 python3 benchmarks/sparse/sparse_gpu.py \
        --scale 0.1 --out "$OUT/results/sparse_gpu_2ranks_scale0.1.json"
else
    for rep in 1 2; do for p in mpi tcp; do
        step "Dask CuPy (x + x.T).sum() over $p://, 2 workers sharing the GPU ($rep)" 60 $MPIRUN -n 4 \
            python3 benchmarks/dask/gpu_rank.py --protocol $p benchmarks/dask/bench_apps.py --device gpu -n 8000 \
            --chunk 2000 --repeat 5 --layouts scheduler,rows --out "$OUT/results/dask_apps_${p}_$rep.json"
    done; done
    step "Dask comm sweep, CuPy payloads, mpi:// vs tcp://" 40 $MPIRUN -n 2 python3 benchmarks/dask/bench_comm.py \
        --device gpu --iters 30 --budget 67108864 --out "$OUT/results/dask_gpu_comm_h200x1.json"
    common="--device gpu --ranks 1 --sparse 0.001 --rows 1e6 --features 100000 --dtype float32 --sklearn-rows 2e5"
    step "sparse TruncatedSVD (1e6 x 1e5, 1e8 values)" 100 python3 -m mpiml.bench.ml_linear --algo tsvd \
        --components 16 $common --out "$OUT/results" --tag sparse_gpu_h200x1
    step "sparse Ridge (1e6 x 1e5, 1e8 values)" 100 python3 -m mpiml.bench.ml_linear --algo ridge $common \
        --out "$OUT/results" --tag sparse_gpu_h200x1
    step "LinearRegression 1e8 x 64 (1 GPU)" 120 python3 -m mpiml bench ml --algo linreg --device gpu --ranks 1 \
        --rows 1e8 --repeats 3 --sklearn-rows 1e6 --out "$OUT/results" --tag gpu_h200x1_1e8
    step "LogisticRegression 1e7 x 128 (1 GPU)" 150 python3 -m mpiml bench ml --algo logreg --device gpu --ranks 1 \
        --rows 1e7 --repeats 2 --sklearn-rows 1e6 --out "$OUT/results" --tag gpu_h200x1_1e7
    step "PCA 1e7 x 512 -> 32 components (1 GPU)" 90 python3 -m mpiml run pca --np 1 --device gpu --dtype float32 \
        --data lowrank:n=10000000,d=512,rank=32 --components 32 --json "$OUT/results/pca_1e7x512_gpu_h200x1.json"
    step "PCA 1e6 x 512 -> 32 components (1 GPU) with scikit-learn on the host cores" 90 python3 -m mpiml run pca \
        --np 1 --device gpu --dtype float32 --data lowrank:n=1000000,d=512,rank=32 --components 32 --compare-sklearn \
        --json "$OUT/results/pca_1e6x512_gpu_h200x1_vs_sklearn.json"
fi

{ echo "=== summary"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } | tee -a "$LOG"
tar -C "$OUT/results" -czf "$OUT/results.tar.gz" . 2>/dev/null

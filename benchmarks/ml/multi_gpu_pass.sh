#!/usr/bin/env bash
# The k-means pass on several GPUs: multi-rank GPU tests, then `mpiml bench ml --shapes` (1, 2, 4 GPUs, plain
# CuPy and scikit-learn in the same run) and the whole fit at 4e7 x 64, k = 64 with k-means|| init.
# Usage (repository root, GPU host): benchmarks/ml/multi_gpu_pass.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/multi_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
if mpirun --version 2>/dev/null | grep -qi "open mpi"; then
    export MPIML_TEST_MPIEXEC=${MPIML_TEST_MPIEXEC:-mpirun}
    extra="--bind-to none --oversubscribe"
    [ "$(id -u)" = 0 ] && extra="$extra --allow-run-as-root"
    export MPIML_TEST_MPIEXEC_ARGS=${MPIML_TEST_MPIEXEC_ARGS:-$extra}
fi
RANKS=${RANKS:-1,2,4}
status=0
timeout "${T_TESTS:-45}" $PY -m pytest tests/kernels/test_distances.py::test_lloyd_step_spmd_with_empty_shard \
    tests/cluster/test_gpu_kmeans.py::test_kmeans_gpu_spmd -q -p no:cacheprovider -o addopts="" -n 7 2>&1 \
    | tail -15 | tee "$OUTDIR/multi_tests.log" || status=1
timeout "${T_SHAPES:-95}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 1e7x64x64,1e7x16x16,1e6x256x1024,2e6x1024x64 --out "$OUTDIR" --tag gpu_shapes 2>&1 \
    | grep -v Warning | tee "$OUTDIR/shapes.log" || status=1
timeout "${T_FIT:-50}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 4e7x64x64 --fit-init "k-means||" --out "$OUTDIR" --tag gpu_fit 2>&1 \
    | grep -v Warning | tee "$OUTDIR/fit.log" || status=1
timeout "${T_F64:-35}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat --dtype float64 \
    --shapes 1e7x64x64,1e7x16x16 --out "$OUTDIR" --tag gpu_shapes_f64 2>&1 \
    | grep -v Warning | tee "$OUTDIR/f64.log" || status=1
exit $status

#!/usr/bin/env bash
# Sparse linear models and decompositions on the GPU host, one GPU, one call (< 2 minutes of benchmarks):
# the GPU tests of tests/linear_model and tests/decomposition (cupyx CSR against SciPy CSR, dense CuPy paths),
# then sparse TruncatedSVD and sparse Ridge on 1 GPU rank against scikit-learn on every host core in the same run.
# Usage (from the repository root, on the GPU host): benchmarks/ml/sparse_linear_gpu_pass.sh OUTDIR
# Writes OUTDIR/sparse_linear_gpu_tests.log, OUTDIR/sparse_bench_{tsvd,ridge}.log and
# OUTDIR/ml_{tsvd,ridge}_sparse_gpu.{json,png}.
# Data: CSR 1e6 x 1e5, density 1e-3 (1e8 stored values, float32); scikit-learn fits the first 2e5 rows,
# its time scaled by rows.  Written on a machine without a GPU: not run yet.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/sparse_linear_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
status=0
timeout 120 $PY -m pytest -m gpu tests/linear_model tests/decomposition -q -p no:cacheprovider -o addopts="" 2>&1 \
    | tee "$OUTDIR/sparse_linear_gpu_tests.log" || status=1
common="--device gpu --ranks 1 --sparse 0.001 --rows 1e6 --features 100000 --dtype float32 --sklearn-rows 2e5 --out $OUTDIR"
timeout 240 $PY -m mpiml.bench.ml_linear --algo tsvd --components 16 $common 2>&1 \
    | tee "$OUTDIR/sparse_bench_tsvd.log" || status=1
timeout 240 $PY -m mpiml.bench.ml_linear --algo ridge $common 2>&1 \
    | tee "$OUTDIR/sparse_bench_ridge.log" || status=1
exit $status

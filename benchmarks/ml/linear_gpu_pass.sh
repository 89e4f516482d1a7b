#!/usr/bin/env bash
# The linear-model part of the GPU pass: GPU tests under mpirun (1, 2, 4 ranks) and both benchmarks.
# Usage (from the repository root, on the GPU host): benchmarks/ml/linear_gpu_pass.sh OUTDIR
# Writes OUTDIR/linear_gpu_tests.log, OUTDIR/linear_bench_{linreg,logreg}.log and
# OUTDIR/ml_{linreg,logreg}_gpu.{json,png}: LinearRegression 1e8 x 64 and LogisticRegression 1e7 x 128
# on 1, 2, 4 GPUs, scikit-learn on every host core in the same run.
# Not run yet (written on a machine without a GPU); expect several minutes, most of it scikit-learn.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/linear_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
status=0
timeout 300 $PY -m pytest tests/linear_model/test_gpu_linear.py -q -p no:cacheprovider -o addopts="" 2>&1 \
    | tee "$OUTDIR/linear_gpu_tests.log" || status=1
# linreg: float32 data (25.6 GB at 1e8 x 64, so one GPU holds it; the solver accumulates in float64);
# scikit-learn fits the first 1e7 rows and is scaled by rows
timeout 600 $PY -m mpiml bench ml --algo linreg --device gpu --rows 1e8 --features 64 --dtype float32 --out "$OUTDIR" 2>&1 \
    | tee "$OUTDIR/linear_bench_linreg.log" || status=1
# logreg: scikit-learn fits all 1e7 rows, so the objectives are compared
timeout 600 $PY -m mpiml bench ml --algo logreg --device gpu --rows 1e7 --features 128 --out "$OUTDIR" 2>&1 \
    | tee "$OUTDIR/linear_bench_logreg.log" || status=1
exit $status

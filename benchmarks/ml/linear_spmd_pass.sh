#!/usr/bin/env bash
# Linear models and decompositions on the GPU host: the one-pass GPU tests, then the one-run SPMD
# benchmark (mpiml, plain CuPy, scikit-learn scaled, floor) of each algorithm at each rank count.
# Usage (repository root): benchmarks/ml/linear_spmd_pass.sh OUTDIR ["1 2 4"] ["linreg ridge logreg pca tsvd"]
# Writes OUTDIR/linear_spmd_tests.log, OUTDIR/ml_{algo}_n{N}.{json,png,log}.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/linear_spmd_pass.sh OUTDIR [RANKS] [ALGOS]}
RANKS=${2:-"1 2 4"}
ALGOS=${3:-"linreg ridge logreg pca tsvd"}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
LAUNCH=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 300 $PY -m pytest tests/linear_model/test_gpu_fused.py -q -x -p no:cacheprovider -o addopts="" 2>&1 \
        | tee "$OUTDIR/linear_spmd_tests.log" || status=1
fi
for algo in $ALGOS; do
    for n in $RANKS; do
        timeout 240 "${LAUNCH[@]}" -n "$n" $PY -m mpiml.bench.ml_decomp --algo "$algo" \
            --json "$OUTDIR/ml_${algo}_n${n}.json" 2>&1 | tee "$OUTDIR/ml_${algo}_n${n}.log" || status=1
    done
done
exit $status

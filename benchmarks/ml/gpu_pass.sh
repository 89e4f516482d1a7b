#!/usr/bin/env bash
# The KMeans part of the final GPU pass: GPU tests under mpirun (1, 2, 4 ranks) and the ML benchmark.
# Usage (from the repository root, on the GPU host): benchmarks/ml/gpu_pass.sh OUTDIR
# Writes OUTDIR/ml_gpu_tests.log, OUTDIR/ml_bench.log, OUTDIR/ml_kmeans_gpu.{json,png}; about 3-4 minutes.
# Heat is used when `heat` imports, or when its wheel (and torchvision's) are carried in .whl/.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
if ! $PY -c "import heat" 2>/dev/null && ls .whl/heat-*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/mpiml_ml_site \
        .whl/heat-*.whl .whl/torchvision-*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/mpiml_ml_site"
fi
status=0
timeout 170 $PY -m pytest tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider -o addopts="" 2>&1 \
    | tee "$OUTDIR/ml_gpu_tests.log" || status=1
timeout 200 $PY -m mpiml bench ml --algo kmeans --device gpu --out "$OUTDIR" 2>&1 | tee "$OUTDIR/ml_bench.log" || status=1
exit $status

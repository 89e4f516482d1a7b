#!/usr/bin/env bash
# The k-means pass on a host of several GPUs, in one call: the kernel and k-means GPU tests (multi-rank at 1-4
# ranks), the whole fit at 4e7 x 64, k = 64 with k-means|| init on 1, 2, 4 GPUs (scikit-learn on the host's
# cores in the same run), `mpiml bench ml --shapes` with the four benchmark shapes (plain CuPy and scikit-learn
# in the same run), then the single-GPU kernel benchmark.  Each part has its time limit (T_TESTS, T_FIT,
# T_SHAPES, T_KERNELS seconds; 0 skips it): on a fresh 4 x H200 host (kernels compiled on first use) the tests
# took 56 s, the fit about 40 s, and the shapes more than 250 s, so a 600 s call holds the first three at most.
# Usage (repository root, GPU host): benchmarks/ml/multi_gpu_pass.sh OUTDIR
# Everything printed goes to OUTDIR/multi.log; results to OUTDIR/{kernels_bench,ml_kmeans_gpu_*}.{json,png}.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/multi_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
RANKS=${RANKS:-1,2,4}
LOG="$OUTDIR/multi.log"
status=0
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv >> "$LOG" 2>&1
part() {     # part LIMIT COMMAND...: run unless LIMIT is 0, output (less warnings) to the log
    local limit=$1; shift
    [ "$limit" = 0 ] && return 0
    timeout "$limit" "$@" 2>&1 | grep -v -i "warn\|warm.fit" >> "$LOG" || status=1
}
part "${T_TESTS:-120}" $PY -m pytest tests/kernels tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider \
    -o addopts="" -n 16
part "${T_FIT:-120}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 4e7x64x64 --fit-init "k-means||" --out "$OUTDIR" --tag gpu_fit
part "${T_SHAPES:-330}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 1e7x64x64,1e7x16x16,1e6x256x1024,2e6x1024x64 --out "$OUTDIR" --tag gpu_shapes
part "${T_KERNELS:-0}" $PY benchmarks/ml/kernels_bench.py "$OUTDIR" --quick
tail -60 "$LOG"
exit $status

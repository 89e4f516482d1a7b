#!/usr/bin/env bash
# The k-means pass on a host of several GPUs, in one call: the kernel and k-means GPU tests (multi-rank at 1-4
# ranks), the single-GPU kernel benchmark (fused kernel vs GEMM path vs plain CuPy), then `mpiml bench ml --shapes`
# on 1, 2, 4 GPUs (plain CuPy and scikit-learn in the same run) and the whole fit at 4e7 x 64, k = 64 with
# k-means|| init.  Usage (repository root, GPU host): benchmarks/ml/multi_gpu_pass.sh OUTDIR
# Everything printed goes to OUTDIR/multi.log; results to OUTDIR/{kernels_bench,ml_kmeans_gpu_*}.{json,png}.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/multi_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
RANKS=${RANKS:-1,2,4}
LOG="$OUTDIR/multi.log"
status=0
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv >> "$LOG" 2>&1
timeout "${T_TESTS:-50}" $PY -m pytest tests/kernels tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider \
    -o addopts="" -n 16 2>&1 | grep -v -i warn | tail -25 >> "$LOG" || status=1
timeout "${T_KERNELS:-45}" $PY benchmarks/ml/kernels_bench.py "$OUTDIR" --quick 2>&1 | grep -v -i warn >> "$LOG" || status=1
timeout "${T_SHAPES:-85}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 1e7x64x64,1e7x16x16,1e6x256x1024,2e6x1024x64 --out "$OUTDIR" --tag gpu_shapes 2>&1 \
    | grep -v -i warn >> "$LOG" || status=1
timeout "${T_FIT:-50}" $PY -m mpiml bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat \
    --shapes 4e7x64x64 --fit-init "k-means||" --out "$OUTDIR" --tag gpu_fit 2>&1 \
    | grep -v -i warn >> "$LOG" || status=1
tail -60 "$LOG"
exit $status

#!/usr/bin/env bash
# The kernel pass on one GPU, in the order that keeps the most if the time slot ends early:
# the kernel and k-means GPU tests (1-4 ranks sharing the GPU), the kernel benchmark (+ whole fits), the
# parts of a Lloyd step timed apart, and Nsight Compute on the parts of the 10^7 x 64, k = 64 float32 step.
# Usage (repository root, GPU host): benchmarks/ml/kernels_gpu_pass.sh OUTDIR   (about 4 minutes)
# Writes OUTDIR/{gpu.txt,tests.log,bench.log,kernels_bench.{json,png},variants.log,lloyd_variants.json,ncu_*.txt}.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/kernels_gpu_pass.sh OUTDIR}
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
T_TESTS=${T_TESTS:-240}; T_BENCH=${T_BENCH:-240}; T_VAR=${T_VAR:-150}; T_NCU=${T_NCU:-60}
XD=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUTDIR/gpu.txt"
timeout "$T_TESTS" $PY -m pytest tests/kernels tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider \
    -o addopts="" $XD > "$OUTDIR/tests.log" 2>&1 || status=1
tail -3 "$OUTDIR/tests.log"; grep -E "^FAILED|^ERROR" "$OUTDIR/tests.log" | head -20
timeout "$T_BENCH" $PY benchmarks/ml/kernels_bench.py "$OUTDIR" ${BENCH_ARGS:---quick --all-shapes} \
    > "$OUTDIR/bench.log" 2>&1 || status=1
grep -A12 "^shape" "$OUTDIR/bench.log"
timeout "$T_VAR" $PY benchmarks/ml/lloyd_variants.py "$OUTDIR" > "$OUTDIR/variants.log" 2>&1 || status=1
grep -E "^\S|  auto|sums\[" "$OUTDIR/variants.log" | grep -v "^  [0-9]e" | tail -40
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$T_NCU" != 0 ]; then
    for part in "kernel mpiml_distances_tc" "sums-simt mpiml_distances_sums_simt"; do
        set -- $part
        MPIML_KERNEL_LINEINFO=1 timeout "$T_NCU" "$NCU" --clock-control none -k regex:$2 --launch-skip 1 \
            --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
            $PY benchmarks/ml/ncu_parts.py 1e7 64 64 float32 "$1" > "$OUTDIR/ncu_$1.txt" 2>&1 || status=1
        echo "== ncu $1"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Warp" \
            "$OUTDIR/ncu_$1.txt" | head -8
    done
fi
exit $status

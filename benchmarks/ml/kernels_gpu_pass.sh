#!/usr/bin/env bash
# The kernel pass on one GPU, in the order that keeps the most if the time slot ends early:
# the tensor-core kernel tests, the kernel benchmark (+ whole fits), Nsight Compute on the Lloyd kernel
# of 10^7 x 64, k = 64, then the other kernel and k-means GPU tests (1-4 ranks sharing the GPUs).
# Usage (repository root, GPU host): benchmarks/ml/kernels_gpu_pass.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/ml/kernels_gpu_pass.sh OUTDIR}
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
T_TC=${T_TC:-80}; T_BENCH=${T_BENCH:-190}; T_NCU=${T_NCU:-40}; T_TESTS=${T_TESTS:-90}
XD=$($PY -c "import xdist" 2>/dev/null && echo "-n 12")
NCU_SHAPE=${NCU_SHAPE:-"1e7 64 64 float32 double tc"}
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUTDIR/gpu.txt"
timeout "$T_TC" $PY -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" $XD -x \
    -k "tc or pack or ties or non_contiguous or unaligned or empty or errors or in_place" 2>&1 | tail -30 \
    | tee "$OUTDIR/tests_tc.log" || status=1
timeout "$T_BENCH" $PY benchmarks/ml/kernels_bench.py "$OUTDIR" ${BENCH_ARGS:---quick} 2>&1 | tee "$OUTDIR/bench.log" || status=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$T_NCU" != 0 ]; then
    timeout "$T_NCU" "$NCU" --clock-control none -k regex:mpiml_distances_tc --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis $PY benchmarks/ml/ncu_lloyd.py $NCU_SHAPE \
        > "$OUTDIR/ncu_lloyd.txt" 2>&1 || status=1
    grep -E "Duration|Throughput|Registers|Achieved Occupancy|Stall|Issue Slots|Pipe|Bank" "$OUTDIR/ncu_lloyd.txt" | head -40
fi
timeout "$T_TESTS" $PY -m pytest tests/kernels tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider \
    -o addopts="" $XD 2>&1 | tail -40 | tee "$OUTDIR/tests.log" || status=1
exit $status

#!/usr/bin/env bash
# The kernel pass on one GPU: kernel + k-means GPU tests, the kernel benchmark, Nsight Compute on the
# Lloyd kernel.  Usage (repository root, GPU host): benchmarks/ml/kernels_gpu_pass.sh OUTDIR
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
T_TESTS=${T_TESTS:-110}; T_BENCH=${T_BENCH:-140}; T_NCU=${T_NCU:-60}
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUTDIR/gpu.txt"
timeout "$T_TESTS" $PY -m pytest tests/kernels tests/cluster/test_gpu_kmeans.py -q -p no:cacheprovider \
    -o addopts="" -n 12 2>&1 | tail -40 | tee "$OUTDIR/tests.log" || status=1
timeout "$T_BENCH" $PY benchmarks/ml/kernels_bench.py "$OUTDIR" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench.log" || status=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
    timeout "$T_NCU" "$NCU" --clock-control none -k regex:mpiml_distances_argmin --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis $PY benchmarks/ml/ncu_lloyd.py 1e7 64 64 float32 double \
        > "$OUTDIR/ncu_lloyd.txt" 2>&1 || status=1
    tail -60 "$OUTDIR/ncu_lloyd.txt"
fi
exit $status

#!/bin/bash
# One device call for the forests (issue 13): profiles (before / after), GPU tests, benchmarks.
# Run from a tree that holds src/ tests/ benchmarks/ (and old/src: the grower before the kernel) with
# $OUT set; everything lands under $OUT.  STAGES picks the steps and their order (default: all).
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
STAGES=${STAGES:-"profold prof profcmp tests b6 b7 b7all ncu"}
mkdir -p "$OUT/results"
NEW="$PWD/src:$PWD/tests"
nvidia-smi -L; python3 -c "import cupy, sklearn; print('cupy', cupy.__version__, 'sklearn', sklearn.__version__)"
stage_profold() {
  if [ -d old/src ]; then
  echo "== profile: the grower before the kernel (old/src), 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$PWD/old/src" timeout 120 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_before.json" 1e6 20 10
  fi
}
stage_prof() {
  echo "== profile: the grower with the kernel, 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_after.json" 1e6 20 10
}
stage_profcmp() {
  echo "== profile: partitioned rows, bincount histograms instead of the kernel (MPIML_RF_GPU_KERNEL=0)"
  MPIML_RF_GPU_KERNEL=0 PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py \
    "$OUT/results/rf_profile_after_bincount.json" 1e6 20 10
  echo "== profile: the kernel with every feature (sibling subtraction), max_features=None"
  PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_after_all_features.json" \
    1e6 20 10 none
}
stage_tests() {
  echo "== GPU tests (${TESTS_K:-all})"
  PYTHONPATH="$NEW" timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q tests/ensemble/test_gpu_forest.py \
    -p no:cacheprovider --timeout=180 -rs ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -40
}
stage_b6() {
  echo "== bench 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$NEW" timeout 150 python3 -m mpiml bench ml --algo rf --device gpu --ranks 1 --rows 1e6 --trees 20 \
    --depth 10 --sklearn-rows 2e5 --out "$OUT/results" --tag gpu_h200_1e6_20t_d10
}
stage_b7() {
  echo "== bench 1e7 x 32, ${B7_TREES:-100} trees, depth 12"
  PYTHONPATH="$NEW" timeout ${B7_TIMEOUT:-200} python3 -m mpiml bench ml --algo rf --device gpu --ranks 1 --rows 1e7 \
    --trees ${B7_TREES:-100} --depth 12 --sklearn-rows ${B7_SK:-1e5} --training global,local --out "$OUT/results" \
    --tag gpu_h200_1e7_${B7_TREES:-100}t_d12
}
stage_b7all() {
  echo "== bench 1e7 x 32, 20 trees, depth 12, every feature per node (sibling subtraction)"
  PYTHONPATH="$NEW" timeout ${B7ALL_TIMEOUT:-100} python3 -m mpiml bench ml --algo rf --device gpu --ranks 1 \
    --rows 1e7 --trees 20 --depth 12 --max-features none --sklearn-rows 5e4 --training global --out "$OUT/results" \
    --tag gpu_h200_1e7_20t_d12_all_features
}
stage_ncu() {
  if [ 1 ] && command -v ncu >/dev/null; then
  echo "== ncu: the histogram and partition kernels (1e6 x 32, 2 trees, depth 10)"
  PYTHONPATH="$NEW" timeout ${NCU_TIMEOUT:-60} ncu --kernel-name regex:mpiml_hist --launch-skip 20 --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    python3 benchmarks/ml/rf_profile.py /tmp/ncu_prof.json 1e6 2 10 2>&1 | grep -v "^==PROF==" | \
    grep -E "mpiml_hist|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|L1/TEX Hit|L2 Hit|Block Size|Grid Size|Dynamic Shared" | tee "$OUT/results/rf_ncu.txt"
  fi
}
for st in $STAGES; do "stage_$st"; done
ls -la "$OUT/results"

#!/bin/bash
# One device call for the forests (issue 13): profiles (before / after), GPU tests, benchmarks.
# Run from a tree that holds src/ tests/ benchmarks/ (and old/src: the grower before the kernel) with
# $OUT set; everything lands under $OUT.  STAGES picks steps (default all): prof tests b6 b7.
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
STAGES=${STAGES:-"prof tests b6 b7"}
mkdir -p "$OUT/results"
NEW="$PWD/src:$PWD/tests"
nvidia-smi -L; python3 -c "import cupy, sklearn; print('cupy', cupy.__version__, 'sklearn', sklearn.__version__)"
has() { [[ " $STAGES " == *" $1 "* ]]; }
if has prof && [ -d old/src ]; then
  echo "== profile: the grower before the kernel (old/src), 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$PWD/old/src" timeout 120 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_before.json" 1e6 20 10
fi
if has prof; then
  echo "== profile: the grower with the kernel, 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_after.json" 1e6 20 10
fi
if has prof; then
  echo "== profile: partitioned rows, bincount histograms instead of the kernel (MPIML_RF_GPU_KERNEL=0)"
  MPIML_RF_GPU_KERNEL=0 PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py \
    "$OUT/results/rf_profile_after_bincount.json" 1e6 20 10
  echo "== profile: the kernel with every feature (sibling subtraction), max_features=None"
  PYTHONPATH="$NEW" timeout 90 python3 benchmarks/ml/rf_profile.py "$OUT/results/rf_profile_after_all_features.json" \
    1e6 20 10 none
fi
if has tests; then
  echo "== GPU tests"
  PYTHONPATH="$NEW" timeout 200 python3 -m pytest -q tests/ensemble/test_gpu_forest.py -p no:cacheprovider \
    --timeout=180 -rs -x 2>&1 | tail -40
fi
if has b6; then
  echo "== bench 1e6 x 32, 20 trees, depth 10"
  PYTHONPATH="$NEW" timeout 150 python3 -m mpiml bench ml --algo rf --device gpu --ranks 1 --rows 1e6 --trees 20 \
    --depth 10 --sklearn-rows 2e5 --out "$OUT/results" --tag gpu_h200_1e6_20t_d10
fi
if has b7; then
  echo "== bench 1e7 x 32, ${B7_TREES:-100} trees, depth 12"
  PYTHONPATH="$NEW" timeout ${B7_TIMEOUT:-200} python3 -m mpiml bench ml --algo rf --device gpu --ranks 1 --rows 1e7 \
    --trees ${B7_TREES:-100} --depth 12 --sklearn-rows ${B7_SK:-1e5} --training global,local --out "$OUT/results" \
    --tag gpu_h200_1e7_${B7_TREES:-100}t_d12
fi
ls -la "$OUT/results"

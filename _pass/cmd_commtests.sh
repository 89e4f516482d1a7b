#!/usr/bin/env bash
# The GPU comm test group (tests/comm, -m gpu) in one device step, on the 4 x H100 host, from the repository root:
#   OUT=/some/dir bash _pass/cmd_commtests.sh
# Writes under $OUT/commtests/: pytest.log (the run, its durations, the launches' timeline at the end),
# jobs/<launch>.log (each mpirun launch's whole output), jobs/timeline.txt, gpu_before.txt / gpu_after.txt
# (nvidia-smi: what else ran on the GPUs), summary.txt.  At most ~265 s.
set -u
OUT=${OUT:-/tmp/device_pass_out}
D="$OUT/commtests"
mkdir -p "$D/jobs"

# the environment of scripts/device_pass.sh's preamble
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} MPIML_TIMEOUT=${MPIML_TIMEOUT:-120}
export MPIML_TEST_MPIEXEC=mpirun MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
    timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed \
        --prefix /tmp/pfx .whl/*.whl >"$D/wheels.log" 2>&1 && SITE=$(ls -d /tmp/pfx/lib/python3*/site-packages | head -1)
fi
export PYTHONPATH="$PWD/src:$PWD/tests${SITE:+:$SITE}"
# where the launches write their output and the timeline (tests/comm/_gpu_jobs.py)
export MPIML_TEST_JOBS_DIR="$D/jobs"

{ echo "commtests on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
  timeout 20 nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
  echo "compute processes:"; timeout 20 nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id --format=csv,noheader
} >"$D/gpu_before.txt" 2>&1

T0=$SECONDS
timeout -k 10 250 python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts= -rs --durations=15 --timeout=240 \
    tests/comm >"$D/pytest.log" 2>&1
RC=$?
T=$((SECONDS - T0))

{ echo "after the run, $(date -u +%FT%TZ)"
  timeout 20 nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
  echo "compute processes left:"; timeout 20 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  echo "python processes left:"; ps -eo pid,etimes,args | grep -E "gpu_(batch|timeout)|keep_survivors" | grep -v grep
} >"$D/gpu_after.txt" 2>&1

{ echo "pytest rc=$RC in ${T}s (limit 250 s; 124 = killed by timeout)"
  grep -E "^(FAILED|ERROR)|passed|failed|skipped|^GPU comm launches" "$D/pytest.log" | tail -40
  echo "--- timeline"; cat "$D/jobs/timeline.txt" 2>/dev/null
} >"$D/summary.txt"
cat "$D/summary.txt"

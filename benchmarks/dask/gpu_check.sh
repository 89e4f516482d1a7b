#!/usr/bin/env bash
# GPU part of the Dask benchmarks: CuPy end to end over mpi://, and CuPy (x + x.T).sum()
# over mpi:// and tcp://. Writes JSON to OUTDIR. About 2 minutes.
#
#   benchmarks/dask/gpu_check.sh OUTDIR
#
# MPIRUN (default: mpirun --allow-run-as-root -n 4 --bind-to none) must start 4 ranks:
# scheduler, client and two workers (one GPU each when there are several). Dask and
# distributed must be importable (e.g. wheels on PYTHONPATH); CuPy too. MPI need not be
# CUDA-aware: device frames are staged through pinned host memory unless
# MPIML_CUDA_AWARE_MPI=1.
set -euo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
MPIRUN=${MPIRUN:-"mpirun --allow-run-as-root -n 4 --bind-to none"}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export DASK_LOGGING__DISTRIBUTED=${DASK_LOGGING__DISTRIBUTED:-error}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ENVFLAGS=()
if $MPIRUN --version 2>/dev/null | grep -qi "open mpi\|open-rte\|prte"; then
  for v in PYTHONPATH DASK_LOGGING__DISTRIBUTED OMP_NUM_THREADS MPIML_CUDA_AWARE_MPI; do
    [ -n "${!v:-}" ] && ENVFLAGS+=(-x "$v")
  done
fi
run() { timeout 150 $MPIRUN "${ENVFLAGS[@]}" "$PY" benchmarks/dask/gpu_rank.py "$@"; }

{
  echo "date: $(date -Is)"; echo "host: $(hostname)"; echo "mpirun: $MPIRUN"
  $MPIRUN --version 2>&1 | head -1 || true
  nvidia-smi -L 2>&1 || true
  "$PY" -c "import cupy, dask, distributed; print('cupy', cupy.__version__, 'dask', dask.__version__, 'distributed', distributed.__version__)" || true
} > "$OUT/dask_gpu_env.txt" 2>&1

status=0
run --protocol mpi benchmarks/dask/gpu_e2e.py "$OUT/dask_gpu_e2e.json" > "$OUT/dask_gpu_e2e.log" 2>&1 || status=$?
echo "e2e over mpi://: exit $status (log: $OUT/dask_gpu_e2e.log)"

for p in mpi tcp; do
  run --protocol "$p" benchmarks/dask/bench_apps.py --device gpu -n 8000 --chunk 2000 --repeat 5 \
      --out "$OUT/dask_gpu_apps_$p.json" > "$OUT/dask_gpu_apps_$p.log" 2>&1 || status=$?
  echo "cupy (x + x.T).sum() over $p://: $(tail -c 300 "$OUT/dask_gpu_apps_$p.json" 2>/dev/null || echo failed)"
done

"$PY" - "$OUT" "$MPIRUN" <<'PYEOF'
import json, os, platform, sys, time
out, mpirun = sys.argv[1], sys.argv[2]
runs = {}
for p in ("mpi", "tcp"):
    path = os.path.join(out, f"dask_gpu_apps_{p}.json")
    if os.path.exists(path):
        runs[p] = json.load(open(path))
report = {"benchmark": "CuPy (x + x.T).sum() over mpi:// and tcp:// (python -m mpiml.dask)",
          "machine": {"hostname": platform.node(), "cpu_count": os.cpu_count()},
          "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "command": f"benchmarks/dask/gpu_check.sh {out}  (MPIRUN={mpirun})",
          "runs": list(runs.values())}
if len(runs) == 2:
    m, t = (runs[p]["apps"]["sum_transpose"]["seconds"] for p in ("mpi", "tcp"))
    report["tcp_seconds_over_mpi_seconds"] = t / m
json.dump(report, open(os.path.join(out, "dask_gpu_apps.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
PYEOF
exit $status

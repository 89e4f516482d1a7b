#!/usr/bin/env bash
# Ranks beyond the cores (issue 32), on 2 quiet cores of the GPU host (taskset -c 0,1, CPU only), repository root:
#   OUT=/some/dir bash _pass/cmd_ranksfix.sh
# Writes $OUT/ranksfix/: {A,B}_{a,b}.log and their ml_cpu_*.json, summary.txt.  A: MPIML_BIND=none (the placement
# before: unbound ranks never pinned); B: the default (4 ranks on 2 cores pinned round robin, two a core).  One
# round each, a then b, under 4 minutes in all (each step timeout 55 s).
set -u
OUT=${OUT:-/tmp/device_pass_out}
D="$OUT/ranksfix"
mkdir -p "$D"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS MPIML_BIND
S="$D/summary.txt"
echo "ranksfix on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)" >"$S"
A_ARGS="--rows 4e5 --features 64 --estimators kmeans,logreg,pca,linreg"
B_ARGS="--features 32 --rf-rows 1e5 --max-depth 0 --estimators rf"
for set in a b; do
  ARGS=$A_ARGS; [ $set = b ] && ARGS=$B_ARGS
  for v in A B; do
    E=""; [ $v = A ] && E="MPIML_BIND=none"
    timeout -k 5 55 env $E taskset -c 0,1 python3 -m mpiml bench ml --device cpu --ranks 1,2,3,4 $ARGS --repeat 3 \
      --no-sklearn --no-sklearnex --out "$D/${v}_$set" --tag $set >"$D/${v}_$set.log" 2>&1
    echo "== $v ($set, rc $?)" >>"$S"
    grep "^[A-Za-z]* |" "$D/${v}_$set.log" >>"$S"
  done
done
cat "$S"

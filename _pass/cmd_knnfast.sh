#!/usr/bin/env bash
# NearestNeighbors on 2 quiet cores (taskset -c 0,1) of the GPU host: the shape, 1-4 ranks and
# scikit-learn-intelex, rounds alternating before (f5fe97c, when git can export it) and after (this tree).
# Run from the repository root; writes under $OUT/knnfast/; about 3 minutes.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 MPIML_TIMEOUT=60
export PYTHONUNBUFFERED=1
unset OMP_NUM_THREADS
O=$OUT/knnfast; mkdir -p $O; S=$O/summary.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $S; git log --oneline -1 >> $S 2>/dev/null
B=$O/before; mkdir -p $B
(git archive f5fe97c src 2>/dev/null | tar -x -C $B) || rm -rf $B
C="--device cpu --estimators knn --features 32 --knn-rows 1e5 --ranks 1,2,3,4 --repeat 5 --no-sklearn"
T0=$(date +%s)
for r in 1 2 3; do
  [ $(( $(date +%s) - T0 )) -gt 150 ] && break   # (the first round compiles both trees' kernels)
  if [ -d $B/src ]; then
    (cd $B && PYTHONPATH=src timeout 70 taskset -c 0,1 python3 -m mpiml bench ml $C --out $O --tag before$r \
      > $O/before$r.log 2>&1); echo "before$r rc=$?" >> $S; grep "^NearestNeighbors" $O/before$r.log >> $S
  fi
  PYTHONPATH=src timeout 70 taskset -c 0,1 python3 -m mpiml bench ml $C --out $O --tag after$r > $O/after$r.log 2>&1
  echo "after$r rc=$?" >> $S; grep "^NearestNeighbors" $O/after$r.log >> $S
done
cat $S

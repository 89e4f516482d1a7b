#!/usr/bin/env bash
# The exit of the 2-rank reduce_scatter sweep (issue 34: an exit must never hang), on the GPU host, repository root:
#   OUT=/some/dir bash _pass/cmd_rshang.sh
# Everything goes into ONE file, $OUT/rshang.tgz (rshang/: summary.txt, a_repro.log, b_vs_nccl.log, b_X.json,
# c_diag.log).  At most ~90 s:
#   (a) tests/comm/gpu_rs_exit.py at 2 ranks (GPUs 0,1), timeout 40: the benchmark's reduce_scatter calls with the
#       H200 table's 2-rank rules from an explicit MPIML_TUNING_FILE; must end within a few s of "rs_exit done";
#   (b) the command that never exited on 2 x H200, exactly, with MPIML_TUNING_FILE=a copy of that table
#       (tests/comm/rs_exit_h200_table.json) and MPIML_TIMEOUT=10, timeout 45;
#   (c) if time is left: (b) again with mpiml's ordered release at exit off (MPIML_EXIT_RELEASE=0, the state before
#       the fix; the exit bound on, MPIML_EXIT_TIMEOUT=15) and NCCL's INIT/DESTROY log: the order in which each rank
#       destroys its two NCCL communicators, and whether the exit then waits (ends in faulthandler's "Timeout").
set -u
OUT=${OUT:-/tmp/device_pass_out}
D="$OUT/rshang"
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export PYTHONPATH="$PWD/src:$PWD/tests" CUDA_VISIBLE_DEVICES=0,1 MPIML_TIMEOUT=10
cp tests/comm/rs_exit_h200_table.json "$D/table.json"
RUN="mpirun --allow-run-as-root --bind-to none --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x CUDA_VISIBLE_DEVICES \
-x MPIML_TIMEOUT -x PYTHONUNBUFFERED"
SIZES=4,1024,16384,65536,262144,524288,786432,1048576,2097152,3145728,4194304,8388608,16777216,67108864,268435456
S="$D/summary.txt"
echo "rshang on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)" >"$S"

now() { date +%s.%N; }
since_done() {  # seconds from the last "... done at T" line of log $1 (pattern $2) to time $3
    python3 - "$1" "$2" "$3" <<'PY'
import sys
log, pat, end = sys.argv[1], sys.argv[2], float(sys.argv[3])
ts = [float(l.split()[-1]) for l in open(log, errors="replace") if l.startswith(pat)]
print(f"{end - max(ts):.1f} s after the last '{pat}'" if ts else f"no '{pat}' line")
PY
}

# (a) the repro on this code
T0=$SECONDS; t0=$(now)
MPIML_EXIT_VERBOSE=1 timeout -k 2 40 $RUN -x MPIML_EXIT_VERBOSE -n 2 python3 tests/comm/gpu_rs_exit.py >"$D/a_repro.log" 2>&1
RC=$?; t1=$(now)
echo "(a) gpu_rs_exit.py, 2 ranks: rc=$RC in $((SECONDS - T0)) s (124/137: killed by timeout 40); exit ended $(since_done "$D/a_repro.log" "rs_exit done at" "$t1")" >>"$S"
grep -E "^mpiml:|Timeout|rs_exit (done|hooks)" "$D/a_repro.log" | head -12 >>"$S"

# (b) the benchmark command, exactly
T0=$SECONDS
MPIML_TUNING_FILE="$D/table.json" timeout -k 2 45 $RUN -x MPIML_TUNING_FILE -n 2 python3 benchmarks/gpu/vs_nccl.py \
    --ops reduce_scatter --sizes $SIZES --paths raw,auto,auto0 --rounds 3 --no-micro --out "$D/b_X.json" \
    >"$D/b_vs_nccl.log" 2>&1
RC=$?
echo "(b) vs_nccl.py --ops reduce_scatter (MPIML_TUNING_FILE=the 2-rank table, MPIML_TIMEOUT=10): rc=$RC in $((SECONDS - T0)) s (124/137: killed by timeout 45)" >>"$S"
grep -E "^wrote|^mpiml:|Timeout" "$D/b_vs_nccl.log" | head -8 >>"$S"

# (c) diagnosis, with what time is left: the release off, NCCL's log of inits and destroys
LEFT=$((87 - SECONDS))
if [ "$LEFT" -ge 20 ]; then
    T0=$SECONDS
    MPIML_TUNING_FILE="$D/table.json" MPIML_EXIT_RELEASE=0 MPIML_EXIT_TIMEOUT=15 NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=INIT,DESTROY timeout -k 1 "$LEFT" $RUN -x MPIML_TUNING_FILE -x MPIML_EXIT_RELEASE \
        -x MPIML_EXIT_TIMEOUT -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -n 2 python3 benchmarks/gpu/vs_nccl.py \
        --ops reduce_scatter --sizes $SIZES --paths raw,auto,auto0 --rounds 3 --no-micro --out "$D/c_X.json" \
        >"$D/c_diag.log" 2>&1
    RC=$?
    echo "(c) (b) with MPIML_EXIT_RELEASE=0 MPIML_EXIT_TIMEOUT=15: rc=$RC in $((SECONDS - T0)) s (limit $LEFT s)" >>"$S"
    grep -E "Init COMPLETE|Destroy COMPLETE|Abort COMPLETE|^wrote|Timeout" "$D/c_diag.log" | cut -c1-200 | head -16 >>"$S"
else
    echo "(c) skipped: $LEFT s left" >>"$S"
fi
cat "$S"
tar -C "$OUT" -czf "$OUT/rshang.tgz" rshang && rm -rf "$D"

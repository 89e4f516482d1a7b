#!/usr/bin/env bash
# The push reduce / allgather (ipc/llpush, src/mpiml/kernels/comm/small_push.cu) on the GPU host (4 x H100):
# correctness at 4 and 3 ranks, then against raw NCCL and ipc/ll at 4 B-256 KiB with every knob, then an nsys trace
# of one rank. Run from the repository root with $OUT set; everything goes to $OUT/smallcoll/ (~150 s in all:
# BUDGET seconds, default 150; a step that would start past it is skipped and says so).
#
#   bash _pass/cmd_smallcoll.sh
#
# Kernels: small_push.cu is a family of its own (ipc._push_kernel loads it through kernels/_loader.py): no shipped
# cubin holds it (their key is the source hash), so its first use compiles it with NVRTC (~2-5 s a dtype, once per
# machine: later steps load it from ~/.cache/mpiml/kernels); every other kernel's source is unchanged, so the shipped
# cubins serve them as before. MPIML_KERNEL_RECORD lists how each module was served (kernels.jsonl: "compiled" then
# "cache" for the push family, "prebuilt" for the rest; "fallback" would be CuPy compiling the same source itself).
# Nothing stale can be taken: a cubin is found by the hash of the source text it was compiled from.
#
# Output ($OUT/smallcoll/):
#   log.txt          every step's command, output, status and time; the summary at the end
#   vs_small.json    vs_nccl.py rows (graph and eager, us a call, max over ranks), the variants' names in "path":
#                    ipc/llpush (defaults: 4 KiB a block, no split, acks at the start, plain launches) and
#                    ipc/llpush@KNOB=V: ENDACK=1 (the acks at the end too: what moving them saved), SPLIT_BYTES
#                    (allgather parts from that size split by peer over three times the blocks), BLOCK_BYTES
#                    (payload a block: 1024 = four times the blocks, 16384 = a quarter), PDL=1 (programmatic
#                    dependent launch of the hot launches: a graph's kernel-to-kernel gap overlapped), DEPTH=4/8
#                    (a ring of slots of their own that many calls deep: a reduce's non-roots run further ahead)
#   vs_bcast.json    the LL bcast and allreduce of the same run (the one-hop reference: 2.6-2.9 / 3.7 us before)
#   table.txt        the graph and eager times per op / size / path and their ratio to raw NCCL
#   kernels.jsonl    how every kernel module was served (compiled / cache / prebuilt)
#   nsys_r0.*        rank 0's trace of ipc/ll against ipc/llpush in graphs, and kern_gaps.txt: each kernel's median
#                    duration and the median gap before it, from that trace
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4 MPIML_TIMEOUT=20
export PYTHONPATH="$PWD/src:$PWD/tests"
RES="${OUT:-/tmp/smallcoll_out}/smallcoll"
mkdir -p "$RES"
export MPIML_KERNEL_RECORD="$RES/kernels.jsonl"
LOG="$RES/log.txt"
BUDGET=${BUDGET:-150}
T0=$SECONDS
SUMMARY=()
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe -x PYTHONPATH -x OMP_NUM_THREADS -x MPIML_TIMEOUT
 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x MPIML_KERNEL_RECORD
 -x PYTHONUNBUFFERED"

step() {  # step NAME SECONDS COMMAND...: its own limit (cut to what is left of BUDGET), output to the log
    local name=$1 secs=$2; shift 2
    if [ $((SECONDS - T0 + 10)) -gt "$BUDGET" ]; then SUMMARY+=("$name: skipped (budget)"); return; fi
    local left=$((BUDGET - (SECONDS - T0)))
    [ "$secs" -gt "$left" ] && secs=$left
    echo "=== [$name] (limit ${secs}s, at $((SECONDS - T0))s): $*" >>"$LOG"
    local t0=$SECONDS
    timeout -k 5 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" >>"$LOG"
}

SIZES=4,1024,16384,65536,262144
V=ipc/llpush@MPIML_IPC_LLPUSH_ENDACK=1
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_SPLIT_BYTES=4096
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_BLOCK_BYTES=1024
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_BLOCK_BYTES=1024+MPIML_IPC_LLPUSH_SPLIT_BYTES=1024
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_BLOCK_BYTES=16384
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_PDL=1
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_PDL=1+MPIML_IPC_LLPUSH_BLOCK_BYTES=1024+MPIML_IPC_LLPUSH_SPLIT_BYTES=1024
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_DEPTH=4
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_DEPTH=8
V=$V,ipc/llpush@MPIML_IPC_LLPUSH_DEPTH=4+MPIML_IPC_LLPUSH_PDL=1

nvidia-smi -L >>"$LOG" 2>&1
# (a) correctness at 4 ranks (compiles the push family for the dtypes it meets), then the timings, then 3 ranks
step "push kernels correct, 4 ranks (--quick)" 75 $MPIRUN -n 4 python3 tests/comm/gpu_small_push.py --quick
step "vs raw NCCL: reduce, allgather, 4 ranks" 60 $MPIRUN -n 4 python3 benchmarks/gpu/vs_nccl.py \
    --ops reduce,allgather --sizes $SIZES --paths raw,auto,ipc/ll,ipc/llpush --variants "$V" \
    --modes eager,graph --rounds 3 --no-micro --out "$RES/vs_small.json"
step "push kernels correct, 3 ranks (--quick)" 40 $MPIRUN -n 3 python3 tests/comm/gpu_small_push.py --quick
step "reference: LL bcast and allreduce, 4 ranks" 25 $MPIRUN -n 4 python3 benchmarks/gpu/vs_nccl.py \
    --ops bcast,allreduce --sizes 4,1024,65536 --paths raw,ipc/ll --modes graph --rounds 3 --no-micro \
    --out "$RES/vs_bcast.json"

python3 - "$RES" >"$RES/table.txt" 2>&1 <<'EOF'
import json, os, sys
res = sys.argv[1]
for name in ("vs_small.json", "vs_bcast.json"):
    path = os.path.join(res, name)
    if not os.path.exists(path):
        print(f"{name}: missing")
        continue
    rows = json.load(open(path))["rows"]
    raw = {(r["op"], r["mode"], r["bytes"]): r["us"] for r in rows if r["path"] == "raw"}
    print(f"# {name}: us a call (max over ranks), ratio to raw NCCL")
    for mode in ("graph", "eager"):
        for r in rows:
            if r["mode"] == mode:
                base = raw.get((r["op"], mode, r["bytes"]))
                ratio = r["us"] / base if base else float("nan")
                path = r["path"].replace("MPIML_IPC_LLPUSH_", "")
                print(f"{mode:5s} {r['op']:9s} {r['bytes']:>7d} {path:55s} {r['us']:7.2f} {ratio:5.2f}"
                      + (f"  ERROR {r['error']}" if "error" in r else ""))
EOF
cat "$RES/table.txt" >>"$LOG"

# (c) rank 0 under nsys: the kernels' durations against the gaps between them in graphs (ipc/ll and ipc/llpush)
if command -v nsys >/dev/null 2>&1; then
    cat >"$RES/nsys_rank.sh" <<EOF
a="benchmarks/gpu/vs_nccl.py --ops reduce,allgather --sizes 4,65536 --paths ipc/ll,ipc/llpush --modes graph"
a="\$a --rounds 1 --no-micro --out $RES/vs_nsys.json"
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 0 ]; then
    exec nsys profile --cuda-graph-trace=node -t cuda --force-overwrite true -o $RES/nsys_r0 python3 \$a
else
    exec python3 \$a
fi
EOF
    step "nsys: rank 0, graphs, ipc/ll vs ipc/llpush" 45 $MPIRUN -n 4 bash "$RES/nsys_rank.sh"
    step "nsys stats" 25 nsys stats -q --report cuda_gpu_trace --format csv --force-export=true \
        -o "$RES/nsys_r0" "$RES/nsys_r0.nsys-rep"
    python3 - "$RES" >"$RES/kern_gaps.txt" 2>&1 <<'EOF'
import csv, glob, statistics, sys
res = sys.argv[1]
files = glob.glob(f"{res}/nsys_r0*cuda_gpu_trace*.csv")
if not files:
    sys.exit("no cuda_gpu_trace CSV")
rows = list(csv.DictReader(open(files[0])))
start = next(k for k in rows[0] if k.startswith("Start"))
dur = next(k for k in rows[0] if k.startswith("Duration"))
kern = [(int(float(r[start])), int(float(r[dur])), r["Name"]) for r in rows if "mpiml_" in r.get("Name", "")]
kern.sort()
by = {}
for (s0, d0, n0), (s1, d1, n1) in zip(kern, kern[1:]):
    if n0 == n1:  # back to back, the same kernel: a graph's replay
        by.setdefault(n1.split("(")[0][:90], []).append((d1, s1 - (s0 + d0)))
print("kernel (median duration / median gap before it, ns; calls)")
for name, v in sorted(by.items()):
    print(f"{name:90s} {statistics.median(d for d, _ in v):8.0f} {statistics.median(g for _, g in v):8.0f} {len(v):6d}")
EOF
    cat "$RES/kern_gaps.txt" >>"$LOG"
else
    SUMMARY+=("nsys: not on this host")
fi

{ echo "=== summary ($((SECONDS - T0)) s)"; printf '%s\n' "${SUMMARY[@]}"; } | tee -a "$LOG"

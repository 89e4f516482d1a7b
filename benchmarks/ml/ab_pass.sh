#!/usr/bin/env bash
# A/B of two source trees at the estimator's level, alternating in one device session (the estimator's
# iteration depends on the host as much as the GPU, so only runs of one session compare):
#   benchmarks/ml/ab_pass.sh OUTDIR OLD_SRC NEW_SRC ROUNDS -- ARGS of `mpiml bench ml`
# runs `mpiml bench ml ARGS --no-heat --no-sklearn` with PYTHONPATH=OLD_SRC, then NEW_SRC, ROUNDS times, and
# merges every shape run into OUTDIR/ab.json (each tagged with its source and round; machine, date, command).
# OLD_SRC is e.g. the previous commit's src/, unpacked by `git archive HEAD~1 src | tar -x -C .ab/old`.
set -uo pipefail
OUTDIR=${1:?usage: ab_pass.sh OUTDIR OLD_SRC NEW_SRC ROUNDS -- ARGS}
OLD=$(realpath "$2") NEW=$(realpath "$3") ROUNDS=$4
shift 4
[ "${1:-}" = "--" ] && shift
mkdir -p "$OUTDIR"
. scripts/_device_env.sh
TMP=$(mktemp -d)
status=0
for r in $(seq 1 "$ROUNDS"); do
    for v in old new; do
        src=$OLD; [ $v = new ] && src=$NEW
        echo "== round $r, $v ($src)"
        PYTHONPATH="$src:$PWD/tests" timeout "${T_RUN:-120}" $PY -m mpiml bench ml "$@" --no-heat --no-sklearn \
            --out "$TMP/$v$r" --tag ab 2>&1 | grep -v -i warn || status=1
    done
done
$PY - "$TMP" "$OUTDIR/ab.json" "$ROUNDS" "$*" <<'EOF'
import glob, json, os, sys
tmp, out, rounds, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
merged = {"what": "mpiml bench ml, two source trees alternating in one device session",
          "command": f"benchmarks/ml/ab_pass.sh OUT OLD_SRC NEW_SRC {rounds} -- {args}", "runs": []}
for r in range(1, rounds + 1):
    for v in ("old", "new"):
        for f in glob.glob(os.path.join(tmp, f"{v}{r}", "*.json")):
            res = json.load(open(f))
            for key in ("machine", "date", "rates"):
                merged.setdefault(key, res.get(key))
            merged["runs"] += [dict(run, source=v, round=r) for run in res.get("shape_runs", [])]
json.dump(merged, open(out, "w"), indent=1)
print(f"{'shape':>16} {'source':>6} {'round':>5} {'ms/iter':>9} {'x floor':>8}")
for run in merged["runs"]:
    print(f"{run['n']:.0e}x{run['d']}x{run['k']:<5} {run['source']:>6} {run['round']:>5} "
          f"{run['iter_ms']:9.3f} {run['ratio_to_floor']:8.2f}")
EOF
rm -rf "$TMP"
exit $status

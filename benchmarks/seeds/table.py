"""The table of benchmarks/seeds/README.md, built from the runs in benchmarks/seeds/results/.

    python benchmarks/seeds/table.py            # print the table
    python benchmarks/seeds/table.py --write    # put it into README.md (between the table markers)
    python benchmarks/seeds/table.py --check    # exit 1 if README.md's table is not the one the runs give

One row per document: the document's figure, ours at 1, 2 and 4 GPUs (each cell our figure, its
ratio to the document's and the file it comes from), the peer measured in the same run, why ours
differs where it is worse, and the one command that reruns the row.  A cell takes the newest GPU
run of that document at that GPU count on each machine kind (the date in the JSON: a 4 x H200 run
stands beside a 4 x H100 one); runs on CPU ranks (``*_vm.json``, the harness) are not in the table.
Files are named as ``scripts/device_pass.sh seeds seeds_ranks`` writes them: ``seed000_n4_4xh100.json``, ``seed000_fig1_n4_4xh100.json`` (``benchmarks/gpu/vs_nccl.py``),
``seed000_hpo_n4_4xh100.json`` (``benchmarks/dask/hpo_higgs.py``), ``seed001_4xh100.json`` (every worker
count in one file), ``seed002_n2_4xh100.json``, ...  A run that measured nothing (every part failed, or
the file is unreadable) still gets its cell, saying so and why, rather than "not yet measured".
"""

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
BEGIN = "<!-- table.py: begin (python benchmarks/seeds/table.py --write) -->"
END = "<!-- table.py: end -->"
GPUS = (1, 2, 4)
_NAME = re.compile(r"^seed(\d{3})(?:_(fig1|hpo))?(?:_n(\d+))?_([0-9a-z]+)\.json$")

#: The document's figure and experiment per seed (what the row compares against).
DOCUMENT = {
    "000": ("Fig. 1: allreduce / reduce / bcast latency 4 B-16 KiB against NCCL; Fig. 10: fit time with "
            "every collective forced onto NCCL against the MPI communicator, 1 to N GPUs; Listing 2: Hyperband "
            "search over k-means on the Higgs set",
            "MVAPICH2-GDR 84 / 74 / 85 % lower latency than NCCL (6.3x / 3.8x / 6.7x; 8 GPUs, 2 nodes); fits "
            "1.6x (k-means), 1.25x (k-NN, LinearRegression), 1.36x (TruncatedSVD) faster than on NCCL "
            "(up to 32 GPUs); the search keeps its accuracy at scale (no number given)"),
    "001": ("Dask `mpi://` against the peer: latency at 1 B, throughput from 2 MB (2 GPUs); CuPy "
            "`(x + x.T).sum()` and `x.sum()`, one GPU per worker",
            "against UCX: 6x lower latency at 1 B, 4x throughput from 2 MB; `(x + x.T).sum()` 3.47x faster "
            "(V100, 1-6 workers; 1.71x on Frontera); cuDF merge 3.11x (not run: no cuDF here)"),
    "002": ("bcast 4 B-256 MiB on every path (IPC, pipelined, two-level, auto) against NCCL; all-to-all bcast "
            "(every rank a root in turn) 4 KiB-2 MiB; streaming bcast of AlexNet and VGG-16 parameters",
            "GPU-to-GPU bcast gains 4 KB-2 MB; all-to-all bcast up to 68 % lower latency than MVAPICH2-GDR's "
            "ring / k-nomial (time ratio 0.32); CNTK AlexNet / VGG training up to 24 % shorter (0.76), 16 GPUs"),
    "003": ("k-NN ring (k = 5): blocking vs overlapped vs one-sided three-slot buffer; KDD-XS (10^5 x "
            "20,216,830, 36 values a row), KDD at 1/8 of its 8.4 M rows, dense 36 features",
            "time saved against blocking: KDD-XS 5.9 % (overlap) / 27.6 % (one-sided), 256 cores; KDD 2.7 % / "
            "9.0 %, 512 cores"),
    "004": ("reduce / allreduce / scan: every design by size against its cost model; the device path "
            "(`auto`) against MPI's own (`native`)",
            "GPU-kernel allreduce 1.7x (32 GPUs) / 1.8x (96 GPUs) faster than the host reduction; the cost "
            "models predict which design wins"),
}
PEER = {
    "000": "raw NCCL through CuPy (Fig. 1); the same fit with `MPIML_COMM_ALGO` forcing `nccl/native` (Fig. 10); "
           "HPO: the best model against its SPMD refit on every GPU",
    "001": "`tcp://` (UCX-Py is not on our hosts)",
    "002": "raw NCCL through CuPy (`NcclCommunicator.bcast`), same buffers",
    "003": "`exchange=\"blocking\"` (the document's baseline design)",
    "004": "`native`: MPI's own collective (on GPUs: staged through the host, Open MPI is not CUDA-aware)",
}
#: Why ours differs from the document where it is worse (shown when a measured cell is).
WHY = {
    "000": "one node on NVLink, where NCCL is at its best, against the document's two nodes over InfiniBand, "
           "where MVAPICH2-GDR beat NCCL; our fits send few small collectives (Fig. 11), so the path "
           "matters little to the fit",
    "001": "the document's peer is UCX over InfiniBand between nodes, ours `tcp://` on one host; where the "
           "scheduler keeps a block next to its transpose little moves and both protocols measure Dask's "
           "scheduling",
    "002": "our peer is NCCL on NVLink, not MVAPICH2-GDR's ring / k-nomial over InfiniBand; one node, so no "
           "multicast (the document's inter-node scheme); `two_level` runs on virtual nodes of 2 GPUs",
    "003": "NVLink moves a block in a small part of its search time, so the ring has 2-3 % of communication "
           "to hide (the run measures the share); the document's ring crossed QDR InfiniBand between CPU "
           "nodes; `onesided` is MPI RMA on host memory, so device blocks go through the host",
    "004": "the designs run through MPI, which stages device buffers through the host here; the "
           "document's designs ran over InfiniBand between GPU nodes",
}
NOT_APPLICABLE = {
    ("002", 1): "n/a: one GPU has nothing to send",
    ("003", 1): "n/a: one GPU has no ring",
    ("004", 1): "n/a: the model needs a ping-pong of 2 ranks",
}
COMMAND = {
    "000": "mpirun -n 4 python benchmarks/gpu/vs_nccl.py --sizes 4,16,64,256,1024,4096,16384 --ops "
           "allreduce,reduce,bcast --modes eager --rounds 2 --out seed000_fig1_n4.json && mpirun -n 4 python "
           "benchmarks/seeds/seed000_estimators.py --device gpu --json seed000_n4.json --plot seed000_n4.png && "
           "mpirun -n 6 python benchmarks/dask/gpu_rank.py --protocol mpi benchmarks/dask/hpo_higgs.py --device gpu "
           "--n-samples 11000000 --out seed000_hpo_n4.json",
    "001": "python benchmarks/seeds/seed001_dask.py --device gpu --workers 1,2,4 --json seed001.json "
           "--plot seed001.png",
    "002": "mpirun -n 4 python benchmarks/seeds/seed002_bcast.py --device gpu --json seed002_n4.json "
           "--plot seed002_n4.png",
    "003": "mpirun -n 4 python benchmarks/seeds/seed003_knn.py --device gpu --json seed003_n4.json "
           "--plot seed003_n4.png",
    "004": "mpirun -n 4 python benchmarks/seeds/seed004_reductions.py --device gpu --rounds 3 --json "
           "seed004_n4.json --plot seed004_n4.png",
}
FIG1_DOC = {"allreduce": 1 / (1 - 0.84), "reduce": 1 / (1 - 0.74), "bcast": 1 / (1 - 0.85)}


def _f(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _ratio(a, b):
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def _machine(tag):
    m = re.match(r"(\d+)x([a-z]+\d*)", tag)
    return f"{m.group(1)} x {m.group(2).upper()}" if m else tag


class Cell:
    """Our figure at one GPU count: ``text``, ``vs_document`` (above 1: as good as the document's or
    better; None: not comparable), the file and its date."""

    def __init__(self, text, vs_document, name, date):
        self.text, self.vs_document, self.name, self.date = text, vs_document, name, date

    @property
    def worse(self):
        return self.vs_document is not None and self.vs_document < 1


# ---------------------------------------------------------------------- per document: a run -> our figure
def fig1(doc):
    """vs_nccl.py at 4 B-16 KiB, eager: raw NCCL's time over auto's, median over the sizes, per op."""
    t = {}
    for r in doc.get("rows", []):
        if r.get("mode", "eager") == "eager" and r["bytes"] <= 16384 and r["path"] in ("raw", "auto"):
            t.setdefault(r["op"], {}).setdefault(r["bytes"], {})[r["path"]] = r["us"]
    speed = {op: statistics.median(v["raw"] / v["auto"] for v in by.values() if "raw" in v and "auto" in v)
             for op, by in t.items() if op in FIG1_DOC and any("raw" in v and "auto" in v for v in by.values())}
    if not speed:
        return None
    vs = {op: s / FIG1_DOC[op] for op, s in speed.items()}
    text = "Fig. 1, raw NCCL / auto, 4 B-16 KiB (median): " + ", ".join(f"{op} {_f(s)}x" for op, s in speed.items())
    return text, min(vs.values())


def fig10(doc):
    est = (doc.get("summary") or {}).get("estimators") or {}
    if not est:
        return None
    if all(v.get("forced_over_auto") is None for v in est.values()):  # one GPU: no collective, nothing forced
        text = ("Fig. 10 at 1 GPU, fit s: " + ", ".join(f"{a} {_f(v.get('auto_s'), '.3g')}" for a, v in est.items())
                + " (no collective on one GPU: Fig. 1 and the forced fits do not apply)")
    else:
        text = "Fig. 10, forced NCCL / auto fit (auto's s): " + ", ".join(
            f"{a} {_f(v['forced_over_auto'])}x ({_f(v.get('auto_s'), '.3g')})" for a, v in est.items())
    failed = [a for a, r in (doc.get("results") or {}).items() if "error" in r]
    if failed:
        text += f" ({', '.join(failed)} failed: the error is in the JSON)"
    vs = [v["vs_document"] for v in est.values() if v.get("vs_document")]
    return text, (min(vs) if vs else None)


def hpo(doc):
    """benchmarks/dask/hpo_higgs.py: the document's Listing 2 (no figure to compare: accuracy is kept at scale)."""
    acc = doc.get("purity_accuracy") or {}
    if "search_seconds" not in doc:
        return None
    text = (f"HPO (Listing 2): Hyperband over KMeans, {doc.get('n_samples', 0):.3g} Higgs-shaped rows x 28, "
            f"{doc.get('n_workers')} GPU workers: {doc.get('n_models')} models, {doc.get('partial_fit_calls')} "
            f"partial_fit calls in {_f(doc.get('search_seconds'), '.1f')} s; cluster-purity accuracy "
            f"{_f(acc.get('hyperband_best'), '.3f')} (best model) / {_f(acc.get('spmd_refit'), '.3f')} (its SPMD refit "
            f"on every GPU, {_f(doc.get('refit_seconds'), '.2f')} s), majority class "
            f"{_f(doc.get('majority_class_rate'), '.3f')}")
    return text, None


def seed001(doc, workers):
    s = doc.get("summary") or {}
    apps = {a["app"]: a for a in s.get("apps", []) if a["workers"] == workers}
    if not apps:
        return None
    parts, vs = [], []
    st, rows, sm = apps.get("sum_transpose"), apps.get("sum_transpose_rows"), apps.get("sum")
    parts.append(f"`(x + x.T).sum()` tcp / mpi {_f(rows and rows['tcp_over_mpi'])}x (blocks by rows), "
                 f"{_f(st and st['tcp_over_mpi'])}x (the scheduler's placement); `x.sum()` "
                 f"{_f(sm and sm['tcp_over_mpi'])}x")
    if rows and rows.get("vs_document"):
        vs.append(rows["vs_document"])
    if any(a.get("separate_gpus") is False for a in apps.values()):
        parts.append("the workers shared GPUs (CUDA_VISIBLE_DEVICES was set for them)")
    c = s.get("comm") or {}
    if workers == 2 and c:
        parts.append(f"comm, 2 ranks: latency at 1 B {_f(c.get('latency_1B_speedup'))}x, throughput from 2 MB "
                     f"{_f(c.get('throughput_2MB_up_speedup_median'))}x (median)")
        vs += [v for v in (c.get("latency_vs_document"), c.get("throughput_vs_document")) if v]
    elif workers == 2 and "error" in (doc.get("comm") or {}):
        parts.append("the comm sweep failed (its error is in the JSON)")
    return "; ".join(parts), (min(vs) if vs else None)


def seed002(doc):
    s = doc.get("summary")
    if not s:
        return None
    models = " / ".join(f"{_f(v['auto_over_peer'])}" for v in s.get("models", {}).values())
    fused = " / ".join(f"{_f(_ratio(v.get('fused_auto_ms'), v.get('fused_peer_ms')))}"
                       for v in s.get("models", {}).values())
    a2a = s.get("alltoall_auto_over_peer_min")
    text = (f"auto / raw NCCL: bcast {_f(s.get('auto_over_peer_median_doc_range'))} (median, 4 KB-2 MB; best path "
            f"{_f(s.get('best_over_peer_min_doc_range'))}), all-to-all bcast down to {_f(a2a)}; AlexNet / VGG-16 "
            f"streaming {models} per tensor, {fused} fused")
    return text, _ratio(0.32, a2a)  # times: the document's 0.32 over ours (above 1: ours lower)


def seed003(doc):
    rows = [r for r in doc.get("rows", []) if "overlap_saved_pct" in r]
    if not rows:
        return None
    saved = doc.get("document", {}).get("saved_pct", {})
    parts, vs = [], []
    for r in rows:
        share = f", communication {r['comm_share_pct']:.1f} % of the ring" if "comm_share_pct" in r else ""
        parts.append(f"{r['workload']} overlap {r['overlap_saved_pct']:+.1f} %, one-sided "
                     f"{r['onesided_saved_pct']:+.1f} %{share}")
        d = saved.get(r["workload"], {}).get("overlap")
        if d:
            vs.append(r["overlap_saved_pct"] / d)
    return "saved against blocking: " + "; ".join(parts), (min(vs) if vs else None)


def seed004(doc):
    s = doc.get("summary") or {}
    agree = doc.get("model_picks_fastest") or {}
    parts = []
    speed = s.get("native_over_auto_largest") or {}
    if speed:
        parts.append(f"native / auto at {s['largest_bytes'] >> 20 if s['largest_bytes'] >= 1 << 20 else s['largest_bytes']}"
                     f"{' MiB' if s['largest_bytes'] >= 1 << 20 else ' B'}: "
                     + ", ".join(f"{op} {_f(v)}x" for op, v in speed.items()))
    if agree:
        parts.append(f"the model picks the fastest design at {agree['agree']} of {agree['points']} points")
    err = s.get("measured_over_predicted_median")
    if err is None and doc.get("rows"):  # runs before the summary: the model's error from the rows
        err = {}
        for nbytes in sorted({r["bytes"] for r in doc["rows"]}):
            q = [r["measured_s"] / r["predicted_s"] for r in doc["rows"]
                 if r["bytes"] == nbytes and r.get("predicted_s") and r["measured_s"] > 0]
            if q:
                err[str(nbytes)] = statistics.median(q)
    if err:
        parts.append(f"measured / predicted {_f(min(err.values()), '.1f')}-{_f(max(err.values()), '.1f')} "
                     f"(median per size)")
    if not parts:
        return None
    return "; ".join(parts), s.get("vs_document")


# ---------------------------------------------------------------------- the runs -> the table
def runs(folder=RESULTS):
    """``[(seed, kind, gpus, name, doc)]`` for every GPU run in ``folder`` (kind: "fig1" or "")."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "seed*.json"))):
        name = os.path.basename(path)
        m = _NAME.match(name)
        if not m:
            continue
        if m.group(4) == "vm":
            continue
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:  # a run cut short mid-write: its cell says so
            doc = {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}
        if not isinstance(doc, dict) or doc.get("device", "gpu") != "gpu":
            continue
        gpus = doc.get("ranks") or doc.get("n_workers") or (int(m.group(3)) if m.group(3) else None)
        out.append((m.group(1), m.group(2) or "", gpus, name, doc))
    return out


def _errors(doc):
    """The first error a run recorded (any part), for the cell of a run that measured nothing."""
    if "unreadable" in doc:
        return f"unreadable JSON ({doc['unreadable']})"
    found = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("error"), str):
                found.append(x["error"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk({k: v for k, v in doc.items() if k != "document"})
    if not found:
        return "no result in the file"
    first = " ".join(found[0].split())
    more = f" (+{len(found) - 1} more errors)" if len(found) > 1 else ""
    return first[:160] + ("..." if len(first) > 160 else "") + more


def cells(folder=RESULTS):
    """``{(seed, gpus): [Cell, ...]}``: per document and GPU count, the newest run of each kind on each machine
    kind (the name's last part, ``4xh100``); an older run of the same is superseded."""
    newest = {}
    for seed, kind, gpus, name, doc in runs(folder):
        counts = [gpus]
        if seed == "001":  # one file, every worker count: those asked for (``workers``) and those measured
            asked = str(doc.get("workers") or "")
            counts = sorted({int(w) for w in asked.split(",") if w.strip().isdigit()}
                            | {a["workers"] for a in (doc.get("summary") or {}).get("apps", [])}) or list(GPUS)
        machine = _NAME.match(name).group(4)  # the current run per machine kind: an H200 run leaves H100's
        for n in counts:
            key = (seed, kind, n, machine)
            if key not in newest or str(doc.get("date", "")) > str(newest[key][1].get("date", "")):
                newest[key] = (name, doc)
    out = {}
    for (seed, kind, n, _), (name, doc) in sorted(newest.items()):
        got = None
        if "unreadable" in doc:
            pass
        elif seed == "000":
            got = {"fig1": fig1, "hpo": hpo}.get(kind, fig10)(doc)
        elif seed == "001":
            got = seed001(doc, n)
        else:
            got = {"002": seed002, "003": seed003, "004": seed004}[seed](doc)
        if got is None and seed == "001" and "unreadable" not in doc:  # that worker count's launches
            mine = [a for a in doc.get("apps") or [] if a.get("workers") == n]
            why = _errors({"apps": mine}) if mine else "the run stopped before it (its time limit)"
            got = (f"{n} worker(s): measured nothing ({why})", None)
        if got is None:  # the run measured nothing: say so, and why, instead of "not yet measured"
            what = {"fig1": "Fig. 1", "hpo": "HPO"}.get(kind, "run")
            got = (f"{what}: measured nothing ({_errors(doc)})", None)
        out.setdefault((seed, n), []).append(Cell(got[0], got[1], name, str(doc.get("date") or "undated")[:10]))
    return out


def superseded(folder=RESULTS):
    """GPU runs that no cell shows (a newer run of the same document and GPU count replaced them)."""
    shown = {c.name for found in cells(folder).values() for c in found}
    return sorted(name for _, _, _, name, _ in runs(folder) if name not in shown)


def _cell_text(seed, n, found, folder=RESULTS):
    if (seed, n) in NOT_APPLICABLE and not found:
        return NOT_APPLICABLE[(seed, n)]
    if not found:
        return "not yet measured"
    parts = []
    for c in found:
        stem = c.name[:-len(".json")]
        png = os.path.exists(os.path.join(folder, stem + ".png"))
        ref = f"`results/{stem}.{{json,png}}`" if png else f"`results/{c.name}`"
        machine = _machine(stem.rsplit("_", 1)[-1])
        ratio = "" if c.vs_document is None else f"; vs the document **{_f(c.vs_document)}**"
        parts.append(f"{machine}, {c.date} ({ref}): {c.text}{ratio}")
    return "<br>".join(parts)


def rows(folder=RESULTS):
    """The table's Markdown lines: the header, then one row per document."""
    found = cells(folder)
    lines = ["| doc | experiment | the document | ours, 1 GPU | ours, 2 GPUs | ours, 4 GPUs | peer (same run) "
             "| why ours is worse (where it is) | command (one node; `-n 2` for 2 GPUs) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for seed, (experiment, figure) in DOCUMENT.items():
        mine = [c for n in GPUS for c in found.get((seed, n), [])]
        worse = [c for c in mine if c.worse]
        why = WHY[seed] if worse else ("-" if mine else "not yet measured")
        cols = [_cell_text(seed, n, found.get((seed, n), []), folder) for n in GPUS]
        lines.append(f"| {seed} | {experiment} | {figure} | " + " | ".join(cols)
                     + f" | {PEER[seed]} | {why} | `{COMMAND[seed]}` |")
    return lines


def replace(text, lines):
    """``text`` (the README) with the lines between the markers replaced by ``lines``."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"table.py: {README} has no '{BEGIN}' ... '{END}' markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--readme", default=README)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the table in the README")
    group.add_argument("--check", action="store_true", help="exit 1 if the README's table is out of date")
    args = ap.parse_args(argv)
    lines = rows(args.results)
    if not (args.write or args.check):
        print("\n".join(lines))
        return 0
    with open(args.readme, encoding="utf-8") as f:
        text = f.read()
    new = replace(text, lines)
    if args.check:
        if new != text:
            print(f"{args.readme}: the table is not the one the runs in {args.results} give "
                  "(python benchmarks/seeds/table.py --write)", file=sys.stderr)
            return 1
        return 0
    with open(args.readme, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"wrote the table of {args.readme} ({len(lines) - 2} rows)")
    old = superseded(args.results)
    if old:
        print("superseded by newer runs (git rm them and give each a line in benchmarks/HISTORY.md): "
              + ", ".join(old))
    return 0


if __name__ == "__main__":
    sys.exit(main())

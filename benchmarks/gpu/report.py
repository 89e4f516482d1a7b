"""Plots and the targets from the JSON files of ``bench_gpu.py``.

Usage: ``python report.py OUT_DIR gpu_bench_4.json [gpu_bench_2.json ...]``.
Writes ``gpu_<ranks>.png`` per file and prints a markdown table of every
target with its measured ratio (also written to ``OUT_DIR/gpu_targets.md``).
"""

import json
import math
import os
import sys

OPS = ("allreduce", "bcast", "allgather", "reduce")
SINGLE = ("nccl", "ipc", "mpi", "ring", "two_level")


def table(doc):
    t = {}
    for r in doc["results"]:
        if r.get("seconds") is not None and not math.isnan(r["seconds"]):
            t[(r["op"], r["path"], r["mode"], r["bytes"])] = r
    return t


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = table(doc)
    fig, axes = plt.subplots(2, len(OPS), figsize=(5 * len(OPS), 8), squeeze=False)
    for j, op in enumerate(OPS):
        for i, mode in enumerate(("eager", "graph")):
            ax = axes[i][j]
            for p in ("raw", "nccl", "ipc", "auto", "ring", "mpi", "two_level"):
                pts = sorted((b, r["us"]) for (o, pp, m, b), r in t.items() if o == op and pp == p and m == mode)
                if pts:
                    ax.loglog([b for b, _ in pts], [u for _, u in pts], marker="o", ms=3,
                              label="CuPy-NCCL (peer)" if p == "raw" else p)
            ax.set_title(f"{op}, {mode}, {doc['ranks']} GPUs")
            ax.set_xlabel("bytes")
            ax.set_ylabel("us per call")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def targets(doc):
    t = table(doc)
    rows = []

    def ratio(op, b, mode, num="auto", den="raw"):
        a, r = t.get((op, num, mode, b)), t.get((op, den, mode, b))
        return a["seconds"] / r["seconds"] if a and r else None

    sizes = sorted({b for (_, _, _, b) in t})
    for op in OPS:
        for mode in ("eager", "graph"):
            small = [ratio(op, b, mode) for b in sizes if 4 <= b <= 65536]
            mid = [ratio(op, b, mode) for b in sizes if 262144 <= b <= 4 << 20]
            small, mid = [x for x in small if x], [x for x in mid if x]
            if small:
                rows.append((f"{op} 4 B-64 KB auto/NCCL time, {mode}", "<= 0.5", max(small)))
            if mid:
                rows.append((f"{op} 256 KB-4 MB auto/NCCL time, {mode}", "<= 0.8", max(mid)))
        big = [1 / ratio(op, b, "eager") for b in sizes if b >= 64 << 20 and ratio(op, b, "eager")]
        if big:
            rows.append((f"{op} >= 64 MB auto/NCCL busbw, eager", ">= 1.0", min(big)))
        worst = None
        for b in sizes:
            a = t.get((op, "auto", "eager", b))
            best = [t[(op, p, "eager", b)]["seconds"] for p in SINGLE if (op, p, "eager", b) in t]
            if a and best:
                x = a["seconds"] / min(best)
                worst = x if worst is None else max(worst, x)
        if worst:
            rows.append((f"{op} auto / fastest single path, every size, eager", "<= 1.05", worst))
    m = doc.get("micro", {})
    st = t.get(("bcast", "mpi", "eager", 64 << 20))
    if st and m.get("d2h_64MiB_GBps"):
        copy = min(m["d2h_64MiB_GBps"], m["h2d_64MiB_GBps"])
        rows.append(("staged MPI bcast 64 MiB bw / host-device copy bw", ">= 0.8", st["algbw_GBps"] / copy))
    return rows


def main():
    out = sys.argv[1]
    lines = []
    for path in sys.argv[2:]:
        if not os.path.exists(path):
            lines.append(f"(missing: {path})")
            continue
        with open(path) as f:
            doc = json.load(f)
        png = os.path.join(out, os.path.basename(path).replace(".json", ".png"))
        try:
            plot(doc, png)
        except Exception as exc:
            lines.append(f"(plot failed: {exc})")
        lines.append(f"\n### {os.path.basename(path)}: {doc['ranks']} GPUs, {doc['machine']}, {doc['date']}\n")
        lines.append(f"micro: {json.dumps(doc.get('micro', {}))}\n")
        lines.append("| target | goal | measured |\n| --- | --- | --- |")
        for name, goal, val in targets(doc):
            ok = (val <= float(goal.split()[1])) if goal.startswith("<=") else (val >= float(goal.split()[1]))
            lines.append(f"| {name} | {goal} | {val:.2f} {'met' if ok else 'MISSED'} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "gpu_targets.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

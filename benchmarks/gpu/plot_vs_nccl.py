"""Plot and tabulate a ``vs_nccl.py`` JSON: time per call and ratio to raw NCCL, per op and mode.

``python benchmarks/gpu/plot_vs_nccl.py RESULT.json [OUT.png]`` prints a Markdown table of
ratios (mpiml time / raw NCCL time in the same run) and draws the PNG.
"""

import json
import math
import sys

__all__ = ["plot", "ratio_table"]


def _series(doc):
    out = {}
    for r in doc["rows"]:
        if r.get("error") or not (r["us"] == r["us"]):
            continue
        out.setdefault((r["op"], r["mode"]), {}).setdefault(r["path"], {})[r["bytes"]] = r["us"]
    return out


def _fmt(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


def ratio_table(doc):
    """Markdown: per op/mode/size, raw NCCL us, auto (default settings) and auto0 (``MPIML_CHECK=0``) us,
    their ratios to NCCL and to each other, the best single mpiml path and auto/best."""
    lines = ["| op | mode | bytes | raw NCCL us | auto us | auto0 us | auto/NCCL | auto/auto0 | best mpiml path "
             "| auto/best |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (op, mode), paths in sorted(_series(doc).items()):
        for b in sorted(paths.get("raw", {})):
            raw = paths["raw"][b]
            auto = paths.get("auto", {}).get(b)
            auto0 = paths.get("auto0", {}).get(b, math.nan)
            singles = {p: v[b] for p, v in paths.items() if p not in ("raw", "auto", "auto0") and b in v}
            best = min(singles.items(), key=lambda kv: kv[1]) if singles else (None, math.nan)
            lines.append(f"| {op} | {mode} | {_fmt(b)} | {raw:.1f} | {auto:.1f} | {auto0:.1f} | {auto / raw:.2f} | "
                         f"{auto / auto0:.2f} | {best[0]} {best[1]:.1f} | {auto / best[1]:.2f} |" if auto else
                         f"| {op} | {mode} | {_fmt(b)} | {raw:.1f} | - | - | - | - | - | - |")
    return "\n".join(lines)


def plot(doc, path):
    """One row per op; columns: eager time, eager ratio to raw NCCL, graph time, graph ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(doc)
    ops = sorted({op for op, _ in series})
    modes = [m for m in ("eager", "graph") if any(k[1] == m for k in series)]
    fig, axes = plt.subplots(len(ops), 2 * len(modes), figsize=(5.5 * len(modes) * 2, 3.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, mode in enumerate(modes):
            paths = series.get((op, mode), {})
            raw = paths.get("raw", {})
            at, ar = axes[i][2 * j], axes[i][2 * j + 1]
            for p, pts in sorted(paths.items()):
                xs = sorted(pts)
                style = {"raw": dict(lw=2.5, color="k"), "auto": dict(lw=2.5, color="C3"),
                         "auto0": dict(lw=1.5, color="C3", ls="--")}.get(p, {})
                at.loglog(xs, [pts[b] for b in xs], marker="o", ms=3, label=p, **style)
                rx = [b for b in xs if b in raw]
                ar.semilogx(rx, [pts[b] / raw[b] for b in rx], marker="o", ms=3, label=p, **style)
            at.set_title(f"{op}, {mode}: us per call ({doc['ranks']} GPUs)", fontsize=9)
            ar.set_title(f"{op}, {mode}: time / raw NCCL", fontsize=9)
            ar.axhline(1.0, color="k", lw=0.8)
            ar.set_ylim(0, 3)
            for a in (at, ar):
                a.set_xlabel("bytes", fontsize=8)
                a.tick_params(labelsize=7)
            at.legend(fontsize=6)
    fig.suptitle(f"{doc['machine']}, {doc['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        d = json.load(f)
    print(ratio_table(d))
    if len(sys.argv) > 2:
        plot(d, sys.argv[2])

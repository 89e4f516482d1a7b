"""Plot and tabulate a ``vs_nccl.py`` JSON: time per call and ratio to raw NCCL, per op and mode.

``python benchmarks/gpu/plot_vs_nccl.py RESULT.json [OUT.png]`` prints a Markdown table of
ratios (mpiml time / raw NCCL time in the same run), then issue 34's targets with the worst ratio
of each and whether it is met, and draws the PNG.
"""

import json
import math
import sys

__all__ = ["plot", "ratio_table", "targets"]


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


#: issue 34's targets: (name, modes, ops, smallest and largest size, bound, kind); "le": auto / raw NCCL
#: at most the bound at every size; "busbw": raw NCCL / auto (bus bandwidth ratio) at least the bound;
#: "check": auto / auto0 (the default's checking against none) at most the bound
TARGETS = (
    ("eager 4 B-64 KiB <= 0.8x NCCL", ("eager",), ("allreduce", "bcast", "reduce", "allgather"), 4, 65536, 0.8, "le"),
    ("graphs 4 B-64 KiB <= 0.6x NCCL", ("graph",), ("allreduce", "bcast", "reduce", "allgather"), 4, 65536, 0.6,
     "le"),
    ("eager 256 KiB-4 MiB <= 1.0x NCCL", ("eager",), None, 262144, 4 << 20, 1.0, "le"),
    ("graphs 256 KiB-4 MiB <= 0.9x NCCL", ("graph",), None, 262144, 4 << 20, 0.9, "le"),
    (">= 64 MiB >= 0.98x NCCL's bus bandwidth", ("eager", "graph"), None, 64 << 20, None, 0.98, "busbw"),
    ("default within 1.05x of MPIML_CHECK=0", ("eager", "graph"), None, 0, None, 1.05, "check"),
)


def targets(doc):
    """Markdown: each target of issue 34, the worst ratio over its cells (op, mode, size) and whether it is met."""
    series = _series(doc)
    lines = ["| target | worst | where | met | cells over |", "| --- | --- | --- | --- | --- |"]
    for name, modes, ops, lo, hi, bound, kind in TARGETS:
        cells = []
        for (op, mode), paths in series.items():
            if mode not in modes or (ops is not None and op not in ops):
                continue
            for b, raw in paths.get("raw", {}).items():
                auto = paths.get("auto", {}).get(b)
                if auto is None or b < lo or (hi is not None and b > hi):
                    continue
                if kind == "le":
                    v = auto / raw
                elif kind == "busbw":
                    v = raw / auto
                else:
                    auto0 = paths.get("auto0", {}).get(b)
                    if auto0 is None:
                        continue
                    v = auto / auto0
                cells.append((v, f"{op} {mode} {_fmt(b)}"))
        if not cells:
            continue
        bad = [c for c in cells if (c[0] < bound if kind == "busbw" else c[0] > bound)]
        worst = min(cells) if kind == "busbw" else max(cells)
        lines.append(f"| {name} | {worst[0]:.2f} | {worst[1]} | {'yes' if not bad else 'no'} | "
                     f"{', '.join(f'{w} {v:.2f}' for v, w in sorted(bad, reverse=kind != 'busbw')[:6])} |")
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
    print()
    print(targets(d))
    if len(sys.argv) > 2:
        plot(d, sys.argv[2])

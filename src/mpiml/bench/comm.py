"""``mpiml bench comm``: an OSU-style sweep of every collective, algorithm and backend.

For each op and message size (powers of two), every series ("auto" and each
``backend/algorithm`` that applies) is timed in interleaved rounds, in a shuffled
order each round (the same on every rank): a barrier, then a batch of
back-to-back calls; the per-call time of a round is the slowest
rank's; a series' latency is the median over rounds.  With ``modes`` including
``"graph"`` (device buffers), every ``nccl``/``ipc`` series (not ``auto``) is also
timed captured in a CUDA graph of ``GRAPH_CALLS`` calls and replayed (its result rows
carry ``"mode": "graph"``; eager rows ``"mode": "eager"``): a device call's best path
may differ between the two (the host's cost per call hides the device's eagerly).
Device calls get preallocated results (``out=``), as a graph needs.  Bandwidths follow
nccl-tests: ``algbw = bytes / time``; ``busbw = algbw x`` 2(n-1)/n for allreduce,
(n-1)/n for allgather, reduce_scatter, alltoall and gather/scatter, 1 for bcast
and reduce.

Message size means: the buffer of one rank for bcast, reduce, allreduce and
scan; the whole result for allgather and gather; the whole input for scatter,
reduce_scatter and alltoall (nccl-tests' convention).
"""

import json
import os
import random
import statistics
import sys
import time
import zlib

import numpy as np

from ..comm import algorithm_names
from ._common import Progress, human_bytes, machine_info, parse_bytes, require_matplotlib, stamp

__all__ = ["main", "sweep", "series_for", "BUSBW_FACTOR", "DEFAULT_OPS", "GRAPH_CALLS", "MODES"]

#: calls captured in one CUDA graph (the graph mode's timing)
GRAPH_CALLS = 10
#: the timing modes of a sweep
MODES = ("eager", "graph")

DEFAULT_OPS = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter", "scan")


def BUSBW_FACTOR(op, n):
    if n <= 1:
        return 1.0
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter", "allgatherv"):
        return (n - 1) / n
    return 1.0


def _dtype_for(nbytes):
    if nbytes < 2:
        return np.dtype(np.bool_)
    if nbytes < 4:
        return np.dtype(np.float16)
    return np.dtype(np.float32)


def _make_call(comm, op, nbytes, xp, algorithm):
    """A zero-argument function doing one ``op`` of ``nbytes``, with its buffers preallocated."""
    dt = _dtype_for(nbytes)
    p = comm.size
    n = max(1, nbytes // dt.itemsize)
    redop = "max" if dt == np.bool_ else "sum"
    if op in ("allgather", "gather"):
        x = xp.ones(max(1, n // p), dtype=dt)
    elif op in ("alltoall", "reduce_scatter", "scatter"):
        x = xp.ones(p * max(1, n // p), dtype=dt)
    else:
        x = xp.ones(n, dtype=dt)
    if op == "allreduce":
        out = xp.empty_like(x)
        return lambda: comm.allreduce(x, redop, out=out, algorithm=algorithm)
    if xp is not np and op in ("bcast", "reduce", "allgather", "reduce_scatter"):
        # device: results preallocated (no allocation a call, and capturable in a CUDA graph)
        if op == "bcast":
            out = xp.empty_like(x)
            return lambda: comm.bcast(x, 0, out=out, algorithm=algorithm)
        if op == "reduce":
            out = xp.empty_like(x)
            return lambda: comm.reduce(x, redop, 0, out=out, algorithm=algorithm)
        if op == "allgather":
            out = xp.empty(x.size * p, dtype=dt)
            return lambda: comm.allgather(x, out=out, algorithm=algorithm)
        out = xp.empty(x.size // p, dtype=dt)
        return lambda: comm.reduce_scatter(x, redop, out=out, algorithm=algorithm)
    if op == "bcast":
        return lambda: comm.bcast(x, 0, algorithm=algorithm)
    if op == "reduce":
        return lambda: comm.reduce(x, redop, 0, algorithm=algorithm)
    if op == "allgather":
        return lambda: comm.allgather(x, algorithm=algorithm)
    if op == "gather":
        return lambda: comm.gather(x, 0, algorithm=algorithm)
    if op == "scatter":
        return lambda: comm.scatter(x if comm.rank == 0 else None, 0, algorithm=algorithm)
    if op == "reduce_scatter":
        return lambda: comm.reduce_scatter(x, redop, algorithm=algorithm)
    if op == "alltoall":
        return lambda: comm.alltoall(x, algorithm=algorithm)
    if op == "scan":
        return lambda: comm.scan(x, redop, algorithm=algorithm)
    if op == "barrier":
        return lambda: comm.barrier(algorithm=algorithm)
    raise ValueError(f"mpiml bench comm: unsupported op {op!r}")


def series_for(comm, op, device, backends=None, include_auto=True, only=None):
    """The series to time for ``op``: "auto" and each ``backend/algorithm`` that applies.

    ``only`` is a list of shell-style patterns (``"nccl/*"``, ``"mpi/native"``) that
    a fixed series must match to be timed.
    """
    from fnmatch import fnmatch

    series = ["auto"] if include_auto else []
    if only:
        return series + [s for s in series_for(comm, op, device, backends, False)
                         if any(fnmatch(s, pat) for pat in only)]
    if comm.size == 1:
        return series + [f"{comm.backend}/native"]
    wanted = backends or (("mpi",) if device == "cpu" else ("mpi", "nccl", "ipc"))
    for backend in wanted:
        if backend == "mpi":
            series += [f"mpi/{a}" for a in algorithm_names(op)]
        elif device == "gpu" and comm._device_backend_usable(backend):
            t = comm._transport(backend)
            names = ["native"] if t.has_native(op) else []
            extra = getattr(t, "algorithm_names", None)
            if extra is not None:
                names += [a for a in extra(op) if a not in names]
            series += [f"{backend}/{a}" for a in names]
    return series


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _time_batch(comm, fn, iters, xp):
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(xp)
    dt = (time.perf_counter() - t0) / iters
    return float(comm.allreduce(np.array([dt]), "max")[0])


def _capture(comm, fn, xp):
    """A CUDA graph of GRAPH_CALLS calls of ``fn`` on the current stream, or None on every rank if any failed."""
    stream = xp.cuda.get_current_stream()
    graph, err = None, None
    try:
        stream.begin_capture()
        try:
            for _ in range(GRAPH_CALLS):
                fn()
        finally:
            graph = stream.end_capture()
    except Exception as exc:  # a path that cannot be captured: left out of the graph mode on every rank
        err = f"{type(exc).__name__}: {exc}"
    if any(comm.allgather_obj(err)):
        return None
    return graph


def _time_graph(comm, graph, reps, xp):
    """Seconds per call of ``reps`` replays of a graph of GRAPH_CALLS calls, the slowest rank's."""
    stream = xp.cuda.get_current_stream()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.launch(stream)
    stream.synchronize()
    dt = (time.perf_counter() - t0) / (reps * GRAPH_CALLS)
    return float(comm.allreduce(np.array([dt]), "max")[0])


def _auto_path(comm, fn):
    from ..comm import profile

    with profile() as p:
        fn()
    calls = [c for c in p.calls if c[0] not in ("send", "recv")]
    return f"{calls[-1][2]}/{calls[-1][3]}" if calls else "?"


def sweep(comm, ops, sizes, *, device="cpu", backends=None, include_auto=True, rounds=5,
          target_seconds=0.02, max_iters=1000, progress=True, only=None, modes=("eager",)):
    """Time every series of every op at every size; returns a list of result dicts.

    The data paths are timed as the table routes them: without the signature check
    (``MPIML_CHECK=0``) unless the caller set ``MPIML_CHECK`` (its cost: docs/comm.md).
    ``modes``: ``("eager",)``, or with ``"graph"`` on device buffers also in CUDA graphs.
    """
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be some of {list(MODES)}; got {list(modes)}")
    if device != "gpu":
        modes = ("eager",)
    if "MPIML_CHECK" in os.environ:
        return _sweep(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters,
                      progress, only, modes)
    os.environ["MPIML_CHECK"] = "0"
    try:
        return _sweep(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters,
                      progress, only, modes)
    finally:
        os.environ.pop("MPIML_CHECK", None)


def _sweep(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters, progress, only,
           modes=("eager",)):
    if device == "gpu":
        import cupy

        with cupy.cuda.Stream(non_blocking=True):  # (a graph cannot be captured on the legacy stream)
            return _sweep_on(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters,
                             progress, only, modes, cupy)
    return _sweep_on(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters, progress,
                     only, ("eager",), np)


def _sweep_on(comm, ops, sizes, device, backends, include_auto, rounds, target_seconds, max_iters, progress, only,
              modes, xp):
    results = []
    plan = []
    for op in ops:
        op_sizes = [0] if op == "barrier" else sizes
        for nbytes in op_sizes:
            plan.append((op, nbytes))
    bar = Progress(len(plan), f"bench comm ({comm.size} ranks, {device})", enabled=progress and comm.rank == 0)
    series_cache = {}
    for op, nbytes in plan:
        if op not in series_cache:
            series_cache[op] = series_for(comm, op, device, backends, include_auto, only)
        names = series_cache[op]
        calls, iters = {}, {}
        for s in names:
            algo = None if s == "auto" else s
            try:
                fn = _make_call(comm, op, nbytes, xp, algo)
                fn()  # warm-up (and first-use set-up)
                _sync(xp)
            except (ValueError, NotImplementedError) as exc:
                if comm.rank == 0 and progress:
                    sys.stderr.write(f"\nskipping {op} {s}: {exc}\n")
                continue
            # rank 0 estimates the per-call time; everyone uses its iteration count
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            _sync(xp)
            est = (time.perf_counter() - t0) / 3
            n_it = int(min(max_iters, max(2, target_seconds / max(est, 1e-7))))
            iters[s] = int(comm.bcast_obj(n_it, 0))
            calls[s] = fn
        graphs = {}
        if "graph" in modes:  # the fixed device paths that a graph can hold (not the host-staged mpi ones)
            for s in calls:
                if s.partition("/")[0] in ("nccl", "ipc"):
                    g = _capture(comm, calls[s], xp)
                    if g is not None:
                        graphs[s] = g
        timed = [("eager", s) for s in calls] if "eager" in modes else []
        timed += [("graph", s) for s in graphs]
        times = {key: [] for key in timed}
        for rnd in range(rounds):
            # a different order every round (the same on every rank), so that no series
            # always runs first after a barrier or right after a slow one
            order = list(timed)
            random.Random(zlib.crc32(f"{op}:{nbytes}:{rnd}".encode())).shuffle(order)
            for mode, s in order:
                if mode == "eager":
                    times[(mode, s)].append(_time_batch(comm, calls[s], iters[s], xp))
                else:
                    reps = max(2, iters[s] // GRAPH_CALLS)
                    times[(mode, s)].append(_time_graph(comm, graphs[s], reps, xp))
        auto_path = _auto_path(comm, calls["auto"]) if "auto" in calls else None
        for (mode, s), ts in times.items():
            lat = statistics.median(ts)
            backend, _, algo = s.partition("/")
            eff_bytes = nbytes
            algbw = eff_bytes / lat / 1e9 if lat > 0 and eff_bytes else 0.0
            results.append({
                "op": op, "bytes": nbytes, "series": s, "mode": mode, "backend": backend if s != "auto" else "auto",
                "algorithm": algo if s != "auto" else auto_path, "latency_us": lat * 1e6,
                "min_us": min(ts) * 1e6, "iters": iters[s], "rounds": rounds,
                "algbw_GBps": algbw, "busbw_GBps": algbw * BUSBW_FACTOR(op, comm.size),
            })
        bar.step(f"{op} {human_bytes(nbytes)}")
    return results


def summarize(results):
    """Per op and size: the best series and auto's ratio to it."""
    table = {}
    for r in results:
        table.setdefault((r["op"], r["bytes"]), {})[r["series"]] = r
    rows = []
    for (op, nbytes), by in sorted(table.items()):
        fixed = {s: r for s, r in by.items() if s != "auto"}
        if not fixed:
            continue
        best = min(fixed.values(), key=lambda r: r["latency_us"])
        auto = by.get("auto")
        rows.append({"op": op, "bytes": nbytes, "best": best["series"], "best_us": best["latency_us"],
                     "auto_us": auto["latency_us"] if auto else None,
                     "auto_path": auto["algorithm"] if auto else None,
                     "auto_over_best": auto["latency_us"] / best["latency_us"] if auto and best["latency_us"] > 0 else None})
    return rows


def print_table(results, file=sys.stdout):
    ops = []
    for r in results:
        if r["op"] not in ops:
            ops.append(r["op"])
    for op in ops:
        rs = [r for r in results if r["op"] == op]
        series = []
        for r in rs:
            if r["series"] not in series:
                series.append(r["series"])
        sizes = sorted({r["bytes"] for r in rs})
        by = {(r["bytes"], r["series"]): r for r in rs}
        width = max(12, max(len(s) for s in series) + 1)
        print(f"\n# {op}: latency in us (busbw GB/s at the largest size)", file=file)
        print(f"{'bytes':>9}" + "".join(f"{s:>{width}}" for s in series) + f"{'auto/best':>11}", file=file)
        for b in sizes:
            cells, vals = [], []
            for s in series:
                r = by.get((b, s))
                cells.append(f"{r['latency_us']:>{width}.1f}" if r else f"{'-':>{width}}")
                if r and s != "auto":
                    vals.append(r["latency_us"])
            auto = by.get((b, "auto"))
            ratio = f"{auto['latency_us'] / min(vals):>11.2f}" if auto and vals else f"{'':>11}"
            print(f"{human_bytes(b):>9}" + "".join(cells) + ratio, file=file)
        big = max(sizes)
        print(f"{'busbw':>9}" + "".join(
            f"{by[(big, s)]['busbw_GBps']:>{width}.2f}" if (big, s) in by else f"{'-':>{width}}" for s in series),
            file=file)


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = []
    for r in results:
        if r["op"] not in ops and r["op"] != "barrier":
            ops.append(r["op"])
    if not ops:
        return
    cols = min(3, len(ops))
    rows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        rs = [r for r in results if r["op"] == op]
        series = []
        for r in rs:
            if r["series"] not in series:
                series.append(r["series"])
        for s in series:
            pts = sorted((max(r["bytes"], 1), r["latency_us"]) for r in rs if r["series"] == s)
            style = dict(lw=2.5, color="black") if s == "auto" else dict(lw=1, alpha=0.8)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=s, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("latency (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser(prog="mpiml bench comm"):
    from ..cli._options import parser

    p = parser(prog, "OSU-style sweep of collectives x algorithms x backends, with 'auto'.")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help="comma-separated collectives")
    p.add_argument("--min-bytes", default="1", help="smallest message (default 1)")
    p.add_argument("--max-bytes", default="64MiB", help="largest message (default 64MiB)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="NumPy or CuPy buffers")
    p.add_argument("--backends", default=None, help="comma-separated backends to time (default: all usable)")
    p.add_argument("--series", default=None,
                   help="comma-separated patterns of the fixed series to time, e.g. 'nccl/*,ipc/*,mpi/native'")
    p.add_argument("--step", type=int, default=2, help="size factor between messages (2: every power of two)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per series (median)")
    p.add_argument("--target-ms", type=float, default=20.0, help="time per batch of calls")
    p.add_argument("--json", default=None, help="write results to this JSON file")
    p.add_argument("--plot", default=None, help="write a PNG plot to this file")
    p.add_argument("--no-auto", action="store_true", help="do not time the 'auto' series")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def sizes_between(lo, hi, step=2):
    """Powers of ``step`` from ``lo`` to ``hi`` (both rounded into the range; ``hi`` always included)."""
    if step < 2:
        raise ValueError(f"--step must be at least 2; got {step}")
    sizes, s = [], 1
    while s <= hi:
        if s >= lo:
            sizes.append(s)
        s *= step
    if sizes and sizes[-1] != hi and hi > sizes[-1]:
        sizes.append(hi)
    return sizes


def main(argv):
    args = build_parser().parse_args(argv)
    from ..comm import COLLECTIVES, get_comm

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in COLLECTIVES:
            print(f"mpiml bench comm: unknown op {o!r} (known: {list(COLLECTIVES)})", file=sys.stderr)
            return 2
    if args.plot and require_matplotlib():
        print(f"mpiml bench comm: {require_matplotlib()}", file=sys.stderr)
        return 2
    comm = get_comm()
    if args.device == "gpu":
        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step)
    backends = tuple(args.backends.split(",")) if args.backends else None
    only = [s.strip() for s in args.series.split(",") if s.strip()] if args.series else None
    results = sweep(comm, ops, sizes, device=args.device, backends=backends, include_auto=not args.no_auto,
                    rounds=args.rounds, target_seconds=args.target_ms / 1e3, progress=not args.quiet, only=only)
    if comm.rank != 0:
        return 0
    print_table(results)
    summary = summarize(results)
    worst = max((r for r in summary if r["auto_over_best"]), key=lambda r: r["auto_over_best"], default=None)
    if worst:
        print(f"\nauto vs best: worst ratio {worst['auto_over_best']:.2f} ({worst['op']} at "
              f"{human_bytes(worst['bytes'])}: auto {worst['auto_path']} vs best {worst['best']})")
    doc = {"benchmark": "mpiml bench comm", **stamp(["bench", "comm"] + list(argv)), "machine": machine_info(comm),
           "ranks": comm.size, "device": args.device, "results": results, "summary": summary}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot, f"mpiml bench comm: {comm.size} ranks, {args.device}, {doc['machine']['host']}")
        print(f"wrote {args.plot}")
    return 0

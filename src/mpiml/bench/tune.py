"""``mpiml tune``: measure this machine and write its tuning table.

The sweep of :mod:`mpiml.bench.comm` is run without "auto"; for each op and
size the fastest ``backend/algorithm`` wins, and runs of consecutive sizes with
the same winner become one rule (``max_bytes`` = the largest size of the run;
the last rule of an op has no upper limit).  A winner must beat MPI's own
collective and the incumbent of the previous size by ``--margin`` (default 10 %)
to be chosen, which keeps noise from fragmenting the table.  Rules are for this rank count and
memory kind; rules for other rank counts or memory kinds already in the file
are kept.  Rank 0 writes the file atomically.

On GPUs (``--device gpu``) every path is timed eagerly and captured in CUDA graphs
(``--modes``, both by default), and each mode gets rules of its own (``"mode":
"eager"`` / ``"graph"``): eagerly a small call is host-bound and every path costs about
the same, so the eager winner says nothing of the device time that a graph replays.
"""

import json
import os
import sys

from .. import _config
from ._common import machine_info, parse_bytes, stamp
from .comm import DEFAULT_OPS, sizes_between, sweep

__all__ = ["main", "rules_from_results"]


def rules_from_results(results, ranks, memory, margin=0.10, open_end=True):
    """Turn sweep results into tuning rules (a list of dicts).

    ``open_end``: the last rule of an op has no upper limit; else it ends at the largest
    size measured, and larger calls fall through to the rules after this table's
    (device tables: a sweep to 16 MiB says nothing of 256 MiB).

    Results with a ``"mode"`` other than ``"eager"`` (CUDA-graph timings) give rules of
    their own mode, and then the eager results give ``"mode": "eager"`` rules; results
    of one mode only give rules for every mode (no ``"mode"`` field).
    """
    by_mode = {}
    for r in results:
        if r["series"] == "auto":
            continue
        by_mode.setdefault(r.get("mode", "eager"), []).append(r)
    if set(by_mode) <= {"eager"}:
        return _rules_of(by_mode.get("eager", []), ranks, memory, margin, None, open_end)
    rules = []
    for mode in sorted(by_mode):
        rules += _rules_of(by_mode[mode], ranks, memory, margin, mode, open_end)
    return rules


def _rules_of(results, ranks, memory, margin, mode, open_end=True):
    by = {}
    for r in results:
        by.setdefault(r["op"], {}).setdefault(r["bytes"], {})[r["series"]] = r["latency_us"]
    rules = []
    for op, sizes in by.items():
        ordered = sorted(sizes)
        runs = []  # [series, max_bytes]
        for b in ordered:
            lat = sizes[b]
            best = min(lat, key=lat.get)
            native = next((s for s in lat if s.endswith("/native") and s.startswith("mpi/")), None)
            if native is not None and lat[native] <= lat[best] * (1 + margin):
                best = native  # the library's own collective unless ours is clearly faster
            if runs:
                current = runs[-1][0]
                if current in lat and lat[current] <= lat[best] * (1 + margin):
                    best = current
            if runs and runs[-1][0] == best:
                runs[-1][1] = b
            else:
                runs.append([best, b])
        for i, (series, max_bytes) in enumerate(runs):
            backend, _, algo = series.partition("/")
            rule = {"op": op, "memory": memory, "min_ranks": ranks, "max_ranks": ranks,
                    "max_bytes": None if i == len(runs) - 1 and open_end else max_bytes, "backend": backend,
                    "algorithm": algo}
            if mode is not None:
                rule["mode"] = mode
            rules.append(rule)
    return rules


def _write_atomic(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def with_midpoints(sizes, start=64 << 10):
    """``sizes`` and 1.5x each size from ``start`` below the largest: a device route that changes between two
    powers of two (3 MiB between 2 and 4) then gets its own boundary instead of the next power's choice."""
    top = max(sizes) if sizes else 0
    return sorted(set(sizes) | {s * 3 // 2 for s in sizes if start <= s and s * 3 // 2 < top})


def main(argv):
    from ..cli._options import parser

    p = parser("mpiml tune", "Measure every backend x algorithm here and write this machine's tuning table.")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS))
    p.add_argument("--min-bytes", default="1")
    p.add_argument("--max-bytes", default="64MiB")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--series", default=None, help="patterns of the series to consider, e.g. 'nccl/*,ipc/*'")
    p.add_argument("--step", type=int, default=2, help="size factor between messages")
    p.add_argument("--sizes", default=None, help="comma list of message sizes (64K, 1.5MiB, ...; overrides the range)")
    p.add_argument("--midpoints", choices=("auto", "on", "off"), default="auto",
                   help="also measure 1.5x each size from 64 KiB, where device routes change (auto: on for --device gpu)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--target-ms", type=float, default=20.0)
    p.add_argument("--margin", type=float, default=0.10, help="relative gain needed to switch algorithm")
    p.add_argument("--output", default=None, help=f"table to write (default MPIML_TUNING_FILE or {_config.tuning_file()})")
    p.add_argument("--modes", default="eager,graph",
                   help="timing modes on GPUs: eager, graph (CUDA graphs) or both (rules per mode)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())

    from ..comm import get_comm

    comm = get_comm()
    if args.device == "gpu":
        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    ops = [o for o in args.ops.split(",") if o]
    if args.sizes:
        sizes = sorted({parse_bytes(t) for t in args.sizes.split(",") if t.strip()})
    else:
        sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step)
        if args.midpoints == "on" or (args.midpoints == "auto" and args.device == "gpu"):
            sizes = with_midpoints(sizes)
    only = [s.strip() for s in args.series.split(",") if s.strip()] if args.series else None
    results = sweep(comm, ops, sizes, device=args.device, include_auto=False, rounds=args.rounds,
                    target_seconds=args.target_ms / 1e3, progress=not args.quiet, only=only, modes=modes)
    if comm.rank != 0:
        return 0
    memory = "device" if args.device == "gpu" else "host"
    new_rules = rules_from_results(results, comm.size, memory, args.margin, open_end=memory != "device")
    path = args.output or _config.tuning_file()
    key = None
    if memory == "device":
        from ..comm._tuning import machine_key, machine_table_path  # a table per GPU model and links

        key = machine_key()  # recorded in every device table: a shipped table is named by it
        if not args.output and "MPIML_TUNING_FILE" not in os.environ:
            path = machine_table_path(key, path)
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        kept = [r for r in old.get("rules", [])
                if not (r.get("memory") == memory and r.get("min_ranks") == comm.size and r.get("max_ranks") == comm.size)]
    doc = {"version": 1, **stamp(["tune"] + list(argv)), "machine": machine_info(comm),
           **({"machine_key": key} if key else {}), "rules": new_rules + kept}
    _write_atomic(path, doc)
    print(f"mpiml tune: {len(new_rules)} rules for {comm.size} ranks, {memory} memory -> {path}")
    for r in new_rules:
        upto = "inf" if r["max_bytes"] is None else r["max_bytes"]
        print(f"  {r['op']:<15} {r.get('mode', ''):<6} <= {upto!s:>10} B : {r['backend']}/{r['algorithm']}")
    sys.stdout.flush()
    return 0

"""What the collective signature check costs: host allreduce latency with MPIML_CHECK=0, unset and 1.

Run (launches ``mpiexec -n 2`` and ``-n 4`` of itself, one after the other)::

    python benchmarks/comm_check/bench_check.py --json benchmarks/results/check_cost_vm.json

Within one launch every (size, mode) cell is measured in each of ``--rounds``
rounds, the modes in a new random order every round, so that a noisy machine
moves all modes alike; a cell is the mean time per call of a timed loop (the
maximum over ranks), and the table shows the median over rounds.  Modes:

* ``off`` — ``MPIML_CHECK=0``: no agreement at all (the floor);
* ``default`` — ``MPIML_CHECK`` unset: small calls carry their data inside
  the signature round (``inline``), larger ones overlap the round with the
  data collective (``concurrent``);
* ``strict`` — ``MPIML_CHECK=1``: the round completes before data moves
  (small calls still inline);
* ``*_native`` — the same with ``algorithm="native"`` (never inline), which is
  how the alternatives compare at small sizes: ``default_native`` is the
  concurrent round, ``strict_native`` a blocking agreement before MPI's own
  allreduce, ``off_native`` MPI's own allreduce unchecked;
* ``barrier_off`` / ``barrier_default`` — ``MPIML_CHECK=0`` barrier (MPI's) vs
  the default one (the round alone): what a host-side agreement costs by itself,
  i.e. what a device call would add if it agreed on the host before launching.

``--slot-bytes N`` measures with another largest inline slot (the design
choice in ``mpiml.comm._signature.SLOT_BYTES``; the slot is
``min(SLOT_BYTES, 16 KiB / ranks)``).
"""

import argparse
import datetime
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time

SIZES = (8, 64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576)
MODES = {  # name: (MPIML_CHECK, algorithm)
    "off": ("0", None), "default": ("", None), "strict": ("1", None),
    "off_native": ("0", "native"), "default_native": ("", "native"), "strict_native": ("1", "native"),
}


def worker(args):
    import numpy as np

    if args.slot_bytes:
        from mpiml.comm import _signature

        _signature.SLOT_BYTES = args.slot_bytes
        _signature.ROUND_BYTES = max(_signature.ROUND_BYTES, 4 * args.slot_bytes)
    from mpiml.comm import get_comm

    comm = get_comm()
    rng = random.Random(1234)  # the same order on every rank
    sizes = [s for s in SIZES if s <= args.max_bytes]
    cells = [(s, m) for s in sizes for m in MODES] + [(0, "barrier_off"), (0, "barrier_default")]
    times = {c: [] for c in cells}
    iters = {}

    def setmode(check):
        if check:
            os.environ["MPIML_CHECK"] = check
        else:
            os.environ.pop("MPIML_CHECK", None)

    def loop(nbytes, mode, n):
        if mode.startswith("barrier"):
            setmode("0" if mode == "barrier_off" else "")
            comm.barrier()
            t = time.perf_counter()
            for _ in range(n):
                comm.barrier()
            return time.perf_counter() - t
        check, algorithm = MODES[mode]
        setmode(check)
        x = np.ones(nbytes // 8)
        out = np.empty_like(x)
        for _ in range(3):
            comm.allreduce(x, out=out, algorithm=algorithm)
        comm.barrier()
        t = time.perf_counter()
        for _ in range(n):
            comm.allreduce(x, out=out, algorithm=algorithm)
        return time.perf_counter() - t

    for cell in cells:  # calibrate: iterations for about target_ms per cell (agreed: rank 0's count)
        dt = loop(*cell, 5) / 5
        n = max(5, min(args.max_iters, int(args.target_ms * 1e-3 / max(dt, 1e-7))))
        iters[cell] = comm.bcast_obj(n)
    for _ in range(args.rounds):
        order = list(cells)
        rng.shuffle(order)
        for cell in order:
            dt = loop(*cell, iters[cell]) / iters[cell]
            times[cell].append(comm.allreduce_obj(dt, op="max"))
    setmode("")
    if comm.rank == 0:
        rows = []
        for (nbytes, mode), ts in times.items():
            ts = sorted(ts)
            rows.append({"ranks": comm.size, "bytes": nbytes, "mode": mode, "median_us": ts[len(ts) // 2] * 1e6,
                         "min_us": ts[0] * 1e6, "rounds": len(ts), "iters": iters[(nbytes, mode)],
                         "slot_bytes": args.slot_bytes or None})
        with open(args.worker_out, "w") as f:
            json.dump(rows, f)


def machine():
    info = {"host": socket.gethostname(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0]}
    try:
        load = os.getloadavg()
        info["load_average_at_start"] = [round(v, 2) for v in load]
    except OSError:
        pass
    try:
        out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True, timeout=30).stdout
        version = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.strip().startswith("Version:")]
        info["launcher"] = " ".join((out.split() or ["?"])[:1] + version[:1])
        from mpi4py import MPI  # noqa: F401 (only the library's name)

        info["mpi"] = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    except Exception:
        pass
    return info


def table(rows):
    by = {(r["ranks"], r["bytes"], r["mode"]): r["median_us"] for r in rows}
    lines = []
    for ranks in sorted({r["ranks"] for r in rows}):
        lines.append(f"\n{ranks} ranks: median us per allreduce (ratio to MPIML_CHECK=0)")
        lines.append(f"{'bytes':>8} {'off':>8} {'default':>16} {'strict':>16} {'off_nat':>8} "
                     f"{'default_nat':>16} {'strict_nat':>16}")
        for nbytes in sorted({r["bytes"] for r in rows if r["bytes"]}):
            off, offn = by[(ranks, nbytes, "off")], by[(ranks, nbytes, "off_native")]

            def cell(mode, base):
                v = by[(ranks, nbytes, mode)]
                return f"{v:8.1f} ({v / base:5.2f})"

            lines.append(f"{nbytes:>8} {off:8.1f} {cell('default', off):>16} {cell('strict', off):>16} "
                         f"{offn:8.1f} {cell('default_native', offn):>16} {cell('strict_native', offn):>16}")
        b0, b1 = by[(ranks, 0, "barrier_off")], by[(ranks, 0, "barrier_default")]
        lines.append(f"barrier: MPI's {b0:.1f} us, the signature round alone {b1:.1f} us")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--target-ms", type=float, default=40.0)
    ap.add_argument("--max-iters", type=int, default=4000)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--slot-bytes", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--note", default="", help="recorded with the results (e.g. what else ran on the machine)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    import tempfile

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine()
    rows = []
    for n in args.ranks:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = ["mpiexec", "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker", "--worker-out", path,
               "--rounds", str(args.rounds), "--target-ms", str(args.target_ms), "--max-iters", str(args.max_iters),
               "--max-bytes", str(args.max_bytes), "--slot-bytes", str(args.slot_bytes)]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env.pop("MPIML_CHECK", None)
        subprocess.run(cmd, check=True, env=env)
        with open(path) as f:
            rows += json.load(f)
        os.unlink(path)
    result = {"benchmark": "benchmarks/comm_check/bench_check.py", "date": started,
              "command": " ".join(["python", "benchmarks/comm_check/bench_check.py"] + list(argv or sys.argv[1:])),
              "machine": info, "note": args.note, "results": rows}
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

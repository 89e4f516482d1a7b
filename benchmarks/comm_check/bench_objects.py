"""``allgather_obj`` of large objects against the in-band pickle path and mpi4py's ``allgather``.

    mpiexec -n 3 python benchmarks/comm_check/bench_objects.py --json OUT.json

Every rank gathers (a) one large float64 array in a dict, (b) 16 tree-like dicts of 7 arrays of 30k values
(the forest's exchange before it packed its trees itself); per case and method the best of ``--repeats``
calls, each timed on every rank between two barriers, the slowest rank's time reported.  The peers, in the
same run: ``in_band`` is the communicator's control-plane ``_allgather_obj`` (pickle with the arrays in
band, allgather of the sizes, one allgatherv, a copy of each received pickle, unpickle: what
``allgather_obj`` did for a large object before its out-of-band path); ``mpi4py`` is
``MPI.COMM_WORLD.allgather`` (pickle with the arrays in band, its own exchange).
"""

import argparse
import datetime
import json
import platform
import sys
import time

import numpy as np


def cases(rank, mb):
    array = {"a": np.full(int(mb * 2 ** 20 / 8), float(rank)), "meta": list(range(10)), "rank": rank}
    kinds = (("feature", np.int32), ("threshold", np.float64), ("left", np.int32), ("right", np.int32),
             ("value", np.float64), ("n", np.int64), ("impurity", np.float64))
    trees = [{k: np.full(30000, rank * 100 + t, dtype=dt) for k, dt in kinds} for t in range(16)]
    return {f"array_{mb:g}MB": array, "trees_16x7x30k": trees}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=27.0, help="megabytes of the large array a rank (27)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-mpi4py", action="store_true", help="leave out mpi4py's allgather (slow past 2 ranks)")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()

    from mpiml.comm import get_comm

    comm = get_comm()
    methods = {"allgather_obj": comm.allgather_obj, "in_band": comm._allgather_obj}
    if not args.no_mpi4py:
        from mpi4py import MPI

        methods["mpi4py"] = MPI.COMM_WORLD.allgather
    results = {}
    for name, obj in cases(comm.rank, args.mb).items():
        row = {}
        for method, fn in methods.items():
            times = []
            for _ in range(args.repeats):
                comm.barrier()
                t = time.perf_counter()
                out = fn(obj)
                times.append(time.perf_counter() - t)
            ok = len(out) == comm.size and all(
                (o["rank"] == r) if isinstance(o, dict) else int(o[3]["value"][0]) == r * 100 + 3
                for r, o in enumerate(out))
            slowest = max(comm.allgather_obj(min(times)))
            row[method] = {"ms": round(slowest * 1e3, 2), "ok": bool(all(comm.allgather_obj(ok)))}
            del out
        row["in_band_over_allgather_obj"] = round(row["in_band"]["ms"] / row["allgather_obj"]["ms"], 2)
        results[name] = row
        if comm.rank == 0:
            print(f"{comm.size} ranks {name:18s} " + "  ".join(
                f"{m} {v['ms']:8.1f} ms" for m, v in row.items() if isinstance(v, dict)), flush=True)
    if comm.rank == 0 and args.json:
        doc = {"benchmark": "allgather_obj of large objects", "date": datetime.datetime.now(
               datetime.timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
               "machine": f"{platform.node()} ({platform.machine()})", "ranks": comm.size,
               "peers": "in_band: the control plane's pickle-in-band allgather_obj; mpi4py: COMM_WORLD.allgather",
               "repeats": args.repeats, "results": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

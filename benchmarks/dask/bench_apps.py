"""Dask application timings, run as the client script of ``python -m mpiml.dask``.

    mpiexec -n 4 python -m mpiml.dask --protocol mpi benchmarks/dask/bench_apps.py --out r.json

Measures (median of ``--repeat`` runs after one warm-up run):

* ``sum_transpose``: ``(x + x.T).sum()`` on an n x n random array in
  ``--chunk`` blocks (NumPy, or CuPy with ``--device gpu``); the transpose
  makes workers exchange blocks;
* ``merge`` (CPU only, needs pandas): a dask.dataframe merge of two frames on
  a key (``--rows`` rows on the left) with the task-based shuffle, which moves
  rows between workers in many messages.

Results go to ``--out`` as JSON (``run_apps.py`` drives the launches and
merges them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def timed(fn, repeat):
    fn()  # warm-up: imports, first connections between workers
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, value


def sum_transpose(n, chunk, device):
    import dask.array as da

    if device == "gpu":
        import cupy

        rs = da.random.RandomState(0, RandomState=cupy.random.RandomState)
    else:
        rs = da.random.RandomState(0)
    x = rs.random((n, n), chunks=(chunk, chunk)).persist()

    def run():
        return float((x + x.T).sum().compute())

    return run, x


def merge(rows):
    import pandas as pd
    import dask.dataframe as dd

    rng = np.random.default_rng(0)
    keys = rows // 10
    left = pd.DataFrame({"k": rng.integers(0, keys, rows), "a": rng.random(rows)})
    right = pd.DataFrame({"k": np.arange(keys), "b": rng.random(keys)})
    dleft = dd.from_pandas(left, npartitions=8).persist()
    dright = dd.from_pandas(right, npartitions=4).persist()

    def run():
        # Task-based shuffle: many worker-to-worker messages of all sizes, and no
        # state kept between repetitions (the p2p shuffle sometimes reuses it).
        out = dleft.merge(dright, on="k", shuffle_method="tasks").map_partitions(len).compute()
        return int(out.sum())

    return run, (dleft, dright)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("-n", type=int, default=4000, help="array side (default 4000)")
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the merge's left frame")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from mpiml.dask import get_client

    client = get_client()
    workers = client.scheduler_info()["workers"]
    result = {
        "protocol": client.scheduler.address.split("://")[0],
        "workers": len(workers),
        "threads_per_worker": sorted({w["nthreads"] for w in workers.values()}),
        "device": args.device,
        "apps": {},
    }
    run, keep = sum_transpose(args.n, args.chunk, args.device)
    median, times, value = timed(run, args.repeat)
    result["apps"]["sum_transpose"] = {"n": args.n, "chunk": args.chunk, "seconds": median,
                                       "all_seconds": times, "value": value}
    del keep
    if args.device == "cpu":
        try:
            import pandas  # noqa: F401
        except ImportError:
            result["apps"]["merge"] = "skipped: pandas is not installed"
        else:
            run, keep = merge(args.rows)
            median, times, value = timed(run, args.repeat)
            result["apps"]["merge"] = {"rows": args.rows, "seconds": median,
                                       "all_seconds": times, "value": value}
            del keep
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Dask application timings, run as the client script of ``python -m mpiml.dask``.

    mpiexec -n 4 python -m mpiml.dask --protocol mpi benchmarks/dask/bench_apps.py --out r.json

Measures (median of ``--repeat`` runs after one warm-up run):

* ``sum_transpose``: ``(x + x.T).sum()`` on an n x n random array in
  ``--chunk`` blocks (NumPy, or CuPy with ``--device gpu``), placed by the
  scheduler, which tends to keep a block and its transpose on one worker (few
  bytes move: the time is Dask's scheduling); ``sum_transpose_rows``
  (``--layouts scheduler,rows``): row block i on worker i mod w, so every
  block whose transpose lives elsewhere moves (the time is the transfers);
  each records the worker-to-worker transfers Dask logged (count, bytes, seconds);
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


def sum_transpose(n, chunk, device, layout="scheduler", client=None):
    import dask.array as da

    if device == "gpu":
        import cupy

        rs = da.random.RandomState(0, RandomState=cupy.random.RandomState)
    else:
        rs = da.random.RandomState(0)
    if layout == "rows":
        # row block i lives on worker i mod w (data loaded by rows): block (i, j) of x.T is
        # block (j, i) of x, on another worker whenever i and j differ mod w, so blocks move
        from mpiml.dask import worker_addresses

        workers = worker_addresses(client)
        rows = [client.persist(rs.random((min(chunk, n - start), n), chunks=(chunk, chunk)),
                               workers=[workers[i % len(workers)]])
                for i, start in enumerate(range(0, n, chunk))]
        x = da.concatenate(rows, axis=0)
    else:  # where the scheduler puts the blocks (it tends to keep x(i, j) and x(j, i) together)
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


def _transfer_logs(dask_worker):
    return [(t["duration"], t["total"]) for t in dask_worker.transfer_incoming_log]


def transfer_stats(client, before):
    """Worker-to-worker transfers since ``before`` (Dask's incoming transfer logs): how many,
    bytes moved, the seconds they took (summed over transfers) and bytes / second."""
    logs = client.run(_transfer_logs)
    new = [t for w, entries in logs.items() for t in entries[before.get(w, 0):]]
    seconds, total = sum(d for d, _ in new), sum(b for _, b in new)
    return {"transfers": len(new), "bytes": total, "transfer_seconds": seconds,
            "bytes_per_second": total / seconds if seconds else None}


def timed_with_transfers(client, fn, repeat):
    fn()
    before = {w: len(v) for w, v in client.run(_transfer_logs).items()}
    median, times, value = timed(fn, repeat)
    stats = transfer_stats(client, before)
    stats["per_run"] = {k: stats[k] / (repeat + 1) for k in ("transfers", "bytes", "transfer_seconds")}
    return median, times, value, stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("-n", type=int, default=4000, help="array side (default 4000)")
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the merge's left frame")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layouts", default="scheduler",
                        help="comma-separated placements of x's blocks: 'scheduler' (Dask places them) "
                             "and/or 'rows' (row block i on worker i mod w, so transposed blocks move)")
    args = parser.parse_args(argv)

    from mpiml.dask import get_client

    client = get_client()
    workers = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    result = {
        "protocol": client.scheduler.address.split("://")[0],
        "workers": len(workers),
        "threads_per_worker": sorted({w["nthreads"] for w in workers.values()}),
        "device": args.device,
        "apps": {},
    }
    for layout in args.layouts.split(","):
        run, keep = sum_transpose(args.n, args.chunk, args.device, layout, client)
        median, times, value, transfers = timed_with_transfers(client, run, args.repeat)
        name = "sum_transpose" if layout == "scheduler" else f"sum_transpose_{layout}"
        result["apps"][name] = {"n": args.n, "chunk": args.chunk, "layout": layout, "seconds": median,
                                "all_seconds": times, "value": value, "transfers": transfers}
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

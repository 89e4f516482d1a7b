"""A Dask computation run by test_launcher.py through ``python -m mpiml.dask``.

``_cluster_app.py OUT.json`` computes a few results with the launcher's client
and writes them as JSON, so that runs over mpi:// and tcp:// can be compared.
"""

import json
import sys
import time

import numpy as np

import dask.array as da
from distributed import wait
from mpiml.dask import get_client, worker_addresses


def inc(x):
    return x + 1


def total(arr):
    return float(arr.sum())


def fail(x):
    raise ValueError(f"bad input {x}")


def main(out_path):
    client = get_client()
    workers = worker_addresses(client)
    results = {"n_workers": len(workers), "schemes": sorted({w.split("://")[0] for w in workers})}

    x = da.random.RandomState(0).random((1200, 1200), chunks=(300, 300))
    results["sym_sum"] = float((x + x.T).sum().compute())
    results["mean_axis0"] = (x.mean(axis=0)[:5]).compute().tolist()

    # Data made on one worker, used on the other (worker-to-worker transfer).
    big = client.submit(np.arange, 2_000_000, workers=[workers[0]], pure=False)
    moved = client.submit(total, big, workers=[workers[-1]], pure=False)
    results["moved_sum"] = moved.result()

    # Scatter / gather round trip of 8 MB.
    data = np.random.default_rng(1).random(1_000_000)
    [remote] = client.scatter([data])
    results["gathered_equal"] = bool(np.array_equal(client.gather(remote), data))

    # An exception raised on a worker reaches the client.
    try:
        client.submit(fail, 7).result()
        results["error"] = None
    except ValueError as exc:
        results["error"] = str(exc)

    try:
        import pandas as pd
        import dask.dataframe as dd
    except ImportError:
        results["merge"] = "skipped"
    else:
        left = pd.DataFrame({"k": np.arange(4000) % 500, "a": np.arange(4000.0)})
        right = pd.DataFrame({"k": np.arange(500), "b": np.arange(500.0) * 2})
        merged = dd.from_pandas(left, npartitions=4).merge(dd.from_pandas(right, npartitions=2), on="k")
        out = merged.compute()
        results["merge"] = [len(out), float(out["a"].sum()), float(out["b"].sum())]

    # A worker leaving in the middle of a computation: its work is redone elsewhere.
    futures = client.map(lambda i: (time.sleep(0.02), i * 2)[1], range(60), pure=False)
    time.sleep(0.2)
    client.retire_workers([workers[0]], close_workers=True)
    results["after_retire"] = sum(client.gather(futures))
    wait(futures)

    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])

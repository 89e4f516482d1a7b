"""The forests' bootstrap draws per tree against the per-row Poisson draw they replaced, in one process.

For ``N`` rows on one device (CuPy by default, ``--cpu``: NumPy with the Numba kernel and the array path),
the time per tree of :meth:`mpiml.ensemble._bootstrap.Bootstrap.counts` (exactly ``N`` draws with
replacement: unweighted, and weighted by random sample weights) and, as the peer, of the earlier
per-row Poisson(1) weights (a counter-based uniform per row and an inverse-CDF lookup in a 20-entry
table: what the forests drew before).  Each is the best of 5 trees after one warm-up; the device is
synchronised around each.  Writes JSON: machine, date, command, rows, seconds per tree of each.

Usage: python3 rf_bootstrap_bench.py OUTFILE.json [ROWS] [--cpu]   (PYTHONPATH pointing at ``src``)
"""

import datetime
import json
import math
import os
import platform
import sys
import time

import numpy as np


def _poisson_peer(xp, key, n):
    """The earlier bootstrap: Poisson(1) weight per row from a hashed uniform (inverse CDF, short table)."""
    from mpiml.ensemble._hist import hash_uniform

    table, p, total = [], math.exp(-1.0), 0.0
    for k in range(1, 21):
        total += p
        table.append(total)
        p /= k
    u = hash_uniform(xp, 7, 1, key, xp.arange(n, dtype=xp.int64))
    return xp.searchsorted(xp.asarray(table), u, side="right").astype(xp.float64)


def _best(fn, sync, reps=5):
    fn(0)
    sync()
    times = []
    for r in range(1, reps + 1):
        t0 = time.perf_counter()
        fn(r)
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    argv = [a for a in sys.argv[1:] if a != "--cpu"]
    cpu = "--cpu" in sys.argv
    out = argv[0]
    n = int(float(argv[1])) if len(argv) > 1 else (10 ** 6 if cpu else 10 ** 7)
    from mpiml.ensemble._bootstrap import Bootstrap

    if cpu:
        xp = np

        def sync():
            pass
        device = platform.processor() or platform.machine()
    else:
        import cupy as xp

        def sync():
            xp.cuda.get_current_stream().synchronize()
        device = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    w = xp.asarray(np.random.default_rng(0).random(n) * 2)
    plain = Bootstrap(xp, n, n, 0, n)
    weighted = Bootstrap(xp, n, n, 0, n, weights=w)
    res = {"rows": n, "draws_per_tree": n, "device": device, "machine": platform.node(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    res["poisson_peer_s"] = _best(lambda r: _poisson_peer(xp, r, n), sync)
    res["multinomial_s"] = _best(lambda r: plain.counts([r + 100]), sync)
    res["multinomial_weighted_s"] = _best(lambda r: weighted.counts([r + 100]), sync)
    if cpu:                                            # the array path too (what CuPy runs), without Numba
        os.environ["MPIML_RF_CPU_KERNEL"] = "0"
        res["multinomial_array_path_s"] = _best(lambda r: Bootstrap(np, n, n, 0, n).counts([r + 100]), sync)
        del os.environ["MPIML_RF_CPU_KERNEL"]
    c = plain.counts([1])[0]
    res["check_draws"] = float(c.sum())
    print(json.dumps(res, indent=1))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

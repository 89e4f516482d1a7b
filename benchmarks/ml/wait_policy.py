"""Wait policies of ranks that share cores, alternated fit by fit in one run (A/B on a noisy machine).

Run under mpiexec (e.g. 4 ranks on 2 cores); every rank takes its data shard of ``mpiml bench ml --device cpu``'s
default sizes, and each fit runs once under each policy in turn, ``--repeat`` times, so that the machine's other
load falls on every policy alike.  A policy is ``spin:nap:short`` (seconds: the spin before napping, the longest
nap, how long the naps stay at 20 us; see :func:`mpiml.comm._request.set_default_spin`)::

    mpiexec -n 4 python benchmarks/ml/wait_policy.py --out OUT.json \\
        --policies 0.001:0.0002:0,0:0.0002:0.002 --estimators logreg,linreg,pca,kmeans,knn,rf --repeat 7

The JSON: per estimator and policy the wall seconds of every fit (the slowest rank's) and the CPU seconds of all
ranks, with the machine, date, command and load average.
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policies", default="0.001:0.0002:0,0:0.0002:0.002")
    p.add_argument("--estimators", default="logreg,linreg,pca,kmeans,knn,rf")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import mpiml
    from mpiml.bench import ml_cpu
    from mpiml.bench._common import machine_info, stamp
    from mpiml.comm import _request, get_comm

    mpiml.init(device="cpu")
    comm = get_comm()
    args = ml_cpu._parser().parse_args(["--estimators", a.estimators])
    policies = a.policies.split(",")
    out = {"bench": "wait_policy", "ranks": comm.size, "machine": machine_info(),
           **stamp(["benchmarks/ml/wait_policy.py", *(sys.argv[1:] if argv is None else argv)]),
           "load_average_before": list(os.getloadavg()), "policies": policies, "wall": {}, "cpu_all_ranks": {}}
    for name in a.estimators.split(","):
        X, y, Q = ml_cpu._data(name, args, comm)
        centres = comm.bcast(np.ascontiguousarray(X[:args.k]), root=0) if name == "kmeans" else None
        est = ml_cpu._estimator("mpiml", name, args, comm)
        ml_cpu._fit(est, name, X, y, Q, centres)
        for _ in range(a.repeat):
            for pol in policies:
                _request.set_default_spin(*(float(v) for v in pol.split(":")))
                comm.barrier()
                t, c = time.perf_counter(), time.process_time()
                ml_cpu._fit(est, name, X, y, Q, centres)
                w = comm.allreduce_obj(time.perf_counter() - t, op="max")
                cc = comm.allreduce_obj(time.process_time() - c)
                out["wall"].setdefault(name, {}).setdefault(pol, []).append(round(w, 5))
                out["cpu_all_ranks"].setdefault(name, {}).setdefault(pol, []).append(round(cc, 5))
    out["load_average_after"] = list(os.getloadavg())
    out["median"] = {n: {pol: {"wall": float(np.median(v)), "cpu_all_ranks": float(np.median(out["cpu_all_ranks"][n][pol]))}
                         for pol, v in d.items()} for n, d in out["wall"].items()}
    if comm.rank == 0:
        for n, d in out["median"].items():
            print(comm.size, n, "  ".join(f"{pol}: wall {1e3 * v['wall']:.1f} ms, cpu {1e3 * v['cpu_all_ranks']:.1f}"
                                         for pol, v in d.items()), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

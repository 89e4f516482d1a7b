"""``mpiml bench ml --device cpu``: mpiml on CPU ranks against scikit-learn and scikit-learn-intelex.

The driver (a plain process) times, on the same data in one run:

* mpiml at each of ``--ranks`` (default 1, 2, 4) under ``mpiexec``, every rank taking its
  share of the node's cores (:mod:`mpiml.utils._threads`) and its rows of the data;
* scikit-learn in the driver process on every core (``n_jobs=-1`` where it applies);
* scikit-learn-intelex (oneDAL) estimators (``sklearnex.*``, the classes that
  ``patch_sklearn()`` substitutes) on every core, when it is installed; otherwise the
  entry says why it was skipped.

Every generator of :mod:`mpiml.datasets` draws a row from its global index, so the
driver's one-process draw is the concatenation of the ranks' shards: the same data for
every contender.  Each fit is timed ``--repeat`` times and the best is kept (the first
of a process loads the compiled kernels).  KMeans starts from the same centres
everywhere (``init`` = the first ``k`` rows, one run) and runs a fixed number of Lloyd
iterations (``tol=0``); NearestNeighbors is the index's fit plus the ``k``-NN search of
the query rows (spread over the ranks for mpiml).

At more than one rank, one more fit is recorded per estimator: the communication profile
(``comm``) and, per rank, its wall time, its seconds inside the communicator's blocking calls and
request waits, and the rest, its own work (``rank_seconds``: ``compute`` spread over the ranks is
load imbalance; a ``wait`` near equal on every rank is the collectives' own cost).  KMeans records
its Lloyd iteration's median time and the rows' bytes over it (``iterations``: ``GBps_rows``, the
memory rate of the ranks together; a step reads every row once, so near the host's streaming rate
the step is memory-bound and more ranks on the node cannot make it faster).

``--ceiling`` measures, in the same run, what the machine itself gives: after mpiml's fewest ranks one plain
process (no MPI) fits rank 0's share of the work at R ranks (R the most ``--ranks``), after mpiml's R ranks R plain
processes fit the R shares side by side (each fit started together, the slowest copy's time kept), with the shares
of the machine's CPU time that were busy and stolen by the hypervisor (``/proc/stat``).  ``ceiling.summary`` then
gives mpiml's speed-up as a fraction of the machine's (see :func:`_ceiling_summary`).  On a virtual machine whose
neighbours take its CPUs at times, the ceiling moves from one minute to the next; only a ceiling measured beside
mpiml says what mpiml itself adds.

Sizes for a 64-core node, 1 rank of 8 threads against 8 of 8 threads (one rank several seconds, so that the
parts of a fit that do not shrink with the work weigh little; the forest has 128 trees so that each of the 64
threads grows two, where 32 trees left half of them idle at 8 ranks)::

    B="mpiml bench ml --device cpu --threads-per-rank 8 --ranks 1,8 --ceiling"
    $B --estimators kmeans --rows 2e6 --k 64 --iters 60
    $B --estimators knn --knn-rows 3e5 --queries 40000
    $B --estimators rf --rf-rows 2e5 --trees 128 --max-depth 0      # also --trees 256: 4 trees a thread at 8 ranks

The JSON (machine, date, command, sizes, every time and score) and a PNG go to ``--out``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ._common import machine_info, stamp

__all__ = ["main", "ESTIMATORS"]

ESTIMATORS = ("kmeans", "logreg", "pca", "linreg", "rf", "knn")
_TITLES = {"kmeans": "KMeans", "logreg": "LogisticRegression", "pca": "PCA", "linreg": "LinearRegression",
           "rf": "RandomForestClassifier", "knn": "NearestNeighbors"}


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml --device cpu",
                                description="mpiml on 1, 2, 4 CPU ranks vs scikit-learn and scikit-learn-intelex "
                                "on every core: KMeans, LogisticRegression, PCA, LinearRegression, "
                                "RandomForestClassifier, NearestNeighbors on the same data.")
    p.add_argument("--device", choices=("cpu",), default="cpu")
    p.add_argument("--estimators", default=",".join(ESTIMATORS), help=f"comma-separated subset of {ESTIMATORS}")
    p.add_argument("--ranks", default="1,2,4", help="mpiml rank counts (default 1,2,4)")
    p.add_argument("--rows", type=float, default=1e5, help="rows of KMeans, LogisticRegression, PCA, "
                   "LinearRegression (default 1e5)")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--k", type=int, default=16, help="KMeans clusters")
    p.add_argument("--iters", type=int, default=20, help="KMeans Lloyd iterations")
    p.add_argument("--components", type=int, default=8, help="PCA components")
    p.add_argument("--rf-rows", type=float, default=2e4)
    p.add_argument("--trees", type=int, default=20)
    p.add_argument("--max-depth", type=int, default=12, help="forest depth (0: unlimited, scikit-learn's default)")
    p.add_argument("--knn-rows", type=float, default=5e4, help="NearestNeighbors index rows")
    p.add_argument("--queries", type=int, default=2000, help="NearestNeighbors query rows")
    p.add_argument("--neighbors", type=int, default=10)
    p.add_argument("--repeat", type=int, default=2, help="fits per measurement, the best kept")
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="threads of every mpiml rank (OMP_NUM_THREADS of the ranks; default: the node's cores "
                   "divided by the ranks on it). scikit-learn and scikit-learn-intelex always use every core")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--no-sklearnex", action="store_true")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--tag", default=None, help="file name part: ml_cpu_<tag>.json (default: <cores>core)")
    p.add_argument("--ceiling", action="store_true",
                   help="also run the machine's ceiling in the same run: 1 and then R (the most --ranks) plain "
                   "processes side by side (no MPI), each fitting one rank's share of the work at R ranks, beside "
                   "mpiml's 1 and R ranks; the JSON's 'ceiling' gives mpiml's speed-up as a fraction of it")
    p.add_argument("--variants", default="", help="settings to run every --ranks above 1 (and the most ranks' "
                   "copies, with --ceiling) again under, in the same run: ';'-separated NAME=VALUE[,NAME=VALUE] (e.g. "
                   "'MPIML_BIND=none' against the default placement; the copies are rerun for a variant that "
                   "sets MPIML_BIND only); the JSON's 'variants' holds them")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--copy", default=None, help=argparse.SUPPRESS)       # "i,R,n": copy i of n, rank i's work of R
    p.add_argument("--copy-dir", default=None, help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------- data (the same for everyone)
def _data(name, args, comm):
    """``(X, y, queries)`` of this communicator's rank (the whole set on a size-1 communicator)."""
    from .. import datasets

    d = args.features
    if name == "kmeans":
        X, _ = datasets.make_blobs(int(args.rows), d, centers=args.k, random_state=0, comm=comm)
        return X, None, None
    if name in ("logreg", "rf"):
        n = int(args.rows if name == "logreg" else args.rf_rows)
        X, y = datasets.make_classification(n, d, n_informative=d // 2, n_redundant=0, random_state=0, comm=comm)
        return X, y, None
    if name == "linreg":
        X, y = datasets.make_regression(int(args.rows), d, n_informative=d, noise=1.0, random_state=0, comm=comm)
        return X, y, None
    if name == "pca":
        X = datasets.make_low_rank_matrix(int(args.rows), d, effective_rank=max(1, d // 4), random_state=0, comm=comm)
        return X, None, None
    X, _ = datasets.make_blobs(int(args.knn_rows), d, centers=32, random_state=1, comm=comm)
    Q, _ = datasets.make_blobs(args.queries, d, centers=32, random_state=2, comm=comm)
    return X, None, Q


def _estimator(lib, name, args, comm=None):
    """``lib``: "mpiml", "sklearn" or "sklearnex"; the same settings for all three."""
    if lib == "mpiml":
        from .. import cluster, decomposition, ensemble, linear_model, neighbors
        extra = {"comm": comm}
    elif lib == "sklearn":
        from sklearn import cluster, decomposition, ensemble, linear_model, neighbors
        extra = {}
    else:
        from sklearnex import cluster, decomposition, ensemble, linear_model, neighbors
        extra = {}
    jobs = {} if lib == "mpiml" else {"n_jobs": -1}
    if name == "kmeans":
        return cluster.KMeans(args.k, init="random", n_init=1, max_iter=args.iters, tol=0.0, random_state=0, **extra)
    if name == "logreg":
        return linear_model.LogisticRegression(max_iter=100, tol=1e-4, **extra)
    if name == "pca":
        return decomposition.PCA(args.components, random_state=0, **extra)
    if name == "linreg":
        return linear_model.LinearRegression(**extra)
    if name == "rf":
        return ensemble.RandomForestClassifier(args.trees, max_depth=args.max_depth or None, random_state=0, **jobs,
                                               **extra)
    return neighbors.NearestNeighbors(n_neighbors=args.neighbors, **({"algorithm": "brute"} if lib != "mpiml" else {}),
                                      **jobs, **extra)


def _fit(est, name, X, y, Q, centres=None):
    """Fit (and search, for k-NN); returns a number to compare (score, inertia, distance sum)."""
    if name == "kmeans":
        est.set_params(init=centres)
        est.fit(X)
        return float(est.inertia_)
    if name == "knn":
        est.fit(X)
        dist, _ = est.kneighbors(Q)
        return float(np.asarray(dist).sum())
    if y is None:
        est.fit(X)
        return float(np.sum(est.explained_variance_ratio_))
    est.fit(X, y)
    return None


def _warm_up(make, name, X, y, Q, centres):
    """One untimed fit of a fresh estimator on the first rows of this rank's data (and a few queries): the
    process loads (on a fresh machine, compiles) its kernels and starts its thread pools here, not in the
    timed fits, for every contender alike.  The first fit's cost is a separate measurement (firstfit)."""
    rows = min(X.shape[0], 4096)
    est = make()
    yw = None if y is None else y[:rows]
    Qw = None if Q is None else Q[:min(Q.shape[0], 256)]
    _fit(est, name, X[:rows], yw, Qw, centres)


def _best(fn, repeat, sync=None, total=None):
    """``(best wall seconds, value, CPU seconds of that run, their total)``: the CPU time (every thread of
    the process; the largest rank's under MPI) says how much work a run did even on a busy machine;
    ``total(c)`` gives the last (the ranks' sum under MPI; None without ``total``)."""
    best, value, cpu, cpu_total = float("inf"), None, None, None
    for _ in range(max(1, repeat)):
        if sync:
            sync()
        t0, c0 = time.perf_counter(), time.process_time()
        value = fn()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        c_all = total(c) if total else None
        if sync:
            t, c = sync(t), sync(c)
        if t < best:
            best, cpu, cpu_total = t, c, c_all
    return best, value, cpu, cpu_total


def _jiffies():
    """The machine's ``(busy, steal, total)`` CPU jiffies (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return total - v[3] - (v[4] if len(v) > 4 else 0) - steal, steal, total


def _shares(j0, j1):
    """Shares of the machine's CPU time between two :func:`_jiffies` that were busy and stolen (a virtual
    machine's CPU that its host gave to something else: in no process's CPU time, yet not available)."""
    if not j0 or not j1 or j1[2] <= j0[2]:
        return None
    dt = j1[2] - j0[2]
    return {"busy": round((j1[0] - j0[0]) / dt, 3), "steal": round((j1[1] - j0[1]) / dt, 3)}


# ---------------------------------------------------------------------- mpiml under mpiexec
#: Blocking calls of a communicator whose time is a rank's waiting (for its peers, and the transfer itself).
_BLOCKING = ("allgather", "allgather_obj", "allgatherv", "allreduce", "allreduce_obj", "alltoall", "barrier", "bcast",
             "bcast_obj", "exscan", "gather", "gatherv", "recv", "reduce", "reduce_scatter", "scan", "scatter", "send")


class _WaitClock:
    """Seconds this rank spends inside ``comm``'s blocking calls and in the waits of its requests (a ring's
    ``isendrecv(...).wait()``), outermost calls only (a collective that waits on requests is counted once):
    waiting for the other ranks and moving the bytes.  The rest of a fit's wall time is this rank's own work.
    The communication profile cannot tell this for nonblocking calls: it times a request from its post, across
    the computation it overlaps."""

    def __init__(self, comm):
        self.comm, self.seconds, self.calls, self._depth, self.each = comm, 0.0, 0, 0, []

    def _timed(self, fn):
        def call(*a, **kw):
            if self._depth:
                return fn(*a, **kw)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.each.append(time.perf_counter() - t0)
                self.seconds += self.each[-1]
                self.calls += 1
                self._depth -= 1
        return call

    def __enter__(self):
        from ..comm import _request

        self._wait = _request.Request.wait
        for name in _BLOCKING:
            if hasattr(self.comm, name):
                setattr(self.comm, name, self._timed(getattr(self.comm, name)))
        clock = self
        timed_wait = None

        def wait(req, timeout=None):
            return timed_wait(req, timeout)

        timed_wait = self._timed(lambda req, timeout=None: clock._wait(req, timeout))
        _request.Request.wait = wait
        return self

    def __exit__(self, *exc):
        from ..comm import _request

        _request.Request.wait = self._wait
        for name in _BLOCKING:
            self.comm.__dict__.pop(name, None)
        return False


def _rank_times(comm, fit):
    """One more fit, timed per rank: ``{"wall", "wait", "compute"}`` lists in rank order (seconds), with the
    slowest rank's compute and the ranks' mean wait.  ``compute`` (wall minus wait) spread over the ranks is
    load imbalance; a wait near equal on every rank is the collectives' own cost."""
    comm.barrier()
    with _WaitClock(comm) as clock:
        t0 = time.perf_counter()
        fit()
        wall = time.perf_counter() - t0
    rows = comm.allgather_obj((round(wall, 5), round(clock.seconds, 5), clock.calls, clock.each))
    walls, waits = [r[0] for r in rows], [r[1] for r in rows]
    compute = [round(w - x, 5) for w, x in zip(walls, waits)]
    out = {"wall": walls, "wait": waits, "compute": compute, "calls": rows[0][2],
           "compute_max": max(compute), "compute_min": min(compute),
           "wait_mean": round(sum(waits) / len(waits), 5)}
    if len({len(r[3]) for r in rows}) == 1 and rows[0][3]:
        # per call, the least any rank waited: what the last rank to arrive waited, the call's own cost (its
        # latency); the rest of a rank's wait in that call was for the slowest rank (skew)
        least = np.min(np.array([r[3] for r in rows]), axis=0)
        out["call_least_wait"] = {"median": round(float(np.median(least)), 6), "sum": round(float(least.sum()), 5)}
    return out


def _phases(name, est):
    """This rank's seconds in the parts of the last fit, or None: the forest's (binning, gathering the rows,
    growing its own trees, the trees' exchange, assembling the forest), the k-NN search's in node memory
    (allocating the windows, writing the rows, the two waits, the search itself, freeing) and the k-means fit's
    iterations against the rest (validation, statistics, the last assignment)."""
    if name == "rf":
        return {k: round(float(v), 5) for k, v in getattr(est, "_fit_stats", {}).items()
                if k.endswith("_s") or k == "own_trees"}
    if name == "knn":
        from ..neighbors import _cpu, _node

        return {**dict(_node.LAST), **{k: round(v, 5) for k, v in getattr(_cpu, "PHASES", {}).items()}}
    if name == "kmeans" and getattr(est, "_iter_seconds", None):
        from ..cluster import _kmeans_node

        # node: the steps ran over the node's rows (all ranks' threads), reused: on the windows of the fit before
        return {"iterations_s": round(float(np.sum(est._iter_seconds)), 5), "n_iter": len(est._iter_seconds),
                **{f"node_{k}": v for k, v in _kmeans_node.LAST.items()}}
    return None


def _worker(args):
    import mpiml
    from ..comm import get_comm
    from ..utils._threads import thread_info

    mpiml.init(device="cpu")
    comm = get_comm()
    info = thread_info()
    # the settings a run was made under (an A/B run of the wait's spin or the k-NN strategy names its variable)
    chosen = ("MPIML_SPIN_US", "MPIML_KNN_STRATEGY", "MPIML_BIND", "MPIML_KNN_SCREEN", "MPIML_CPU_SCHEDULE",
              "MPIML_RF_TREE_THREADS", "MPIML_KNN_GATHER_BYTES", "MPIML_KNN_SHARED", "MPIML_KMEANS_NODE")
    settings = {"wait_spin_ms": info.get("wait_spin_ms"), **{v: os.environ[v] for v in chosen if os.environ.get(v)},
                "bound_to": info.get("bound_to"), "placement": comm.allgather_obj(info.get("placement"))}
    out = {"ranks": comm.size, "threads_per_rank": info.get("threads"), "settings": settings, "seconds": {},
           "values": {}, "cpu_seconds": {}}

    def sync(t=None):
        if t is None:
            comm.barrier()
            return None
        return comm.allreduce_obj(t, op="max")

    for name in args.estimators.split(","):
        X, y, Q = _data(name, args, comm)
        centres = None
        if name == "kmeans":  # the first k global rows, as the one-process runs take them
            centres = comm.bcast(np.ascontiguousarray(X[:args.k]), root=0)
        _warm_up(lambda: _estimator("mpiml", name, args, comm), name, X, y, Q, centres)
        est = _estimator("mpiml", name, args, comm)
        j0 = _jiffies()
        seconds, value, cpu, cpu_all = _best(lambda: _fit(est, name, X, y, Q, centres), args.repeat, sync,
                                             total=lambda c: comm.allreduce_obj(c))
        out.setdefault("machine", {})[name] = _shares(j0, _jiffies())
        out.setdefault("cpu_seconds_all_ranks", {})[name] = cpu_all
        if name == "knn" and value is not None:
            value = comm.allreduce_obj(value)
        out["seconds"][name], out["values"][name], out["cpu_seconds"][name] = seconds, value, cpu
        if comm.size > 1:  # one more fit, recorded: where a rank's time goes besides its own work
            with mpiml.profile() as prof:
                # per rank: its own work and its waits (load imbalance vs the collectives' cost)
                out.setdefault("rank_seconds", {})[name] = _rank_times(comm,
                                                                       lambda: _fit(est, name, X, y, Q, centres))
            phases = _phases(name, est)
            if phases is not None:   # per rank: where its own time went (the fit's parts)
                out.setdefault("rank_phases", {})[name] = comm.allgather_obj(phases)
            summ = prof.summary()
            # every rank's seconds in collectives (nonblocking ones from their post: a ring's overlapped receive
            # spans the search), the rank_seconds' own gather included
            waits = comm.allgather_obj(round(summ["total_seconds"], 4))
            out.setdefault("comm", {})[name] = {"calls": summ["calls"], "seconds": max(waits),
                                                "seconds_min": min(waits),
                                                "ops": {k: v["calls"] for k, v in summ["ops"].items()}}
        if name == "kmeans" and getattr(est, "_iter_seconds", None):
            # a Lloyd iteration reads every row once: the rows' bytes over its median time, the memory rate the
            # ranks reached together (memory-bound when it nears the host's streaming rate)
            it = np.asarray(est._iter_seconds)
            med = float(comm.allreduce_obj(float(np.median(it)), op="max"))
            nbytes = comm.allreduce_obj(int(np.asarray(X).nbytes))
            out.setdefault("iterations", {})[name] = {"median": round(med, 5), "max": round(float(it.max()), 5),
                                                      "GBps_rows": round(nbytes / med / 1e9, 2)}
        if comm.rank == 0:
            print(f"  mpiml {comm.size} rank(s): {_TITLES[name]} {seconds:.3f} s", flush=True)
    if comm.rank == 0:
        with open(args.worker, "w") as f:
            json.dump(out, f)
    return 0


# ---------------------------------------------------------------------- the ceiling: plain copies side by side
class _Shard:
    """Rank ``rank`` of ``size`` for the generators, which read these two alone (given an int ``random_state``):
    a plain process draws exactly the rows that rank draws under MPI."""

    def __init__(self, size, rank):
        self.size, self.rank = size, rank


def _copy_work(name, args, i, R):
    """``(X, y, Q, centres, make)``: rank ``i``'s share of the work at ``R`` ranks, for one plain process.  Its rows
    (KMeans, the linear models, PCA); every row and its share of the trees (the forest: CPU ranks gather the binned
    rows and grow whole trees, round robin); every index row and its share of the queries (k-NN: the ranks search
    the queries' blocks against the whole index)."""
    from .. import datasets
    from ..comm import get_comm

    one = get_comm("self")
    centres = None
    if name == "rf":
        X, y, Q = _data(name, args, one)
        args = argparse.Namespace(**{**vars(args), "trees": max(1, len(range(args.trees)[i::R]))})
    elif name == "knn":
        X, _ = datasets.make_blobs(int(args.knn_rows), args.features, centers=32, random_state=1, comm=one)
        Q, _ = datasets.make_blobs(args.queries, args.features, centers=32, random_state=2, comm=_Shard(R, i))
        y = None
    else:
        X, y, Q = _data(name, args, _Shard(R, i))
        if name == "kmeans":   # the first k global rows, as the ranks start from
            first = X if i == 0 else _data(name, args, _Shard(R, 0))[0]
            centres = np.ascontiguousarray(first[:args.k])
    return X, y, Q, centres, (lambda: _estimator("mpiml", name, args, one))


def _file_barrier(folder, name, index, count, timeout=300.0):
    """Every one of ``count`` copies at the same point (a mark per copy in ``folder``), or False after ``timeout``."""
    open(os.path.join(folder, f"{name}.{index}"), "w").close()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if all(os.path.exists(os.path.join(folder, f"{name}.{j}")) for j in range(count)):
            return True
        time.sleep(0.001)
    return False


def _copy_worker(args):
    """One plain process of the ceiling (``--copy i,R,n``): rank ``i``'s work at ``R`` ranks, ``--repeat`` fits,
    each started together with the other ``n - 1`` copies."""
    import mpiml
    from ..utils._threads import thread_info

    i, R, n = (int(v) for v in args.copy.split(","))
    mpiml.init(device="cpu")
    # pinned as rank i of n would be (the same rules, before any data exist), unless MPIML_BIND=none
    from ..utils import _placement

    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus, placement = _placement.plan(i, n, [mine] * n, threads=thread_info().get("threads"))
    if cpus is not None and not _placement.pin(cpus):
        placement = "not pinned (sched_setaffinity refused)"
    out = {"copy": i, "of": R, "side_by_side": n, "threads": thread_info().get("threads"), "walls": {}, "cpus": {},
           "machine": {}, "placement": placement}
    for name in args.estimators.split(","):
        X, y, Q, centres, make = _copy_work(name, args, i, R)
        _warm_up(make, name, X, y, Q, centres)
        est = make()
        walls, cpus = [], []
        j0 = _jiffies()
        for rep in range(max(1, args.repeat)):
            if not _file_barrier(args.copy_dir, f"{name}.{rep}", i, n):
                out["error"] = f"the other copies did not reach {name} fit {rep}"
                break
            t0, c0 = time.perf_counter(), time.process_time()
            _fit(est, name, X, y, Q, centres)
            walls.append(round(time.perf_counter() - t0, 5))
            cpus.append(round(time.process_time() - c0, 5))
        out["machine"][name] = _shares(j0, _jiffies())
        out["walls"][name], out["cpus"][name] = walls, cpus
    with open(args.worker, "w") as f:
        json.dump(out, f)
    return 0


def _copies(argv, args, names, n, R, threads, env):
    """``n`` plain processes side by side, each with rank ``i``'s work at ``R`` ranks on ``threads`` threads.  Per
    estimator: ``seconds``, the best over the fits of the slowest copy (the copies start each fit together, as the
    ranks do); ``cpu_seconds`` (that copy's); ``machine``, the shares of the machine's CPU time busy and stolen by
    the hypervisor (``/proc/stat``) over the fits; ``walls``, every copy's fits."""
    env = dict(env, **{v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"copy{i}.json") for i in range(n)]
        cmd = [sys.executable, "-m", "mpiml", "bench", "ml", *argv]
        print(f"launching {n} plain process(es) of {threads} thread(s), rank i's work of {R}", flush=True)
        kids = [subprocess.Popen(cmd + ["--copy", f"{i},{R},{n}", "--copy-dir", tmp, "--worker", paths[i]], env=env)
                for i in range(n)]
        codes = [k.wait() for k in kids]
        runs = []
        for path in paths:
            if os.path.exists(path):
                with open(path) as f:
                    runs.append(json.load(f))
    out = {"copies": n, "of": R, "threads": threads, "exit_codes": codes, "seconds": {}, "cpu_seconds": {},
           "machine": {}, "walls": {}, "placement": [r.get("placement") for r in runs]}
    if len(runs) != n or any(c != 0 for c in codes):
        out["error"] = f"{n - len(runs)} of {n} copies wrote nothing; exit codes {codes}"
        return out
    for name in names:
        walls = [r["walls"].get(name, []) for r in runs]
        reps = min(len(w) for w in walls)
        if not reps:
            continue
        slowest = [max(w[j] for w in walls) for j in range(reps)]
        j = int(np.argmin(slowest))
        who = int(np.argmax([w[j] for w in walls]))
        out["seconds"][name] = slowest[j]
        out["cpu_seconds"][name] = runs[who]["cpus"][name][j]
        out["walls"][name] = walls
        shares = [r["machine"].get(name) for r in runs if r["machine"].get(name)]
        if shares:
            out["machine"][name] = {k: round(float(np.median([m[k] for m in shares])), 3) for k in shares[0]}
        print(f"  {n} cop{'y' if n == 1 else 'ies'}: {_TITLES[name]} {slowest[j]:.3f} s (slowest copy), "
              f"machine {out['machine'].get(name)}", flush=True)
    return out


def _ceiling_summary(result):
    """Per estimator, mpiml's 1 -> R ranks against the machine's ceiling measured in the same run.

    * ``machine_ceiling`` = R x (one copy alone) / (R copies side by side): the speed-up the machine gives R
      processes that never communicate (R when it gives every copy the speed of one alone);
    * ``speedup`` = mpiml at 1 rank / mpiml at R ranks, and ``fraction`` = speedup / machine_ceiling;
    * the fraction is ``one_rank_over_copy`` / ``over_copies``: ``one_rank_over_copy`` = (mpiml at 1 rank) / (R x
      one copy alone) (above 1: one rank of all the work takes longer than R times one rank's share alone, which
      flatters the speed-up), ``over_copies`` = (mpiml at R ranks) / (R copies): what the ranks add above plain
      processes doing the same work at the same time (communication, waits, the parts every rank repeats);
    * ``mpiml_ceiling`` = (mpiml at 1 rank) / (R copies): the speed-up mpiml's R ranks would reach if they cost no
      more than the copies.
    """
    ceil = result.get("ceiling", {})
    ranks = result["ranks"]
    if not ranks or min(ranks) != 1 or max(ranks) == 1:
        return {}
    R = max(ranks)
    one, many = ceil.get("1", {}).get("seconds", {}), ceil.get(str(R), {}).get("seconds", {})
    m1 = result["mpiml"].get("1", {}).get("seconds", {})
    mR = result["mpiml"].get(str(R), {}).get("seconds", {})
    out = {}
    for name in result["estimators"]:
        if not all(d.get(name) for d in (one, many, m1, mR)):
            continue
        machine = R * one[name] / many[name]
        speedup = m1[name] / mR[name]
        out[name] = {"copy_alone_s": one[name], "copies_s": many[name], "machine_ceiling": round(machine, 3),
                     "speedup": round(speedup, 3), "fraction": round(speedup / machine, 3),
                     "one_rank_over_copy": round(m1[name] / (R * one[name]), 3),
                     "over_copies": round(mR[name] / many[name], 3),
                     "mpiml_ceiling": round(m1[name] / many[name], 3),
                     "steal": {"copies": ceil[str(R)].get("machine", {}).get(name, {}).get("steal"),
                               "mpiml": (result["mpiml"][str(R)].get("machine") or {}).get(name, {}) and
                               result["mpiml"][str(R)]["machine"][name].get("steal")}}
    return out


# ---------------------------------------------------------------------- one process, every core
def _single(lib, args, names):
    from ..comm import get_comm

    comm = get_comm("self")
    seconds, values, cpu = {}, {}, {}
    for name in names:
        X, y, Q = _data(name, args, comm)
        X = np.asarray(X)
        centres = np.ascontiguousarray(X[:args.k]) if name == "kmeans" else None
        _warm_up(lambda: _estimator(lib, name, args), name, X, y, Q, centres)
        est = _estimator(lib, name, args)
        seconds[name], values[name], cpu[name], _ = _best(lambda: _fit(est, name, X, y, Q, centres), args.repeat)
        print(f"  {lib}: {_TITLES[name]} {seconds[name]:.3f} s", flush=True)
    return {"seconds": seconds, "values": values, "cpu_seconds": cpu}


def _sklearnex_available():
    try:
        import sklearnex

        return True, getattr(sklearnex, "__version__", "?")
    except Exception as exc:  # not installed, or its oneDAL library does not load here
        return False, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- the driver
def _load():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["estimators"])
    series = [(f"mpiml {r} rank(s)", [result["mpiml"].get(str(r), {}).get("seconds", {}).get(n) for n in names])
              for r in result["ranks"]]
    for lib in ("sklearn", "sklearnex"):
        if isinstance(result.get(lib), dict) and "seconds" in result[lib]:
            series.append((f"{lib} ({result['cores']} cores)", [result[lib]["seconds"].get(n) for n in names]))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        xs = [j + i * width for j, v in enumerate(values) if v]
        ax.bar(xs, [v for v in values if v], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    ax.set_xticklabels([_TITLES[n] for n in names], rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (fit; k-NN: fit + search), lower is better")
    ax.set_title(f"CPU: mpiml ranks vs scikit-learn / scikit-learn-intelex, {result['machine']['host']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedups(result):
    """Per estimator, the time at the fewest ranks over the time at each rank count (1.0 for the fewest)."""
    runs = {r: result["mpiml"].get(str(r), {}).get("seconds", {}) for r in result["ranks"]}
    base = runs.get(min(result["ranks"]), {}) if result["ranks"] else {}
    return {name: {str(r): round(base[name] / runs[r][name], 3) for r in result["ranks"] if runs[r].get(name)}
            for name in result["estimators"] if base.get(name)}


def _table(result):
    names = result["estimators"]
    top = str(max(result["ranks"]))
    head = ["estimator"] + [f"mpiml R={r}" for r in result["ranks"]] + ["scikit-learn", "sklearnex",
                                                                         f"R={top} speed-up"]
    print(" | ".join(head))
    for n in names:
        row = [_TITLES[n]] + [result["mpiml"].get(str(r), {}).get("seconds", {}).get(n) for r in result["ranks"]]
        for lib in ("sklearn", "sklearnex"):
            row.append(result[lib]["seconds"].get(n) if "seconds" in result.get(lib, {}) else None)
        row.append(result["speedup"].get(n, {}).get(top))
        print(" | ".join(row[:1] + [f"{v:.3f}" if isinstance(v, float) else "-" for v in row[1:]]))
    summary = result.get("ceiling", {}).get("summary", {})
    for label, entry in result.get("variants", {}).items():
        for n in names:
            one = result["mpiml"].get("1", {}).get("seconds", {}).get(n)
            for r, run in entry["mpiml"].items():
                t = run.get("seconds", {}).get(n)
                c = entry.get("summary", {}).get(n) if r == top else None
                print(f"variant {label}: {_TITLES[n]} R={r} " + (f"{t:.3f} s" if t else "-") +
                      (f", speed-up {one / t:.2f}" if t and one else "") +
                      (f"; {top} copies {c['copies_s']:.3f} s, machine ceiling {c['machine_ceiling']:.2f}" if c else ""))
    if summary:
        print(f"ceiling (plain processes, same run) | 1 copy | {top} copies | machine ceiling | mpiml speed-up | "
              f"fraction | R ranks / R copies | steal (copies, mpiml)")
        for n, c in summary.items():
            print(f"{_TITLES[n]} | {c['copy_alone_s']:.3f} | {c['copies_s']:.3f} | {c['machine_ceiling']:.2f} | "
                  f"{c['speedup']:.2f} | {c['fraction']:.2f} | {c['over_copies']:.2f} | "
                  f"{c['steal']['copies']}, {c['steal']['mpiml']}")


def main(argv):
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    names = [n for n in args.estimators.split(",") if n]
    unknown = sorted(set(names) - set(ESTIMATORS))
    if unknown:
        print(f"mpiml bench ml --device cpu: unknown estimators {unknown} (known: {list(ESTIMATORS)})", file=sys.stderr)
        return 2
    if args.copy:
        return _copy_worker(args)
    if args.worker:
        return _worker(args)
    from ._common import bench_launch_check

    status, _ = bench_launch_check("cpu", "mpiml bench ml --device cpu")
    if status is not None:
        return status
    from ..cli._options import mpiexec_command

    ranks = [int(r) for r in args.ranks.split(",") if r]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    result = {"bench": "ml_cpu", "estimators": names, "ranks": ranks, "machine": machine_info(),
              "cores": cores, **stamp(["bench", "ml", *argv]),
              "sizes": {k: getattr(args, k) for k in ("rows", "features", "k", "iters", "components", "rf_rows",
                                                       "trees", "max_depth", "knn_rows", "queries", "neighbors",
                                                       "repeat", "threads_per_rank")},
              "mpiml": {}, "load_average_before": _load()}
    # every rank its share of the cores (the launcher sets nothing; a user's variable would still win)
    from ..utils._threads import child_env

    env = {k: v for k, v in child_env().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")}
    if args.threads_per_rank:  # a fixed count per rank (1 -> R ranks of T threads: the cores grow with R)
        env.update({k: str(args.threads_per_rank) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                             "OPENBLAS_NUM_THREADS")})
    tag = args.tag or f"{cores}core"
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"ml_cpu_{tag}.json")

    def save():   # after every part: a run cut by its time limit keeps what it measured
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)

    variants = [v for v in args.variants.split(";") if v.strip()]

    def ranks_run(r, tmp, run_env):
        path = os.path.join(tmp, f"r{r}.json")
        cmd = mpiexec_command(r, [])
        cmd = cmd[:cmd.index("-m")] + ["-m", "mpiml", "bench", "ml", *argv, "--worker", path]
        print("launching: " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=run_env)
        if rc != 0 or not os.path.exists(path):
            return {"error": f"exit status {rc}"}
        with open(path) as f:
            return json.load(f)

    with tempfile.TemporaryDirectory() as tmp:
        for r in ranks:
            result["mpiml"][str(r)] = ranks_run(r, tmp, env)
            save()
            if "error" in result["mpiml"][str(r)]:
                continue
            if args.ceiling and r in (min(ranks), max(ranks)) and max(ranks) > 1:
                R = max(ranks)
                n = 1 if r == min(ranks) else R
                result.setdefault("ceiling", {})[str(n)] = _copies(argv, args, names, n, R, args.threads_per_rank
                                                                   or max(1, cores // R), env)
            save()
        R = max(ranks)
        for label in variants:   # the most ranks (and their copies) again, under other settings
            extra = dict(kv.strip().split("=", 1) for kv in label.split(",") if "=" in kv)
            print(f"variant {label}:", flush=True)
            entry = result.setdefault("variants", {})[label] = {"mpiml": {}}
            for r in ranks:
                if r > 1:
                    entry["mpiml"][str(r)] = ranks_run(r, tmp, dict(env, **extra))
                    save()
            if args.ceiling and R > 1 and "MPIML_BIND" in extra:   # (other settings change nothing in a copy)
                entry["copies"] = _copies(argv, args, names, R, R, args.threads_per_rank or max(1, cores // R),
                                          dict(env, **extra))
            save()
    result["sklearn"] = {"skipped": "--no-sklearn"} if args.no_sklearn else _single("sklearn", args, names)
    ok, detail = _sklearnex_available()
    if args.no_sklearnex:
        result["sklearnex"] = {"skipped": "--no-sklearnex"}
    elif not ok:
        result["sklearnex"] = {"skipped": f"scikit-learn-intelex does not import here ({detail}); "
                                          "pip install scikit-learn-intelex"}
    else:
        result["sklearnex"] = dict(_single("sklearnex", args, names), version=detail)
    result["load_average_after"] = _load()  # a shared machine's other work shows here
    result["speedup"] = _speedups(result)
    if args.ceiling:
        result.setdefault("ceiling", {})["summary"] = _ceiling_summary(result)
        for entry in result.get("variants", {}).values():
            if "copies" in entry:   # the same summary with the variant's R ranks and R copies
                alt = dict(result, mpiml={**result["mpiml"], str(max(ranks)): entry["mpiml"].get(str(max(ranks)), {})},
                           ceiling={**result.get("ceiling", {}), str(max(ranks)): entry["copies"]})
                entry["summary"] = _ceiling_summary(alt)
    save()
    _plot(result, os.path.join(args.out, f"ml_cpu_{tag}.png"))
    _table(result)
    print(f"wrote {json_path} and its .png")
    return 0

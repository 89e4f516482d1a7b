"""Thread scaling of one CPU rank's kernels: the same work at 1, 8, ... threads in one process.

``mpiml bench ml --device cpu`` measures whole fits over ranks; this says, for one rank, how
each compiled kernel and each fit scales with its threads, and which thread pools the process
holds (BLAS, OpenMP, Numba's layer), so that a fit that does not scale points at its part:

* KMeans: one Lloyd step (:func:`mpiml.cluster._kmeans_cpu.lloyd_step`) and a 20-step fit;
* RandomForestClassifier: whole fits (full depth) with the grower's phase times
  (binning, node search, partition, the rest: Python and NumPy between the kernels);
* NearestNeighbors: the k-NN search kernel (:func:`mpiml.neighbors._cpu.topk`).

Run from the repository root (a plain process, no mpiexec):

    python benchmarks/ml/cpu_threads.py --threads 1,8,64 --out $OUT/cpu_threads.json

Every measurement is the best of ``--repeat`` after one untimed call (kernels loaded).

``--procs N`` runs N copies side by side instead (plain processes, no MPI), each with
``--threads`` threads (one count) and its own data: a memory-streaming loop, one rank's Lloyd
step and one rank's k-NN search (``--rows``, ``--queries`` x ``--knn-rows``), each part started
by all copies together (a file barrier) and repeated for ``--seconds``.  Per copy: calls, wall
and CPU seconds a call.  Compared with ``--procs 1``, it says what the machine itself does to a
rank's threads when every rank computes at once, with no communication in the way:

    python benchmarks/ml/cpu_threads.py --procs 8 --threads 8 --out $OUT/procs8x8.json
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def _set_threads(t):
    """This process's pools at ``t`` threads: BLAS and OpenMP through threadpoolctl, Numba's count, and the
    limit that mpiml's kernels read."""
    from threadpoolctl import threadpool_limits

    from mpiml.utils import _threads
    from mpiml.utils._jit import numba

    _threads._STATE["threads"] = t
    nb = numba()
    nb.set_num_threads(min(t, nb.config.NUMBA_NUM_THREADS))
    return threadpool_limits(limits=t)


def _peer_threads(t):
    """scikit-learn-intelex's threads (oneDAL's global count), when it is installed."""
    try:
        import daal4py

        daal4py.daalinit(t)
        return True
    except Exception:  # noqa: BLE001 - not installed, or its library does not load
        return False


def _peers(name, t, fit_of, repeat, res):
    """The same fit by scikit-learn and scikit-learn-intelex at ``t`` threads, in this process."""
    for lib in ("sklearn", "sklearnex"):
        if lib == "sklearnex" and not _peer_threads(t):
            continue
        try:
            fn = fit_of(lib)
        except ImportError:
            continue
        res[f"{name}_{lib}_T{t}"] = _best(fn, repeat)


def _best(fn, repeat):
    fn()
    best_w, best_c = float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - t0, time.process_time() - c0
        if w < best_w:
            best_w, best_c = w, c
    return round(best_w, 4), round(best_c, 4)


def _probe_kernel(nb):
    @nb.njit(parallel=True, nogil=True)
    def probe(X, parts, out, useblas, CT):
        n = X.shape[0]
        for p in nb.prange(parts):
            s = 0.0
            for b0 in range(p * n // parts, (p + 1) * n // parts, 512):
                m = min((p + 1) * n // parts, b0 + 512) - b0
                if useblas:
                    G = np.dot(X[b0:b0 + m], CT)
                    s += G[0, 0]
                else:
                    for i in range(b0, b0 + m):
                        for j in range(CT.shape[1]):
                            acc = 0.0
                            for f in range(X.shape[1]):
                                acc += X[i, f] * CT[f, j]
                            s += acc
            out[p] = s
    return probe


def _stream_kernel(nb):
    @nb.njit(parallel=True, nogil=True)
    def stream(a):
        s = 0.0
        for i in nb.prange(a.shape[0]):
            s += a[i]
        return s
    return stream


def _for_seconds(fn, seconds):
    """``(calls, wall s a call, CPU s a call, machine)`` of ``fn`` called for about ``seconds``; ``machine``:
    the shares of the whole machine's CPU time that were busy and stolen meanwhile (``/proc/stat``: a virtual
    machine's CPU that the host ran something else on counts as stolen, not in any process's CPU time)."""
    from mpiml.bench.ml_cpu import _jiffies, _shares   # the benchmark's own reading of /proc/stat

    j0 = _jiffies()
    calls, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        calls += 1
        w = time.perf_counter() - t0
        if w >= seconds:
            machine = _shares(j0, _jiffies())
            return calls, round(w / calls, 5), round((time.process_time() - c0) / calls, 5), machine


def _kmeans_step(rows, seed, comm, k=16):
    """One rank's k-means data (``rows`` x 32, ``k`` blobs), its first ``k`` rows as centres, and a Lloyd step on
    them (:func:`mpiml.cluster._kmeans_cpu.lloyd_step`, the packed sums zeroed first): ``(X, C, step)``."""
    from mpiml import datasets
    from mpiml.cluster import _kmeans_cpu

    X, _ = datasets.make_blobs(int(rows), 32, centers=k, random_state=seed, comm=comm)
    X = np.ascontiguousarray(X)
    C = np.ascontiguousarray(X[:k])
    labels = np.zeros(X.shape[0], dtype=np.int32)
    packed = np.zeros(k * 32 + k + 2)

    def step():
        packed[:] = 0
        _kmeans_cpu.lloyd_step(X, None, None, C, labels, None, packed)

    return X, C, step


def _knn_data(rows, queries, seeds, comm):
    """One rank's k-NN index (``rows`` x 32, 32 blobs) and ``queries`` queries, drawn with ``seeds``."""
    from mpiml import datasets

    X, _ = datasets.make_blobs(int(rows), 32, centers=32, random_state=seeds[0], comm=comm)
    Q, _ = datasets.make_blobs(queries, 32, centers=32, random_state=seeds[1], comm=comm)
    return np.ascontiguousarray(X), np.ascontiguousarray(Q)


def _child(args):
    """One copy of ``--procs``: its own data, each part after the barrier, for ``--seconds``."""
    import mpiml
    from mpiml.bench.ml_cpu import _file_barrier
    from mpiml.comm import get_comm
    from mpiml.utils._jit import numba

    mpiml.init(device="cpu")
    nb = numba()
    comm = get_comm("self")
    i, procs = args.child, args.procs
    parts = args.parts.split(",")
    out = {"index": i, "pid": os.getpid(), "threads": nb.get_num_threads(), "results": {}}
    if "stream" in parts:
        a = np.random.default_rng(i).random(int(args.stream_mb * 2 ** 20 // 8))
        stream = _stream_kernel(nb)
        stream(a)
        if _file_barrier(args.child_dir, "stream", i, procs, timeout=120.0):
            calls, w, c, m = _for_seconds(lambda: stream(a), args.seconds)
            out["results"]["stream"] = {"calls": calls, "wall": w, "cpu": c, "GBps": round(a.nbytes / w / 1e9, 2),
                                        "machine": m}
    if "kmeans" in parts:
        X, _, step = _kmeans_step(args.rows, i, comm, k=args.k)
        step()
        if _file_barrier(args.child_dir, "kmeans", i, procs, timeout=120.0):
            calls, w, c, m = _for_seconds(step, args.seconds)
            out["results"]["kmeans_step"] = {"calls": calls, "wall": w, "cpu": c,
                                             "GBps": round(X.nbytes / w / 1e9, 2), "machine": m}
    if "knn" in parts:
        from mpiml.neighbors import _cpu

        X, Q = _knn_data(args.knn_rows, args.queries, (100 + i, 200 + i), comm)
        _cpu.topk(Q[:64], X, 10)
        if _file_barrier(args.child_dir, "knn", i, procs, timeout=120.0):
            calls, w, c, m = _for_seconds(lambda: _cpu.topk(Q, X, 10), args.seconds)
            out["results"]["knn"] = {"calls": calls, "wall": w, "cpu": c, "machine": m}
    with open(os.path.join(args.child_dir, f"child{i}.json"), "w") as f:
        json.dump(out, f)
    return 0


def _side_by_side(args, argv):
    """``--procs N`` copies of :func:`_child` at ``--threads`` threads each; their numbers and a summary."""
    import subprocess
    import tempfile

    threads = int(args.threads.split(",")[0])
    env = dict(os.environ)
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[v] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), *argv]
        kids = [subprocess.Popen(cmd + ["--child", str(i), "--child-dir", tmp], env=env) for i in range(args.procs)]
        codes = [k.wait() for k in kids]
        runs = []
        for i in range(args.procs):
            path = os.path.join(tmp, f"child{i}.json")
            if os.path.exists(path):
                with open(path) as f:
                    runs.append(json.load(f))
    summary = {}
    for part in ("stream", "kmeans_step", "knn"):
        got = [r["results"][part] for r in runs if part in r["results"]]
        if got:
            summary[part] = {k: {"median": float(np.median([g[k] for g in got])), "max": max(g[k] for g in got),
                                 "min": min(g[k] for g in got)} for k in got[0] if k not in ("calls", "machine")}
            # threads of this part running on average: CPU seconds over wall seconds, summed over the copies
            summary[part]["threads_running"] = round(sum(g["cpu"] / g["wall"] for g in got), 2)
            machine = [g["machine"] for g in got if g.get("machine")]
            if machine:
                summary[part]["machine"] = {k: float(np.median([m[k] for m in machine])) for k in machine[0]}
            if "GBps" in got[0]:
                summary[part]["GBps_total"] = round(sum(g["GBps"] for g in got), 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = {"procs": args.procs, "threads": threads, "cores": cores, "argv": argv, "exit_codes": codes,
           "summary": summary, "copies": runs}
    print(json.dumps({k: v for k, v in out.items() if k != "copies"}, indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(c == 0 for c in codes) else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,8,64")
    p.add_argument("--rows", type=float, default=2.5e5, help="KMeans rows (one rank's share)")
    p.add_argument("--k", type=int, default=16, help="--procs: KMeans clusters of the Lloyd step")
    p.add_argument("--rf-rows", type=float, default=2e5)
    p.add_argument("--trees", default="4,32", help="forest sizes to fit")
    p.add_argument("--knn-rows", type=float, default=2e5)
    p.add_argument("--queries", type=int, default=2500)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--parts", default="probe,kmeans,rf,knn")
    p.add_argument("--peers", action="store_true", help="also scikit-learn and scikit-learn-intelex at each count")
    p.add_argument("--out", default=None)
    p.add_argument("--procs", type=int, default=None, help="copies side by side, 1 or more (see the module notes)")
    p.add_argument("--seconds", type=float, default=2.0, help="--procs: seconds of each part")
    p.add_argument("--stream-mb", type=float, default=256, help="--procs: MiB streamed by each copy")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return _child(args)
    if args.procs is not None:
        if args.parts == "probe,kmeans,rf,knn":
            args.parts = "stream,kmeans,knn"
            argv = argv + ["--parts", args.parts]
        return _side_by_side(args, argv)
    import mpiml
    from mpiml import datasets
    from mpiml.comm import get_comm
    from mpiml.utils._threads import limit_threads

    mpiml.init(device="cpu")
    limit_threads()
    from threadpoolctl import threadpool_info

    from mpiml.utils._jit import numba

    nb = numba()
    comm = get_comm("self")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = [min(int(t), cores) for t in args.threads.split(",") if t]
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        import llvmlite.binding as llvm

        target = llvm.get_host_cpu_name()
    except Exception as exc:  # noqa: BLE001 - only a label
        target = f"? ({exc})"
    out = {"cores": cores, "cpu": model, "llvm_target": target, "threads": threads, "argv": sys.argv[1:],
           "numba": nb.__version__,
           "numba_threads": int(nb.config.NUMBA_NUM_THREADS), "numba_layer_requested": nb.config.THREADING_LAYER,
           "pools": [{k: v for k, v in pi.items() if k in ("internal_api", "num_threads", "filepath", "version")}
                     for pi in threadpool_info()], "results": {}}
    parts = args.parts.split(",")
    res = out["results"]
    if "probe" in parts:   # Numba's threads alone: a compute-bound loop, then the same with a BLAS call per block
        probe = _probe_kernel(nb)
        Xp = np.random.default_rng(0).random((400000, 32))
        CT = np.random.default_rng(1).random((32, 16))
        o = np.zeros(256)
        from mpiml.utils._threads import one_blas_thread

        for t in threads:
            with _set_threads(t):
                for blas in (False, True):
                    def run():
                        with one_blas_thread():
                            probe(Xp, 256, o, blas, CT)
                    res[f"probe_{'blas' if blas else 'loops'}_T{t}"] = _best(run, args.repeat)
            print(t, "probe loops", res[f"probe_loops_T{t}"], "blas", res[f"probe_blas_T{t}"], flush=True)
    if "kmeans" in parts:
        from mpiml.cluster import KMeans

        X, C, step = _kmeans_step(args.rows, 0, comm)

        def fit():
            KMeans(16, init=C, n_init=1, max_iter=20, tol=0.0).fit(X)

        def peer(lib):
            mod = __import__(f"{lib}.cluster", fromlist=["KMeans"])
            return lambda: mod.KMeans(16, init=C, n_init=1, max_iter=20, tol=0.0).fit(X)

        for t in threads:
            with _set_threads(t):
                res[f"kmeans_step_T{t}"] = _best(step, args.repeat)
                res[f"kmeans_fit20_T{t}"] = _best(fit, args.repeat)
                if args.peers:
                    _peers("kmeans_fit20", t, peer, args.repeat, res)
            print(t, "kmeans step", res[f"kmeans_step_T{t}"], "fit", res[f"kmeans_fit20_T{t}"],
                  {k: v for k, v in res.items() if k.startswith("kmeans_fit20_sk") and k.endswith(f"_T{t}")}, flush=True)
    if "rf" in parts:
        from mpiml.ensemble import RandomForestClassifier

        X, y = datasets.make_classification(int(args.rf_rows), 32, n_informative=16, n_redundant=0, random_state=0,
                                            comm=comm)
        X, y = np.asarray(X), np.asarray(y)
        for trees in [int(t) for t in args.trees.split(",")]:
            for t in threads:
                est = RandomForestClassifier(trees, random_state=0)

                def peer(lib):
                    mod = __import__(f"{lib}.ensemble", fromlist=["RandomForestClassifier"])
                    return lambda: mod.RandomForestClassifier(trees, random_state=0, n_jobs=t).fit(X, y)

                with _set_threads(t):
                    res[f"rf{trees}_T{t}"] = _best(lambda: est.fit(X, y), args.repeat)
                    if args.peers and trees == min(int(v) for v in args.trees.split(",")):
                        _peers(f"rf{trees}", t, peer, args.repeat, res)
                st = {k: round(v, 4) for k, v in est._fit_stats.items() if k.endswith("_s")}
                res[f"rf{trees}_T{t}_phases"] = st
                print(t, f"rf {trees} trees", res[f"rf{trees}_T{t}"], st, flush=True)
    if "knn" in parts:
        from mpiml.neighbors import _cpu

        X, Q = _knn_data(args.knn_rows, args.queries, (1, 2), comm)

        def peer(lib):
            mod = __import__(f"{lib}.neighbors", fromlist=["NearestNeighbors"])
            return lambda: mod.NearestNeighbors(n_neighbors=10, algorithm="brute").fit(X).kneighbors(Q)

        for t in threads:
            with _set_threads(t):
                res[f"knn_T{t}"] = _best(lambda: _cpu.topk(Q, X, 10), args.repeat)
                if args.peers:
                    _peers("knn", t, peer, args.repeat, res)
            print(t, "knn", res[f"knn_T{t}"], {k: v for k, v in res.items() if k.startswith("knn_sk") and
                                                k.endswith(f"_T{t}")}, flush=True)
    out["numba_layer_used"] = nb.threading_layer()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "results"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

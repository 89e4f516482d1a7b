"""Compile (or load) the CPU kernels of some families once, before a test session's first test.

With an empty Numba cache, the test process compiled each kernel at its first single-process test (scikit-learn's
estimator checks meet many argument types: float32, read-only memory maps), and the ranks of a launch compiled
the kernels they met first (the neighbours' read-only rows of a node's shared windows are met only on several
ranks), one compile after another on a machine whose other cores were idle.  ``tests/conftest.py`` runs this
script before the session's first test (``python _warm_kernels.py FAMILY...``; the families whose multi-rank
tests the session holds, see its ``WARM_FAMILIES``, spread over one process per core).  It fits the families'
CPU estimators on a few rows of each dtype (and calls the neighbours' kernels with the argument types only
several ranks make), which writes the kernels into the cache every later process reads
(:mod:`mpiml.utils._jit`: the same environment, so the same folder).  A kernel it misses is compiled where it
is met, as before; with a warm cache it only loads them (about 2 s for every family).
"""

import sys
import time
import warnings

import numpy as np


def _data(dtype, rows=300):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, 6)).astype(dtype)
    return X, (X[:, 0] > 0).astype(np.int64), X[:, 1].copy()


def kmeans(dtype, comm):
    from mpiml.cluster import KMeans

    X, _, _ = _data(dtype)
    yield "KMeans", lambda: KMeans(3, n_init=1, random_state=0, comm=comm).fit(X).predict(X)


def neighbors(dtype, comm):
    from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors

    X, y, yr = _data(dtype)
    for metric in ("euclidean", "manhattan", "cosine"):
        yield f"NearestNeighbors {metric}", lambda m=metric: NearestNeighbors(n_neighbors=4, metric=m, comm=comm) \
            .fit(X).kneighbors(X[:20])
    yield "KNeighborsClassifier", lambda: KNeighborsClassifier(3, comm=comm).fit(X, y).predict(X[:20])
    yield "KNeighborsRegressor", lambda: KNeighborsRegressor(3, comm=comm).fit(X, yr).predict(X[:20])


def neighbors_read_only(dtype, comm):
    if dtype == np.float64:
        X, _, yr = _data(dtype)
        yield "read-only blocks", lambda: _neighbors_read_only(X, yr)


def _neighbors_read_only(X, y):
    """The kernels' argument types that several ranks on a node meet and one process's fits do not: read-only
    query or index rows (a shared window's), a read-only payload, the float64 screen."""
    import os

    from mpiml.neighbors import _cpu

    def ro(a):
        a = a.copy()
        a.setflags(write=False)
        return a

    Q, R = X[:20], X[20:]
    for q, r in ((Q, ro(R)), (ro(Q), R), (ro(Q), ro(R))):
        for metric in ("euclidean", "manhattan"):
            _cpu.merge_block(q, r, 0, *_cpu.new_lists(q.shape[0], 3), metric)
    before = _cpu.new_lists(Q.shape[0], 3)[1]
    after = _cpu.merge_block(Q, R, 0, *_cpu.new_lists(Q.shape[0], 3))[1]
    _cpu.carry_payload(before, np.zeros((Q.shape[0], 3, 1)), after, 0, ro(y[20:, None]))
    saved = os.environ.get("MPIML_KNN_SCREEN")
    os.environ["MPIML_KNN_SCREEN"] = "float64"
    try:
        _cpu.merge_block(Q, R, 0, *_cpu.new_lists(Q.shape[0], 3))
    finally:
        os.environ.pop("MPIML_KNN_SCREEN") if saved is None else os.environ.__setitem__("MPIML_KNN_SCREEN", saved)


def forest(dtype, comm):
    from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

    X, y, yr = _data(dtype)
    yield "RandomForestClassifier", lambda: RandomForestClassifier(3, max_depth=4, random_state=0, comm=comm) \
        .fit(X, y).predict(X)
    yield "RandomForestRegressor", lambda: RandomForestRegressor(3, max_depth=4, random_state=0, comm=comm) \
        .fit(X, yr).predict(X)


def linear(dtype, comm):
    from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

    # the host kernels read shards of 2^16 values or more (_lsq_direct, _logistic_loss)
    B, yb, yr = _data(dtype, rows=12_000)
    w = np.random.default_rng(1).random(B.shape[0])
    yield "LinearRegression", lambda: LinearRegression(comm=comm).fit(B, yr)
    yield "weighted Ridge", lambda: Ridge(comm=comm).fit(B, yr, sample_weight=w)
    yield "LogisticRegression", lambda: LogisticRegression(comm=comm).fit(B, yb)
    yield "multinomial", lambda: LogisticRegression(comm=comm).fit(B, yb + (B[:, 1] > 0))
    if dtype == np.float64:
        X, y, _ = _data(dtype)
        yield "liblinear", lambda: LogisticRegression(solver="liblinear", dual=True, comm=comm).fit(X, y)
        yield "the small algebra", _compiled_algebra


def _compiled_algebra():
    from mpiml.linear_model._lsq_direct import wait_compiled_algebra

    if not wait_compiled_algebra(timeout=300):
        raise RuntimeError("not ready in 300 s")


#: The families, each of its own kernels (or of its own argument types: ``neighbors_read_only``), so that
#: processes warming different families write different cache entries.
FAMILIES = {"kmeans": kmeans, "neighbors": neighbors, "neighbors_read_only": neighbors_read_only, "forest": forest,
            "linear": linear}


def main(families):
    """Warm ``families`` in that order (a line ``warmed FAMILY SECONDS`` each)."""
    from mpiml.comm import get_comm

    comm = get_comm("self")
    failed = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family in families:
            t0 = time.perf_counter()
            for dtype in (np.float64, np.float32):
                for name, fit in FAMILIES[family](dtype, comm):
                    try:
                        fit()
                    except Exception as exc:  # noqa: BLE001 - a warm-up that fails leaves that compile to the ranks
                        failed.append(f"{name} {np.dtype(dtype)}: {type(exc).__name__}: {exc}")
            print(f"warmed {family} {time.perf_counter() - t0:.1f} s", flush=True)
    for f in failed:
        print(f"failed: {f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or sorted(FAMILIES)))

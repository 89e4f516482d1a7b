"""Dask-driven estimators checked from a client under ``python -m mpiml.dask`` (test_estimators.py).

``_estimator_app.py OUT.json [cupy]`` fits ``mpiml.dask.cluster.KMeans`` on dask
arrays whose blocks sit on chosen workers, compares every result with the SPMD
estimator run in this process on the same rows, runs a Hyperband search of
mpiml's KMeans on the MPI workers, and writes the failed checks (none: pass) as JSON.
"""

import json
import sys

import numpy as np

import dask
import dask.array as da
from sklearn.base import clone

from mpiml.base import SPMDEstimator
from mpiml.cluster import KMeans as SPMDKMeans
from mpiml.dask import DaskSPMDEstimator, get_client, worker_addresses
from mpiml.dask.cluster import KMeans
from mpiml.dask.model_selection import HyperbandSearchCV

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def close(a, b, msg, rtol=1e-10):
    a, b = np.asarray(to_host(a)), np.asarray(to_host(b))
    check(a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=1e-12), f"{msg}: {a.ravel()[:4]} != {b.ravel()[:4]}")


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def placed(client, blocks, owners, xp):
    """A dask array whose block i is on worker owners[i] (concatenated in order)."""
    parts = []
    for block, worker in zip(blocks, owners):
        [fut] = client.scatter([xp.asarray(block)], workers=[worker])
        parts.append(da.from_delayed(fut, shape=block.shape, dtype=block.dtype, meta=xp.asarray(block[:0])))
    return da.concatenate(parts, axis=0)


class ShardedNN(SPMDEstimator):
    """A brute-force k-nearest-neighbours whose index stays sharded over the ranks (a test model)."""

    def __init__(self, n_neighbors=3, *, comm=None):
        self.n_neighbors = n_neighbors
        self.comm = comm

    def fit(self, X, y=None):
        comm = self._get_comm()
        counts = comm.allgather_obj(len(X))
        self._fit_X = np.asarray(X)
        self._offset = int(sum(counts[:comm.rank]))
        self.n_samples_fit_ = int(sum(counts))
        return self

    def kneighbors(self, X, n_neighbors=None):
        comm = self._get_comm()
        k = n_neighbors or self.n_neighbors
        queries = comm.allgather_obj(np.asarray(X))
        Q = np.concatenate(queries)
        d = np.sqrt(((Q[:, None, :] - self._fit_X[None]) ** 2).sum(-1))
        idx = np.argsort(d, axis=1, kind="stable")[:, :k]
        found = comm.allgather_obj((np.take_along_axis(d, idx, 1), idx + self._offset))
        D = np.concatenate([f[0] for f in found], axis=1)
        Id = np.concatenate([f[1] for f in found], axis=1)
        order = np.lexsort((Id, D))[:, :k]
        start = sum(len(q) for q in queries[:comm.rank])
        rows = slice(start, start + len(X))
        return np.take_along_axis(D, order, 1)[rows], np.take_along_axis(Id, order, 1)[rows]


    def score(self, X, y=None):
        """Minus the mean distance to the nearest neighbour, over every rank's queries (global)."""
        dist, _ = self.kneighbors(X, n_neighbors=1)
        total = self._get_comm().allgather_obj((float(dist.sum()), len(dist)))
        return -sum(t[0] for t in total) / sum(t[1] for t in total)


class DaskShardedNN(DaskSPMDEstimator, spmd=ShardedNN):
    _sharded = True
    _query_methods = ("kneighbors",)
    _local_attributes = ("_fit_X",)


def check_sharded(client, workers, Xn, blocks, sizes):
    """A model whose fitted state stays sharded: fit keeps it on the workers, queries go to them."""
    from sklearn.neighbors import NearestNeighbors

    ref = NearestNeighbors(n_neighbors=4, algorithm="brute").fit(Xn)
    rng = np.random.default_rng(5)
    Qn = rng.normal(size=(300, Xn.shape[1]))
    want_d, want_i = ref.kneighbors(Qn)
    for name, owners in (("index on both workers", [workers[1], workers[1], workers[0], workers[0], workers[0]]),
                         ("index on one worker", [workers[0]] * 5)):
        X = placed(client, blocks, owners, np)
        nn = DaskShardedNN(n_neighbors=4).fit(X)
        check(nn.n_samples_fit_ == len(Xn) and not hasattr(nn.spmd_estimator_, "_fit_X"), f"{name}: shards")
        # query blocks on the other worker too (sent to the index's workers)
        Q = placed(client, [Qn[:100], Qn[100:250], Qn[250:]], [workers[1], workers[0], workers[1]], np)
        dist, ind = nn.kneighbors(Q)
        check(ind.chunks[0] == (100, 150, 50), f"{name}: query blocks {ind.chunks}")
        close(dist.compute(), want_d, f"{name}: kneighbors distances")
        check(np.array_equal(ind.compute(), want_i), f"{name}: kneighbors indices")
        close(nn.score(Q), -want_d[:, 0].mean(), f"{name}: score")


def main(out, array_lib="numpy"):
    xp = np if array_lib == "numpy" else __import__("cupy")
    client = get_client()
    workers = worker_addresses(client)
    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(2600, 5))
    Xn[:900] += 4.0
    Xn[900:1500] -= 3.0
    init = Xn[[0, 1000, 2000, 5]].copy()
    sizes = [400, 700, 300, 600, 600]
    bounds = np.cumsum([0] + sizes)
    blocks = [Xn[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    # blocks 0-1 on the second worker, 2-4 on the first: rank order is not block order
    X = placed(client, blocks, [workers[1], workers[1], workers[0], workers[0], workers[0]], xp)

    ref = SPMDKMeans(n_clusters=4, init=init, max_iter=100, tol=0).fit(Xn)
    km = KMeans(n_clusters=4, init=xp.asarray(init), max_iter=100, tol=0).fit(X)
    close(km.cluster_centers_, ref.cluster_centers_, "centres (two workers)")
    check(type(km.cluster_centers_) is type(xp.asarray(init)), f"centres are {type(km.cluster_centers_)}")
    check(km.n_iter_ == ref.n_iter_, f"n_iter {km.n_iter_} != {ref.n_iter_}")
    close(km.inertia_, ref.inertia_, "inertia")
    check(not hasattr(km, "labels_"), "labels_ (local to ranks) came back to the client")

    labels = km.predict(X)
    check(isinstance(labels, da.Array) and labels.chunks[0] == tuple(sizes), "predict is a lazy dask array")
    check(np.array_equal(to_host(labels.compute()), ref.predict(Xn)), "predict")
    dist = km.transform(X)
    check(dist.shape == (2600, 4), f"transform shape {dist.shape}")
    close(dist.compute(), ref.transform(Xn), "transform")
    close(km.score(X), ref.score(Xn), "score")
    check(np.array_equal(to_host(km.fit_predict(X).compute()), ref.predict(Xn)), "fit_predict")

    # one worker holds everything; the other takes part in the split without rows
    X_one = placed(client, [Xn], [workers[0]], xp)
    close(KMeans(n_clusters=4, init=xp.asarray(init), max_iter=100, tol=0).fit(X_one).cluster_centers_,
          ref.cluster_centers_, "centres (one worker holds all rows)")

    # mini-batch steps over all blocks, and sample weights
    pf = KMeans(n_clusters=4, init=xp.asarray(init)).partial_fit(X).partial_fit(X)
    pref = SPMDKMeans(n_clusters=4, init=init).partial_fit(Xn).partial_fit(Xn)
    close(pf.cluster_centers_, pref.cluster_centers_, "partial_fit x2")
    w = rng.random(2600) + 0.5
    Wd = placed(client, [w[a:b] for a, b in zip(bounds[:-1], bounds[1:])],
                [workers[1], workers[1], workers[0], workers[0], workers[0]], xp)
    wref = SPMDKMeans(n_clusters=4, init=init, max_iter=100, tol=0).fit(Xn, sample_weight=w)
    close(KMeans(n_clusters=4, init=xp.asarray(init), max_iter=100, tol=0).fit(X, sample_weight=Wd).cluster_centers_,
          wref.cluster_centers_, "sample_weight")

    if xp is np:
        import dask.dataframe as dd

        df = dd.from_dask_array(X, columns=[f"f{i}" for i in range(5)])
        close(KMeans(n_clusters=4, init=init, max_iter=100, tol=0).fit(df).cluster_centers_,
              ref.cluster_centers_, "dask dataframe input")

    # parameters are checked on the ranks; the client gets the same exception class and text
    try:
        KMeans(n_clusters=0).fit(X)
        check(False, "n_clusters=0 did not raise")
    except ValueError as exc:
        check("'n_clusters' parameter of KMeans" in str(exc), f"wrong message: {exc}")
    plain = KMeans(n_clusters=5, max_iter=7)
    check(clone(plain).get_params() == plain.get_params() and "comm" not in plain.get_params()
          and plain.set_params(tol=0.5).tol == 0.5, "clone/get_params/set_params")

    if xp is np:
        check_sharded(client, workers, Xn, blocks, sizes)

    # Hyperband over partial_fit: mpiml's KMeans on the MPI workers, one model per task
    if xp is np:
        y = da.from_array((Xn[:, 0] > 0).astype(np.int64), chunks=(tuple(sizes),))
        search = HyperbandSearchCV(SPMDKMeans(n_clusters=2, init="k-means++", random_state=0),
                                   {"n_clusters": [2, 3, 4, 5, 6]}, max_iter=9, random_state=0)
        search.fit(dask.array.from_array(Xn, chunks=(tuple(sizes), 5)), y)
        check(search.metadata_["n_models"] == 17 and search.metadata_["partial_fit_calls"] > 17,
              f"hyperband metadata {search.metadata_}")
        check(isinstance(search.best_estimator_, SPMDKMeans) and search.best_estimator_.n_steps_ >= 1,
              "hyperband best estimator")
        check(len(search.history_) == 22, f"hyperband evaluations {len(search.history_)}")

    with open(out, "w") as f:
        json.dump({"failures": failures}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Nearest neighbours on sparse (SciPy CSR) shards, run under ``mpiexec -n N`` by test_neighbors_sparse.py.

The global index and queries are the same on every rank count; each rank keeps an uneven
shard (the last rank of 3 or 4 keeps no index rows in one case).  Checked against a
reference computed on the gathered dense data (exact distances from differences, ties
to the lower global index) and against scikit-learn's neighbour sets; the sparse results
must equal mpiml's dense results for every mix of sparse and dense index and queries, and
every exchange of the ring must give identical results.  Verdicts are collective.
"""

import numpy as np
import scipy.sparse as sp
from sklearn import neighbors as sk
from sklearn.metrics import pairwise_distances

from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
EXCHANGES = ("blocking", "overlap", "onesided")


def bounds(n, skip_last=False):
    w = np.arange(1, size + 1, dtype=np.float64)
    if skip_last and size > 2:
        w[-1] = 0
    return np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])


def shard(a, skip_last=False):
    b = bounds(a.shape[0], skip_last)
    return a[b[rank]:b[rank + 1]]


def sparse_data(seed=0, n=160, d=12, density=0.35):
    rs = np.random.RandomState(seed)
    X = rs.randn(n, d) * (rs.rand(n, d) < density)
    X[100:110] = X[:10]    # exact duplicates: ties resolved to the lower global index
    X[20] = 0.0            # an empty row (cosine: distance 1 to everything)
    Q = rs.randn(40, d) * (rs.rand(40, d) < density)
    Q[:5] = X[:5]          # queries equal to indexed (duplicated) rows
    Q[7] = 0.0
    return X, Q


def reference(X, Q, k, metric):
    """Exact distances (from differences) and the neighbours by (distance, global index)."""
    if metric in ("euclidean", "sqeuclidean"):
        D = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        D = np.sqrt(D) if metric == "euclidean" else D
    else:
        D = pairwise_distances(Q, X, metric=metric)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(D, order, axis=1), order


def sklearn_sets_agree(i, X, Q, k, metric, msg):
    """Where scikit-learn's k-th distance is clear of the (k+1)-th, its neighbour set is ours."""
    if metric == "sqeuclidean":  # scikit-learn refuses sqeuclidean on sparse input: compare on dense
        ref = sk.NearestNeighbors(n_neighbors=k + 1, metric=metric, algorithm="brute").fit(X)
        d_sk, i_sk = ref.kneighbors(shard(Q))
    else:
        ref = sk.NearestNeighbors(n_neighbors=k + 1, metric=metric, algorithm="brute").fit(sp.csr_matrix(X))
        d_sk, i_sk = ref.kneighbors(sp.csr_matrix(shard(Q)))
    clear = d_sk[:, k - 1] < d_sk[:, k] * (1 - 1e-9) - 1e-7
    ok = all(set(a) == set(b) for a, b, c in zip(i.tolist(), i_sk[:, :k].tolist(), clear) if c)
    return check(ok and clear.sum() >= 0.3 * len(clear), f"{msg}: neighbour sets differ from scikit-learn's")


def check_kneighbors():
    X, Q = sparse_data()
    k = 6
    for skip_last in (False, True):
        Xl, Ql = shard(X, skip_last), shard(Q)
        Xs, Qs = sp.csr_matrix(Xl), sp.csr_matrix(Ql)
        for metric in ("euclidean", "sqeuclidean", "cosine", "manhattan"):
            d_ref, i_ref = (shard(a) for a in reference(X, Q, k, metric))
            dense = NearestNeighbors(n_neighbors=k, metric=metric).fit(Xl).kneighbors(Ql)
            tag = f"{metric} skip_last={skip_last}"
            assert_close(dense[0], d_ref, f"dense distances {tag}", rtol=1e-9, atol=1e-9)
            assert_close(dense[1], i_ref, f"dense indices {tag}", exact=True)
            results = {}
            for ex in EXCHANGES:
                nn = NearestNeighbors(n_neighbors=k, metric=metric, exchange=ex).fit(Xs)
                check(nn.n_samples_fit_ == X.shape[0], f"n_samples_fit_ {nn.n_samples_fit_}")
                check(sp.issparse(nn._shard_X), f"{tag}: the index shard was densified")
                results[ex] = nn.kneighbors(Qs)
                assert_close(results[ex][0], d_ref, f"sparse distances {tag} {ex}", rtol=1e-9, atol=1e-9)
                assert_close(results[ex][1], i_ref, f"sparse indices {tag} {ex}", exact=True)
                assert_close(results[ex][1], dense[1], f"sparse vs dense indices {tag} {ex}", exact=True)
                assert_close(results[ex][0], dense[0], f"sparse vs dense distances {tag} {ex}", rtol=1e-12,
                             atol=1e-12)
            for ex in EXCHANGES[1:]:
                assert_close(results[ex][0], results["blocking"][0], f"{tag} {ex} vs blocking", exact=True)
                assert_close(results[ex][1], results["blocking"][1], f"{tag} {ex} vs blocking idx", exact=True)
            sklearn_sets_agree(results["overlap"][1], X, Q, k, metric, tag)
            # mixed kinds: a sparse index with dense queries and a dense index with sparse queries
            for xi, qi, what in ((Xs, Ql, "sparse index, dense queries"), (Xl, Qs, "dense index, sparse queries")):
                d, i = NearestNeighbors(n_neighbors=k, metric=metric).fit(xi).kneighbors(qi)
                assert_close(d, d_ref, f"{what} distances {tag}", rtol=1e-9, atol=1e-9)
                assert_close(i, i_ref, f"{what} indices {tag}", exact=True)
        # X=None, float32, the graph and radius queries on the sparse index
        nn = NearestNeighbors(n_neighbors=4).fit(Xs)
        dd, di = NearestNeighbors(n_neighbors=4).fit(Xl).kneighbors()
        d, i = nn.kneighbors()
        assert_close(d, dd, f"X=None distances skip_last={skip_last}", rtol=1e-12, atol=1e-12)
        assert_close(i, di, f"X=None indices skip_last={skip_last}", exact=True)
        d32, i32 = NearestNeighbors(n_neighbors=4).fit(Xs.astype(np.float32)).kneighbors(Qs.astype(np.float32))
        check(d32.dtype == np.float32, f"float32 sparse distances are {d32.dtype}")
        assert_close(d32.astype(np.float64), shard(reference(X, Q, 4, "euclidean")[0]), "float32 distances",
                     rtol=1e-5, atol=1e-5)
        G = nn.kneighbors_graph(Qs, n_neighbors=3, mode="distance")
        Gd = NearestNeighbors(n_neighbors=3).fit(Xl).kneighbors_graph(Ql, mode="distance")
        assert_close(G.toarray(), Gd.toarray(), "kneighbors_graph sparse vs dense", rtol=1e-12, atol=1e-12)
        for ex in EXCHANGES:
            rd, ri = NearestNeighbors(radius=2.0, exchange=ex).fit(Xs).radius_neighbors(Qs)
            hd, hi = NearestNeighbors(radius=2.0).fit(Xl).radius_neighbors(Ql)
            ok = all(np.array_equal(a, b) for a, b in zip(ri, hi)) and all(
                np.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(rd, hd))
            check(ok and len(ri) == Ql.shape[0], f"radius_neighbors sparse vs dense {ex} skip_last={skip_last}")


def check_supervised():
    X, Q = sparse_data(1)
    y = (np.arange(X.shape[0]) * 7) % 3
    Xs, ys = sp.csr_matrix(shard(X, True)), shard(y, True)
    Qs = sp.csr_matrix(shard(Q))
    for weights in ("uniform", "distance"):
        for ex in ("blocking", "onesided"):
            clf = KNeighborsClassifier(n_neighbors=5, weights=weights, exchange=ex).fit(Xs, ys)
            host = KNeighborsClassifier(n_neighbors=5, weights=weights).fit(shard(X, True), ys)
            assert_close(clf.predict_proba(Qs), host.predict_proba(shard(Q)), f"sparse proba {weights} {ex}",
                         rtol=1e-12)
            check(np.array_equal(clf.predict(Qs), host.predict(shard(Q))), f"sparse predict {weights} {ex}")
            t = np.c_[X[:, 0] + y, X[:, 1]]
            reg = KNeighborsRegressor(n_neighbors=5, weights=weights, exchange=ex).fit(Xs, shard(t, True))
            href = KNeighborsRegressor(n_neighbors=5, weights=weights).fit(shard(X, True), shard(t, True))
            assert_close(reg.predict(Qs), href.predict(shard(Q)), f"sparse regress {weights} {ex}", rtol=1e-10)
            s = reg.score(sp.csr_matrix(shard(X)), shard(t))
            check(abs(s - href.score(shard(X), shard(t))) < 1e-10, f"sparse r2 {weights} {ex}")


def check_errors():
    X, Q = sparse_data(2)
    Xs = sp.csr_matrix(shard(X))
    # scikit-learn's refusal of a metric it cannot compute on sparse rows, on every rank
    for metric in ("chebyshev", "minkowski"):
        try:
            NearestNeighbors(metric=metric, p=3).fit(Xs)
            msg = None
        except ValueError as exc:
            msg = str(exc)
        msgs = comm.allgather_obj(msg)
        check(msg is not None and "not valid for sparse input" in msg, f"{metric} on sparse rows: {msg!r}")
        check(len(set(msgs)) == 1, f"{metric} on sparse rows: ranks disagree {msgs}")
    if size > 1:
        # a sparse shard on one rank and dense shards elsewhere: one clear error everywhere
        mixed = Xs if rank == 0 else shard(X)
        try:
            NearestNeighbors().fit(mixed)
            msg = None
        except DistributedInputError as exc:
            msg = str(exc)
        msgs = comm.allgather_obj(msg)
        check(msg is not None and "sparse on rank(s) [0]" in msg and len(set(msgs)) == 1,
              f"mixed sparse/dense index: {msgs}")
    # still usable afterwards (no rank left behind)
    d, _ = NearestNeighbors(n_neighbors=3).fit(Xs).kneighbors(sp.csr_matrix(shard(Q)))
    check(d.shape == (shard(Q).shape[0], 3), "usable after errors")


def main():
    check_kneighbors()
    check_supervised()
    check_errors()


if __name__ == "__main__":   # (else one case of a shared launch: _neighbors_launches.py)
    guarded(main, comm)

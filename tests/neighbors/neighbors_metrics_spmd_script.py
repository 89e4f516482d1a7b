"""The rarer neighbour metrics on N ranks, run under ``mpiexec -n N`` by test_neighbors_metrics.py.

Every rank builds the same data, keeps an uneven shard of the index and of the queries
(the last rank of 3 or 4 keeps no index rows), and compares with scikit-learn on the
whole data: the same neighbours (global indices) and distances, and radius results.
Usage: neighbors_metrics_spmd_script.py
"""

import numpy as np
from sklearn import neighbors as sk
from sklearn.metrics import DistanceMetric

from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsRegressor, NearestNeighbors

from _spmd import assert_close, check, guarded, uneven_shard

comm = get_comm()
rank, size = comm.rank, comm.size


def shard(a, skip_last=False):
    return uneven_shard(a, rank, size, skip_last)


def main():
    rng = np.random.RandomState(0)
    X, Q = rng.rand(90, 5), rng.rand(20, 5)
    cases = [("braycurtis", None), ("canberra", None), ("seuclidean", {"V": rng.rand(5) + 0.5}),
             ("mahalanobis", {"VI": np.diag(rng.rand(5) + 0.5)}), ("minkowski", {"w": rng.rand(5), "p": 3}),
             (DistanceMetric.get_metric("chebyshev"), None), (lambda a, b: float(np.abs(a - b).sum() ** 0.5), None)]
    for metric, params in cases:
        label = f"metric {metric!r}"
        ref = sk.NearestNeighbors(n_neighbors=4, metric=metric, metric_params=params, algorithm="brute").fit(X)
        ours = NearestNeighbors(n_neighbors=4, metric=metric, metric_params=params).fit(shard(X, True))
        d, i = ours.kneighbors(shard(Q))
        d_ref, i_ref = ref.kneighbors(shard(Q))
        assert_close(i, i_ref, f"{label}: indices", exact=True)
        assert_close(d, d_ref, f"{label}: distances", rtol=1e-10, atol=1e-12)
        r = float(np.median(d_ref[:, -1])) if d_ref.size else 1.0
        r = comm.allreduce_obj(r) / size if size > 1 else r
        rd, ri = ours.radius_neighbors(shard(Q), radius=r, sort_results=True)
        D = ref.kneighbors(shard(Q), n_neighbors=X.shape[0])
        for row in range(len(ri)):
            want = np.sort(D[1][row][D[0][row] <= r])
            check(np.array_equal(np.sort(ri[row]), want), f"{label}: radius neighbours of query {row}")
    # metric="precomputed": each rank holds its rows of the distance matrices
    from sklearn.metrics import pairwise_distances

    D, DQ = pairwise_distances(X), pairwise_distances(Q, X)
    ref = sk.NearestNeighbors(n_neighbors=4, metric="precomputed").fit(D)
    ours = NearestNeighbors(n_neighbors=4, metric="precomputed").fit(shard(D))
    assert_close(ours.kneighbors(shard(DQ))[1], ref.kneighbors(shard(DQ))[1], "precomputed: indices", exact=True)
    assert_close(ours.kneighbors()[1], shard(ref.kneighbors()[1]), "precomputed, X=None: indices", exact=True)
    y = X @ np.arange(5.0)
    reg = KNeighborsRegressor(n_neighbors=3, metric="canberra", weights="distance").fit(shard(X, True), shard(y, True))
    ref = sk.KNeighborsRegressor(n_neighbors=3, metric="canberra", weights="distance").fit(X, y)
    assert_close(reg.predict(shard(Q)), ref.predict(shard(Q)), "regressor with canberra", rtol=1e-10)


if __name__ == "__main__":   # (else one case of a shared launch: _neighbors_launches.py)
    guarded(main, comm)

"""Multi-rank nearest-neighbour checks, run under ``mpiexec -n N`` by test_neighbors_mpi.py.

Every rank builds the same global index and queries, keeps an uneven shard of both
(the last rank of 3 or 4 keeps no index rows in one case), and compares with
scikit-learn's brute force on the whole data: distances within rounding, neighbour
indices equal (global index = rows of lower ranks + local index), with constructed
exact ties (duplicated rows) resolved to the lower global index.  Every exchange
variant must give identical results.  Verdicts are collective (tests/_spmd.py).
"""

import os
import tempfile

import numpy as np
from sklearn import neighbors as sk
from sklearn.metrics import pairwise_distances

import mpiml
from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors, _node, _ring

from _spmd import assert_close, check, guarded, uneven_bounds, uneven_shard

comm = get_comm()
rank, size = comm.rank, comm.size
#: the ring's three exchanges, the local search (every rank's queries against each shard) and the gathered
#: index (CPU ranks: in node memory, the ranks' threads taking query blocks from one counter; or copied to each)
EXCHANGES = ("blocking", "overlap", "onesided", "local", "gather", "gather_copy")


def pin(variant):
    """The ``exchange`` parameter of ``variant``; pins the search strategy it names."""
    _node.SHARED = variant != "gather_copy"
    _ring.STRATEGY = "gather" if variant.startswith("gather") else "local" if variant == "local" else "ring"
    return variant if variant in ("blocking", "overlap", "onesided") else "overlap"


def bounds(n, skip_last=False):
    return uneven_bounds(n, size, skip_last)


def shard(a, skip_last=False):
    return uneven_shard(a, rank, size, skip_last)


def expect_error(fn, cls, needle, msg):
    try:
        fn()
    except cls as exc:
        check(needle in str(exc), f"{msg}: message {str(exc)!r} lacks {needle!r}")
        return
    except Exception as exc:  # noqa: BLE001
        check(False, f"{msg}: raised {type(exc).__name__}: {exc}")
        return
    check(False, f"{msg}: no error")


def data(seed=0, n=150, d=6):
    rs = np.random.RandomState(seed)
    X = rs.randn(n, d)
    X[100:110] = X[:10]          # exact duplicates: ties at distance 0 and equal distances to any query
    Q = rs.randn(40, d)
    Q[:5] = X[:5]                # queries on indexed (duplicated) rows
    y = rs.randint(0, 4, n)
    return X, Q, y


def reference(X, Q, k, metric, exclude_self=False):
    """scikit-learn's distances, and the neighbours ordered by (distance, global index).

    scikit-learn's own ``kneighbors`` does not promise the lower index first among exact
    ties (duplicated rows), so indices are compared with a stable sort of
    ``sklearn.metrics.pairwise_distances``; distances with ``kneighbors`` itself.
    """
    ref = sk.NearestNeighbors(n_neighbors=k, metric=metric, algorithm="brute").fit(X)
    _, i_sk = ref.kneighbors(None if exclude_self else Q)
    A = X if exclude_self else Q
    if metric in ("euclidean", "sqeuclidean"):
        # from the differences, not scikit-learn's |a|^2 - 2ab + |b|^2, whose cancellation leaves
        # up to ~6e-8 where the distance is 0 (duplicated rows): ours are exact there
        D = ((A[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        D = np.sqrt(D) if metric == "euclidean" else D
    else:
        D = pairwise_distances(A, X, metric=metric)
    if exclude_self:
        np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")
    Ds = np.take_along_axis(D, order[:, :k + 1], axis=1)
    clear = Ds[:, k - 1] < Ds[:, k] * (1 - 1e-9) - 1e-12  # no exact (or near) tie across the k-th place
    return Ds[:, :k], order[:, :k], np.where(clear[:, None], i_sk, -1)


def same_sets_where_no_boundary_tie(i, i_sk, msg):
    """Where the k-th distance is not tied with a later one, scikit-learn's neighbour set is ours."""
    rows = [(a, b) for a, b in zip(i.tolist(), i_sk.tolist()) if b[0] != -1]
    ok = all(set(a) == set(b) for a, b in rows)
    return check(ok and len(rows) >= 0.5 * i.shape[0], f"{msg}: neighbour sets differ from scikit-learn's")


def check_kneighbors():
    X, Q, _ = data()
    for skip_last in (False, True):
        Xl, Ql = shard(X, skip_last), shard(Q)
        for metric in ("euclidean", "sqeuclidean", "cosine", "manhattan"):
            d_ref, i_ref, i_sk = (shard(a) for a in reference(X, Q, 7, metric))
            results = {}
            for ex in EXCHANGES:
                nn = NearestNeighbors(n_neighbors=7, metric=metric, exchange=pin(ex)).fit(Xl)
                check(nn.n_samples_fit_ == X.shape[0], f"n_samples_fit_ {nn.n_samples_fit_}")
                results[ex] = nn.kneighbors(Ql)
                tag = f"{metric} {ex} skip_last={skip_last}"
                assert_close(results[ex][0], d_ref, f"distances {tag}", rtol=1e-9, atol=1e-9)
                assert_close(results[ex][1], i_ref, f"indices {tag}", exact=True)
                same_sets_where_no_boundary_tie(results[ex][1], i_sk, tag)
            for ex in EXCHANGES[1:]:
                assert_close(results[ex][0], results["blocking"][0], f"{metric} {ex} vs blocking", exact=True)
                assert_close(results[ex][1], results["blocking"][1], f"{metric} {ex} vs blocking idx", exact=True)
        # X=None: every index row queries the global index without itself
        nn = NearestNeighbors(n_neighbors=4).fit(Xl)
        d_ref, i_ref, _ = reference(X, None, 4, "euclidean", exclude_self=True)
        b = bounds(X.shape[0], skip_last)
        d, i = nn.kneighbors()
        assert_close(d, d_ref[b[rank]:b[rank + 1]], f"X=None distances skip_last={skip_last}", rtol=1e-9, atol=1e-9)
        assert_close(i, i_ref[b[rank]:b[rank + 1]], f"X=None indices skip_last={skip_last}", exact=True)
        # graph
        G = nn.kneighbors_graph(Ql, n_neighbors=3, mode="distance").toarray()
        Gr = sk.NearestNeighbors(n_neighbors=3, algorithm="brute").fit(X).kneighbors_graph(shard(Q), mode="distance")
        # scikit-learn's distances carry up to ~6e-8 of cancellation where they are 0
        assert_close(G, Gr.toarray(), "kneighbors_graph", rtol=1e-9, atol=1e-7)
        for ex in EXCHANGES[:4]:  # (the radius search has no gathered form)
            rn = NearestNeighbors(radius=2.5, exchange=pin(ex)).fit(Xl)
            rd, ri = rn.radius_neighbors(Ql, sort_results=True)
            Dq = np.sqrt(pairwise_distances(shard(Q), X, metric="sqeuclidean"))
            ok = len(ri) == Ql.shape[0]
            for r in range(len(ri)):
                want = np.flatnonzero(Dq[r] <= 2.5)
                want = want[np.lexsort((want, Dq[r][want]))]
                ok &= np.array_equal(ri[r], want) and np.allclose(rd[r], Dq[r][want], rtol=1e-9, atol=1e-9)
            check(ok, f"radius_neighbors {ex} skip_last={skip_last}")
        rd, ri = NearestNeighbors(radius=2.0).fit(Xl).radius_neighbors()
        ref_d, ref_i = sk.NearestNeighbors(radius=2.0, algorithm="brute").fit(X).radius_neighbors(sort_results=True)
        b = bounds(X.shape[0], skip_last)
        check(all(set(a.tolist()) == set(c.tolist()) for a, c in zip(ri, ref_i[b[rank]:b[rank + 1]])),
              "radius_neighbors X=None")
        i_only = nn.kneighbors(Ql, n_neighbors=2, return_distance=False)
        check(i_only.shape == (Ql.shape[0], 2), f"return_distance=False shape {i_only.shape}")


def check_supervised():
    X, Q, y = data(1)
    labels = np.array(["ant", "bee", "cat", "dog"])[y]
    Xl, Ql, ll = shard(X, True), shard(Q), shard(labels, True)
    for weights in ("uniform", "distance"):
        ref = sk.KNeighborsClassifier(n_neighbors=5, weights=weights, algorithm="brute").fit(X, labels)
        for ex in EXCHANGES:
            clf = KNeighborsClassifier(n_neighbors=5, weights=weights, exchange=pin(ex)).fit(Xl, ll)
            check(list(clf.classes_) == ["ant", "bee", "cat", "dog"], f"classes_ {clf.classes_}")
            # weights="distance": queries on indexed rows are exact matches (distance 0) for us, ~6e-8
            # away for scikit-learn (cancellation), which weighs them 1/6e-8 instead of taking them alone
            tol = 1e-12 if weights == "uniform" else 1e-6
            assert_close(clf.predict_proba(Ql), ref.predict_proba(shard(Q)), f"proba {weights} {ex}", rtol=tol,
                         atol=0 if weights == "uniform" else 1e-6)
            check(np.array_equal(clf.predict(Ql), ref.predict(shard(Q))), f"predict {weights} {ex}")
            s = clf.score(shard(X), shard(labels))
            check(abs(s - ref.score(X, labels)) < 1e-12, f"score {s} vs {ref.score(X, labels)}")
        target = np.c_[X[:, 0] + y, X[:, 1]]
        for t in (target[:, 0], target):
            rref = sk.KNeighborsRegressor(n_neighbors=5, weights=weights, algorithm="brute").fit(X, t)
            for ex in EXCHANGES:
                reg = KNeighborsRegressor(n_neighbors=5, weights=weights, exchange=pin(ex)).fit(Xl, shard(t, True))
                assert_close(reg.predict(Ql), rref.predict(shard(Q)), f"regress {weights} {ex} {t.ndim}",
                             rtol=1e-10 if weights == "uniform" else 1e-6)
                s = reg.score(shard(X), shard(t))
                check(abs(s - rref.score(X, t)) < 1e-10, f"r2 {s} vs {rref.score(X, t)}")


def check_errors():
    X, Q, _ = data(2)
    nn = NearestNeighbors(n_neighbors=3).fit(shard(X))
    Qbad = shard(Q)
    if rank == size - 1:
        Qbad = Qbad[:, :4]
    expect_error(lambda: nn.kneighbors(Qbad), ValueError, "features", "query feature count")
    expect_error(lambda: nn.kneighbors(shard(Q), n_neighbors=X.shape[0] + 1), ValueError,
                 "n_neighbors <= n_samples_fit", "k too large")
    Xnan = shard(X).copy()
    if rank == 0 and Xnan.shape[0]:
        Xnan[0, 0] = np.nan
    expect_error(lambda: NearestNeighbors().fit(Xnan), ValueError, "NaN", "NaN in fit")
    expect_error(lambda: NearestNeighbors().fit(X[:0]), ValueError, "0 sample", "empty index on every rank")
    expect_error(lambda: NearestNeighbors(metric="bray-curtis").fit(shard(X)), ValueError, "Got 'bray-curtis' instead",
                 "unknown metric")
    Qnan = shard(Q).copy()
    if rank == size - 1 and Qnan.shape[0]:
        Qnan[0, 1] = np.nan
    expect_error(lambda: nn.kneighbors(Qnan), ValueError, "NaN", "NaN in queries")
    clf = KNeighborsClassifier(3).fit(shard(X), shard(np.arange(X.shape[0]) % 3))
    ybad = shard(np.arange(Q.shape[0]) % 3)
    if rank == 0:
        ybad = ybad[:-1]
    expect_error(lambda: clf.score(shard(Q), ybad), ValueError, "rows", "score with y too short on rank 0")
    # still usable after the errors (no rank left behind)
    d, _ = nn.kneighbors(shard(Q))
    check(d.shape == (shard(Q).shape[0], 3), "usable after errors")
    if size > 1:
        check(issubclass(DistributedInputError, ValueError), "DistributedInputError is a ValueError")
        # a sharded index cannot be written by rank 0 alone: the same clear error everywhere, nothing written
        path = os.path.join(tempfile.gettempdir(), f"mpiml_neighbors_unwritten_{os.getpid()}.mpiml")
        expect_error(lambda: mpiml.save(nn, path), Exception, "keeps its index sharded", "save of a sharded index")


def check_strategy_choice():
    # few queries against a large index: the local search; many queries against a small one: the ring
    q, x = np.full(size, 10), np.full(size, 10_000)
    want = "local" if size > 1 else "ring"
    check(_ring.choose_strategy(q, x, 32, 10, 4) == want, "few queries -> local")
    check(_ring.choose_strategy(x, q, 32, 10, 4) == "ring", "many queries -> ring")
    # CPU ranks: identical queries everywhere -> each rank its shard; distinct, spread evenly -> the ring;
    # piled on one rank or few -> the local search
    many = np.full(size, 1000)
    check(_ring.choose_host_strategy(many, x, replicated=True) == ("replicated" if size > 1 else "ring"),
          "replicated queries")
    check(_ring.choose_host_strategy(many, x) == "ring", "even queries -> ring")
    # an index that fits every rank: gathered instead of ringed (the same rows searched, no step waits)
    check(_ring.choose_host_strategy(many, x, row_bytes=256) == ("gather" if size > 1 else "ring"), "fits -> gather")
    check(_ring.choose_host_strategy(many, x * 10 ** 6, row_bytes=256) == "ring", "too big -> ring")
    if size > 1:
        check(_ring.choose_host_strategy(np.r_[4000, np.zeros(size - 1, int)], x) == "local", "piled -> local")
        check(_ring.choose_host_strategy(q, x) == "local", "few -> local")
    _ring.STRATEGY = "auto"
    X, Q, y = data(4)
    d, i = NearestNeighbors(n_neighbors=6).fit(shard(X)).kneighbors(shard(Q))
    d_ref, i_ref, _ = (shard(a) for a in reference(X, Q, 6, "euclidean"))
    assert_close(d, d_ref, "auto distances", rtol=1e-9, atol=1e-9)
    assert_close(i, i_ref, "auto indices", exact=True)
    # the same queries on every rank (the replicated search): every rank gets the whole answer
    for metric in ("euclidean", "manhattan"):
        d_all, i_all, _ = reference(X, Q, 6, metric)
        for variant in ("auto", "local"):
            _ring.STRATEGY = variant
            d, i = NearestNeighbors(n_neighbors=6, metric=metric).fit(shard(X, True)).kneighbors(Q)
            assert_close(d, d_all, f"replicated {metric} {variant} distances", rtol=1e-9, atol=1e-9)
            assert_close(i, i_all, f"replicated {metric} {variant} indices", exact=True)
    _ring.STRATEGY = "auto"
    ref = sk.KNeighborsRegressor(n_neighbors=5, weights="distance", algorithm="brute").fit(X, X[:, 0] + y)
    reg = KNeighborsRegressor(n_neighbors=5, weights="distance").fit(shard(X, True), shard(X[:, 0] + y, True))
    assert_close(reg.predict(Q), ref.predict(Q), "replicated regression", rtol=1e-6)


def check_kept_windows():
    """Searches in node memory of the same sizes reuse the last one's windows (other rows, other queries: the
    answers still exact); a search of other sizes frees them and makes new ones."""
    pin("gather")
    X1, Q1, _ = data(5)
    X2, Q2, _ = data(6)
    est = NearestNeighbors(n_neighbors=4)
    for X, Q, what in ((X1, Q1, "first"), (X2, Q2, "same sizes"), (X2[:120], Q2[:30], "other sizes"),
                       (X1[:120], Q1[:30], "same again")):
        d, i = est.fit(shard(X)).kneighbors(shard(Q))
        d_ref, i_ref, _ = (shard(a) for a in reference(X, Q, 4, "euclidean"))
        assert_close(d, d_ref, f"kept windows, {what}: distances", rtol=1e-9, atol=1e-9)
        assert_close(i, i_ref, f"kept windows, {what}: indices", exact=True)
        if size > 1 and what != "first":
            check(_node.LAST.get("reused") == what.startswith("same"), f"kept windows, {what}: {dict(_node.LAST)}")
    # no room in the node's shared memory for new windows (agreed): each rank gathers the index, the same answer
    room, _node.room_for = _node.room_for, lambda nbytes: False
    try:
        d, i = est.fit(shard(X1[:90])).kneighbors(shard(Q1[:20]))
    finally:
        _node.room_for = room
    d_ref, i_ref, _ = (shard(a) for a in reference(X1[:90], Q1[:20], 4, "euclidean"))
    assert_close(i, i_ref, "no room for windows: indices", exact=True)
    check("reused" not in _node.LAST, f"no room for windows, yet searched in node memory: {dict(_node.LAST)}")
    pin("overlap")
    _ring.STRATEGY = "auto"


def main():
    check_strategy_choice()
    check_kneighbors()
    check_supervised()
    check_errors()
    check_kept_windows()


if __name__ == "__main__":   # (else one case of a shared launch: _neighbors_launches.py)
    guarded(main, comm)

"""scikit-learn's behaviours of the neighbours estimators on several ranks (run by
test_neighbors_sklearn_behaviour.py on 3 ranks).

Every rank holds an uneven shard of the same global data; scikit-learn is fitted on the
whole.  Checks: parameter errors and their wording (raised on every rank before any
communication), fitted attributes replicated and equal to scikit-learn's, results on dense
and sparse shards equal to scikit-learn's, and errors that depend on data of one rank raised
identically on every rank.
"""

import math
import re
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn import neighbors as sk

from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors

from _spmd import assert_close, check, guarded, uneven_shard

comm = get_comm()
rank, size = comm.rank, comm.size
OURS = {"NearestNeighbors": NearestNeighbors, "KNeighborsClassifier": KNeighborsClassifier,
        "KNeighborsRegressor": KNeighborsRegressor}


def shard(a):
    return uneven_shard(a, rank, size)


def unordered_sets(message):
    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", message)


def outcome(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return exc
    return None


def agreed(exc, what, cls=Exception, contains=None, equals=None):
    """The same error class and text on every rank, of the expected class and wording."""
    text = None if exc is None else f"{type(exc).__name__}: {exc}"
    texts = comm.allgather_obj(text)
    check(exc is not None and isinstance(exc, cls), f"{what}: expected {cls.__name__}, got {text!r}")
    check(len(set(texts)) == 1, f"{what}: ranks raised different errors {texts}")
    if exc is not None and contains is not None:
        check(contains in str(exc), f"{what}: {contains!r} not in {str(exc)!r}")
    if exc is not None and equals is not None:
        check(unordered_sets(str(exc)) == unordered_sets(equals), f"{what}: {str(exc)!r} != {equals!r}")


def data(seed=0, n=90, d=6, sparse=False):
    rs = np.random.RandomState(seed)
    X = rs.rand(n, d) * ((rs.rand(n, d) < 0.6) if sparse else 1)
    Q = rs.rand(20, d) * ((rs.rand(20, d) < 0.6) if sparse else 1)
    return X, rs.randint(0, 3, n), Q


def check_parameters():
    X, y, _ = data()
    for name, cls in OURS.items():
        for params in (dict(n_neighbors=0), dict(p=-1), dict(leaf_size=0), dict(algorithm="foo"), dict(n_jobs="x")):
            ref = outcome(lambda: getattr(sk, name)(**params).fit(X, y))
            agreed(outcome(lambda: cls(**params).fit(shard(X), shard(y))), f"{name}{params}", ValueError,
                   equals=str(ref))
        for metric, p in (("minkowski", 1), ("minkowski", 2), ("minkowski", 3), ("l2", 2), ("cosine", 2)):
            est = cls(metric=metric, p=p).fit(shard(X), shard(y))
            ref = getattr(sk, name)(metric=metric, p=p).fit(X, y)
            check(est.effective_metric_ == ref.effective_metric_ and
                  est.effective_metric_params_ == ref.effective_metric_params_, f"{name} {metric} p={p} effective")
            check(est.n_samples_fit_ == ref.n_samples_fit_ and est.n_features_in_ == ref.n_features_in_,
                  f"{name} fitted sizes")


def check_results():
    for sparse in (False, True):
        X, y, Q = data(1, sparse=sparse)
        conv = sp.csr_matrix if sparse else np.asarray
        metrics = (("euclidean", 2), ("manhattan", 2), ("cosine", 2)) + (() if sparse else (("minkowski", 3),))
        for metric, p in metrics:
            ref = sk.NearestNeighbors(n_neighbors=6, metric=metric, p=p).fit(conv(X))
            d_ref, i_ref = ref.kneighbors(conv(shard(Q)))
            d, i = NearestNeighbors(n_neighbors=5, metric=metric, p=p).fit(conv(shard(X))).kneighbors(conv(shard(Q)))
            tag = f"{metric} p={p} sparse={sparse}"
            assert_close(d, d_ref[:, :5], f"distances {tag}", rtol=1e-10, atol=1e-7)
            clear = d_ref[:, 4] < d_ref[:, 5] * (1 - 1e-9) - 2e-7
            check(all(set(a) == set(b) for a, b, c in zip(i.tolist(), i_ref[:, :5].tolist(), clear) if c),
                  f"neighbour sets {tag}")
        clf = KNeighborsClassifier(n_neighbors=5, weights="distance").fit(conv(shard(X)), shard(y))
        cref = sk.KNeighborsClassifier(n_neighbors=5, weights="distance").fit(conv(X), y)
        assert_close(clf.predict_proba(conv(shard(Q))), cref.predict_proba(conv(shard(Q))), f"proba {sparse}",
                     rtol=1e-6)
        check(abs(clf.score(conv(shard(X)), shard(y)) - cref.score(conv(X), y)) < 1e-12, f"accuracy {sparse}")
        check(list(clf.classes_) == list(cref.classes_), "classes_")
        reg = KNeighborsRegressor(n_neighbors=4, weights=lambda d: 1.0 / (1.0 + d)).fit(conv(shard(X)), shard(y))
        rref = sk.KNeighborsRegressor(n_neighbors=4, weights=lambda d: 1.0 / (1.0 + d)).fit(conv(X), y)
        assert_close(reg.predict(conv(shard(Q))), rref.predict(conv(shard(Q))), f"regress {sparse}", rtol=1e-6)
        check(abs(reg.score(conv(shard(X)), shard(y)) - rref.score(conv(X), y)) < 1e-9, f"r2 {sparse}")


def check_errors():
    X, y, Q = data(2)
    nn = NearestNeighbors(n_neighbors=3).fit(shard(X))
    ref = sk.NearestNeighbors(n_neighbors=3).fit(X)
    agreed(outcome(lambda: nn.kneighbors(shard(Q), n_neighbors=0)), "k = 0", ValueError,
           equals=str(outcome(lambda: ref.kneighbors(Q, n_neighbors=0))))
    agreed(outcome(lambda: nn.kneighbors(shard(Q), n_neighbors=2.0)), "k float", TypeError,
           equals=str(outcome(lambda: ref.kneighbors(Q, n_neighbors=2.0))))
    agreed(outcome(lambda: nn.kneighbors(shard(Q), n_neighbors=X.shape[0] + 1)), "k too large", ValueError,
           equals=str(outcome(lambda: ref.kneighbors(Q, n_neighbors=X.shape[0] + 1))))
    agreed(outcome(lambda: nn.kneighbors(None, n_neighbors=X.shape[0])), "k too large, X=None", ValueError,
           equals=str(outcome(lambda: ref.kneighbors(None, n_neighbors=X.shape[0]))))
    Qbad = shard(Q)[:, :4] if rank == size - 1 else shard(Q)
    agreed(outcome(lambda: nn.kneighbors(Qbad)), "features on one rank", DistributedInputError if size > 1 else ValueError,
           contains="features")
    agreed(outcome(lambda: NearestNeighbors(metric="chebyshev").fit(sp.csr_matrix(shard(X)))), "chebyshev sparse",
           ValueError, contains="Metric 'chebyshev' not valid for sparse input")
    Qs = sp.csr_matrix(shard(Q)) if rank == 0 else shard(Q)  # sparse queries on one rank only
    agreed(outcome(lambda: NearestNeighbors(p=math.inf).fit(shard(X)).kneighbors(Qs)), "chebyshev, sparse on rank 0",
           ValueError, contains="not valid for sparse input")
    agreed(outcome(lambda: KNeighborsClassifier().fit(shard(X), shard(X[:, 0]))), "continuous labels", ValueError,
           contains="Unknown label type")
    d, _ = nn.kneighbors(shard(Q))  # still usable: no rank left behind
    check(d.shape == (shard(Q).shape[0], 3), "usable after the errors")


def main():
    check_parameters()
    check_results()
    check_errors()


if __name__ == "__main__":   # (else one case of a shared launch: _neighbors_launches.py)
    guarded(main, comm)

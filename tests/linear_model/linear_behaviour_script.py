"""The core of test_sklearn_behaviour.py on several ranks (run under ``mpiexec -n 3``).

Every rank must raise what scikit-learn raises (same type, same text) at the same point, warn what
it warns, and end with scikit-learn's fitted attributes on the gathered data; verdicts are
collective (tests/_spmd.py).
"""

import io
import sys
import warnings
from contextlib import redirect_stdout

import numpy as np
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.exceptions import ConvergenceWarning

from mpiml.comm import get_comm
from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size


def shard(a):
    b = np.linspace(0, a.shape[0], size + 1).astype(int)
    return a[b[rank]:b[rank + 1]]


def data(kind, n=240, d=6, seed=0, sparse=False):
    rs = np.random.RandomState(seed)
    X = rs.randn(n, d)
    if sparse:
        X[rs.rand(n, d) < 0.6] = 0.0
    y = X @ rs.randn(d) + 0.3 * rs.randn(n) + 2.0
    if kind == "bin":
        y = (y > np.median(y)).astype(int)
    elif kind == "multi":
        y = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))
    return (sp.csr_matrix(X) if sparse else X), y


def raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def same_everywhere(text, tag):
    texts = comm.allgather_obj(text)
    check(len(set(texts)) == 1, f"{tag}: differs across ranks: {texts}")


def errors():
    X, y = data("bin")
    Xl, yl = shard(X), shard(y)
    cases = [
        (LogisticRegression, sk.LogisticRegression, dict(C=0.0)),            # a parameter constraint
        (LogisticRegression, sk.LogisticRegression, dict(dual=True)),        # a solver rule
        (LogisticRegression, sk.LogisticRegression, dict(l1_ratio=1.0)),
        (Ridge, sk.Ridge, dict(solver="lbfgs")),
        (Ridge, sk.Ridge, dict(positive=True, solver="cholesky")),
        (LinearRegression, sk.LinearRegression, dict(tol=-1.0)),
    ]
    for ours_cls, sk_cls, kw in cases:
        theirs = raised(lambda: sk_cls(**kw).fit(X, y))
        ours = raised(lambda: ours_cls(**kw).fit(Xl, yl))
        tag = f"{ours_cls.__name__}({kw})"
        # the same class, or both scikit-learn's InvalidParameterError shape (a ValueError and a TypeError)
        kind = (lambda e: (isinstance(e, ValueError), isinstance(e, TypeError)))
        check(ours is not None and kind(ours) == kind(theirs), f"{tag}: {ours!r} vs {theirs!r}")
        check(str(ours) == str(theirs) or "among {" in str(theirs), f"{tag}: {ours} vs {theirs}")
        same_everywhere(str(ours), tag)
    # data-dependent rules: agreed first, then the same error everywhere
    X3, y3 = data("multi")
    theirs = raised(lambda: sk.LogisticRegression(solver="liblinear").fit(X3, y3))
    ours = raised(lambda: LogisticRegression(solver="liblinear").fit(shard(X3), shard(y3)))
    check(type(ours) is ValueError and str(ours) == str(theirs), f"liblinear multiclass: {ours}")
    same_everywhere(str(ours), "liblinear multiclass")
    ours = raised(lambda: LogisticRegression().fit(Xl, np.full(len(yl), 5)))
    theirs = raised(lambda: sk.LogisticRegression().fit(X, np.full(len(y), 5)))
    check(type(ours) is ValueError and str(ours) == str(theirs), f"one class: {ours} vs {theirs}")
    same_everywhere(str(ours), "one class")
    # one class per rank, two overall: scikit-learn's fit on the union of the labels
    order = np.argsort(y, kind="stable")
    m = LogisticRegression(tol=1e-10).fit(shard(X[order]), shard(y[order]))
    s = sk.LogisticRegression(tol=1e-10).fit(X, y)
    check(list(m.classes_) == [0, 1], f"classes_ {m.classes_}")
    assert_close(m.coef_, s.coef_, "one class per rank: coef", rtol=1e-6)


def warnings_everywhere():
    X, y = data("multi")
    X = X * 30.0
    for kw, category in ((dict(penalty="l2"), FutureWarning), (dict(n_jobs=4), FutureWarning),
                         (dict(max_iter=2), ConvergenceWarning),
                         (dict(solver="newton-cg", max_iter=1), ConvergenceWarning)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            LogisticRegression(**kw).fit(shard(X), shard(y))
        with warnings.catch_warnings(record=True) as sk_caught:
            warnings.simplefilter("always")
            sk.LogisticRegression(**kw).fit(X, y)
        mine = sorted({w.category.__name__ for w in caught if w.category is not DeprecationWarning})
        theirs = sorted({w.category.__name__ for w in sk_caught if w.category is not DeprecationWarning})
        check(category.__name__ in mine and mine == theirs, f"{kw}: warnings {mine} vs {theirs}")
        same_everywhere(str(mine), f"warnings of {kw}")


def fitted():
    for sparse in (False, True):
        for cls, sk_cls, kw, kind in ((LinearRegression, sk.LinearRegression, {}, "reg"),
                                      (Ridge, sk.Ridge, dict(alpha=3.0), "reg"),
                                      (Ridge, sk.Ridge, dict(alpha=3.0, positive=True), "reg"),
                                      (LogisticRegression, sk.LogisticRegression, dict(tol=1e-10), "multi")):
            X, y = data(kind, sparse=sparse)
            if kw.get("positive"):
                y = y - 2 * np.asarray(X[:, 0].todense()).ravel() if sparse else y - 2 * X[:, 0]
            # scikit-learn's Ridge iterates on sparse X (sparse_cg, tol 1e-4); mpiml solves exactly: compare
            # with scikit-learn's exact solution on the dense matrix
            Xs = X.toarray() if sparse and cls is Ridge else X
            s = sk_cls(**kw, **({"tol": 1e-12} if kw.get("positive") else {})).fit(Xs, y)
            m = cls(**kw).fit(shard(X), shard(y))
            tag = f"{cls.__name__}{kw} sparse={sparse}"
            for key, want in vars(s).items():
                if not key.endswith("_") or key.startswith("_") or key in ("solver_", "n_iter_"):
                    continue
                got = getattr(m, key, None)
                check(got is not None and np.shape(got) == np.shape(want), f"{tag}: {key} shape")
                if isinstance(want, np.ndarray) and want.dtype.kind == "f":
                    rtol = 1e-5 if kw.get("positive") else 1e-6
                    assert_close(np.asarray(got), want, f"{tag}: {key}", rtol=rtol, atol=rtol * np.abs(want).max())
            check(abs(m.score(shard(X), shard(y)) - s.score(X, y)) < 1e-8, f"{tag}: score")


def warm_start_and_verbose():
    X, y = data("multi")
    est = LogisticRegression(warm_start=True, tol=1e-8, max_iter=500).fit(shard(X), shard(y))
    first = int(est.n_iter_[0])
    est.fit(shard(X), shard(y))
    check(int(est.n_iter_[0]) < first, f"warm start: {est.n_iter_[0]} vs {first} iterations")
    out = io.StringIO()
    with redirect_stdout(out):
        LogisticRegression(verbose=1).fit(shard(X), shard(y))
    check(("loss" in out.getvalue()) == (rank == 0), f"verbose output on rank {rank}: {out.getvalue()[:60]!r}")


def main():
    errors()
    warnings_everywhere()
    fitted()
    warm_start_and_verbose()


if __name__ == "__main__":
    guarded(main, comm)
    sys.exit(0)

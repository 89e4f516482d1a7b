"""Multi-rank linear-model checks, run under ``mpiexec -n N`` by test_linear_mpi.py.

Every rank builds the same global dataset, keeps an uneven shard of it (the
last rank of 3 or 4 keeps none in one case), and compares the SPMD estimators
with scikit-learn fitted on the whole data and with mpiml on one process.
Verdicts are collective (tests/_spmd.py).

Usage: linear_spmd_script.py OUTDIR (or ``main(OUTDIR)``, one case of a shared launch: _launches.py)
"""

import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning

import mpiml
from mpiml import CommError, DistributedInputError
from mpiml.comm import get_comm
from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge
from mpiml.linear_model._logistic import _Objective

from _spmd import assert_close, check, guarded, uneven_bounds, uneven_shard

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
OUT = sys.argv[1] if len(sys.argv) > 1 else None


def bounds(n, skip_last=False):
    return uneven_bounds(n, size, skip_last)


def shard(a, skip_last=False):
    return uneven_shard(a, rank, size, skip_last)


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def same_on_every_rank(a, msg):
    a = np.atleast_1d(np.asarray(a, dtype=np.float64))
    check(np.array_equal(comm.allgather(a[None]).reshape(size, -1), np.tile(a.ravel(), (size, 1))),
          f"{msg}: not bit-identical on every rank")


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-300))


def expect_error(fn, cls, needle, msg):
    try:
        fn()
    except cls as exc:
        text = str(exc)
        check(needle in text, f"{msg}: message {text!r} lacks {needle!r}")
        texts = comm.allgather_obj(text)
        check(len(set(texts)) == 1, f"{msg}: different messages on the ranks: {texts}")
        return
    except Exception as exc:  # noqa: BLE001
        check(False, f"{msg}: raised {type(exc).__name__}: {exc}")
        comm.allgather_obj(None)
        return
    check(False, f"{msg}: nothing raised")
    comm.allgather_obj(None)


def regression_checks():
    X, Y = make_regression(n_samples=700, n_features=7, n_targets=3, noise=2.0, random_state=0)
    X += 5.0  # a mean far from zero exercises the centring
    w = np.random.RandomState(1).uniform(0.2, 3.0, size=len(X))
    y = Y[:, 0]
    Xl, Yl, yl, wl = shard(X), shard(Y), shard(y), shard(w)

    for solver in ("normal", "tsqr"):
        # single target, weights
        m = LinearRegression(solver=solver).fit(Xl, yl, sample_weight=wl)
        s = sk.LinearRegression().fit(X, y, sample_weight=w)
        check(rel(m.coef_, s.coef_) < 1e-9, f"{solver}: coef vs scikit-learn rel {rel(m.coef_, s.coef_):.2e}")
        check(abs(m.intercept_ - s.intercept_) < 1e-8 * abs(s.intercept_) + 1e-10, f"{solver}: intercept")
        check(isinstance(m.intercept_, float) and m.coef_.shape == (7,), f"{solver}: shapes of a 1-d target")
        check(m.rank_ == s.rank_ == 7, f"{solver}: rank_ {m.rank_} vs {s.rank_}")
        assert_close(m.singular_, s.singular_, f"{solver}: singular_", rtol=1e-8)
        assert_close(m.predict(Xl), shard(s.predict(X)), f"{solver}: predict on local rows", rtol=1e-9, atol=1e-9)
        check(abs(m.score(Xl, yl, sample_weight=wl) - s.score(X, y, sample_weight=w)) < 1e-12, f"{solver}: score")
        same_on_every_rank(m.coef_, f"{solver}: coef_")
        # rank-count independence: the same as mpiml on one process over the gathered rows
        one = LinearRegression(solver=solver, comm=SELF).fit(X, y, sample_weight=w)
        check(rel(m.coef_, one.coef_) < 1e-12,
              f"{solver}: coef depends on the rank count ({rel(m.coef_, one.coef_):.1e})")

        # multi-target, no intercept
        m = LinearRegression(solver=solver, fit_intercept=False).fit(Xl, Yl)
        s = sk.LinearRegression(fit_intercept=False).fit(X, Y)
        check(rel(m.coef_, s.coef_) < 1e-9 and m.coef_.shape == (3, 7), f"{solver}: multi-target coef")
        check(m.intercept_ == 0.0, f"{solver}: intercept_ without fit_intercept")
        check(abs(m.score(Xl, Yl) - s.score(X, Y)) < 1e-12, f"{solver}: multi-target score")

        # rank-deficient X: scikit-learn's minimum-norm solution and rank
        Xd = np.column_stack([X, X[:, 0] + 2 * X[:, 1], X[:, 2]])
        m = LinearRegression(solver=solver).fit(shard(Xd), yl)
        s = sk.LinearRegression().fit(Xd, y)
        check(rel(m.coef_, s.coef_) < 1e-6, f"{solver}: rank-deficient coef rel {rel(m.coef_, s.coef_):.2e}")
        check(m.rank_ == s.rank_ == 7, f"{solver}: rank-deficient rank_ {m.rank_} vs {s.rank_}")

        # Ridge: per-target alphas, weights; a rank without rows
        for skip in (False, True):
            r = Ridge(alpha=[0.1, 10.0, 1000.0], solver="cholesky" if solver == "normal" else "svd")
            r.fit(shard(X, skip), shard(Y, skip), sample_weight=shard(w, skip))
            s = sk.Ridge(alpha=[0.1, 10.0, 1000.0]).fit(X, Y, sample_weight=w)
            check(rel(r.coef_, s.coef_) < 1e-9, f"Ridge {solver} skip={skip}: coef rel {rel(r.coef_, s.coef_):.1e}")
            assert_close(r.intercept_, s.intercept_, f"Ridge {solver}: intercept", rtol=1e-9, atol=1e-9)
            check(abs(r.score(shard(X, skip), shard(Y, skip)) - s.score(X, Y)) < 1e-12, f"Ridge {solver}: score")
        r = Ridge(alpha=2.0, fit_intercept=False, solver="svd" if solver == "tsqr" else "auto").fit(Xl, yl)
        s = sk.Ridge(alpha=2.0, fit_intercept=False).fit(X, y)
        check(rel(r.coef_, s.coef_) < 1e-9, f"Ridge {solver}: no intercept")

    # float32 input keeps float32 attributes; the accumulation is float64
    m = LinearRegression().fit(Xl.astype(np.float32), yl.astype(np.float32))
    s = sk.LinearRegression().fit(X, y)
    check(m.coef_.dtype == np.float32 and rel(m.coef_, s.coef_) < 1e-5, "float32 input")

    # ill-conditioned X: TSQR keeps accuracy where the normal equations lose it
    rs = np.random.RandomState(5)
    Q, _ = np.linalg.qr(rs.randn(700, 6))
    Xc = Q @ np.diag(np.logspace(0, -5, 6)) @ np.linalg.qr(rs.randn(6, 6))[0]
    yc = Xc @ rs.randn(6) + 1e-3 * rs.randn(700)
    s = sk.LinearRegression().fit(Xc, yc)
    t = LinearRegression(solver="tsqr").fit(shard(Xc), shard(yc))
    check(rel(t.coef_, s.coef_) < 1e-8, f"tsqr on cond 1e5 data: rel {rel(t.coef_, s.coef_):.1e}")


def classification_checks():
    X, y = make_classification(n_samples=900, n_features=6, n_informative=4, n_redundant=0, n_classes=3,
                               n_clusters_per_class=1, random_state=0)
    w = np.random.RandomState(2).uniform(0.5, 2.0, size=len(X))
    names = np.array(["cat", "dog", "emu"])
    ys = names[y]
    # sort by label so that some ranks see only some classes: classes_ is still the union
    order = np.argsort(y, kind="stable")
    X, y, ys, w = X[order], y[order], ys[order], w[order]
    Xl, yl, ysl, wl = shard(X), shard(y), shard(ys), shard(w)
    yb = (y == 1).astype(np.int64)
    for solver in ("lbfgs", "newton-cholesky"):
        opts = dict(solver=solver, tol=1e-10, max_iter=500)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            s = sk.LogisticRegression(C=0.5, solver=solver, tol=1e-10, max_iter=500).fit(X, ys, sample_weight=w)
        m = LogisticRegression(C=0.5, **opts).fit(Xl, ysl, sample_weight=wl)
        check(list(m.classes_) == ["cat", "dog", "emu"], f"{solver}: classes_ {m.classes_}")
        check(rel(m.coef_, s.coef_) < 1e-6, f"{solver}: multinomial coef rel {rel(m.coef_, s.coef_):.1e}")
        assert_close(m.intercept_, s.intercept_, f"{solver}: multinomial intercept", rtol=1e-6, atol=1e-7)
        assert_close(m.predict_proba(Xl), shard(s.predict_proba(X)), f"{solver}: predict_proba", rtol=1e-6, atol=1e-8)
        check(np.array_equal(m.predict(Xl), shard(s.predict(X))), f"{solver}: predict")
        check(abs(m.score(Xl, ysl) - s.score(X, ys)) < 1e-12, f"{solver}: score")
        same_on_every_rank(m.coef_, f"{solver}: coef_")
        same_on_every_rank(m.n_iter_, f"{solver}: n_iter_")
        one = LogisticRegression(C=0.5, comm=SELF, **opts).fit(X, ys, sample_weight=w)
        check(rel(m.coef_, one.coef_) < 1e-8, f"{solver}: depends on the rank count ({rel(m.coef_, one.coef_):.1e})")

        # binary, balanced class weights, no intercept; a rank without rows
        s = sk.LogisticRegression(class_weight="balanced", fit_intercept=False, solver=solver, tol=1e-10,
                                  max_iter=500).fit(X, yb)
        m = LogisticRegression(class_weight="balanced", fit_intercept=False, **opts).fit(shard(X, True),
                                                                                       shard(yb, True))
        check(m.coef_.shape == (1, 6) and rel(m.coef_, s.coef_) < 1e-6, f"{solver}: binary balanced coef")
        assert_close(m.decision_function(Xl), shard(s.decision_function(X)), f"{solver}: decision_function",
                     rtol=1e-6, atol=1e-8)
        # class_weight as a dict, no penalty
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            s = sk.LogisticRegression(C=np.inf, class_weight={0: 2.0, 2: 0.5}, solver=solver, tol=1e-10,
                                      max_iter=500).fit(X, y)
        m = LogisticRegression(C=np.inf, class_weight={0: 2.0, 2: 0.5}, **opts).fit(Xl, yl)
        check(rel(m.coef_, s.coef_) < 1e-5, f"{solver}: unpenalised dict-weighted coef rel {rel(m.coef_, s.coef_):.1e}")

    # the profile shows one allreduce per L-BFGS function evaluation (+1 for the class counts)
    with mpiml.profile() as p:
        m = LogisticRegression(C=0.5, tol=1e-8).fit(Xl, ysl)
    n_allreduce = p.summary()["ops"].get("allreduce", {}).get("calls", 0) if size > 1 else 1 + m._n_fun_evals
    check(m._n_fun_evals == m._n_fun_evals_scipy, f"evaluations {m._n_fun_evals} vs scipy's {m._n_fun_evals_scipy}")
    check(n_allreduce == 1 + m._n_fun_evals, f"{n_allreduce} allreduces for {m._n_fun_evals} evaluations")

    # separable classes without penalty: a ConvergenceWarning on every rank, no hang
    Xs = np.vstack([X[y == 0], X[y == 0] + 50.0])
    ysep = np.r_[np.zeros((y == 0).sum()), np.ones((y == 0).sum())]
    perm = np.random.RandomState(0).permutation(len(ysep))
    Xs, ysep = Xs[perm], ysep[perm]
    for max_iter in (5, 100):  # at 5 iterations both warn
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = LogisticRegression(C=np.inf, max_iter=max_iter).fit(shard(Xs), shard(ysep))
        with warnings.catch_warnings(record=True) as sk_caught:
            warnings.simplefilter("always")
            sk.LogisticRegression(C=np.inf, max_iter=max_iter).fit(Xs, ysep)
        warned = any(issubclass(c.category, ConvergenceWarning) for c in caught)
        sk_warned = any(issubclass(c.category, ConvergenceWarning) for c in sk_caught)
        check(warned == sk_warned, f"separable, max_iter={max_iter}: ConvergenceWarning {warned} vs {sk_warned}")
        check(m.score(shard(Xs), shard(ysep)) == 1.0, "separable: training accuracy below 1")

    # a fingerprint mismatch is the same CommError on every rank, not a hang
    if size > 1:
        obj = _Objective(Xl, np.searchsorted([0, 1, 2], yl), np.ones(len(yl)), n_classes=3, fit_intercept=True,
                         l2=0.1, sw_sum=float(len(y)), comm=comm, xp=np)
        expect_error(lambda: obj.evaluate(np.full(obj.n_params, float(rank))), CommError, "diverged",
                     "diverged optimisers")
    return X, y


def error_checks(X, y):
    Xl, yl = shard(X), shard(y)
    last = size - 1
    Xn = Xl.copy()
    if rank == last and len(Xn):
        Xn[0, 0] = np.nan
    cls = DistributedInputError if size > 1 else ValueError
    for est in (LinearRegression(), Ridge(), LogisticRegression()):
        name = type(est).__name__
        expect_error(lambda: est.fit(Xn, yl), cls, "NaN", f"{name}: NaN on the last rank")
        Xf = Xl if rank != last else Xl[:, :-1]
        if size > 1:
            expect_error(lambda: est.fit(Xf, yl), cls, "features", f"{name}: n_features differs")
        yshort = yl if rank != last else yl[:-1]
        expect_error(lambda: est.fit(Xl, yshort), cls, "inconsistent numbers of samples", f"{name}: len(y)")
    if size > 1:
        Y2 = np.column_stack([yl, yl]) if rank == last else yl
        expect_error(lambda: LinearRegression().fit(Xl, Y2), cls, "same shape", "y 1-d here, 2-d there")
        ymix = yl.astype(str) if rank == last else yl
        expect_error(lambda: LogisticRegression().fit(Xl, ymix), cls, "text labels", "labels text here only")
    expect_error(lambda: LogisticRegression().fit(Xl, np.full(len(Xl), 7)), ValueError, "only one class",
                 "one class only")
    yr = Xl @ np.abs(np.arange(Xl.shape[1]) - 2.0) + 0.1 * yl
    for solver in ("auto", "normal"):
        m = LinearRegression(positive=True, solver=solver).fit(Xl, yr)
        s = sk.LinearRegression(positive=True).fit(X, X @ np.abs(np.arange(X.shape[1]) - 2.0) + 0.1 * y)
        check(rel(m.coef_, s.coef_) < 1e-8 and m.coef_.min() >= 0,
              f"positive=True {solver}: rel {rel(m.coef_, s.coef_):.1e}")
    expect_error(lambda: LinearRegression(positive=True, solver="lsqr").fit(Xl, yl), ValueError, "positive=True",
                 "positive with lsqr")
    expect_error(lambda: Ridge(alpha=[1.0, 2.0]).fit(Xl, yl), ValueError, "Number of targets",
                 "alphas vs targets")
    yc = yl + 0.5
    expect_error(lambda: LogisticRegression().fit(Xl, yc), cls, "continuous", "continuous labels")


def sparse_checks():
    """CSR shards: equal to the dense fit and to scikit-learn on the gathered rows; never a different answer
    because a rank holds no rows or because the solver is iterative."""
    import mpiml.linear_model._least_squares as lsq

    rs = np.random.RandomState(7)
    X = sp.random(600, 12, density=0.3, random_state=rs, format="csr")
    X.data += 1.0  # non-zero means, so the implicit centring matters
    Xd = X.toarray()
    Y = Xd @ rs.randn(12, 2) + 0.1 * rs.randn(600, 2) + [3.0, -1.0]
    y = Y[:, 0]
    w = rs.uniform(0.5, 2.0, 600)
    for skip in (False, True):
        Xl, yl, Yl, wl = shard(X, skip), shard(y, skip), shard(Y, skip), shard(w, skip)
        check(sp.issparse(Xl), "the shard is sparse")
        s = sk.LinearRegression().fit(Xd, y, sample_weight=w)
        for solver in ("normal", "tsqr", "lsqr"):
            tol = 1e-12 if solver == "lsqr" else 1e-6
            m = LinearRegression(solver=solver, tol=tol).fit(Xl, yl, sample_weight=wl)
            bound = 1e-7 if solver == "lsqr" else 1e-9
            check(rel(m.coef_, s.coef_) < bound, f"sparse {solver} skip={skip}: coef rel {rel(m.coef_, s.coef_):.1e}")
            check(abs(m.intercept_ - s.intercept_) < 1e-7, f"sparse {solver}: intercept")
            assert_close(m.predict(Xl), shard(s.predict(Xd), skip), f"sparse {solver}: predict", rtol=1e-7, atol=1e-7)
            check(abs(m.score(Xl, yl, sample_weight=wl) - s.score(Xd, y, sample_weight=w)) < 1e-9,
                  f"sparse {solver}: score")
            same_on_every_rank(m.coef_, f"sparse {solver}: coef_")
        dense = LinearRegression().fit(shard(Xd, skip), yl, sample_weight=wl)
        check(rel(LinearRegression().fit(Xl, yl, sample_weight=wl).coef_, dense.coef_) < 1e-10,
              "sparse normal equals the dense fit")
        for solver in ("cholesky", "svd", "lsqr", "sparse_cg", "saga"):
            r = Ridge(alpha=[0.3, 30.0], solver=solver, tol=1e-12).fit(Xl, Yl, sample_weight=wl)
            s = sk.Ridge(alpha=[0.3, 30.0]).fit(Xd, Y, sample_weight=w)
            check(rel(r.coef_, s.coef_) < 1e-7,
                  f"sparse Ridge {solver} skip={skip}: coef rel {rel(r.coef_, s.coef_):.1e}")
            assert_close(r.intercept_, s.intercept_, f"sparse Ridge {solver}: intercept", rtol=1e-7, atol=1e-7)
        r = Ridge(alpha=2.0, positive=True).fit(Xl, yl - 2 * shard(Xd[:, 0], skip))
        s = sk.Ridge(alpha=2.0, positive=True, tol=1e-12).fit(Xd, y - 2 * Xd[:, 0])
        check(rel(r.coef_, s.coef_) < 1e-5 and r.coef_.min() >= 0,
              f"sparse Ridge positive: rel {rel(r.coef_, s.coef_):.1e}")
    # sparse data with many features: "auto" runs LSQR / CG (the threshold lowered for the test)
    saved = lsq.SPARSE_GRAM_MAX_FEATURES
    lsq.SPARSE_GRAM_MAX_FEATURES = 4
    try:
        m = LinearRegression(tol=1e-12).fit(shard(X), shard(y))
        r = Ridge(alpha=1.0, tol=1e-12).fit(shard(X), shard(y))
    finally:
        lsq.SPARSE_GRAM_MAX_FEATURES = saved
    check(m.solver_ == "lsqr" and r.solver_ == "sparse_cg", f"auto with many features: {m.solver_}, {r.solver_}")
    check(rel(m.coef_, sk.LinearRegression().fit(Xd, y).coef_) < 1e-7, "auto lsqr coef")
    check(rel(r.coef_, sk.Ridge(alpha=1.0).fit(Xd, y).coef_) < 1e-7, "auto sparse_cg coef")

    # logistic regression: binary and multinomial, every solver, against scikit-learn on the gathered CSR
    yb = (Xd[:, 0] + Xd[:, 1] - Xd[:, 2] + 0.3 * rs.randn(600) > 0.4).astype(int)
    ym = np.digitize(Xd[:, 3] - Xd[:, 4] + 0.2 * rs.randn(600), [-0.3, 0.3])
    for target, name in ((yb, "binary"), (ym, "multinomial")):
        for solver in ("lbfgs", "newton-cholesky", "newton-cg"):
            s = sk.LogisticRegression(solver=solver, C=2.0, tol=1e-10, max_iter=500).fit(X, target, sample_weight=w)
            m = LogisticRegression(solver=solver, C=2.0, tol=1e-10, max_iter=500).fit(
                shard(X, True), shard(target, True), sample_weight=shard(w, True))
            tag = f"sparse logistic {name} {solver}"
            check(rel(m.coef_, s.coef_) < 1e-6, f"{tag}: coef rel {rel(m.coef_, s.coef_):.1e}")
            assert_close(m.predict_proba(shard(X)), shard(s.predict_proba(X)), f"{tag}: proba", rtol=1e-6, atol=1e-8)
            check(abs(m.score(shard(X), shard(target)) - s.score(X, target)) < 1e-12, f"sparse logistic {name}: score")
            same_on_every_rank(m.coef_, f"sparse logistic {name} {solver}: coef_")

    # every rank must pass the same kind of matrix; NaN or a feature count that differs: one error everywhere
    cls = DistributedInputError if size > 1 else ValueError
    if size > 1:
        mixed = shard(X) if rank != size - 1 else shard(Xd)
        expect_error(lambda: LinearRegression().fit(mixed, shard(y)), cls, "sparse on rank(s)", "sparse here only")
        narrow = shard(X) if rank != size - 1 else shard(X)[:, :-1]
        expect_error(lambda: Ridge().fit(narrow, shard(y)), cls, "features", "sparse n_features differs")
    bad = shard(X).copy()
    if rank == size - 1 and bad.nnz:
        bad.data[0] = np.nan
    expect_error(lambda: LogisticRegression().fit(bad, shard(yb)), cls, "NaN", "NaN in a sparse shard")
    expect_error(lambda: LinearRegression(positive=True).fit(shard(X), shard(y)),
                 cls if size > 1 else TypeError, "dense data is required", "positive=True refuses sparse")


def robustness_checks():
    """Hard cases: rank-deficient and constant X (dense and sparse), singular Hessians, separable
    classes under every solver, NaN in y or in the weights on one rank; scikit-learn's answer or the same
    error everywhere, never a hang."""
    rs = np.random.RandomState(3)
    X = rs.randn(300, 5)
    Xd = np.column_stack([X, X[:, 0] - 2 * X[:, 1]])           # rank 5 of 6 columns
    y = X @ rs.randn(5) + 0.1 * rs.randn(300)
    s = sk.LinearRegression().fit(Xd, y)
    for solver in ("normal", "tsqr"):
        for Xi in (Xd, sp.csr_matrix(Xd)):
            m = LinearRegression(solver=solver).fit(shard(Xi), shard(y))
            check(rel(m.coef_, s.coef_) < 1e-6 and m.rank_ == s.rank_ == 5,
                  f"rank-deficient {solver} sparse={sp.issparse(Xi)}: rel {rel(m.coef_, s.coef_):.1e}, rank {m.rank_}")
    C = np.ones((300, 3)) * [1.0, -2.0, 5.0]                      # constant columns: rank 0 once centred
    s = sk.LinearRegression().fit(C, y)
    for Xi in (C, sp.csr_matrix(C)):
        m = LinearRegression().fit(shard(Xi), shard(y))
        check(np.array_equal(m.coef_, np.zeros(3)) and m.rank_ == s.rank_ == 0
              and abs(m.intercept_ - s.intercept_) < 1e-12,
              f"constant X: coef {m.coef_}, rank {m.rank_}, intercept {m.intercept_} vs {s.intercept_}")
    # a singular Hessian (duplicated column, no penalty): Newton falls back to L-BFGS on every rank alike
    yb = (X[:, 0] + 0.5 * rs.randn(300) > 0).astype(int)
    Xdup = np.column_stack([X, X[:, 0]])
    s = sk.LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(Xdup, yb)
    for solver in ("newton-cholesky", "newton-cg", "lbfgs"):
        for Xi in (Xdup, sp.csr_matrix(Xdup)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                m = LogisticRegression(C=np.inf, solver=solver, tol=1e-10, max_iter=1000).fit(shard(Xi), shard(yb))
            kinds = sorted({w.category.__name__ for w in caught})
            texts = comm.allgather_obj(kinds)
            check(all(t == kinds for t in texts), f"singular Hessian {solver}: warnings differ across ranks {texts}")
            assert_close(m.predict_proba(shard(Xi)), shard(s.predict_proba(Xdup)), f"singular Hessian {solver}: proba",
                         rtol=1e-5, atol=1e-6)
            same_on_every_rank(m.coef_, f"singular Hessian {solver}: coef_")
    # perfectly separable classes without a penalty, every solver: finishes on every rank, separates
    Xs = np.r_[rs.randn(60, 2) - 3, rs.randn(60, 2) + 3]
    ys = np.r_[np.zeros(60, int), np.ones(60, int)]
    for solver in ("lbfgs", "newton-cholesky", "newton-cg", "sag"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = LogisticRegression(C=np.inf, solver=solver, max_iter=30).fit(shard(Xs), shard(ys))
        with warnings.catch_warnings(record=True) as sk_caught:
            warnings.simplefilter("always")
            sk.LogisticRegression(C=np.inf, solver=solver if solver != "sag" else "lbfgs", max_iter=30).fit(Xs, ys)
        warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
        sk_warned = any(issubclass(w.category, ConvergenceWarning) for w in sk_caught)
        check(comm.allgather_obj(warned) == [warned] * size, f"separable {solver}: warning differs across ranks")
        check(warned == sk_warned, f"separable {solver}: ConvergenceWarning {warned} vs scikit-learn {sk_warned}")
        check(m.score(shard(Xs), shard(ys)) == 1.0, f"separable {solver}: training accuracy below 1")
    # NaN in y or in the weights on the last rank only: the same error everywhere
    cls = DistributedInputError if size > 1 else ValueError
    yn = shard(y).copy()
    wn = np.ones(len(yn))
    if rank == size - 1 and len(yn):
        yn[0] = np.nan
        wn[0] = np.nan
    expect_error(lambda: Ridge().fit(shard(X), yn), cls, "NaN", "NaN in y on one rank")
    expect_error(lambda: LogisticRegression().fit(shard(X), shard(yb), sample_weight=wn), cls, "NaN",
                 "NaN in sample_weight on one rank")


def host_kernel_checks():
    """The compiled host passes (every shard through them: the size thresholds lowered), F-ordered rows as the
    generators make them, uneven shards with an empty one: scikit-learn's answer, the same bits everywhere."""
    from mpiml.linear_model import _logistic_loss, _lsq_direct

    saved = _lsq_direct._HOST_KERNEL_MIN_VALUES, _logistic_loss._HOST_PASS_MIN_VALUES
    _lsq_direct._HOST_KERNEL_MIN_VALUES = _logistic_loss._HOST_PASS_MIN_VALUES = 0
    try:
        rs = np.random.RandomState(8)
        X = np.asfortranarray(rs.randn(5000, 6) + 3.0)
        y = X @ rs.randn(6) + 0.1 * rs.randn(5000)
        yb = (X[:, 0] - X[:, 2] + 0.5 * rs.randn(5000) > 0).astype(int)
        w = rs.uniform(0.5, 2.0, size=5000)
        Xl, yl, ybl, wl = (np.asfortranarray(shard(X, True)), shard(y, True), shard(yb, True), shard(w, True))
        m = LinearRegression().fit(Xl, yl, sample_weight=wl)
        s = sk.LinearRegression().fit(X, y, sample_weight=w)
        check(rel(m.coef_, s.coef_) < 1e-9, f"host kernel LinearRegression: rel {rel(m.coef_, s.coef_):.1e}")
        same_on_every_rank(m.coef_, "host kernel LinearRegression coef_")
        for solver in ("lbfgs", "newton-cg"):
            m = LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(Xl, ybl, sample_weight=wl)
            s = sk.LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, yb, sample_weight=w)
            check(rel(m.coef_, s.coef_) < 1e-6, f"host kernel logistic {solver}: rel {rel(m.coef_, s.coef_):.1e}")
            same_on_every_rank(m.coef_, f"host kernel logistic {solver} coef_")
    finally:
        _lsq_direct._HOST_KERNEL_MIN_VALUES, _logistic_loss._HOST_PASS_MIN_VALUES = saved


def auto_solver_checks():
    """solver="auto": the same choice on every rank (it reads the reduced Gram), scikit-learn's coefficients."""
    rs = np.random.RandomState(5)
    n, d = 600, 6
    U, _ = np.linalg.qr(rs.randn(n, d))
    V, _ = np.linalg.qr(rs.randn(d, d))
    for cond, want in ((10.0, "normal"), (1e8, "tsqr")):
        X = (U * np.logspace(0, -np.log10(cond), d)) @ V.T * 10 + rs.randn(d)
        y = X @ rs.randn(d) + 1e-3 * rs.randn(n)
        m = LinearRegression().fit(shard(X, skip_last=True), shard(y, skip_last=True))
        s = sk.LinearRegression().fit(X, y)
        check(m.solver_ == want, f"auto at cond {cond:g}: {m.solver_}, want {want}")
        same_on_every_rank(m.coef_, f"auto at cond {cond:g}")
        check(rel(m.predict(X), s.predict(X)) < 1e-8, f"auto at cond {cond:g}: predictions")
        r = Ridge(alpha=1e-3).fit(shard(X), shard(y))
        check(rel(r.coef_, sk.Ridge(alpha=1e-3).fit(X, y).coef_) < 1e-6, f"Ridge auto at cond {cond:g}")


def main(out=None):
    auto_solver_checks()
    robustness_checks()
    host_kernel_checks()
    sparse_checks()
    regression_checks()
    X, y = classification_checks()
    error_checks(X, y)
    if out:
        m = LogisticRegression(C=0.5).fit(shard(X), shard(y))
        mpiml.save(m, os.path.join(out, "logreg.mpiml"))
        if rank == 0:
            np.save(os.path.join(out, "X.npy"), X)
        np.save(os.path.join(out, f"proba{rank}.npy"), m.predict_proba(X))


if __name__ == "__main__":
    warnings.simplefilter("ignore", UserWarning)
    guarded(lambda: main(OUT), comm)

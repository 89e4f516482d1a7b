"""What scikit-learn's own test files asked of the linear models, on N ranks (run by test_suite_params_mpi.py).

- LogisticRegression: scikit-learn's callbacks with ``solver="lbfgs"`` (the same
  per-iteration coefficients on every rank and at every rank count), its refusal of
  int64-indexed sparse input and of values above 1e30 for liblinear / sag / saga (the
  same error on every rank when only one rank's shard has the problem);
- LinearRegression(copy_X=False): the shards are left centred on the *global* weighted
  means and scaled by sqrt(w), as one process leaves the gathered array;
- Ridge: ``n_iter_`` of sag / saga, ``positive=True`` with ``solver="lbfgs"``, the 1-D ``coef_`` of a
  one-column ``y``, and
  ``score`` NaN when the ranks hold fewer than two rows in total.

Every rank builds the same global data and keeps an uneven shard (the last rank of 3 or 4
keeps none where noted). Verdicts are collective (tests/_spmd.py).
"""

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import UndefinedMetricWarning

from mpiml.comm import get_comm
from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

from _spmd import assert_close, check, guarded, uneven_bounds, uneven_shard

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size


def bounds(n, skip_last=False):
    return uneven_bounds(n, size, skip_last)


def shard(a, skip_last=False):
    return uneven_shard(a, rank, size, skip_last)


def expect_error(fn, cls, needle, msg):
    text = None
    try:
        fn()
        check(False, f"{msg}: nothing raised")
    except cls as exc:
        text = str(exc)
        check(needle in text, f"{msg}: message {text!r} lacks {needle!r}")
    except Exception as exc:  # noqa: BLE001
        check(False, f"{msg}: raised {type(exc).__name__}: {exc}")
    texts = comm.allgather_obj(text)
    check(len(set(texts)) == 1, f"{msg}: different outcomes on the ranks: {texts}")


class Recorder:
    """A callback keeping the coefficients at the end of every L-BFGS iteration."""

    def __init__(self):
        self.ends = []
        self.begins = 0

    def setup(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context, *, fitted_estimator):
        self.begins += 1

    def on_fit_task_end(self, estimator, context, *, fitted_estimator):
        if "iter" in context.task_name and fitted_estimator is not None:
            self.ends.append(np.concatenate([fitted_estimator.coef_.ravel(), fitted_estimator.intercept_.ravel()]))

    def teardown(self, estimator, context):
        pass


def callback_checks():
    try:
        import sklearn.callback  # noqa: F401
    except ImportError:
        return
    X, y = make_classification(n_samples=300, n_features=6, n_informative=4, n_classes=3, random_state=0)
    for skip_last in (False, True):
        tag = f"callbacks skip_last={skip_last}"
        cb = Recorder()
        m = LogisticRegression(max_iter=50).set_callbacks(cb).fit(shard(X, skip_last), shard(y, skip_last))
        ref_cb = Recorder()
        ref = LogisticRegression(max_iter=50, comm=SELF).set_callbacks(ref_cb).fit(X, y)
        n = int(m.n_iter_[0])
        check(len(cb.ends) == n, f"{tag}: {len(cb.ends)} iteration ends for n_iter_={n}")
        check(cb.begins == n + 2, f"{tag}: {cb.begins} task begins for n_iter_={n} (root + iterations + 1)")
        if cb.ends:
            path = np.array(cb.ends)
            gathered = comm.allgather(path[None])
            check(all(np.array_equal(g, gathered[0]) for g in gathered), f"{tag}: iterates differ between ranks")
            check(np.array_equal(path[-1], np.concatenate([m.coef_.ravel(), m.intercept_.ravel()])),
                  f"{tag}: last iterate is not the fitted model")
            k = min(len(ref_cb.ends), len(cb.ends), 5)  # the first iterates follow the one-process ones closely
            assert_close(path[:k], np.array(ref_cb.ends)[:k], f"{tag}: iterates vs one process", rtol=1e-8,
                         atol=1e-10)
        assert_close(m.coef_, ref.coef_, f"{tag}: coef vs one process", rtol=1e-6, atol=1e-8)


def refusal_checks():
    X, y = make_classification(n_samples=120, n_features=5, random_state=1)
    for bad_rank in sorted({0, size - 1}):
        for solver in ("liblinear", "sag", "saga"):
            Xs = sp.csr_matrix(shard(X))
            if rank == bad_rank:
                Xs.indices = Xs.indices.astype(np.int64)
                Xs.indptr = Xs.indptr.astype(np.int64)
            expect_error(lambda: LogisticRegression(solver=solver).fit(Xs, shard(y)), ValueError,
                         "Only sparse matrices with 32-bit integer indices",
                         f"int64 indices on rank {bad_rank}, {solver}")
        Xd = shard(X).copy()
        if rank == bad_rank and Xd.shape[0]:
            Xd[0, 0] = 1e100
        expect_error(lambda: LogisticRegression(solver="liblinear").fit(Xd, shard(y)), ValueError,
                     "maximum value > 1e30", f"1e100 on rank {bad_rank}, liblinear")
    # the other solvers take int64 indices
    Xs = sp.csr_matrix(shard(X))
    Xs.indices, Xs.indptr = Xs.indices.astype(np.int64), Xs.indptr.astype(np.int64)
    m = LogisticRegression(solver="lbfgs").fit(Xs, shard(y))
    ref = LogisticRegression(solver="lbfgs", comm=SELF).fit(X, y)
    assert_close(m.coef_, ref.coef_, "lbfgs on int64-indexed shards", rtol=1e-6, atol=1e-8)


def copy_x_checks():
    X, y = make_regression(n_samples=200, n_features=6, noise=1.0, random_state=2)
    X += 3.0
    w = np.random.default_rng(0).random(X.shape[0]) + 0.5
    for use_w in (False, True):
        for skip_last in (False, True):
            tag = f"copy_X=False weights={use_w} skip_last={skip_last}"
            Xl = np.array(shard(X, skip_last))
            Xall = X.copy()
            kw, kw_all = ({"sample_weight": shard(w, skip_last)}, {"sample_weight": w}) if use_w else ({}, {})
            m = LinearRegression(copy_X=False).fit(Xl, shard(y, skip_last), **kw)
            ref = LinearRegression(copy_X=False, comm=SELF).fit(Xall, y, **kw_all)
            assert_close(Xl, shard(Xall, skip_last), f"{tag}: X left as one process leaves it", rtol=1e-10,
                         atol=1e-10)
            check(np.linalg.norm(Xall - X) > 1.0, f"{tag}: one process left X unchanged")
            assert_close(m.coef_, ref.coef_, f"{tag}: coef", rtol=1e-8, atol=1e-10)
            keep = np.array(shard(X, skip_last))
            LinearRegression().fit(keep, shard(y, skip_last), **kw)
            assert_close(keep, shard(X, skip_last), f"{tag}: copy_X=True leaves X alone", exact=True)


def ridge_checks():
    X, y = make_regression(n_samples=150, n_features=8, noise=1.0, random_state=3)
    Y2 = np.c_[y, 2 * y]
    for solver in ("sag", "saga"):
        for max_iter in (1, 3):
            m = Ridge(solver=solver, max_iter=max_iter, tol=1e-12).fit(shard(X), shard(Y2))
            check(m.n_iter_ is not None and list(m.n_iter_) == [max_iter, max_iter],
                  f"{solver} max_iter={max_iter}: n_iter_ {m.n_iter_}")
        m = Ridge(solver=solver, tol=1e-10).fit(shard(X), shard(y))
        ref = Ridge(solver=solver, tol=1e-10, comm=SELF).fit(X, y)
        check(list(m.n_iter_) == list(ref.n_iter_), f"{solver}: n_iter_ {m.n_iter_} vs one process {ref.n_iter_}")
        assert_close(m.coef_, ref.coef_, f"{solver}: coef", rtol=1e-8, atol=1e-10)
    # positive=True with solver="lbfgs": scikit-learn's bounded L-BFGS-B on the replicated factor
    ypos = X @ np.abs(np.random.default_rng(1).standard_normal(X.shape[1])) + 5.0
    ypos[:10] -= 40.0
    for sparse in (False, True):
        Xs = sp.csr_matrix(shard(X)) if sparse else shard(X)
        m = Ridge(positive=True, solver="lbfgs", tol=1e-10).fit(Xs, shard(ypos))
        ref = Ridge(positive=True, solver="lbfgs", tol=1e-10, comm=SELF).fit(X, ypos)
        exact = Ridge(positive=True, comm=SELF).fit(X, ypos)
        check(m.solver_ == "lbfgs" and exact.solver_ == "nnls", f"positive lbfgs: solver_ {m.solver_}, {exact.solver_}")
        check(bool((m.coef_ >= 0).all()), "positive lbfgs: a negative coefficient")
        assert_close(m.coef_, ref.coef_, f"positive lbfgs sparse={sparse}: vs one process", rtol=1e-6, atol=1e-8)
        assert_close(m.coef_, exact.coef_, f"positive lbfgs sparse={sparse}: vs NNLS", rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        Ridge(positive=True, solver="lbfgs", max_iter=1, tol=1e-12).fit(shard(X), shard(ypos))
    warned = any("lbfgs solver did not converge" in str(r.message) for r in rec)
    check(warned and comm.allgather_obj(warned) == [True] * size, "positive lbfgs max_iter=1: no warning everywhere")
    m = Ridge().fit(shard(X, True), shard(y, True)[:, None])
    check(m.coef_.shape == (X.shape[1],) and np.shape(m.intercept_) == (1,),
          f"one-column y: coef_ {m.coef_.shape}, intercept_ {np.shape(m.intercept_)}")
    # one row in total (on rank 0): R² is undefined on every rank
    rows = slice(0, 1) if rank == 0 else slice(0, 0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = m.score(X[rows], y[rows])
    check(np.isnan(s), f"score on one row in total: {s}")
    check(any(issubclass(r.category, UndefinedMetricWarning) for r in rec), "score on one row: no warning")
    s = m.score(shard(X), shard(y))
    check(np.isfinite(s) and s == comm.allgather_obj(s)[0], f"score on all rows: {s}")


def main():
    callback_checks()
    refusal_checks()
    copy_x_checks()
    ridge_checks()


if __name__ == "__main__":
    warnings.simplefilter("ignore", UserWarning)
    guarded(main, comm)

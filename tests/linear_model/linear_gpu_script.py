"""Multi-rank linear models on CuPy shards (one GPU per rank), run by test_gpu_linear.py.

The CuPy path is the NumPy path's code on another namespace: its results must
match the NumPy fit on the same shards and scikit-learn on the gathered data.
"""

import warnings

import cupy as cp
import numpy as np
from sklearn import linear_model as sk
from sklearn.datasets import make_classification, make_regression

from mpiml.comm import get_comm
from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()


def shard(a):
    w = np.arange(1, size + 1, dtype=np.float64)
    b = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * a.shape[0]).astype(int)])
    return a[b[rank]:b[rank + 1]]


def rel(a, b):
    a = a.get() if isinstance(a, cp.ndarray) else np.asarray(a)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def same_bits(est, what):
    """Every rank holds the same bits of coef_ and intercept_."""
    mine = (np.asarray(est.coef_.get() if isinstance(est.coef_, cp.ndarray) else est.coef_).tobytes(),
            np.asarray(est.intercept_.get() if isinstance(est.intercept_, cp.ndarray) else est.intercept_).tobytes())
    check(len(set(comm.allgather_obj(mine))) == 1, f"{what}: the same bits on every rank")


def main():
    X, Y = make_regression(n_samples=5000, n_features=20, n_targets=2, noise=1.0, random_state=0)
    X += 3.0
    w = np.random.RandomState(1).uniform(0.5, 2.0, len(X))
    Xd, Yd, wd = cp.asarray(shard(X)), cp.asarray(shard(Y)), cp.asarray(shard(w))
    for solver in ("normal", "tsqr"):
        g = LinearRegression(solver=solver).fit(Xd, Yd, sample_weight=wd)
        h = LinearRegression(solver=solver).fit(shard(X), shard(Y), sample_weight=shard(w))
        s = sk.LinearRegression().fit(X, Y, sample_weight=w)
        check(isinstance(g.coef_, cp.ndarray) and isinstance(g.intercept_, cp.ndarray), f"{solver}: outputs follow X")
        check(rel(g.coef_, h.coef_) < 1e-10, f"{solver}: GPU vs host coef")
        check(rel(g.coef_, s.coef_) < 1e-8, f"{solver}: GPU vs scikit-learn coef")
        check(isinstance(g.predict(Xd), cp.ndarray), f"{solver}: predict follows X")
        assert_close(g.predict(Xd).get(), shard(s.predict(X)), f"{solver}: predict", rtol=1e-8, atol=1e-8)
        check(abs(g.score(Xd, Yd) - s.score(X, Y)) < 1e-10, f"{solver}: score")
        r = Ridge(alpha=[1.0, 50.0], solver="svd" if solver == "tsqr" else "cholesky").fit(Xd, Yd)
        check(rel(r.coef_, sk.Ridge(alpha=[1.0, 50.0]).fit(X, Y).coef_) < 1e-8, f"Ridge {solver}: GPU coef")
    g32 = LinearRegression().fit(Xd.astype(cp.float32), Yd[:, 0].astype(cp.float32))
    check(g32.coef_.dtype == cp.float32 and rel(g32.coef_, sk.LinearRegression().fit(X, Y[:, 0]).coef_) < 1e-4,
          "float32 on the GPU")

    # the one-pass paths: float32 auto (normal equations through the Gram kernel), NaN on one rank only
    Xa, ya = make_regression(n_samples=40000, n_features=64, noise=1.0, random_state=1)
    Xa = (Xa + 2.0).astype(np.float32)
    ya = ya.astype(np.float32)
    g = LinearRegression().fit(cp.asarray(shard(Xa)), cp.asarray(shard(ya)))
    h = LinearRegression().fit(shard(Xa), shard(ya))
    check(g.solver_ == "normal" and rel(g.coef_, h.coef_) < 1e-6, f"float32 auto on the GPU: {g.solver_}")
    same_bits(g, "float32 auto on the GPU (the compiled algebra)")
    rg = Ridge(alpha=3.0).fit(cp.asarray(shard(Xa)), cp.asarray(shard(ya)))
    check(rg.solver_ == "cholesky" and rel(rg.coef_, Ridge(alpha=3.0).fit(shard(Xa), shard(ya)).coef_) < 1e-6,
          f"float32 Ridge auto on the GPU: {rg.solver_}")
    same_bits(rg, "float32 Ridge auto on the GPU (the compiled algebra)")
    Xn = shard(Xa).copy()
    if rank == size - 1:
        Xn[0, 0] = np.nan
    try:
        LinearRegression().fit(cp.asarray(Xn), cp.asarray(shard(ya)))
        check(False, "NaN on the last rank was not found")
    except ValueError as exc:
        check("NaN" in str(exc), f"NaN message: {exc}")
    Xb, yb2 = make_classification(n_samples=20000, n_features=30, random_state=3)
    Xbn = shard(Xb).copy()
    if rank == size - 1:
        Xbn[1, 2] = np.inf
    try:   # L-BFGS finds it in its first evaluation: the same error on every rank
        LogisticRegression().fit(cp.asarray(Xbn), cp.asarray(shard(yb2)))
        check(False, "infinity on the last rank was not found (LogisticRegression)")
    except ValueError as exc:
        check("infinity" in str(exc) and (size == 1 or f"[{size - 1}]" in str(exc)), f"infinity message: {exc}")
    g = LogisticRegression(tol=1e-8).fit(cp.asarray(shard(Xb)), cp.asarray(shard(yb2)))
    s = sk.LogisticRegression(tol=1e-8).fit(Xb, yb2)
    check(rel(g.coef_, s.coef_) < 1e-5, f"fused binary logistic: rel {rel(g.coef_, s.coef_):.1e}")
    same_bits(g, "fused binary logistic")
    check(g._early_first_pass, "the first evaluation ran during validation")
    if size > 1:
        # a rank whose labels are one class only does not launch it early, the others do: the same bits as a fit
        # where no rank does (and on every rank)
        yone = shard(yb2).copy()
        if rank == 0:
            yone[:] = 1
        yall = np.concatenate(comm.allgather_obj(yone))
        g1 = LogisticRegression(tol=1e-8).fit(cp.asarray(shard(Xb)), cp.asarray(yone))
        check(g1._early_first_pass == (rank != 0), f"early first evaluation where two labels: {g1._early_first_pass}")
        from mpiml.linear_model._logistic_loss import EarlyPass
        applies = EarlyPass.applies
        EarlyPass.applies = staticmethod(lambda *a, **k: False)
        try:
            g2 = LogisticRegression(tol=1e-8).fit(cp.asarray(shard(Xb)), cp.asarray(yone))
        finally:
            EarlyPass.applies = staticmethod(applies)
        check(not g2._early_first_pass and g1.n_iter_[0] == g2.n_iter_[0]
              and np.array_equal(g1.coef_.get(), g2.coef_.get()) and np.array_equal(g1.intercept_.get(),
                                                                                     g2.intercept_.get()),
              "early first evaluation: the same bits as without it")
        same_bits(g1, "fused binary logistic, one class on rank 0")
        s1 = sk.LogisticRegression(tol=1e-8).fit(Xb, yall)
        check(rel(g1.coef_, s1.coef_) < 1e-5, f"one class on rank 0: rel {rel(g1.coef_, s1.coef_):.1e}")
    g = LinearRegression().fit(cp.asarray(shard(Xa)), cp.asarray(shard(ya)))
    same_bits(g, "float32 auto (device Gram allreduce)")
    g = Ridge(alpha=3.0).fit(cp.asarray(shard(Xa)), cp.asarray(shard(ya)))
    ref = sk.Ridge(alpha=3.0).fit(Xa.astype(np.float64), ya)
    check(rel(g.coef_, ref.coef_) < 1e-5, "float32 Ridge auto on the GPU")
    same_bits(g, "float32 Ridge auto")

    # the last rank without rows: its parts of the device reductions are zeros made on the host side
    if size > 1:
        def rows_but_last(a):
            b = np.linspace(0, a.shape[0], size).astype(int)
            return a[b[rank]:b[rank + 1]] if rank < size - 1 else a[:0]
        g = LogisticRegression(tol=1e-8).fit(cp.asarray(rows_but_last(Xb)), cp.asarray(rows_but_last(yb2)))
        check(rel(g.coef_, s.coef_) < 1e-5, f"fused binary logistic, an empty rank: rel {rel(g.coef_, s.coef_):.1e}")
        same_bits(g, "fused binary logistic, an empty rank")
        g = LinearRegression().fit(cp.asarray(rows_but_last(Xa)), cp.asarray(rows_but_last(ya)))
        h = sk.LinearRegression().fit(Xa.astype(np.float64), ya)
        check(rel(g.coef_, h.coef_) < 1e-4, f"float32 auto, an empty rank: rel {rel(g.coef_, h.coef_):.1e}")
        same_bits(g, "float32 auto, an empty rank")

    X, y = make_classification(n_samples=6000, n_features=12, n_informative=6, n_classes=3, random_state=0)
    Xd, yd = cp.asarray(shard(X)), cp.asarray(shard(y))
    for solver in ("lbfgs", "newton-cholesky"):
        g = LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(Xd, yd)
        s = sk.LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, y)
        check(isinstance(g.coef_, cp.ndarray), f"{solver}: coef follows X")
        check(rel(g.coef_, s.coef_) < 1e-6, f"{solver}: GPU multinomial coef rel {rel(g.coef_, s.coef_):.1e}")
        assert_close(g.predict_proba(Xd).get(), shard(s.predict_proba(X)), f"{solver}: proba", rtol=1e-6, atol=1e-8)
        check(bool((g.predict(Xd).get() == shard(s.predict(X))).all()), f"{solver}: predict")
        check(abs(g.score(Xd, yd) - s.score(X, y)) < 1e-12, f"{solver}: score")
        yb = cp.asarray(shard(y == 2).astype(np.int64))
        gb = LogisticRegression(solver=solver, tol=1e-10, class_weight="balanced").fit(Xd, yb)
        sb = sk.LogisticRegression(solver=solver, tol=1e-10, class_weight="balanced").fit(X, (y == 2).astype(int))
        check(rel(gb.coef_, sb.coef_) < 1e-6, f"{solver}: GPU binary coef")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    guarded(main, comm)

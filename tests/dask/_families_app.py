"""The other estimator families driven from a Dask client (test_families.py).

``_families_app.py OUT.json``: for each of mpiml.linear_model, .decomposition
and .ensemble that is importable, fits its Dask wrapper on dask arrays spread
over two workers and compares with the SPMD estimator run in this process on
the same rows (in the same order). Writes the failed checks as JSON.
"""

import importlib
import json
import sys

import numpy as np

import dask.array as da
from _estimator_app import placed, to_host
from mpiml.dask import get_client, worker_addresses

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def close(a, b, msg, rtol=1e-8, atol=1e-10):
    a, b = np.asarray(to_host(a), dtype=float), np.asarray(to_host(b), dtype=float)
    check(a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol), f"{msg}: {a.ravel()[:3]} != {b.ravel()[:3]}")


def have(family):
    try:
        importlib.import_module(f"mpiml.{family}")
        return True
    except ImportError:
        return False


def main(out):
    client = get_client()
    workers = worker_addresses(client)
    rng = np.random.default_rng(1)
    Xn = rng.normal(size=(1800, 6))
    yr = Xn @ np.array([1.0, -2.0, 0.5, 0.0, 3.0, 1.5]) + 0.3 + 0.1 * rng.normal(size=1800)
    yc = (Xn[:, 0] - Xn[:, 1] + 0.3 * rng.normal(size=1800) > 0).astype(np.int64)
    bounds = [0, 500, 800, 1300, 1800]
    owners = [workers[1], workers[1], workers[0], workers[0]]  # members in block order

    def spread(a):
        return placed(client, [a[s:e] for s, e in zip(bounds[:-1], bounds[1:])], owners, np)

    X, Yr, Yc = spread(Xn), spread(yr), spread(yc)
    tested = []

    if have("linear_model"):
        from mpiml import linear_model as spmd
        from mpiml.dask import linear_model as dsk

        for name, kw in (("LinearRegression", {}), ("Ridge", {"alpha": 2.0})):
            ref = getattr(spmd, name)(**kw).fit(Xn, yr)
            got = getattr(dsk, name)(**kw).fit(X, Yr)
            close(got.coef_, ref.coef_, f"{name} coef_")
            close(got.intercept_, ref.intercept_, f"{name} intercept_")
            pred = got.predict(X)
            check(isinstance(pred, da.Array), f"{name}.predict is lazy")
            close(pred.compute(), ref.predict(Xn), f"{name} predict")
            close(got.score(X, Yr), ref.score(Xn, yr), f"{name} score")
        ref = spmd.LogisticRegression(C=0.5).fit(Xn, yc)
        got = dsk.LogisticRegression(C=0.5).fit(X, Yc)
        close(got.coef_, ref.coef_, "LogisticRegression coef_", rtol=1e-5, atol=1e-7)
        close(got.predict_proba(X).compute(), ref.predict_proba(Xn), "predict_proba", rtol=1e-5, atol=1e-7)
        check(np.array_equal(to_host(got.predict(X).compute()), ref.predict(Xn)), "LogisticRegression predict")
        tested.append("linear_model")

    if have("decomposition"):
        from mpiml import decomposition as spmd
        from mpiml.dask import decomposition as dsk

        ref = spmd.PCA(n_components=3, svd_solver="covariance_eigh").fit(Xn)
        got = dsk.PCA(n_components=3, svd_solver="covariance_eigh").fit(X)
        close(got.components_, ref.components_, "PCA components_")
        close(got.explained_variance_, ref.explained_variance_, "PCA explained_variance_")
        close(got.transform(X).compute(), ref.transform(Xn), "PCA transform")
        close(got.fit_transform(X).compute(), ref.transform(Xn), "PCA fit_transform")
        close(got.inverse_transform(got.transform(X)).compute(), ref.inverse_transform(ref.transform(Xn)),
              "PCA inverse_transform")
        ref = spmd.TruncatedSVD(n_components=2, random_state=0).fit(Xn)
        got = dsk.TruncatedSVD(n_components=2, random_state=0).fit(X)
        close(got.explained_variance_, ref.explained_variance_, "TruncatedSVD explained_variance_", rtol=1e-6)
        tested.append("decomposition")

    if have("ensemble"):
        from mpiml import ensemble as spmd
        from mpiml.dask import ensemble as dsk

        kw = {"n_estimators": 8, "max_depth": 6, "random_state": 0}
        ref = spmd.RandomForestClassifier(**kw).fit(Xn, yc)
        got = dsk.RandomForestClassifier(**kw).fit(X, Yc)
        agree = float((to_host(got.predict(X).compute()) == ref.predict(Xn)).mean())
        check(agree > 0.97, f"RandomForestClassifier predictions agree on {agree:.3f} of the rows")
        check(got.score(X, Yc) > 0.85, f"RandomForestClassifier score {got.score(X, Yc)}")
        check(got.predict_proba(X).shape == (1800, 2), "predict_proba shape")
        reg = dsk.RandomForestRegressor(**kw).fit(X, Yr)
        check(reg.score(X, Yr) > 0.8, f"RandomForestRegressor score {reg.score(X, Yr)}")
        tested.append("ensemble")

    with open(out, "w") as f:
        json.dump({"failures": failures, "tested": tested}, f)


if __name__ == "__main__":
    main(sys.argv[1])

"""mpiml.dask.neighbors from a Dask client (test_dask_neighbors.py): fit on blocks spread over two
workers, query with dask arrays, compare with the SPMD estimators run in this process on the same rows."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dask"))

import dask.array as da  # noqa: E402
from _estimator_app import placed, to_host  # noqa: E402

from mpiml import neighbors as spmd  # noqa: E402
from mpiml.dask import get_client, worker_addresses  # noqa: E402
from mpiml.dask import neighbors as dsk  # noqa: E402

failures = []
checked = []


def check(cond, msg):
    checked.append(msg)
    if not cond:
        failures.append(msg)


def main(out):
    client = get_client()
    workers = worker_addresses(client)
    rng = np.random.default_rng(2)
    Xn = rng.normal(size=(900, 5))
    yc = (Xn[:, 0] + 0.3 * rng.normal(size=900) > 0).astype(np.int64)
    bounds = [0, 250, 400, 650, 900]
    owners = [workers[1], workers[1], workers[0], workers[0]]

    def spread(a):
        return placed(client, [a[s:e] for s, e in zip(bounds[:-1], bounds[1:])], owners, np)

    X, Yc = spread(Xn), spread(yc)
    for ex in ("overlap", "onesided"):
        ref = spmd.NearestNeighbors(n_neighbors=4).fit(Xn)
        nn = dsk.NearestNeighbors(n_neighbors=4, exchange=ex).fit(X)
        dist, ind = nn.kneighbors(X)
        check(isinstance(ind, da.Array), "kneighbors returns dask arrays")
        want_d, want_i = ref.kneighbors(Xn)
        check(np.allclose(to_host(dist.compute()), want_d), f"{ex}: distances")
        check(np.array_equal(to_host(ind.compute()), want_i), f"{ex}: indices")
        clf = dsk.KNeighborsClassifier(n_neighbors=5, exchange=ex).fit(X, Yc)
        rclf = spmd.KNeighborsClassifier(n_neighbors=5).fit(Xn, yc)
        check(np.allclose(to_host(clf.predict_proba(X).compute()), rclf.predict_proba(Xn)), f"{ex}: proba")
        check(abs(clf.score(X, Yc) - rclf.score(Xn, yc)) < 1e-12, f"{ex}: score")
        reg = dsk.KNeighborsRegressor(n_neighbors=5, exchange=ex).fit(X, spread(Xn[:, 1]))
        rreg = spmd.KNeighborsRegressor(n_neighbors=5).fit(Xn, Xn[:, 1])
        check(np.allclose(to_host(reg.predict(X).compute()), rreg.predict(Xn)), f"{ex}: regression")
    with open(out, "w") as f:
        json.dump({"failures": failures, "checked": len(checked)}, f)


if __name__ == "__main__":
    main(sys.argv[1])

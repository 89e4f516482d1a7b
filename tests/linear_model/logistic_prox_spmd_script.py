"""L1 / elastic-net LogisticRegression on N ranks, run under ``mpiexec -n N`` by test_logistic_prox.py.

Every rank builds the same global data, keeps an uneven shard (NumPy, SciPy CSR, or
CuPy with ``--gpu``; the last rank of 3 or 4 keeps none in one case), fits, and compares
with mpiml on one process and scikit-learn on the gathered data. The coefficients
must be bit-identical on every rank. Verdicts are collective (tests/_spmd.py).

Usage: logistic_prox_spmd_script.py [--gpu]
"""

import sys
import warnings

import numpy as np
from sklearn import linear_model as sk
from sklearn.datasets import make_classification

from mpiml.comm import get_comm
from mpiml.linear_model import LogisticRegression

from _spmd import assert_close, check, guarded, local_rows

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
GPU = "--gpu" in sys.argv


def same_on_every_rank(a, msg):
    a = np.atleast_1d(np.asarray(a, dtype=np.float64)).ravel()
    check(np.array_equal(comm.allgather(a[None]).reshape(size, -1), np.tile(a, (size, 1))),
          f"{msg}: not bit-identical on every rank")


def host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


CASES = [  # (n_classes, kind, options)
    (2, "dense", dict(solver="saga", l1_ratio=1.0, C=0.3)),
    (2, "dense", dict(solver="liblinear", l1_ratio=1.0, C=0.3)),
    (2, "sparse", dict(solver="saga", l1_ratio=0.5, C=1.0)),
    (3, "dense", dict(solver="saga", l1_ratio=0.7, C=0.5)),
    (3, "dense", dict(solver="saga", l1_ratio=1.0, C=2.0, fit_intercept=False)),
]


def main(*argv):
    """The checks; ``"--gpu"`` in ``argv`` (a case of a shared GPU launch) or on the command line: CuPy shards."""
    global GPU
    GPU = GPU or "--gpu" in argv
    for n_classes, kind, opts in CASES:
        X, y = make_classification(n_samples=400, n_features=12, n_informative=5, n_classes=n_classes,
                                   random_state=n_classes)
        w = np.random.RandomState(1).uniform(0.5, 2.0, X.shape[0])
        if kind == "sparse":
            X = np.where(np.abs(X) < 0.8, 0.0, X)
        skip = n_classes == 3
        Xs, ys, ws = local_rows((X, y, w), rank, size, skip, kind == "sparse", GPU)
        label = f"{n_classes} classes, {kind}, {opts}"
        ours = LogisticRegression(tol=1e-8, max_iter=200, **opts).fit(Xs, ys, sample_weight=ws)
        coef, icpt = host(ours.coef_), host(ours.intercept_)
        same_on_every_rank(np.concatenate([coef.ravel(), icpt.ravel()]), label)
        one = LogisticRegression(tol=1e-8, max_iter=200, comm=SELF, **opts).fit(X, y, sample_weight=w)
        assert_close(coef, one.coef_, f"{label}: N ranks vs one process", rtol=1e-6, atol=1e-8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = sk.LogisticRegression(tol=1e-12, max_iter=20000, **opts).fit(X, y, sample_weight=w)
        assert_close(coef, ref.coef_.astype(coef.dtype), f"{label}: vs scikit-learn", rtol=0, atol=2e-5)
        assert_close(icpt, ref.intercept_.astype(icpt.dtype), f"{label}: intercept vs scikit-learn",
                     rtol=0, atol=2e-5)
        check(np.array_equal(coef == 0, ref.coef_ == 0), f"{label}: sparsity pattern differs from scikit-learn")


if __name__ == "__main__":   # (else one case of a shared launch: _launches.py)
    guarded(main, comm)

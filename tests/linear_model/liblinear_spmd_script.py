"""``LogisticRegression(solver="liblinear")`` (L2) on N ranks, run under ``mpiexec -n N`` by test_liblinear.py.

Every rank builds the same global data and keeps an uneven shard (NumPy, SciPy CSR, or CuPy
with ``--gpu``; the last rank of 3 or 4 keeps none in some cases). Checked:

* the coefficients are bit-identical on every rank;
* primal (trust-region Newton): equal to scikit-learn's LIBLINEAR fit on the gathered rows
  at the same ``tol`` (the same iterates: 1e-9), and to one process (1e-12);
* dual (coordinate descent, rows gathered on rank 0): bit-identical to one process with the
  same ``random_state`` (the visiting order is a permutation of the global rows), a
  different ``random_state`` gives a different point at ``tol=1e-3``, and at a tight
  ``tol`` the minimiser scikit-learn's LIBLINEAR finds.

Verdicts are collective (tests/_spmd.py).  Usage: liblinear_spmd_script.py [--gpu]
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


def host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def same_on_every_rank(a, msg):
    a = np.atleast_1d(np.asarray(a, dtype=np.float64)).ravel()
    check(np.array_equal(comm.allgather(a[None]).reshape(size, -1), np.tile(a, (size, 1))),
          f"{msg}: not bit-identical on every rank")


def data(kind, seed):
    X, y = make_classification(n_samples=240, n_features=10, n_informative=5, random_state=seed)
    if kind == "sparse":
        X = np.where(np.abs(X) < 0.8, 0.0, X)
    w = np.random.RandomState(seed).uniform(0.5, 2.0, X.shape[0])
    return X, y, w


def local(X, y, w, kind, skip):
    return local_rows((X, y, w), rank, size, skip, kind == "sparse", GPU)


def params(est):
    return np.concatenate([host(est.coef_).ravel(), np.atleast_1d(host(est.intercept_)).ravel()])


PRIMAL = [  # (kind, skip_last, options)
    ("dense", False, dict()),
    ("dense", True, dict(fit_intercept=False, C=0.3)),
    ("sparse", False, dict(intercept_scaling=3.0, class_weight="balanced")),
    ("dense", False, dict(C=10.0, class_weight={0: 2.0, 1: 0.5}, tol=1e-2)),
]

DUAL = [
    ("dense", False, dict()),
    ("sparse", True, dict(intercept_scaling=2.0, C=0.5)),
    ("dense", True, dict(fit_intercept=False, class_weight="balanced")),
]


def main(*argv):
    """The checks; ``"--gpu"`` in ``argv`` (a case of a shared GPU launch) or on the command line: CuPy shards."""
    global GPU
    GPU = GPU or "--gpu" in argv
    for case, (kind, skip, opts) in enumerate(PRIMAL):
        X, y, w = data(kind, case)
        label = f"primal {kind} {opts}"
        ours = LogisticRegression(solver="liblinear", **opts).fit(*local(X, y, w, kind, skip)[:2],
                                                                  sample_weight=local(X, y, w, kind, skip)[2])
        got = params(ours)
        same_on_every_rank(got, label)
        one = LogisticRegression(solver="liblinear", comm=SELF, **opts).fit(X, y, sample_weight=w)
        assert_close(got, params(one), f"{label}: N ranks vs one process", rtol=0, atol=1e-12)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = sk.LogisticRegression(solver="liblinear", **opts).fit(X, y, sample_weight=w)
        assert_close(got, params(ref), f"{label}: vs scikit-learn's LIBLINEAR at the same tol", rtol=0, atol=1e-9)
        check(int(ours.n_iter_[0]) == int(ref.n_iter_[0]), f"{label}: n_iter_ {ours.n_iter_} != {ref.n_iter_}")

    for case, (kind, skip, opts) in enumerate(DUAL):
        X, y, w = data(kind, 10 + case)
        label = f"dual {kind} {opts}"
        Xs, ys, ws = local(X, y, w, kind, skip)
        fits = {}
        for seed in (0, 1):
            est = LogisticRegression(solver="liblinear", dual=True, tol=1e-3, random_state=seed, **opts)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fits[seed] = params(est.fit(Xs, ys, sample_weight=ws))
            same_on_every_rank(fits[seed], f"{label} seed {seed}")
            one = LogisticRegression(solver="liblinear", dual=True, tol=1e-3, random_state=seed, comm=SELF, **opts)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (tol=1e-3 takes ~120 epochs here: LIBLINEAR's warning, as there)
                want = params(one.fit(X, y, sample_weight=w))
            # bit-identical, except that "balanced" class weights come from global sums of the
            # weights, which round differently at different rank counts
            exact = opts.get("class_weight") != "balanced"
            assert_close(fits[seed], want, f"{label}: N ranks vs one process", rtol=0, atol=1e-12, exact=exact)
        check(np.abs(fits[0] - fits[1]).max() > 1.5e-6, f"{label}: random_state changed nothing at tol=1e-3")
        tight = LogisticRegression(solver="liblinear", dual=True, tol=1e-10, max_iter=5000, random_state=0, **opts)
        got = params(tight.fit(Xs, ys, sample_weight=ws))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = sk.LogisticRegression(solver="liblinear", tol=1e-12, max_iter=5000, **opts).fit(X, y, sample_weight=w)
        assert_close(got, params(ref), f"{label}: the minimiser at a tight tol", rtol=0, atol=1e-6)


if __name__ == "__main__":   # (else one case of a shared launch: _launches.py)
    guarded(main, comm)

"""The core of test_sklearn_behaviour.py on several ranks (run under ``mpiexec -n 3``).

Every rank raises scikit-learn's error (type and text) at the same point and ends with
scikit-learn's fitted attributes (names, shapes, dtypes, values) on the gathered rows, for dense
and CSR shards in float64 and float32; verdicts are collective (tests/_spmd.py).
"""

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn import decomposition as skd

from mpiml.comm import get_comm
from mpiml.decomposition import PCA, TruncatedSVD

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
CLASSES = {"PCA": (PCA, skd.PCA), "TruncatedSVD": (TruncatedSVD, skd.TruncatedSVD)}


def shard(a):
    b = np.linspace(0, a.shape[0], size + 1).astype(int)
    return a[b[rank]:b[rank + 1]]


def data(n=150, d=9, seed=0, sparse=False, dtype=np.float64):
    rs = np.random.RandomState(seed)
    X = (rs.randn(n, d) * 0.8 ** np.arange(d)) @ np.linalg.qr(rs.randn(d, d))[0] + rs.randn(d)
    if sparse:
        X[rs.rand(n, d) < 0.5] = 0.0
    X = X.astype(dtype)
    return sp.csr_matrix(X) if sparse else X


def raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def errors():
    X = data()
    for name, kw, sparse in (("PCA", dict(n_components=-1), False),
                             ("PCA", dict(n_components=10, svd_solver="full"), False),
                             ("PCA", dict(n_components=9, svd_solver="arpack"), False),
                             ("PCA", dict(n_components=3, svd_solver="randomized"), True),
                             ("PCA", dict(n_components="mle"), True),
                             ("TruncatedSVD", dict(n_components=9, algorithm="arpack"), False),
                             ("TruncatedSVD", dict(n_components=10), True)):
        ours_cls, sk_cls = CLASSES[name]
        Xi = sp.csr_matrix(X) if sparse else X
        theirs = raised(lambda: sk_cls(**kw).fit(Xi))
        ours = raised(lambda: ours_cls(**kw).fit(shard(Xi)))
        tag = f"{name}({kw}) sparse={sparse}"
        kind = (lambda e: (isinstance(e, ValueError), isinstance(e, TypeError)))
        check(ours is not None and kind(ours) == kind(theirs), f"{tag}: {ours!r} vs {theirs!r}")
        check(str(ours) == str(theirs) or str(ours).startswith(str(theirs) + " (n_"), f"{tag}: {ours} vs {theirs}")
        texts = comm.allgather_obj(str(ours))
        check(len(set(texts)) == 1, f"{tag}: differs across ranks")


def fitted():
    for sparse in (False, True):
        for dtype in (np.float64, np.float32):
            X = data(sparse=sparse, dtype=dtype)
            for name, kw in (("PCA", dict(n_components=3)), ("PCA", dict(n_components=3, svd_solver="covariance_eigh")),
                             ("PCA", dict(n_components=3, svd_solver="arpack", whiten=True)),
                             ("TruncatedSVD", dict(n_components=3)),
                             ("TruncatedSVD", dict(n_components=3, algorithm="arpack"))):
                ours_cls, sk_cls = CLASSES[name]
                tag = f"{name}({kw}) sparse={sparse} {np.dtype(dtype).name}"
                s = sk_cls(**kw, random_state=0).fit(X)
                m = ours_cls(**kw, random_state=0).fit(shard(X))
                rtol = 1e-6 if dtype == np.float64 else 2e-3
                for key, want in vars(s).items():
                    if not key.endswith("_") or key.startswith("_"):
                        continue
                    got = getattr(m, key, None)
                    check(got is not None and np.shape(got) == np.shape(want), f"{tag}: {key} shape")
                    if isinstance(want, (np.ndarray, np.generic)):
                        check(np.asarray(got).dtype == np.asarray(want).dtype, f"{tag}: {key} dtype")
                    if np.asarray(want).dtype.kind == "f":
                        want = np.asarray(want)
                        assert_close(np.asarray(got, dtype=want.dtype), want, f"{tag}: {key}", rtol=rtol,
                                     atol=rtol * max(1e-3, float(np.abs(want).max())))
                Z = s.transform(X)
                assert_close(m.transform(shard(X)), shard(Z), f"{tag}: transform", rtol=rtol * 10,
                             atol=rtol * np.abs(Z).max())
                check(list(m.get_feature_names_out()) == list(s.get_feature_names_out()), f"{tag}: feature names")


def main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        errors()
        fitted()


guarded(main, comm)

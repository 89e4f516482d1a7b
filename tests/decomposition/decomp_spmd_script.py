"""Multi-rank PCA and TruncatedSVD checks, run under ``mpiexec -n N`` by test_decomposition_mpi.py.

Every rank builds the same global data, keeps an uneven shard (rank r holds a
share proportional to r + 1; one variant leaves rank 0 empty), and compares
the SPMD estimators with scikit-learn fitted on the whole data and with mpiml
on one process.  Verdicts are collective (tests/_spmd.py).

Usage: decomp_spmd_script.py [OUTDIR]   (OUTDIR: a PCA model file and the data are written there)
"""

import sys
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn import decomposition as skd

import mpiml
from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.decomposition import PCA, TruncatedSVD

from _spmd import assert_close, check, guarded

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
OUT = sys.argv[1] if len(sys.argv) > 1 else None


def bounds(n, empty_first=False):
    w = np.arange(1, size + 1, dtype=np.float64)
    if empty_first and size > 1:
        w[0] = 0.0
    return np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])


def shard(a, empty_first=False):
    b = bounds(a.shape[0], empty_first)
    return a[b[rank]:b[rank + 1]]


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def make_data(n, d, seed, offset=3.0):
    """Rows with a well-separated spectrum (distinct singular values) around a non-zero mean."""
    rs = np.random.RandomState(seed)
    V, _ = np.linalg.qr(rs.randn(d, d))
    scales = 10.0 * 0.8 ** np.arange(d)
    return (rs.randn(n, d) * scales) @ V.T + offset * rs.randn(d)


def compare(est, sk, tag, attrs, rtol=1e-6):
    for name in attrs:
        got, want = getattr(est, name), getattr(sk, name)
        if np.ndim(want) == 0:
            check(rel(float(got), float(want)) < rtol or abs(float(got) - float(want)) < 1e-12,
                  f"{tag}: {name} {got} vs scikit-learn {want}")
        else:
            want = np.asarray(want)
            assert_close(np.asarray(got), want, f"{tag}: {name}", rtol=rtol, atol=rtol * 1e-3 * np.abs(want).max())


PCA_ATTRS = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_",
             "noise_variance_", "n_components_", "n_samples_")
TSVD_ATTRS = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_")


def same_error_everywhere(fn, cls, tag, contains=""):
    """``fn()`` must raise ``cls`` on every rank with the same text."""
    msg = None
    try:
        fn()
    except cls as exc:
        msg = str(exc)
    except Exception as exc:  # the wrong class is a failure, reported as such
        msg = f"WRONG {type(exc).__name__}: {exc}"
    every = comm.allgather_obj(msg) if size > 1 else [msg]
    check(all(m is not None and not m.startswith("WRONG") for m in every), f"{tag}: not raised as {cls.__name__}: {every}")
    check(len(set(every)) == 1, f"{tag}: different messages across ranks: {every}")
    check(contains in (every[0] or ""), f"{tag}: {every[0]!r} does not contain {contains!r}")


def pca_checks():
    X = make_data(240, 16, 0)
    for empty in (False, True):
        Xl = shard(X, empty)
        rows = slice(bounds(len(X), empty)[rank], bounds(len(X), empty)[rank + 1])
        for solver, ncs in (("covariance_eigh", (5, None, 0.8, "mle")), ("full", (5, None, 0.8, "mle")),
                            ("randomized", (5,)), ("arpack", (5,))):
            for nc in ncs:
                for whiten in ((False, True) if nc == 5 else (False,)):
                    tag = f"PCA {solver} n_components={nc} whiten={whiten} empty={empty}"
                    kw = dict(n_components=nc, svd_solver=solver, whiten=whiten, random_state=0)
                    est = PCA(**kw)
                    Z = est.fit_transform(Xl)
                    sk = skd.PCA(**kw)
                    Zsk = sk.fit_transform(X)
                    compare(est, sk, tag, PCA_ATTRS)
                    assert_close(Z, Zsk[rows], f"{tag}: fit_transform", rtol=1e-6, atol=1e-9 * np.abs(Zsk).max())
                    assert_close(est.transform(Xl), sk.transform(X)[rows], f"{tag}: transform",
                                 rtol=1e-6, atol=1e-9 * np.abs(Zsk).max())
                    assert_close(est.inverse_transform(Z), sk.inverse_transform(Zsk)[rows],
                                 f"{tag}: inverse_transform", rtol=1e-6, atol=1e-9 * np.abs(X).max())
                    if nc == 5 and not whiten:
                        check(rel(est.score(Xl), sk.score(X)) < 1e-9, f"{tag}: score {est.score(Xl)} vs {sk.score(X)}")
                        assert_close(est.score_samples(Xl), sk.score_samples(X)[rows], f"{tag}: score_samples",
                                     rtol=1e-8)
                        one = PCA(**kw, comm=SELF).fit(X)
                        assert_close(est.components_, one.components_, f"{tag}: N ranks vs 1 rank",
                                     rtol=1e-9, atol=1e-12)

    # copy=False centres this rank's rows in place (as scikit-learn does) and stays correct
    Xl = shard(X).copy()
    est = PCA(5, svd_solver="full", copy=False).fit(Xl)
    sk = skd.PCA(5, svd_solver="full").fit(X)
    compare(est, sk, "PCA copy=False", PCA_ATTRS)

    # "auto" picks the same solver as scikit-learn on the global shape
    for shape in ((240, 16), (60, 40)):
        Xa = make_data(*shape, 1)
        est = PCA(3, random_state=0).fit(shard(Xa))
        sk = skd.PCA(3, random_state=0).fit(Xa)
        check(est._fit_svd_solver == sk._fit_svd_solver, f"auto solver {est._fit_svd_solver} vs {sk._fit_svd_solver}")
        compare(est, sk, f"PCA auto {shape}", PCA_ATTRS)

    # wide data (n < d): full (TSQR of a wide matrix) and randomized (transposed)
    W = make_data(30, 50, 2)
    for solver in ("full", "randomized", "covariance_eigh"):
        est = PCA(4, svd_solver=solver, random_state=1).fit(shard(W))
        sk = skd.PCA(4, svd_solver=solver, random_state=1).fit(W)
        compare(est, sk, f"PCA wide {solver}", PCA_ATTRS)

    # float32 is kept
    X32 = X.astype(np.float32)
    for solver in ("covariance_eigh", "full", "randomized"):
        est = PCA(4, svd_solver=solver, random_state=0).fit(shard(X32))
        sk = skd.PCA(4, svd_solver=solver, random_state=0).fit(X32)
        check(est.components_.dtype == np.float32 and est.transform(shard(X32)).dtype == np.float32,
              f"PCA float32 {solver}: dtype")
        assert_close(est.components_, sk.components_, f"PCA float32 {solver}: components", rtol=1e-3, atol=1e-4)
        assert_close(est.explained_variance_, sk.explained_variance_, f"PCA float32 {solver}: variance", rtol=1e-4)

    # rank-deficient X: duplicated and constant columns
    D = make_data(120, 8, 3)
    D[:, 5] = D[:, 1]
    D[:, 7] = 2.0
    for solver in ("covariance_eigh", "full", "randomized", "arpack"):
        est = PCA(4, svd_solver=solver, random_state=0).fit(shard(D))
        sk = skd.PCA(4, svd_solver=solver, random_state=0).fit(D)
        compare(est, sk, f"PCA rank-deficient {solver}", PCA_ATTRS)
    full = PCA(None, svd_solver="full").fit(shard(D))
    skf = skd.PCA(None, svd_solver="full").fit(D)
    assert_close(full.explained_variance_, skf.explained_variance_, "PCA rank-deficient all variances",
                 rtol=1e-6, atol=1e-10 * skf.explained_variance_.max())
    assert_close(full.components_[:6], skf.components_[:6], "PCA rank-deficient non-null components",
                 rtol=1e-6, atol=1e-9)


def tsvd_checks():
    X = make_data(240, 30, 4, offset=5.0)
    for empty in (False, True):
        Xl = shard(X, empty)
        rows = slice(bounds(len(X), empty)[rank], bounds(len(X), empty)[rank + 1])
        for kw in (dict(), dict(n_iter=1, power_iteration_normalizer="none"), dict(power_iteration_normalizer="QR"),
                   dict(n_iter=7, power_iteration_normalizer="LU"), dict(algorithm="arpack")):
            tag = f"TruncatedSVD {kw} empty={empty}"
            est = TruncatedSVD(5, random_state=0, **kw)
            Z = est.fit_transform(Xl)
            sk = skd.TruncatedSVD(5, random_state=0, **kw)
            Zsk = sk.fit_transform(X)
            compare(est, sk, tag, TSVD_ATTRS)
            assert_close(Z, Zsk[rows], f"{tag}: fit_transform", rtol=1e-6, atol=1e-9 * np.abs(Zsk).max())
            assert_close(est.transform(Xl), sk.transform(X)[rows], f"{tag}: transform", rtol=1e-6,
                         atol=1e-9 * np.abs(Zsk).max())
            assert_close(est.inverse_transform(Z), sk.inverse_transform(Zsk)[rows], f"{tag}: inverse_transform",
                         rtol=1e-6, atol=1e-9 * np.abs(X).max())
        one = TruncatedSVD(5, random_state=0, comm=SELF).fit(X)
        assert_close(est.components_, one.components_, "TruncatedSVD N ranks vs 1 rank", rtol=1e-9, atol=1e-12)
    # a slowly decaying spectrum, unconverged: still scikit-learn's answer for the same random matrix
    N = np.random.RandomState(5).randn(200, 40)
    est = TruncatedSVD(3, n_iter=2, random_state=7).fit(shard(N))
    sk = skd.TruncatedSVD(3, n_iter=2, random_state=7).fit(N)
    compare(est, sk, "TruncatedSVD noisy n_iter=2", TSVD_ATTRS)
    # wide: scikit-learn transposes
    W = make_data(25, 60, 6)
    for alg in ("randomized", "arpack"):
        est = TruncatedSVD(4, algorithm=alg, random_state=2).fit(shard(W))
        sk = skd.TruncatedSVD(4, algorithm=alg, random_state=2).fit(W)
        compare(est, sk, f"TruncatedSVD wide {alg}", TSVD_ATTRS)


def error_checks():
    X = make_data(40, 6, 8)
    Xl = shard(X)
    same_error_everywhere(lambda: PCA(7, svd_solver="full").fit(Xl), ValueError, "PCA too many components",
                          "n_components=7 must be between 0 and min(n_samples, n_features)=6")
    same_error_everywhere(lambda: PCA(6, svd_solver="arpack").fit(Xl), ValueError, "PCA arpack k = min",
                          "must be strictly less than")
    same_error_everywhere(lambda: PCA(0.5, svd_solver="randomized").fit(Xl), ValueError, "PCA float randomized",
                          "must be between 1 and")
    same_error_everywhere(lambda: PCA("mle", svd_solver="full").fit(make_data(5, 6, 0)[:5] if rank == 0
                                                                     else np.empty((0, 6))),
                          ValueError, "PCA mle wide", "only supported if n_samples >= n_features")
    same_error_everywhere(lambda: TruncatedSVD(7).fit(Xl), ValueError, "TruncatedSVD too many", "must be <=")
    same_error_everywhere(lambda: PCA(n_components=-1).fit(Xl), ValueError, "bad parameter", "'n_components'")
    if size > 1:
        bad = Xl.copy()
        if rank == size - 1:
            bad[0, 0] = np.nan
        for est in (PCA(2), TruncatedSVD(2)):
            same_error_everywhere(lambda: est.fit(bad), DistributedInputError, f"NaN {type(est).__name__}",
                                  f"NaN on rank(s) [{size - 1}]")
        narrow = Xl[:, :5] if rank == 1 else Xl
        same_error_everywhere(lambda: PCA(2).fit(narrow), DistributedInputError, "n_features differ",
                              "X has 5 features on rank 1 but 6 on rank 0")
    else:
        bad = Xl.copy()
        bad[0, 0] = np.nan
        same_error_everywhere(lambda: PCA(2).fit(bad), ValueError, "NaN single", "Input X contains NaN")


def make_sparse(n, d, seed, density=0.2):
    """A CSR matrix with a decaying column scale (distinct singular values) and non-zero column means."""
    rs = np.random.RandomState(seed)
    X = sp.random(n, d, density=density, random_state=rs, format="csr")
    X.data += 0.5
    return sp.csr_matrix(X @ sp.diags(3.0 * 0.85 ** np.arange(d)))


def sparse_checks():
    """CSR shards: PCA (implicit centring) and TruncatedSVD equal scikit-learn on the gathered CSR matrix."""
    X = make_sparse(300, 25, 11)
    for empty in (False, True):
        Xl = shard(X, empty)
        rows = slice(bounds(X.shape[0], empty)[rank], bounds(X.shape[0], empty)[rank + 1])
        for solver in ("auto", "arpack", "covariance_eigh"):
            for whiten in (False, True):
                tag = f"sparse PCA {solver} whiten={whiten} empty={empty}"
                est = PCA(4, svd_solver=solver, whiten=whiten, random_state=0)
                Z = est.fit_transform(Xl)
                sk = skd.PCA(4, svd_solver=solver, whiten=whiten, random_state=0)
                Zsk = sk.fit_transform(X)
                check(est._fit_svd_solver == sk._fit_svd_solver, f"{tag}: solver {est._fit_svd_solver}")
                compare(est, sk, tag, PCA_ATTRS)
                assert_close(Z, Zsk[rows], f"{tag}: fit_transform", rtol=1e-6, atol=1e-9 * np.abs(Zsk).max())
                assert_close(est.transform(Xl), sk.transform(X)[rows], f"{tag}: transform", rtol=1e-6,
                             atol=1e-9 * np.abs(Zsk).max())
                if not whiten and solver == "auto":
                    dense = PCA(4, svd_solver="arpack", random_state=0).fit(Xl.toarray())
                    assert_close(est.components_, dense.components_, f"{tag}: sparse vs dense", rtol=1e-8, atol=1e-10)
        for alg in ("randomized", "arpack"):
            tag = f"sparse TruncatedSVD {alg} empty={empty}"
            est = TruncatedSVD(4, algorithm=alg, random_state=0)
            Z = est.fit_transform(Xl)
            sk = skd.TruncatedSVD(4, algorithm=alg, random_state=0)
            Zsk = sk.fit_transform(X)
            compare(est, sk, tag, TSVD_ATTRS)
            assert_close(Z, Zsk[rows], f"{tag}: fit_transform", rtol=1e-6, atol=1e-9 * np.abs(Zsk).max())
            assert_close(est.transform(Xl), sk.transform(X)[rows], f"{tag}: transform", rtol=1e-6,
                         atol=1e-9 * np.abs(Zsk).max())
            dense = TruncatedSVD(4, algorithm=alg, random_state=0).fit(Xl.toarray())
            assert_close(est.components_, dense.components_, f"{tag}: sparse vs dense", rtol=1e-8, atol=1e-10)
    # wide sparse data (n < d: the randomised solver works on the transpose)
    W = make_sparse(40, 90, 12, density=0.3)
    for alg in ("randomized", "arpack"):
        est = TruncatedSVD(3, algorithm=alg, random_state=1).fit(shard(W))
        sk = skd.TruncatedSVD(3, algorithm=alg, random_state=1).fit(W)
        compare(est, sk, f"sparse TruncatedSVD wide {alg}", TSVD_ATTRS)
    # scikit-learn's TypeError for the solvers that need dense data, on every rank; sparse on some ranks only
    # counts as sparse (the solver is chosen alike everywhere)
    for solver in ("full", "randomized"):
        same_error_everywhere(lambda: PCA(3, svd_solver=solver).fit(shard(X)), TypeError, f"sparse PCA {solver}",
                              f'while "{solver}" was passed')
    if size > 1:
        mixed = shard(X) if rank == 0 else shard(X).toarray()
        est = PCA(4, random_state=0).fit(mixed)
        sk = skd.PCA(4, random_state=0).fit(X)
        compare(est, sk, "PCA sparse on rank 0 only", PCA_ATTRS)
        same_error_everywhere(lambda: PCA(3, svd_solver="full").fit(mixed), TypeError, "mixed full",
                              'while "full" was passed')
    bad = shard(X).copy()
    if rank == size - 1 and bad.nnz:
        bad.data[0] = np.nan
    same_error_everywhere(lambda: TruncatedSVD(2).fit(bad), DistributedInputError if size > 1 else ValueError,
                          "sparse NaN", "NaN")
    same_error_everywhere(lambda: PCA(2).fit(shard(X)).score(shard(X)), DistributedInputError if size > 1
                          else TypeError, "sparse score", "dense data is required")


def robustness_checks():
    """Hard cases for the decompositions: fewer directions than components, constant data."""
    rs = np.random.RandomState(9)
    R = rs.randn(90, 2) @ rs.randn(2, 7)                       # rank 2, three components asked
    for Xi in (R, sp.csr_matrix(R)):
        for alg in ("randomized", "arpack"):
            est = TruncatedSVD(3, algorithm=alg, random_state=0).fit(shard(Xi))
            sk = skd.TruncatedSVD(3, algorithm=alg, random_state=0).fit(Xi)
            tag = f"rank-2 TruncatedSVD {alg} sparse={sp.issparse(Xi)}"
            assert_close(est.singular_values_, sk.singular_values_, f"{tag}: singular values", rtol=1e-8,
                         atol=1e-6 * sk.singular_values_[0])
            assert_close(est.components_[:2], sk.components_[:2], f"{tag}: the two real directions", rtol=1e-6,
                         atol=1e-9)
    C = np.ones((60, 4)) * [1.0, 2.0, 3.0, 4.0]                 # no variance at all
    for solver in ("covariance_eigh", "full", "randomized", "arpack"):
        est = PCA(2, svd_solver=solver, random_state=0).fit(shard(C))
        check(np.isnan(est.explained_variance_ratio_).all() and np.all(est.explained_variance_ == 0),
              f"constant X {solver}: {est.explained_variance_}, {est.explained_variance_ratio_}")
        if solver != "arpack":  # scikit-learn's ARPACK raises ArpackError ("starting vector is zero") here
            sk = skd.PCA(2, svd_solver=solver, random_state=0).fit(C)
            check(np.isnan(sk.explained_variance_ratio_).all() and est.noise_variance_ == sk.noise_variance_,
                  f"constant X {solver}: scikit-learn differs")


def clustered_arpack_checks():
    """Ten components of a sparse matrix whose covariance tail is clustered (no decaying scale): the block
    Lanczos must converge (no ConvergenceWarning), the sparse fit must equal the dense one to 1e-8 (scikit-learn's
    test_pca_sparse asks 1e-7) and the one-process fit."""
    rs = np.random.RandomState(5)
    X = sp.csr_matrix(sp.random(600, 150, density=0.3, random_state=rs, format="csr")
                      @ sp.diags(rs.random_sample(150) * 10))
    Xl = shard(X, True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est = PCA(10, svd_solver="arpack", random_state=0).fit(Xl)
        dense = PCA(10, svd_solver="arpack", random_state=0).fit(Xl.toarray())
        one = PCA(10, svd_solver="arpack", random_state=0, comm=SELF).fit(X)
    check(not [r for r in rec if "converge" in str(r.message)], "clustered arpack: a convergence warning")
    for name in ("components_", "explained_variance_", "singular_values_"):
        assert_close(getattr(est, name), getattr(dense, name), f"clustered arpack sparse vs dense: {name}",
                     rtol=1e-8, atol=1e-12)
        assert_close(getattr(est, name), getattr(one, name), f"clustered arpack vs one process: {name}",
                     rtol=1e-8, atol=1e-12)


def flat_arpack_checks():
    """A random sparse matrix (a flat spectrum, its top singular values 1e-3 apart): the thick restart must
    converge here as on one process (no ConvergenceWarning, about as many restarts) to scikit-learn's
    triplets (the product count against ARPACK's: test_decomposition.py)."""
    rs = np.random.RandomState(1)
    nnz = 75_000
    X = sp.csr_matrix((rs.random_sample(nnz), (rs.randint(0, 10_000, nnz), rs.randint(0, 1_500, nnz))),
                      shape=(10_000, 1_500))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est = TruncatedSVD(10, algorithm="arpack", random_state=0).fit(shard(X, True))
        one = TruncatedSVD(10, algorithm="arpack", random_state=0, comm=SELF).fit(X)
    check(not [r for r in rec if "converge" in str(r.message)], "flat arpack: a convergence warning")
    check(abs(est.n_iter_ - one.n_iter_) <= 2, f"flat arpack: {est.n_iter_} restarts, {one.n_iter_} on one process")
    sk = skd.TruncatedSVD(10, algorithm="arpack", random_state=0).fit(X)
    assert_close(est.singular_values_, sk.singular_values_, "flat arpack: singular values", rtol=1e-12, atol=0)
    assert_close(est.components_, sk.components_, "flat arpack: components", rtol=0, atol=1e-8)


def main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        robustness_checks()
        clustered_arpack_checks()
        flat_arpack_checks()
        sparse_checks()
        pca_checks()
        tsvd_checks()
        error_checks()
    if OUT is not None:
        X = make_data(240, 16, 0)
        est = PCA(4, whiten=True).fit(shard(X))
        mpiml.save(est, f"{OUT}/pca.mpiml")
        if rank == 0:
            np.save(f"{OUT}/X.npy", X)


guarded(main, comm)

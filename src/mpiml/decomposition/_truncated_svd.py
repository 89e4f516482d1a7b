"""Truncated SVD (latent semantic analysis) of rows spread over ranks (SPMD), on NumPy or CuPy shards."""

from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin

from .._array import to_numpy
from ..base import SPMDEstimator
from ..kernels import sparse as _sparse_kernels
from ..utils._linalg import column_sq_dev, column_sums, is_sparse, svd_flip_rows
from ..utils._param_validation import Interval, StrOptions
from ._pca import _allreduce, _check_local, validate_local_rows, validated_rows
from ._lanczos import block_lanczos_svd
from ._solvers import SparseRows, checks_mode, mark, randomized_svd

__all__ = ["TruncatedSVD"]


def _global_variances(X, Xt, n, *, comm, xp):
    """Sum of the feature variances of ``X`` and the column variances of ``Xt`` (ddof=0), global.

    Two allreduces, of ``d + k`` (the sums: the means) and ``2 + k`` float64
    (the squared deviations and a count of columns to redo, whose reading is
    the one wait on the device).  A sparse ``X`` is not densified (its implicit
    zeros are counted, as scikit-learn's ``mean_variance_axis`` does); a
    ``cupyx`` shard with its transpose stored (:class:`SparseRows`) takes the
    moments of its columns from the kernel transpose's sort (sums and squares
    about the stored values' own mean, computed while it sorts, so no pass
    here: ``Σ (x - m)² = s2 + c (s1 / c - m)²`` over a column's ``c`` stored
    values, every term non-negative), or reads them off the rows of ``Xᵀ``
    in one pass (a kernel: sums and squares about the column's first stored
    value ``s``, then over the ``c`` stored values ``Σ (x - m)² = Q - 2 (m -
    s)(S - c s) + c (m - s)²``, exact algebra with ``s`` among the column's
    values), its check that ``Xᵀ``'s rows strictly increase read with the
    result (one wait; where they do not, duplicates, that rank's share is
    computed again from ``Xᵀ``, each run of a duplicate's values added first
    (:func:`_sq_dev_sorted`), and summed once more, on every rank alike).
    Dense CuPy blocks are read once by the column-moments kernel
    about a shift of this rank's own (the mean of its first rows): with ``S``
    the rank's sums, ``Q`` its squared deviations about ``s`` and ``m`` the
    global mean, its share is ``Q - 2 (m - s)(S - n_r s) + n_r (m - s)²``,
    exact algebra whose terms stay small while ``s`` is near ``m`` (the
    two-pass accuracy without the second read).  Host blocks: two passes.
    """
    stored = None
    if isinstance(X, SparseRows):
        if X.XT is not None and X.kernels is not None:
            stored = X
        X = X.X
    d, k = X.shape[1], Xt.shape[1]
    n_r = X.shape[0]
    moments = None
    if xp is not np:
        from ..kernels import sparse as moments

    def shifted(A):
        """(sums, squares about the shift, shift) of a dense CuPy block, one read."""
        shift = A[:256].astype(xp.float64).mean(axis=0) if A.shape[0] else xp.zeros(A.shape[1], dtype=xp.float64)
        S, Q = moments.dense_column_moments(A, shift)
        return S, Q, shift

    sums = xp.zeros(d + k, dtype=xp.float64)
    one_x = one_t = None
    by_sort = stored.moments if stored is not None else None    # the kernel transpose's: (s1, s2, dups)
    if n_r:
        if by_sort is not None:
            sums[:d] = by_sort[0]
        elif stored is not None:      # one pass: sums and squares about each column's first stored value
            XT = stored.XT
            s0 = XT.data[xp.minimum(XT.indptr[:-1], XT.nnz - 1)].astype(xp.float64)
            S_t, Q_t, not_canonical = stored.kernels.csr_row_moments(XT, s0, check="device")
            sums[:d] = S_t
        elif is_sparse(X) or moments is None:
            sums[:d] = column_sums(X)
        else:
            one_x = shifted(X)
            sums[:d] = one_x[0]
        if moments is None:
            sums[d:] = Xt.sum(axis=0, dtype=xp.float64)
        else:
            one_t = shifted(Xt)
            sums[d:] = one_t[0]
    mark("variances: sums", xp)
    means = _allreduce(comm, sums) / n
    sq = xp.zeros(2 + k, dtype=xp.float64)     # X's squared deviations, Xt's k, then the count of columns redone
    fast = None

    def share(first, m):
        S, Q, s = first
        return Q - 2.0 * (m - s) * (S - n_r * s) + n_r * (m - s) ** 2

    if n_r:
        done = False
        if by_sort is not None:
            # about the stored values' own mean: Σ (x - m)² = s2 + c (s1 / c - m)², every term non-negative
            s1, s2, dups = by_sort
            c = xp.diff(stored.XT.indptr).astype(xp.float64)
            m = means[:d]
            if int(dups.get()[0]) == 0:
                dev = s2 + c * (s1 / xp.maximum(c, 1.0) - m) ** 2
                sq[0] = (dev + (n_r - c) * m * m).sum()
                done = True
        elif stored is not None:
            m = means[:d]
            c = xp.diff(XT.indptr).astype(xp.float64)
            dev = Q_t - 2.0 * (m - s0) * (S_t - c * s0) + c * (m - s0) ** 2
            sq[0] = fast = (dev + (n_r - c) * m * m).sum()   # the implicit zeros add (rows - stored) m²
            sq[-1] = not_canonical[0]
            done = True
        if not done:
            sq[0] = (share(one_x, means[:d]) if one_x is not None else column_sq_dev(X, means[:d])).sum()
        sq[1:1 + k] = share(one_t, means[d:]) if one_t is not None else column_sq_dev(Xt, means[d:])
    mark("variances: squared deviations", xp)
    mine = sq[:1].copy()
    sq = _allreduce(comm, sq)
    head = to_numpy(sq[::1 + k])                 # X's total and the count of columns to redo: the one wait
    total = head[0]
    if head[-1] > 0:   # duplicates in some rank's Xᵀ: those ranks' shares again, from X; every rank sums again
        if fast is not None and int(to_numpy(not_canonical)[0]):
            mine[0] = _sq_dev_sorted(XT, means[:d], n_r, xp)
        total = to_numpy(_allreduce(comm, mine))[0]
    return float(total) / n, sq[1:1 + k] / n


def _sq_dev_sorted(XT, m, n_r, xp):
    """``Σ_columns Σ_rows (x - m)²`` of this rank's ``X`` (``n_r`` rows) from ``Xᵀ`` whose rows hold their indices
    in increasing order, duplicates next to each other (cuSPARSE's and the bucket transpose's): each run of equal
    indices is added up first (the matrix's value), then squared.  For ``X`` with duplicate entries, with no sort
    (where a copy of ``X`` with its duplicates summed took ~212 ms at 10^8 values)."""
    d = XT.shape[0]
    nnz = int(XT.indices.size)
    col = xp.searchsorted(XT.indptr, xp.arange(nnz, dtype=XT.indptr.dtype), side="right") - 1   # its row of Xᵀ
    idx = XT.indices
    head = xp.ones(nnz, dtype=bool)
    head[1:] = (idx[1:] != idx[:-1]) | (col[1:] != col[:-1])
    run = xp.cumsum(head) - 1
    sums = xp.bincount(run, weights=XT.data.astype(xp.float64))
    rcol = col[head]
    dev = sums - m[rcol]
    sq = xp.bincount(rcol, weights=dev * dev, minlength=d)
    stored = xp.bincount(rcol, minlength=d).astype(xp.float64)
    return (sq + (n_r - stored) * m * m).sum()


class TruncatedSVD(ClassNamePrefixFeaturesOutMixin, TransformerMixin, SPMDEstimator):
    """Dimensionality reduction by truncated SVD of rows spread over ranks (SPMD), NumPy or CuPy.

    The data are not centred (unlike :class:`PCA`).  Every rank calls
    :meth:`fit` with its own rows; the fitted model is the same on every rank
    and equals scikit-learn's TruncatedSVD on the concatenated rows (to
    rounding; with ``"randomized"`` and the same integer ``random_state`` the
    random matrix is scikit-learn's own, so the approximation is too).

    Parameters
    ----------
    n_components : int, default=2
        Number of singular triplets.
    algorithm : {"randomized", "arpack"}, default="randomized"
        ``"randomized"``: Halko et al. with ``n_iter`` power iterations, the
        distributed iterate orthonormalised by TSQR or CholeskyQR2.
        ``"arpack"``: thick-restarted block Lanczos on the distributed
        operator ``X^T X`` (one allreduce of ``d`` values per product); it
        converges to the same triplets as ARPACK, not by ARPACK's iteration.
    n_iter : int, default=5
        Power iterations of ``"randomized"``.
    n_oversamples : int, default=10
        Extra random vectors of ``"randomized"``.
    power_iteration_normalizer : {"auto", "QR", "LU", "none", "CholeskyQR2"}, default="auto"
        As :class:`PCA`'s: ``"QR"``/``"LU"`` use TSQR, ``"auto"`` is none for
        ``n_iter <= 2`` and CholeskyQR2 (falling back to TSQR) otherwise.
    random_state : int, RandomState instance or None, default=None
        An int gives scikit-learn's random matrix on every rank; otherwise
        rank 0 draws and broadcasts it.
    tol : float, default=0.0
        ``"arpack"``: relative residual of the Ritz pairs (0: about ``1000 eps``).
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Right singular vectors, replicated; NumPy or CuPy like ``X``.
    explained_variance_ : ndarray of shape (n_components,)
        Variance of each projection over all rows; replicated.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        Replicated.
    singular_values_ : ndarray of shape (n_components,)
        Replicated.
    n_features_in_ : int

    Notes
    -----
    Communicated per fit (``d`` features, ``k`` components, ``l = k + n_oversamples``):
    the input agreement (one small ``allgather_obj``), the row counts
    (allgather of one int64), then

    - ``"randomized"``: per power iteration one allreduce of ``d x l``
      float64 (``X^T Q``) plus the normaliser's (CholeskyQR2: two allreduces
      of ``l x l`` float64); at the end one orthonormalisation and one
      allreduce of ``d x l`` float64; when ``n < d`` the roles of the two
      sides swap (scikit-learn's ``transpose``);
    - ``"arpack"``: one allreduce of ``d`` float64 per product of ``XᵀX``
      with a vector (blocks of one, as ARPACK's);
    - the variances: two allreduces of ``d + k`` and ``k + 2`` float64 (one more
      of one value where a rank's ``Xᵀ`` has duplicate entries).

    :meth:`transform` and :meth:`inverse_transform` act on local rows and
    communicate nothing.  Only ``X @ V`` and ``X.T @ U`` touch the data in
    ``fit``, so a sparse shard can take the same path.
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"arpack", "randomized"})],
        "n_iter": [Interval(Integral, 0, None, closed="left")],
        "n_oversamples": [Interval(Integral, 1, None, closed="left")],
        "power_iteration_normalizer": [StrOptions({"auto", "QR", "LU", "none", "CholeskyQR2"})],
        "random_state": ["random_state"],
        "tol": [Interval(Real, 0, None, closed="left")],
    }
    _saved_attributes = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_")

    def __init__(self, n_components=2, *, algorithm="randomized", n_iter=5, n_oversamples=10,
                 power_iteration_normalizer="auto", random_state=None, tol=0.0, comm=None):
        self.n_components = n_components
        self.algorithm = algorithm
        self.n_iter = n_iter
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.tol = tol
        self.comm = comm

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    def fit(self, X, y=None):
        """Fit the model on the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float64 and float32 are kept).
        y : Ignored

        Returns
        -------
        self : TruncatedSVD
        """
        self.fit_transform(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit, then return the projections ``X @ components_.T`` of this rank's rows.

        Returns
        -------
        X_new : ndarray of shape (n_local_samples, n_components)
        """
        self._validate_params()
        comm = self._get_comm()
        mark("start")
        X, xp, counts, _ = validated_rows(self, X, comm, ensure_min_features=2)
        mark("validate", xp)
        n, d = int(counts.sum()), X.shape[1]
        k = self.n_components
        # a cupyx CSR shard: the sparse kernels, Xᵀ stored once per fit (see SparseRows)
        operand = SparseRows(X) if is_sparse(X) and xp is not np else X
        mark("operand (transpose queued)", xp)
        if self.algorithm == "arpack":
            if not k < min(n, d):  # scikit-learn passes scipy's svds message on; the shape follows it here
                raise ValueError(f"`k` must be an integer satisfying `0 < k < min(A.shape)`. (n_components={k}, "
                                 f"n_samples={n}, n_features={d})")
            _, S, Vt, self.n_iter_ = block_lanczos_svd(operand, k, comm=comm, xp=xp, tol=self.tol,
                                                       random_state=self.random_state)
        else:
            if k > d:
                raise ValueError(f"n_components({k}) must be <= n_features({d}).")
            deferred = xp is not np and checks_mode() == "deferred"
            _, S, Vt, *redo = randomized_svd(operand, k, comm=comm, xp=xp, n_rows=n,
                                             row_offset=int(counts[:comm.rank].sum()),
                                             n_oversamples=self.n_oversamples, n_iter=self.n_iter,
                                             power_iteration_normalizer=self.power_iteration_normalizer,
                                             random_state=self.random_state, want_u=False, deferred=deferred)
            if redo and redo[0] is not None:   # the device algebra's checks, read after the fit's end is queued
                X_transformed = self._finish(operand, X, S, Vt, n, comm, xp)
                again = redo[0]()
                if again is None:
                    return X_transformed
                _, S, Vt = again
        return self._finish(operand, X, S, Vt, n, comm, xp)

    def _finish(self, operand, X, S, Vt, n, comm, xp):
        """Signs, components, the projection of this rank's rows and the variances from a fit's ``S`` and ``Vt``."""
        _, Vt = svd_flip_rows(Vt)
        self.components_ = xp.ascontiguousarray(Vt.astype(X.dtype, copy=False))
        mark("signs", xp)
        X_transformed = operand.matmul(self.components_.T, xp) if operand is not X else X @ self.components_.T
        mark("X components_.T", xp)
        full_var, exp_var = _global_variances(operand, X_transformed, n, comm=comm, xp=xp)
        self.explained_variance_ = exp_var.astype(X.dtype)
        self.explained_variance_ratio_ = (exp_var / full_var).astype(X.dtype)
        self.singular_values_ = S.astype(X.dtype, copy=False)
        mark("variances", xp)
        return X_transformed

    def _on(self, xp):
        C = self.components_
        if xp is np and not isinstance(C, np.ndarray):
            return C.get()
        if xp is not np and isinstance(C, np.ndarray):
            return xp.asarray(C)
        return C

    def transform(self, X):
        """Project this rank's rows: ``X @ components_.T`` (no communication).

        Returns
        -------
        X_new : ndarray of shape (n_local_samples, n_components)
        """
        self._check_is_fitted()
        X, xp = validate_local_rows(self, X)
        C = self._on(xp).astype(X.dtype, copy=False)
        kernels = _sparse_kernels.for_shard(X)
        return kernels.csr_matmul(X, C.T) if kernels is not None else X @ C.T

    def inverse_transform(self, X):
        """Map projections back: ``X @ components_`` (no communication).

        Returns
        -------
        X_original : ndarray of shape (n_local_samples, n_features)
        """
        self._check_is_fitted()
        X, xp = _check_local(X)
        return X @ self._on(xp).astype(X.dtype, copy=False)

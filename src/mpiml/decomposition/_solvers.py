"""Truncated SVD solvers on a row-distributed matrix: the randomised range finder, the operators and products.

Both solvers (this one and :mod:`._lanczos`'s block Lanczos) touch the data
only through two products, so that a sparse shard (SciPy or ``cupyx`` CSR,
never densified) or an implicitly centred one (:class:`CentredRows`, what
PCA's ``"arpack"`` runs on sparse data) takes the same path as a dense shard:

* ``X @ V`` with ``V`` replicated ``(d, b)``: local rows out, no communication;
* ``X.T @ U`` with ``U`` local rows ``(n_r, b)``: summed over ranks, one
  allreduce of ``d * b`` values (float64 accumulation).

Every rank runs the same arithmetic on replicated small matrices, so every
rank takes the same branches and the same number of iterations.
"""

import contextlib
import os
import time
from numbers import Integral

import numpy as np
from sklearn.utils import check_random_state

from .._array import to_numpy
from ..kernels import sparse as _sparse_kernels
from ..utils._linalg import orthonormalize, tsqr
from ..utils._node_memory import sum_over_ranks

__all__ = ["gaussian_matrix", "randomized_svd", "resolve_normalizer", "CentredRows", "SparseRows"]


# ---------------------------------------------------------------------- timeline (benchmarks)
_TIMELINE = None


@contextlib.contextmanager
def timeline():
    """Within it, the fits on CuPy data record ``(label, CUDA event, host seconds)`` at each step into the list
    it yields (no synchronisation: the events time the device's work and idleness between the steps as the fit
    ran; ``benchmarks/sparse/spmm_gpu.py --timeline`` prints them).  Not thread-safe; for benchmarks."""
    global _TIMELINE
    _TIMELINE = marks = []
    try:
        yield marks
    finally:
        _TIMELINE = None


def mark(label, xp=None):
    """Record a step of the fit under :func:`timeline` (nothing otherwise, nor on host data)."""
    if _TIMELINE is None or xp is np:
        return
    import cupy

    ev = cupy.cuda.Event()
    ev.record()
    _TIMELINE.append((label, ev, time.perf_counter()))


# ---------------------------------------------------------------------- operator
class SparseRows:
    """A sparse shard as the solvers use it: ``X V`` and this rank's part of ``Xᵀ U``, optionally centred.

    With ``mean``, the operator is ``X - 1 meanᵀ`` of this rank's rows, never
    formed (implicit centring, what PCA's ``"arpack"`` runs on sparse data):
    ``(X - 1 mᵀ) V = X V - 1 (mᵀ V)`` and ``(X - 1 mᵀ)ᵀ U = Xᵀ U - m (1ᵀ U)``;
    both are linear in the local rows, so the second is summed over ranks like
    ``Xᵀ U`` itself (the same single allreduce).

    A ``cupyx`` CSR shard multiplies by :mod:`mpiml.kernels.sparse` (see
    :data:`mpiml.kernels.sparse.PRODUCTS`, ``MPIML_SPARSE_PRODUCTS``): cuSPARSE reads a skinny dense block a column at a
    time, far below the memory bandwidth, and multiplies by a transposed CSR
    matrix with atomics; here ``Xᵀ`` is stored as CSR once per fit (one
    conversion, the stored values' memory once more) and both products read
    the dense block a row at a time.  SciPy shards multiply as SciPy does.
    """

    def __init__(self, X, XT=None, mean=None, mode=None):
        self.X = X
        self.mean = mean
        self.shape, self.dtype = X.shape, X.dtype
        self.mode = _sparse_kernels.products_mode() if mode is None else mode
        self.kernels = _sparse_kernels.for_shard(X) if self.mode != "cusparse" else None
        self._pending = None
        self._aside = None      # the event after which X is ready, until the transpose is launched
        self._chunks = None
        self._moments = None
        if XT is None and not (self.kernels is not None and self.mode == "scatter"):
            if self.kernels is not None:   # launched after the first product is queued (see _launch_aside)
                import cupy

                self._aside = cupy.cuda.get_current_stream().record()
            else:   # cuSPARSE's products (or a shard the kernels do not take): cuSPARSE's conversion too
                XT = device_transpose(X, "cusparse")
        self._XT = XT

    def _launch_aside(self):
        """Launch the transpose on the side stream (after the work queued before this operand was made): called
        once the fit's first ``X V`` is queued, so the GPU runs that product while the host launches the transpose
        (0.86 ms of host time for the bucket transpose at 22:50, the GPU idle meanwhile when it came first)."""
        after, self._aside = self._aside, None
        try:
            self._pending = _transpose_aside(self.X, after)
        except Exception:  # noqa: BLE001 - any trouble with streams or kernels: cuSPARSE, in line
            self._XT = device_transpose(self.X, "cusparse")

    @property
    def XT(self):
        """``Xᵀ`` as CSR (None for a SciPy shard or without stored values); formed by a worker thread on a
        side stream, waited for here (the first products of a fit overlap the conversion)."""
        if self._aside is not None:
            self._launch_aside()
        if self._pending is not None:
            import cupy

            pending, self._pending = self._pending, None
            try:
                self._XT, self._moments, ready = pending.result()
            except Exception:  # noqa: BLE001 - any trouble with the thread, the streams or the kernels: cuSPARSE
                self._XT, self._moments, ready = device_transpose(self.X, "cusparse"), None, None
            if ready is not None:
                cupy.cuda.get_current_stream().wait_event(ready)
            mark("wait for the transpose", cupy)
        return self._XT

    @property
    def moments(self):
        """``(s1, s2, dups)`` per column of ``X`` (see :func:`mpiml.kernels.sparse.csr_transpose`) when the kernel
        transpose formed ``Xᵀ`` (computed by its sort), else None."""
        return self._moments if self.XT is not None else None

    def matmul(self, V, xp, padded=False):
        """``X V`` (centred when ``mean`` is set) of this rank's rows, in ``X``'s dtype; ``padded``: uncentred
        float32 products as the leading columns of a padded block (:func:`mpiml.kernels.sparse.csr_matmul`), which
        :meth:`rmatmul` reads with no copy."""
        if self.kernels is not None:
            out = self.kernels.csr_matmul(self.X, V, padded=padded and self.mean is None)
            if self._aside is not None:
                self._launch_aside()
        else:
            out = self.X @ V.astype(self.dtype, copy=False)
        if self.mean is not None:
            out = out - (self.mean.astype(self.dtype) @ V.astype(self.dtype, copy=False))[None, :]
        return out

    def rmatmul(self, U, xp):
        """This rank's part of ``Xᵀ U`` (centred when ``mean`` is set), float64."""
        if self.kernels is not None and self.XT is not None and self.mode == "kernels":
            if self._chunks is None and U.ndim == 2:   # U's rows in L2-sized chunks (once per fit)
                self._chunks = self.kernels.gather_chunks(self.XT, U.shape[1]) or False
            out = self.kernels.csr_matmul(self.XT, U, out_dtype=np.float64, chunks=self._chunks or None)
        elif self.kernels is not None:  # "scatter", or a shard with no rows or no stored value (no Xᵀ)
            out = self.kernels.csr_rmatmul_scatter(self.X, U, out_dtype=np.float64)
        else:
            XT = self.XT if self.XT is not None else self.X.T
            out = (XT @ U.astype(self.dtype, copy=False)).astype(xp.float64, copy=False)
        if self.mean is not None:
            out = out - xp.outer(self.mean.astype(xp.float64), U.sum(axis=0, dtype=xp.float64))
        return out


def CentredRows(X, mean):
    """``X - 1 meanᵀ`` of this rank's sparse rows, never formed (:class:`SparseRows` with ``mean``)."""
    return SparseRows(X, mean=mean)


_SIDE_STREAMS = {}
_WORKER = []


class _Done:
    """A future already done (the kernel transpose's: its launches return at once)."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


def _transpose_aside(X, after=None):
    """A future of ``(Xᵀ as CSR, moments, event)`` for a non-empty ``cupyx`` shard (else None), converted on a
    side stream (one per device, kept: CuPy's memory pool caches per stream) after the event ``after`` (default:
    the work queued so far), so the fit's first products run beside it.  The kernel transposes
    (``MPIML_SPARSE_TRANSPOSE=kernel|buckets``) are launched here (no wait on the device); cuSPARSE's conversion
    by a worker thread (it holds its thread, and measured on an H100 the GIL, for most of its 9 ms at 10^8 stored
    values)."""
    import cupy

    if not (X.nnz and X.shape[0]):
        return None
    dev = cupy.cuda.runtime.getDevice()
    side = _SIDE_STREAMS.get(dev)
    if side is None:
        side = _SIDE_STREAMS[dev] = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(after if after is not None else cupy.cuda.get_current_stream().record())

    how = _sparse_kernels.transpose_mode()
    if how == "kernel" and _sparse_kernels.supported(X):
        with side:
            XT, moments = _sparse_kernels.csr_transpose(X, moments=True)
            return _Done((XT, moments, side.record()))
    if how == "buckets" and _sparse_kernels.buckets_supported(X):
        with side:
            return _Done((_sparse_kernels.csr_transpose_buckets(X), None, side.record()))

    def convert():
        with cupy.cuda.Device(dev), side:
            XT, moments = device_transpose(X, how, moments=True)
            return XT, moments, side.record()

    if not _WORKER:
        from concurrent.futures import ThreadPoolExecutor

        _WORKER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpiml-transpose"))
    return _WORKER[0].submit(convert)


def device_transpose(X, how=None, moments=False):
    """``Xᵀ`` as CSR for a non-empty ``cupyx`` CSR shard, else None (host SciPy needs no help).

    ``how`` (default: ``MPIML_SPARSE_TRANSPOSE``, :data:`mpiml.kernels.sparse.TRANSPOSES`): ``"kernel"`` forms it
    by :func:`mpiml.kernels.sparse.csr_transpose` where the kernels take ``X``, ``"buckets"`` by
    :func:`mpiml.kernels.sparse.csr_transpose_buckets` where it takes ``X``, else by cuSPARSE
    (``X.T.tocsr()``), the same arrays every way (but for columns too long for the kernel's sort).
    ``moments``: ``(Xᵀ, moments)``, the column moments the kernel's sort computes (None otherwise).
    """
    XT = mom = None
    if type(X).__module__.startswith("cupyx") and getattr(X, "format", None) == "csr" and X.nnz and X.shape[0]:
        how = _sparse_kernels.transpose_mode() if how is None else how
        if how == "kernel" and _sparse_kernels.supported(X):
            XT, mom = _sparse_kernels.csr_transpose(X, moments=True)
        elif how == "buckets" and _sparse_kernels.buckets_supported(X):
            XT = _sparse_kernels.csr_transpose_buckets(X)
        else:
            XT = X.T.tocsr()
    return (XT, mom) if moments else XT


def _matvec(X, V, padded=False):
    """``X @ V`` on this rank's rows (``V`` cast to the dtype of ``X``: no copy of ``X``); ``padded``: see
    :meth:`SparseRows.matmul` (a view whose rows are not contiguous; others ignore it)."""
    if isinstance(X, SparseRows):
        from .._array import get_namespace

        return X.matmul(V, get_namespace(V), padded=padded)
    return X @ V.astype(X.dtype, copy=False)


#: Rows a batch of :func:`_tall_tmatmul` sums in the data's dtype (then float64 across batches).
_TALL_BATCH_ROWS = 1 << 15


def _tall_tmatmul(X, U, xp):
    """``Xᵀ U`` of a tall local block as float64: on a GPU one strided-batched GEMM over row batches.

    ``X.T @ U`` is a GEMM whose output (``d x b``) is tiny and whose inner
    dimension is the row count: a handful of output tiles, so a plain GEMM
    keeps few SMs busy.  Cut into batches of :data:`_TALL_BATCH_ROWS` rows
    (one cuBLAS strided-batched call), every batch is a GEMM of its own and
    the partial products are summed in float64.  Environment
    ``MPIML_DENSE_TPRODUCT=gemm`` keeps the plain GEMM (for comparison).
    """
    L = _TALL_BATCH_ROWS
    n, d = X.shape
    U = U.astype(X.dtype, copy=False)
    plain = xp is np or n < 4 * L or X.dtype not in (xp.float32, xp.float64) or not X.flags.c_contiguous \
        or os.environ.get("MPIML_DENSE_TPRODUCT") == "gemm"
    if not plain:
        try:
            return _batched_tmatmul(X, xp.ascontiguousarray(U), xp, L)
        except Exception:  # noqa: BLE001 - a CuPy without these cuBLAS bindings: the plain GEMM
            pass
    return (X.T @ U).astype(xp.float64, copy=False)


def _batched_tmatmul(X, U, xp, L):
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:
        from cupy.cuda import cublas
    n, d = X.shape
    b = U.shape[1]
    c = n // L
    m = c * L
    single = X.dtype == xp.float32
    data_type, compute_type = (0, 68) if single else (1, 70)   # CUDA_R_32F / 64F, CUBLAS_COMPUTE_32F / 64F
    part = xp.empty((c, d, b), dtype=X.dtype)
    one = np.array(1, dtype=X.dtype)
    zero = np.array(0, dtype=X.dtype)
    # column-major view: U_c is b x L (ld b), X_c is d x L (ld d); part_cᵀ (b x d, ld b) = U_c X_cᵀ
    cublas.gemmStridedBatchedEx(xp.cuda.device.get_cublas_handle(), 0, 1, b, d, L, one.ctypes.data,
                                U.data.ptr, data_type, b, L * b, X.data.ptr, data_type, d, L * d,
                                zero.ctypes.data, part.data.ptr, data_type, b, d * b, c, compute_type, -1)
    out = part.sum(axis=0, dtype=xp.float64)
    if m < n:
        out += (X[m:].T @ U[m:]).astype(xp.float64, copy=False)
    return out


def _rmatvec(X, U, comm, xp):
    """``X.T @ U`` summed over ranks, float64, replicated (one allreduce of d x b)."""
    if isinstance(X, SparseRows):
        out = X.rmatmul(U, xp)
    else:
        out = _tall_tmatmul(X, U, xp)
    if comm.size > 1:
        out = sum_over_ranks(comm, xp.ascontiguousarray(out))
    return out


# ---------------------------------------------------------------------- randomness
def gaussian_matrix(random_state, shape, comm, xp, dtype):
    """A standard normal matrix, the same on every rank, drawn as scikit-learn draws it.

    An int ``random_state`` is expanded on every rank alike (no communication)
    into ``RandomState(seed).normal(size=shape)``, scikit-learn's first draw
    (on the host: about 25 ns a value, 65 ms for a 10^5 x 26 matrix); a
    ``RandomState`` instance is drawn on rank 0 and broadcast (``prod(shape)``
    float64 values).  None on GPU ranks draws on the device from a seed that
    rank 0 takes from NumPy's global generator and broadcasts (one int64): any
    Gaussian matrix serves, and the host draw would cost more than the fit.
    """
    if random_state is None and xp is not np:
        seed = np.array([np.random.randint(0, 2**63 - 1, dtype=np.int64)]) if comm.rank == 0 else \
            np.zeros(1, dtype=np.int64)
        if comm.size > 1:
            seed = comm.bcast(seed)
        return _device_normal(int(np.asarray(seed)[0]), shape, xp, dtype)
    if isinstance(random_state, (Integral, np.integer)) or comm.size == 1:
        G = check_random_state(random_state).normal(size=shape)
    elif comm.rank == 0:
        G = comm.bcast(check_random_state(random_state).normal(size=shape))
    else:
        G = comm.bcast(np.empty(shape, dtype=np.float64))
    return xp.asarray(np.asarray(G, dtype=np.float64).astype(dtype, copy=False))


def _device_normal(seed, shape, xp, dtype):
    """A standard normal matrix drawn on the device from ``seed``, directly in ``dtype``.

    By :func:`mpiml.kernels.sparse.normal` (one counter-based kernel, a few microseconds).  cuRAND's generators
    cost more than the draw: XORWOW sets up its state at the first draw (5.5 ms of a 70 ms sparse fit for a
    10^5 x 26 matrix), and a Philox generator made each fit took 0.84-1.0 ms of device time at 20:20 (its state
    allocated, and freed with a synchronisation, each fit).  Environment ``MPIML_DEVICE_NORMAL=curand`` draws
    by cuRAND's Philox instead (for comparison).
    """
    dtype = np.dtype(dtype)
    draw = dtype if dtype in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float64)
    if _sparse_kernels._env_choice("MPIML_DEVICE_NORMAL", ("kernel", "curand")) == "kernel":
        return _sparse_kernels.normal(seed, shape, draw).astype(dtype, copy=False)
    try:
        try:
            from cupy_backends.cuda.libs import curand
        except ImportError:
            from cupy.cuda import curand
        rs = xp.random.RandomState(seed, method=curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
    except Exception:  # noqa: BLE001 - a CuPy without the Philox constant: the default generator
        rs = xp.random.RandomState(seed)
    return rs.standard_normal(shape, dtype=draw).astype(dtype, copy=False)


def resolve_normalizer(power_iteration_normalizer, n_iter):
    """(normaliser of the distributed iterate, of the replicated one, final orthonormalisation) for a name.

    ``"auto"``: none for ``n_iter <= 2`` (scikit-learn's rule), otherwise
    CholeskyQR2 of the replicated iterate only (scikit-learn uses LU on both,
    which has no communication-avoiding distributed form; only the span of the
    iterate matters, so any normalisation gives the same subspace).  The
    distributed iterate is ``X`` times an orthonormal basis, as well
    conditioned as ``X`` lets it be; normalising it too costs two more passes
    over its rows, two Gram allreduces and two waits on the device a power
    iteration.  ``"QR"``, ``"LU"`` (both TSQR) and ``"CholeskyQR2"`` normalise
    both, as scikit-learn does.
    """
    name = power_iteration_normalizer
    if name == "auto":
        if n_iter <= 2:
            return None, None, "tsqr"
        return None, "cholesky_qr2", "cholesky_qr2"
    step = {"none": None, "QR": "tsqr", "LU": "tsqr", "CholeskyQR2": "cholesky_qr2"}[name]
    final = "cholesky_qr2" if step == "cholesky_qr2" else "tsqr"
    return step, step, final


# ---------------------------------------------------------------------- randomised SVD
class _Alone:
    """The communicator of one rank, for the replicated matrices (no communication)."""

    size, rank = 1, 0


def _local_orth(Y, xp):
    """An orthonormal basis of the columns of a replicated ``Y``.

    On a GPU, CholeskyQR2 (two Gram products and a ``b x b`` Cholesky on the
    host; TSQR, that is cuSOLVER's QR, when ``Y`` is too ill-conditioned):
    cuSOLVER's QR of a tall ``d x b`` matrix costs milliseconds of panel
    factorisations.  Only the span matters to the callers.
    """
    if xp is np:
        return xp.linalg.qr(Y, mode="reduced")[0]
    return orthonormalize(Y, _Alone, method="cholesky_qr2")


def _wide_svd(B, xp):
    """``U, s, Vt`` of a replicated wide ``B`` (``m <= d``): NumPy's on the host; on a GPU by the QR of ``Bᵀ``
    (CholeskyQR2, cuSOLVER's QR beyond its condition limit) and the SVD of its ``m x m`` R factor on the host
    (cuSOLVER's SVD of a wide matrix is slow)."""
    if xp is np:
        return np.linalg.svd(B, full_matrices=False)
    from ..utils._linalg import cholesky_qr2

    Qb, Rb = cholesky_qr2(xp.ascontiguousarray(B.T), _Alone)   # Bᵀ = Qb Rb (cuSOLVER's QR when ill-conditioned)
    Ur, s, Vrt = np.linalg.svd(to_numpy(Rb), full_matrices=False)
    # B = Rbᵀ Qbᵀ = Vrtᵀ diag(s) Urᵀ Qbᵀ
    return xp.asarray(Vrt.T), xp.asarray(s), (Qb @ xp.asarray(Ur)).T


def _small_svd(R, xp):
    """The SVD of a small replicated square matrix, on the host (returned on ``xp``)."""
    if xp is np:
        return np.linalg.svd(R, full_matrices=False)
    return tuple(xp.asarray(a) for a in np.linalg.svd(to_numpy(R), full_matrices=False))


#: Where the CholeskyQR2 rounds of :func:`randomized_svd` on CuPy data do their ``l x l`` algebra
#: (environment ``MPIML_RANDOMIZED_ALGEBRA``, read when a fit starts): ``"host"``: the Gram matrix is copied to
#: the host every round (Cholesky, condition check, triangular inverse there; a wait on the device each round,
#: 14 a default fit, ~2.7 ms each on an H100 host); ``"device"`` (default): one kernel a round
#: (:func:`mpiml.kernels.sparse.small_cholinv`)
#: whose checks are read once, after the final ``l x l`` SVD (one-sided Jacobi on the device,
#: :func:`mpiml.kernels.sparse.small_svd`): if one failed (not positive definite, an iterate past CholeskyQR2's
#: condition limit, or Jacobi unconverged), the range finder runs again from the same random matrix with the
#: host's algebra (and its TSQR fallback).  For ``l <= 64``.
ALGEBRAS = ("device", "host")
#: When TruncatedSVD reads the device algebra's checks (environment ``MPIML_RANDOMIZED_CHECKS``, read when a fit
#: starts): ``"deferred"`` (default) after the signs, the projection and the variances are queued (the host queues
#: them while the device still runs the products; a failed check redoes the fit's end with the host algebra's
#: result); ``"now"``: at the end of the range finder, a wait before they are queued.  Pass of 22:50 (one H100,
#: the bucket transpose): 38.0 ms a fit deferred, 38.5 now.  (Taken back after the pass of 21:10, whose 211.7 ms
#: variances step turned out to be the benchmark's matrix: duplicate entries, which the variances sum on a copy.)
CHECKS = ("deferred", "now")


def checks_mode():
    """When TruncatedSVD reads the device algebra's checks, from ``MPIML_RANDOMIZED_CHECKS`` (see :data:`CHECKS`)."""
    return _sparse_kernels._env_choice("MPIML_RANDOMIZED_CHECKS", CHECKS)


def algebra_mode():
    """Where randomized_svd's CholeskyQR2 algebra runs on CuPy data, from ``MPIML_RANDOMIZED_ALGEBRA``."""
    return _sparse_kernels._env_choice("MPIML_RANDOMIZED_ALGEBRA", ALGEBRAS)


def _cholqr2_device(A, comm, flag, xp):
    """``(Q, R)`` of the row-distributed ``A`` by CholeskyQR2 with no wait on the device: the Gram matrix by the
    one-read kernel (float64), summed over ``comm``, factored by :func:`mpiml.kernels.sparse.small_cholinv`; its
    checks (round 1: positive definite and CholeskyQR2's condition limit; round 2: positive definite) are ORed
    into ``flag`` for the caller to read later.  ``R`` float64, ``Q`` in ``A``'s dtype."""
    from ..utils._linalg import CHOLQR2_MAX_COND, augmented_gram

    l = A.shape[1]
    Q, R = A, None
    for rnd in range(2):
        G = augmented_gram(Q)[:l, :l] if Q.shape[0] else xp.zeros((l, l), dtype=xp.float64)
        if comm.size > 1:
            G = sum_over_ranks(comm, xp.ascontiguousarray(G))
        Rr, Rinv = _sparse_kernels.small_cholinv(G, flag, CHOLQR2_MAX_COND if rnd == 0 else 0.0)
        Q = Q @ Rinv.astype(A.dtype, copy=False)
        R = Rr if R is None else Rr @ R
    return Q, R


def _checks_failed(flag, comm):
    """Whether a check of the device's CholeskyQR2 algebra failed (one read back), alike on every rank."""
    failed = int(to_numpy(flag)[0]) != 0
    if comm.size > 1:   # the checks act on replicated matrices, alike everywhere; agreed on all the same
        failed = bool(np.asarray(comm.allreduce(np.array([float(failed)])))[0] > 0)
    return failed


#: The condition bound (``‖R‖_F ‖R⁻¹‖_F``) up to which the implicit final step (:func:`_range_svd`) factors
#: the Gram matrix once: the implied ``Q = Y R⁻¹`` is then orthonormal to ``ε64 (l · bound)²`` < 1e-7, float32's
#: precision; past it the check fails and the range finder runs again with the host algebra.
IMPLICIT_MAX_COND = 1e4


def implicit_final():
    """Whether the device algebra's final step leaves ``Q`` implicit (``MPIML_RANDOMIZED_FINAL``: ``implicit``,
    the default, or ``explicit``); float32 data only (see :func:`_range_svd`)."""
    return _sparse_kernels._env_choice("MPIML_RANDOMIZED_FINAL", ("implicit", "explicit")) == "implicit"


def _range_svd(X, Omega, comm, xp, n_iter, dist_step, repl_step, final, *, device, deferred=False, implicit=False):
    """``(Q, Uhat, s, Vt)`` of randomized_svd's untransposed case from the random matrix ``Omega``: ``X ≈ Q Uhat
    diag(s) Vt``.  ``device``: the CholeskyQR2 rounds by :func:`_cholqr2_device`, whose checks are read once at
    the end with the ``l x l`` factor of the final SVD; None when one failed (on every rank alike).  ``deferred``
    (with ``device``): ``(Q, Uhat, s, Vt, flag)``, the checks unread (:func:`_checks_failed`).  ``implicit`` (with
    ``device`` and a CholeskyQR2 final step; for float32 data, whose ``Q`` was float32 anyway): ``Q = Y R⁻¹`` is
    never formed: ``R`` from ``Y``'s float64 Gram matrix, one Cholesky (its condition at most
    :data:`IMPLICIT_MAX_COND`, else the check fails), and ``Bᵀ = (Xᵀ Y) R⁻¹`` in float64 (the product on ``Y``
    itself): the final orthonormalisation's two passes writing ``Q`` and its second Gram matrix are saved (1.4 ms
    of a 37.6 ms fit at 23:45); ``Q`` is returned None."""
    flag = xp.zeros(1, dtype=xp.int32) if device else None

    def orth(Y, how, on):
        if how is None:
            return Y
        if device and how == "cholesky_qr2":
            return _cholqr2_device(Y, on, flag, xp)[0]
        return orthonormalize(Y, on, method=how)

    Y = _matvec(X, Omega, padded=True)                            # (n_local, l), distributed
    mark("X V 0", xp)
    for it in range(1, n_iter + 1):
        if dist_step is not None:
            Y = orth(Y, dist_step, comm)
            mark(f"normalise X V {it - 1}", xp)
        Z = _rmatvec(X, Y, comm, xp)                              # (d, l), replicated
        mark(f"Xt U {it}", xp)
        if repl_step is not None:                                 # the replicated iterate: one rank's algebra
            Z = orth(Z, repl_step, _Alone) if device and repl_step == "cholesky_qr2" else _local_orth(Z, xp)
            mark(f"normalise Xt U {it}", xp)
        Y = _matvec(X, Z, padded=True)
        mark(f"X V {it}", xp)
    if device and implicit and final == "cholesky_qr2":
        from ..utils._linalg import augmented_gram

        l = Y.shape[1]
        G = augmented_gram(Y)[:l, :l] if Y.shape[0] else xp.zeros((l, l), dtype=xp.float64)
        if comm.size > 1:
            G = sum_over_ranks(comm, xp.ascontiguousarray(G))
        _, Rinv = _sparse_kernels.small_cholinv(G, flag, IMPLICIT_MAX_COND)
        mark("orthonormalise X V", xp)
        B = (_rmatvec(X, Y, comm, xp) @ Rinv).T                  # (m, d) = (Xᵀ Y R⁻¹)ᵀ = Qᵀ X, replicated
        Q = None
    else:
        Q = orth(Y, final, comm)                                  # (n_local, m)
        mark("orthonormalise X V", xp)
        B = _rmatvec(X, Q, comm, xp).T                            # (m, d) = Q^T X, replicated
    mark("Qt X", xp)
    if not device:
        Uhat, s, Vt = _wide_svd(B, xp)
        mark("SVD of Qt X", xp)
        return Q, Uhat, s, Vt
    # Bᵀ = Qb Rb and the SVD of Rb on the device (Jacobi); then the only wait on the device, for the checks
    Qb, Rb = _cholqr2_device(xp.ascontiguousarray(B.T), _Alone, flag, xp)
    Ur, s, Vrt = _sparse_kernels.small_svd(Rb, flag)
    # B = Rbᵀ Qbᵀ = Vrtᵀ diag(s) Urᵀ Qbᵀ
    Uhat, Vt = Vrt.T, (Qb @ Ur).T
    if deferred:
        mark("SVD of Qt X", xp)
        return Q, Uhat, s, Vt, flag
    failed = _checks_failed(flag, comm)
    mark("SVD of Qt X", xp)
    if failed:
        return None
    return Q, Uhat, s, Vt


def randomized_svd(X, n_components, *, comm, xp, n_rows, row_offset, n_oversamples=10, n_iter=4,
                   power_iteration_normalizer="auto", random_state=None, transpose="auto", want_u=True,
                   deferred=False):
    """Randomised truncated SVD of the row-distributed ``X`` (Halko, Martinsson, Tropp 2011).

    Parameters
    ----------
    X : ndarray of shape (n_local, d)
        This rank's rows.
    n_components : int
    comm : Communicator
    xp : module
    n_rows : int
        Global number of rows.
    row_offset : int
        Global index of this rank's first row (used when ``transpose``).
    n_oversamples, n_iter, power_iteration_normalizer, random_state
        As scikit-learn's ``randomized_svd``; see :func:`resolve_normalizer`.
    transpose : bool or "auto", default="auto"
        Work on ``X.T`` (scikit-learn's choice: when ``n < d``).  The random
        matrix then has one row per sample; each rank takes its rows of it.
    want_u : bool, default=True
        False: ``U_local`` is not formed (None; TruncatedSVD projects ``X`` instead).
    deferred : bool, default=False
        Return ``(U_local, s, Vt, redo)``: the device algebra's checks are not read here, so the caller queues more
        work before the host waits; ``redo()`` reads them (one wait) and returns None when they passed, else the
        result of the host's algebra from the same random matrix.  ``redo`` is None when nothing was deferred.

    Returns
    -------
    U_local : ndarray of shape (n_local, n_components) or None
        This rank's rows of U.
    s : ndarray of shape (n_components,), replicated
    Vt : ndarray of shape (n_components, d), replicated

    Signs are not flipped (callers apply scikit-learn's rule on ``Vt``).

    Notes
    -----
    With the same integer ``random_state`` the random matrix is scikit-learn's,
    and the subspace is the same as scikit-learn's up to rounding whatever the
    normaliser, so the result agrees with scikit-learn's on the gathered data.

    Communicated, with ``l = n_components + n_oversamples``: per power
    iteration one allreduce of ``d x l`` float64 (``X.T @ Q``) plus the
    normaliser's (CholeskyQR2: two allreduces of ``l x l`` float64; TSQR: see
    :func:`mpiml.utils._linalg.tsqr`; none: nothing); at the end one
    orthonormalisation and one allreduce of ``d x l`` float64 (``B = Q.T X``).
    Transposed, the roles swap: the ``d x l`` iterate is replicated and the
    distributed ``n x l`` one is orthonormalised.
    """
    n_local, d = X.shape
    dtype = X.dtype
    n_random = n_components + n_oversamples
    if n_iter == "auto":
        n_iter = 7 if n_components < 0.1 * min(n_rows, d) else 4
    if transpose == "auto":
        transpose = n_rows < d
    dist_step, repl_step, final = resolve_normalizer(power_iteration_normalizer, n_iter)

    def dist_norm(Y, how):
        return Y if how is None else orthonormalize(Y, comm, method=how)

    def repl_norm(Y, how):
        return Y if how is None else _local_orth(Y, xp)

    if not transpose:
        Omega = gaussian_matrix(random_state, (d, n_random), comm, xp, dtype)
        mark("random matrix", xp)

        def finish(out):
            Q, Uhat, s, Vt = out[:4]
            U = (Q @ Uhat[:, :n_components].astype(dtype, copy=False)) if want_u else None
            return U, s[:n_components].astype(dtype), Vt[:n_components].astype(dtype)

        def host():
            return finish(_range_svd(X, Omega, comm, xp, n_iter, dist_step, repl_step, final, device=False))

        if xp is not np and algebra_mode() == "device" and n_random <= _sparse_kernels.SMALL_MAX:
            implicit = not want_u and np.dtype(dtype) == np.float32 and implicit_final()
            out = _range_svd(X, Omega, comm, xp, n_iter, dist_step, repl_step, final, device=True, deferred=deferred,
                             implicit=implicit)
            if deferred:
                def redo(flag=out[4]):   # a check failed: the host's algebra from the same Omega
                    return host() if _checks_failed(flag, comm) else None
                return (*finish(out), redo)
            if out is not None:
                return finish(out)
        # host algebra, or a check of the device's failed: again from the same Omega
        return (*host(), None) if deferred else host()

    # transposed: M = X.T (d x n); the random matrix has one row per global sample
    Omega = gaussian_matrix(random_state, (n_rows, n_random), comm, xp, dtype)[row_offset:row_offset + n_local]
    Y = _rmatvec(X, Omega, comm, xp)                              # (d, l) = M Omega, replicated
    for _ in range(n_iter):
        Y = repl_norm(Y, repl_step)
        Z = dist_norm(_matvec(X, Y), dist_step)                   # (n_local, l) = M^T Y
        Y = _rmatvec(X, Z, comm, xp)
    Q = _local_orth(Y, xp)                                        # (d, m), replicated
    # B = Q^T M = (X Q)^T, distributed by columns: SVD through the QR of X Q
    Q2, R = tsqr(_matvec(X, Q), comm, want_q=True)               # X Q = Q2 R
    Ur, s, Vrt = _small_svd(R, xp)                               # R = Ur diag(s) Vrt
    # B = Vrt^T diag(s) (Q2 Ur)^T  ->  M = (Q Vrt^T) diag(s) (Q2 Ur)^T,  X = (Q2 Ur) diag(s) (Q Vrt^T)^T
    U = (Q2 @ Ur[:, :n_components].astype(dtype, copy=False)) if want_u else None
    Vt = (Q.astype(xp.float64) @ Vrt.T).T
    out = U, s[:n_components].astype(dtype), Vt[:n_components].astype(dtype)
    return (*out, None) if deferred else out

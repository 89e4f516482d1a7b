"""Shared pieces of the linear models: agreed reductions, chunking, validation of rows to predict.

Every reduction whose result steers a solver (a Gram matrix, a loss, a
gradient) goes through :func:`allreduce_identical`: a float64 host buffer
reduced to rank 0 along a binomial tree and broadcast back, so every rank
holds the same bits and takes the same decisions.
"""

import os

import numpy as np

from .._array import get_namespace, is_device_array
from ..utils._linalg import is_sparse
from ..utils._supervised import (  # noqa: F401 (re-exported: the linear models import them from here)
    SPARSE_DENSE_REQUIRED,
    _sparse_as_csr,
    as_like,
    global_classes,
    raise_if_nonfinite,
    sparse_mismatch,
    validate_X_y,
)
from ..utils._validation import validate_data

__all__ = ["allreduce_identical", "allreduce_identical_device", "pinned_buffer", "validate_X_y", "fitted_like",
           "local_X", "chunk_rows", "global_classes", "as_like",
           "SPARSE_DENSE_REQUIRED", "raise_if_nonfinite"]

#: Bytes of one float64 row chunk converted at a time (bounds the temporary memory).
_CHUNK_BYTES = 8 << 20
_DEVICE_CHUNK_BYTES = 256 << 20


def allreduce_identical(comm, x):
    """Sum a host float64 vector over ranks; the result is bit-identical on every rank.

    The communicator's ``binomial`` algorithm reduces to rank 0 and
    broadcasts, so no rank sees a differently rounded sum (a native MPI
    allreduce does not promise that).
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    if comm.size == 1:
        return x
    from ..utils._node_memory import sum_over_ranks

    # ranks beyond the node's cores: through node memory, the ranks' vectors added in rank order (the same bits on
    # every rank too), where each round of a binomial collective waited for a rank to be scheduled
    return sum_over_ranks(comm, x, algorithm="binomial")


def _to_host(x, host, copy=True):
    """``x`` (a float64 CuPy vector) as a new host array: through the pinned buffer ``host`` of its size
    when given (one asynchronous copy and a wait for the stream), else by a plain copy.  ``copy=False``:
    ``host`` itself when it served (the caller reads it before its next use)."""
    if host is None or host.size != x.size:
        return as_like(x, np)
    import cupy

    stream = cupy.cuda.get_current_stream()
    if not x.flags.c_contiguous:
        x = cupy.ascontiguousarray(x)
    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, x.data.ptr, x.nbytes, cupy.cuda.runtime.memcpyDeviceToHost,
                                  stream.ptr)
    stream.synchronize()
    return host.copy() if copy else host


def allreduce_identical_device(comm, x, host=None, copy=True):
    """Sum a float64 CuPy array over ranks, the same bits on every rank; returned as host float64.

    Where the communicator's IPC kernels run (one GPU per rank on one node)
    the sum stays on the device: every rank reduces the ranks' buffers in rank
    order 0, 1, ..., p - 1 (the same bits everywhere, as the binomial host
    allreduce promises), one kernel and no host round trip before the one copy
    of the result to the host.  Elsewhere the array is copied to the host and
    summed by :func:`allreduce_identical`.  Collective; every rank takes the same
    path (whether IPC runs is agreed by the communicator when it first tries it).  ``host``: a
    pinned float64 buffer of ``x``'s size for the copy to the host (an optimiser's repeated reductions);
    ``copy=False`` returns that buffer itself where it holds the result (read it before its next use).
    """
    if comm.size == 1:
        return _to_host(x, host, copy)
    # (an experiment's switch, read per call: vectors up to this many bytes copied to the host first and summed
    # there; 0, the default, keeps every size on the device)
    host_bytes = os.environ.get("MPIML_LINEAR_HOST_REDUCE_BYTES")
    if host_bytes and x.nbytes <= int(host_bytes):
        return allreduce_identical(comm, _to_host(x, host, copy))
    from .._errors import CommError

    if "ipc" in comm.available_backends("device"):
        try:
            out = comm.allreduce(x, algorithm="ipc/native")
        except CommError:
            if "ipc" in comm.available_backends("device"):
                raise   # a failure of the call itself, not a transport that cannot run here
        else:
            return _to_host(out, host, copy)
    return allreduce_identical(comm, _to_host(x, host, copy))


def pinned_buffer(bufs, size):
    """``bufs[size]``, a pinned float64 host buffer of ``size`` values (made on first use): the ``host`` of
    :func:`allreduce_identical_device` for reductions repeated with one size; ``bufs`` is the caller's dict
    (per thread, per fit, ...), which decides how long the buffers live."""
    buf = bufs.get(size)
    if buf is None:
        import cupyx

        buf = bufs[size] = cupyx.empty_pinned(size, dtype=np.float64)
    return buf


def fitted_like(array, xp, dtype):
    """A fitted attribute (a small host array) on the namespace of the data, cast on the host to ``dtype``.

    For CuPy, one copy from the (pageable) host array into a new device array on the current stream: at
    the end of a fit the device is idle (its results were waited for), so the copy waits for nothing; it
    skips CuPy's general path for host input (a pinned staging buffer, an event and its watch list) and
    ``ndarray.set``'s device switches (driver calls of ~10-40 us each on the GPU host).  A copy from pageable
    memory returns once the host array is staged, so it may be dropped at once.
    """
    if xp is np or is_device_array(array):
        return as_like(array, xp, dtype)
    host = np.ascontiguousarray(array, dtype=dtype)
    if host.size == 0:
        return as_like(host, xp)
    out = xp.empty(host.shape, dtype=host.dtype)
    runtime = xp.cuda.runtime
    runtime.memcpyAsync(out.data.ptr, host.ctypes.data, host.nbytes, runtime.memcpyHostToDevice,
                        xp.cuda.get_current_stream().ptr)
    return out


def chunk_rows(n_cols, itemsize=8, xp=np):
    """Rows per chunk: a float64 chunk of ``n_cols`` columns near 8 MiB on the host
    (it stays in cache between the subtraction and the GEMM), 256 MiB on a GPU."""
    nbytes = _CHUNK_BYTES if xp is np else _DEVICE_CHUNK_BYTES
    return max(1024, nbytes // max(1, n_cols * itemsize))


def local_X(estimator, X, accept_sparse=True):
    """Validate rows for a local method (predict, decision_function): no communication.

    Sparse rows (SciPy or ``cupyx``) are accepted and returned as CSR unless
    ``accept_sparse`` is False.
    """
    from ..comm import get_comm

    estimator._check_is_fitted()
    if getattr(X, "ndim", None) == 2 and X.shape[0] == 0 and X.dtype.kind in "biuf":
        # a rank without rows: valid in SPMD (scikit-learn's one-process check would refuse it)
        xp = get_namespace(X)
        if is_sparse(X):
            X = _sparse_as_csr(X, accept_sparse)
        if X.shape[1] != estimator.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
                             f"{estimator.n_features_in_} features as input.")
        return X.astype(X.dtype if X.dtype.kind == "f" else xp.float64), xp
    X, xp = validate_data(estimator, X, comm=get_comm("self"), reset=False,
                          accept_sparse="csr" if accept_sparse else False)
    if xp is not np:
        X = _sparse_as_csr(X, accept_sparse)
    return X, xp


def overwrite_as_preprocessed(X, X_given, sw, *, fit_intercept, comm, xp):
    """``copy_X=False``: leave the caller's dense ``X`` as scikit-learn's preprocessing leaves it.

    That is centred on the global (weighted) column means when ``fit_intercept``
    and, with sample weights, each row scaled by ``sqrt(weight)``.  Collective when
    ``fit_intercept`` (one allreduce of ``n_features + 1`` values, on every rank of
    ``comm`` whatever its rows); only a rank whose validated ``X`` *is* the array it
    was given (no conversion copied it) writes.  Sparse ``X`` is left alone, as there.
    """
    if is_sparse(X):
        return
    # (CuPy arrays are always writeable: their flags have no such field)
    write = X is X_given and X.shape[0] > 0 and getattr(X.flags, "writeable", True)
    if fit_intercept:
        pack = np.zeros(X.shape[1] + 1)
        if X.shape[0]:
            w = xp.ones(X.shape[0], dtype=xp.float64) if sw is None else sw.astype(xp.float64)
            pack[0] = float(w.sum())
            pack[1:] = as_like(w @ X.astype(xp.float64, copy=False), np)
        pack = allreduce_identical(comm, pack)
        if write and pack[0] > 0:
            X -= as_like(pack[1:] / pack[0], xp, X.dtype)
    if write and sw is not None:
        X *= xp.sqrt(sw).astype(X.dtype)[:, None]

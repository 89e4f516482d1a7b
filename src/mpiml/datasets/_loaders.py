"""Partitioned loaders: every rank reads only its own rows of a file.

Rows are assigned like :func:`numpy.array_split` for ``.npy`` files (the row
count is in the header) and by byte range for text files: rank ``r`` owns the
lines whose first byte lies in ``[r * S / size, (r + 1) * S / size)`` of the
data (``S`` bytes after any header), so the ranks together read each line
exactly once.  A problem on any rank (missing, truncated or malformed file)
raises the same :class:`mpiml.DistributedInputError` on every rank, naming
the file and the rank(s).
"""

import io
import os
import warnings

import numpy as np

from .._errors import DistributedInputError
from ..utils._validation import _combine
from ._partition import resolve_comm, resolve_namespace, shard_bounds

__all__ = ["load_npy", "load_csv", "load_svmlight"]


def _raise_agreed(comm, path, gathered_errors):
    msg = _combine(gathered_errors, f"Cannot load {os.fspath(path)!r}")
    if msg is not None:
        raise DistributedInputError(msg)


def _agree(comm, path, error, facts=None):
    """Allgather (error text, facts); raise on every rank if any rank failed; return all facts."""
    text = None if error is None else (f"{type(error).__name__}: {error}" if isinstance(error, BaseException)
                                       else str(error))
    if comm.size == 1:
        gathered = [(text, facts)]
    else:
        gathered = comm.allgather_obj((text, facts))
    _raise_agreed(comm, path, [e for e, _ in gathered])
    return [f for _, f in gathered]


# ---------------------------------------------------------------------- npy
def _npy_header(f):
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:  # pragma: no cover - read_magic rejects others
        raise ValueError(f"unsupported .npy version {version}")
    return shape, fortran, dtype, f.tell()


def load_npy(path, *, comm=None, mmap=True, device="cpu", xp=None):
    """This rank's rows of a ``.npy`` file (split along axis 0 like ``np.array_split``).

    Parameters
    ----------
    path : str or path-like
        A ``.npy`` file readable by every rank; object arrays are refused.
    comm : Communicator, default=None
        World communicator when None.
    mmap : bool, default=True
        Return a read-only memory map of this rank's rows (nothing read until
        used); False copies the rows into memory (reading only them).
    device : {"cpu", "gpu"}, default="cpu"
        ``"gpu"`` copies the rows to a CuPy array.
    xp : module, default=None
        ``numpy`` or ``cupy``; overrides ``device``.

    Returns
    -------
    ndarray of shape (n_local_rows, ...)
    """
    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    error, out, facts = None, None, None
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype, offset = _npy_header(f)
        if dtype.hasobject:
            raise ValueError("object arrays cannot be loaded (they would need pickle)")
        if len(shape) == 0:
            raise ValueError("the file holds a scalar, not rows")
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        actual = os.path.getsize(path)
        if actual < expected:
            raise ValueError(f"file is truncated: {actual} bytes, the header promises {expected}")
        n = shape[0]
        start, stop = shard_bounds(n, comm.size, comm.rank)
        if fortran and len(shape) > 1:
            full = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F")
            out = full[start:stop]
        else:
            row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            local = (stop - start,) + tuple(shape[1:])
            if stop > start and row > 0:
                out = np.memmap(path, dtype=dtype, mode="r", offset=offset + start * row, shape=local)
            else:
                out = np.empty(local, dtype=dtype)
        facts = (tuple(shape), str(dtype))
    except Exception as exc:
        error = exc
    _agree(comm, path, error, facts)
    if not mmap or xp is not np:
        out = np.array(out) if xp is np else xp.asarray(np.ascontiguousarray(out))
    return out


# ---------------------------------------------------------------------- text files
def _aligned(f, pos, data_start, size):
    """The first line start at or after ``pos`` (a line belongs to the range holding its first byte)."""
    if pos <= data_start:
        return data_start
    if pos >= size:
        return size
    f.seek(pos - 1)
    f.readline()
    return f.tell()


def _read_my_lines(path, comm, header_lines=0, comments=None):
    """This rank's byte range of ``path``, aligned to line starts; returns ``(bytes, header)``."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = [f.readline() for _ in range(header_lines)]
        data_start = f.tell()
        n = size - data_start
        lo = data_start + (n * comm.rank) // comm.size
        hi = data_start + (n * (comm.rank + 1)) // comm.size
        s, e = _aligned(f, lo, data_start, size), _aligned(f, hi, data_start, size)
        f.seek(s)
        chunk = f.read(max(e - s, 0))
    return chunk, header


def load_csv(path, *, comm=None, delimiter=",", header=False, target_column=None, dtype=np.float64,
             comments="#", device="cpu", xp=None):
    """This rank's rows of a delimited text file of numbers.

    Parameters
    ----------
    path : str or path-like
        The file, readable by every rank.
    comm : Communicator, default=None
        World communicator when None.
    delimiter : str, default=","
        Column separator.
    header : bool or int, default=False
        Skip the first line (True) or the first ``header`` lines (an int).
    target_column : int or None, default=None
        Column returned separately as ``y`` (negative values count from the end).
    dtype : dtype, default=np.float64
        Dtype of ``X`` and ``y``.
    comments : str or None, default="#"
        Lines (or the rest of lines) after this marker are ignored.
    device : {"cpu", "gpu"}, default="cpu"
        Where the arrays are returned.
    xp : module, default=None
        ``numpy`` or ``cupy``; overrides ``device``.

    Returns
    -------
    X : ndarray of shape (n_local_rows, n_columns) or (n_local_rows, n_columns - 1)
    y : ndarray of shape (n_local_rows,)
        Only with ``target_column``.

    Notes
    -----
    Each rank reads about ``file size / size`` bytes; one ``allgather_obj``
    agrees on errors and the number of columns (ranks may hold zero rows).
    """
    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    header_lines = int(header) if not isinstance(header, bool) else (1 if header else 0)
    error, data = None, None
    try:
        chunk, _ = _read_my_lines(path, comm, header_lines)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data" on an empty range
            data = np.loadtxt(io.BytesIO(chunk), delimiter=delimiter, dtype=dtype, comments=comments,
                              ndmin=2, encoding="utf-8")
    except Exception as exc:
        error = exc
    n_cols = data.shape[1] if data is not None and data.shape[0] > 0 else None
    facts = _agree(comm, path, error, n_cols)
    widths = {c for c in facts if c is not None}
    if len(widths) > 1:
        by = {}
        for r, c in enumerate(facts):
            if c is not None:
                by.setdefault(c, []).append(r)
        desc = "; ".join(f"{c} on rank(s) {rs}" for c, rs in sorted(by.items()))
        raise DistributedInputError(f"Cannot load {os.fspath(path)!r}: the number of columns differs "
                                    f"across ranks ({desc})")
    if not widths:
        raise DistributedInputError(f"Cannot load {os.fspath(path)!r}: the file holds no data rows")
    (width,) = widths
    if data.shape[0] == 0:
        data = np.empty((0, width), dtype=dtype)
    if target_column is not None:
        if not -width <= target_column < width:
            raise ValueError(f"target_column={target_column} is out of range for {width} columns")
        t = target_column % width
        y = data[:, t]
        X = np.delete(data, t, axis=1)
        return xp.asarray(X), xp.asarray(y)
    return xp.asarray(data)


# ---------------------------------------------------------------------- svmlight
def load_svmlight(path, *, n_features=None, comm=None, dtype=np.float64, zero_based="auto", query_id=False,
                  device="cpu", xp=None):
    """This rank's rows of an SVMlight / LibSVM file, as a CSR matrix.

    Parameters
    ----------
    path : str or path-like
        The file, readable by every rank.
    n_features : int, default=None
        Number of columns; when None, the largest index over all ranks (one
        agreement).
    comm : Communicator, default=None
        World communicator when None.
    dtype : dtype, default=np.float64
        Dtype of the values.
    zero_based : bool or "auto", default="auto"
        Whether indices start at 0; "auto" decides from the smallest index in
        the whole file (agreed across ranks, so every rank decides alike).
    query_id : bool, default=False
        Also return the query ids.
    device : {"cpu", "gpu"}, default="cpu"
        ``"gpu"`` returns ``cupyx.scipy.sparse.csr_matrix`` and CuPy targets.
    xp : module, default=None
        ``numpy`` or ``cupy``; overrides ``device``.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_local_rows, n_features)
    y : ndarray of shape (n_local_rows,)
    qid : ndarray of shape (n_local_rows,)
        Only with ``query_id=True``.

    Notes
    -----
    Parsing is scikit-learn's :func:`sklearn.datasets.load_svmlight_file`
    applied to this rank's line-aligned byte range.
    """
    import scipy.sparse as sp
    from sklearn.datasets import load_svmlight_file

    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    error, parsed, facts = None, None, None
    try:
        chunk, _ = _read_my_lines(path, comm)
        big = np.iinfo(np.int32).max
        parsed = load_svmlight_file(io.BytesIO(chunk), n_features=big, dtype=dtype, zero_based=True,
                                    query_id=query_id)
        X = parsed[0]
        lo = int(X.indices.min()) if X.nnz else None
        hi = int(X.indices.max()) if X.nnz else -1
        facts = (lo, hi)
    except Exception as exc:
        error = exc
    facts = _agree(comm, path, error, facts)
    mins = [f[0] for f in facts if f[0] is not None]
    one_based = zero_based is False or (zero_based == "auto" and (not mins or min(mins) > 0))
    if zero_based is False and mins and min(mins) == 0:
        raise DistributedInputError(f"Cannot load {os.fspath(path)!r}: index 0 found but zero_based=False")
    n_found = max(f[1] for f in facts) + (0 if one_based else 1)
    if n_features is None:
        n_features = n_found
    elif n_features < n_found:
        raise DistributedInputError(f"Cannot load {os.fspath(path)!r}: n_features was set to {n_features}, "
                                    f"but the file contains {n_found} features")
    X = parsed[0]
    indices = X.indices - 1 if one_based else X.indices
    X = sp.csr_matrix((X.data, indices, X.indptr), shape=(X.shape[0], n_features))
    rest = list(parsed[1:])
    if xp is not np:
        import cupyx.scipy.sparse as csp

        X = csp.csr_matrix(X)
        rest = [xp.asarray(a) for a in rest]
    return (X, *rest)

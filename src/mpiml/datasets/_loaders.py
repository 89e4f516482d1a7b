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
import re
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


class _LineError(Exception):
    """A problem on one line of this rank's range; ``line`` counts from 0 within the range."""

    def __init__(self, line, message):
        super().__init__(message)
        self.line = line


def _is_data_line(line, comments):
    if comments:
        line = line.split(comments.encode(), 1)[0]
    return bool(line.strip())


def _first_bad_line(n_lines, ok):
    """The first of ``n_lines`` lines that fails, by halving, given that the whole range fails.

    ``ok(lo, hi)`` is True exactly when lines ``[lo, hi)`` are all valid (each line is
    judged on its own), so about two parses of the range find the line.
    """
    lo, hi = 0, n_lines
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _line_error(chunk, ok, describe):
    """A :class:`_LineError` for the first line of ``chunk`` that ``ok`` refuses."""
    lines = chunk.split(b"\n")

    def seg_ok(lo, hi):
        return ok(b"\n".join(lines[lo:hi]))

    bad = _first_bad_line(len(lines), seg_ok)
    return _LineError(bad, describe(lines[bad]))


def _error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def _agree_text(comm, path, chunk, error, facts, first_line):
    """One allgather of (error, lines in the range, facts); the same error on every rank.

    A :class:`_LineError` is reported with its line number in the file: ``first_line``
    (1-based number of the first data line after the header) plus the lines of the lower
    ranks' ranges.  Only the first problem in file order is reported.  Returns the facts.
    """
    n_lines = chunk.count(b"\n") if chunk is not None else 0
    if isinstance(error, _LineError):
        err = ("line", error.line, str(error))
    elif error is not None:
        err = ("other", None, _error_text(error) if isinstance(error, BaseException) else str(error))
    else:
        err = None
    gathered = [(err, n_lines, facts)] if comm.size == 1 else comm.allgather_obj((err, n_lines, facts))
    starts = first_line + np.concatenate([[0], np.cumsum([g[1] for g in gathered])[:-1]]).astype(np.int64)
    lined = [(int(starts[r]) + g[0][1], g[0][2]) for r, g in enumerate(gathered) if g[0] and g[0][0] == "line"]
    others = [None if not g[0] or g[0][0] == "line" else g[0][2] for g in gathered]
    msg = _combine(others, f"Cannot load {os.fspath(path)!r}")
    if msg is None and lined:
        line, text = lined[0]
        msg = f"Cannot load {os.fspath(path)!r}, line {line}: {text}"
    if msg is not None:
        raise DistributedInputError(msg)
    return [g[2] for g in gathered], starts


def _first_data_line(path, header_lines, comments):
    """The first data line of the file after the header (bytes), or None."""
    with open(path, "rb") as f:
        for _ in range(header_lines):
            f.readline()
        for line in f:
            if _is_data_line(line, comments):
                return line
    return None


def _loadtxt(data, delimiter, dtype, comments):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "input contained no data" on an empty range
        return np.loadtxt(io.BytesIO(data), delimiter=delimiter, dtype=dtype, comments=comments, ndmin=2,
                          encoding="utf-8")


_NUMPY_ROW = re.compile(r" at row \d+, column (\d+)")


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

    Raises
    ------
    DistributedInputError
        The same on every rank.  A malformed value or a line whose number of columns
        differs from the first data line's names the line in the file (1-based, header
        and comment lines counted): ``Cannot load 'x.csv', line 302: ...``.

    Notes
    -----
    Each rank reads about ``file size / size`` bytes; one ``allgather_obj``
    agrees on errors and the number of columns (ranks may hold zero rows).
    Every rank also reads the file's first data line, whose width all lines
    must have.
    """
    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    header_lines = int(header) if not isinstance(header, bool) else (1 if header else 0)
    error, data, chunk = None, None, None
    try:
        first = _first_data_line(path, header_lines, comments)
        try:
            ref = _loadtxt(first, delimiter, dtype, comments).shape[1] if first is not None else None
        except ValueError:
            ref = None  # the line is malformed: the rank holding it reports it
        chunk, _ = _read_my_lines(path, comm, header_lines)

        def ok(seg):
            try:
                part = _loadtxt(seg, delimiter, dtype, comments)
            except ValueError:
                return False
            return part.shape[0] == 0 or ref is None or part.shape[1] == ref

        def describe(line):
            try:
                part = _loadtxt(line, delimiter, dtype, comments)
            except ValueError as exc:
                return "ValueError: " + _NUMPY_ROW.sub(r" (column \1)", str(exc)).rstrip(".")
            return f"the line has {part.shape[1]} columns, but the first data line has {ref}"

        if not ok(chunk):
            raise _line_error(chunk, ok, describe)
        data = _loadtxt(chunk, delimiter, dtype, comments)
    except Exception as exc:
        error = exc
    n_cols = data.shape[1] if data is not None and data.shape[0] > 0 else None
    facts, _ = _agree_text(comm, path, chunk, error, n_cols, header_lines + 1)
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
def _parse_svmlight(data, dtype, query_id):
    """scikit-learn's parser on bytes, indices as written (zero-based), ``n_features`` from the data."""
    from sklearn.datasets import load_svmlight_file

    return load_svmlight_file(io.BytesIO(data), dtype=dtype, zero_based=True, query_id=query_id)


def _row_line(chunk, row):
    """The line (0-based, in ``chunk``) holding data row ``row`` (comment and blank lines skipped)."""
    seen = -1
    for i, line in enumerate(chunk.split(b"\n")):
        if _is_data_line(line, "#"):
            seen += 1
            if seen == row:
                return i
    return None


def load_svmlight(path, *, n_features=None, comm=None, dtype=np.float64, zero_based="auto", query_id=False,
                  dense=False, device="cpu", xp=None):
    """This rank's rows of an SVMlight / LibSVM file, as a CSR matrix (or dense with ``dense=True``).

    Parameters
    ----------
    path : str or path-like
        The file, readable by every rank.
    n_features : int, default=None
        Number of columns; when None, the largest index over all ranks (one
        agreement), so every rank gets the same ``n_features``.
    comm : Communicator, default=None
        World communicator when None.
    dtype : dtype, default=np.float64
        Dtype of the values.
    zero_based : bool or "auto", default="auto"
        Whether indices start at 0; "auto" decides from the smallest index in
        the whole file (agreed across ranks, so every rank decides alike), as
        scikit-learn's loader does for one file.
    query_id : bool, default=False
        Also return the query ids.
    dense : bool, default=False
        Return a dense ndarray (``n_local_rows x n_features`` values: only for
        narrow data) instead of CSR.
    device : {"cpu", "gpu"}, default="cpu"
        ``"gpu"`` returns ``cupyx.scipy.sparse.csr_matrix`` (or a CuPy array with
        ``dense=True``) and CuPy targets.
    xp : module, default=None
        ``numpy`` or ``cupy``; overrides ``device``.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_local_rows, n_features)
        Or ``cupyx.scipy.sparse.csr_matrix`` on the GPU; an ndarray with ``dense=True``.
    y : ndarray of shape (n_local_rows,)
    qid : ndarray of shape (n_local_rows,)
        Only with ``query_id=True``.

    Raises
    ------
    DistributedInputError
        The same on every rank: a malformed line names the file and the line
        (1-based, comment lines counted); an empty file (or one of comments
        only) says so.

    Notes
    -----
    Parsing is scikit-learn's :func:`sklearn.datasets.load_svmlight_file`
    applied to this rank's line-aligned byte range; one ``allgather_obj``
    agrees on errors, the index range and the line numbers.  Indices up to
    ``2**31 - 1`` are accepted, as scikit-learn accepts them.
    """
    import scipy.sparse as sp

    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    if n_features is not None and (not isinstance(n_features, (int, np.integer)) or n_features < 1):
        raise ValueError(f"n_features must be a positive int or None; got {n_features!r}")
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based must be True, False or 'auto'; got {zero_based!r}")
    error, parsed, facts, chunk = None, None, None, None
    try:
        chunk, _ = _read_my_lines(path, comm)

        def ok(seg):
            try:
                _parse_svmlight(seg, dtype, query_id)
            except Exception:
                return False
            return True

        try:
            parsed = _parse_svmlight(chunk, dtype, query_id)
        except Exception as exc:
            raise _line_error(chunk, ok, lambda line: _parse_error(line, dtype, query_id)) from exc
        X = parsed[0]
        lo = int(X.indices.min()) if X.nnz else None
        hi = int(X.indices.max()) if X.nnz else -1
        zero_line = None
        if lo == 0:
            first_row = int(np.searchsorted(X.indptr, int(np.argmax(X.indices == 0)), side="right")) - 1
            zero_line = _row_line(chunk, first_row)
        facts = (X.shape[0], lo, hi, zero_line)
    except Exception as exc:
        error = exc
    facts, starts = _agree_text(comm, path, chunk, error, facts, 1)
    where = f"Cannot load {os.fspath(path)!r}"
    if sum(f[0] for f in facts) == 0:
        raise DistributedInputError(f"{where}: the file holds no data rows (it is empty or holds only comments)")
    mins = [f[1] for f in facts if f[1] is not None]
    zeros = [int(starts[r]) + f[3] for r, f in enumerate(facts) if f[3] is not None]
    if zero_based is False and zeros:
        raise DistributedInputError(f"{where}, line {zeros[0]}: index 0 found but zero_based=False "
                                    "(indices must start at 1)")
    one_based = zero_based is False or (zero_based == "auto" and (not mins or min(mins) > 0))
    n_found = max(max(f[2] for f in facts) + (0 if one_based else 1), 1 if not mins else 0)
    if n_features is None:
        n_features = n_found
    elif n_features < n_found:
        raise DistributedInputError(f"{where}: n_features was set to {n_features}, but the file contains "
                                    f"{n_found} features")
    X = parsed[0]
    indices = X.indices - 1 if one_based else X.indices
    X = sp.csr_matrix((X.data, indices, X.indptr), shape=(X.shape[0], int(n_features)))
    rest = list(parsed[1:])
    if dense:
        X = X.toarray()
        if xp is not np:
            X = xp.asarray(X)
    elif xp is not np:
        import cupyx.scipy.sparse as csp

        X = csp.csr_matrix(X)
    if xp is not np:
        rest = [xp.asarray(a) for a in rest]
    return (X, *rest)


def _parse_error(line, dtype, query_id):
    """scikit-learn's message for one malformed line."""
    try:
        _parse_svmlight(line, dtype, query_id)
    except Exception as exc:
        return _error_text(exc)
    return "malformed line"  # pragma: no cover - only called for a line that fails

"""Input validation for SPMD estimators: local checks, then one agreement.

Every rank validates its own shard; the facts that must agree across ranks
(number of features, dtype, memory kind, NaN/inf, rows) plus any local error
text are exchanged with one small ``allgather_obj``, and every rank raises the
same :class:`mpiml.DistributedInputError` naming the ranks at fault.  On a
size-1 communicator host input goes through scikit-learn's own
``validate_data`` so messages match scikit-learn exactly.
"""

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import validate_data as _sk_validate_data

from .._array import as_supported_array, get_namespace, is_device_array
from .._errors import DistributedInputError

__all__ = [
    "validate_data",
    "validate_sample_weight",
    "check_random_state",
    "global_row_offset",
    "row_counts",
    "agree_on_error",
    "xp_of",
    "to_device_like",
]

_NAN_HINT = (
    "\n{name} does not accept missing values encoded as NaN natively. For supervised learning, you "
    "might want to consider sklearn.ensemble.HistGradientBoostingClassifier and Regressor which accept "
    "missing values encoded as NaNs natively. Alternatively, it is possible to preprocess the data, for "
    "instance by using an imputer transformer in a pipeline or drop samples with missing values. See "
    "https://scikit-learn.org/stable/modules/impute.html You can find a list of all estimators that "
    "handle NaN values at the following page: "
    "https://scikit-learn.org/stable/modules/impute.html#estimators-that-handle-nan-values"
)


# ---------------------------------------------------------------------- small helpers
def xp_of(X):
    """The array namespace of ``X``: ``cupy`` for CuPy arrays, else ``numpy``."""
    return get_namespace(X)


def to_device_like(array, X):
    """``array`` on the namespace (and so the device) of ``X``; a no-op when it already is."""
    if array is None:
        return None
    want_device = is_device_array(X)
    if want_device and not is_device_array(array):
        import cupy

        return cupy.asarray(array)
    if not want_device and is_device_array(array):
        return array.get()
    return array


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def agree_on_error(comm, error, *, error_class=DistributedInputError, prefix=""):
    """Raise the same error on every rank if ``error`` is set on any rank.

    Parameters
    ----------
    comm : Communicator
        Every rank of ``comm`` must call this.
    error : BaseException, str or None
        This rank's local problem, or None.
    error_class : type, default=DistributedInputError
        Class raised on every rank.
    prefix : str
        Text put before the per-rank messages, e.g. ``"Cannot read 'x.csv'"``.

    Notes
    -----
    On a size-1 communicator a local exception is re-raised unchanged.
    One ``allgather_obj`` of the (short) messages is communicated.
    """
    if comm.size == 1:
        if isinstance(error, BaseException):
            raise error
        if error is not None:
            raise error_class(f"{prefix}: {error}" if prefix else str(error))
        return
    text = None if error is None else (str(error) if not isinstance(error, BaseException)
                                       else f"{error}" or type(error).__name__)
    texts = comm.allgather_obj(text)
    msg = _combine(texts, prefix)
    if msg is not None:
        raise error_class(msg) from (error if isinstance(error, BaseException) else None)


def _combine(texts, prefix):
    bad = [(r, t) for r, t in enumerate(texts) if t is not None]
    if not bad:
        return None
    ranks = [r for r, _ in bad]
    lead = f"{prefix} on rank(s) {ranks}" if prefix else f"Invalid input on rank(s) {ranks}"
    if len({t for _, t in bad}) == 1:
        return f"{lead}: {bad[0][1]}"
    return f"{lead}: " + "; ".join(f"rank {r}: {t}" for r, t in bad)


def row_counts(n_local, comm):
    """Rows on every rank, as an int64 NumPy array in rank order (one allgather)."""
    if comm.size == 1:
        return np.array([int(n_local)], dtype=np.int64)
    return np.asarray(comm.allgather(np.array([int(n_local)], dtype=np.int64)), dtype=np.int64)


def global_row_offset(n_local, comm):
    """Index of this rank's first row in the global dataset (exclusive scan of row counts)."""
    if comm.size == 1:
        return 0
    out = comm.exscan(np.array([int(n_local)], dtype=np.int64))
    return 0 if comm.rank == 0 else int(out[0])


# ---------------------------------------------------------------------- local checks
def _finite_flags(X, xp, ensure_all_finite):
    """(has_nan, has_inf) of a float array; a single reduction when everything is finite."""
    if ensure_all_finite is False or X.size == 0 or X.dtype.kind not in "fc":
        return False, False
    data = X.data if hasattr(X, "format") else X  # sparse matrices: check the stored values
    if data.ndim and data.size >= 1 << 31:
        # in row blocks of 2^30 elements: CuPy's 32-bit-index reduction, compiled already for smaller arrays
        # (its 64-bit-index one compiles on first use: 1 s each)
        rows = max(1, (1 << 30) // (data.size // data.shape[0]))
        total = sum(float(xp.sum(data[s:s + rows], dtype=xp.float64)) for s in range(0, data.shape[0], rows))
    else:
        total = float(xp.sum(data, dtype=xp.float64))
    if np.isfinite(total):
        return False, False
    has_nan = bool(xp.isnan(data).any()) if ensure_all_finite is True else False
    has_inf = bool(xp.isinf(data).any())
    return has_nan, has_inf


def _nonfinite_message(has_nan, has_inf, dtype, name, input_name="X"):
    if has_nan:
        msg = f"Input {input_name} contains NaN."
        if name and input_name == "X":
            msg += _NAN_HINT.format(name=name)
        return msg
    return f"Input {input_name} contains infinity or a value too large for {np.dtype(dtype)!r}."


def _check_device_sparse(X, accept_sparse):
    """cupyx.scipy.sparse input: refused like scikit-learn refuses SciPy's, or converted to the first
    accepted format."""
    if accept_sparse is False:
        raise TypeError("Sparse data was passed for X, but dense data is required. Use '.toarray()' to convert "
                        "to a dense numpy array.")
    if accept_sparse is not True:
        formats = [accept_sparse] if isinstance(accept_sparse, str) else list(accept_sparse)
        if X.format not in formats:
            X = X.asformat(formats[0])
    return X


def _check_device_array(X, *, name, dtype, ensure_min_features, order, accept_sparse=False):
    """scikit-learn's ``check_array`` checks for a CuPy array (messages alike)."""
    import cupy as xp

    context = f" by {name}" if name else ""
    sparse = hasattr(X, "format")
    if sparse:
        X = _check_device_sparse(X, accept_sparse)
    if X.dtype.kind == "c":
        raise ValueError(f"Complex data not supported\n{X}\n")
    allowed = [np.dtype(d) for d in dtype]
    if X.dtype not in allowed:
        X = X.astype(allowed[0])
    if X.ndim == 0:
        raise ValueError(
            f"Expected 2D array, got scalar array instead:\narray={X}.\nReshape your data either using "
            "array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) if it "
            "contains a single sample.")
    if X.ndim == 1:
        raise ValueError(
            f"Expected 2D array, got 1D array instead:\narray={X}.\nReshape your data either using "
            "array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) if it "
            "contains a single sample.")
    if X.ndim >= 3:
        raise ValueError(f"Found array with dim {X.ndim}, while dim <= 2 is required{context}.")
    if ensure_min_features > 0 and X.shape[1] < ensure_min_features:
        raise ValueError(f"Found array with {X.shape[1]} feature(s) (shape={X.shape}) while a minimum of "
                         f"{ensure_min_features} is required{context}.")
    if sparse:
        return X
    if order == "C":
        X = xp.ascontiguousarray(X)
    elif order == "F":
        X = xp.asfortranarray(X)
    return X


def _check_n_features(estimator, n_features, reset):
    name = type(estimator).__name__
    if reset:
        estimator.n_features_in_ = n_features
        if hasattr(estimator, "feature_names_in_"):
            delattr(estimator, "feature_names_in_")
        return
    expected = getattr(estimator, "n_features_in_", None)
    if expected is not None and n_features != expected:
        raise ValueError(f"X has {n_features} features, but {name} is expecting {expected} features as input.")


def _normalise_input(X):
    """DLPack producers (torch, ...) become NumPy or CuPy; everything else is left alone."""
    if (hasattr(X, "__dlpack_device__") and not isinstance(X, np.ndarray) and not is_device_array(X)
            and not hasattr(X, "columns") and not hasattr(X, "iloc")):
        return as_supported_array(X)
    return X


# ---------------------------------------------------------------------- public checks
def validate_data(estimator, X, *, comm=None, reset=True, dtype=("float64", "float32"), accept_sparse=False,
                  ensure_all_finite=True, ensure_min_features=1, allow_local_empty=True, order=None,
                  defer_finite=False, agree=True):
    """Validate this rank's shard ``X`` and agree on it across ranks.

    Parameters
    ----------
    estimator : estimator instance
        Named in messages; ``n_features_in_`` (and ``feature_names_in_`` for
        DataFrames) is set on it when ``reset`` and checked otherwise.
    X : array-like of shape (n_local_samples, n_features)
        NumPy or CuPy array, list, DataFrame, sparse matrix (if accepted) or a
        DLPack producer (a CUDA torch tensor becomes CuPy without a copy).
    comm : Communicator, default=None
        Defaults to ``estimator._get_comm()`` or the world communicator.
    reset : bool, default=True
        True in ``fit``; False in ``predict``/``transform``.
    dtype : tuple of str, default=("float64", "float32")
        Kept when ``X`` has one of them; converted to the first otherwise.
    accept_sparse : bool or str or list, default=False
        As in scikit-learn; also for ``cupyx.scipy.sparse`` input (refused with
        scikit-learn's TypeError, or converted to the first accepted format).
    ensure_all_finite : bool or "allow-nan", default=True
        Reject NaN and infinity on any rank.
    ensure_min_features : int, default=1
        Minimum number of columns.
    allow_local_empty : bool, default=True
        Whether a rank may hold zero rows (the global dataset never may). With
        ``reset=False`` on the size-1 communicator (a local method such as
        ``predict``) of an estimator whose own communicator has several ranks,
        zero rows are accepted too.
    order : {None, "C", "F"}, default=None
        Memory layout to enforce.
    defer_finite : bool, default=False
        For a dense CuPy ``X``: skip the NaN/infinity check (a full read of
        ``X`` and a wait for the device) because the caller finds non-finite
        values in a reduction it makes anyway and then raises the same error
        (:func:`mpiml.utils._supervised.raise_if_nonfinite`).  ``"host"``: dense
        host input too.  Sparse input is checked here as usual.
    agree : bool, default=True
        False (for a caller that agrees on more in the same round): on several
        ranks nothing is communicated nor raised here; a third value, this
        rank's ``(error, facts)``, is returned for the caller's
        ``allgather_obj``, whose gathered list :func:`agreed_X_message` turns
        into the message to raise (None on one rank, where errors raise here).

    Returns
    -------
    X : ndarray (NumPy or CuPy) or sparse matrix
        The validated shard, on the same device as the input.
    xp : module
        ``numpy`` or ``cupy``.

    Raises
    ------
    ValueError
        On a size-1 communicator, scikit-learn's error for host input.
    DistributedInputError
        On several ranks, the same message on every rank, naming the ranks.

    Notes
    -----
    Communicated: one ``allgather_obj`` of a small tuple per rank (plus none
    on a size-1 communicator).
    """
    if comm is None:
        get = getattr(estimator, "_get_comm", None)
        if get is not None:
            comm = get()
        else:
            from ..comm import get_comm

            comm = get_comm()
    if reset:  # first use by an estimator: this rank's thread pools get its share of the node (once)
        from ._threads import limit_threads

        # a CPU rank pinned to its cores too; device rows (CuPy): a GPU rank, whose threads stay free
        limit_threads(comm, place=not type(X).__module__.startswith(("cupy", "cupyx")))
    name = type(estimator).__name__
    single = comm.size == 1
    # A local method (predict, transform: validated on the size-1 communicator, no communication) of a
    # model that lives on several ranks: this rank may hold no rows, as fit allowed (scikit-learn's
    # "at least one sample" stays for models of one process).
    local_empty_ok = single and not reset and allow_local_empty and _spmd_size(estimator) > 1
    error = None
    xp = np
    facts = (False, 0, -1, "", False, False, ())
    try:
        X = _normalise_input(X)
        if is_device_array(X):
            xp = get_namespace(X)
            X = _check_device_array(X, name=name, dtype=dtype, ensure_min_features=ensure_min_features,
                                    order=order, accept_sparse=accept_sparse)
            if single and X.shape[0] < 1 and not local_empty_ok:
                raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 is "
                                 f"required by {name}.")
            _check_n_features(estimator, X.shape[1], reset)
        else:
            X = _sk_validate_data(
                estimator, X, reset=reset, dtype=list(dtype), accept_sparse=accept_sparse, order=order,
                ensure_all_finite=ensure_all_finite if single else False,
                ensure_min_samples=1 if single and not local_empty_ok else 0,
                ensure_min_features=ensure_min_features,
            )
        deferred = (defer_finite == "host" or (defer_finite and xp is not np)) and not hasattr(X, "format")
        if single and xp is not np and not deferred:
            has_nan, has_inf = _finite_flags(X, xp, ensure_all_finite)
            if has_nan or has_inf:
                raise ValueError(_nonfinite_message(has_nan, has_inf, X.dtype, name))
        if not single:
            has_nan, has_inf = (False, False) if deferred else _finite_flags(X, xp, ensure_all_finite)
            facts = (xp is not np, X.shape[0], X.shape[1], str(X.dtype), has_nan, has_inf, tuple(X.shape))
    except Exception as exc:
        if single:
            raise
        error = str(exc)
    if single:
        return (X, xp) if agree else (X, xp, None)
    if not agree:
        return X, xp, (error, facts)
    gathered = comm.allgather_obj((error, facts))
    msg = _distributed_message(gathered, name, allow_local_empty)
    if msg is not None:
        raise DistributedInputError(msg)
    return X, xp


def agreed_X_message(gathered, estimator, allow_local_empty=True):
    """The message every rank raises for the ranks' ``(error, facts)`` of ``validate_data(agree=False)``, or None."""
    return _distributed_message(gathered, type(estimator).__name__, allow_local_empty)


def _spmd_size(estimator):
    """Ranks of the communicator ``estimator`` was fitted over (1 when it has none).

    A model without a communicator of its own (a tree of a forest's ``estimators_``) may name the
    ranks of its fit in ``_fit_ranks``.
    """
    ranks = getattr(estimator, "_fit_ranks", None)
    if ranks is not None:
        return int(ranks)
    get = getattr(estimator, "_get_comm", None)
    if get is None:
        return 1
    try:
        return int(get().size)
    except Exception:  # noqa: BLE001 - no communicator: a single process
        return 1


def _distributed_message(gathered, name, allow_local_empty):
    """The one message every rank raises for the gathered facts, or None."""
    errors = [e for e, _ in gathered]
    msg = _combine(errors, "Invalid input X")
    if msg is not None:
        return msg
    facts = [f for _, f in gathered]
    device = [f[0] for f in facts]
    if len(set(device)) > 1:
        gpu = [r for r, d in enumerate(device) if d]
        cpu = [r for r, d in enumerate(device) if not d]
        return f"X is a GPU (CuPy) array on {_ranks(gpu)} but a host (NumPy) array on {_ranks(cpu)}."
    for i, what in ((2, "features"), (3, "dtype")):
        values = [f[i] for f in facts]
        ref = values[0]
        other = {}
        for r, v in enumerate(values):
            if v != ref:
                other.setdefault(v, []).append(r)
        if other:
            v, rs = next(iter(other.items()))
            if what == "features":
                return f"X has {v} features on {_ranks(rs)} but {ref} on rank 0."
            return f"X has dtype {v} on {_ranks(rs)} but {ref} on rank 0."
    nan = [r for r, f in enumerate(facts) if f[4]]
    if nan:
        return f"Input X contains NaN on rank(s) {nan}."
    inf = [r for r, f in enumerate(facts) if f[5]]
    if inf:
        return (f"Input X contains infinity or a value too large for {np.dtype(facts[inf[0]][3])!r} "
                f"on rank(s) {inf}.")
    rows = [f[1] for f in facts]
    if sum(rows) == 0:
        return (f"Found array with 0 sample(s) on every rank (shape={facts[0][6]} on rank 0) while a "
                f"minimum of 1 is required by {name}.")
    empty = [r for r, n in enumerate(rows) if n == 0]
    if empty and not allow_local_empty:
        return f"Found array with 0 sample(s) on rank(s) {empty} while {name} needs rows on every rank."
    return None


def validate_sample_weight(sample_weight, X, *, xp=None, dtype=None, only_non_negative=False,
                           allow_all_zero=False, comm=None):
    """Per-row weights for this rank's shard, on the namespace and dtype of ``X``.

    Parameters
    ----------
    sample_weight : None, float or array-like of shape (n_local_samples,)
        None means ones; a scalar is broadcast.
    X : ndarray of shape (n_local_samples, n_features)
        The validated shard.
    xp : module, default=None
        Namespace of ``X`` (derived when None).
    dtype : dtype, default=None
        Defaults to ``X.dtype``.
    only_non_negative : bool, default=False
        Reject negative weights.
    allow_all_zero : bool, default=False
        Accept weights that are zero on every row of every rank.
    comm : Communicator, default=None
        When given with more than one rank, a local problem (and whether the
        weights are zero everywhere) is agreed and raised on every rank (one
        ``allgather_obj``); otherwise checks are local.

    Returns
    -------
    ndarray of shape (n_local_samples,)
    """
    xp = xp if xp is not None else get_namespace(X)
    dtype = dtype if dtype is not None else X.dtype
    n = X.shape[0]
    error, out = None, None
    try:
        if sample_weight is None:
            out = xp.ones(n, dtype=dtype)
        elif isinstance(sample_weight, (int, float, np.number)) and not isinstance(sample_weight, bool):
            out = xp.full(n, sample_weight, dtype=dtype)
        else:
            sw = to_device_like(_normalise_input(sample_weight), X)
            if xp is np and not isinstance(sw, np.ndarray):
                sw = np.asarray(sw)
            out = sw.astype(dtype, copy=False) if sw.dtype.kind in "biuf" else None
            if out is None:
                raise ValueError(f"sample_weight must be numeric; got dtype {sw.dtype}")
            if out.ndim != 1:
                raise ValueError("Sample weights must be 1D array or scalar")
            if out.shape != (n,):
                raise ValueError(f"sample_weight.shape == {out.shape}, expected {(n,)}!")
            has_nan, has_inf = _finite_flags(out, xp, True)
            if has_nan or has_inf:
                raise ValueError(_nonfinite_message(has_nan, has_inf, out.dtype, None, "sample_weight"))
        if isinstance(sample_weight, (int, float, np.number)) and not isinstance(sample_weight, bool):
            negative, nonzero = n > 0 and sample_weight < 0, n > 0 and sample_weight != 0  # known on the host
        elif sample_weight is None:
            negative, nonzero = False, n > 0
        else:
            negative = bool(out.size and (out < 0).any())
            nonzero = out.size > 0 and bool((out != 0).any())
        if only_non_negative and negative:
            raise ValueError("Negative values in data passed to `sample_weight`")
    except Exception as exc:
        error = exc
    nonzero = error is None and bool(nonzero)
    if comm is not None and comm.size > 1:
        gathered = comm.allgather_obj((None if error is None else str(error), nonzero))
        msg = _combine([e for e, _ in gathered], "Invalid sample_weight")
        if msg is not None:
            raise DistributedInputError(msg)
        nonzero = any(nz for _, nz in gathered)
    elif error is not None:
        raise error
    if not allow_all_zero and not nonzero:
        cls = DistributedInputError if comm is not None and comm.size > 1 else ValueError
        raise cls("Sample weights must contain at least one non-zero number.")
    return out

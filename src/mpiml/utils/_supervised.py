"""Validation of ``(X, y)`` and the labels of classifiers, shared by the supervised estimator families.

:func:`validate_X_y` checks this rank's rows and targets and agrees on them across ranks;
:func:`global_classes` gathers the union of the labels. Linear models and nearest-neighbour
estimators both use them.
"""

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data as _sk_validate_data

from .._array import get_namespace, is_device_array, to_numpy
from .._errors import DistributedInputError
from ._linalg import is_sparse, to_csr
from ._validation import _combine, _finite_flags, _nonfinite_message, agreed_X_message, validate_data

__all__ = ["validate_X_y", "global_classes", "as_like", "sparse_mismatch", "SPARSE_DENSE_REQUIRED",
           "raise_if_nonfinite"]

#: scikit-learn's message for sparse input where dense data is required (a TypeError).
SPARSE_DENSE_REQUIRED = ("Sparse data was passed for X, but dense data is required. Use '.toarray()' to convert "
                         "to a dense numpy array.")


def as_like(array, xp, dtype=None):
    """A host or device copy of ``array`` on namespace ``xp`` (optionally cast)."""
    if xp is np:
        out = to_numpy(array)
    elif is_device_array(array):
        out = array
    else:   # host data cast on the host: one copy of the final bytes, no cast kernel on the device
        out = xp.asarray(array if dtype is None else np.asarray(array, dtype=dtype))
    return out if dtype is None else out.astype(dtype, copy=False)


def _sk_single(comm, X, y):
    return comm.size == 1 and not is_device_array(X) and not is_device_array(y)


def _sparse_as_csr(X, accept_sparse):
    """CSR for an accepted sparse shard (SciPy's validation converts host input already; ``cupyx`` input is
    converted here); scikit-learn's TypeError where dense data is required."""
    if not is_sparse(X):
        return X
    if not accept_sparse:
        raise TypeError(SPARSE_DENSE_REQUIRED)
    return to_csr(X)


def validate_X_y(estimator, X, y, *, comm, y_numeric, multi_output, reset=True, accept_sparse=False,
                 defer_finite=False, sample_weight_given=None, classes_into=None, before_agreement=None):
    """Validate this rank's ``X`` and ``y`` and agree on them across ranks.

    On one process with host input, scikit-learn's ``validate_data`` (its exact
    messages).  Otherwise :func:`mpiml.utils.validate_data` for ``X``, then
    local checks of ``y`` (length, dimensions, numeric, finite) agreed with one
    ``allgather_obj`` and raised as the same :class:`DistributedInputError` on
    every rank.  With ``accept_sparse`` (``"csr"``), SciPy and ``cupyx``
    sparse shards are accepted and returned as CSR; whether ``X`` is sparse
    must then agree across ranks (it steers the solver).

    With ``defer_finite`` and a dense CuPy ``X``, the NaN/infinity checks of
    ``X`` and ``y`` are left to the caller, which finds non-finite values in
    the reduction it makes anyway and then calls :func:`raise_if_nonfinite`
    (no full read of the data and no wait for the device here).  With
    ``defer_finite="host"`` the check of a dense host ``X`` is left to it too
    (a read of ``X`` as long as a least-squares Gram pass on one core).

    With ``sample_weight_given`` (whether this rank was passed weights), the
    agreement also tells whether any rank was, returned as a fourth value:
    when none was, the caller needs no agreement on the weights.

    ``classes_into``: a dict for a classifier's labels.  Where the labels of a
    device ``y`` are found anyway (to check their type), they travel with the
    agreement and ``classes_into["classes"]`` receives their sorted union
    over the ranks, what :func:`global_classes` returns, without its second
    read of ``y`` and second collective (and ``classes_into["rows"]`` the
    global row count).  Left empty otherwise.

    ``before_agreement(X, y, labels)``: called with this rank's validated
    device ``X`` and ``y`` (and a classifier's local distinct labels, or None)
    once its local checks passed, before the ranks agree: device work launched
    there runs while they do (a classifier's first evaluation).  It must not
    communicate; an exception there is ignored (its work is then not used).

    Returns
    -------
    X, y, xp
        ``y`` is on the namespace of ``X``; float for regressors (``y_numeric``).
    """
    if _sk_single(comm, X, y):
        # (defer_finite="host": the caller's reduction finds NaN/infinity in dense host X too; y is checked here)
        X, y = _sk_validate_data(estimator, X, y, reset=reset, dtype=[np.float64, np.float32],
                                 y_numeric=y_numeric, multi_output=multi_output,
                                 accept_sparse="csr" if accept_sparse else False,
                                 ensure_all_finite=not (defer_finite == "host" and not is_sparse(X)))
        if y_numeric and y.dtype.kind != "f":
            y = y.astype(np.float64)
        if not y_numeric:
            check_classification_targets(y)
        return (X, y, np) if sample_weight_given is None else (X, y, np, bool(sample_weight_given))
    # one agreement for X and y on several ranks: X's facts travel in y's allgather (X's message first)
    X, xp, x_facts = validate_data(estimator, X, comm=comm, reset=reset,
                                   accept_sparse="csr" if accept_sparse else False, defer_finite=defer_finite,
                                   agree=False)
    deferred = defer_finite and xp is not np and not is_sparse(X)
    error = labels = None
    if comm.size == 1 and xp is not np:
        X = _sparse_as_csr(X, accept_sparse)  # one process: scikit-learn's TypeError as is
    try:
        X = _sparse_as_csr(X, accept_sparse)
        if y is None:
            raise ValueError(f"{type(estimator).__name__} requires y to be passed, but the target y is None.")
        if xp is np:
            y = to_numpy(y) if is_device_array(y) else np.asarray(y)
        else:
            y = as_like(y, xp)
        if y.ndim == 2 and y.shape[1] == 1 and not multi_output:
            y = y.ravel()
        if y.ndim not in ((1, 2) if multi_output else (1,)):
            raise ValueError(f"y should be a 1d array{' or 2d array' if multi_output else ''}, got an array "
                             f"of shape {tuple(y.shape)} instead.")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                             f"[{X.shape[0]}, {y.shape[0]}]")
        if y_numeric:
            if y.dtype.kind not in "biuf":
                raise ValueError(f"y must be numeric; got dtype {y.dtype}")
            if y.dtype.kind != "f":
                y = y.astype(xp.float64)
            has_nan, has_inf = (False, False) if deferred else _finite_flags(y, xp, True)
            if has_nan or has_inf:
                raise ValueError(_nonfinite_message(has_nan, has_inf, y.dtype, None, "y"))
        elif xp is not np:
            # the distinct values of a device y (no copy of y to the host): they hold every NaN or
            # infinity y holds, and the label type follows from them
            labels = _device_labels(y) if y.shape[0] else None
            if labels is not None and labels.dtype.kind == "f":
                has_nan, has_inf = bool(np.isnan(labels).any()), bool(np.isinf(labels).any())
                if has_nan or has_inf:
                    raise ValueError(_nonfinite_message(has_nan, has_inf, y.dtype, None, "y"))
            if labels is not None:
                _check_label_values(labels)
        else:
            if y.dtype.kind == "f":
                has_nan, has_inf = _finite_flags(y, xp, True)
                if has_nan or has_inf:
                    raise ValueError(_nonfinite_message(has_nan, has_inf, y.dtype, None, "y"))
            if y.shape[0]:
                check_classification_targets(y)
    except Exception as exc:
        error = str(exc)
    x_ok = x_facts is None or x_facts[0] is None     # (None: one rank, where X's errors raised already)
    if before_agreement is not None and error is None and x_ok and xp is not np:
        try:
            before_agreement(X, y, labels)
        except Exception:   # noqa: BLE001 - a speculation that failed: the caller goes the usual way
            pass
    any_weights = bool(sample_weight_given)
    # the labels travel with the agreement (a device y's, found above; the namespace is agreed already)
    share = classes_into is not None and not y_numeric and xp is not np
    if comm.size > 1:
        facts = None if error else (tuple(y.shape[1:]), y.dtype.kind in "USO", is_sparse(X))
        mine = (labels, 0 if error else int(y.shape[0]))
        gathered = comm.allgather_obj((error, facts, bool(sample_weight_given), x_facts)
                                      + ((mine,) if share else ()))
        msg = agreed_X_message([g[3] for g in gathered], estimator)
        if msg is not None:
            raise DistributedInputError(msg)
        msg = _combine([g[0] for g in gathered], "Invalid input") or _y_mismatch([g[1] for g in gathered])
        if msg is not None:
            raise DistributedInputError(msg)
        any_weights = any(g[2] for g in gathered)
        if share:
            classes_into["classes"] = _union([g[4][0] for g in gathered])
            classes_into["rows"] = sum(g[4][1] for g in gathered)
    elif error is not None:
        raise ValueError(error)
    elif share:
        classes_into["classes"] = _union([labels])
        classes_into["rows"] = int(y.shape[0])
    return (X, y, xp) if sample_weight_given is None else (X, y, xp, any_weights)


def raise_if_nonfinite(estimator, X, y, *, comm, xp):
    """The NaN/infinity checks that ``validate_X_y(defer_finite=True)`` left out, with their errors.

    Collective: every rank calls it (they all saw the same non-finite
    reduction).  Raises what the checks would have raised (the same class and
    text on every rank); returns when ``X`` and ``y`` are finite everywhere
    (the reduction then overflowed).
    """
    name = type(estimator).__name__
    xf = _finite_flags(X, xp, True)
    yf = _finite_flags(y, xp, True)
    if comm.size == 1:
        if any(xf):
            raise ValueError(_nonfinite_message(*xf, X.dtype, name))
        if any(yf):
            raise ValueError(_nonfinite_message(*yf, y.dtype, None, "y"))
        return
    facts = comm.allgather_obj((xf, yf, str(X.dtype), str(y.dtype)))
    nan = [r for r, f in enumerate(facts) if f[0][0]]
    if nan:
        raise DistributedInputError(f"Input X contains NaN on rank(s) {nan}.")
    inf = [r for r, f in enumerate(facts) if f[0][1]]
    if inf:
        raise DistributedInputError(f"Input X contains infinity or a value too large for "
                                    f"{np.dtype(facts[inf[0]][2])!r} on rank(s) {inf}.")
    msg = _combine([_nonfinite_message(*f[1], f[3], None, "y") if any(f[1]) else None for f in facts],
                   "Invalid input")
    if msg is not None:
        raise DistributedInputError(msg)


def _y_mismatch(facts):
    """The message for targets whose shape or kind (labels as text vs numbers) differ across ranks,
    or for ``X`` sparse on some ranks only."""
    def describe(i, value):
        if i == 0:
            return "a 1-d target" if not value else f"{value[0]} target columns"
        return "text labels" if value else "numeric labels"

    for i in (0, 1):
        ref = facts[0][i]
        bad = [r for r, f in enumerate(facts) if f[i] != ref]
        if bad:
            return (f"y has {describe(i, facts[bad[0]][i])} on rank(s) {bad} but {describe(i, ref)} on rank 0 "
                    "(every rank must pass targets of the same shape and kind).")
    return sparse_mismatch([f[2] for f in facts])


def sparse_mismatch(flags):
    """The message for ``X`` sparse on some ranks and dense on others, or None."""
    if len(set(flags)) <= 1:
        return None
    sparse = [r for r, f in enumerate(flags) if f]
    dense = [r for r, f in enumerate(flags) if not f]
    return (f"X is sparse on rank(s) {sparse} but dense on rank(s) {dense} (every rank must pass the same kind "
            "of matrix).")


def _device_labels(y):
    """The sorted distinct labels of a CuPy vector; one or two of them without sorting the vector.

    Most labels are binary: the minimum, the maximum and whether any row equals neither (reads of
    ``y`` on the device, one copy of the three to the host; a sort of 4e7 labels costs ~40 reads)
    find them; for int32/int64/float32/float64 labels one kernel finds the smallest two and the
    largest in one read.  Anything else (more labels, NaN) falls back to ``unique``.  One code path over the
    array namespace (NumPy runs the same lines: the CPU tests cover the GPU's).
    """
    xp = get_namespace(y)
    if xp is not np:   # the common label dtypes: one kernel reads y once (mpiml.kernels.linear.label_scan)
        from ..kernels import linear as kernels

        found = kernels.label_scan(y)
        if found is not None:
            (lo, lo2, hi), flags = found
            if not flags & kernels.LABELS_NAN:
                if not flags & kernels.LABELS_TWO:
                    return np.array([lo], dtype=y.dtype)
                if lo2 == hi:
                    return np.array([lo, hi], dtype=y.dtype)
            return to_numpy(xp.unique(y))
    lo, hi = y.min(), y.max()
    other = ((y != lo) & (y != hi)).any()   # (0 or 1: exact in y's dtype)
    lo, hi, more = to_numpy(xp.stack([lo, hi, other.astype(y.dtype)]))
    if not more:
        return np.unique(np.array([lo, hi], dtype=y.dtype))
    return to_numpy(xp.unique(y))


def _check_label_values(labels):
    """scikit-learn's ``check_classification_targets`` on a rank's distinct labels (a short host vector).

    Integer and boolean labels, and floats holding integers, are its ``"binary"``/``"multiclass"``
    targets: accepted here without its type inspection (a few hundred microseconds a fit); anything
    else goes through it, for its verdict and message.
    """
    kind = labels.dtype.kind
    if kind in "biu" and labels.ndim == 1:
        return
    if kind == "f" and labels.ndim == 1 and bool(np.all(np.abs(labels) < 2.0 ** 53)) \
            and bool(np.all(labels == labels.astype(np.int64))):
        return
    check_classification_targets(labels)


def _union(parts):
    """The sorted union of the ranks' label arrays (None: a rank without rows)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return np.array([])
    return np.unique(np.concatenate(parts))


def global_classes(y, comm):
    """The sorted union of the labels of every rank (one ``allgather_obj``).

    Labels of any type that NumPy sorts (numbers, strings) are accepted; a
    rank without rows contributes nothing.
    """
    if not y.shape[0]:
        local = None
    elif is_device_array(y):
        local = _device_labels(y)
    else:
        local = np.unique(y)
    return _union(comm.allgather_obj(local) if comm.size > 1 else [local])

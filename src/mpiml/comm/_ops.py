"""Reduction operations, dtypes, and the local reduction used by every algorithm."""

import numpy as np

__all__ = ["OPS", "SUPPORTED_DTYPES", "check_op", "check_dtype", "reduce_local", "identity", "dtype_code"]

OPS = ("sum", "prod", "min", "max")

SUPPORTED_DTYPES = tuple(
    np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64", "bool")
)

# NumPy / CuPy ufunc names; on bool, add is logical or and multiply logical and,
# exactly as the ufuncs define them for a bool output.
_UFUNC = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum"}


def check_op(op):
    if op not in _UFUNC:
        raise ValueError(f"unknown reduction op {op!r} (known: {list(OPS)})")
    return op


def check_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"dtype {dtype} is not supported by mpiml collectives "
            f"(supported: {[str(d) for d in SUPPORTED_DTYPES]})"
        )
    return dtype


def dtype_code(dtype):
    """A small integer naming the dtype, equal on every rank (for signature checks)."""
    return SUPPORTED_DTYPES.index(np.dtype(dtype)) + 1


def reduce_local(xp, op, inbuf, inoutbuf):
    """``inoutbuf = op(inbuf, inoutbuf)`` elementwise, in place, on host or device."""
    if inbuf.size:
        getattr(xp, _UFUNC[op])(inbuf, inoutbuf, out=inoutbuf)
    return inoutbuf


def identity(op, dtype):
    """The identity element of ``op`` for ``dtype`` (used by exscan on rank 0)."""
    dtype = np.dtype(dtype)
    if op == "sum":
        return np.zeros((), dtype)[()]
    if op == "prod":
        return np.ones((), dtype)[()]
    if dtype == np.bool_:
        return np.bool_(op == "min")
    if dtype.kind == "f":
        return dtype.type(np.inf if op == "min" else -np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if op == "min" else info.min)

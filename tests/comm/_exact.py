"""Inputs whose collective results are exact in every dtype, and their NumPy reference (the GPU scripts).

Small integers (booleans for ``bool``) seeded by rank, size and a salt, so sums, products, minima and
maxima over a few ranks are exact in float16 as in int64 and every result compares with ``==``.
"""

import numpy as np

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]
OPS = ["sum", "prod", "min", "max"]
NP_OP = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def data(rank, n, dtype, salt=0):
    rng = np.random.default_rng(1000 * rank + 7 * n + salt)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    return rng.integers(-3, 4, n).astype(dtype)


def reduce_np(arrays, op):
    out = arrays[0].copy()
    for a in arrays[1:]:
        out = NP_OP[op](out, a).astype(arrays[0].dtype)
    return out


def device(x, offset):
    """A CuPy copy of ``x``; with ``offset`` a view one element into a larger array."""
    import cupy as cp

    if not offset:
        return cp.asarray(x)
    base = cp.zeros(x.size + 1, dtype=x.dtype)
    base[1:] = cp.asarray(x)
    return base[1:]

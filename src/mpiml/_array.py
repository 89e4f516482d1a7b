"""The array namespace of an input: NumPy or CuPy ("everything follows X")."""

import sys

import numpy as np

__all__ = ["get_namespace", "is_device_array", "to_numpy", "cupy_or_none", "as_supported_array"]


def cupy_or_none():
    """CuPy if it is importable *and already imported or needed*; never imports at mpiml import."""
    cp = sys.modules.get("cupy")
    if cp is not None:
        return cp
    try:
        import cupy as cp  # noqa: F811
    except Exception:  # ImportError, or a CUDA runtime error at import
        return None
    return cp


def is_device_array(x):
    """True for CuPy arrays (checked without importing CuPy)."""
    return type(x).__module__.startswith("cupy")


def get_namespace(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    for a in arrays:
        if a is not None and is_device_array(a):
            import cupy

            return cupy
    return np


def to_numpy(x):
    """A NumPy view or copy of ``x`` (device arrays are copied to the host)."""
    if is_device_array(x):
        return x.get()
    return np.asarray(x)


def as_supported_array(x):
    """``x`` as a NumPy or CuPy array; other DLPack producers (torch, ...) are converted.

    A CUDA tensor becomes a CuPy array without a copy; a CPU tensor a NumPy array.
    """
    if isinstance(x, np.ndarray) or is_device_array(x):
        return x
    if hasattr(x, "__dlpack_device__"):
        dev_type, _ = x.__dlpack_device__()
        if int(dev_type) in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            import cupy

            return cupy.from_dlpack(x)
        return np.from_dlpack(x)
    return np.asarray(x)

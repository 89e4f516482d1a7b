"""Numba, imported on first use with its compilation cache in a writable place.

Why Numba for the CPU kernels: it ships binary wheels for every platform NumPy does, so
``pip install mpiml`` needs no compiler; a kernel is compiled once per machine at its first
use and cached on disk (``cache=True``), so later processes (every rank of every job) load
it in milliseconds; ``prange`` gives the threads, limited per rank by
:mod:`mpiml.utils._threads`.

The cache goes where ``NUMBA_CACHE_DIR`` says; when it is unset, under
``$MPIML_KERNEL_CACHE/numba`` if that is set, else beside the package (Numba's default)
when the package directory is writable, else ``~/.cache/mpiml/numba``.
"""

import os

__all__ = ["numba", "FASTMATH"]

#: Reassociation and contraction (vectorised sums, FMA) but no finite-math assumptions:
#: the kernels see only validated, finite input, yet an infinity must still compare right.
FASTMATH = {"nsz", "arcp", "contract", "reassoc"}


def _cache_dir():
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None  # the user's
    root = os.environ.get("MPIML_KERNEL_CACHE")
    if root:
        return os.path.join(root, "numba")
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.access(package, os.W_OK):
        return None  # Numba's __pycache__ beside the sources
    return os.path.join(os.path.expanduser("~"), ".cache", "mpiml", "numba")


def numba():
    """The ``numba`` module, its cache directory set (before its first import) and its
    thread count limited to this rank's share (see :mod:`mpiml.utils._threads`)."""
    import sys

    if "numba" not in sys.modules:
        where = _cache_dir()
        if where:
            os.makedirs(where, exist_ok=True)
            os.environ["NUMBA_CACHE_DIR"] = where
    import numba as nb

    from ._threads import _set_numba_threads, numba_threads

    _set_numba_threads(numba_threads())
    return nb

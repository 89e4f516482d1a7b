"""The k-means distance kernels' former module: they live in :mod:`mpiml.kernels.kmeans` (a folder per family).

Kept so that ``from mpiml.kernels import distances`` in scripts and notebooks goes on working: the family's
public functions are re-exported, and any other name (the benchmarks time private launchers such as
``distances._tc_launch``) is read from the family's modules.  Assigning a name here changes nothing in the
family: set it on the module that defines it (``mpiml.kernels.kmeans._small._SMALL_TC_CELLS``).
"""

from . import kmeans
from .kmeans import _common, _lloyd, _simt, _small, _tc
from .kmeans import *  # noqa: F401,F403 - the family's public functions, under their old module

# the family's public names, less the build's file lists and device emulation (never part of this module)
__all__ = [n for n in kmeans.__all__ if n not in ("emulated_device", "TC_FILES", "SIMT_FILES")]

_FAMILY = (_lloyd, _small, _tc, _simt, _common)


def __getattr__(name):
    for mod in _FAMILY:
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

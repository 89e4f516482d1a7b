"""The k-means distance kernels' former module: they live in :mod:`mpiml.kernels.kmeans` (a folder per family).

Kept so that ``from mpiml.kernels import distances`` in scripts and notebooks goes on working: the family's
public functions are re-exported, and any other name (the benchmarks time private launchers such as
``distances._tc_launch``) is read from the family's modules.  Assigning a name here changes nothing in the
family: set it on the module that defines it (``mpiml.kernels.kmeans._small._SMALL_TC_CELLS``).
"""

from .kmeans import (_common, _lloyd, _simt, _small, _tc, argmin_sqeuclidean, kernel_plan, lloyd_step,
                     lloyd_step_packed, lloyd_update, pack_centres, pairwise_distances, small_plan, sums_plan,
                     tc_plan, tc_supported, topk)

__all__ = [
    "argmin_sqeuclidean",
    "lloyd_step",
    "lloyd_step_packed",
    "lloyd_update",
    "pairwise_distances",
    "topk",
    "kernel_plan",
    "tc_plan",
    "small_plan",
    "sums_plan",
    "tc_supported",
    "pack_centres",
]

_FAMILY = (_lloyd, _small, _tc, _simt, _common)


def __getattr__(name):
    for mod in _FAMILY:
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

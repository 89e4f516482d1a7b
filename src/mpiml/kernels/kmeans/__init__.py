"""The k-means kernel family for CuPy arrays: arg-min, Lloyd step and centres' update, pairwise distances, top-k.

KMeans calls these (:mod:`mpiml.cluster._gpu`); the nearest neighbours take :func:`topk` where ``k`` is past
the selection kernels of :mod:`mpiml.kernels.select`.  An instantiation is loaded through
:mod:`mpiml.kernels._loader` (a shipped cubin, this machine's cache, else NVRTC once) the first time it is
needed; kernels are memoized per device.  Nothing compiles at import.

Inputs: CuPy arrays, float32 or float64 (``C``, weights and shifts are cast to the dtype of ``X``), any
strides (non-contiguous input is copied once), any ``d`` and ``k``; zero rows is allowed.  Ties go to the
lower index, like scikit-learn.

Where things are (CUDA sources beside their launchers; see ``docs/kmeans.md`` for the kernels themselves):

=================  ===================================================================================
``_lloyd.py``      the entry points and the choice of kernel for a launch (``_method``)
``_small.py``      whole rows in registers, k and d up to 32 (``small.cu``, ``small_tc.cu``)
``_tc.py``         tensor cores, sm_80 and later (``tc.cu``), and the sums passes (``sums.cu``)
``_simt.py``       the register tile without tensor cores, the cuBLAS path, pairwise distances (``simt.cu``)
``_common.py``     the device, the two programs and their loading, launch geometry, the inputs' checks
=================  ===================================================================================

The tensor-core program is one source in five files (``tc_common.cuh`` first, :data:`TC_FILES`), the SIMT
program one file (:data:`SIMT_FILES`).
"""

from ._common import SIMT_FILES, TC_FILES, emulated_device, tc_supported
from ._lloyd import argmin_sqeuclidean, lloyd_step, lloyd_step_packed, lloyd_update
from ._simt import kernel_plan, pairwise_distances, topk
from ._small import small_plan
from ._tc import pack_centres, sums_plan, tc_plan

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
    "emulated_device",
    "TC_FILES",
    "SIMT_FILES",
]

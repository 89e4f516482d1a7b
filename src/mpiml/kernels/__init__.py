"""CUDA sources of the collectives, loaded through :mod:`mpiml.kernels._loader`, memoized per device.

Each family is one templated ``.cu`` file in ``kernels/comm/``; the shared
protocol lives in ``comm/ipc_common.cuh`` and is prepended to every family
(paths are relative to ``kernels/``, as the loader takes them). Nothing
compiles at import: :func:`get_kernel` loads a family for one element type
the first time it is asked for (a shipped cubin, this machine's cache, else
NVRTC once) and returns the raw ``CUfunction`` handle, which the caller launches
with pre-packed arguments (see :mod:`mpiml.comm.backends.ipc`).

Kernel names are ``mpiml_<family>_<variant>``; reduction kernels are
instantiated as ``name<T, OP, A>`` (OP 0 sum, 1 prod, 2 min, 3 max; A true when
the user's arrays are 16-byte aligned, so they are accessed 16 bytes at a
time), copy kernels as ``name<U, A>`` with ``U`` an unsigned type of the
element size.
"""

from importlib import resources

import numpy as np

__all__ = ["get_kernel", "source", "reduce_type", "copy_type", "FAMILIES", "OP_CODES", "COMMON"]

#: the protocol header prepended to every family (a path relative to kernels/)
COMMON = "comm/ipc_common.cuh"
#: The push kernels' program (``mpiml.comm.backends.ipc``'s ``llpush``: a family of its own, loaded by
#: ``ipc._push_kernel`` and shipped by :mod:`mpiml.kernels.build`; the same files in the same order in both).
PUSH_SOURCES = (COMMON, "comm/small_push.cu")

#: family -> (file relative to kernels/, kernels in it, whether they reduce)
FAMILIES = {
    "allreduce": ("comm/allreduce.cu", ("mpiml_allreduce_oneshot", "mpiml_allreduce_twoshot", "mpiml_allreduce_ll",
                                       "mpiml_allreduce_lltwoshot", "mpiml_allreduce_pipe", "mpiml_allreduce_ll128"),
                  True),
    "reduce": ("comm/reduce.cu", ("mpiml_reduce_oneshot", "mpiml_scan_oneshot", "mpiml_reduce_scatter_oneshot",
                               "mpiml_reduce_scatter_ll", "mpiml_reduce_ll", "mpiml_reduce_twoshot",
                               "mpiml_reduce_lltwoshot", "mpiml_reduce_pipe", "mpiml_reduce_llrelay",
                               "mpiml_reduce_ll128", "mpiml_reduce_ll128direct", "mpiml_reduce_scatter_ll128",
                               "mpiml_reduce_ll128twoshot"), True),
    "bcast": ("comm/bcast.cu", ("mpiml_bcast_pull", "mpiml_allgather_pull", "mpiml_bcast_ll", "mpiml_allgather_ll",
                                "mpiml_bcast_twoshot", "mpiml_allgather_push", "mpiml_bcast_lltwoshot",
                                "mpiml_bcast_pipe", "mpiml_bcast_ll128"), False),
}

OP_CODES = {"sum": 0, "prod": 1, "min": 2, "max": 3}

_REDUCE_TYPES = {
    np.dtype("float16"): "mpiml_half",
    np.dtype("float32"): "float",
    np.dtype("float64"): "double",
    np.dtype("int32"): "int",
    np.dtype("int64"): "long long",
    np.dtype("bool"): "unsigned char",
}
_COPY_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}

_SOURCES = {}
_MODULES = {}
_KERNELS = {}


def reduce_type(dtype):
    """The CUDA element type the reduction kernels use for ``dtype``."""
    return _REDUCE_TYPES[np.dtype(dtype)]


def copy_type(itemsize):
    """The unsigned CUDA type the copy kernels use for elements of ``itemsize`` bytes."""
    return _COPY_TYPES[int(itemsize)]


def source(family):
    """The full CUDA source of ``family`` (common header + family file)."""
    text = _SOURCES.get(family)
    if text is None:
        pkg = resources.files(__name__)
        text = pkg.joinpath(COMMON).read_text() + "\n" + pkg.joinpath(FAMILIES[family][0]).read_text()
        _SOURCES[family] = text
    return text


def _name_expressions(family, ctype, size):
    _, names, reduces = FAMILIES[family]
    if reduces:
        return [f"{n}<{ctype}, {op}, {a}>" for n in names for op in range(4) for a in ("false", "true")]
    return [f"{n}<{ctype}, {a}>" for n in names for a in ("false", "true")]


def _module(family, ctype, size):
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (dev, family, ctype)
    mod = _MODULES.get(key)
    if mod is None:
        # every instantiation of the family for this type in one cubin: shipped, cached or compiled once
        from ._loader import load_module

        mod = load_module((COMMON, FAMILIES[family][0]), _name_expressions(family, ctype, size))
        _MODULES[key] = mod
    return mod


def get_kernel(family, name, dtype, op=None, aligned=False):
    """The ``CUfunction`` handle (an int) of one instantiation, compiled on first use.

    Parameters
    ----------
    family : str
        Key of :data:`FAMILIES`.
    name : str
        Kernel name, e.g. ``"mpiml_allreduce_oneshot"``.
    dtype : numpy.dtype
        Element type of the buffers.
    op : str, default=None
        Reduction op for reducing kernels ("sum", "prod", "min", "max").
    aligned : bool, default=False
        Whether the user's arrays (and, for allgather, the row stride) are
        16-byte aligned, so that they are read and written 16 bytes at a time.
    """
    import cupy

    dtype = np.dtype(dtype)
    key = (cupy.cuda.runtime.getDevice(), name, dtype.char, op, aligned)
    fn = _KERNELS.get(key)
    if fn is None:
        reduces = FAMILIES[family][2]
        ctype = reduce_type(dtype) if reduces else copy_type(dtype.itemsize)
        mod = _module(family, ctype, dtype.itemsize)
        a = "true" if aligned else "false"
        expr = f"{name}<{ctype}, {OP_CODES[op]}, {a}>" if reduces else f"{name}<{ctype}, {a}>"
        kernel = mod.get_function(expr)  # a RawKernel; .kernel is the loaded Function
        func = kernel.kernel
        fn = (kernel, func, int(func.ptr))
        _KERNELS[key] = fn
    return fn[2]

"""The sparse family's launch layer: its one NVRTC program's expressions, the kernels loaded once per device, the
grid of a grid-stride launch, and which matrices the kernels take.  Below :mod:`mpiml.kernels.sparse` and its
``_transpose``; CuPy is imported inside the functions only."""

import os

import numpy as np

FILES = ("sparse/spmm.cu",)
_THREADS = 256                     # MPIML_SPARSE_THREADS in spmm.cu
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

_FUNCTIONS = {}
_SMS = {}


#: The sort words of ``mpiml_csr_sort_runs``: (index << pbits) | place in 32 bits when they fit, else 64.
SORT_WORDS = ("unsigned int", "unsigned long long")
#: Stored values a thread of the bucket transpose's kernels holds, by value type (``mpiml_bt_*<T, PER>``).
BUCKET_PER = {"float": 8, "double": 4}


def expressions():
    """Every instantiation the launchers ask for (what :mod:`mpiml.kernels.build` ships)."""
    out = []
    for t in ("float", "double"):
        for o in ("float", "double"):
            out += [f"mpiml_csr_gather<{t}, double, {o}, {g}, {c}>" for g, c in _PLANS]
            out += [f"mpiml_csr_rowdot<{t}, double, {o}, {g}>" for g in (4, 8, 16, 32)]
            out += [f"mpiml_csr_scatter<{t}, {o}, {g}, {c}>" for g, c in _PLANS]
        out += [f"mpiml_csr_row_moments<{t}>", f"mpiml_dense_col_moments<{t}>"]
        out += [f"mpiml_csr_gather4<{t}, {lanes}>" for lanes in (2, 4, 8)]   # {t}: the output type here
        out += [f"mpiml_csr_scatter_vec<{t}, {g}>" for g in (4, 8, 16, 32)]
        out += [f"mpiml_csr_normal_vec<{t}, {g}, {w}>" for g in (4, 8, 16, 32) for w in ("false", "true")]
        out += [f"mpiml_csr_piece_dot<{t}, {g}>" for g in (4, 8, 16, 32)]
        out += [f"mpiml_csr_piece_scatter<{t}, {g}>" for g in (4, 8, 16, 32)]
        out += [f"mpiml_csr_transpose_fill<{t}>"]
        out += [f"mpiml_csr_sort_runs<{t}, {w}>" for w in SORT_WORDS]
        out += [f"mpiml_bt_scatter<{t}, {BUCKET_PER[t]}>", f"mpiml_bt_place<{t}, {BUCKET_PER[t]}>"]
        out += [f"mpiml_normal<{t}>"]
    out += ["mpiml_csr_split", "mpiml_csr_col_counts", "mpiml_csr_col_counts_smem", "mpiml_small_cholinv",
            "mpiml_small_svd", "mpiml_csr_block_counts", "mpiml_csr_block_scan"]
    out += [f"mpiml_csr_block_fill<{t}>" for t in ("float", "double")]
    out += [f"mpiml_csr_scatter4<{lanes}>" for lanes in (2, 4, 8)]
    out += [f"mpiml_bt_counts<{per}>" for per in sorted(set(BUCKET_PER.values()))]
    return out


#: (lanes per row, columns per lane) by block width: b <= 8, 16, 32, 64, 128.
_PLANS = ((8, 1), (16, 1), (32, 1), (32, 2), (32, 4))


def _env_choice(name, choices):
    """The environment variable ``name``, one of ``choices`` (the first when unset), else a clear error."""
    mode = os.environ.get(name, choices[0])
    if mode not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {mode!r}")
    return mode


def _function(expr):
    import cupy

    key = (cupy.cuda.runtime.getDevice(), expr)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        from .._loader import load_module

        fn = load_module(FILES, [expr], also=_siblings(expr)).get_function(expr)
        _FUNCTIONS[key] = fn
    return fn


def _siblings(expr):
    """The expressions compiled with ``expr`` on a miss: the same kernel with the same value type (its other
    lane counts, widths and output types), so one compilation serves a fit."""
    if "<" not in expr:
        return []
    name, args = expr.split("<", 1)
    head = f"{name}<{args.split(',')[0]}"
    return [e for e in expressions() if e != expr and (e.startswith(head + ",") or e.startswith(head + ">"))]


def _sm_count():
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    if dev not in _SMS:
        _SMS[dev] = cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
    return _SMS[dev]


#: Most blocks a grid-stride launch has per SM (:func:`_blocks`; the benchmark sweeps it).
MAX_BLOCKS_PER_SM = 64


def _blocks(rows_per_block, n_rows):
    """Blocks of a grid-stride launch: enough for every row, at most :data:`MAX_BLOCKS_PER_SM` an SM."""
    need = max(1, -(-int(n_rows) // rows_per_block))
    return int(min(need, _sm_count() * MAX_BLOCKS_PER_SM))


def supported(A):
    """Whether the kernels take ``A``: a ``cupyx`` CSR matrix of float32/float64 values with int32 indices."""
    return (type(A).__module__.startswith("cupyx") and getattr(A, "format", None) == "csr"
            and np.dtype(A.dtype) in _TYPES and A.indices.dtype == np.int32 and A.indptr.dtype == np.int32)

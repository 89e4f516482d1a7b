"""The bootstrap counts of one tree on a GPU rank's rows (``bootstrap.cu``), for :mod:`mpiml.ensemble._bootstrap`.

One kernel replaces the array path's twenty-odd CuPy passes over the draws (block search, hash,
landing weight, row search, ``bincount``): a CUDA block per bootstrap block counts that block's
draws in shared memory and writes its rows' counts.  The counts equal the array path's (and
NumPy's) bit for bit.  Loaded through :mod:`mpiml.kernels._loader` on first use, memoised per device.
"""

import numpy as np

__all__ = ["tree_counts", "EXPRESSIONS"]

EXPRESSIONS = ["mpiml_boot_counts<false>", "mpiml_boot_counts<true>"]
_THREADS = 256
_FUNCTIONS = {}


def _function(weighted):
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    fns = _FUNCTIONS.get(dev)
    if fns is None:
        from .._loader import load

        fns = _FUNCTIONS[dev] = load(("forest/bootstrap.cu",), EXPRESSIONS)
    return fns[EXPRESSIONS[int(bool(weighted))]]


_SMEM = {}


def _smem_limit():
    """The largest opt-in shared memory of a block on the current device (bytes), memoised."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    if dev not in _SMEM:
        _SMEM[dev] = int(cupy.cuda.Device(dev).attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
    return _SMEM[dev]


def tree_counts(head, first, Q, base, b0, S, g0, n, cum, c_lo, c_hi, out):
    """Write into ``out`` (CuPy float64, ``n``) the times each row ``g0 .. g0 + n - 1`` is drawn.

    Parameters
    ----------
    head : int
        The tree's 64-bit hash head (:func:`mpiml.ensemble._hist.hash_head` of the tree's key).
    first : cupy int64 array, ``b1 - b0 + 1``
        The first draw number of each block ``b0 .. b1 - 1``, and the end.
    Q, base : cupy float64 arrays, ``b1 - b0``
        Those blocks' weights and the weight before each (exact integers).
    b0, S : int
        The first block met by the rows, rows per block.
    g0, n : int
        The rows' first global index and count.
    cum : cupy float64 array of ``n`` or None
        Weighted draws: the global cumulated weight at the end of each row; None: unweighted.
    c_lo, c_hi : float
        Weighted: the cumulated weight before the first row and at the end of the last.

    Returns
    -------
    bool
        False (``out`` untouched) when one block's rows do not fit a block's shared memory.
    """
    import cupy

    smem = int(S) * 4
    if smem > _smem_limit():
        return False
    weighted = cum is not None
    fn = _function(weighted)
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    blocks = int(first.shape[0]) - 1
    if blocks <= 0 or n <= 0:
        out[...] = 0
        return True
    fn((blocks,), (_THREADS,),
       (np.uint64(head), first, Q, base, np.int64(b0), np.int64(S), np.int64(g0), np.int64(n),
        cum if weighted else out, np.float64(c_lo), np.float64(c_hi), out), shared_mem=smem)
    return True

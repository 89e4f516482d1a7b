"""How a global dataset is cut into shards and into random-number blocks.

Rows are split over ranks like :func:`numpy.array_split`: the first
``n % size`` ranks hold one row more.  Generators draw rows in fixed-size
blocks, each from its own stream seeded by ``(random_state, block index)``,
so that the global dataset does not depend on the number of ranks and a rank
only generates the blocks overlapping its rows.
"""

import secrets

import numpy as np

from .._array import is_device_array

__all__ = ["shard_bounds", "resolve_comm", "resolve_namespace", "resolve_seed", "block_rows",
           "BlockStream", "generate_rows"]

_ROWS_STREAM = 1
_PARAMS_STREAM = 0
#: Elements drawn per block (rows * features), so a block stays near 32 MB in float64.
BLOCK_ELEMENTS = 1 << 22
MAX_BLOCK_ROWS = 1 << 16
MIN_BLOCK_ROWS = 1 << 8


def resolve_comm(comm):
    """``comm``, or the world communicator when None."""
    if comm is not None:
        return comm
    from ..comm import get_comm

    return get_comm()


def shard_bounds(n, size, rank):
    """``(start, stop)`` of ``rank``'s rows when ``n`` rows are split like ``np.array_split``."""
    base, extra = divmod(int(n), int(size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def resolve_namespace(device="cpu", xp=None):
    """NumPy for ``device="cpu"``, CuPy for ``device="gpu"``; an explicit ``xp`` wins."""
    if xp is not None:
        if xp.__name__ not in ("numpy", "cupy"):
            raise ValueError(f"xp must be numpy or cupy; got {xp.__name__}")
        return xp
    if device in ("cpu", "host", None):
        return np
    if device in ("gpu", "cuda", "device"):
        try:
            import cupy
        except ImportError as exc:
            raise ImportError("device='gpu' needs CuPy (pip install cupy-cuda12x)") from exc
        return cupy
    raise ValueError(f"device must be 'cpu' or 'gpu'; got {device!r}")


def resolve_seed(random_state, comm):
    """One integer seed, the same on every rank.

    An int is used as is; None draws fresh entropy on rank 0 and broadcasts it;
    a ``RandomState``/``Generator`` draws a seed from itself (it must be in the
    same state on every rank, as parameters are replicated).
    """
    if random_state is None:
        seed = secrets.randbits(63) if comm.rank == 0 else None
        return int(comm.bcast_obj(seed)) if comm.size > 1 else int(seed)
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be non-negative; got {random_state}")
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**63 - 1))
    raise ValueError(f"random_state must be None, an int, a numpy RandomState or Generator; got {random_state!r}")


def block_rows(n_columns):
    """Rows per random-number block for rows of ``n_columns`` values (a power of two)."""
    rows = BLOCK_ELEMENTS // max(int(n_columns), 1)
    rows = 1 << max(int(rows).bit_length() - 1, 0)
    return int(min(max(rows, MIN_BLOCK_ROWS), MAX_BLOCK_ROWS))


class BlockStream:
    """The random numbers of one block (or of the global parameters) on NumPy or CuPy.

    NumPy draws from Philox seeded by ``SeedSequence(seed, spawn_key=key)``;
    CuPy from its ``RandomState`` seeded by a 64-bit word of the same sequence.
    Both are reproducible; the two devices give different numbers.
    """

    def __init__(self, seed, key, xp=np):
        ss = np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in key))
        self.xp = xp
        if xp is np:
            self._rng = np.random.Generator(np.random.Philox(ss))
        else:
            self._rng = xp.random.RandomState(int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1)))

    def normal(self, shape):
        return self._rng.standard_normal(shape)

    def uniform(self, shape, low=0.0, high=1.0):
        if self.xp is np:
            return self._rng.uniform(low, high, shape)
        return self._rng.uniform(low, high, shape)

    def integers(self, high, size):
        if self.xp is np:
            return self._rng.integers(0, high, size)
        return self._rng.randint(0, high, size)

    def permutation(self, n):
        return self._rng.permutation(n)


def params_stream(seed):
    """The host stream for the global small arrays (centres, coefficients, ...)."""
    return BlockStream(seed, (_PARAMS_STREAM,), np)


def generate_rows(n_samples, start, stop, n_columns, seed, xp, make_block):
    """Rows ``[start, stop)`` of a dataset generated block by block.

    ``make_block(stream, b0, b1)`` returns a tuple of arrays holding global rows
    ``[b0, b1)`` of one whole block; the pieces overlapping ``[start, stop)``
    are cut out and concatenated.  Only blocks overlapping the range are drawn.
    """
    rows = block_rows(n_columns)
    parts = []
    if stop > start:
        for b in range(start // rows, (stop - 1) // rows + 1):
            b0, b1 = b * rows, min((b + 1) * rows, n_samples)
            arrays = make_block(BlockStream(seed, (_ROWS_STREAM, b), xp), b0, b1)
            lo, hi = max(start, b0) - b0, min(stop, b1) - b0
            parts.append(tuple(a[lo:hi] for a in arrays))
    if not parts:
        arrays = make_block(BlockStream(seed, (_ROWS_STREAM, 0), xp), 0, 0)
        return tuple(a[:0] for a in arrays)
    if len(parts) == 1:
        return parts[0]
    return tuple(xp.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))


class RowPermutation:
    """A bijection of ``[0, n)``: ``i -> (a * i + b) mod n`` with ``gcd(a, n) = 1``.

    Spreads groups of consecutive indices (one cluster, one class) over the
    whole dataset in O(1) per row without materialising a global permutation.
    """

    def __init__(self, n, stream, shuffle=True):
        self.n = int(n)
        if not shuffle or self.n <= 1:
            self.a, self.b = 1, 0
            return
        amax = max(2, min(self.n, (2**62) // self.n))
        a = int(stream.integers(amax, 1)[0]) | 1
        while np.gcd(a, self.n) != 1:
            a = a + 2 if a + 2 < amax else 1
        self.a, self.b = a, int(stream.integers(self.n, 1)[0])

    def __call__(self, index, xp=np):
        if self.a == 1 and self.b == 0:
            return index
        return (index * self.a + self.b) % self.n


def groups_of(rows, counts_cumsum, perm, xp):
    """Group (cluster, class) of global ``rows`` when group g holds ``counts[g]`` of them."""
    idx = perm(xp.arange(rows[0], rows[1], dtype=xp.int64), xp)
    return xp.searchsorted(xp.asarray(counts_cumsum), idx, side="right")


def as_device(array, xp):
    """A host array on ``xp``'s device (no-op on NumPy)."""
    if xp is np or is_device_array(array):
        return array
    return xp.asarray(array)

"""The hot path's binding of results and pointers, on a stand-in for CuPy arrays (no GPU needed).

A binding returns ``(result, in_ptr, out_ptr)`` or None (take the full path); a reduce_scatter
result is one part of the input, so only an ``out`` that meets that part's bytes overlaps the
input (sizing it as the whole input sent calls whose result sat just below the input down the
full path, at 3-4x NCCL's time).
"""

import sys
import types

import numpy as np
import pytest

from mpiml.comm import _hotpath


class _Mem:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class _Array:
    """What a binding reads of a CuPy array: class, dtype, shape, size, bytes, contiguity, pointer."""

    def __init__(self, shape, dtype=np.float32, ptr=1 << 20):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.itemsize = self.dtype.itemsize
        self.nbytes = self.size * self.itemsize
        self._c_contiguous = True
        self.data = _Mem(ptr)


@pytest.fixture
def fake_cupy(monkeypatch):
    mod = types.ModuleType("cupy")
    mod.empty = lambda shape, dtype: _Array(shape, dtype, ptr=1 << 30)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def test_reduce_scatter_out_just_below_the_input_is_not_an_overlap(fake_cupy):
    x = _Array((4096,), ptr=1 << 20)  # 16 KiB
    bind = _hotpath.binding("reduce_scatter", x, rank=1, size=4, rows=1024)  # result: 4 KiB
    below = _Array((1024,), ptr=x.data.ptr - 4096)  # ends where x starts
    assert bind(x, below) == (below, x.data.ptr, below.data.ptr)
    inside = _Array((1024,), ptr=x.data.ptr + 8192)
    assert bind(x, inside) is None  # a real overlap: the full path copies the input first
    straddling = _Array((1024,), ptr=x.data.ptr - 2048)
    assert bind(x, straddling) is None
    res, ip, op = bind(x, None)  # allocated
    assert res.shape == (1024,) and ip == x.data.ptr and op == res.data.ptr


def test_reduce_scatter_rows_keep_the_trailing_shape(fake_cupy):
    x = _Array((10, 3), dtype=np.float64)
    bind = _hotpath.binding("reduce_scatter", x, rank=0, size=4, rows=3)  # array_split: 3, 3, 2, 2
    res, _, _ = bind(x, None)
    assert res.shape == (3, 3) and res.dtype == np.float64
    assert bind(x, _Array((2, 3), dtype=np.float64, ptr=1 << 28)) is None  # another rank's block shape
    assert bind(x, _Array((3, 3), dtype=np.float32, ptr=1 << 28)) is None  # another dtype
    out = _Array((3, 3), dtype=np.float64, ptr=1 << 28)
    assert bind(x, out)[0] is out


def test_allreduce_in_place_is_bound_and_partial_overlap_is_not(fake_cupy):
    x = _Array((100,))
    bind = _hotpath.binding("allreduce", x, rank=0, size=2)
    assert bind(x, x) == (x, x.data.ptr, x.data.ptr)
    assert bind(x, _Array((100,), ptr=x.data.ptr + 4)) is None
    assert bind(x, _Array((100,), ptr=x.data.ptr + 400))[0] is not None


def test_allgather_out_is_size_times_the_input(fake_cupy):
    x = _Array((8,), ptr=1 << 20)
    bind = _hotpath.binding("allgather", x, rank=0, size=4)
    assert bind(x, _Array((32,), ptr=x.data.ptr - 4 * 32)) is not None  # ends where x starts
    assert bind(x, _Array((32,), ptr=x.data.ptr - 4 * 31)) is None

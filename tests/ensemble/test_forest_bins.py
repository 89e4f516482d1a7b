"""Bin edges read from columns sorted on the device (``_hist._bin_edges_sorted``, the GPU path): the edges and
bin values of the host path (:func:`mpiml.ensemble._hist.bin_edges` on NumPy), checked here through NumPy."""

import numpy as np
import pytest

from mpiml.ensemble import _hist


@pytest.mark.parametrize("n", [2, 3, 17, 1001, 20000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sorted_column_edges_equal_the_host_edges(n, dtype):
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 7)).astype(dtype)
    X[:, 1] = np.round(X[:, 1] * 3)                                   # a few distinct values
    X[:, 2] = 1.0                                                     # constant
    X[:, 3] = np.round(X[:, 3], 1)                                    # tens of distinct values
    X[:, 4] = np.where(rng.random(n) < 0.5, np.nextafter(1.0, 2.0), 1.0)   # adjacent floats
    X[:, 5] = np.where(rng.random(n) < 0.9, 0.0, X[:, 5])             # heavy ties
    for max_bins in (256, 16, 2):
        for exact in (True, False):
            want = _hist.bin_edges(X, max_bins, exact)
            got = _hist._bin_edges_sorted(np, X, max_bins, exact)
            for j in range(X.shape[1]):
                np.testing.assert_array_equal(got[0][j], want[0][j])
                assert (got[1][j] is None) == (want[1][j] is None)
                if want[1][j] is not None:
                    np.testing.assert_array_equal(got[1][j], want[1][j])

"""Nearest neighbours on 1, 2, 3 and 4 ranks against scikit-learn on the gathered data (one launch per rank count).

The checks live in ``neighbors_spmd_script.py``: every metric and every exchange
("blocking", "overlap", "onesided") on uneven shards (one case with an empty shard),
``X=None``, the graph, the classifier and regressor (both weightings), global scores,
and the same error on every rank for bad input.
"""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "neighbors_spmd_script.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_neighbors_spmd_against_sklearn(mpi, n):
    mpi(SCRIPT, n, timeout=150)

"""Nearest neighbours on 1, 2, 3 and 4 ranks against scikit-learn on the gathered data (one launch per rank count,
shared with the folder's other multi-rank scripts: _neighbors_launches.py).

The checks live in ``neighbors_spmd_script.py``: every metric and every exchange
("blocking", "overlap", "onesided") on uneven shards (one case with an empty shard),
``X=None``, the graph, the classifier and regressor (both weightings), global scores,
and the same error on every rank for bad input.
"""

import pytest

import _neighbors_launches


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _neighbors_launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_neighbors_spmd_against_sklearn(launches, n):
    launches.verdict(n, "dense")    # neighbors_spmd_script.py, in the folder's shared launches

"""Deferred checking of repeated device calls, tested on host calls (see spmd_deferred.py)."""

import os

import pytest

from mpiml.comm._signature import describe, first_difference

HERE = os.path.dirname(os.path.abspath(__file__))


def test_first_difference_finds_where_sequences_part():
    a = describe(("allreduce", "float32", 4, 0, "sum", (4,), "device", None), 7)
    b = describe(("allreduce", "float32", 4, 0, "max", (4,), "device", None), 7)
    cur = describe(("barrier", None, 0, 0, None, (), "host", None), 9)
    assert first_difference([[a, a, cur], [a, b, cur]], [2, 2]) == (1, True)
    assert first_difference([[a, cur], [a, cur]], [1, 1]) == (1, False)
    # a shorter sequence repeats its last entry: the difference is at the first extra call
    assert first_difference([[a, a, cur], [a, cur]], [2, 1]) == (1, True)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_deferred_calls_are_agreed_later_and_mismatches_raise_everywhere(mpi, n):
    proc = mpi(os.path.join(HERE, "spmd_deferred.py"), n, timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout

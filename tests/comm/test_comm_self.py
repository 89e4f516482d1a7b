"""The whole matrix in-process on the size-1 ``self`` communicator (no MPI)."""

import pytest

import _spmd
import spmd_collectives
import spmd_p2p_errors

from mpiml.comm import Communicator
from mpiml.comm.backends.self import SelfTransport


@pytest.fixture
def self_comm():
    comm = Communicator(SelfTransport())
    _spmd._failures.clear()
    yield comm
    comm.close()
    _spmd._failures.clear()


@pytest.mark.parametrize("section", spmd_collectives.SECTIONS + spmd_p2p_errors.SECTIONS,
                         ids=lambda f: f.__name__)
def test_self_communicator(self_comm, section):
    assert self_comm.size == 1 and self_comm.rank == 0
    spmd_collectives.run(self_comm, (section,))
    assert not _spmd._failures, "\n".join(_spmd._failures[:10])


def test_get_comm_self_is_cached():
    from mpiml.comm import get_comm

    comm = get_comm("self")
    assert comm is get_comm("self") and comm.size == 1 and comm.backend == "self"

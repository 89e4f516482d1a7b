"""Ranks that share a GPU: the decision (pure functions of the agreed device ids) and its agreement.

On the GPU host, ``test_gpu_comm.py::test_ranks_sharing_one_gpu`` runs the collectives of 2 and 3
ranks on one GPU; here the logic runs on the CPU, with device ids given by the test.
"""

import pytest

from mpiml.comm.backends._device import (
    DEVICE_BACKENDS,
    auto_device_backends,
    shared_device_groups,
    shared_device_refusal,
)

A0, A1, B0 = ("nodeA", "0000:18:00.0"), ("nodeA", "0000:2a:00.0"), ("nodeB", "0000:18:00.0")


def test_groups():
    assert shared_device_groups([]) == []
    assert shared_device_groups([A0]) == []
    assert shared_device_groups([A0, A1]) == []
    assert shared_device_groups([A0, B0]) == []            # the same bus id on two hosts: two GPUs
    assert shared_device_groups([A0, A0]) == [[0, 1]]
    assert shared_device_groups([A0, A1, A0]) == [[0, 2]]  # 3 ranks on 2 GPUs
    assert shared_device_groups([A0, A1, A0, A1]) == [[0, 2], [1, 3]]
    assert shared_device_groups([A0, None, None]) == []    # ranks without a device share nothing
    assert shared_device_groups([list(A0), list(A0)]) == [[0, 1]]  # ids that went through pickling as lists


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_device_backends_refused_when_shared(backend):
    why = shared_device_refusal(backend, [A0, A1, A0])
    assert why is not None
    assert f"'{backend}'" in why and "ranks [0, 2] share GPU 0000:18:00.0 on nodeA" in why
    assert shared_device_refusal(backend, [A0, A1, B0]) is None


def test_mpi_is_never_refused():
    assert shared_device_refusal("mpi", [A0, A0]) is None
    assert shared_device_refusal("self", [A0]) is None


def test_auto_uses_no_device_transport_on_shared_gpus():
    assert auto_device_backends([A0, A1]) == ("nccl", "ipc")
    assert auto_device_backends([A0, A1, A0]) == ()
    assert auto_device_backends([A0, A0]) == ()
    assert auto_device_backends([A0]) == ("nccl", "ipc")


AGREE = r'''
from mpi4py import MPI

from _spmd import check, guarded
from mpiml import BackendUnavailableError
from mpiml.comm import get_comm
from mpiml.comm.backends._device import require_exclusive_devices
from mpiml.comm.backends.mpi import MPITransport

world = MPITransport(MPI.COMM_WORLD.Dup(), owned=True)
P, R = world.size, world.rank


def refused(local_id, backend="nccl"):
    try:
        require_exclusive_devices(world, backend, local_id=local_id)
        return None
    except BackendUnavailableError as exc:
        return str(exc)


def main():
    # one GPU each: accepted everywhere
    check(refused(("host", f"bus{R}")) is None, "distinct GPUs were refused")
    # two GPUs for P ranks: every rank raises, with the same text (also a rank with a GPU of its own)
    texts = world.allgather_obj(refused(("host", f"bus{R % 2}"), "ipc"))
    if P > 2:
        check(all(t is not None for t in texts), f"not every rank raised: {texts}")
        check(len(set(texts)) == 1, f"the ranks raised different texts: {texts}")
        check("ranks [0, 2" in texts[0] and "'ipc'" in texts[0], f"unclear: {texts[0]}")
    else:
        check(all(t is None for t in texts), f"{P} ranks on {P} GPUs refused: {texts}")
    # a rank that cannot read its device: every rank raises, naming it
    texts = world.allgather_obj(refused(("error", "no GPU here") if R == P - 1 else ("host", f"bus{R}")))
    check(all(t is not None and f"rank {P - 1}: no GPU here" in t for t in texts), f"device errors: {texts}")


guarded(main, get_comm())
'''


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3])
def test_refusal_is_agreed_on_every_rank(mpi, n):
    proc = mpi(None, n, timeout=120, code=AGREE)
    assert "OK: 0 failure(s)" in proc.stdout, proc.stdout + proc.stderr

"""The push kernels (``ipc/llpush``: reduce and allgather) on the GPU host, 1-4 ranks (gpu_small_push.py).

Every dtype, op, root, size (one element to several launches), offset views, ``out=`` and in place; back-to-back
calls through the hot launcher among the LL and barrier kernels with one rank late at each call; CUDA graphs
replayed on fresh inputs; each knob (``MPIML_IPC_LLPUSH_SPLIT_BYTES``, ``MPIML_IPC_LLPUSH_ENDACK``) on a
communicator of its own.  Skipped without enough GPUs.
"""

import os

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.slow]

cupy = pytest.importorskip("cupy")

HERE = os.path.dirname(os.path.abspath(__file__))


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_push_reduce_and_allgather(mpi, n):
    if _gpus() < n:
        pytest.skip(f"needs {n} GPUs, found {_gpus()}")
    proc = mpi(os.path.join(HERE, "gpu_small_push.py"), n, timeout=600, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout

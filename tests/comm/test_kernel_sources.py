"""The IPC collectives' CUDA sources against what the host launches (no GPU needed).

Every kernel named in ``mpiml.kernels.FAMILIES`` exists in its file under ``kernels/comm/`` and
declares the block size the host launches it with as its launch bounds: a barrier kernel whose
registers outgrow a 512-thread block fails to launch (the one-byte types unpack 16 elements a
pack and asked for 254 registers before the bounds were declared).
"""

import re
from importlib import resources

import pytest

from mpiml.comm.backends import ipc
from mpiml.kernels import COMMON, FAMILIES

_KERNELS = resources.files("mpiml.kernels")


def _text(path):
    return _KERNELS.joinpath(path).read_text()


def test_the_header_names_the_block_sizes_the_host_launches():
    head = _text(COMMON)
    assert re.search(rf"#define MPIML_THREADS {ipc.THREADS}\b", head)
    assert re.search(rf"#define MPIML_LL_THREADS {ipc.LL_THREADS}\b", head)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_kernel_exists_with_its_launch_bounds(family):
    path, names, _ = FAMILIES[family]
    assert path.startswith("comm/"), path
    text = _text(path)
    declared = {name: bound for bound, name in re.findall(
        r"__global__ void __launch_bounds__\((MPIML_[A-Z_]+)\)\s*(mpiml_\w+)\(", text)}
    assert set(names) <= set(declared), sorted(set(names) - set(declared))
    assert len(re.findall(r"__global__", text)) == len(declared), "a kernel without launch bounds"
    for name in names:
        want = "MPIML_LL_THREADS" if name.endswith("_ll") else "MPIML_THREADS"
        assert declared[name] == want, (name, declared[name])

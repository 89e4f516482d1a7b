"""The IPC collectives' CUDA sources against what the host launches (no GPU needed).

Every kernel named in ``mpiml.kernels.FAMILIES`` exists in its file under ``kernels/comm/``, and
every kernel declares the block size the host launches it with as its launch bounds (512
threads, barrier kernels MPIML_THREADS, LL kernels (``_ll``, ``_lltwoshot``) MPIML_LL_THREADS): one whose registers outgrow
such a block fails to launch (with every peer's pack loaded at once, the one-byte types asked for
254 registers before the bounds were declared).
"""

import re
from importlib import resources

import pytest

from mpiml.comm.backends import ipc
from mpiml.kernels import COMMON, FAMILIES

_KERNELS = resources.files("mpiml.kernels")


def _text(path):
    return _KERNELS.joinpath(path).read_text()


def test_the_header_names_the_block_size_the_host_launches():
    assert re.search(rf"#define MPIML_THREADS {ipc.THREADS}\b", _text(COMMON))
    assert re.search(rf"#define MPIML_LL_THREADS {ipc.LL_THREADS}\b", _text(COMMON))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_kernel_exists_with_its_launch_bounds(family):
    path, names, _ = FAMILIES[family]
    assert path.startswith("comm/"), path
    text = _text(path)
    kernels = {name: bound for bound, name in re.findall(
        r"__global__ void (?:__launch_bounds__\((MPIML_\w+)\)\s*)?(mpiml_\w+)\(", text)}
    assert set(names) <= set(kernels), sorted(set(names) - set(kernels))
    assert len(re.findall(r"__global__", text)) == len(kernels)
    for name, bound in kernels.items():
        ll = name.endswith(("_ll", "_lltwoshot"))
        assert bound == ("MPIML_LL_THREADS" if ll else "MPIML_THREADS"), (name, bound)


def test_the_error_codes_the_kernels_write_are_the_hosts():
    text = _text(COMMON)
    for name, value in (("TIMEOUT", ipc.ERR_TIMEOUT), ("ABORT", ipc.ERR_ABORT), ("OVERLAP", ipc.ERR_OVERLAP)):
        assert re.search(rf"#define MPIML_ERR_{name} {value}\b", text), name

"""mpiml.dask.neighbors: the sharded index on the workers, queries as SPMD jobs over them."""

import json
import os

import pytest

from conftest import ROOT, run_mpi

pytest.importorskip("distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(ROOT, "src", "mpiml", "dask", "__main__.py")


def test_wrappers_mirror_the_spmd_classes():
    from mpiml import neighbors as spmd
    from mpiml.dask import neighbors as dsk

    for name in spmd.__all__:
        assert set(getattr(dsk, name)().get_params()) == set(getattr(spmd, name)().get_params()) - {"comm"}


@pytest.mark.mpi
def test_neighbors_from_a_dask_client_match_spmd(tmp_path):
    out = tmp_path / "result.json"
    run_mpi(LAUNCHER, 4, os.path.join(HERE, "_dask_app.py"), out, timeout=150,
            env={"DASK_LOGGING__DISTRIBUTED": "critical"})
    result = json.loads(out.read_text())
    assert not result["failures"], "\n".join(result["failures"])
    assert result["checked"] == 12  # 6 checks for each of 2 exchanges

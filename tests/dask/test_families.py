"""The Dask wrappers of mpiml.linear_model, .decomposition and .ensemble (skipped until they exist)."""

import importlib
import json
import os

import pytest

from conftest import ROOT, run_mpi

pytest.importorskip("distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(ROOT, "src", "mpiml", "dask", "__main__.py")
FAMILIES = {
    "linear_model": ["LinearRegression", "Ridge", "LogisticRegression"],
    "decomposition": ["PCA", "TruncatedSVD"],
    "ensemble": ["RandomForestClassifier", "RandomForestRegressor"],
}


def _have(family):
    try:
        importlib.import_module(f"mpiml.{family}")
        return True
    except ImportError:
        return False


AVAILABLE = [f for f in FAMILIES if _have(f)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_wrappers_mirror_the_spmd_classes(family):
    if family not in AVAILABLE:
        pytest.skip(f"mpiml.{family} is not importable here")
    spmd = importlib.import_module(f"mpiml.{family}")
    dsk = importlib.import_module(f"mpiml.dask.{family}")
    assert sorted(dsk.__all__) == sorted(FAMILIES[family])
    for name in FAMILIES[family]:
        wrapper, wrapped = getattr(dsk, name), getattr(spmd, name)
        assert set(wrapper().get_params()) == set(wrapped().get_params()) - {"comm"}
        for method in wrapper._block_methods:
            assert hasattr(wrapped, method), f"{name}.{method}"


@pytest.mark.mpi
def test_families_from_a_dask_client_match_spmd(tmp_path):
    if not AVAILABLE:
        pytest.skip("none of mpiml.linear_model, .decomposition, .ensemble is importable here")
    out = tmp_path / "result.json"
    run_mpi(LAUNCHER, 4, os.path.join(HERE, "_families_app.py"), out, timeout=150,
            env={"DASK_LOGGING__DISTRIBUTED": "critical"})
    result = json.loads(out.read_text())
    assert sorted(result["tested"]) == sorted(AVAILABLE)
    assert not result["failures"], "\n".join(result["failures"])

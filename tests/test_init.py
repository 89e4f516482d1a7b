"""mpiml.init (device binding) and the CuPy advice of mpiml info, on a machine without a GPU."""

import pytest

import mpiml
from mpiml import _init
from mpiml.cli._info import cupy_extra


@pytest.fixture(autouse=True)
def fresh_binding():
    saved = dict(_init._STATE)
    _init._STATE.clear()
    yield
    _init._STATE.clear()
    _init._STATE.update(saved)


def test_cpu_binding_is_idempotent():
    assert mpiml.init(device="cpu") == "cpu"
    assert mpiml.init(device="cpu") == "cpu"
    assert mpiml.init() == "cpu"  # auto after a binding returns the binding
    assert mpiml.device_info()["device"] == "cpu"


def test_auto_without_gpu_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(_init, "_visible_gpus", lambda: (0, None))
    assert mpiml.init() == "cpu"
    assert "CuPy is not installed" in mpiml.device_info()["how"]


def test_gpu_without_gpu_raises(monkeypatch):
    monkeypatch.setattr(_init, "_visible_gpus", lambda: (0, None))
    with pytest.raises(RuntimeError, match="CuPy is not installed"):
        mpiml.init(device="gpu")
    assert mpiml.device_info() == {}


class _FakeDevice:
    used = []

    def __init__(self, dev):
        self.dev = dev

    def use(self):
        _FakeDevice.used.append(self.dev)


class _FakeCupy:
    class cuda:
        Device = _FakeDevice


@pytest.mark.parametrize("var", ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"])
def test_local_rank_picks_the_device(monkeypatch, var):
    for v in _init._LOCAL_RANK_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, "5")
    monkeypatch.setattr(_init, "_visible_gpus", lambda: (4, _FakeCupy))
    _FakeDevice.used.clear()
    assert mpiml.init() == 1  # local rank 5 mod 4 visible devices
    assert _FakeDevice.used == [1]
    assert var in mpiml.device_info()["how"]
    assert mpiml.init(device="gpu") == 1 and _FakeDevice.used == [1]  # idempotent: no second bind
    with pytest.raises(RuntimeError, match="already bound to GPU 1"):
        mpiml.init(device="cpu")
    with pytest.raises(RuntimeError, match="already bound to GPU 1"):
        mpiml.init(device=2)


def test_one_visible_device_per_task(monkeypatch):
    # srun --gpus-per-task=1 leaves one device visible to each task: every local rank takes it
    monkeypatch.setenv("SLURM_LOCALID", "3")
    monkeypatch.setattr(_init, "_visible_gpus", lambda: (1, _FakeCupy))
    assert mpiml.init() == 0


def test_bad_arguments(monkeypatch):
    with pytest.raises(ValueError, match="device must be"):
        mpiml.init(device="tpu")
    monkeypatch.setattr(_init, "_visible_gpus", lambda: (2, _FakeCupy))
    with pytest.raises(RuntimeError, match="ids 0..1"):
        mpiml.init(device=2)


@pytest.mark.parametrize("driver, extra", [((13, 0), "cuda13"), ((13, 2), "cuda13"), ((12, 4), "cuda12"),
                                           ((11, 8), None), (None, None)])
def test_cupy_extra_follows_the_driver(driver, extra):
    assert cupy_extra(driver) == extra


def test_import_pulls_in_no_scikit_learn():
    """``import mpiml`` and the world communicator stay light (every rank of every job pays it);
    ``mpiml.NotFittedError`` is still scikit-learn's class once asked for."""
    import os
    import subprocess
    import sys

    code = ("import sys, mpiml; from mpiml.comm import get_comm; get_comm()\n"
            "assert 'sklearn' not in sys.modules, 'import mpiml imported scikit-learn'\n"
            "import sklearn.exceptions\n"
            "assert mpiml.NotFittedError is sklearn.exceptions.NotFittedError\n"
            "from mpiml._errors import NotFittedError\n"
            "assert NotFittedError is sklearn.exceptions.NotFittedError\n")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr


def test_imports_do_not_touch_cupy(tmp_path):
    """No import of ours pulls in CuPy (which would cost seconds and may create a CUDA context): a ``cupy``
    that fails when imported is never imported by ``import mpiml``, the estimator packages or the kernels'
    loader; nor do they pull in matplotlib or Dask."""
    import os
    import subprocess
    import sys

    trap = tmp_path / "cupy"
    trap.mkdir()
    (trap / "__init__.py").write_text("raise ImportError('cupy was imported')\n")
    code = ("import sys\n"
            "import mpiml, mpiml.cluster, mpiml.linear_model, mpiml.decomposition, mpiml.ensemble, mpiml.neighbors\n"
            "import mpiml.kernels, mpiml.kernels._loader, mpiml.kernels.distances, mpiml.kernels.forest.histograms\n"
            "import mpiml.kernels.linear, mpiml.kernels.select, mpiml.kernels.build\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'cupy', 'matplotlib', 'dask', 'distributed'})\n"
            "assert not bad, bad\n")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr

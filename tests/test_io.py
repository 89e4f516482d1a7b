"""Model files: round trip, refusal of corrupted / truncated / foreign files, atomic writes."""

import hashlib
import json
import os
import zipfile

import numpy as np
import pytest

import mpiml
from mpiml import _io
from mpiml.utils._testing import MinimalSPMDTransformer

from conftest import forge_model_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT_SRC = os.path.join(os.path.dirname(HERE), "src")


@pytest.fixture
def fitted():
    X = np.arange(20.0).reshape(5, 4)
    return MinimalSPMDTransformer(shift=0.25, mode="mean").fit(X), X


def test_round_trip(tmp_path, fitted):
    est, X = fitted
    path = tmp_path / "model.mpiml"
    mpiml.save(est, path)
    loaded = mpiml.load(path)
    assert type(loaded) is MinimalSPMDTransformer
    assert loaded.get_params() == est.get_params() and "comm" not in loaded.get_params()  # (unset: not reported)
    assert np.array_equal(loaded.mean_, est.mean_) and loaded.mean_.dtype == est.mean_.dtype
    assert loaded.n_samples_seen_ == est.n_samples_seen_ and loaded.n_features_in_ == 4
    assert np.array_equal(loaded.transform(X), est.transform(X))
    # saving again replaces the file; no temporary file is left behind
    mpiml.save(MinimalSPMDTransformer(mode="none").fit(X), path)
    assert mpiml.load(path).mode == "none"
    assert os.listdir(tmp_path) == ["model.mpiml"]


def test_values_and_feature_names(tmp_path):
    pd = pytest.importorskip("pandas")
    est = MinimalSPMDTransformer().fit(pd.DataFrame({"x": [1.0, 2.0], "y": [3.0, 5.0]}))
    mpiml.save(est, tmp_path / "m")
    loaded = mpiml.load(tmp_path / "m")
    assert loaded.feature_names_in_.tolist() == ["x", "y"] and loaded.feature_names_in_.dtype == object
    enc = _io._Encoder()
    value = {"a": (1, 2.5, None, "s"), "b": [np.float32(1.5), np.arange(3)], "c": np.array(["p", "q"])}
    back = _io._decode(enc.encode(value, "v"), {k: np.load(__import__("io").BytesIO(v)) for k, v in enc.arrays.items()}, np)
    assert back["a"] == (1, 2.5, None, "s") and back["b"][0].dtype == np.float32
    assert np.array_equal(back["b"][1], np.arange(3)) and back["c"].tolist() == ["p", "q"]
    with pytest.raises(TypeError, match="cannot save a value of type object"):
        enc.encode(object(), "v")
    with pytest.raises(TypeError, match="only object arrays of strings"):
        enc.encode(np.array([1, "a", None], dtype=object), "v")


def test_not_fitted_and_foreign_models_are_not_saved(tmp_path):
    with pytest.raises(mpiml.NotFittedError):
        mpiml.save(MinimalSPMDTransformer(), tmp_path / "m")
    from sklearn.preprocessing import StandardScaler

    with pytest.raises(TypeError, match="only mpiml estimators can be saved"):
        mpiml.save(StandardScaler().fit([[1.0], [2.0]]), tmp_path / "m")
    assert os.listdir(tmp_path) == []


def test_corrupted_file_is_refused(tmp_path, fitted):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("arrays/0000.npy")
    at = info.header_offset + 30 + len(info.filename) + 140  # inside the array's data
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(_io.ModelFileError, match="corrupted"):
        mpiml.load(path)


def test_checksum_mismatch_is_refused(tmp_path, fitted):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(entries["meta.json"])
    meta["params"]["shift"] = 99.0
    entries["meta.json"] = json.dumps(meta).encode()  # changed without updating SHA256SUM
    with zipfile.ZipFile(path, "w") as z:
        for n, d in entries.items():
            z.writestr(n, d)
    with pytest.raises(_io.ModelFileError, match="checksum does not match"):
        mpiml.load(path)


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_file_is_refused(tmp_path, fitted, keep):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(_io.ModelFileError, match="truncated or corrupted"):
        mpiml.load(path)


def test_not_a_model_file(tmp_path):
    (tmp_path / "x").write_bytes(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(_io.ModelFileError):
        mpiml.load(tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        mpiml.load(tmp_path / "missing")


@pytest.mark.parametrize("module, qualname", [
    ("os", "system"), ("sklearn.preprocessing", "StandardScaler"), ("mpiml._io", "ModelFileError"),
    ("mpiml.comm", "Communicator"), ("mpiml.utils._testing", "os.system"), ("mpiml.nothere", "X"),
    ("mpiml.base", "SPMDEstimator.__init__"),
])
def test_only_mpiml_estimators_are_loaded(tmp_path, fitted, module, qualname):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)

    def edit(entries):
        meta = json.loads(entries["meta.json"])
        meta["class"] = {"module": module, "qualname": qualname}
        entries["meta.json"] = json.dumps(meta).encode()

    forge_model_file(path, edit)
    with pytest.raises(_io.ModelFileError, match="not an mpiml estimator|does not have"):
        mpiml.load(path)


def test_pickled_array_entry_is_refused(tmp_path, fitted):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)

    def edit(entries):
        import io

        buf = io.BytesIO()
        np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
        entries["arrays/0000.npy"] = buf.getvalue()

    forge_model_file(path, edit)
    with pytest.raises(_io.ModelFileError, match="not a plain array"):
        mpiml.load(path)


def test_atomic_write_leaves_no_partial_file(tmp_path, fitted, monkeypatch):
    path = tmp_path / "m.mpiml"
    mpiml.save(fitted[0], path)
    before = path.read_bytes()

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(_io.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        mpiml.save(MinimalSPMDTransformer(mode="none").fit(fitted[1]), path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old file is intact
    assert os.listdir(tmp_path) == ["m.mpiml"]  # and the temporary file is gone
    with pytest.raises(OSError):
        mpiml.save(fitted[0], tmp_path / "no-such-dir" / "m.mpiml")


def test_file_hash_is_deterministic(tmp_path, fitted):
    a, b = tmp_path / "a", tmp_path / "b"
    mpiml.save(fitted[0], a)
    mpiml.save(fitted[0], b)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def test_device_argument(tmp_path, fitted):
    mpiml.save(fitted[0], tmp_path / "m")
    with pytest.raises(ValueError, match="device must be"):
        mpiml.load(tmp_path / "m", device="tpu")
    assert isinstance(mpiml.load(tmp_path / "m", device="cpu").mean_, np.ndarray)


@pytest.mark.gpu
def test_load_on_gpu(tmp_path, fitted):
    import cupy

    mpiml.save(fitted[0], tmp_path / "m")
    loaded = mpiml.load(tmp_path / "m", device="gpu")
    assert isinstance(loaded.mean_, cupy.ndarray)
    X = cupy.asarray(fitted[1])
    assert cupy.allclose(loaded.transform(X), cupy.asarray(fitted[0].transform(fitted[1])))
    mpiml.save(loaded, tmp_path / "m2")  # device arrays are saved as NumPy
    assert isinstance(mpiml.load(tmp_path / "m2").mean_, np.ndarray)


SPMD_SAVE = """
import os, sys
import numpy as np
from _spmd import check, guarded
import mpiml
from mpiml import _io
from mpiml.comm import get_comm
from mpiml.utils._testing import MinimalSPMDTransformer

comm = get_comm()
d = sys.argv[1]


def outcome(fn):
    try:
        fn()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def main():
    X = np.arange(12.0).reshape(3, 4) + comm.rank
    est = MinimalSPMDTransformer().fit(X)
    path = os.path.join(d, f"model{comm.size}.mpiml")
    _io.save(est, path)  # every rank calls; rank 0 writes; all return after it finished
    check(os.path.exists(path), "the file exists on every rank after save returns")
    loaded = mpiml.load(path)
    check(np.array_equal(loaded.mean_, est.mean_), "every rank loads the model")
    check(np.allclose(loaded.transform(X), est.transform(X)), "loaded model transforms alike")
    for what, fn in [("missing directory", lambda: _io.save(est, os.path.join(d, "nope", "m"))),
                     ("not fitted", lambda: _io.save(MinimalSPMDTransformer(), path))]:
        got = outcome(fn)
        texts = comm.allgather_obj(got)
        check(got is not None and len(set(texts)) == 1, f"{what}: not the same error everywhere: {texts}")
    check(outcome(lambda: _io.save(MinimalSPMDTransformer(), path)).startswith("NotFittedError"),
          "NotFittedError on every rank")
    one = get_comm("self")
    if comm.rank == comm.size - 1:
        _io.save(est, os.path.join(d, f"solo{comm.size}.mpiml"), comm=one)  # one rank alone
    comm.barrier()
    check(os.path.exists(os.path.join(d, f"solo{comm.size}.mpiml")), "a single rank can save with comm=self")


guarded(main, comm)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_save_on_ranks(mpi, tmp_path, n):
    mpi(None, n, str(tmp_path), code=SPMD_SAVE, timeout=120)


FORGED = [
    ("mpiml.__main__", "KMeans"), ("mpiml.cli.__main__", "KMeans"), ("mpiml.cli", "main"), ("os", "KMeans"),
    ("mpiml.cluster._kmeans", "os"), ("mpiml.dask.cluster", "KMeans"), ("mpiml.cluster", "KMeans"),
    ("this", "KMeans"), ("this", "s"), ("mpiml.utils._testing", "MinimalSPMDTransformer.fit"),
    (["mpiml.cluster._kmeans"], "KMeans"), ("mpiml.cluster._kmeans", None),
]


@pytest.fixture(scope="module")
def forged_loads(tmp_path_factory):
    """Every file of ``FORGED`` loaded in one fresh interpreter (a start costs more than all the loads): after a
    valid file (the loader's own modules are then there already), each forged file in turn, with what it printed
    and the modules that loading it added to ``sys.modules``."""
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("forged")
    X = np.arange(20.0).reshape(5, 4)
    est = MinimalSPMDTransformer(shift=0.25, mode="mean").fit(X)
    good = tmp / "good.mpiml"
    mpiml.save(est, good)
    paths = []
    for i, (module, qualname) in enumerate(FORGED):
        path = tmp / f"m{i}.mpiml"
        mpiml.save(est, path)

        def edit(entries, module=module, qualname=qualname):
            meta = json.loads(entries["meta.json"])
            meta["class"] = {"module": module, "qualname": qualname}
            entries["meta.json"] = json.dumps(meta).encode()

        forge_model_file(path, edit)
        paths.append(str(path))
    code = ("import json, sys, mpiml\n"
            f"mpiml.load({str(good)!r})\n"
            "out = []\n"
            f"for path in {paths!r}:\n"
            "    before, said = set(sys.modules), ''\n"
            "    try:\n"
            "        mpiml.load(path)\n"
            "    except mpiml.ModelFileError as e:\n"
            "        said = f'refused: {e}'\n"
            "    out.append({'said': said, 'new': sorted(set(sys.modules) - before)})\n"
            "print('RESULTS ' + json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT_SRC})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
    assert line is not None, proc.stdout + proc.stderr
    return json.loads(line[len("RESULTS "):])


@pytest.mark.parametrize("case", range(len(FORGED)), ids=[f"{m}-{q}" for m, q in FORGED])
def test_loading_imports_nothing_the_file_names(forged_loads, case):
    """The class comes from a fixed registry: a file naming any other module imports nothing."""
    got = forged_loads[case]
    assert got["said"].startswith("refused:") and "not an mpiml estimator this version can load" in got["said"], got
    assert got["new"] == [], got


def test_only_registered_classes_are_saved(tmp_path, fitted):
    class Subclass(type(fitted[0])):
        pass

    model = Subclass(**fitted[0].get_params())
    model.__dict__.update({k: v for k, v in fitted[0].__dict__.items() if k.endswith("_")})
    with pytest.raises(TypeError, match="not in mpiml's registry"):
        mpiml.save(model, tmp_path / "m.mpiml")

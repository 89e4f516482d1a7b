"""CuPy's compiled kernels shipped (mpiml.kernels._cupy_ship), on a machine without a GPU: a stand-in for CuPy's
side that keys files the way CuPy does (the options' install paths are part of the key), a fake cache,
pack and install, another install path (re-keyed), versions that do not match, concurrent ranks, a cache
that cannot be written, the marker, the time an install takes; and, on a GPU, that a fresh process whose
cache init filled compiles nothing for a KMeans and a LinearRegression fit."""

import errno
import hashlib
import json
import logging
import multiprocessing
import os
import random
import sys
import threading
import time
import zipfile

import pytest

from mpiml.kernels import _cupy_ship as ship
from mpiml.kernels import _cupy_warm as cw


#: a zip named by the caller for the GPU test (MPIML_CUPY_SHIP=/path/cupy_sm90.zip), read before the fixture
#: below clears the variable for the CPU tests
_ZIP = os.environ.get("MPIML_CUPY_SHIP", "") if os.environ.get("MPIML_CUPY_SHIP", "").endswith(".zip") else None


def _cupy_file(payload):
    """A file of CuPy's disk cache: the SHA-1 hex of the payload, then the payload."""
    return hashlib.sha1(payload).hexdigest().encode() + payload


class FakeShip:
    """ShipHooks' interface: CuPy ``cupy``, NVRTC ``nvrtc``, a device of ``arch``, headers under ``include``;
    a module's file name is the SHA-1 of its architecture, its options as CuPy assembles them (paths
    included) and its source, as in CuPy."""

    def __init__(self, cache, include="/site-a/cupy/_core/include", cupy="14.2.0", nvrtc=(13, 0), arch="90"):
        self.cache, self.include, self._arch = str(cache), include, arch
        self._versions = {"cupy": cupy, "nvrtc": list(nvrtc)}
        self.named = 0

    def versions(self):
        return dict(self._versions)

    def arch(self):
        return self._arch

    def cache_dir(self):
        return self.cache

    def runtime(self):
        return 13020

    def assemble(self, options):
        return (f"-I{self.include}/cupy/_cccl/cub", *options, "--std=c++17", f"-I{self.include}",
                "-I/cuda/include")

    def paths(self):
        return {"{cupy_include}": self.include}

    def name(self, spec):
        key = repr((self._arch, self.assemble(spec["options"]["user"]), spec["source"]))
        return hashlib.sha1(key.encode()).hexdigest() + ".cubin"

    def names(self, entries):
        self.named += len(entries)
        return {e["id"]: self.name(e) for e in entries}


def _entry(i):
    spec = {"source": f"extern \"C\" __global__ void k{i}(float* x) {{ x[0] = {i}; }}", "options": {"user": []},
            "arch": None, "extra": {"cupy_headers": True}, "backend": "nvrtc", "cooperative": False,
            "name_expressions": None, "jitify": False, "to_ltoir": False}
    return dict(spec, id=cw.entry_id(spec), tags=["kmeans"])


def _recording(tmp_path, n=12, size=3000, fake=None):
    """A CuPy cache folder as a recording run leaves it, its manifest, and the stand-in that made it."""
    fake = fake or FakeShip(tmp_path / "recorded")
    os.makedirs(fake.cache, exist_ok=True)
    entries = [_entry(i) for i in range(n)]
    for e in entries:
        # about as compressible as a cubin (a third random, the rest repeats)
        noise = random.Random(e["id"]).randbytes(size // 3)
        payload = (noise + e["id"].encode() * (size // 24 + 1))[:size]
        with open(os.path.join(fake.cache, fake.name(e)), "wb") as f:
            f.write(_cupy_file(payload))
    manifest = {"format": cw.FORMAT, **fake.versions(), "recorded": {}, "entries": entries}
    return fake, manifest


def _files(folder):
    return sorted(n for n in os.listdir(folder) if ship._FILE.match(n))


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for var in ("MPIML_CUPY_SHIP", "CUPY_CACHE_IN_MEMORY", "CUPY_CUDA_COMPILE_WITH_DEBUG", "CUPY_COMPILE_WITH_PTX"):
        monkeypatch.delenv(var, raising=False)
    ship._reset()
    yield
    ship._reset()


def test_pack_keeps_valid_cache_files_and_maps_them(tmp_path):
    fake, m = _recording(tmp_path)
    for junk, data in (("tmpab12cd", b"partial"), ("0" * 40 + ".cubin.cu", b"source"),
                       ("1" * 40 + ".cubin", b"0" * 40 + b"payload whose digest is wrong")):
        (tmp_path / "recorded" / junk).write_bytes(data)
    h = ship.pack(fake.cache, str(tmp_path / "c.zip"), m, hooks=fake)
    assert (h["count"], h["invalid_skipped"], h["mapped"], h["manifest_entries"]) == (12, 1, 12, 12)
    assert (h["cupy"], h["nvrtc"], h["arch"], h["cuda_runtime"]) == ("14.2.0", [13, 0], "90", 13020)
    assert ship.read_header(str(tmp_path / "c.zip")) == h
    with zipfile.ZipFile(tmp_path / "c.zip") as z:
        names = z.namelist()
        assert names[0] == ship.HEADER and ship.MANIFEST_MEMBER in names
        valid = [n for n in _files(fake.cache) if n != "1" * 40 + ".cubin"]
        assert sorted(n for n in names if ship._FILE.match(n)) == valid
    # packed again: the same files and header id (the zip is reproducible but for the date)
    assert ship.pack(fake.cache, str(tmp_path / "d.zip"), m, hooks=fake)["id"] == h["id"]


def test_pack_without_cupy_needs_versions_and_arch(tmp_path):
    fake, m = _recording(tmp_path)
    with pytest.raises(ValueError, match="architecture"):
        ship.pack(fake.cache, str(tmp_path / "c.zip"), hooks=None)
    h = ship.pack(fake.cache, str(tmp_path / "c.zip"), m, arch="sm_90")
    assert (h["cupy"], h["nvrtc"], h["arch"], h["mapped"], h["count"]) == ("14.2.0", [13, 0], "90", 0, 12)


def test_install_round_trip_then_the_marker(tmp_path):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user")              # the same install paths: the shipped names hold
    os.makedirs(user.cache)
    st = ship.install(hooks=user, path=z)
    assert (st["state"], st["keys"], st["written"], st["present"]) == ("installed", "as shipped", 12, 0), st
    assert user.named == 1                          # one name computed to check them
    assert _files(user.cache) == _files(fake.cache)
    for name in _files(user.cache):
        assert (tmp_path / "user" / name).read_bytes() == (tmp_path / "recorded" / name).read_bytes()
    assert not [n for n in os.listdir(user.cache) if n.startswith(".mpiml-ship-")]
    assert ship.status() == st
    # a new process on the same machine: the marker, nothing read from the zip
    ship._reset()
    again = ship.install(hooks=user, path=z)
    assert again["state"] == "present" and user.named == 1, again
    # a file CuPy already had is left alone
    ship._reset()
    os.unlink(again["marker"])
    os.unlink(os.path.join(user.cache, _files(user.cache)[0]))
    third = ship.install(hooks=user, path=z)
    assert (third["written"], third["present"]) == (1, 11), third


def test_another_install_path_gets_the_files_under_its_own_names(tmp_path):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    venv = FakeShip(tmp_path / "venv", include="/home/u/venv/lib/python3.12/site-packages/cupy/_core/include")
    os.makedirs(venv.cache)
    st = ship.install(hooks=venv, path=z)
    assert (st["state"], st["keys"], st["written"]) == ("installed", "re-keyed", 12), st
    assert _files(venv.cache) == sorted(venv.name(e) for e in m["entries"])
    assert not set(_files(venv.cache)) & set(_files(fake.cache))
    # the cubins are those recorded, under this install's names
    by_payload = {(tmp_path / "recorded" / fake.name(e)).read_bytes(): venv.name(e) for e in m["entries"]}
    for payload, name in by_payload.items():
        assert (tmp_path / "venv" / name).read_bytes() == payload


def test_an_unmapped_zip_is_installed_as_shipped_unchecked(tmp_path):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, arch="90", versions=fake.versions())
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)
    st = ship.install(hooks=user, path=z)
    assert (st["keys"], st["written"], user.named) == ("unchecked", 12, 0)


def test_a_name_cupy_cannot_compute_leaves_the_files_as_shipped(tmp_path):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user", include="/elsewhere")
    os.makedirs(user.cache)
    user.names = lambda entries: {e["id"]: None for e in entries}
    st = ship.install(hooks=user, path=z)
    assert (st["keys"], st["written"]) == ("unchecked", 12)
    assert _files(user.cache) == _files(fake.cache)


@pytest.mark.parametrize("other", [{"cupy": "14.1.1"}, {"nvrtc": (13, 1)}, {"nvrtc": (12, 9)}, {"arch": "80"}])
def test_other_versions_write_nothing(tmp_path, other):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user", **other)
    os.makedirs(user.cache)
    st = ship.install(hooks=user, path=z)
    assert st["state"] == "skipped" and "this is CuPy" in st["reason"], st
    assert os.listdir(user.cache) == []


def test_switches_and_missing_zip(tmp_path, monkeypatch):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)
    assert "MPIML_CUPY_SHIP=0" in ship.install(hooks=user, path=z, setting="0")["reason"]
    monkeypatch.setenv("MPIML_CUPY_SHIP", "off")
    assert ship.install(hooks=user, path=z)["state"] == "skipped"
    monkeypatch.delenv("MPIML_CUPY_SHIP")
    for var in ("CUPY_CACHE_IN_MEMORY", "CUPY_CUDA_COMPILE_WITH_DEBUG", "CUPY_COMPILE_WITH_PTX"):
        monkeypatch.setenv(var, "1")
        assert var in ship.install(hooks=user, path=z)["reason"]
        monkeypatch.setenv(var, "true")        # CuPy reads only an integer 1 as on
        assert ship._cupy_flag(var) is False
        monkeypatch.delenv(var)
    assert "no CuPy kernels shipped for sm_90" in ship.install(hooks=user, path=str(tmp_path / "none.zip"))["reason"]
    user.cache_dir = lambda: None
    assert "backend" in ship.install(hooks=user, path=z)["reason"]
    assert os.listdir(tmp_path / "user") == []
    # MPIML_CUPY_SHIP naming a zip installs that one
    user = FakeShip(tmp_path / "user2")
    os.makedirs(user.cache)
    monkeypatch.setenv("MPIML_CUPY_SHIP", z)
    assert ship.install(hooks=user)["written"] == 12


def test_the_package_zip_is_found_by_arch(tmp_path, monkeypatch):
    fake, m = _recording(tmp_path)
    monkeypatch.setattr(ship, "_prebuilt_folder", lambda: str(tmp_path / "prebuilt"))
    ship.pack(fake.cache, ship.shipped_path("90"), m, hooks=fake)
    assert os.path.basename(ship.shipped_path("sm_90")) == "cupy_sm90.zip"
    assert [s["zip"] for s in ship.shipped()] == ["cupy_sm90.zip"] and ship.shipped()[0]["count"] == 12
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)
    assert ship.install(hooks=user)["written"] == 12


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_a_cache_that_cannot_be_written_never_fails(tmp_path, monkeypatch, caplog, err):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)

    def refuse(*a, **k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(ship.tempfile, "mkstemp", refuse)
    with caplog.at_level(logging.WARNING, logger="mpiml.kernels"):
        st = ship.install(hooks=user, path=z)
        ship._STATUS.clear()
        st2 = ship.install(hooks=user, path=z)
    assert st["state"] == st2["state"] == "failed" and st["written"] == 0, st
    assert len([r for r in caplog.records if "shipped CuPy kernels" in r.getMessage()]) == 1
    assert _files(user.cache) == []


def test_a_read_only_cache_folder_never_fails(tmp_path, monkeypatch, caplog):
    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "ro")
    os.makedirs(user.cache)
    if os.geteuid() == 0:        # root writes anywhere: the folder refuses as a read-only mount would
        real = os.makedirs

        def makedirs(p, *a, **k):
            if str(p).startswith(user.cache):
                raise OSError(errno.EROFS, "Read-only file system")
            return real(p, *a, **k)

        monkeypatch.setattr(ship.os, "makedirs", makedirs)
    else:
        os.chmod(user.cache, 0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="mpiml.kernels"):
            st = ship.install(hooks=user, path=z)
    finally:
        os.chmod(user.cache, 0o755)
    assert st["state"] == "skipped" and "cannot write" in st["reason"], st
    assert any("cannot write" in r.getMessage() for r in caplog.records)
    assert os.listdir(user.cache) == []


def test_a_file_system_without_locks_still_installs(tmp_path, monkeypatch):
    import fcntl

    fake, m = _recording(tmp_path)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    st = ship.install(hooks=user, path=z)
    assert (st["state"], st["written"]) == ("installed", 12), st


def test_install_never_raises(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)
    st = ship.install(hooks=user, path=str(bad))
    assert st["state"] == "failed" and "not a zip" in st["reason"]


def _install_in_child(args):
    cache, z = args
    ship._reset()
    return ship.install(hooks=FakeShip(cache), path=z)


def test_ranks_of_a_node_install_at_once(tmp_path):
    fake, m = _recording(tmp_path, n=40)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    cache = str(tmp_path / "node")
    os.makedirs(cache)
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(3) as pool:
        got = pool.map(_install_in_child, [(cache, z)] * 3)
    assert sorted(g["state"] for g in got).count("installed") == 1, got     # one writes, the others wait
    assert all(g["state"] in ("installed", "present") for g in got)
    assert sum(g.get("written", 0) for g in got) == 40
    assert _files(cache) == _files(fake.cache)
    for name in _files(cache):
        assert ship._valid((tmp_path / "node" / name).read_bytes())
    assert not [n for n in os.listdir(cache) if n.startswith(".mpiml-ship-")]


def test_concurrent_writers_without_the_lock_stay_consistent(tmp_path):
    # a file system where flock does not separate processes: every writer renames a complete file
    fake, m = _recording(tmp_path, n=30)
    z = str(tmp_path / "c.zip")
    ship.pack(fake.cache, z, m, hooks=fake)
    cache = str(tmp_path / "nolock")
    os.makedirs(cache)
    with zipfile.ZipFile(z) as zf:
        members = [(n, zf.read(n)) for n in zf.namelist() if ship._FILE.match(n)]
    errors = []

    def writer():
        try:
            for n, data in members:
                ship._write(cache, n, data)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _files(cache) == _files(fake.cache)
    assert all(ship._valid((tmp_path / "nolock" / n).read_bytes()) for n in _files(cache))


def test_install_of_a_full_size_cache_is_quick(tmp_path):
    """205 modules, 9.6 MiB of cubins (the size of the recorded list on sm_90): the cold install and the warm
    check.  On this project's busy 2-core CPU host: cold ~0.1 s, warm well under a millisecond."""
    fake, m = _recording(tmp_path, n=205, size=49_000)
    z = str(tmp_path / "c.zip")
    h = ship.pack(fake.cache, z, m, hooks=fake)
    assert h["bytes"] > 9.5 * 2**20
    user = FakeShip(tmp_path / "user")
    os.makedirs(user.cache)
    t = time.perf_counter()
    st = ship.install(hooks=user, path=z)
    cold = time.perf_counter() - t
    ship._reset()
    t = time.perf_counter()
    warm = ship.install(hooks=user, path=z)
    warm_s = time.perf_counter() - t
    print(f"install of {h['count']} files, {h['bytes'] / 2**20:.1f} MiB ({os.path.getsize(z) / 2**20:.1f} MiB "
          f"zipped): cold {cold:.3f} s, warm {warm_s * 1e3:.2f} ms")
    assert st["written"] == 205 and warm["state"] == "present"
    assert cold < 1.0 and warm_s < 0.05         # loose: a shared CI core; the print gives the figure


# ------------------------------------------------------------------------------- CuPy's key, by CuPy's code

class _FakeCompiler:
    """What ShipHooks.names touches of ``cupy.cuda.compiler``: a compile function that keys the module and
    asks the module-level cache backend for it, as CuPy 14.2 does."""

    def __init__(self, include):
        self.include = include
        self._kernel_cache_backend = _DictBackend()
        self.compiled = []

    def _compile_module_with_cache(self, source, options=(), *, arch=None, extra_source=None, backend="nvrtc",
                                   enable_cooperative_groups=False, name_expressions=None, log_stream=None,
                                   jitify=False, to_ltoir=False):
        name = hashlib.sha1(repr((arch or "90", tuple(options), source)).encode()).hexdigest() + ".cubin"
        got = self._kernel_cache_backend.load(name)
        if got is None:
            self.compiled.append(name)
            self._kernel_cache_backend.save(name, b"cubin", source)
        return name


class _DictBackend:
    def __init__(self):
        self.files = {}

    def load(self, name):
        return self.files.get(name)

    def save(self, name, cubin, source):
        self.files[name] = cubin


def _real_hooks(include):
    h = object.__new__(ship.ShipHooks)
    h.compiler = _FakeCompiler(include)
    fake = FakeShip("/nowhere", include=include)
    h.get = lambda: h.compiler._compile_module_with_cache
    h.assemble, h.header_source, h.paths = fake.assemble, lambda: "HEADERS", fake.paths
    return h, fake


def test_names_come_from_cupys_own_key_and_compile_nothing():
    h, fake = _real_hooks("/site-a/cupy/_core/include")
    entries = [_entry(i) for i in range(5)]
    backend = h.compiler._kernel_cache_backend
    names = h.names(entries)
    assert names == {e["id"]: hashlib.sha1(repr(("90", fake.assemble(()), e["source"])).encode()).hexdigest()
                     + ".cubin" for e in entries}
    assert h.compiler.compiled == [] and backend.files == {}
    assert h.compiler._kernel_cache_backend is backend          # CuPy's backend is back


def test_while_names_are_computed_other_threads_reach_cupys_backend():
    h, _ = _real_hooks("/site-a/cupy/_core/include")
    backend = h.compiler._kernel_cache_backend
    go, done, seen = threading.Event(), threading.Event(), []
    real_replay = cw._replay

    def slow_replay(*a, **k):       # while this thread is inside the probe, another thread compiles
        go.set()
        done.wait(5)
        return real_replay(*a, **k)

    def other():
        go.wait(5)
        seen.append(h.compiler._compile_module_with_cache("other kernel", ()))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    cw_replay, cw._replay = cw._replay, slow_replay
    try:
        names = h.names([_entry(0)])
    finally:
        cw._replay = cw_replay
        t.join()
    assert names[_entry(0)["id"]] and seen and seen[0] in backend.files     # compiled and saved by CuPy's backend
    assert h.compiler.compiled == [seen[0]]


def test_init_installs_before_the_warm_up(monkeypatch):
    from mpiml import _init

    order = []
    monkeypatch.setattr(ship, "install", lambda dev: order.append(("install", dev)))
    monkeypatch.setattr(_init, "_start_cupy_warm", lambda dev, local, warm: order.append(("warm", dev)))
    _init._install_cupy_kernels(1)
    _init._start_cupy_warm(1, 0, None)
    assert order == [("install", 1), ("warm", 1)]


# ------------------------------------------------------------------------------------------------ on a GPU

_GPU_SCRIPT = r"""
import json, os, sys, time
import cupy
from cupy.cuda import compiler
import mpiml
mpiml.init(device="gpu")
from mpiml.kernels import _cupy_ship
st = _cupy_ship.status()
cache = os.environ["CUPY_CACHE_DIR"]
compiles = []
real = compiler._compile_using_nvrtc_no_warning
def counted(source, *a, **k):
    compiles.append(source[-300:])
    return real(source, *a, **k)
compiler._compile_using_nvrtc_no_warning = counted     # CuPy's NVRTC compiles: one per cache miss
from mpiml.cluster import KMeans
from mpiml.decomposition import PCA
from mpiml.ensemble import RandomForestClassifier
from mpiml.linear_model import LinearRegression, LogisticRegression
from mpiml.neighbors import NearestNeighbors
out = {"status": st, "cupy_file": cupy.__file__, "arch": compiler._get_arch(), "cupy": cupy.__version__}
# the shape the kernels were recorded at (10^6 x 32, benchmarks/gpu/first_fit.py), then 10^5 x 32
for rows in (1000000, 100000):
    before, n0 = set(os.listdir(cache)), len(compiles)
    rs = cupy.random.RandomState(0)
    X = rs.standard_normal((rows, 32), dtype=cupy.float32)
    y = X @ cupy.arange(32, dtype=cupy.float32) / 32
    yc = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(cupy.int32)
    fit = {}
    # the estimators and calls of benchmarks/gpu/first_fit.py (the recorder's workloads)
    for name, est, call, args in (
            ("kmeans", KMeans(n_clusters=32, random_state=0), "fit", (X,)),
            ("linreg", LinearRegression(), "fit", (X, y)),
            ("logreg", LogisticRegression(), "fit", (X, yc)),
            ("pca", PCA(n_components=8), "fit", (X,)),
            ("rf", RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0), "fit", (X, yc)),
            ("knn", NearestNeighbors(n_neighbors=10).fit(X), "kneighbors", (X[:10000],))):
        t1 = time.perf_counter()
        getattr(est, call)(*args)
        cupy.cuda.Device().synchronize()
        fit[name] = round(time.perf_counter() - t1, 4)
    out[rows] = {"compiles": len(compiles) - n0, "sources": compiles[n0:n0 + 5], "fit_s": fit,
                 "new_files": sorted(n for n in set(os.listdir(cache)) - before if n.endswith(".cubin"))}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("install_path", ["same", "symlinked"])
def test_on_a_gpu_the_shipped_cache_leaves_nothing_to_compile(tmp_path, install_path):
    """A fresh process with an empty CuPy cache: init installs the shipped files, and the first fits of
    benchmarks/gpu/first_fit.py (KMeans, LinearRegression, LogisticRegression, PCA, the forest, k-NN) on
    10^6 x 32 rows (the recorded shape) then compile no CuPy kernel (no NVRTC call, no new cache file: a
    kernel that a changed fit needs and the recording lacks fails here, as the forest's bin-edge sums did); what fits on 10^5 rows compile beyond that is printed (a kernel chosen by
    size that the recorded workloads did not reach).
    ``symlinked``: CuPy imported through a symlink, so its include paths (part of CuPy's key) differ from
    the recording's, as in another virtual environment: the files must be re-keyed."""
    from conftest import ROOT, have_gpu, run_group

    if not have_gpu():
        pytest.skip("no GPU")
    import cupy

    cc = cupy.cuda.Device(0).compute_capability
    z = _ZIP or ship.shipped_path(cc)
    if not os.path.exists(z):
        pytest.skip(f"no CuPy cache shipped for sm_{cc} ({z})")
    h = ship.read_header(z)
    if h["cupy"] != cupy.__version__:
        pytest.skip(f"{os.path.basename(z)} is for CuPy {h['cupy']}, this is {cupy.__version__}")
    path = [os.path.join(ROOT, "src")]
    if install_path == "symlinked":
        if not h["mapped"]:
            pytest.skip(f"{os.path.basename(z)} maps no file to the manifest: it cannot be re-keyed")
        os.makedirs(tmp_path / "alt")
        os.symlink(os.path.dirname(cupy.__file__), tmp_path / "alt" / "cupy")
        path.insert(0, str(tmp_path / "alt"))
    script = tmp_path / "fits.py"
    script.write_text(_GPU_SCRIPT)
    os.makedirs(tmp_path / "cupy")
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"), MPIML_KERNEL_CACHE=str(tmp_path / "mpiml"),
               MPIML_CUPY_SHIP=z, PYTHONPATH=os.pathsep.join(path))
    env.pop("MPIML_CUPY_WARM", None)
    p = run_group([sys.executable, str(script)], 300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    print(json.dumps(out, indent=1))
    assert out["status"]["state"] == "installed" and out["status"]["written"] > 0, out["status"]
    want = {"same": "as shipped" if h["mapped"] else "unchecked", "symlinked": "re-keyed"}[install_path]
    assert out["status"]["keys"] == want, out["status"]
    recorded = out[str(10**6)]
    assert recorded["compiles"] == 0 and recorded["new_files"] == [], recorded

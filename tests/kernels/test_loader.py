"""The kernel loader: keys, the per-machine cache, its lock, shipped cubins (a fake compiler, no GPU), and on
a GPU that a loaded cubin runs."""

import json
import multiprocessing
import os
import sys
import time
import zipfile

import numpy as np
import pytest

from conftest import have_gpu
from mpiml.kernels import _loader

SRC = ("forest/histograms.cu",)
EXPRS = ["mpiml_hist_route", "mpiml_hist_move<true>"]


class FakeCompiler:
    """Counts its compiles in a file (shared by processes); the cubin names its expressions."""

    def __init__(self, log, delay=0.0):
        self.log, self.delay = log, delay

    def archs(self):
        return [80, 86, 90, 100, 120]

    def compile(self, source, expressions, arch, options):
        time.sleep(self.delay)
        with open(self.log, "a") as f:
            f.write(json.dumps({"arch": arch, "exprs": list(expressions), "pid": os.getpid()}) + "\n")
        return ("cubin:" + arch + ":" + "|".join(expressions)).encode(), {e: "_Z" + e for e in expressions}


class FakeRaw:
    def __init__(self, path):
        self.path = path

    def get_function(self, name):
        return ("function", self.path, name)

    def get_global(self, name):
        return ("global", self.path, name)


def _fake(monkeypatch, tmp_path, cc=90, delay=0.0):
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_loader, "_COMPILER", FakeCompiler(str(log), delay))
    monkeypatch.setattr(_loader, "_device_arch", lambda: (0, cc))
    monkeypatch.setattr(_loader, "_runtime_major", lambda: 13)
    monkeypatch.setattr(_loader, "_open", lambda path, meta: _loader.Module(FakeRaw(path), dict(meta["lowered"]), path))
    monkeypatch.setattr(_loader, "_prebuilt_folder", lambda: str(tmp_path / "prebuilt"))
    monkeypatch.setenv("MPIML_KERNEL_STRICT", "1")
    _forget()
    return log


def _forget():
    """A new process, as far as the loader's memory goes."""
    _loader._LOADED.clear()
    _loader._CACHE_INDEX.clear()
    _loader._PREBUILT.clear()


def _compiles(log):
    return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def test_keys_change_with_what_was_compiled():
    text = _loader.source_text(SRC)
    h = _loader.source_hash(text, ("--std=c++17",))
    assert h != _loader.source_hash(text + " ", ("--std=c++17",))
    assert h != _loader.source_hash(text, ("--std=c++17", "-lineinfo"))
    k = _loader.entry_key(h, EXPRS, "sm_90", 13)
    assert k == _loader.entry_key(h, EXPRS[::-1], "sm_90", 13)      # the order of expressions does not matter
    assert len({k, _loader.entry_key(h, EXPRS[:1], "sm_90", 13), _loader.entry_key(h, EXPRS, "sm_80", 13),
                _loader.entry_key(h, EXPRS, "sm_90", 12)}) == 4


def test_compatible_archs():
    assert _loader.compatible_archs(89) == ["sm_89", "sm_88", "sm_87", "sm_86", "sm_85", "sm_84", "sm_83", "sm_82",
                                            "sm_81", "sm_80"]
    assert _loader.compatible_archs(90) == ["sm_90"]
    assert _loader.compatible_archs(120) == ["sm_120"]


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path / "k"))
    assert _loader.cache_dir() == str(tmp_path / "k")
    monkeypatch.delenv("MPIML_KERNEL_CACHE")
    assert _loader.cache_dir().endswith(os.path.join(".cache", "mpiml", "kernels"))


def test_compile_once_then_cache(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path)
    fns = _loader.load(SRC, EXPRS)
    assert fns["mpiml_hist_route"][2] == "_Zmpiml_hist_route"
    assert len(_compiles(log)) == 1 and _compiles(log)[0]["arch"] == "sm_90"
    files = sorted(os.listdir(tmp_path / "cache" / "sm_90"))
    assert [f for f in files if f.endswith(".cubin")] and [f for f in files if f.endswith(".json")]
    assert not [f for f in files if f.startswith(".tmp-")]
    # the same process: memoized; a new process: from the cache, no compile
    _loader.load(SRC, EXPRS)
    _forget()
    again = _loader.load(SRC, EXPRS[::-1])
    assert again["mpiml_hist_move<true>"][2] == "_Zmpiml_hist_move<true>"
    assert len(_compiles(log)) == 1
    # a subset is found in a cached cubin that holds it
    _forget()
    _loader.load(SRC, EXPRS[:1])
    assert len(_compiles(log)) == 1
    # another source, NVRTC major or architecture compiles again
    _forget()
    monkeypatch.setattr(_loader, "_runtime_major", lambda: 12)
    _loader.load(SRC, EXPRS)
    assert len(_compiles(log)) == 2


def test_also_is_compiled_along_and_found_later(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path)
    mod = _loader.load_module(SRC, ["mpiml_hist_route"], also=["mpiml_hist_move<true>"])
    assert set(mod.lowered) == {"mpiml_hist_route", "mpiml_hist_move<true>"}
    # the companion is in the loaded module: no load, no compile
    assert _loader.load_module(SRC, ["mpiml_hist_move<true>"]) is mod
    _forget()
    _loader.load_module(SRC, ["mpiml_hist_move<true>"])
    assert len(_compiles(log)) == 1


def _rank(args):
    cache, log, delay = args
    os.environ["MPIML_KERNEL_CACHE"] = cache
    os.environ["MPIML_KERNEL_STRICT"] = "1"
    _loader._COMPILER = FakeCompiler(log, delay)
    _loader._device_arch = lambda: (0, 90)
    _loader._runtime_major = lambda: 13
    _loader._open = lambda path, meta: _loader.Module(FakeRaw(path), dict(meta["lowered"]), path)
    _loader._prebuilt_folder = lambda: os.path.join(cache, "none")
    _forget()
    mod = _loader.load_module(SRC, EXPRS)
    return mod.path, open(mod.path, "rb").read()


def test_ranks_of_a_node_compile_once(tmp_path):
    """Four processes ask at once: one compiles under the lock, the others wait and load its cubin."""
    log = str(tmp_path / "compiles.jsonl")
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(4) as pool:
        got = pool.map(_rank, [(str(tmp_path / "cache"), log, 0.5)] * 4)
    assert len(_compiles(log)) == 1
    assert len({p for p, _ in got}) == 1 and all(b == got[0][1] for _, b in got)
    assert got[0][1].startswith(b"cubin:sm_90:")


def test_a_broken_cache_entry_is_not_used(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path)
    _loader.load(SRC, EXPRS)
    folder = tmp_path / "cache" / "sm_90"
    for f in folder.glob("*.json"):
        f.write_text("{not json")
    _forget()
    _loader.load(SRC, EXPRS)
    assert len(_compiles(log)) == 2


def _write_bundle(folder, arch, exprs, major=13):
    """A prebuilt zip as build.py writes it (fake cubins)."""
    text = _loader.source_text(SRC)
    src = _loader.source_hash(text, _loader.DEFAULT_OPTIONS)
    name = _loader.entry_key(src, exprs, arch, major) + ".cubin"
    os.makedirs(folder, exist_ok=True)
    with zipfile.ZipFile(os.path.join(folder, arch + ".zip"), "w") as z:
        z.writestr("index.json", json.dumps({"arch": arch, "entries": [
            {"file": name, "source": src, "nvrtc": major, "arch": arch, "lowered": {e: "_P" + e for e in exprs}}]}))
        z.writestr(name, b"prebuilt cubin")


@pytest.mark.parametrize("cc, shipped", [(90, "sm_90"), (86, "sm_80"), (89, "sm_86")])
def test_prebuilt_first(monkeypatch, tmp_path, cc, shipped):
    log = _fake(monkeypatch, tmp_path, cc=cc)
    _write_bundle(str(tmp_path / "prebuilt"), shipped, EXPRS + ["mpiml_hist_move<false>"])
    fns = _loader.load(SRC, EXPRS)
    assert fns["mpiml_hist_route"][2] == "_Pmpiml_hist_route"
    assert _compiles(log) == []
    assert open(fns["mpiml_hist_route"][1], "rb").read() == b"prebuilt cubin"
    assert _loader.prebuilt_summary(cc)[0]["arch"] == shipped


def test_prebuilt_of_another_nvrtc_major_is_not_used(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path)
    _write_bundle(str(tmp_path / "prebuilt"), "sm_90", EXPRS, major=12)
    _loader.load(SRC, EXPRS)
    assert len(_compiles(log)) == 1


def test_a_newer_gpu_than_nvrtc_gets_ptx(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path, cc=130)
    _loader.load(SRC, EXPRS)
    assert _compiles(log)[0]["arch"] == "compute_120"


def test_record(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("MPIML_KERNEL_RECORD", str(tmp_path / "rec.jsonl"))
    _loader.load(SRC, EXPRS)
    rec = [json.loads(line) for line in open(tmp_path / "rec.jsonl")]
    assert rec == [{"files": list(SRC), "expressions": EXPRS, "options": ["--std=c++17"], "how": "compiled"}]


def _nvrtc_available():
    try:
        return 90 in _loader._CtypesNVRTC().archs()
    except OSError:
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="no NVRTC library")
def test_nvrtc_compiles_one_program_with_every_expression():
    compiler = _loader._CtypesNVRTC()
    cubin, lowered = _loader.compile_cubin(_loader.source_text(SRC), EXPRS, "sm_80", compiler=compiler)
    assert cubin[:4] == b"\x7fELF"
    assert set(lowered) == set(EXPRS) and lowered["mpiml_hist_move<true>"].startswith("_Z")


@pytest.mark.skipif(not _nvrtc_available(), reason="no NVRTC library")
def test_build_specs_cover_the_collectives_and_histograms():
    from mpiml.kernels import COMMON, FAMILIES, build, kmeans

    progs = build.specs("sm_90")
    files = {f for f, _ in progs}
    assert ("forest/histograms.cu",) in files and kmeans.TC_FILES in files and kmeans.SIMT_FILES in files
    assert all((COMMON, FAMILIES[f][0]) in files for f in FAMILIES)
    # a form with a constant bank is alone in its program
    for _, exprs in progs:
        if any(build._own_module(e) for e in exprs):
            assert len(exprs) == 1
    # KMeans(32) on 32 float32 features: its Lloyd step is shipped
    with kmeans.emulated_device(build.DEVICE_MODELS["sm_90"]):
        want = kmeans.small_plan(np.float32, 32, 32, mode="lloyd", vw=4, unit=True)["expr"]
    assert any(want in exprs for _, exprs in progs)


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs a CUDA GPU and CuPy")
def test_loaded_cubin_runs(monkeypatch, tmp_path):
    """Compiled into an empty cache, then loaded from it in a fresh state: the kernels give the same result."""
    import cupy

    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("MPIML_KERNEL_STRICT", "1")
    monkeypatch.setattr(_loader, "_prebuilt_folder", lambda: str(tmp_path / "none"))
    _forget()
    src = ("kmeans/simt.cu",)
    expr = "mpiml_distances_reduce_partials"
    fn = _loader.load(src, [expr])[expr]
    assert _loader.stats()["compiled"] >= 1
    part = cupy.arange(3 * 40, dtype=cupy.float64).reshape(3, 40)
    out = cupy.zeros(40, dtype=cupy.float64)
    fn((2,), (256,), (part, np.int32(3), np.int64(40), out))
    cupy.testing.assert_array_equal(out, part.sum(axis=0))
    _forget()
    fn2 = _loader.load(src, [expr])[expr]
    out[:] = 0
    fn2((2,), (256,), (part, np.int32(3), np.int64(40), out))
    cupy.testing.assert_array_equal(out, part.sum(axis=0))


def test_warmup_without_gpu_needs_an_arch():
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "src"))
    if not have_gpu():
        p = subprocess.run([sys.executable, "-m", "mpiml", "warmup"], capture_output=True, text=True, env=env,
                           timeout=120)
        assert p.returncode == 2 and "--arch" in p.stderr + p.stdout
    p = subprocess.run([sys.executable, "-m", "mpiml", "warmup", "--arch", "sm_7"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 2 and "--arch must be one of" in p.stderr + p.stdout


@pytest.mark.skipif(not _nvrtc_available(), reason="no NVRTC library")
def test_warmup_fills_the_cache_without_gpu(monkeypatch, tmp_path):
    """``ensure_cached`` with the ctypes compiler: compiled once, then found in the cache."""
    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(_loader, "_prebuilt_folder", lambda: str(tmp_path / "none"))
    _forget()
    compiler = _loader._CtypesNVRTC()
    major = compiler.version()[0]
    assert _loader.ensure_cached(SRC, EXPRS, "sm_80", major, compiler=compiler) == "compiled"
    _forget()
    assert _loader.ensure_cached(SRC, EXPRS[:1], "sm_80", major, compiler=compiler) == "cache"
    assert len(list((tmp_path / "sm_80").glob("*.cubin"))) == 1


def test_shipped_cubins_match_the_sources():
    """Every shipped cubin was compiled from the installed source: after a change to a ``.cu`` file, rebuild
    with ``python -m mpiml.kernels.build`` (a stale cubin is never loaded, but its kernels compile again)."""
    stale = []
    for arch in _loader.prebuilt_archs():
        _forget()
        _, index = _loader._prebuilt(arch)
        for e in index["entries"]:
            assert e["file"] == _loader.entry_key(e["source"], list(e["lowered"]), arch, e["nvrtc"]) + ".cubin"
            if _loader.source_hash(_loader.source_text(e["files"]), tuple(e["options"])) != e["source"]:
                stale.append(f"{arch}: {'+'.join(e['files'])}")
    assert not stale, ("shipped cubins compiled from other sources; run `python -m mpiml.kernels.build`: "
                       + ", ".join(sorted(set(stale))))


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs a CUDA GPU and CuPy")
def test_shipped_cubin_runs(monkeypatch, tmp_path):
    """On a GPU whose architecture the package ships: a kernel comes from the shipped zip (nothing compiled
    into the empty cache) and gives the right result; the histogram family loads as one module."""
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    _forget()
    if not _loader.prebuilt_summary(cc):
        pytest.skip(f"no cubins shipped for sm_{cc}")
    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("MPIML_KERNEL_STRICT", "1")
    _forget()
    before = _loader.stats()
    expr = "mpiml_distances_reduce_partials"
    fn = _loader.load(("kmeans/simt.cu",), [expr])[expr]
    part = cupy.arange(5 * 70, dtype=cupy.float64).reshape(5, 70)
    out = cupy.ones(70, dtype=cupy.float64)
    fn((3,), (256,), (part, np.int32(5), np.int64(70), out))
    cupy.testing.assert_array_equal(out, part.sum(axis=0) + 1)
    hist = [f"mpiml_hist_build<{c}, {d}, {w}>" for c in ("false", "true") for d in (0, 1) for w in ("false", "true")]
    fns = _loader.load(("forest/histograms.cu",), hist + ["mpiml_hist_route"])
    assert len({id(f) for f in fns.values()}) == len(fns)
    after = _loader.stats()
    assert after["prebuilt"] - before["prebuilt"] == 2 and after["compiled"] == before["compiled"]
    assert not list(tmp_path.glob("sm_*/*.json"))          # nothing compiled into the cache


class _FakeCupyModule:
    """Just enough of ``cupy`` for the families' compile functions to ask the loader."""

    class cuda:
        class runtime:
            @staticmethod
            def getDevice():
                return 0


def test_what_the_families_ask_for_is_shipped(monkeypatch):
    """The requests of the compile sites (collectives, histograms, linear models, k-selection, a k-means step at
    10^6 x 32, k = 32 on an sm_90 device) are each held by one program of the build's specs, so the shipped
    cubins serve them."""
    from mpiml import kernels
    from mpiml.kernels import build, kmeans, linear, select
    from mpiml.kernels.forest import histograms

    asked = []

    def fake_load_module(files, expressions, options=_loader.DEFAULT_OPTIONS, also=()):
        asked.append((tuple(files), list(expressions)))
        return _loader.Module(FakeRaw("x"), {e: e for e in list(expressions) + list(also)})

    monkeypatch.setitem(sys.modules, "cupy", _FakeCupyModule)
    monkeypatch.setattr(_loader, "load_module", fake_load_module)
    monkeypatch.setattr(kernels, "_MODULES", {})
    monkeypatch.setattr(histograms, "_FUNCTIONS", {})
    monkeypatch.setattr(kmeans._common, "_MODULES", {})
    kernels._module("allreduce", kernels.reduce_type(np.float32), 4)
    kernels._module("bcast", kernels.copy_type(8), 8)
    histograms._function(True, 1, False)
    histograms._function(expr="mpiml_hist_split<true>")
    monkeypatch.setattr(linear, "_FUNCTIONS", {})
    monkeypatch.setattr(select, "_MODULES", {})
    linear._function("mpiml_linear_logistic<float, 0, 1>")
    linear._function("mpiml_linear_labels<long long>")
    select._module(("mpiml_knn_select<float, 0, 4, 16, true>", "mpiml_knn_merge<float>", "mpiml_knn_norms<float, 0>"))
    select._module(("mpiml_knn_exact_sq<double>",))
    from mpiml.kernels import sparse

    monkeypatch.setattr(sparse._launch, "_FUNCTIONS", {})
    sparse._function("mpiml_csr_gather<float, double, float, 32, 1>")
    sparse._function("mpiml_csr_row_moments<double>")
    sparse._function("mpiml_csr_split")
    sparse._function("mpiml_csr_piece_scatter<float, 32>")
    with kmeans.emulated_device(build.DEVICE_MODELS["sm_90"]):
        plan = kmeans.small_plan(np.float32, 32, 32, mode="lloyd", vw=4, unit=True)
        for expr in (plan["expr"], plan.get("expr_cb", plan["expr"]), "mpiml_distances_reduce_partials",
                     "mpiml_lloyd_update<float>"):
            kmeans._common._function(expr)
    progs = build.specs("sm_90")
    for files, exprs in asked:
        assert any(f == files and set(exprs) <= set(e) for f, e in progs), (files, exprs)
    assert {f for f, _ in asked} == {("comm/ipc_common.cuh", "comm/allreduce.cu"),
                                     ("comm/ipc_common.cuh", "comm/bcast.cu"),
                                     ("forest/histograms.cu",), kmeans.TC_FILES, kmeans.SIMT_FILES, ("linear/linear.cu",),
                                     ("select/select.cu",), ("sparse/spmm.cu",)}


def test_a_cubin_another_process_wrote_is_found(monkeypatch, tmp_path):
    log = _fake(monkeypatch, tmp_path)
    _loader.load(SRC, ["mpiml_hist_route"])
    folder = str(tmp_path / "cache" / "sm_90")
    src = _loader.source_hash(_loader.source_text(SRC), _loader.DEFAULT_OPTIONS)
    exprs = ["mpiml_hist_move<true>", "mpiml_hist_move<false>"]
    # written behind this process's back (its index of the folder is older)
    _loader._store(folder, _loader.entry_key(src, exprs, "sm_90", 13), b"other",
                   {"source": src, "nvrtc": 13, "arch": "sm_90", "lowered": {e: "_O" + e for e in exprs}})
    fn = _loader.load(SRC, ["mpiml_hist_move<false>"])["mpiml_hist_move<false>"]
    assert fn[2] == "_Ompiml_hist_move<false>" and len(_compiles(log)) == 1
    assert _loader.stats()["cache"] >= 1


class _FakeRawModule:
    def __init__(self, path):
        self.path = path
        self.image = open(path, "rb").read()

    def get_function(self, name):
        assert name.encode() in self.image, f"{name} is not in {self.path}"
        return ("function", self.path, name)

    def get_global(self, name):
        return ("global", self.path, name)


class _FakeCupyDevice(_FakeCupyModule):
    """``cupy`` on an sm_90 device of CUDA 13, loading cubins from files."""

    RawModule = staticmethod(lambda path: _FakeRawModule(path))

    class cuda(_FakeCupyModule.cuda):
        class runtime(_FakeCupyModule.cuda.runtime):
            @staticmethod
            def runtimeGetVersion():
                return 13000

        class Device:
            def __init__(self, dev=0):
                self.compute_capability = "90"


@pytest.mark.skipif("sm_90" not in _loader.prebuilt_archs(), reason="no sm_90 cubins shipped")
def test_a_kmeans_step_on_sm_90_is_served_by_the_shipped_zip(monkeypatch, tmp_path):
    """Through the loader as on the GPU (a fake CuPy that loads the cubin files): the kernels of a k-means step,
    the histograms and an allreduce come from the shipped zip, extracted into the cache; nothing compiles."""
    from mpiml import kernels
    from mpiml.kernels import build, kmeans
    from mpiml.kernels.forest import histograms

    monkeypatch.setitem(sys.modules, "cupy", _FakeCupyDevice)
    monkeypatch.setenv("MPIML_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("MPIML_KERNEL_STRICT", "1")
    monkeypatch.setattr(_loader, "_COMPILER", FakeCompiler(str(tmp_path / "compiles.jsonl")))
    monkeypatch.setattr(kernels, "_MODULES", {})
    monkeypatch.setattr(histograms, "_FUNCTIONS", {})
    monkeypatch.setattr(kmeans._common, "_MODULES", {})
    _forget()
    before = _loader.stats()
    with kmeans.emulated_device(build.DEVICE_MODELS["sm_90"]):
        plan = kmeans.small_plan(np.float32, 32, 32, mode="lloyd", vw=4, unit=True)
        assign = kmeans.tc_plan(np.float32, 32, 32, mode="assign", vw=4)
        for expr in (plan["expr"], assign["expr"], assign["pack"], "mpiml_distances_reduce_partials",
                     "mpiml_lloyd_update<float>"):
            fn = kmeans._common._function(expr)
            assert fn[2].startswith(("_Z", "mpiml_"))
    histograms._function(True, 1, False)
    kernels._module("allreduce", kernels.reduce_type(np.float32), 4)
    after = _loader.stats()
    assert after["compiled"] == before["compiled"] and after["fallback"] == before["fallback"]
    assert after["prebuilt"] - before["prebuilt"] >= 4
    assert not (tmp_path / "compiles.jsonl").exists()
    assert list((tmp_path / "prebuilt" / "sm_90").glob("*.cubin"))


def test_the_build_ships_the_push_kernels_under_the_transport_s_sources():
    # a cubin is found by the hash of the very source text the transport loads: the same files, in the same order
    from mpiml.comm.backends import ipc
    from mpiml.kernels import PUSH_SOURCES, build

    assert ipc.PUSH_SOURCES is PUSH_SOURCES
    push = [exprs for files, exprs in build.specs("sm_90") if files == PUSH_SOURCES]
    names = {e.split("<")[0] for exprs in push for e in exprs}
    assert names == {"mpiml_reduce_llpush", "mpiml_allgather_llpush"}
    assert any("mpiml_reduce_llpush<float, 0, true>" in exprs for exprs in push)

"""CuPy's kernels compiled ahead (mpiml.kernels._cupy_warm), on a machine without a GPU: a stand-in for CuPy's
compile function that writes a cache and counts its compiles, the recorder, the manifest, the node split,
the fit that comes first, and failures that never reach the caller."""

import gzip
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import threading
import time

import pytest

from mpiml.kernels import _cupy_warm as cw
from mpiml.cli._cupy_record import own_kernel


class FakeCupy:
    """CupyHooks' interface over a stand-in of ``_compile_module_with_cache`` with CuPy 14.1's signature.

    ``include``: where this "installation" keeps CuPy's headers (two installations differ only there).
    The compile function writes ``<cache>/<key>.cubin`` and appends one line per compile to ``log``;
    a source containing ``BROKEN`` fails to compile."""

    def __init__(self, cache, log, include="/site-a/cupy/_core/include", delay=0.0, cupy="14.0.1", nvrtc=(13, 0)):
        self.cache, self.log, self.include, self.delay = str(cache), str(log), include, delay
        self._versions = {"cupy": cupy, "nvrtc": list(nvrtc)}
        self.devices = []
        self.calls = 0
        self.fn = self._compile

    def _compile(self, source, options=(), *, arch=None, extra_source=None, backend="nvrtc",
                 enable_cooperative_groups=False, name_expressions=None, log_stream=None, jitify=False,
                 to_ltoir=False):
        key = hashlib.sha256(repr((source, tuple(options), arch or "90", extra_source, backend,
                                   name_expressions, jitify)).encode()).hexdigest()[:16]
        path = os.path.join(self.cache, key + ".cubin")
        self.calls += 1
        if os.path.exists(path):
            return ("module", key)
        if "BROKEN" in source:
            raise RuntimeError("NVRTC: error: BROKEN is undefined")
        time.sleep(self.delay)
        with open(self.log, "a") as f:
            f.write(json.dumps({"key": key, "pid": os.getpid(), "thread": threading.get_ident()}) + "\n")
        tmp = path + f".{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w") as f:
            f.write("cubin")
        os.replace(tmp, path)
        return ("module", key)

    # the CupyHooks interface
    def versions(self):
        return dict(self._versions)

    def get(self):
        return self.fn

    def set(self, fn):
        self.fn = fn

    def assemble(self, options):
        options = tuple(options)
        std = () if any("std=" in o for o in options) else ("--std=c++17",)
        return (f"-I{self.include}/cupy/_cccl/cub", f"-I{self.include}/cupy/_cccl/libcudacxx") + options + std \
            + (f"-I{self.include}", "-I/usr/local/cuda/include")

    def header_source(self):
        return "HEADERS OF CUPY"

    def paths(self):
        return {"{cupy_include}": self.include, "{cuda_path}": "/usr/local/cuda"}

    def cache_dir(self):
        return self.cache

    def arch(self):
        return "90"

    def use_device(self, device):
        self.devices.append(device)

    # what CuPy's kernels do: look the function up at each call, with assembled options
    def kernel(self, source, user_options=(), **kw):
        return self.get()(source, self.assemble(user_options), extra_source=self.header_source(), **kw)


def _compiles(log):
    try:
        with open(log) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for var in ("MPIML_CUPY_WARM", "MPIML_CUPY_WARM_JOBS", "CUPY_CACHE_IN_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    cw._reset()
    yield
    cw._reset()


SOURCES = [f"extern \"C\" __global__ void k{i}(float* x) {{ x[{i}] = {i}; }}" for i in range(12)]


def _record(fake, workloads):
    """A manifest from ``{tag: [(source, user options, kwargs)]}`` run through the recorder."""
    with cw.Recorder(fake) as rec:
        for tag, calls in workloads.items():
            with rec.tagged(tag):
                for src, opts, kw in calls:
                    fake.kernel(src, opts, **kw)
    assert fake.get() == fake._compile, "the recorder puts CuPy's function back"
    return rec.manifest(workload="test")


def _manifest(fake, n=12):
    calls = [(s, (), {}) for s in SOURCES[:n]]
    return _record(fake, {"kmeans": calls[: n // 2], "pca": calls[n // 3:]})


def test_recorder_keeps_each_module_once_with_its_workloads(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _record(fake, {"kmeans": [(SOURCES[0], (), {}), (SOURCES[1], ("-DX=1",), {"name_expressions": ["k<1>"]}),
                                  (SOURCES[0], (), {})],
                       "pca": [(SOURCES[1], ("-DX=1",), {"name_expressions": ["k<1>"]}),
                               (SOURCES[2], ("--std=c++14",), {"jitify": True})]})
    assert [e["tags"] for e in m["entries"]] == [["kmeans"], ["kmeans", "pca"], ["pca"]]
    e0, e1, e2 = m["entries"]
    assert e0["options"] == {"user": []} and e0["extra"] == {"cupy_headers": True}
    assert e1["options"] == {"user": ["-DX=1"]} and e1["name_expressions"] == ["k<1>"]
    assert e2["options"] == {"user": ["--std=c++14"]} and e2["jitify"] is True
    assert m["cupy"] == "14.0.1" and m["nvrtc"] == [13, 0] and m["format"] == cw.FORMAT
    assert len(_compiles(fake.log)) == 3        # the recorder compiled nothing itself: CuPy did, as always


def test_manifest_round_trip_is_reproducible(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    a, b = str(tmp_path / "a.json.gz"), str(tmp_path / "b.json.gz")
    cw.write_manifest(a, m)
    cw.write_manifest(b, m)
    assert open(a, "rb").read() == open(b, "rb").read()
    assert cw.read_manifest(a) == json.loads(json.dumps(m))
    assert cw.read_manifest(str(tmp_path / "missing.json.gz")) is None
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a CuPy kernel manifest"):
        cw.read_manifest(str(tmp_path / "bad.json.gz"))
    with gzip.open(tmp_path / "old.json.gz", "wb") as f:
        f.write(json.dumps({"format": 0, "entries": []}).encode())
    with pytest.raises(ValueError, match="format"):
        cw.read_manifest(str(tmp_path / "old.json.gz"))


def test_merge_unites_tags_and_refuses_other_versions(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    a = _record(fake, {"kmeans": [(SOURCES[0], (), {}), (SOURCES[1], (), {})]})
    b = _record(fake, {"pca": [(SOURCES[1], (), {}), (SOURCES[2], (), {})]})
    m = cw.merge([a, b])
    assert [e["tags"] for e in m["entries"]] == [["kmeans"], ["kmeans", "pca"], ["pca"]]
    c = dict(b, cupy="13.6.0")
    with pytest.raises(ValueError, match="different CuPy"):
        cw.merge([a, c])
    assert own_kernel({"name_expressions": ["mpiml_hist_route"]}) and not own_kernel({"name_expressions": None})


def test_entries_hold_on_another_installation(tmp_path):
    """Recorded where CuPy lives in /site-a, replayed where it lives in /site-b: the replay passes site-b's
    options, and site-b's own call of the same kernel is recognised as the entry."""
    rec = FakeCupy(tmp_path / "a", tmp_path / "log-a", include="/site-a/include")
    os.makedirs(rec.cache)
    m = _record(rec, {"kmeans": [(SOURCES[0], ("-DN=4",), {})]})
    entry = m["entries"][0]
    assert "/site-a" not in json.dumps(entry)
    here = FakeCupy(tmp_path / "b", tmp_path / "log-b", include="/site-b/include")
    os.makedirs(here.cache)
    seen = []
    here.fn = lambda source, options=(), **kw: seen.append(options) or here._compile(source, options, **kw)
    cw._replay(entry, here.fn, cw._Options(here), here)
    assert seen == [here.assemble(("-DN=4",))]
    w = cw._Warmup(m["entries"], here, None, 0, 1, 1, str(tmp_path / "markers"), here.versions())
    args = (SOURCES[0], here.assemble(("-DN=4",)))
    assert w.match(args, {"extra_source": here.header_source()}) == entry["id"]
    assert w.match((SOURCES[0], here.assemble(("-DN=5",))), {"extra_source": here.header_source()}) is None


def test_raw_options_use_placeholders(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log", include="/site-a/include")
    opts = cw._Options(fake)
    odd = ("-I/site-a/include/extra", "-DONLY_RAW")          # not what CuPy's assembly makes
    spec = opts.portable(odd)
    assert spec == {"raw": ["-I{cupy_include}/extra", "-DONLY_RAW"]}
    other = cw._Options(FakeCupy(tmp_path / "cache", tmp_path / "log", include="/site-b/include"))
    assert other.local(spec) == ("-I/site-b/include/extra", "-DONLY_RAW")


def test_node_order_splits_and_covers():
    for size in (1, 2, 3, 4):
        firsts = []
        for r in range(size):
            order = cw.node_order(10, r, size)
            assert sorted(order) == list(range(10))
            own = [i for i in range(10) if i % size == r]
            assert order[:len(own)] == own
            firsts.append(set(own))
        assert set().union(*firsts) == set(range(10))
        assert sum(map(len, firsts)) == 10


def test_parse_setting():
    assert cw.parse_setting(None) == (True, False, None)
    assert cw.parse_setting("1") == (True, False, None)
    assert cw.parse_setting("0") == (False, False, None)
    assert cw.parse_setting("off") == (False, False, None)
    assert cw.parse_setting("wait") == (True, True, None)
    assert cw.parse_setting("kmeans, PCA,wait") == (True, True, ["kmeans", "pca"])


def _warm(fake, manifest, **kw):
    kw.setdefault("wait", True)
    return cw.start(0, hooks=fake, manifest=manifest, **kw)


def test_warm_compiles_each_entry_once_then_finds_them(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    os.unlink(fake.log)
    for f in os.listdir(fake.cache):
        os.unlink(os.path.join(fake.cache, f))      # an empty CuPy cache
    st = _warm(fake, m, cores=4)
    assert st["state"] == "done", st
    assert st["counts"]["compiled"] == len(m["entries"]) and st["jobs"] == 4
    assert len(_compiles(fake.log)) == len(m["entries"])
    assert set(fake.devices) == {0}                 # every worker thread on the rank's GPU
    assert fake.get() == fake._compile              # the hook is gone once done
    # what the fits then ask for is in the cache: no compile
    for s in SOURCES:
        fake.kernel(s)
    assert len(_compiles(fake.log)) == len(m["entries"])
    # a second process: the markers say it is done, nothing compiled; one entry per set of options is loaded
    # (CuPy's set-up of those options, off the fit's path)
    cw._reset()
    fake.calls = 0
    st = _warm(fake, m)
    assert st["counts"]["cached"] == len(m["entries"]) and st["counts"]["compiled"] == 0
    assert fake.calls == len({json.dumps(e["options"]) for e in m["entries"]}) == 1


def test_tags_select_entries(tmp_path, monkeypatch):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    os.unlink(fake.log)
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    kmeans = [e for e in m["entries"] if "kmeans" in e["tags"]]
    st = _warm(fake, m, tags=["kmeans"])
    assert st["entries"] == len(kmeans) == len(_compiles(fake.log))
    cw._reset()
    monkeypatch.setenv("MPIML_CUPY_WARM", "pca")
    st = _warm(fake, m)
    assert st["entries"] == sum("pca" in e["tags"] for e in m["entries"])
    cw._reset()
    assert _warm(fake, m, tags="kmeans")["entries"] == len(kmeans)     # init(warm="kmeans") as well as a list


@pytest.mark.parametrize("setting, reason", [("0", "turned off"), ("off", "turned off")])
def test_off_switch(tmp_path, monkeypatch, setting, reason):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    monkeypatch.setenv("MPIML_CUPY_WARM", setting)
    st = _warm(fake, m, tags=["kmeans"])
    assert st["state"] == "skipped" and reason in st["reason"]
    assert cw.status()["state"] == "skipped"


def test_in_memory_cache_and_no_manifest_are_skipped(tmp_path, monkeypatch):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    assert "CUPY_CACHE_IN_MEMORY" in _warm(fake, m)["reason"]
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY")
    monkeypatch.setattr(cw, "read_manifest", lambda path=None: None)
    st = cw.start(0, hooks=fake)
    assert st["state"] == "skipped" and "no manifest" in st["reason"]


@pytest.mark.parametrize("cupy, nvrtc", [("14.1.0", (13, 0)), ("14.0.1", (12, 9))])
def test_version_mismatch_skips(tmp_path, cupy, nvrtc):
    rec = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(rec.cache)
    m = _manifest(rec)
    n = len(_compiles(rec.log))
    here = FakeCupy(tmp_path / "cache2", tmp_path / "log", cupy=cupy, nvrtc=nvrtc)
    os.makedirs(here.cache)
    st = _warm(here, m)
    assert st["state"] == "skipped" and "recorded with CuPy 14.0.1" in st["reason"]
    assert len(_compiles(rec.log)) == n and here.get() == here._compile


def test_a_failing_entry_is_logged_once_and_the_others_compile(tmp_path, caplog):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _record(fake, {"kmeans": [(s, (), {}) for s in SOURCES[:4]]})
    bad = [dict(e, source=e["source"] + " BROKEN", id=e["id"] + "x") for e in m["entries"][:2]]
    m["entries"] = bad + m["entries"]
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    with caplog.at_level(logging.WARNING, logger="mpiml.kernels"):
        st = _warm(fake, m, cores=1)
    assert st["counts"]["failed"] == 2 and st["counts"]["compiled"] == 4
    assert sum("failed to compile" in r.getMessage() for r in caplog.records) == 1


def test_start_never_raises(tmp_path, caplog):
    class Broken(FakeCupy):
        def versions(self):
            raise OSError("libnvrtc.so: cannot open shared object file")

    fake = Broken(tmp_path / "cache", tmp_path / "log")
    with caplog.at_level(logging.WARNING, logger="mpiml.kernels"):
        st = cw.start(0, hooks=fake, manifest={"format": 1, "cupy": "x", "nvrtc": [13, 0], "entries": []})
    assert st["state"] == "failed" and "libnvrtc" in st["reason"]
    assert any("not started" in r.getMessage() for r in caplog.records)
    # a cache folder that cannot be written: skipped, said once
    ro = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(ro.cache)
    m = _manifest(ro)
    ro.cache_dir = lambda: "/proc/no-such-dir"
    cw._reset()
    st = cw.start(0, hooks=ro, manifest=m, wait=True)
    assert st["state"] == "skipped" and "cannot write" in st["reason"]


def test_workers_without_a_device_stop_and_say_so(tmp_path, caplog):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)

    def no_device(device):
        raise RuntimeError("cudaErrorNoDevice")

    fake.use_device = no_device
    with caplog.at_level(logging.WARNING, logger="mpiml.kernels"):
        st = _warm(fake, m, cores=3)
    assert st["state"] == "done" and fake.get() == fake._compile
    assert sum("cudaErrorNoDevice" in r.getMessage() for r in caplog.records) == 1


def test_a_fit_that_comes_first_takes_its_entry(tmp_path):
    """While the warm-up runs (slow compiles), the fit's own calls: an entry not started is compiled by the fit
    at once, one being compiled is waited for; each entry compiles once; the fit's workload moves up."""
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _record(fake, {"pca": [(s, (), {}) for s in SOURCES[:8]], "kmeans": [(s, (), {}) for s in SOURCES[8:]]})
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    os.unlink(fake.log)
    fake.delay = 0.3
    st = cw.start(0, hooks=fake, manifest=m, cores=1)          # one thread, in the background
    assert st["state"] == "running" and fake.get() is not fake._compile
    time.sleep(0.05)                                          # the worker is on the first pca entry
    t = time.perf_counter()
    assert fake.kernel(SOURCES[10]) == fake._compile(SOURCES[10], fake.assemble(()),
                                                     extra_source=fake.header_source())
    assert time.perf_counter() - t < 0.9                      # compiled at once, not after the queue
    w = cw._CURRENT[0]
    assert set(w.entries[w.pending[0]]["tags"]) == {"kmeans"}  # the rest of kmeans goes next
    assert fake.kernel(SOURCES[0])                            # being compiled by the worker: waited for
    assert fake.kernel("not recorded")                        # passes straight through
    assert cw.wait(20)
    st = cw.status()
    assert st["state"] == "done" and st["counts"]["by_fit"] == 1
    keys = [c["key"] for c in _compiles(fake.log)]
    assert len(keys) == len(set(keys)) == len(m["entries"]) + 1   # + the unrecorded one
    assert fake.get() == fake._compile


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_drops_the_hook(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    fake.delay = 0.2
    cw.start(0, hooks=fake, manifest=m, cores=1)
    assert fake.get() is not fake._compile
    pid = os.fork()
    if pid == 0:       # the child: CuPy's own function again, nothing waits on the parent's threads
        os._exit(0 if fake.get() == fake._compile and cw.wait(0.1) else 1)
    _, code = os.waitpid(pid, 0)
    assert code == 0
    assert cw.wait(30)


def test_a_recorder_over_a_running_warm_up_sees_cupys_arguments(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    fake.delay = 0.1
    cw.start(0, hooks=fake, manifest=m, cores=2)
    with cw.Recorder(fake) as rec:
        fake.kernel(SOURCES[3], ("-DY",))
    assert rec.errors == [] and [e["options"] for e in rec.entries.values()] == [{"user": ["-DY"]}]
    assert cw.wait(30)


def test_stop_ends_the_warm_up_early(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    fake.delay = 0.2
    cw.start(0, hooks=fake, manifest=m, cores=1)
    time.sleep(0.1)
    cw.stop(5)
    st = cw.status()
    assert st["state"] == "done" and st["pending"] > 0 and fake.get() == fake._compile


def test_a_compile_error_of_the_fit_reaches_the_fit(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    m = _record(fake, {"kmeans": [(s, (), {}) for s in SOURCES[:3]]})
    # an entry that fails wherever it compiles: the fit gets CuPy's error, as without the warm-up
    m["entries"].append(dict(m["entries"][0], source="BROKEN", id=cw.entry_id(dict(m["entries"][0],
                                                                                    source="BROKEN"))))
    fake.cache = str(tmp_path / "empty")
    os.makedirs(fake.cache)
    fake.delay = 0.3
    cw.start(0, hooks=fake, manifest=m, cores=1)
    with pytest.raises(RuntimeError, match="BROKEN is undefined"):
        fake.kernel("BROKEN")
    assert cw.wait(20)


def _node_rank(args):
    cache, log, rank, size, manifest, *who = args
    cw._reset()
    fake = FakeCupy(cache, log, delay=0.15)   # long enough that every rank finds work
    st = cw.start(rank, hooks=fake, manifest=manifest, node_rank=rank, node_size=size, cores=2 * size, wait=True)
    return (who[0] if who else rank), st


def test_ranks_that_do_not_know_their_place_still_share(tmp_path):
    """No launcher variable: every rank believes it is local rank 0 of 1 and starts at the same entry.  An entry
    another rank is compiling is put back and waited for at the end, so the work is still shared."""
    fake = FakeCupy(tmp_path / "rec", tmp_path / "rec.log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    cache, log = str(tmp_path / "cache"), str(tmp_path / "log")
    os.makedirs(cache)
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(2) as pool:
        got = dict(pool.map(_node_rank, [(cache, log, 0, 1, m, r) for r in range(2)]))
    compiles = _compiles(log)
    assert len(compiles) == len({c["key"] for c in compiles}) == len(m["entries"])
    assert len({c["pid"] for c in compiles}) == 2
    for st in got.values():
        assert st["state"] == "done" and sum(st["counts"].values()) == len(m["entries"])


def test_the_fits_workload_goes_first(tmp_path):
    fake = FakeCupy(tmp_path / "cache", tmp_path / "log")
    os.makedirs(fake.cache)
    shared = [(SOURCES[0], (), {})]
    m = _record(fake, {"data": shared, "kmeans": shared + [(s, (), {}) for s in SOURCES[1:4]],
                       "pca": shared + [(s, (), {}) for s in SOURCES[4:8]],
                       "rf": shared + [(s, (), {}) for s in SOURCES[8:12]]})
    w = cw._Warmup(m["entries"], fake, None, 0, 1, 1, str(tmp_path / "markers"), fake.versions())
    ids = {e["source"]: e["id"] for e in m["entries"]}
    w.claim(ids[SOURCES[0]])              # shared by every workload: nothing is learnt
    w.claim(ids[SOURCES[9]])              # rf's own
    assert [set(w.entries[e]["tags"]) for e in w.pending[:3]] == [{"rf"}] * 3
    w.claim(ids[SOURCES[5]])              # now pca
    assert [set(w.entries[e]["tags"]) for e in w.pending[:3]] == [{"pca"}] * 3


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_of_a_node_share_the_work(tmp_path, size):
    fake = FakeCupy(tmp_path / "rec", tmp_path / "rec.log")
    os.makedirs(fake.cache)
    m = _manifest(fake)
    cache, log = str(tmp_path / "cache"), str(tmp_path / "log")
    os.makedirs(cache)
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(size) as pool:
        got = dict(pool.map(_node_rank, [(cache, log, r, size, m) for r in range(size)]))
    compiles = _compiles(log)
    assert len(compiles) == len({c["key"] for c in compiles}) == len(m["entries"])   # each once on the node
    assert len({c["pid"] for c in compiles}) == size                                 # by every rank
    for st in got.values():
        assert st["state"] == "done" and st["pending"] == 0
        assert sum(st["counts"].values()) == len(m["entries"])


# ------------------------------------------------------------------------------------------------ on a GPU

_GPU_SCRIPT = r"""
import json, os, sys
import cupy
from mpiml.kernels import _cupy_warm as cw

def work():
    x = cupy.arange(1000, dtype=cupy.float64)
    y = cupy.ElementwiseKernel("T x", "T y", "y = x * 3 + 1", "mpiml_test_warm_affine")(x)
    s = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "mpiml_test_warm_sumsq")(y)
    z = (y.astype(cupy.float32) - 0.5).sum()
    return float(s) + float(z)

step, path = sys.argv[1], sys.argv[2]
cache = os.environ["CUPY_CACHE_DIR"]
if step == "record":
    with cw.Recorder() as rec:
        with rec.tagged("test"):
            value = work()
    cw.write_manifest(path, rec.manifest())
    print(json.dumps({"value": value, "entries": len(rec.entries), "errors": rec.errors}))
else:
    st = cw.start(0, manifest=cw.read_manifest(path), wait=True)
    before = sorted(os.listdir(cache))
    value = work()
    after = sorted(os.listdir(cache))
    print(json.dumps({"value": value, "status": st, "new_files": sorted(set(after) - set(before))}))
"""


@pytest.mark.gpu
def test_on_a_gpu_the_replay_fills_cupys_cache(tmp_path):
    """Recorded in one process; in another with an empty CuPy cache the warm-up compiles every entry, and the
    same kernels then run without compiling anything (no new file in CuPy's cache)."""
    from conftest import ROOT, have_gpu, run_group

    if not have_gpu():
        pytest.skip("no GPU")
    script = tmp_path / "warm.py"
    script.write_text(_GPU_SCRIPT)
    manifest = str(tmp_path / "m.json.gz")
    out = {}
    for step, cache in (("record", "c1"), ("warm", "c2")):
        os.makedirs(tmp_path / cache)
        env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / cache), MPIML_CUPY_WARM="1",
                   PYTHONPATH=os.path.join(ROOT, "src"))
        p = run_group([sys.executable, str(script), step, manifest], 300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        out[step] = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["record"]["errors"] == [] and out["record"]["entries"] >= 3
    st = out["warm"]["status"]
    assert st["state"] == "done" and st["counts"]["compiled"] == out["record"]["entries"], st
    assert out["warm"]["new_files"] == [], out["warm"]
    assert out["warm"]["value"] == out["record"]["value"]


def test_every_mpiml_run_names_a_recorded_workload():
    """`mpiml run ALGORITHM` compiles ahead the workload `run-ALGORITHM`: the recorder must record each."""
    from mpiml.cli import _cupy_record
    from mpiml.cli.run_estimator import JOBS

    recorded = {_cupy_record.MPI_WORKLOADS.get(w, (1, w))[1] for w in _cupy_record.WORKLOADS}
    assert {f"run-{a}" for a in JOBS} | {"run-kmeans"} <= recorded
    # the estimators' own tags are those of mpiml run's algorithms (MPIML_CUPY_WARM=kmeans,pca names them)
    assert {w for w in _cupy_record.WORKLOADS if not w.startswith("run-")} - {"data"} <= set(JOBS) | {"kmeans"}


@pytest.mark.parametrize("env,warm,started", [(None, None, False), ("1", None, True), ("0", None, True),
                                              (None, ["run-kmeans"], True), (None, False, True)])
def test_init_starts_the_warm_up_only_when_asked(monkeypatch, env, warm, started):
    # a background compile of every workload slowed cold first fits on 4 x H100: off unless asked for
    # (env "0" and warm=False still reach start(), which records why it skips)
    from mpiml import _init
    from mpiml.kernels import _cupy_warm as cw

    calls = []
    monkeypatch.setattr(cw, "start", lambda *a, **k: calls.append(k))
    if env is None:
        monkeypatch.delenv("MPIML_CUPY_WARM", raising=False)
    else:
        monkeypatch.setenv("MPIML_CUPY_WARM", env)
    _init._start_cupy_warm(0, 0, warm)
    assert bool(calls) is started
